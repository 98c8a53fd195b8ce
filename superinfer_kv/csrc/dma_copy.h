// Copy-engine (DMA) transfers of copy runs: one cudaMemcpyBatchAsync call where the runtime
// has it (CUDA >= 12.8), else one cudaMemcpyAsync per run. Plain CUDA runtime, no torch.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "copy_runs.h"

namespace duplexkv {

// True when this build was compiled against a runtime that has cudaMemcpyBatchAsync.
bool batch_memcpy_compiled();

// Issues every run on `stream` through the copy engines; no SMs are used.
cudaError_t dma_copy_runs(const char* src_base, char* dst_base, const std::vector<CopyRun>& runs,
                          bool use_batch_api, cudaStream_t stream);

// The per-block baseline (vLLM's swap_blocks): one cudaMemcpyAsync per block, no merging.
// src_ids/dst_ids: [count] host arrays of block ids.
cudaError_t memcpy_per_block(const char* src_base, char* dst_base, const int64_t* src_ids,
                             const int64_t* dst_ids, int64_t count, int64_t block_bytes,
                             cudaStream_t stream);

}  // namespace duplexkv
