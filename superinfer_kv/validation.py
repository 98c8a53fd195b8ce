"""Entry checks for DuplexKV: pool geometry in the constructor, block-id plans in `submit`.

Everything here is vectorised over the id tensors (no Python loop per block), so validating a
10,000-block plan costs a few tensor ops. Owns no state.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

BlockIds = torch.Tensor | Sequence[int] | None
Direction = tuple[BlockIds, BlockIds] | None


@dataclass(frozen=True)
class CopyPlan:
    """One direction of a transfer: block `src_ids[i]` of the source pool goes to `dst_ids[i]`."""

    src_ids: torch.Tensor  # [n] int64, CPU, contiguous
    dst_ids: torch.Tensor  # [n] int64, CPU, contiguous

    def __len__(self) -> int:
        return int(self.src_ids.numel())


def check_pools(device_kv: torch.Tensor, host_kv: torch.Tensor) -> str:
    """Checks the two KV pools and returns the backend they call for ("cuda" or "cpu")."""
    for name, pool in (("device_kv", device_kv), ("host_kv", host_kv)):
        if not isinstance(pool, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(pool).__name__}")
        if pool.dim() < 1:
            raise ValueError(f"{name} must have a leading block dimension, got a 0-d tensor")
        if not pool.is_contiguous():
            raise ValueError(f"{name} must be contiguous (stride {tuple(pool.stride())})")
    if device_kv.shape[1:] != host_kv.shape[1:]:
        raise ValueError(
            "device_kv and host_kv must share the block geometry shape[1:], got "
            f"{tuple(device_kv.shape[1:])} and {tuple(host_kv.shape[1:])}"
        )
    if device_kv.dtype != host_kv.dtype:
        raise ValueError(
            f"device_kv and host_kv must share a dtype, got {device_kv.dtype} and {host_kv.dtype}"
        )
    if host_kv.device.type != "cpu":
        raise ValueError(f"host_kv must live in CPU memory, got device {host_kv.device}")
    if device_kv.device.type == "cuda":
        # An empty host pool has no memory to pin (is_pinned() is False); no id can address it.
        if host_kv.numel() and not host_kv.is_pinned():
            raise ValueError("host_kv must be pinned memory when device_kv is on a CUDA device")
        return "cuda"
    if device_kv.device.type == "cpu":
        return "cpu"
    raise ValueError(f"device_kv must be on a CUDA device or the CPU, got {device_kv.device}")


def as_block_ids(ids: BlockIds, name: str) -> torch.Tensor:
    """Normalises ids (None, an int sequence or an integer tensor) to a 1-D int64 CPU tensor."""
    if ids is None:
        return torch.empty(0, dtype=torch.int64)
    if isinstance(ids, torch.Tensor):
        tensor = ids
    else:
        if len(ids) == 0:
            return torch.empty(0, dtype=torch.int64)
        tensor = torch.as_tensor(ids)
    if tensor.device.type != "cpu":
        raise ValueError(f"{name} must be a CPU tensor, got device {tensor.device}")
    if tensor.dtype == torch.bool or tensor.dtype.is_floating_point or tensor.dtype.is_complex:
        raise ValueError(f"{name} must hold integer block ids, got dtype {tensor.dtype}")
    if tensor.dim() != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(tensor.shape)}")
    return tensor.to(torch.int64).contiguous()


def _check_range(ids: torch.Tensor, num_blocks: int, name: str) -> None:
    if ids.numel() == 0:
        return
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= num_blocks:
        bad = low if low < 0 else high
        raise ValueError(f"{name}: block id {bad} is out of range [0, {num_blocks})")


def _check_unique(ids: torch.Tensor, name: str) -> None:
    if ids.numel() < 2:
        return
    ordered = torch.sort(ids).values
    repeats = ordered[1:] == ordered[:-1]
    if bool(repeats.any()):
        duplicate = int(ordered[1:][repeats][0])
        raise ValueError(f"{name}: block id {duplicate} appears more than once")


def _check_disjoint(read: torch.Tensor, written: torch.Tensor, what: str) -> None:
    if read.numel() == 0 or written.numel() == 0:
        return
    clash = torch.isin(read, written)
    if bool(clash.any()):
        block = int(read[clash][0])
        raise ValueError(what.format(block=block))


def make_plan(direction: Direction, src_blocks: int, dst_blocks: int, name: str) -> CopyPlan:
    """Validates one direction `(src_ids, dst_ids)` against the pool sizes."""
    if direction is None:
        src_ids, dst_ids = None, None
    else:
        if len(direction) != 2:
            raise ValueError(f"{name} must be a pair (src_blocks, dst_blocks) or None")
        src_ids, dst_ids = direction
    src = as_block_ids(src_ids, f"{name} source ids")
    dst = as_block_ids(dst_ids, f"{name} destination ids")
    if src.numel() != dst.numel():
        raise ValueError(
            f"{name}: {src.numel()} source ids but {dst.numel()} destination ids; "
            "they must pair up one to one"
        )
    _check_range(src, src_blocks, f"{name} source ids")
    _check_range(dst, dst_blocks, f"{name} destination ids")
    _check_unique(src, f"{name} source ids")
    _check_unique(dst, f"{name} destination ids")
    return CopyPlan(src, dst)


def check_no_overlap(swap_out: CopyPlan, swap_in: CopyPlan) -> None:
    """Both directions run at once, so neither may touch a block the other is writing."""
    _check_disjoint(
        swap_out.src_ids,
        swap_in.dst_ids,
        "device block {block} is both read by swap_out and written by swap_in in one submit",
    )
    _check_disjoint(
        swap_in.src_ids,
        swap_out.dst_ids,
        "host block {block} is both written by swap_out and read by swap_in in one submit",
    )
