"""Paged attention over the block-first KV cache, and the per-step metadata it reads.

The runner builds one `AttentionMetadata` per step (indices and masks computed once, not per
layer); every layer then does one scatter of its new K/V into the cache and, per group of
requests, one gather of the context plus one SDPA call. Requests are split into two groups —
prefill chunks (padded to the longest chunk) and decodes (one query each) — so a long prefill
does not pad every decode to its length."""
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class AttentionGroup:
    # Rows of the flat token batch this group's queries come from; the group's rows are
    # contiguous in the batch: [row_start, row_start + num_rows).
    row_start: int
    num_rows: int
    # [B, S_ctx / block_size] device block ids of each request's context (padded with a valid id).
    block_tables: torch.Tensor
    # [B, 1, Q, S_ctx] True where a query may attend a key; None when every key is visible.
    mask: torch.Tensor | None
    # Prefill only: [B, Q] row of each padded query in the group ([row_start, ...)).
    query_rows: torch.Tensor | None = None
    # Prefill only: [num_rows] index of each real query in the flattened [B * Q] padded layout.
    real_queries: torch.Tensor | None = None


@dataclass(frozen=True)
class AttentionMetadata:
    # [T] position of every token of the flat batch.
    positions: torch.Tensor
    # [T] block and in-block offset where each new token's K/V is written.
    slot_blocks: torch.Tensor
    slot_offsets: torch.Tensor
    groups: tuple[AttentionGroup, ...]


def write_kv(layer_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttentionMetadata) -> None:
    """Stores the step's new keys and values in their slots.

    layer_cache: [N, 2, block_size, Hkv, D] (one layer's view of the cache); k, v: [T, Hkv, D]."""
    # Advanced indices on dims 0 and 2 with a slice between: the target is [T, 2, Hkv, D].
    layer_cache[meta.slot_blocks, :, meta.slot_offsets] = torch.stack((k, v), dim=1)


def _gather_context(layer_cache: torch.Tensor, block_tables: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # Gathering whole blocks copies block_size·Hkv·D contiguous values per index, far cheaper
    # than per-token indexing.  k, v: [B, nb, bs, Hkv, D] -> [B, Hkv, S_ctx, D] (views).
    batch, num_blocks = block_tables.shape
    _, _, block_size, num_kv_heads, head_dim = layer_cache.shape
    seq = num_blocks * block_size
    k = layer_cache[:, 0][block_tables].view(batch, seq, num_kv_heads, head_dim).transpose(1, 2)
    v = layer_cache[:, 1][block_tables].view(batch, seq, num_kv_heads, head_dim).transpose(1, 2)
    return k, v


def paged_attention(q: torch.Tensor, layer_cache: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
    """q: [T, H, D] (rotated) -> [T, H·D], attending over each request's cached context.

    torch SDPA picks a fused kernel on both CPU and GPU (flash / memory-efficient), handles
    grouped-query attention without materialising repeated K/V, and takes an arbitrary mask,
    which is what mixing chunked prefills and decodes in one call needs."""
    num_tokens, num_heads, head_dim = q.shape
    out = q.new_empty(num_tokens, num_heads * head_dim)
    for group in meta.groups:
        k, v = _gather_context(layer_cache, group.block_tables)
        rows = slice(group.row_start, group.row_start + group.num_rows)
        if group.query_rows is None:
            # Decodes: one query per request.  qg: [B, H, 1, D]
            qg = q[rows].unsqueeze(2)
            og = F.scaled_dot_product_attention(qg, k, v, attn_mask=group.mask, enable_gqa=True)
            out[rows] = og.reshape(group.num_rows, num_heads * head_dim)
        else:
            # Prefill chunks padded to the longest.  qg: [B, H, Q, D]
            qg = q[group.query_rows].transpose(1, 2)
            og = F.scaled_dot_product_attention(qg, k, v, attn_mask=group.mask, enable_gqa=True)
            batch, _, queries, _ = og.shape
            flat = og.transpose(1, 2).reshape(batch * queries, num_heads * head_dim)
            out[rows] = flat[group.real_queries]
    return out
