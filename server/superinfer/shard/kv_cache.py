"""The paged KV cache: one device tensor and one host tensor of the same block-first layout
[num_blocks, num_layers, 2 (K/V), block_size, num_kv_heads, head_dim], so one block across
all layers is one contiguous run — the unit the transfer engine moves.

Both pools are zero-filled: attention multiplies masked-out context by exactly zero, and
uninitialised memory holding NaN would survive that (0 · NaN = NaN)."""
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class KVGeometry:
    # num_kv_heads: the KV heads this shard holds (all of them without tensor parallelism).
    num_layers: int
    block_size: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype

    @property
    def block_shape(self) -> tuple[int, ...]:
        # [L, 2, block_size, Hkv, D]
        return (self.num_layers, 2, self.block_size, self.num_kv_heads, self.head_dim)

    @property
    def block_bytes(self) -> int:
        elements = 1
        for size in self.block_shape:
            elements *= size
        return elements * torch.empty((), dtype=self.dtype).element_size()


def blocks_for_memory(free_bytes: int, fraction: float, block_bytes: int) -> int:
    """Device blocks that fit in `fraction` of the measured free memory."""
    return max(0, int(free_bytes * fraction) // block_bytes)


class KVCache:
    """Owns the device pool (`device`) and the host pool (`host`); layers read views of `device`.

    With `padding_block`, the device tensor has one block more than `num_device_blocks`, the
    last: the decode graphs' padding rows write and read it (`decode_graphs`); the router is
    never told of it, so no request's K/V lives there."""

    def __init__(self, geometry: KVGeometry, num_device_blocks: int, num_host_blocks: int, device: torch.device,
                 padding_block: bool = False):
        if num_device_blocks < 1:
            raise ValueError(f"the device KV pool needs at least one block, got {num_device_blocks}")
        if num_host_blocks < 0:
            raise ValueError(f"the host KV pool cannot have {num_host_blocks} blocks")
        self.geometry = geometry
        self._num_device_blocks = num_device_blocks
        self.padding_block = num_device_blocks if padding_block else None
        self.device = torch.zeros((num_device_blocks + int(padding_block), *geometry.block_shape), dtype=geometry.dtype, device=device)
        # Pinned on a GPU host so copies are true DMA and can overlap compute.
        pin = device.type == "cuda"
        self.host = torch.zeros((num_host_blocks, *geometry.block_shape), dtype=geometry.dtype, pin_memory=pin)

    @property
    def num_device_blocks(self) -> int:
        """The blocks requests use (the padding block not counted)."""
        return self._num_device_blocks

    @property
    def num_host_blocks(self) -> int:
        return int(self.host.shape[0])
