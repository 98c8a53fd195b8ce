// CUDA backend implementation (see cuda_transfer.h).
#include "cuda_transfer.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <cstdint>
#include <cstring>

#include "dma_copy.h"
#include "gather_scatter.h"

namespace duplexkv {
namespace {

// Kernel pieces (one warp each) are cut to this size so long runs still spread over warps.
constexpr int64_t kKernelPieceBytes = 16 * 1024;

void check_ids(const at::Tensor& ids, const char* name) {
  TORCH_CHECK(ids.device().is_cpu(), name, " must be a CPU tensor");
  TORCH_CHECK(ids.scalar_type() == at::kLong, name, " must be int64, got ", ids.scalar_type());
  TORCH_CHECK(ids.dim() == 1 && ids.is_contiguous(), name, " must be 1-D and contiguous");
}

cudaEvent_t make_event() {
  cudaEvent_t event = nullptr;
  C10_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  return event;
}

bool is_aligned16(const void* pointer) {
  return reinterpret_cast<uintptr_t>(pointer) % 16 == 0;
}

}  // namespace

CudaJob::CudaJob(cudaEvent_t finished, int device_index, CopyMethod method)
    : finished_(finished), device_index_(device_index), method_(method) {}

CudaJob::~CudaJob() {
  // Destroying a pending event is allowed: CUDA releases it once the event completes.
  if (finished_ != nullptr) cudaEventDestroy(finished_);
}

bool CudaJob::done() const {
  if (finished_ == nullptr) return true;
  const cudaError_t status = cudaEventQuery(finished_);
  if (status == cudaErrorNotReady) {
    (void)cudaGetLastError();  // a not-ready query is not an error; do not leave it behind
    return false;
  }
  C10_CUDA_CHECK(status);
  return true;
}

void CudaJob::wait() const {
  if (finished_ != nullptr) C10_CUDA_CHECK(cudaEventSynchronize(finished_));
}

void CudaJob::order_compute_after() const {
  if (finished_ == nullptr) return;
  const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_index_));
  const cudaStream_t compute = at::cuda::getCurrentCUDAStream(device_index_).stream();
  C10_CUDA_CHECK(cudaStreamWaitEvent(compute, finished_, 0));
}

std::string CudaJob::method() const {
  switch (method_) {
    case CopyMethod::kKernel: return "kernel";
    case CopyMethod::kBatchMemcpy: return "batch_memcpy";
    case CopyMethod::kMemcpyLoop: return "memcpy_loop";
    default: return "none";
  }
}

CudaTransfer::CudaTransfer(at::Tensor device_kv, at::Tensor host_kv, CudaTransferOptions options)
    : device_kv_(std::move(device_kv)), host_kv_(std::move(host_kv)), options_(options) {
  TORCH_CHECK(device_kv_.is_cuda(), "device_kv must be a CUDA tensor");
  // An empty host pool (a shard run without one) holds no memory to pin; no id can address it.
  TORCH_CHECK(host_kv_.device().is_cpu() && (host_kv_.numel() == 0 || host_kv_.is_pinned()),
              "host_kv must be pinned");
  TORCH_CHECK(device_kv_.is_contiguous() && host_kv_.is_contiguous(), "pools must be contiguous");
  TORCH_CHECK(device_kv_.dim() >= 1, "pools need a leading block dimension");
  TORCH_CHECK(device_kv_.sizes().slice(1) == host_kv_.sizes().slice(1),
              "device_kv and host_kv must share shape[1:]");
  TORCH_CHECK(device_kv_.scalar_type() == host_kv_.scalar_type(), "pools must share a dtype");
  TORCH_CHECK(options_.kernel_ctas >= 1, "kernel_ctas must be at least 1");
  device_index_ = device_kv_.device().index();
  block_bytes_ = device_kv_.numel() / std::max<int64_t>(1, device_kv_.size(0)) *
                 device_kv_.element_size();
  const c10::cuda::CUDAGuard guard(device_kv_.device());
  void* mapped = nullptr;
  if (host_kv_.numel() == 0) {
    // Nothing to map: the kernel path stays unavailable, and no transfer can be valid anyway.
  } else if (cudaHostGetDevicePointer(&mapped, host_kv_.data_ptr(), 0) == cudaSuccess) {
    host_mapped_ = static_cast<char*>(mapped);
  } else {
    (void)cudaGetLastError();  // not mapped: the kernel path is simply unavailable
  }
  int driver_version = 0;
  C10_CUDA_CHECK(cudaDriverGetVersion(&driver_version));
  batch_memcpy_available_ = batch_memcpy_compiled() && driver_version >= 12080;
  C10_CUDA_CHECK(cudaStreamCreateWithFlags(&out_stream_, cudaStreamNonBlocking));
  C10_CUDA_CHECK(cudaStreamCreateWithFlags(&in_stream_, cudaStreamNonBlocking));
  out_ready_ = make_event();
  in_ready_ = make_event();
}

