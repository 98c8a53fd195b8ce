"""The caller's view of one submitted transfer: completion flags, waiting, compute ordering.

Owns nothing but the two per-direction completions the backend returned; the backends copy
the block ids they need at submit time.
"""

from __future__ import annotations

from typing import Protocol


class Completion(Protocol):
    """One direction of one submit, as a backend reports it."""

    @property
    def method(self) -> str:
        """The path that moves the blocks (e.g. "threads", "kernel", "batch_memcpy"), or
        "none" for an empty direction."""

    def done(self) -> bool:
        """True once the copy has finished (or failed); never blocks."""

    def wait(self) -> None:
        """Blocks until the copy has finished; re-raises the backend's error if it failed."""

    def order_compute_after(self) -> None:
        """Makes compute issued from now on run after the copy (CUDA: stream wait, no sync)."""


class TransferHandle:
    """Completion of one `TransferEngine.submit`: swap-out and swap-in, each tracked apart."""

    def __init__(self, swap_out: Completion, swap_in: Completion) -> None:
        self._swap_out = swap_out
        self._swap_in = swap_in

    @property
    def methods(self) -> tuple[str, str]:
        """(swap-out path, swap-in path) the backend chose, for logs and benchmarks."""
        return self._swap_out.method, self._swap_in.method

    def out_done(self) -> bool:
        """True once every swap-out copy (device → host) has landed; non-blocking."""
        return self._swap_out.done()

    def in_done(self) -> bool:
        """True once every swap-in copy (host → device) has landed; non-blocking."""
        return self._swap_in.done()

    def done(self) -> bool:
        """True once both directions have completed; non-blocking."""
        return self.out_done() and self.in_done()

    def wait(self) -> None:
        """Blocks until both directions have completed; raises if either failed."""
        try:
            self._swap_out.wait()
        finally:
            # Wait for the other direction even if the first failed: its threads or stream
            # may still be using the plan's memory.
            self._swap_in.wait()

    def order_compute_after_in(self) -> None:
        """Orders compute issued after this call behind the swap-in (CUDA: no host sync)."""
        self._swap_in.order_compute_after()
