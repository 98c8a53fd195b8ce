"""Decode steps replayed from CUDA graphs: one graph per batch-size bucket, captured at warm-up
over fixed input buffers, so a decode step costs one graph launch instead of one launch per
kernel of every layer.

A decode-only step of n requests runs in the smallest bucket b >= n. Its inputs are staged in
pinned host buffers and copied into the bucket's own device buffers (two copies per step),
then the graph replays; the hidden states of the first n rows are returned.
The b - n padding rows are harmless by construction: each decodes token 0 at position 0 of
the *padding block*, a device block the cache keeps outside the pool the router allocates
from, with a context of one key — so a padding row writes only into that block and reads only
from it, and its hidden state is never turned into logits (the runner slices the n real rows
before the LM head, so sampling and penalties never see a padding row).

The graphs are captured for the Triton backend only (its kernels take fixed-shape metadata and
do no host reads); prefill and mixed steps, and decode steps larger than the largest bucket,
run eagerly. Every graph shares one memory pool and is captured largest first, so together
they hold about one decode step's activations. Block tables are `width` blocks wide (the
model's longest context) and the decode kernel's split count is fixed per bucket by that
width, so any context length replays the same graph.

On the CPU nothing is captured: `replay` calls the same forward on the same buffers eagerly,
which is how the tests check the bucket logic and the padding rows (kernels under the Triton
interpreter)."""
import logging
import time

import torch

from ..models.attention import AttentionMetadata, KernelGroup
from .batch import Chunk, StepBatch
from .staging import upload

log = logging.getLogger(__name__)

# The rows of the static int64 buffer: one value per request of the bucket.
_INPUT_IDS, _POSITIONS, _SLOT_BLOCKS, _SLOT_OFFSETS, _CONTEXT_LENS = range(5)


def default_batch_sizes(max_requests: int) -> tuple[int, ...]:
    """1, 2, 4, then every multiple of 8 up to the step's request limit (and the limit itself),
    so every decode step the router can send replays a graph padded by at most 7 rows."""
    limit = max(1, max_requests)
    sizes = {size for size in (1, 2, 4) if size <= limit} | set(range(8, limit + 1, 8)) | {limit}
    return tuple(sorted(sizes))


def feed_inputs(input_ids: torch.Tensor, rows: list[int], source: torch.Tensor, source_rows: list[int]) -> None:
    """input_ids[rows[i]] = source[source_rows[i]], on the device (no host read)."""
    device = input_ids.device
    index = upload(torch.tensor(rows, dtype=torch.int64), device)
    picked = source.index_select(0, upload(torch.tensor(source_rows, dtype=torch.int64), device))
    input_ids.index_copy_(0, index, picked.to(input_ids.dtype))


def bucket_for(num_requests: int, batch_sizes: tuple[int, ...]) -> int | None:
    """The smallest captured batch size that holds `num_requests` (None: none does)."""
    return next((size for size in batch_sizes if size >= num_requests), None)


