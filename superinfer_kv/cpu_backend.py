"""CPU backend: gather/scatter of whole blocks between two CPU pools, off the calling thread.

Owns one worker thread per direction so swap-out and swap-in run at the same time.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

import torch

from .validation import CopyPlan


class CpuCompletion:
    """One direction's copy running on a worker thread."""

    def __init__(self, future: Future) -> None:
        self._future = future

    def done(self) -> bool:
        return self._future.done()

    def wait(self) -> None:
        self._future.result()

    def order_compute_after(self) -> None:
        # CPU compute runs on the calling thread, so ordering it means waiting.
        self.wait()


def _copy_blocks(src: torch.Tensor, dst: torch.Tensor, plan: CopyPlan) -> None:
    # src: [S, *block], dst: [D, *block]; torch releases the GIL inside both ops.
    dst.index_copy_(0, plan.dst_ids, src.index_select(0, plan.src_ids))


class CpuBackend:
    """Copies between `device_kv` and `host_kv`, both CPU tensors of equal block geometry."""

    name = "cpu"

    def __init__(self, device_kv: torch.Tensor, host_kv: torch.Tensor) -> None:
        self._device_kv = device_kv
        self._host_kv = host_kv
        self._out_worker = ThreadPoolExecutor(1, thread_name_prefix="duplexkv-out")
        self._in_worker = ThreadPoolExecutor(1, thread_name_prefix="duplexkv-in")

    def start(self, swap_out: CopyPlan, swap_in: CopyPlan) -> tuple[CpuCompletion, CpuCompletion]:
        out = self._out_worker.submit(_copy_blocks, self._device_kv, self._host_kv, swap_out)
        into = self._in_worker.submit(_copy_blocks, self._host_kv, self._device_kv, swap_in)
        return CpuCompletion(out), CpuCompletion(into)

    def close(self) -> None:
        self._out_worker.shutdown(wait=True)
        self._in_worker.shutdown(wait=True)
