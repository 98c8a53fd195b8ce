"""Turns one step's scheduled chunks into the flat token batch and the attention metadata
(positions, KV slots, per-group block tables and masks) — once per step, with tensor ops, so
the layers do no per-request Python work.

Flat order: every prefill chunk (more than one token) first, then every decode; each group's
rows are contiguous. `ChunkRows` maps each chunk, in the caller's order, back to its rows."""
import functools
import itertools
from dataclasses import dataclass, replace

import torch

from ..models.attention import AttentionGroup, AttentionMetadata, KernelGroup
from .staging import upload


@dataclass(frozen=True)
class Chunk:
    # The tokens computed this step (positions start .. start + len(token_ids) - 1).
    token_ids: list[int]
    start: int
    # The request's device blocks in position order (at least the ones this chunk reaches).
    block_table: list[int]
    # The LoRA adapter slot its rows run with (`models.lora`); 0: the base model.
    adapter: int = 0


@dataclass(frozen=True)
class BatchLayout:
    """What the metadata depends on besides the chunks."""

    block_size: int
    num_layers: int
    num_kv_heads: int
    # Query heads per KV head (grouped-query attention).
    query_groups: int
    head_dim: int
    dtype: torch.dtype
    sliding_window: int | None = None
    # Sliding windows some layers use instead of `sliding_window` (Gemma's local layers next to
    # global ones): on the SDPA backend each gets groups of its own (`AttentionMetadata.window_groups`).
    layer_windows: tuple[int, ...] = ()

    @property
    def rows_per_block(self) -> int:
        """Rows of one block in the pool viewed as [N·L·2·block_size·Hkv, D] (`KVGeometry`'s
        block-first layout): where block b's layer-0 K rows start, times b."""
        return self.num_layers * 2 * self.block_size * self.num_kv_heads


@dataclass(frozen=True)
class StepBatch:
    input_ids: torch.Tensor  # [T]
    meta: AttentionMetadata
    # Per chunk in the caller's order: first flat row of its tokens (they are contiguous).
    first_rows: list[int]


def _padded(rows: list[list[int]], width: int) -> torch.Tensor:
    # Padding repeats a real block id (the first of the row): masked keys must still be finite.
    return torch.tensor([row[:width] + [row[0]] * (width - len(row[:width])) for row in rows], dtype=torch.int64)


def _context_mask(starts: torch.Tensor, lengths: torch.Tensor, queries: int, keys: int, window: int | None):
    """[B, 1, Q, S]: query q of request b (position starts[b] + q) may see key j."""
    query_pos = starts[:, None] + torch.arange(queries)[None, :]  # [B, Q]
    # Padded queries (q >= length) are clamped to the last real one so no row is empty.
    query_pos = torch.minimum(query_pos, (starts + lengths - 1)[:, None])
    key_pos = torch.arange(keys)[None, None, :]  # [1, 1, S]
    allowed = key_pos <= query_pos[:, :, None]
    if window is not None:
        allowed &= key_pos > query_pos[:, :, None] - window
    return allowed[:, None]


