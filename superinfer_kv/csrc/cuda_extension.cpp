// Python binding of the CUDA backend: CudaTransfer(device_kv, host_kv, kernel_ctas,
// dma_min_run_bytes, kernel_launch_bytes) and its CudaJob. Blocking calls release the GIL.
#include <torch/extension.h>

#include "cuda_transfer.h"
#include "dma_copy.h"

namespace {

std::unique_ptr<duplexkv::CudaTransfer> make_transfer(at::Tensor device_kv, at::Tensor host_kv,
                                                      int64_t kernel_ctas,
                                                      int64_t dma_min_run_bytes,
                                                      int64_t kernel_launch_bytes) {
  duplexkv::CudaTransferOptions options;
  options.kernel_ctas = kernel_ctas;
  options.dma_min_run_bytes = dma_min_run_bytes;
  options.kernel_launch_bytes = kernel_launch_bytes;
  return std::make_unique<duplexkv::CudaTransfer>(std::move(device_kv), std::move(host_kv),
                                                  options);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  using duplexkv::CopyMethod;
  using duplexkv::CudaJob;
  using duplexkv::CudaTransfer;
  using release_gil = pybind11::call_guard<pybind11::gil_scoped_release>;
  pybind11::class_<CudaJob, std::shared_ptr<CudaJob>>(module, "CudaJob")
      .def("done", &CudaJob::done)
      .def("wait", &CudaJob::wait, release_gil())
      .def("order_compute_after", &CudaJob::order_compute_after)
      .def_property_readonly("method", &CudaJob::method);
  pybind11::class_<CudaTransfer>(module, "CudaTransfer")
      .def(pybind11::init(&make_transfer))
      .def(
          "copy",
          [](CudaTransfer& self, bool swap_out, const at::Tensor& src_ids,
             const at::Tensor& dst_ids, int64_t method) {
            return self.copy(swap_out, src_ids, dst_ids, static_cast<CopyMethod>(method));
          },
          release_gil())
      .def("copy_per_block", &CudaTransfer::copy_per_block, release_gil())
      .def_property_readonly("block_bytes", &CudaTransfer::block_bytes)
      .def_property_readonly("kernel_available", &CudaTransfer::kernel_available)
      .def_property_readonly("batch_memcpy_available", &CudaTransfer::batch_memcpy_available);
  module.attr("METHODS") = pybind11::make_tuple("auto", "kernel", "batch_memcpy", "memcpy_loop");
}