def decode_inputs(chunks: list[Chunk], bucket: int, block_size: int, padding_block: int,
                  width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The host-side inputs of a decode step padded to `bucket` rows: [5, bucket] int64 (input
    id, position, slot block, slot offset, context length) and [bucket, w] int32 block tables,
    w the widest table the step reaches. Padding rows: token 0 at position 0 of the padding
    block, one key."""
    if not chunks or any(len(chunk.token_ids) != 1 for chunk in chunks):
        raise ValueError("a graphed step holds decodes only, one token each")
    if len(chunks) > bucket:
        raise ValueError(f"{len(chunks)} decodes do not fit a bucket of {bucket}")
    rows = torch.zeros(5, bucket, dtype=torch.int64)
    rows[_SLOT_BLOCKS] = padding_block
    rows[_CONTEXT_LENS] = 1
    used = [-(-(chunk.start + 1) // block_size) for chunk in chunks]
    w = max(used)
    if w > width:
        raise ValueError(f"a context of {max(c.start for c in chunks) + 1} tokens is longer than the graphs' "
                         f"{width * block_size}")
    tables = torch.full((bucket, w), padding_block, dtype=torch.int32)
    n = len(chunks)
    rows[_INPUT_IDS, :n] = torch.tensor([chunk.token_ids[0] for chunk in chunks])
    starts = torch.tensor([chunk.start for chunk in chunks])
    rows[_POSITIONS, :n] = starts
    for index, (chunk, blocks) in enumerate(zip(chunks, used)):
        # Past its context a row's entries are never read; repeat its first block, as eager steps do.
        table = chunk.block_table[:blocks]
        tables[index, :blocks] = torch.tensor(table, dtype=torch.int32)
        tables[index, blocks:] = table[0]
    rows[_SLOT_BLOCKS, :n] = tables[torch.arange(n), (starts // block_size)].to(torch.int64)
    rows[_SLOT_OFFSETS, :n] = starts % block_size
    rows[_CONTEXT_LENS, :n] = starts + 1
    return rows, tables


class DecodeGraphs:
    """The captured decode graphs of one model runner and its KV cache (whose device pool must
    not be reallocated afterwards: the graphs hold its address)."""

    def __init__(self, runner, batch_sizes: tuple[int, ...], max_context_len: int):
        if not batch_sizes or min(batch_sizes) < 1:
            raise ValueError(f"batch sizes must be positive, got {batch_sizes}")
        if runner.attention.name != "triton":
            raise ValueError("decode graphs need the triton attention backend (fixed-shape kernel metadata)")
        cache = runner.cache
        if cache is None or cache.padding_block is None:
            raise ValueError("decode graphs need an allocated KV cache with a padding block")
        self.runner = runner
        self.batch_sizes = tuple(sorted(set(batch_sizes)))
        self.padding_block = cache.padding_block
        self.block_size = runner.block_size
        self.width = -(-max_context_len // self.block_size)
        self.capture = runner.device.type == "cuda"
        device, largest = runner.device, self.batch_sizes[-1]
        # Per bucket, the contiguous device buffers its graph reads: [5, b] int64 (the rows
        # named above) of its own, and the first b rows of one [largest, width] int32 table
        # buffer (graphs never run at once, and b rows of it are contiguous).
        self.rows = {b: torch.zeros(5, b, dtype=torch.int64, device=device) for b in self.batch_sizes}
        table_buffer = torch.full((largest, self.width), self.padding_block, dtype=torch.int32, device=device)
        self.tables = {b: table_buffer[:b] for b in self.batch_sizes}
        for rows in self.rows.values():
            rows[_SLOT_BLOCKS] = self.padding_block
            rows[_CONTEXT_LENS] = 1
        self.query_starts = torch.arange(largest + 1, dtype=torch.int32, device=device)
        # Pinned staging (flat, so every step's slice is contiguous): one copy each way.
        pin = self.capture
        self.host_rows = torch.zeros(5 * largest, dtype=torch.int64, pin_memory=pin)
        self.host_tables = torch.zeros(largest * self.width, dtype=torch.int32, pin_memory=pin)
        self.metas = {bucket: self._meta(bucket) for bucket in self.batch_sizes}
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self._staged: torch.cuda.Event | None = None
        self.capture_s = 0.0
        self.memory_bytes = 0

    def _meta(self, bucket: int) -> AttentionMetadata:
        rows = self.rows[bucket]
        group = KernelGroup(
            0, bucket, self.tables[bucket], rows[_CONTEXT_LENS], self.query_starts[: bucket + 1], 1,
            self.width * self.block_size, self.runner.layout.sliding_window,
        )
        return AttentionMetadata(positions=rows[_POSITIONS], slot_blocks=rows[_SLOT_BLOCKS],
                                 slot_offsets=rows[_SLOT_OFFSETS], groups=(), kernel_groups=(group,))

    def _forward(self, bucket: int) -> torch.Tensor:
        return self.runner.model(self.rows[bucket][_INPUT_IDS], self.runner.cache.device, self.metas[bucket])

    def fits(self, chunks: list[Chunk]) -> bool:
        return (bool(chunks) and len(chunks) <= self.batch_sizes[-1]
                and all(len(chunk.token_ids) == 1 and chunk.start < self.width * self.block_size for chunk in chunks))

    @torch.inference_mode()
    def capture_all(self) -> None:
        """CUDA: captures every bucket's graph (largest first, one shared pool); the CPU has
        nothing to capture. Times the capture and measures the memory it took."""
        if not self.capture:
            return
        device = self.runner.device
        started = time.perf_counter()
        torch.cuda.synchronize(device)
        free_before, _ = torch.cuda.mem_get_info(device)
        pool = torch.cuda.graph_pool_handle()
        side = torch.cuda.Stream(device)
        for bucket in reversed(self.batch_sizes):
            # Warm-up runs compile the Triton kernels and settle the allocator before capture.
            side.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(side):
                for _ in range(2):
                    self._forward(bucket)
            torch.cuda.current_stream(device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
                self.outputs[bucket] = self._forward(bucket)
            self.graphs[bucket] = graph
        torch.cuda.synchronize(device)
        free_after, _ = torch.cuda.mem_get_info(device)
        self.capture_s = time.perf_counter() - started
        self.memory_bytes = max(0, free_before - free_after)
        log.info("warm-up: captured decode CUDA graphs for batch sizes %s in %.2f s (%.1f MiB)",
                 ",".join(map(str, self.batch_sizes)), self.capture_s, self.memory_bytes / 2**20)

    def run(self, chunks: list[Chunk], feed=None) -> tuple[torch.Tensor, StepBatch]:
        """One decode step: hidden states [n, hidden] of the chunks in their order (a view of
        the graph's output buffer, valid until the next replay) and the batch it ran as.
        `feed`: as `ModelRunner.forward`'s, copied into the staged inputs before the replay."""
        bucket = bucket_for(len(chunks), self.batch_sizes)
        if bucket is None or not self.fits(chunks):
            raise ValueError("this step does not fit the decode graphs")
        rows, tables = decode_inputs(chunks, bucket, self.block_size, self.padding_block, self.width)
        w = tables.shape[1]
        # Staged in pinned memory, then copied asynchronously on the step's stream.
        if self._staged is not None:
            self._staged.synchronize()  # the previous step's copies have left the staging buffers
        staged_rows = self.host_rows[: 5 * bucket].view(5, bucket)
        staged_tables = self.host_tables[: bucket * w].view(bucket, w)
        staged_rows.copy_(rows)
        staged_tables.copy_(tables)
        self.rows[bucket].copy_(staged_rows, non_blocking=True)
        self.tables[bucket][:, :w].copy_(staged_tables, non_blocking=True)
        if feed is not None:
            fed_chunks, source, source_rows = feed  # a decode's row is its chunk's index
            feed_inputs(self.rows[bucket][_INPUT_IDS], fed_chunks, source, source_rows)
        if self.capture:
            self._staged = torch.cuda.Event()
            self._staged.record()
        if self.capture:
            self.graphs[bucket].replay()
            hidden = self.outputs[bucket]
        else:
            hidden = self._forward(bucket)
        n = len(chunks)
        return hidden[:n], StepBatch(self.rows[bucket][_INPUT_IDS, :n], self.metas[bucket], list(range(n)))