CudaTransfer::~CudaTransfer() {
  const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_index_));
  for (cudaStream_t stream : {out_stream_, in_stream_}) {
    if (stream == nullptr) continue;
    cudaStreamSynchronize(stream);
    cudaStreamDestroy(stream);
  }
  for (cudaEvent_t event : {out_ready_, in_ready_}) {
    if (event != nullptr) cudaEventDestroy(event);
  }
}

CopyMethod CudaTransfer::choose_method(const std::vector<CopyRun>& runs,
                                       CopyMethod requested) const {
  const CopyMethod dma = batch_memcpy_available_ ? CopyMethod::kBatchMemcpy
                                                 : CopyMethod::kMemcpyLoop;
  if (requested == CopyMethod::kKernel) {
    TORCH_CHECK(kernel_available(), "host_kv is not mapped into the device's address space");
    return requested;
  }
  if (requested == CopyMethod::kBatchMemcpy) {
    TORCH_CHECK(batch_memcpy_available_, "cudaMemcpyBatchAsync needs CUDA 12.8 or later");
    return requested;
  }
  if (requested == CopyMethod::kMemcpyLoop) return requested;
  if (!kernel_available()) return dma;
  int64_t total_bytes = 0;
  for (const CopyRun& run : runs) total_bytes += run.bytes;
  const int64_t mean_run_bytes = total_bytes / static_cast<int64_t>(runs.size());
  return mean_run_bytes >= options_.dma_min_run_bytes ? dma : CopyMethod::kKernel;
}

void CudaTransfer::launch_kernel(const char* src, char* dst, const std::vector<CopyRun>& runs,
                                 cudaStream_t stream) {
  const std::vector<CopyRun> pieces = split_runs(runs, kKernelPieceBytes);
  static_assert(sizeof(CopyRun) == 3 * sizeof(int64_t), "CopyRun must pack as 3 int64");
  const int64_t count = static_cast<int64_t>(pieces.size());
  // pieces: [count, 3] int64 — staged in pinned memory and uploaded on the copy stream; the
  // non-blocking copy records the stream on both buffers so neither is reused too early.
  const auto pinned = at::TensorOptions().dtype(at::kLong).pinned_memory(true);
  at::Tensor staged = at::empty({count, 3}, pinned);
  std::memcpy(staged.data_ptr(), pieces.data(), pieces.size() * sizeof(CopyRun));
  const c10::cuda::CUDAStreamGuard stream_guard(
      c10::cuda::getStreamFromExternal(stream, static_cast<c10::DeviceIndex>(device_index_)));
  at::Tensor on_device = at::empty({count, 3}, device_kv_.options().dtype(at::kLong));
  on_device.copy_(staged, /*non_blocking=*/true);
  bool aligned = is_aligned16(src) && is_aligned16(dst);
  for (const CopyRun& piece : pieces) {
    aligned = aligned && piece.src_offset % 16 == 0 && piece.dst_offset % 16 == 0 &&
              piece.bytes % 16 == 0;
  }
  const auto* device_pieces = reinterpret_cast<const CopyRun*>(on_device.data_ptr());
  const int ctas = static_cast<int>(options_.kernel_ctas);
  if (options_.kernel_launch_bytes <= 0) {
    C10_CUDA_CHECK(launch_gather_scatter(src, dst, device_pieces, count, aligned, ctas, stream));
    return;
  }
  int64_t first = 0;
  int64_t bytes = 0;
  for (int64_t i = 0; i < count; ++i) {
    bytes += pieces[static_cast<size_t>(i)].bytes;
    if (bytes >= options_.kernel_launch_bytes || i + 1 == count) {
      C10_CUDA_CHECK(launch_gather_scatter(src, dst, device_pieces + first, i + 1 - first,
                                           aligned, ctas, stream));
      first = i + 1;
      bytes = 0;
    }
  }
}

