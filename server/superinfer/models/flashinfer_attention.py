"""Paged attention through FlashInfer (PyPI `flashinfer-python`, the `gpu` extra): the kernels
SGLang and vLLM run on Hopper, reading the block-first pool in place.

One layer of the pool, `pool[:, layer]`, is [N, 2, block_size, Hkv, D]: FlashInfer's single-
tensor "NHD" paged layout, strided across layers (its kernels take the page stride at run
time). A step's requests are described the way FlashInfer plans them — per group (prefill
chunks, decodes), CSR page lists (`kv_indptr`, `kv_indices`), the fill of each request's last
page and, for prefill, each chunk's first query row (`qo_indptr`); the causal mask is aligned to
the end of each context, which is what a chunk appended to its computed tokens needs.

A wrapper's plan fixes the softmax scale, soft-cap and window, which a model passes per layer:
`FlashInferPlan.attend` plans the step's wrappers on the first layer that asks for a
combination and reuses them for every later layer with the same one (two for Gemma's local and
global layers). Only the index arrays are built per step, on the host; FlashInfer copies them
to the device without blocking.

Imports flashinfer on first use: only the FlashInfer backend loads it."""
from dataclasses import dataclass, field

import torch

# FlashInfer's recommended scratch for split-K partial results, shared by the wrappers (they
# run one after another on one stream).
WORKSPACE_BYTES = 128 * 2**20


@dataclass(frozen=True)
class PagedRows:
    """One group of requests (rows contiguous in the flat batch) as FlashInfer plans it. Host
    int32 tensors."""

    row_start: int
    num_rows: int
    qo_indptr: torch.Tensor  # [B + 1] first query row of each request, relative to row_start
    kv_indptr: torch.Tensor  # [B + 1] first entry of each request's pages in kv_indices
    kv_indices: torch.Tensor  # the pages (device blocks) of every request, in position order
    last_page_len: torch.Tensor  # [B] keys in each request's last page (1..block_size)
    decode: bool


def paged_rows(lengths: list[int], starts: list[int], block_tables: list[list[int]], row_start: int,
               block_size: int, decode: bool) -> PagedRows:
    """The CSR description of chunks with `lengths` new tokens after `starts` computed ones."""
    pages, kv_indptr, last, qo_indptr = [], [0], [], [0]
    for length, start, table in zip(lengths, starts, block_tables):
        context = start + length
        used = -(-context // block_size)
        if used > len(table):
            raise ValueError(f"a context of {context} tokens needs {used} blocks, its table has {len(table)}")
        pages.extend(table[:used])
        kv_indptr.append(len(pages))
        last.append(context - (used - 1) * block_size)
        qo_indptr.append(qo_indptr[-1] + length)
    as_int32 = lambda values: torch.tensor(values, dtype=torch.int32)  # noqa: E731
    return PagedRows(row_start, qo_indptr[-1], as_int32(qo_indptr), as_int32(kv_indptr), as_int32(pages),
                     as_int32(last), decode)


class FlashInferWrappers:
    """The backend's FlashInfer state across steps: one workspace, and a prefill and a decode
    wrapper per (window, scale, soft-cap) a layer has asked for."""

    def __init__(self, device: torch.device):
        import flashinfer  # noqa: F401  (fails here, at start-up, when the extra is missing)

        self.device = device
        self.workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        self._wrappers: dict[tuple, object] = {}

    def wrapper(self, key: tuple, decode: bool):
        import flashinfer

        full = (decode, *key)
        if full not in self._wrappers:
            self._wrappers[full] = (
                flashinfer.BatchDecodeWithPagedKVCacheWrapper(self.workspace, "NHD", use_tensor_cores=True)
                if decode else flashinfer.BatchPrefillWithPagedKVCacheWrapper(self.workspace, "NHD"))
        return self._wrappers[full]


@dataclass
class FlashInferPlan:
    """One step's FlashInfer attention (carried on its `AttentionMetadata`)."""

    wrappers: FlashInferWrappers
    groups: tuple[PagedRows, ...]
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    dtype: torch.dtype
    # The model's sliding window (None: none); a layer may pass its own.
    sliding_window: int | None
    _planned: set = field(default_factory=set)

    def attend(self, q: torch.Tensor, kv_cache: torch.Tensor, layer: int, layer_window: int | None,
               scale: float | None, softcap: float | None) -> torch.Tensor:
        """`paged_attention`'s contract: q [T, H, D] (rotated) -> [T, H·D]."""
        window = layer_window or self.sliding_window
        window_left = -1 if window is None else window - 1  # keys (q - window, q]
        sm_scale = self.head_dim ** -0.5 if scale is None else scale
        key = (window_left, sm_scale, softcap)
        out = q.new_empty(q.shape[0], q.shape[1] * self.head_dim)
        pool = kv_cache[:, layer]  # [N, 2, block_size, Hkv, D]
        for group in self.groups:
            wrapper = self.wrappers.wrapper(key, group.decode)
            if (key, group.decode) not in self._planned:
                self._plan(wrapper, group, window_left, sm_scale, softcap)
                self._planned.add((key, group.decode))
            rows = slice(group.row_start, group.row_start + group.num_rows)
            out[rows] = wrapper.run(q[rows], pool).reshape(group.num_rows, -1)
        return out

    def _plan(self, wrapper, group: PagedRows, window_left: int, sm_scale: float, softcap: float | None) -> None:
        common = dict(window_left=window_left, logits_soft_cap=softcap, sm_scale=sm_scale,
                      q_data_type=self.dtype, kv_data_type=self.dtype)
        if group.decode:
            wrapper.plan(group.kv_indptr, group.kv_indices, group.last_page_len, self.num_qo_heads,
                         self.num_kv_heads, self.head_dim, self.block_size, **common)
        else:
            wrapper.plan(group.qo_indptr, group.kv_indptr, group.kv_indices, group.last_page_len,
                         self.num_qo_heads, self.num_kv_heads, self.head_dim, self.block_size,
                         causal=True, **common)
