"""The attention backends, chosen once per shard (`select_attention_backend`, from
--attention-backend): each builds a step's attention metadata over the paged KV pool and says
whether decode steps may be captured in CUDA graphs. The model's layers call `paged_attention`,
which runs whatever kernels the step's metadata is for.

Every backend reads the same pool, `KVGeometry`'s block-first layout [N, L, 2, block_size,
Hkv, D] (one block across all layers is one contiguous run, the unit DuplexKV moves): the SDPA
backend gathers from it by row (`BatchLayout.rows_per_block`), the Triton kernels and FlashInfer
read one layer's strided view [N, 2, block_size, Hkv, D] through block tables.

- `sdpa`: gather + torch SDPA, the CPU's backend (and a GPU's reference).
- `triton`: the project's paged kernels (`models.triton_attention`); a GPU's default, and the
  one the decode CUDA graphs are captured for (fixed-shape metadata, no host reads).
- `flashinfer`: FlashInfer's kernels (`models.flashinfer_attention`, the `gpu` extra); steps
  run eagerly (its planning reads host-side index arrays every step)."""
from typing import ClassVar

import torch

from ..models.flashinfer_attention import FlashInferPlan, FlashInferWrappers, paged_rows
from .batch import BatchLayout, Chunk, StepBatch, flat_rows, kernel_batch, sdpa_batch
from .config import ATTENTION_BACKEND_NAMES


class AttentionBackend:
    name: ClassVar[str]
    # Whether decode steps may replay CUDA graphs captured over this backend's metadata.
    graphs: ClassVar[bool] = False

    def __init__(self, layout: BatchLayout, device: torch.device):
        self.layout = layout
        self.device = device

    def build_batch(self, chunks: list[Chunk]) -> StepBatch:
        """The step's flat batch and attention metadata, on the device."""
        raise NotImplementedError


class SdpaBackend(AttentionBackend):
    name = "sdpa"

    def build_batch(self, chunks: list[Chunk]) -> StepBatch:
        return sdpa_batch(chunks, self.layout, self.device)


class TritonBackend(AttentionBackend):
    name = "triton"
    graphs = True

    def build_batch(self, chunks: list[Chunk]) -> StepBatch:
        return kernel_batch(chunks, self.layout, self.device)


class FlashInferBackend(AttentionBackend):
    name = "flashinfer"

    def __init__(self, layout: BatchLayout, device: torch.device):
        if device.type != "cuda":
            raise ValueError("--attention-backend flashinfer needs a CUDA device")
        if layout.dtype not in (torch.float16, torch.bfloat16):
            raise ValueError(f"--attention-backend flashinfer needs float16 or bfloat16, not {layout.dtype}")
        super().__init__(layout, device)
        try:
            self.wrappers = FlashInferWrappers(device)
        except ImportError as err:
            raise ValueError("--attention-backend flashinfer needs FlashInfer: pip install 'superinfer[gpu]' "
                             f"({err})") from err

    def build_batch(self, chunks: list[Chunk]) -> StepBatch:
        flat = flat_rows(chunks, self.layout)
        return flat.batch(flat.metadata(self.layout, self.device, groups=(), flashinfer=flashinfer_plan(
            chunks, flat.prefill, flat.decode, self.layout, self.wrappers)), self.device)


def flashinfer_plan(chunks: list[Chunk], prefill: list[int], decode: list[int], layout: BatchLayout,
                    wrappers) -> FlashInferPlan:
    """The step's FlashInfer description: the prefill chunks' group first, then the decodes'
    (the flat batch's order)."""
    groups, row = [], 0
    for indices, is_decode in ((prefill, False), (decode, True)):
        if not indices:
            continue
        members = [chunks[i] for i in indices]
        group = paged_rows([len(c.token_ids) for c in members], [c.start for c in members],
                           [c.block_table for c in members], row, layout.block_size, is_decode)
        groups.append(group)
        row += group.num_rows
    return FlashInferPlan(wrappers, tuple(groups), layout.num_kv_heads * layout.query_groups, layout.num_kv_heads,
                          layout.head_dim, layout.block_size, layout.dtype, layout.sliding_window)


_BACKENDS = {backend.name: backend for backend in (SdpaBackend, TritonBackend, FlashInferBackend)}
assert tuple(_BACKENDS) == ATTENTION_BACKEND_NAMES


def default_attention_backend(device: torch.device) -> str:
    """The Triton kernels on a GPU, gather + SDPA on the CPU."""
    return "triton" if device.type == "cuda" else "sdpa"


def select_attention_backend(name: str | None, layout: BatchLayout, device: torch.device) -> AttentionBackend:
    """The backend `name` (None: the device's default) over `layout` on `device`."""
    name = name or default_attention_backend(device)
    if name not in _BACKENDS:
        raise ValueError(f"attention backend must be one of {', '.join(ATTENTION_BACKEND_NAMES)}, got {name!r}")
    return _BACKENDS[name](layout, device)
