// Copy-engine transfers (see dma_copy.h). cudaMemcpyBatchAsync lost its failIdx argument in
// CUDA 13, hence the two call forms.
#include "dma_copy.h"

namespace duplexkv {

bool batch_memcpy_compiled() {
#if CUDART_VERSION >= 12080
  return true;
#else
  return false;
#endif
}

namespace {

cudaError_t memcpy_each_run(const char* src_base, char* dst_base,
                            const std::vector<CopyRun>& runs, cudaStream_t stream) {
  for (const CopyRun& run : runs) {
    const cudaError_t status =
        cudaMemcpyAsync(dst_base + run.dst_offset, src_base + run.src_offset,
                        static_cast<size_t>(run.bytes), cudaMemcpyDefault, stream);
    if (status != cudaSuccess) return status;
  }
  return cudaSuccess;
}

#if CUDART_VERSION >= 12080
cudaError_t memcpy_batch(const char* src_base, char* dst_base, const std::vector<CopyRun>& runs,
                         cudaStream_t stream) {
  std::vector<void*> dsts(runs.size());
  std::vector<const void*> srcs(runs.size());
  std::vector<size_t> sizes(runs.size());
  for (size_t i = 0; i < runs.size(); ++i) {
    dsts[i] = dst_base + runs[i].dst_offset;
    srcs[i] = src_base + runs[i].src_offset;
    sizes[i] = static_cast<size_t>(runs[i].bytes);
  }
  // One attribute set for all copies: read the source in stream order (after the event the
  // stream waited on) and prefer overlapping with the model's kernels.
  cudaMemcpyAttributes attributes = {};
  attributes.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
  attributes.flags = cudaMemcpyFlagPreferOverlapWithCompute;
  size_t attribute_index = 0;
#if CUDART_VERSION >= 13000
  return cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), runs.size(), &attributes,
                              &attribute_index, 1, stream);
#else
  size_t failed_index = 0;
  return cudaMemcpyBatchAsync(dsts.data(), const_cast<void**>(srcs.data()), sizes.data(),
                              runs.size(), &attributes, &attribute_index, 1, &failed_index,
                              stream);
#endif
}
#endif

}  // namespace

cudaError_t dma_copy_runs(const char* src_base, char* dst_base, const std::vector<CopyRun>& runs,
                          bool use_batch_api, cudaStream_t stream) {
  if (runs.empty()) return cudaSuccess;
#if CUDART_VERSION >= 12080
  if (use_batch_api) return memcpy_batch(src_base, dst_base, runs, stream);
#endif
  return memcpy_each_run(src_base, dst_base, runs, stream);
}

cudaError_t memcpy_per_block(const char* src_base, char* dst_base, const int64_t* src_ids,
                             const int64_t* dst_ids, int64_t count, int64_t block_bytes,
                             cudaStream_t stream) {
  for (int64_t i = 0; i < count; ++i) {
    const cudaError_t status = cudaMemcpyAsync(
        dst_base + dst_ids[i] * block_bytes, src_base + src_ids[i] * block_bytes,
        static_cast<size_t>(block_bytes), cudaMemcpyDefault, stream);
    if (status != cudaSuccess) return status;
  }
  return cudaSuccess;
}

}  // namespace duplexkv
