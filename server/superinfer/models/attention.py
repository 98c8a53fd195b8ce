"""Paged attention over the block-first KV cache, and the per-step metadata it reads.

The runner builds one `AttentionMetadata` per step (indices and masks computed once, not per
layer); every layer then does one scatter of its new K/V into the cache and, per group of
requests, one gather of the context plus one SDPA call. Requests are split into two groups —
prefill chunks (padded to the longest chunk) and decodes (one query each) — so a long prefill
does not pad every decode to its length.

Grouped-query attention is computed by folding the G query heads that share a KV head into
the query-length axis ([B, Hkv, G·Q, D]), so K/V are never repeated per query head.

A layer with a sliding window of its own (Gemma's local layers) reads groups built for that
window, which gather only the keys it reaches; soft-capped scores (Gemma 2) take an explicit
matmul path, since SDPA cannot cap them.

That gather + SDPA path is the CPU's. On a GPU the Triton backend builds `KernelGroup`s instead
and its kernels (triton_attention.py) read the cache through the block tables directly; the
FlashInfer backend builds a `FlashInferPlan` (flashinfer_attention.py). Which metadata a step
carries is the backend's choice (`shard.attention_backends`); `paged_attention` follows it."""
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

if TYPE_CHECKING:  # models.lora imports the decoder, which imports this module
    from .flashinfer_attention import FlashInferPlan
    from .lora import LoraBatch


@dataclass(frozen=True)
class AttentionGroup:
    # Rows of the flat token batch this group's queries come from; the group's rows are
    # contiguous in the batch: [row_start, row_start + num_rows).
    row_start: int
    num_rows: int
    # [B, 2, Hkv, S_ctx] row of each context token's K (0) and V (1) head vector in the cache
    # viewed as [N·L·2·block_size·Hkv, D], for layer 0 (layer l starts 2·block_size·Hkv·l
    # rows further). Padded with a valid row.
    context_rows: torch.Tensor
    # [B, 1, G·Q, S_ctx] True where a query may attend a key; None when every key is visible.
    mask: torch.Tensor | None
    # [B, 2, Hkv, S_ctx, D] scratch the gathered K/V land in, reused by every layer: one
    # allocation per step instead of one (page-faulting) allocation per layer.
    context_buffer: torch.Tensor | None = None
    # Prefill only: [B, Q] row of each padded query in the flat batch.
    query_rows: torch.Tensor | None = None
    # Prefill only: [num_rows] index of each real query in the flattened [B·Q] padded layout.
    real_queries: torch.Tensor | None = None


@dataclass(frozen=True)
class KernelGroup:
    """The Triton backend's view of one group of requests (rows contiguous, as above): fixed
    shapes only, so a captured CUDA graph can replay them with new contents."""

    row_start: int
    num_rows: int
    # [B, W] int32 device blocks of each request in position order, padded with a valid block.
    block_tables: torch.Tensor
    # [B] int32 keys each request attends over: its computed tokens plus this chunk.
    context_lens: torch.Tensor
    # [B + 1] int32 first row of each request's queries, relative to row_start; the last is num_rows.
    query_starts: torch.Tensor
    # Longest chunk and longest context (host-side): size the grids; a longest chunk of 1
    # selects the decode kernel.
    max_query_len: int
    max_context_len: int
    sliding_window: int | None = None


@dataclass(frozen=True)
class AttentionMetadata:
    # [T] position of every token of the flat batch.
    positions: torch.Tensor
    # [T] block and in-block offset where each new token's K/V is written.
    slot_blocks: torch.Tensor
    slot_offsets: torch.Tensor
    groups: tuple[AttentionGroup, ...]
    # Set on the Triton backend (then `groups` is empty): the kernels run instead of SDPA.
    kernel_groups: tuple[KernelGroup, ...] | None = None
    # [T] length of each token's sequence once the step is computed (its chunk's last position
    # + 1), which picks LongRoPE's frequencies; None: positions + 1 (steps of decodes only).
    sequence_lengths: torch.Tensor | None = None
    # SDPA only, for models whose layers differ in their sliding window (Gemma's local layers
    # next to global ones): (window, its groups) for each window a layer passes to
    # `paged_attention`, gathering only the keys that window reaches. The kernels take the
    # window per call instead.
    window_groups: tuple[tuple[int, tuple[AttentionGroup, ...]], ...] = ()
    # The rows that run with each LoRA adapter (`models.lora`), which the decoder layers pass
    # down to their projections; None: every row runs the base model.
    lora: "LoraBatch | None" = None
    # Set on the FlashInfer backend (then `groups` is empty): its kernels run instead of SDPA.
    flashinfer: "FlashInferPlan | None" = None

    def groups_for(self, window: int | None) -> tuple[AttentionGroup, ...]:
        """The groups a layer with `window` attends through; None: the step's own."""
        if window is None:
            return self.groups
        for candidate, groups in self.window_groups:
            if candidate == window:
                return groups
        raise ValueError(f"the step's metadata has no groups for a sliding window of {window}")