def _context_rows(chunks: list[Chunk], keys: int, layout: BatchLayout, num_kv_heads: int) -> torch.Tensor:
    """[B, 2, Hkv, S] row of every context token's K/V head vector in the cache viewed as
    [N·L·2·block_size·Hkv, D] (layer 0); positions past a request's context point into one of
    its own blocks, whose values are finite, and are masked out."""
    block_size = layout.block_size
    block_tables = _padded([c.block_table for c in chunks], -(-keys // block_size))  # [B, nb]
    positions = torch.arange(keys)
    blocks = block_tables[:, positions // block_size]  # [B, S]
    per_block = layout.rows_per_block
    token_rows = blocks * per_block + (positions % block_size)[None, :] * num_kv_heads  # [B, S]
    kv_offset = torch.arange(2)[None, :, None, None] * (block_size * num_kv_heads)
    head_offset = torch.arange(num_kv_heads)[None, None, :, None]
    return token_rows[:, None, None, :] + kv_offset + head_offset


def _group(chunks: list[Chunk], row_start: int, layout: BatchLayout, decode: bool) -> AttentionGroup:
    lengths = torch.tensor([len(c.token_ids) for c in chunks], dtype=torch.int64)
    starts = torch.tensor([c.start for c in chunks], dtype=torch.int64)
    context = starts + lengths
    keys = int(context.max())
    context_rows = _context_rows(chunks, keys, layout, layout.num_kv_heads)
    queries = int(lengths.max())
    mask = None
    if not (decode and layout.sliding_window is None and bool((context == keys).all())):
        mask = _context_mask(starts, lengths, queries, keys, layout.sliding_window)
        mask = mask.repeat(1, 1, layout.query_groups, 1)  # queries folded as [G, Q] -> [B, 1, G·Q, S]
    num_rows = int(lengths.sum())
    if decode:
        return AttentionGroup(row_start, num_rows, context_rows, mask)
    # query_rows[b, q]: flat row of query q of chunk b (padded queries repeat the last row).
    offsets = torch.cumsum(lengths, 0) - lengths
    q_index = torch.arange(queries)[None, :]
    query_rows = row_start + offsets[:, None] + torch.minimum(q_index, (lengths - 1)[:, None])
    real_queries = (torch.arange(len(chunks))[:, None] * queries + q_index)[q_index < lengths[:, None]]
    return AttentionGroup(row_start, num_rows, context_rows, mask, query_rows=query_rows, real_queries=real_queries)


def _kernel_group(chunks: list[Chunk], row_start: int, layout: BatchLayout, device: torch.device) -> KernelGroup:
    lengths = [len(c.token_ids) for c in chunks]
    context = [c.start + length for c, length in zip(chunks, lengths)]
    block_tables = _padded([c.block_table for c in chunks], -(-max(context) // layout.block_size))
    query_starts = [0, *itertools.accumulate(lengths)]
    as_device = lambda values: upload(torch.tensor(values, dtype=torch.int32), device)  # noqa: E731
    return KernelGroup(
        row_start, sum(lengths), upload(block_tables.to(torch.int32), device), as_device(context),
        as_device(query_starts), max(lengths), max(context), layout.sliding_window,
    )


@functools.lru_cache(maxsize=8)
def _decode_offsets(block_size: int, num_kv_heads: int, span: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Constants of the decode path (never written): [span] (j % block_size)·Hkv, each key's
    row within its block; [2, Hkv, 1] the K/V and head offsets of a key's rows."""
    within = (torch.arange(span) % block_size) * num_kv_heads
    offsets = torch.arange(2)[:, None, None] * (block_size * num_kv_heads) + torch.arange(num_kv_heads)[None, :, None]
    return within, offsets


def _decode_batch(chunks: list[Chunk], layout: BatchLayout, device: torch.device) -> StepBatch:
    """`sdpa_batch` for a step of decodes only — the common step — with
    the indices computed from plain lists and a handful of tensor ops (the general path's
    dozens of small ones cost about as much as a small model's decode attention)."""
    block_size, num_kv_heads = layout.block_size, layout.num_kv_heads
    starts = [c.start for c in chunks]
    keys = max(starts) + 1
    width = -(-keys // block_size)
    tables = _padded([c.block_table for c in chunks], width)  # [B, W]
    per_block = layout.rows_per_block
    within, offsets = _decode_offsets(block_size, num_kv_heads, 1 << max(17, (keys - 1).bit_length()))
    # Row of key j's head 0 K vector (layer 0): its block's first row plus its place in the block.
    token_rows = tables.repeat_interleave(block_size, dim=1)[:, :keys] * per_block + within[:keys]  # [B, S]
    context_rows = token_rows[:, None, None, :] + offsets  # [B, 2, Hkv, S]
    mask = None
    if layout.sliding_window is not None or min(starts) + 1 != keys:
        query_pos = torch.tensor(starts)[:, None]
        key_pos = torch.arange(keys)[None, :]
        allowed = key_pos <= query_pos
        if layout.sliding_window is not None:
            allowed &= key_pos > query_pos - layout.sliding_window
        mask = allowed[:, None, None, :]  # [B, 1, 1, S]: every KV head and query head alike
    slot_blocks = [c.block_table[start // block_size] for c, start in zip(chunks, starts)]
    to = lambda t: None if t is None else upload(t, device)  # noqa: E731
    meta = AttentionMetadata(
        positions=to(torch.tensor(starts)),
        slot_blocks=to(torch.tensor(slot_blocks)),
        slot_offsets=to(torch.tensor([start % block_size for start in starts])),
        groups=(AttentionGroup(
            0, len(chunks), to(context_rows), to(mask),
            context_buffer=torch.empty((*context_rows.shape, layout.head_dim), dtype=layout.dtype, device=device),
        ),),
    )
    input_ids = torch.tensor([c.token_ids[0] for c in chunks])
    return StepBatch(to(input_ids), meta, list(range(len(chunks))))


@dataclass(frozen=True)
class FlatRows:
    """What every backend's metadata shares: the flat token batch (every prefill chunk first,
    then every decode) and where each new token's K/V goes. Host tensors."""

    # Chunk indices (in the caller's order) of the prefill chunks and of the decodes.
    prefill: list[int]
    decode: list[int]
    first_rows: list[int]
    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    slot_blocks: torch.Tensor  # [T]
    sequence_lengths: torch.Tensor  # [T]

    def metadata(self, layout: BatchLayout, device: torch.device, **fields) -> AttentionMetadata:
        """The step's metadata with these rows uploaded and a backend's own `fields`."""
        return AttentionMetadata(
            positions=upload(self.positions, device), slot_blocks=upload(self.slot_blocks, device),
            slot_offsets=upload(self.positions % layout.block_size, device),
            sequence_lengths=upload(self.sequence_lengths, device), **fields)

    def batch(self, meta: AttentionMetadata, device: torch.device) -> StepBatch:
        return StepBatch(upload(self.input_ids, device), meta, self.first_rows)


def flat_rows(chunks: list[Chunk], layout: BatchLayout) -> FlatRows:
    prefill = [i for i, c in enumerate(chunks) if len(c.token_ids) > 1]
    decode = [i for i, c in enumerate(chunks) if len(c.token_ids) == 1]
    order = prefill + decode
    ordered = [chunks[i] for i in order]
    lengths = torch.tensor([len(c.token_ids) for c in ordered], dtype=torch.int64)
    starts = torch.tensor([c.start for c in ordered], dtype=torch.int64)
    offsets = torch.cumsum(lengths, 0) - lengths
    first_rows = [0] * len(chunks)
    for rank, index in enumerate(order):
        first_rows[index] = int(offsets[rank])
    input_ids = torch.tensor(list(itertools.chain.from_iterable(c.token_ids for c in ordered)), dtype=torch.int64)
    # positions[t] = start of its chunk + index within the chunk.  [T]
    chunk_of_row = torch.repeat_interleave(torch.arange(len(ordered)), lengths)
    positions = starts[chunk_of_row] + torch.arange(int(lengths.sum())) - offsets[chunk_of_row]
    sequence_lengths = (starts + lengths)[chunk_of_row]  # [T]
    block_size = layout.block_size
    widest = int(((starts + lengths).max() + block_size - 1) // block_size)
    all_tables = _padded([c.block_table for c in ordered], widest)
    slot_blocks = all_tables[chunk_of_row, positions // block_size]
    return FlatRows(prefill, decode, first_rows, input_ids, positions, slot_blocks, sequence_lengths)


def sdpa_batch(chunks: list[Chunk], layout: BatchLayout, device: torch.device) -> StepBatch:
    """The SDPA backend's step: gather indices and masks per group (and per layer window)."""
    if layout.layer_windows:
        batch = sdpa_batch(chunks, replace(layout, layer_windows=()), device)
        return _with_window_groups(batch, chunks, layout, device)
    if chunks and all(len(c.token_ids) == 1 for c in chunks):
        return _decode_batch(chunks, layout, device)
    return general_batch(chunks, layout, device)


def general_batch(chunks: list[Chunk], layout: BatchLayout, device: torch.device) -> StepBatch:
    """The SDPA backend's metadata for any mix of prefill chunks and decodes."""
    flat = flat_rows(chunks, layout)
    num_rows = len(flat.input_ids)
    groups = []
    if flat.prefill:
        groups.append(_group([chunks[i] for i in flat.prefill], 0, layout, decode=False))
    if flat.decode:
        groups.append(_group([chunks[i] for i in flat.decode], num_rows - len(flat.decode), layout, decode=True))
    to = lambda t: None if t is None else upload(t, device)  # noqa: E731
    groups = tuple(
        AttentionGroup(
            g.row_start, g.num_rows, to(g.context_rows), to(g.mask),
            context_buffer=torch.empty((*g.context_rows.shape, layout.head_dim), dtype=layout.dtype, device=device),
            query_rows=to(g.query_rows), real_queries=to(g.real_queries),
        )
        for g in groups
    )
    return flat.batch(flat.metadata(layout, device, groups=groups), device)


def kernel_batch(chunks: list[Chunk], layout: BatchLayout, device: torch.device) -> StepBatch:
    """The Triton backend's metadata: block tables and lengths per group, read in place."""
    flat = flat_rows(chunks, layout)
    kernel_groups = []
    if flat.prefill:
        kernel_groups.append(_kernel_group([chunks[i] for i in flat.prefill], 0, layout, device))
    if flat.decode:
        decodes = [chunks[i] for i in flat.decode]
        kernel_groups.append(_kernel_group(decodes, len(flat.input_ids) - len(decodes), layout, device))
    return flat.batch(flat.metadata(layout, device, groups=(), kernel_groups=tuple(kernel_groups)), device)


def _window_rows(chunks: list[Chunk], layout: BatchLayout, window: int):
    """The keys a sliding window reaches, per request: key j of request b is position
    first_keys[b] + j, so the gather skips everything further back. Returns the key positions
    [B, S] and their cache rows [B, 2, Hkv, S] (layer 0, as `_context_rows`); keys past a
    request's context read its last key (finite) and are masked."""
    block_size, num_kv_heads = layout.block_size, layout.num_kv_heads
    starts = torch.tensor([c.start for c in chunks], dtype=torch.int64)
    context = starts + torch.tensor([len(c.token_ids) for c in chunks], dtype=torch.int64)
    first_keys = (starts - window + 1).clamp(min=0)  # the oldest key the chunk's first query sees
    keys = int((context - first_keys).max())
    key_pos = first_keys[:, None] + torch.arange(keys)[None, :]  # [B, S]
    stored = torch.minimum(key_pos, (context - 1)[:, None])
    tables = _padded([c.block_table for c in chunks], int(-(-int(context.max()) // block_size)))
    per_block = layout.rows_per_block
    token_rows = tables.gather(1, stored // block_size) * per_block + (stored % block_size) * num_kv_heads
    kv_offset = torch.arange(2)[None, :, None, None] * (block_size * num_kv_heads)
    head_offset = torch.arange(num_kv_heads)[None, None, :, None]
    return key_pos, token_rows[:, None, None, :] + kv_offset + head_offset


def _window_group(chunks: list[Chunk], row_start: int, layout: BatchLayout, window: int, decode: bool,
                  device: torch.device) -> AttentionGroup:
    """`_group` for a layer with its own sliding window, over only the keys it reaches."""
    lengths = torch.tensor([len(c.token_ids) for c in chunks], dtype=torch.int64)
    starts = torch.tensor([c.start for c in chunks], dtype=torch.int64)
    key_pos, context_rows = _window_rows(chunks, layout, window)
    queries = int(lengths.max())
    q_index = torch.arange(queries)[None, :]
    # Padded queries are clamped to the last real one so no row is empty.
    query_pos = (starts[:, None] + torch.minimum(q_index, (lengths - 1)[:, None]))[:, :, None]  # [B, Q, 1]
    allowed = (key_pos[:, None, :] <= query_pos) & (key_pos[:, None, :] > query_pos - window)  # [B, Q, S]
    to = lambda t: None if t is None else upload(t, device)  # noqa: E731
    buffer = torch.empty((*context_rows.shape, layout.head_dim), dtype=layout.dtype, device=device)
    num_rows = int(lengths.sum())
    if decode:
        # [B, 1, 1, S] serves the G query heads alike; none when every request sees all its keys.
        mask = None if bool(allowed.all()) else allowed[:, None]
        return AttentionGroup(row_start, num_rows, to(context_rows), to(mask), context_buffer=buffer)
    mask = allowed[:, None].repeat(1, 1, layout.query_groups, 1)  # [B, 1, G·Q, S]
    offsets = torch.cumsum(lengths, 0) - lengths
    query_rows = row_start + offsets[:, None] + torch.minimum(q_index, (lengths - 1)[:, None])
    real_queries = (torch.arange(len(chunks))[:, None] * queries + q_index)[q_index < lengths[:, None]]
    return AttentionGroup(row_start, num_rows, to(context_rows), to(mask), context_buffer=buffer,
                          query_rows=to(query_rows), real_queries=to(real_queries))


def _with_window_groups(batch: StepBatch, chunks: list[Chunk], layout: BatchLayout, device: torch.device) -> StepBatch:
    """`batch` plus the groups of each of the layout's layer windows, over the same rows as its
    own groups (every prefill chunk first, then every decode)."""
    prefill = [c for c in chunks if len(c.token_ids) > 1]
    decode = [c for c in chunks if len(c.token_ids) == 1]
    decode_start = sum(len(c.token_ids) for c in chunks) - len(decode)
    window_groups = []
    for window in layout.layer_windows:
        groups = []
        if prefill:
            groups.append(_window_group(prefill, 0, layout, window, False, device))
        if decode:
            groups.append(_window_group(decode, decode_start, layout, window, True, device))
        window_groups.append((window, tuple(groups)))
    return replace(batch, meta=replace(batch.meta, window_groups=tuple(window_groups)))
