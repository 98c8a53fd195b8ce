"""One step as every rank runs it. Rank 0 turns the router's plan into a `RankWork`
(`rank_work`), sends it to the other ranks under tensor parallelism, and every rank — rank 0
included — runs `run_rank_step` on it: the transfers enqueued, one forward over the chunks, the
logits of the rows that need them, and the poll of completed transfers. The collectives of a
step (the forward's all-reduces, the logits' gather to rank 0, the transfers' agreement) are
issued by this one function in this one order, so the ranks cannot diverge; only rank 0 then
samples, which involves no other rank.

No hidden sync: the step's inputs reach the device through `staging.upload` (pinned, non-
blocking), and the one wait on the device a step may make is on an event it records after
its own compute."""
import time
from dataclasses import dataclass

import torch
from opentelemetry import trace

from ..pb import shard_pb2
from .batch import Chunk
from .device_sampling import PENDING_TOKEN, DeviceSample
from .model_runner import ModelRunner
from .plan import ScheduledWork, after_compute
from .rank_commands import RankWork, TransferOrder
from .requests import RequestState
from .staging import upload
from .telemetry import NO_TRACES
from .transfers import TransferTracker


@dataclass
class RankStep:
    """What `run_rank_step` did: the needed rows' logits [R, vocab] (rank 0; None when no row
    is needed and on the other ranks), the transfers completed (None when not polled), and the
    host time spent enqueueing the transfers and in the forward."""

    logits: torch.Tensor | None
    completed: list | None
    transfer_ns: int
    forward_ns: int


def rank_work(request: shard_pb2.StepRequest, scheduled: list[ScheduledWork], requests: dict[int, RequestState],
              pending: dict[int, tuple[DeviceSample, int]]):
    """The step as every rank runs it: transfers, chunks and the positions needing logits (the
    last of each request the plan samples, plus prompt positions whose next prompt token's
    logprob was asked for); and the feed of inputs still on the device (chunk indices, the
    step's picks, their rows), None when every input is on the host. `pending`: the requests
    whose last token is still on the device, with the picks and row it sits in."""
    chunks, offsets = [], []
    fed_chunks, source, source_rows = [], None, []
    for index, work in enumerate(scheduled):
        state = requests[work.request_id]
        end = work.start + work.num_new
        tokens = state.token_ids[work.start : end]
        if tokens[-1] == PENDING_TOKEN:
            # The token the step still running sampled for it: fed from the device.
            pick, row = pending[work.request_id]
            if source is not None and pick is not source:
                raise RuntimeError("inputs fed from two steps' device picks")
            source = pick
            fed_chunks.append(index)
            source_rows.append(row)
            tokens = [*tokens[:-1], 0]
        if PENDING_TOKEN in tokens:
            raise RuntimeError(f"request {work.request_id}: a token still on the device is not the chunk's last input")
        chunks.append(Chunk(tokens, work.start, list(work.block_table), adapter=state.adapter))
        needed = []
        if state.prompt_logprobs and work.start + 1 < state.prompt_len:
            needed.extend(range(min(end + 1, state.prompt_len) - work.start - 1))
        if work.sample:
            needed.append(work.num_new - 1)
        offsets.append(needed)
    work = RankWork([TransferOrder.of(t) for t in request.rotate_out], [TransferOrder.of(t) for t in request.rotate_in],
                    chunks, offsets)
    return work, None if source is None else (fed_chunks, source.tokens, source_rows)


def run_rank_step(runner: ModelRunner, tracker: TransferTracker, work: RankWork, feed=None, wait: bool = True,
                  poll: bool = True, tracer: trace.Tracer = NO_TRACES) -> RankStep:
    """Every rank's share of a step. `feed`: inputs taken from a device tensor (`rank_work`);
    `wait`: on a GPU, wait for the step's compute (an event recorded after it); `poll`: poll
    the completed transfers (a collective under tensor parallelism; a pipelined step polls at
    its finish instead). `tracer` makes the transfers' and the forward's spans."""
    transfer_start = time.perf_counter_ns()
    with tracer.start_as_current_span("transfers") as span:
        if span.is_recording():
            span.set_attributes({"swap_out": len(work.rotate_out), "swap_in": len(work.rotate_in),
                                 "blocks_out": sum(len(t.src_blocks) for t in work.rotate_out),
                                 "blocks_in": sum(len(t.src_blocks) for t in work.rotate_in)})
        # A copy out of blocks this step computes in runs after the compute (`plan.after_compute`):
        # the request leaves with its token.
        step_blocks = {b for chunk in work.chunks for b in chunk.block_table}
        after = [t for t in work.rotate_out if after_compute(t, step_blocks)]
        tracker.submit([t for t in work.rotate_out if not after_compute(t, step_blocks)], work.rotate_in)
    forward_start = time.perf_counter_ns()
    logits = None
    if work.chunks:
        tokens = sum(len(chunk.token_ids) for chunk in work.chunks)
        with tracer.start_as_current_span("forward", attributes={"requests": len(work.chunks), "tokens": tokens}):
            logits = _forward(runner, tracker, work, feed, wait)
    forward_end = time.perf_counter_ns()
    if after:
        # Submitted after the forward (on a GPU the copy stream waits for the compute issued
        # before it) and waited for, so this reply acknowledges them: their blocks are free for
        # the next step, which the router plans on that.
        tracker.submit(after, [])
        tracker.wait_for([t.id for t in after])
    completed = tracker.poll() if poll else None
    return RankStep(logits, completed, forward_start - transfer_start, forward_end - forward_start)


def _forward(runner: ModelRunner, tracker: TransferTracker, work: RankWork, feed, wait: bool) -> torch.Tensor | None:
    read_blocks, written_blocks = set(), set()
    for chunk in work.chunks:
        read_blocks.update(chunk.block_table)
        written_blocks.update(chunk.block_table[chunk.start // runner.block_size :])
    tracker.order_before_compute(read_blocks, written_blocks)
    hidden, batch = runner.forward(work.chunks, feed=feed)
    rows = [batch.first_rows[index] + offset for index, offsets in enumerate(work.logit_offsets) for offset in offsets]
    if not rows:
        logits = None
    elif rows == list(range(len(rows))):  # a step of decodes, each sampled: the first rows as they are
        logits = runner.logits(hidden[: len(rows)])
    else:
        logits = runner.logits(hidden.index_select(0, upload(torch.tensor(rows, dtype=torch.int64), hidden.device)))
    if wait and runner.device.type == "cuda":
        # The step's own compute only (the forward time is measured up to here): DuplexKV's
        # copies run on their own non-blocking streams, and a transfer may outlast the step
        # that started it — it is acknowledged in a later reply.
        done = torch.cuda.Event()
        done.record()
        done.synchronize()
    return logits
