"""Paged attention in Triton: kernels that read K/V straight from the block-first pool through
each request's block table, with no gather into a scratch buffer — the GPU path.

The pool is [N, L, 2, block_size, Hkv, D]; a kernel gets one layer's strided view of it, so
token t of a request lives in block `block_table[t // block_size]` at row `t % block_size`.
Keys are walked in tiles of KEY_TILE tokens whatever the block size (each key's block id is
loaded from the table), with an online softmax in float32 and scale 1/sqrt(D) (or the model's,
with the scores optionally soft-capped: Gemma 2).

Both kernels fold the G query heads that share a KV head into the rows of one program, so each
K/V tile is loaded once per KV head (grouped-query attention). When a decode batch is too small
to fill the GPU, each context is cut into splits whose partial outputs a second kernel combines
by their log-sum-exp. Every input is a tensor of fixed shape (block tables padded to a width,
lengths, offsets), and the wrappers neither loop over requests nor read device values on the
host (grid sizes come from host-side numbers the batch builder knows), so a CUDA graph can
replay them for a fixed batch size, table width and split count.

Imports triton: load it only on the Triton backend (TRITON_INTERPRET=1 runs these on CPU
tensors, slowly, which the tests use)."""
import math

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

from .attention import AttentionMetadata, KernelGroup

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# Keys per loop iteration of both kernels (the decode kernel's at most), and the decode
# kernel's budget for its [G, keys, D] float32 product.
KEY_TILE = 32
DECODE_PRODUCT_ELEMENTS = 8192
# Split decode: programs that keep a large GPU busy (an H200 has 132 SMs), the fewest keys a
# split is worth, and a cap that bounds the combine kernel's tile.
TARGET_PROGRAMS = 512
MIN_KEYS_PER_SPLIT = 256
MAX_SPLITS = 32
# A window no context reaches: the kernels always apply one (no branch), this when the model has none.
NO_WINDOW = 1 << 30


@triton.jit
def _logits(dots, score_scale, cap_log2, SOFTCAP: tl.constexpr):
    # q·k products -> softmax logits in log2 units: dots·score_scale (scale·log2 e), or with
    # soft-capping (Gemma 2) cap·tanh(dots·score_scale)·log2 e, score_scale then scale / cap.
    # tanh from exp2 (no libdevice under the interpreter), on |x| so exp2 never overflows.
    if SOFTCAP:
        x = dots * score_scale
        decay = tl.exp2(-2.0 * 1.4426950408889634 * tl.abs(x))  # e^(-2|x|)
        tanh = (1.0 - decay) / (1.0 + decay)
        dots = tl.where(x < 0, -tanh, tanh) * cap_log2
    else:
        dots = dots * score_scale
    return dots


def _score_scales(head_dim: int, scale: float | None, softcap: float | None) -> tuple[float, float]:
    """The kernels' (score_scale, cap_log2) for a softmax scale (None: 1/sqrt(D)) and a
    soft-cap (None: none); see _logits."""
    if softcap is not None:
        return (head_dim**-0.5 if scale is None else scale) / softcap, softcap * math.log2(math.e)
    if scale is None:
        return math.log2(math.e) / math.sqrt(head_dim), 0.0
    return math.log2(math.e) * scale, 0.0