std::shared_ptr<CudaJob> CudaTransfer::copy(bool swap_out, const at::Tensor& src_ids,
                                            const at::Tensor& dst_ids, CopyMethod method) {
  check_ids(src_ids, "src_ids");
  check_ids(dst_ids, "dst_ids");
  TORCH_CHECK(src_ids.numel() == dst_ids.numel(), "src_ids and dst_ids differ in length");
  const int64_t count = src_ids.numel();
  if (count == 0 || block_bytes_ == 0) {
    return std::make_shared<CudaJob>(nullptr, device_index_, CopyMethod::kAuto);
  }
  const at::Tensor& src_pool = swap_out ? device_kv_ : host_kv_;
  const at::Tensor& dst_pool = swap_out ? host_kv_ : device_kv_;
  const int64_t* src_ptr = src_ids.data_ptr<int64_t>();
  const int64_t* dst_ptr = dst_ids.data_ptr<int64_t>();
  check_ids_in_range(src_ptr, count, src_pool.size(0), "src_ids");
  check_ids_in_range(dst_ptr, count, dst_pool.size(0), "dst_ids");
  const std::vector<CopyRun> runs = coalesce_runs(src_ptr, dst_ptr, count, block_bytes_);
  const CopyMethod chosen = choose_method(runs, method);

  const std::lock_guard<std::mutex> lock(swap_out ? out_mutex_ : in_mutex_);
  const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_index_));
  const cudaStream_t stream = swap_out ? out_stream_ : in_stream_;
  const cudaEvent_t ready = swap_out ? out_ready_ : in_ready_;
  // Order after the compute already issued: the copy stream waits, the host does not.
  C10_CUDA_CHECK(cudaEventRecord(ready, at::cuda::getCurrentCUDAStream(device_index_).stream()));
  C10_CUDA_CHECK(cudaStreamWaitEvent(stream, ready, 0));

  const char* src = static_cast<const char*>(src_pool.data_ptr());
  char* dst = static_cast<char*>(dst_pool.data_ptr());
  if (chosen == CopyMethod::kKernel) {
    // The kernel addresses host memory through its mapped device view.
    if (swap_out) dst = host_mapped_; else src = host_mapped_;
    launch_kernel(src, dst, runs, stream);
  } else {
    C10_CUDA_CHECK(dma_copy_runs(src, dst, runs, chosen == CopyMethod::kBatchMemcpy, stream));
  }
  cudaEvent_t finished = make_event();
  const cudaError_t recorded = cudaEventRecord(finished, stream);
  if (recorded != cudaSuccess) cudaEventDestroy(finished);
  C10_CUDA_CHECK(recorded);
  return std::make_shared<CudaJob>(finished, device_index_, chosen);
}

void CudaTransfer::copy_per_block(bool swap_out, const at::Tensor& src_ids,
                                  const at::Tensor& dst_ids) {
  check_ids(src_ids, "src_ids");
  check_ids(dst_ids, "dst_ids");
  TORCH_CHECK(src_ids.numel() == dst_ids.numel(), "src_ids and dst_ids differ in length");
  const at::Tensor& src_pool = swap_out ? device_kv_ : host_kv_;
  const at::Tensor& dst_pool = swap_out ? host_kv_ : device_kv_;
  check_ids_in_range(src_ids.data_ptr<int64_t>(), src_ids.numel(), src_pool.size(0), "src_ids");
  check_ids_in_range(dst_ids.data_ptr<int64_t>(), dst_ids.numel(), dst_pool.size(0), "dst_ids");
  const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_index_));
  C10_CUDA_CHECK(memcpy_per_block(static_cast<const char*>(src_pool.data_ptr()),
                                  static_cast<char*>(dst_pool.data_ptr()),
                                  src_ids.data_ptr<int64_t>(), dst_ids.data_ptr<int64_t>(),
                                  src_ids.numel(), block_bytes_,
                                  at::cuda::getCurrentCUDAStream(device_index_).stream()));
}

}  // namespace duplexkv
