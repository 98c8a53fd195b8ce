"""TransferEngine: the shard's entry point to DuplexKV.

Validates pools once and every plan on entry, then hands the copies to a backend that runs
them off the calling thread: CUDA (two copy streams, ordered by events) when the device pool
is on a GPU, multi-threaded CPU gather/scatter otherwise.
"""

from __future__ import annotations

import torch

from .config import TransferConfig
from .cpu_backend import CpuBackend
from .handle import TransferHandle
from .validation import Direction, check_no_overlap, check_pools, make_plan


def _make_backend(
    kind: str, device_kv: torch.Tensor, host_kv: torch.Tensor, config: TransferConfig
):
    if kind == "cuda":
        # Imported lazily: building the CUDA extension needs a CUDA toolchain.
        from .cuda_backend import CudaBackend

        return CudaBackend(device_kv, host_kv, config)
    return CpuBackend(device_kv, host_kv, config.cpu_threads)


class TransferEngine:
    """Moves whole KV blocks between a device pool and a host pool, both directions at once.

    device_kv: [num_device_blocks, *block]; host_kv: [num_host_blocks, *block] (pinned on a
    GPU host). One block across all layers is contiguous, so each block is one memory run.
    `config` tunes the backends (thread count, CUDA copy path); the defaults suit most hosts.
    """

    def __init__(
        self,
        device_kv: torch.Tensor,
        host_kv: torch.Tensor,
        config: TransferConfig | None = None,
    ) -> None:
        kind = check_pools(device_kv, host_kv)
        self._num_device_blocks = int(device_kv.shape[0])
        self._num_host_blocks = int(host_kv.shape[0])
        self._backend_name = kind
        self._backend = _make_backend(kind, device_kv, host_kv, config or TransferConfig())

    @property
    def backend(self) -> str:
        """"cuda" or "cpu"."""
        return self._backend_name

    @property
    def dma_min_run_bytes(self) -> int | None:
        """CUDA: the run size from which "auto" uses the copy engines (measured unless set)."""
        return getattr(self._backend, "dma_min_run_bytes", None)

    def submit(self, swap_out: Direction = None, swap_in: Direction = None) -> TransferHandle:
        """Starts swap-out (device→host) and swap-in (host→device); returns at once.

        swap_out = (src_device_blocks, dst_host_blocks), swap_in = (src_host_blocks,
        dst_device_blocks); either may be None or empty. Raises ValueError, changing nothing,
        when the plan is malformed.

        Copies of one direction run in submit order; the two directions of different submits
        are not ordered against each other, so a block written by one submit's swap-in must
        not be read by an earlier, unconfirmed swap-out (the caller confirms with done/wait
        before reusing a swapped-out block, as the Step protocol requires).
        """
        if self._backend is None:
            raise RuntimeError("TransferEngine is closed")
        out_plan = make_plan(swap_out, self._num_device_blocks, self._num_host_blocks, "swap_out")
        in_plan = make_plan(swap_in, self._num_host_blocks, self._num_device_blocks, "swap_in")
        check_no_overlap(out_plan, in_plan)
        out_done, in_done = self._backend.start(out_plan, in_plan)
        return TransferHandle(out_done, in_done)

    def close(self) -> None:
        """Waits for running copies and stops the backend's threads; idempotent."""
        if self._backend is not None:
            self._backend.close()
            self._backend = None

    def __enter__(self) -> TransferEngine:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