def write_kv(kv_cache: torch.Tensor, layer: int, k: torch.Tensor, v: torch.Tensor, meta: AttentionMetadata) -> None:
    """Stores the step's new keys and values in their slots.

    kv_cache: [N, L, 2, block_size, Hkv, D]; k, v: [T, Hkv, D]."""
    # Advanced indices on dims 0 and 2 of the layer view with a slice between: target [T, 2, Hkv, D].
    kv_cache[:, layer][meta.slot_blocks, :, meta.slot_offsets] = torch.stack((k, v), dim=1)


def _gather_context(kv_cache: torch.Tensor, layer: int, context_rows: torch.Tensor, buffer: torch.Tensor | None):
    # One index_select gathers K and V of every request straight into the head-major layout
    # SDPA reads fastest (a strided [B, S, Hkv, D] view runs about 2x slower on the CPU).
    # -> k, v: [B, Hkv, S_ctx, D]
    _, _, _, block_size, num_kv_heads, head_dim = kv_cache.shape
    layer_rows = kv_cache.view(-1, head_dim)[2 * block_size * num_kv_heads * layer :]
    if buffer is None:
        buffer = layer_rows.new_empty(*context_rows.shape, head_dim)
    torch.index_select(layer_rows, 0, context_rows.view(-1), out=buffer.view(-1, head_dim))
    return buffer[:, 0], buffer[:, 1]


def _softcapped_attention(qg: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                          scale: float, softcap: float) -> torch.Tensor:
    """SDPA's contract with the scores capped to (-softcap, softcap) by softcap·tanh(s / softcap)
    before the mask (Gemma 2), which no fused SDPA kernel offers: explicit matmuls, the softmax
    in float32 as the reference implementation computes it.

    qg: [B, Hkv, G·Q, D]; k, v: [B, Hkv, S, D]; mask: [B, 1, G·Q, S] or None -> [B, Hkv, G·Q, D]"""
    scores = torch.matmul(qg, k.transpose(-1, -2)) * scale
    scores = torch.tanh(scores / softcap) * softcap
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.matmul(scores.softmax(-1, dtype=torch.float32).to(v.dtype), v)


def _attend(qg: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float | None,
            softcap: float | None) -> torch.Tensor:
    if softcap is None:
        return F.scaled_dot_product_attention(qg, k, v, attn_mask=mask, scale=scale)
    return _softcapped_attention(qg, k, v, mask, qg.shape[-1] ** -0.5 if scale is None else scale, softcap)


def paged_attention(q: torch.Tensor, kv_cache: torch.Tensor, layer: int, meta: AttentionMetadata,
                    window: int | None = None, scale: float | None = None,
                    softcap: float | None = None) -> torch.Tensor:
    """q: [T, H, D] (rotated) -> [T, H·D], attending over each request's cached context.

    torch SDPA picks a fused kernel on both CPU and GPU (flash / memory-efficient) and takes
    an arbitrary mask, which is what mixing chunked prefills and decodes in one call needs.
    A layer may pass its own sliding window (groups built for it: `AttentionMetadata.window_groups`),
    softmax scale (None: 1/sqrt(D)) and score soft-capping (None: none)."""
    if meta.flashinfer is not None:
        return meta.flashinfer.attend(q, kv_cache, layer, window, scale, softcap)
    if meta.kernel_groups is not None:
        # Imported on first use: triton is the GPU backend's dependency, not the CPU path's.
        from .triton_attention import kernel_attention

        return kernel_attention(q, kv_cache, layer, meta, window, scale, softcap)
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = kv_cache.shape[4]
    groups = num_heads // num_kv_heads
    out = q.new_empty(num_tokens, num_heads * head_dim)
    for group in meta.groups_for(window):
        k, v = _gather_context(kv_cache, layer, group.context_rows, group.context_buffer)
        rows = slice(group.row_start, group.row_start + group.num_rows)
        if group.query_rows is None:
            # Decodes, one query each.  qg: [B, Hkv, G, D]
            qg = q[rows].view(group.num_rows, num_kv_heads, groups, head_dim)
            og = _attend(qg, k, v, group.mask, scale, softcap)
            out[rows] = og.reshape(group.num_rows, num_heads * head_dim)
            continue
        # Prefill chunks padded to the longest.  [B, Q, H, D] -> qg: [B, Hkv, G·Q, D]
        batch, queries = group.query_rows.shape
        qg = q[group.query_rows].view(batch, queries, num_kv_heads, groups, head_dim)
        qg = qg.permute(0, 2, 3, 1, 4).reshape(batch, num_kv_heads, groups * queries, head_dim)
        og = _attend(qg, k, v, group.mask, scale, softcap)
        og = og.view(batch, num_kv_heads, groups, queries, head_dim).permute(0, 3, 1, 2, 4)
        out[rows] = og.reshape(batch * queries, num_heads * head_dim)[group.real_queries]
    return out
