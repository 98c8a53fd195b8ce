"""CPU backend: multi-threaded gather/scatter of whole blocks between two CPU pools.

The copies run in the C++ extension's own thread pool (csrc/copy_pool.cpp), with the GIL
released, so the calling thread keeps computing while they run. Swap-out and swap-in go to
two lanes that the workers alternate between, so both directions progress at once.
"""

from __future__ import annotations

import os

import torch

from .extension import load_cpu_extension
from .validation import CopyPlan

# Copies are memory-bound: past a handful of threads more only contend for bandwidth.
MAX_COPY_THREADS = 8


class CpuCompletion:
    """One direction's copy running in the extension's thread pool."""

    def __init__(self, job, empty: bool) -> None:
        self._job = job
        self.method = "none" if empty else "threads"

    def done(self) -> bool:
        return self._job.done()

    def wait(self) -> None:
        self._job.wait()

    def order_compute_after(self) -> None:
        # CPU compute runs on the calling thread, so ordering it means waiting.
        self._job.wait()


def default_thread_count() -> int:
    """One copy thread per core the process may use, capped at MAX_COPY_THREADS."""
    return max(1, min(MAX_COPY_THREADS, len(os.sched_getaffinity(0))))


class CpuBackend:
    """Copies between `device_kv` and `host_kv`, both CPU tensors of equal block geometry."""

    name = "cpu"

    def __init__(
        self, device_kv: torch.Tensor, host_kv: torch.Tensor, num_threads: int = 0
    ) -> None:
        extension = load_cpu_extension()
        self._native = extension.CpuTransfer(
            device_kv, host_kv, num_threads or default_thread_count()
        )

    @property
    def block_bytes(self) -> int:
        return int(self._native.block_bytes)

    def start(self, swap_out: CopyPlan, swap_in: CopyPlan) -> tuple[CpuCompletion, CpuCompletion]:
        out = self._native.copy(True, swap_out.src_ids, swap_out.dst_ids)
        try:
            into = self._native.copy(False, swap_in.src_ids, swap_in.dst_ids)
        except Exception:
            out.wait()  # no handle will track the swap-out: let it land before raising
            raise
        return CpuCompletion(out, len(swap_out) == 0), CpuCompletion(into, len(swap_in) == 0)

    def close(self) -> None:
        # Dropping the native object drains its queue and joins its threads.
        self._native = None
