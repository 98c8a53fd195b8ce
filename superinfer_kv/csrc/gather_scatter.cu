// The gather/scatter kernel: each CTA walks whole pieces (grid-stride), its threads moving
// 16-byte words with several loads in flight per thread to hide PCIe latency of host memory.
#include "gather_scatter.h"

#include <algorithm>

namespace duplexkv {
namespace {

// Loads in flight per thread before the matching stores.
constexpr int kUnroll = 4;

// src_base/dst_base: byte bases; pieces: [num_pieces] {src_offset, dst_offset, bytes}.
template <typename Word>
__global__ void __launch_bounds__(kGatherScatterThreads)
    gather_scatter_kernel(const char* __restrict__ src_base, char* __restrict__ dst_base,
                          const CopyRun* __restrict__ pieces, int64_t num_pieces) {
  constexpr int64_t kStride = kGatherScatterThreads;
  for (int64_t p = blockIdx.x; p < num_pieces; p += gridDim.x) {
    const CopyRun piece = pieces[p];
    const Word* from = reinterpret_cast<const Word*>(src_base + piece.src_offset);
    Word* to = reinterpret_cast<Word*>(dst_base + piece.dst_offset);
    const int64_t words = piece.bytes / static_cast<int64_t>(sizeof(Word));
    int64_t i = threadIdx.x;
    for (; i + (kUnroll - 1) * kStride < words; i += kUnroll * kStride) {
      Word buffer[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) buffer[u] = from[i + u * kStride];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) to[i + u * kStride] = buffer[u];
    }
    for (; i < words; i += kStride) to[i] = from[i];
  }
}

}  // namespace

cudaError_t launch_gather_scatter(const char* src_base, char* dst_base,
                                  const CopyRun* pieces_on_device, int64_t num_pieces,
                                  bool aligned16, int max_ctas, cudaStream_t stream) {
  if (num_pieces <= 0) return cudaSuccess;
  const int ctas = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(num_pieces, max_ctas)));
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
