// The CUDA backend: swap-out and swap-in each on a dedicated non-blocking stream, ordered after
// the compute already issued on the caller's current stream (an event the copy stream waits on)
// and reporting completion through an event of its own. Owns both pools (keeping them alive),
// the two streams and their ordering events.
#pragma once

#include <ATen/ATen.h>
#include <cuda_runtime.h>

#include <memory>
#include <mutex>
#include <string>

#include "copy_runs.h"

namespace duplexkv {

enum class CopyMethod : int64_t { kAuto = 0, kKernel = 1, kBatchMemcpy = 2, kMemcpyLoop = 3 };

struct CudaTransferOptions {
  // CTAs (512 threads, a warp per piece) the gather/scatter kernel may occupy; bounds how
  // many SMs it takes from compute.
  int64_t kernel_ctas = 4;
  // In auto mode, runs averaging at least this many bytes go to the copy engines; smaller,
  // fragmented ones to the kernel (copy-engine throughput collapses for small copies).
  int64_t dma_min_run_bytes = 64 * 1024;
  // The kernel path issues one launch per this many bytes (0: one launch for the whole
  // transfer), so its CTAs leave the SMs between launches and the model's kernels get them.
  int64_t kernel_launch_bytes = 0;
};

// One direction of one submit. Holds the completion event; a job with no event is done.
class CudaJob {
 public:
  CudaJob(cudaEvent_t finished, int device_index, CopyMethod method);
  ~CudaJob();
  CudaJob(const CudaJob&) = delete;
  CudaJob& operator=(const CudaJob&) = delete;

  bool done() const;
  // Blocks this host thread (not the device) until the copy has finished.
  void wait() const;
  // The caller's current stream waits for the copy; no host synchronization.
  void order_compute_after() const;
  std::string method() const;

 private:
  cudaEvent_t finished_;
  int device_index_;
  CopyMethod method_;
};

class CudaTransfer {
 public:
  CudaTransfer(at::Tensor device_kv, at::Tensor host_kv, CudaTransferOptions options);
  // Waits for this engine's two streams (not the device) so the pools outlive their copies.
  ~CudaTransfer();
  CudaTransfer(const CudaTransfer&) = delete;
  CudaTransfer& operator=(const CudaTransfer&) = delete;

  // swap_out: device → host on the out stream; otherwise host → device on the in stream.
  std::shared_ptr<CudaJob> copy(bool swap_out, const at::Tensor& src_ids,
                                const at::Tensor& dst_ids, CopyMethod method);
  // Benchmark baseline: one cudaMemcpyAsync per block on the current stream (vLLM's loop).
  void copy_per_block(bool swap_out, const at::Tensor& src_ids, const at::Tensor& dst_ids);

  int64_t block_bytes() const { return block_bytes_; }
  bool kernel_available() const { return host_mapped_ != nullptr; }
  bool batch_memcpy_available() const { return batch_memcpy_available_; }

 private:
  CopyMethod choose_method(const std::vector<CopyRun>& runs, CopyMethod requested) const;
  void launch_kernel(const char* src, char* dst, const std::vector<CopyRun>& runs,
                     cudaStream_t stream);

  at::Tensor device_kv_;
  at::Tensor host_kv_;
  CudaTransferOptions options_;
  int device_index_ = 0;
  int64_t block_bytes_ = 0;
  // Device view of host_kv (mapped pinned memory) for the kernel; null when not mapped.
  char* host_mapped_ = nullptr;
  bool batch_memcpy_available_ = false;
  cudaStream_t out_stream_ = nullptr;
  cudaStream_t in_stream_ = nullptr;
  // Recorded on the caller's stream at each submit; the copy stream waits on it.
  cudaEvent_t out_ready_ = nullptr;
  cudaEvent_t in_ready_ = nullptr;
  // copy() runs without the GIL: one lock per direction keeps concurrent submits from
  // interleaving a record/wait pair on the shared ready event.
  std::mutex out_mutex_;
  std::mutex in_mutex_;
};

}  // namespace duplexkv
