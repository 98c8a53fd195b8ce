// SM-driven gather/scatter of copy pieces between device memory and mapped pinned host memory.
// Plain CUDA (no torch headers) so the CI compile check stays quick.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "copy_runs.h"

namespace duplexkv {

// Threads per CTA of the gather/scatter kernel.
constexpr int kGatherScatterThreads = 512;

// Copies every piece (offsets relative to src_base/dst_base, which may be device pointers or
// device views of mapped pinned host memory). pieces_on_device: [num_pieces] in device memory.
// aligned16: every base, offset and size is a multiple of 16 bytes (enables 16-byte moves).
// max_ctas bounds the SMs the copy occupies, leaving the rest to compute.
cudaError_t launch_gather_scatter(const char* src_base, char* dst_base,
                                  const CopyRun* pieces_on_device, int64_t num_pieces,
                                  bool aligned16, int max_ctas, cudaStream_t stream);

}  // namespace duplexkv