@triton.jit
def _decode_kernel(
    q_ptr, kv_ptr, out_ptr, block_tables_ptr, context_lens_ptr, partial_ptr, lse_ptr,
    stride_q_token, stride_q_head,
    stride_kv_block, stride_kv_kind, stride_kv_slot, stride_kv_head,
    stride_out_token, stride_table,
    scale_log2, window, cap_log2,
    GROUP: tl.constexpr, BLOCK_GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, KEY_TILE: tl.constexpr, NUM_SPLITS: tl.constexpr,
    SOFTCAP: tl.constexpr,
):
    # One program per (request, KV head, split of the context): its G query heads against
    # that split's keys. With one split it writes the output; with several, each writes its
    # normalised partial output and log-sum-exp for _combine_splits_kernel.
    request = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    context_len = tl.load(context_lens_ptr + request).to(tl.int32)
    heads = kv_head * GROUP + tl.arange(0, BLOCK_GROUP)  # [BG]
    head_ok = tl.arange(0, BLOCK_GROUP) < GROUP
    dims = tl.arange(0, BLOCK_D)
    dim_ok = dims < HEAD_DIM
    q = tl.load(q_ptr + request * stride_q_token + heads[:, None] * stride_q_head + dims[None, :],
                mask=head_ok[:, None] & dim_ok[None, :], other=0.0).to(tl.float32)  # [BG, BD]
    row_max = tl.full([BLOCK_GROUP], -1.0e30, tl.float32)
    row_sum = tl.zeros([BLOCK_GROUP], tl.float32)
    acc = tl.zeros([BLOCK_GROUP, BLOCK_D], tl.float32)
    # This split's keys: [split_start, split_end), whole tiles except the context's last.
    keys_per_split = tl.cdiv(tl.cdiv(context_len, NUM_SPLITS), KEY_TILE) * KEY_TILE
    split_start = split * keys_per_split
    split_end = tl.minimum(context_len, split_start + keys_per_split)
    first_key = tl.maximum(split_start, tl.maximum(context_len - window, 0) // KEY_TILE * KEY_TILE)
    table = block_tables_ptr + request.to(tl.int64) * stride_table
    for tile_start in range(first_key, split_end, KEY_TILE):
        keys = tile_start + tl.arange(0, KEY_TILE)  # [KT] key positions
        key_ok = (keys < split_end) & (keys >= context_len - window)
        blocks = tl.load(table + keys // BLOCK_SIZE, mask=key_ok, other=0).to(tl.int64)
        rows = blocks * stride_kv_block + (keys % BLOCK_SIZE) * stride_kv_slot + kv_head * stride_kv_head  # [KT]
        kv_mask = key_ok[:, None] & dim_ok[None, :]
        k = tl.load(kv_ptr + rows[:, None] + dims[None, :], mask=kv_mask, other=0.0).to(tl.float32)  # [KT, BD]
        v = tl.load(kv_ptr + stride_kv_kind + rows[:, None] + dims[None, :], mask=kv_mask, other=0.0).to(tl.float32)
        # One query per head: a broadcast product, not tl.dot (whose tiles need >= 16 rows).
        scores = _logits(tl.sum(q[:, None, :] * k[None, :, :], axis=2), scale_log2, cap_log2, SOFTCAP)  # [BG, KT]
        scores = tl.where(key_ok[None, :], scores, float("-inf"))
        new_max = tl.maximum(row_max, tl.max(scores, axis=1))
        probs = tl.exp2(scores - new_max[:, None])
        rescale = tl.exp2(row_max - new_max)
        row_sum = row_sum * rescale + tl.sum(probs, axis=1)
        acc = acc * rescale[:, None] + tl.sum(probs[:, :, None] * v[None, :, :], axis=1)
        row_max = new_max
    out = acc / tl.maximum(row_sum, 1.0e-30)[:, None]
    store_mask = head_ok[:, None] & dim_ok[None, :]
    if NUM_SPLITS == 1:
        tl.store(out_ptr + request * stride_out_token + heads[:, None] * HEAD_DIM + dims[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=store_mask)
    else:
        # partial: [B, H, S, D] float32; lse: [B, H, S] (log2 units, -inf for an empty split)
        slot = (request * GROUP * tl.num_programs(1) + heads) * NUM_SPLITS + split  # [BG]
        tl.store(partial_ptr + slot[:, None] * HEAD_DIM + dims[None, :], out, mask=store_mask)
        lse = tl.where(row_sum > 0, row_max + tl.log2(tl.maximum(row_sum, 1.0e-30)), float("-inf"))
        tl.store(lse_ptr + slot, lse, mask=head_ok)


@triton.jit
def _combine_splits_kernel(
    partial_ptr, lse_ptr, out_ptr, stride_out_token,
    NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    NUM_SPLITS: tl.constexpr, BLOCK_SPLITS: tl.constexpr,
):
    # One program per (request, query head): the splits' outputs weighted by their share of
    # the softmax mass, exp2(lse_i - max) / sum.
    request = tl.program_id(0)
    head = tl.program_id(1)
    splits = tl.arange(0, BLOCK_SPLITS)
    dims = tl.arange(0, BLOCK_D)
    slot = (request * NUM_HEADS + head) * NUM_SPLITS + splits  # [BS]
    lse = tl.load(lse_ptr + slot, mask=splits < NUM_SPLITS, other=float("-inf"))
    weights = tl.exp2(lse - tl.max(lse, axis=0))  # every context has a key: one split is finite
    mask = (splits < NUM_SPLITS)[:, None] & (dims < HEAD_DIM)[None, :]
    partial = tl.load(partial_ptr + slot[:, None] * HEAD_DIM + dims[None, :], mask=mask, other=0.0)
    out = tl.sum(weights[:, None] * partial, axis=0) / tl.sum(weights, axis=0)
    tl.store(out_ptr + request * stride_out_token + head * HEAD_DIM + dims, out.to(out_ptr.dtype.element_ty),
             mask=dims < HEAD_DIM)


@triton.jit
def _prefill_kernel(
    q_ptr, kv_ptr, out_ptr, block_tables_ptr, context_lens_ptr, query_starts_ptr,
    stride_q_token, stride_q_head,
    stride_kv_block, stride_kv_kind, stride_kv_slot, stride_kv_head,
    stride_out_token, stride_table,
    scale_log2, window, cap_log2,
    GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    QUERY_TILE: tl.constexpr, KEY_TILE: tl.constexpr, UPCAST_DOT: tl.constexpr, SOFTCAP: tl.constexpr,
):
    # One program per (request, KV head, tile of QUERY_TILE rows); row r is query token
    # r // G of the chunk under query head kv_head·G + r % G, so K/V tiles serve all G heads.
    request = tl.program_id(0)
    kv_head = tl.program_id(1)
    query_start = tl.load(query_starts_ptr + request).to(tl.int32)
    query_len = tl.load(query_starts_ptr + request + 1).to(tl.int32) - query_start
    if tl.program_id(2) * QUERY_TILE >= query_len * GROUP:
        return
    context_len = tl.load(context_lens_ptr + request).to(tl.int32)
    computed = context_len - query_len  # the chunk's queries sit at positions [computed, context_len)
    tile_rows = tl.program_id(2) * QUERY_TILE + tl.arange(0, QUERY_TILE)  # [QT]
    row_ok = tile_rows < query_len * GROUP
    tokens = tile_rows // GROUP
    heads = kv_head * GROUP + tile_rows % GROUP
    query_pos = computed + tokens
    dims = tl.arange(0, BLOCK_D)
    dim_ok = dims < HEAD_DIM
    q_rows = (query_start + tokens).to(tl.int64) * stride_q_token + heads * stride_q_head
    q = tl.load(q_ptr + q_rows[:, None] + dims[None, :], mask=row_ok[:, None] & dim_ok[None, :], other=0.0)
    row_max = tl.full([QUERY_TILE], -1.0e30, tl.float32)
    row_sum = tl.zeros([QUERY_TILE], tl.float32)
    acc = tl.zeros([QUERY_TILE, BLOCK_D], tl.float32)
    # Keys past the tile's last query are masked for every row: stop there.
    last_pos = computed + tl.minimum(tl.program_id(2) * QUERY_TILE + QUERY_TILE - 1, query_len * GROUP - 1) // GROUP
    first_pos = computed + (tl.program_id(2) * QUERY_TILE) // GROUP
    first_key = tl.maximum(first_pos - window + 1, 0) // KEY_TILE * KEY_TILE
    table = block_tables_ptr + request.to(tl.int64) * stride_table
    for tile_start in range(first_key, last_pos + 1, KEY_TILE):
        keys = tile_start + tl.arange(0, KEY_TILE)  # [KT]
        key_ok = keys < context_len
        blocks = tl.load(table + keys // BLOCK_SIZE, mask=key_ok, other=0).to(tl.int64)
        rows = blocks * stride_kv_block + (keys % BLOCK_SIZE) * stride_kv_slot + kv_head * stride_kv_head
        kv_mask = key_ok[:, None] & dim_ok[None, :]
        k = tl.load(kv_ptr + rows[:, None] + dims[None, :], mask=kv_mask, other=0.0)  # [KT, BD]
        v = tl.load(kv_ptr + stride_kv_kind + rows[:, None] + dims[None, :], mask=kv_mask, other=0.0)
        if UPCAST_DOT:
            scores = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee")  # [QT, KT]
        else:
            scores = tl.dot(q, tl.trans(k))
        causal = (keys[None, :] <= query_pos[:, None]) & (keys[None, :] > query_pos[:, None] - window)
        visible = key_ok[None, :] & causal
        scores = tl.where(visible, _logits(scores, scale_log2, cap_log2, SOFTCAP), float("-inf"))
        new_max = tl.maximum(row_max, tl.max(scores, axis=1))
        probs = tl.exp2(scores - new_max[:, None])
        rescale = tl.exp2(row_max - new_max)
        row_sum = row_sum * rescale + tl.sum(probs, axis=1)
        if UPCAST_DOT:
            acc = acc * rescale[:, None] + tl.dot(probs, v.to(tl.float32), input_precision="ieee")
        else:
            acc = acc * rescale[:, None] + tl.dot(probs.to(v.dtype), v)
        row_max = new_max
    out = acc / tl.maximum(row_sum, 1.0e-30)[:, None]
    out_rows = (query_start + tokens).to(tl.int64) * stride_out_token + heads * HEAD_DIM
    tl.store(out_ptr + out_rows[:, None] + dims[None, :], out.to(out_ptr.dtype.element_ty),
             mask=row_ok[:, None] & dim_ok[None, :])


# Under TRITON_INTERPRET=1 tl.dot multiplies bfloat16 operands as their raw 16-bit patterns
# (numpy has no bfloat16), so interpreted bfloat16 products run in float32; float16 is exact.
INTERPRETED = isinstance(_prefill_kernel, InterpretedFunction)


def _check(q: torch.Tensor, kv_cache: torch.Tensor, group: KernelGroup) -> None:
    if q.dim() != 3 or kv_cache.dim() != 6:
        raise ValueError(f"q must be [T, H, D] and the cache [N, L, 2, block_size, Hkv, D], got {tuple(q.shape)} "
                         f"and {tuple(kv_cache.shape)}")
    if q.dtype not in _DTYPES or kv_cache.dtype != q.dtype:
        raise ValueError(f"q and the cache must share a float16/bfloat16/float32 dtype, got {q.dtype} and "
                         f"{kv_cache.dtype}")
    if q.stride(-1) != 1 or kv_cache.stride(-1) != 1:
        raise ValueError("q and the cache must be contiguous in the head dimension")
    tensors = (q, kv_cache, group.block_tables, group.context_lens, group.query_starts)
    if len({t.device for t in tensors}) != 1:
        raise ValueError("q, the cache and the kernel metadata must be on one device")
    if q.shape[1] % kv_cache.shape[4] or q.shape[2] != kv_cache.shape[5]:
        raise ValueError(f"{q.shape[1]} query heads of size {q.shape[2]} do not fit the cache's "
                         f"{kv_cache.shape[4]} KV heads of size {kv_cache.shape[5]}")


def decode_splits(batch: int, num_kv_heads: int, max_context_len: int) -> int:
    """How many splits each context is cut into: enough programs to fill a large GPU when the
    batch is small, never a split under MIN_KEYS_PER_SPLIT keys. Host-side numbers only."""
    wanted = triton.cdiv(TARGET_PROGRAMS, batch * num_kv_heads)
    return max(1, min(wanted, max_context_len // MIN_KEYS_PER_SPLIT, MAX_SPLITS))


def decode_attention(q: torch.Tensor, kv_cache: torch.Tensor, layer: int, block_tables: torch.Tensor,
                     context_lens: torch.Tensor, out: torch.Tensor, window: int = NO_WINDOW,
                     num_splits: int = 1, scale: float | None = None, softcap: float | None = None) -> None:
    """One query per request: q [B, H, D]; block_tables [B, W] (padded with any valid block);
    context_lens [B] (keys per request, its own token included); out [B, H·D] is written.
    num_splits > 1 cuts each context into that many parts run in parallel, then combined.
    scale: the softmax scale (None: 1/sqrt(D)); softcap: scores capped by softcap·tanh(s / softcap)."""
    batch, num_heads, head_dim = q.shape
    score_scale, cap_log2 = _score_scales(head_dim, scale, softcap)
    layer_pool = kv_cache[:, layer]  # [N, 2, block_size, Hkv, D], strided
    num_kv_heads = layer_pool.shape[3]
    group = num_heads // num_kv_heads
    block_group, block_d = triton.next_power_of_2(group), triton.next_power_of_2(head_dim)
    # The [G, keys, D] product lives in registers: fewer keys per tile as G·D grows.
    decode_tile = max(8, min(KEY_TILE, DECODE_PRODUCT_ELEMENTS // (block_group * block_d)))
    partial = lse = out  # unused with one split
    if num_splits > 1:
        partial = torch.empty(batch, num_heads, num_splits, head_dim, dtype=torch.float32, device=q.device)
        lse = torch.empty(batch, num_heads, num_splits, dtype=torch.float32, device=q.device)
    _decode_kernel[(batch, num_kv_heads, num_splits)](
        q, layer_pool, out, block_tables, context_lens, partial, lse,
        q.stride(0), q.stride(1), *layer_pool.stride()[:4], out.stride(0), block_tables.stride(0),
        score_scale, window, cap_log2,
        GROUP=group, BLOCK_GROUP=block_group, BLOCK_SIZE=layer_pool.shape[2],
        HEAD_DIM=head_dim, BLOCK_D=block_d, KEY_TILE=decode_tile, NUM_SPLITS=num_splits,
        SOFTCAP=softcap is not None,
    )
    if num_splits > 1:
        _combine_splits_kernel[(batch, num_heads)](
            partial, lse, out, out.stride(0), NUM_HEADS=num_heads, HEAD_DIM=head_dim,
            BLOCK_D=block_d, NUM_SPLITS=num_splits,
            BLOCK_SPLITS=triton.next_power_of_2(num_splits),
        )


def prefill_attention(q: torch.Tensor, kv_cache: torch.Tensor, layer: int, block_tables: torch.Tensor,
                      context_lens: torch.Tensor, query_starts: torch.Tensor, max_query_len: int,
                      out: torch.Tensor, window: int = NO_WINDOW, scale: float | None = None,
                      softcap: float | None = None) -> None:
    """Chunks of new tokens: request b's queries are rows [query_starts[b], query_starts[b+1])
    of q [T, H, D], at positions [context_lens[b] - its length, context_lens[b]), their K/V
    already in the cache; each attends causally to its context. max_query_len bounds the grid
    (a host-side number the batch builder knows). out [T, H·D] is written. scale, softcap: as
    `decode_attention`'s."""
    num_heads, head_dim = q.shape[1], q.shape[2]
    score_scale, cap_log2 = _score_scales(head_dim, scale, softcap)
    layer_pool = kv_cache[:, layer]
    num_kv_heads = layer_pool.shape[3]
    group = num_heads // num_kv_heads
    query_tile = 32
    grid = (context_lens.shape[0], num_kv_heads, triton.cdiv(max_query_len * group, query_tile))
    _prefill_kernel[grid](
        q, layer_pool, out, block_tables, context_lens, query_starts,
        q.stride(0), q.stride(1), *layer_pool.stride()[:4], out.stride(0), block_tables.stride(0),
        score_scale, window, cap_log2,
        GROUP=group, BLOCK_SIZE=layer_pool.shape[2], HEAD_DIM=head_dim,
        BLOCK_D=max(16, triton.next_power_of_2(head_dim)), QUERY_TILE=query_tile, KEY_TILE=KEY_TILE,
        UPCAST_DOT=q.dtype == torch.float32 or (q.dtype == torch.bfloat16 and INTERPRETED),
        SOFTCAP=softcap is not None,
    )


def kernel_attention(q: torch.Tensor, kv_cache: torch.Tensor, layer: int, meta: AttentionMetadata,
                     layer_window: int | None = None, scale: float | None = None,
                     softcap: float | None = None) -> torch.Tensor:
    """q: [T, H, D] (rotated) -> [T, H·D]: `paged_attention`'s contract on the Triton kernels
    (a layer's own window replaces the groups')."""
    num_tokens, num_heads, head_dim = q.shape
    out = q.new_empty(num_tokens, num_heads * head_dim)
    for group in meta.kernel_groups:
        _check(q, kv_cache, group)
        rows = slice(group.row_start, group.row_start + group.num_rows)
        window = layer_window or (NO_WINDOW if group.sliding_window is None else group.sliding_window)
        if group.max_query_len == 1:
            # A sliding window bounds the keys a query visits, so the split count too.
            splits = decode_splits(group.num_rows, kv_cache.shape[4], min(group.max_context_len, window))
            decode_attention(q[rows], kv_cache, layer, group.block_tables, group.context_lens, out[rows],
                             window, splits, scale, softcap)
        else:
            prefill_attention(q[rows], kv_cache, layer, group.block_tables, group.context_lens,
                              group.query_starts, group.max_query_len, out[rows], window, scale, softcap)
    return out
