"""Tracks the KV transfers the router ordered: submits each step's transfers to the DuplexKV
engine in one call and reports each transfer id exactly once when its copy has landed.
Owns the in-flight handles.

Under tensor parallelism every rank has a tracker over its own slice of the blocks, fed the
same transfers; `agree` makes a transfer complete when it has completed on every rank, so the
trackers stay identical and the router hears of a transfer once all its copies have landed."""
from collections.abc import Callable
from dataclasses import dataclass

import torch
from superinfer_kv import TransferEngine, TransferHandle

from .plan import InFlight


@dataclass
class _Pending:
    handle: TransferHandle
    is_out: bool
    device_blocks: frozenset[int]
    host_blocks: frozenset[int]

    def done(self) -> bool:
        return self.handle.out_done() if self.is_out else self.handle.in_done()


class TransferTracker:
    def __init__(self, engine: TransferEngine, device: torch.device,
                 agree: Callable[[list[bool]], list[bool]] | None = None):
        self.engine = engine
        self.device = device
        # Per pending transfer (in order), whether it is done on every rank; None: one rank.
        self.agree = agree
        self._pending: dict[int, _Pending] = {}

    def submit(self, rotate_out, rotate_in) -> None:
        """rotate_out / rotate_in: Transfer messages (validated). One engine submit for the step."""
        out_pairs = ([b for t in rotate_out for b in t.src_blocks], [b for t in rotate_out for b in t.dst_blocks])
        in_pairs = ([b for t in rotate_in for b in t.src_blocks], [b for t in rotate_in for b in t.dst_blocks])
        if not out_pairs[0] and not in_pairs[0]:
            # Nothing to copy: empty transfers complete at once.
            handle = None
        else:
            handle = self.engine.submit(
                swap_out=out_pairs if out_pairs[0] else None, swap_in=in_pairs if in_pairs[0] else None
            )
        for transfers, is_out in ((rotate_out, True), (rotate_in, False)):
            for transfer in transfers:
                device_blocks = transfer.src_blocks if is_out else transfer.dst_blocks
                host_blocks = transfer.dst_blocks if is_out else transfer.src_blocks
                self._pending[transfer.id] = _Pending(handle or _DONE, is_out, frozenset(device_blocks), frozenset(host_blocks))

    def order_before_compute(self, read_blocks: set[int], written_blocks: set[int]) -> None:
        """Makes this step's compute wait for the transfers touching its blocks: a copy in whose
        request computes in the same step (the router brings a request back and computes it at
        once: on a GPU the compute stream waits for the copy's event, with no host sync), and a
        copy out still reading a block the step would write (a plan never asks for that; it
        keeps a misbehaving one from overwriting what is being saved)."""
        for pending in self._pending.values():
            if pending.is_out and pending.device_blocks & written_blocks:
                pending.handle.wait()
            elif not pending.is_out and pending.device_blocks & (read_blocks | written_blocks):
                if self.device.type == "cuda":
                    pending.handle.order_compute_after_in()
                else:
                    pending.handle.wait()

    def wait_for(self, transfer_ids: list[int]) -> None:
        """Waits until the given transfers (pending) have landed."""
        for tid in transfer_ids:
            self._pending[tid].handle.wait()

    def poll(self) -> list[int]:
        """Ids of transfers that completed since the last poll (each reported once)."""
        ids = list(self._pending)
        done = [self._pending[tid].done() for tid in ids]
        if self.agree is not None and ids:  # every rank has the same pending ids, so all call it
            done = self.agree(done)
        finished = [tid for tid, is_done in zip(ids, done) if is_done]
        for tid in finished:
            del self._pending[tid]
        return finished

    def in_flight(self) -> InFlight:
        pending = self._pending.values()
        return InFlight(
            transfer_ids=frozenset(self._pending),
            host_written=frozenset(b for p in pending if p.is_out for b in p.host_blocks),
            host_read=frozenset(b for p in pending if not p.is_out for b in p.host_blocks),
            device_written=frozenset(b for p in pending if not p.is_out for b in p.device_blocks),
            device_read=frozenset(b for p in pending if p.is_out for b in p.device_blocks),
        )

    def drain(self) -> None:
        """Waits for every transfer in flight and forgets them (none will be reported)."""
        for pending in self._pending.values():
            pending.handle.wait()
        self._pending.clear()

    def close(self) -> None:
        self.drain()
        self.engine.close()


class _Completed:
    """Stands in for the handle of a transfer with no blocks."""

    def out_done(self) -> bool:
        return True

    def in_done(self) -> bool:
        return True

    def wait(self) -> None:
        pass

    def order_compute_after_in(self) -> None:
        pass


_DONE = _Completed()
