// Python binding of the CPU backend: CpuTransfer(device_kv, host_kv, num_threads) owns both
// pools (keeping them alive) and a CopyPool; copy() checks its ids, plans runs and queues them.
#include <torch/extension.h>

#include "copy_pool.h"
#include "copy_runs.h"

namespace duplexkv {
namespace {

// Largest piece one worker copies at a time: big enough for full-speed memcpy, small enough
// to spread even a single block (737 KiB for SmolLM2 in fp32) over several threads.
constexpr int64_t kMaxPieceBytes = int64_t{256} << 10;

void check_pool(const at::Tensor& pool, const char* name) {
  TORCH_CHECK(pool.device().is_cpu(), name, " must be a CPU tensor, got ", pool.device());
  TORCH_CHECK(pool.dim() >= 1, name, " must have a leading block dimension");
  TORCH_CHECK(pool.is_contiguous(), name, " must be contiguous");
}

void check_ids(const at::Tensor& ids, const char* name) {
  TORCH_CHECK(ids.device().is_cpu(), name, " must be a CPU tensor");
  TORCH_CHECK(ids.scalar_type() == at::kLong, name, " must be int64, got ", ids.scalar_type());
  TORCH_CHECK(ids.dim() == 1 && ids.is_contiguous(), name, " must be 1-D and contiguous");
}

class CpuTransfer {
 public:
  CpuTransfer(at::Tensor device_kv, at::Tensor host_kv, int64_t num_threads)
      : device_kv_(std::move(device_kv)), host_kv_(std::move(host_kv)),
        pool_(static_cast<int>(num_threads)) {
    check_pool(device_kv_, "device_kv");
    check_pool(host_kv_, "host_kv");
    TORCH_CHECK(device_kv_.sizes().slice(1) == host_kv_.sizes().slice(1),
                "device_kv and host_kv must share shape[1:]");
    TORCH_CHECK(device_kv_.scalar_type() == host_kv_.scalar_type(),
                "device_kv and host_kv must share a dtype");
    block_bytes_ = device_kv_.numel() / std::max<int64_t>(1, device_kv_.size(0)) *
                   device_kv_.element_size();
  }

  // swap_out: device → host; otherwise host → device.
  std::shared_ptr<CopyJob> copy(bool swap_out, const at::Tensor& src_ids,
                                const at::Tensor& dst_ids) {
    check_ids(src_ids, "src_ids");
    check_ids(dst_ids, "dst_ids");
    TORCH_CHECK(src_ids.numel() == dst_ids.numel(), "src_ids and dst_ids differ in length");
    const at::Tensor& src = swap_out ? device_kv_ : host_kv_;
    at::Tensor& dst = swap_out ? host_kv_ : device_kv_;
    const int64_t count = src_ids.numel();
    const int64_t* src_ptr = src_ids.data_ptr<int64_t>();
    const int64_t* dst_ptr = dst_ids.data_ptr<int64_t>();
    const char* src_base = static_cast<const char*>(src.data_ptr());
    char* dst_base = static_cast<char*>(dst.data_ptr());
    if (count == 0 || block_bytes_ == 0) {
      return std::make_shared<CopyJob>(src_base, dst_base, std::vector<CopyRun>{}, 0);
    }
    pybind11::gil_scoped_release no_gil;
    check_ids_in_range(src_ptr, count, src.size(0), "src_ids");
    check_ids_in_range(dst_ptr, count, dst.size(0), "dst_ids");
    std::vector<CopyRun> pieces =
        split_runs(coalesce_runs(src_ptr, dst_ptr, count, block_bytes_), kMaxPieceBytes);
    return pool_.submit(src_base, dst_base, std::move(pieces),
                        swap_out ? CopyPool::kSwapOut : CopyPool::kSwapIn);
  }

  int64_t num_threads() const { return pool_.num_threads(); }
  int64_t block_bytes() const { return block_bytes_; }

 private:
  // Declared before pool_ so that the pool (which drains its queue) goes first.
  at::Tensor device_kv_;
  at::Tensor host_kv_;
  int64_t block_bytes_ = 0;
  CopyPool pool_;
};

}  // namespace
}  // namespace duplexkv

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  using duplexkv::CopyJob;
  using duplexkv::CpuTransfer;
  pybind11::class_<CopyJob, std::shared_ptr<CopyJob>>(module, "CopyJob")
      .def("done", &CopyJob::done)
      .def("wait", &CopyJob::wait, pybind11::call_guard<pybind11::gil_scoped_release>());
  pybind11::class_<CpuTransfer>(module, "CpuTransfer")
      .def(pybind11::init<at::Tensor, at::Tensor, int64_t>())
      .def("copy", &CpuTransfer::copy)
      .def_property_readonly("num_threads", &CpuTransfer::num_threads)
      .def_property_readonly("block_bytes", &CpuTransfer::block_bytes);
}
