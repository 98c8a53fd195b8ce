"""CUDA backend: swap-out and swap-in on two dedicated non-blocking streams, ordered by events.

At submit each copy stream waits on an event recorded on the caller's current stream, so a
transfer sees all compute issued before it; each copy records its own event, which the handle
polls (`done`), waits on (`wait`, this thread only) or makes the current stream wait on
(`order_compute_after_in`, no host sync). Nothing synchronizes the whole device.
"""

from __future__ import annotations

import torch

from .config import CUDA_METHODS, TransferConfig
from .extension import load_cuda_extension
from .validation import CopyPlan


class CudaCompletion:
    """One direction's copy on its stream, tracked by a CUDA event."""

    def __init__(self, job) -> None:
        self._job = job

    @property
    def method(self) -> str:
        """The path that ran the copy: "kernel", "batch_memcpy", "memcpy_loop" or "none"."""
        return self._job.method

    def done(self) -> bool:
        return self._job.done()

    def wait(self) -> None:
        self._job.wait()

    def order_compute_after(self) -> None:
        self._job.order_compute_after()


class CudaBackend:
    """Copies between a CUDA `device_kv` and a pinned CPU `host_kv` of equal block geometry."""

    name = "cuda"

    def __init__(
        self, device_kv: torch.Tensor, host_kv: torch.Tensor, config: TransferConfig
    ) -> None:
        extension = load_cuda_extension()
        threshold = config.dma_min_run_bytes
        if threshold is None:
            from .calibrate import measured_dma_min_run_bytes

            threshold = measured_dma_min_run_bytes(
                device_kv.device.index or 0, config.kernel_ctas, config.kernel_launch_bytes
            )
        self.dma_min_run_bytes = threshold
        self._native = extension.CudaTransfer(
            device_kv, host_kv, config.kernel_ctas, threshold, config.kernel_launch_bytes
        )
        self._method = CUDA_METHODS.index(config.cuda_method)

    @property
    def native(self):
        """The extension object (benchmarks use its per-block baseline and capabilities)."""
        return self._native

    def start(
        self, swap_out: CopyPlan, swap_in: CopyPlan
    ) -> tuple[CudaCompletion, CudaCompletion]:
        out = self._native.copy(True, swap_out.src_ids, swap_out.dst_ids, self._method)
        try:
            into = self._native.copy(False, swap_in.src_ids, swap_in.dst_ids, self._method)
        except Exception:
            out.wait()  # no handle will track the swap-out: let it land before raising
            raise
        return CudaCompletion(out), CudaCompletion(into)

    def close(self) -> None:
        # Dropping the native object waits for its two streams, then frees them.
        self._native = None
