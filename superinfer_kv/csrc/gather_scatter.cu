// The gather/scatter kernel: one warp per piece (grid-stride over pieces), each lane moving
// 16-byte words with several loads in flight to hide the PCIe latency of mapped host memory.
// A warp rather than a CTA per piece keeps small (4-16 KiB) blocks from idling most threads.
#include "gather_scatter.h"

#include <algorithm>

namespace duplexkv {
namespace {

constexpr int kWarpSize = 32;
// Loads in flight per lane before the matching stores.
constexpr int kUnroll = 4;

// src_base/dst_base: byte bases; pieces: [num_pieces] {src_offset, dst_offset, bytes}.
template <typename Word>
__global__ void __launch_bounds__(kGatherScatterThreads)
    gather_scatter_kernel(const char* __restrict__ src_base, char* __restrict__ dst_base,
                          const CopyRun* __restrict__ pieces, int64_t num_pieces) {
  const int64_t lane = threadIdx.x % kWarpSize;
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarpSize;
  const int64_t num_warps = static_cast<int64_t>(gridDim.x) * blockDim.x / kWarpSize;
  for (int64_t p = warp; p < num_pieces; p += num_warps) {
    const CopyRun piece = pieces[p];
    const Word* from = reinterpret_cast<const Word*>(src_base + piece.src_offset);
    Word* to = reinterpret_cast<Word*>(dst_base + piece.dst_offset);
    const int64_t words = piece.bytes / static_cast<int64_t>(sizeof(Word));
    int64_t i = lane;
    for (; i + (kUnroll - 1) * kWarpSize < words; i += kUnroll * kWarpSize) {
      Word buffer[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) buffer[u] = from[i + u * kWarpSize];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) to[i + u * kWarpSize] = buffer[u];
    }
    for (; i < words; i += kWarpSize) to[i] = from[i];
  }
}

}  // namespace

cudaError_t launch_gather_scatter(const char* src_base, char* dst_base,
                                  const CopyRun* pieces_on_device, int64_t num_pieces,
                                  bool aligned16, int max_ctas, cudaStream_t stream) {
  if (num_pieces <= 0) return cudaSuccess;
  constexpr int64_t kWarpsPerCta = kGatherScatterThreads / kWarpSize;
  const int64_t wanted = (num_pieces + kWarpsPerCta - 1) / kWarpsPerCta;
  const int ctas = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(wanted, max_ctas)));
  if (aligned16) {
    gather_scatter_kernel<int4><<<ctas, kGatherScatterThreads, 0, stream>>>(
        src_base, dst_base, pieces_on_device, num_pieces);
  } else {
    gather_scatter_kernel<unsigned char><<<ctas, kGatherScatterThreads, 0, stream>>>(
        src_base, dst_base, pieces_on_device, num_pieces);
  }
  return cudaGetLastError();
}

}  // namespace duplexkv
