"""Warm-up measurements: the step-time cost model (from a few timed forward passes over
synthetic chunks) and the transfer engine's bandwidth per direction and duplex behaviour.

step ≈ c0 + c1·prefill_tokens + c2·decode_requests + c3·context_tokens, where
context_tokens = Σ over scheduled requests of (num_computed_tokens + num_new_tokens). The fit
is the scheduler crate's (`superinfer_scheduler::cost_fit`, non-negative, on relative error),
the same the simulator's derived profiles use. The same timed steps, with steps at every knot
of the scheduler's token curve (`_router.token_curve_knots`: prefills of each token count,
decodes of each batch size), also fit the curve the scheduler then prices steps with: step ≈
T(prefill_tokens + decode_requests) + D(decode_requests) + c·context_tokens, T and D measured
curves, since a step's cost is not linear in its rows (`TokenCurve`)."""
import logging
import time
from dataclasses import dataclass

import torch
from superinfer_kv import TransferEngine

from superinfer import _router

from .batch import Chunk
from .model_runner import ModelRunner

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StepCost:
    step_base_s: float
    per_prefill_token_s: float
    per_decode_request_s: float
    per_context_token_s: float
    # The token curve (`TokenCurve`): values at the first knots; empty when not measured.
    tokens_s: tuple[float, ...] = ()
    decodes_s: tuple[float, ...] = ()
    curve_per_context_token_s: float = 0.0


@dataclass(frozen=True)
class TransferCost:
    swap_out_bytes_per_s: float
    swap_in_bytes_per_s: float
    transfer_overhead_s: float
    duplex: bool


def sync_device(device: torch.device) -> None:
    """Waits for the device's queued work (a no-op on the CPU), so wall-clock timings hold."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _shapes(max_tokens: int, max_requests: int, num_blocks: int, block_size: int) -> list[tuple[int, int, int]]:
    """(prefill tokens, decode requests, context per decode) that fit the pool and the budget:
    prefill-only steps of several sizes, decode-only steps from one request to the batch limit
    over short and long contexts, and mixed steps — short contexts included, since most steps
    of a serving run are small and a fit from large shapes alone overstates them."""
    capacity = num_blocks * block_size

    def blocks(prefill: int, decodes: int, context: int) -> int:  # as _chunks lays them out
        return -(-prefill // block_size) + decodes * -(-max(context, 1) // block_size)

    big = max(2, min(max_tokens, capacity // 2, 512))
    quarter, half = max(1, max_requests // 4), max(1, max_requests // 2)
    candidates = [(big // 8 or 1, 0, 0), (big // 2 or 1, 0, 0), (big, 0, 0)]
    for decodes, context in ((1, 64), (1, 512), (quarter, 32), (quarter, 256), (half, 128),
                             (max_requests, 64), (half, 512)):
        fit = num_blocks // -(-context // block_size)  # as many as the pool holds
        candidates.append((0, max(1, min(decodes, max_tokens, fit)), context))
    candidates.append((big // 2, min(max_requests, 8), 0))
    candidates.append((big // 4, quarter, 128))
    shapes = [shape for shape in candidates
              if blocks(*shape) <= num_blocks and shape[0] + shape[1] <= max(max_tokens, 1)]
    # The token curve's knots: a prefill of each token count up to the largest step above, and
    # decodes (short contexts) of each batch size up to the largest decode batch above.
    largest = max((p + d for p, d, _ in shapes), default=0)
    most = max((d for _, d, _ in shapes), default=0)
    knots = _router.token_curve_knots()
    shapes += [(n, 0, 0) for n in knots if n < largest and blocks(n, 0, 0) <= num_blocks]
    shapes += [(0, d, 32) for d in knots if d < most and blocks(0, d, 32) <= num_blocks and d <= max_tokens]
    return list(dict.fromkeys(shapes))


def _chunks(prefill: int, decodes: int, context: int, block_size: int, computed: int = 0) -> list[Chunk]:
    """A prefill chunk of `prefill` tokens after `computed` positions already in its blocks,
    and `decodes` decodes over `context` positions each, in consecutive blocks."""
    chunks, next_block = [], 0
    if prefill:
        blocks = -(-(computed + prefill) // block_size)
        chunks.append(Chunk([1] * prefill, computed, list(range(next_block, next_block + blocks))))
        next_block += blocks
    for _ in range(decodes):
        length = max(context, 1)
        blocks = -(-length // block_size)
        chunks.append(Chunk([1], length - 1, list(range(next_block, next_block + blocks))))
        next_block += blocks
    return chunks


def time_step(runner: ModelRunner, chunks: list[Chunk]) -> float:
    """Wall time of one step's compute over `chunks`: the forward and the logits of every row
    a step samples (each chunk's last), as `ShardExecutor` computes them — the LM head's cost
    grows with those rows (on the CPU a [49,152 × 576] head takes 2.9 ms for 1 row and
    11.6 ms for 8)."""
    start = time.perf_counter()
    hidden, batch = runner.forward(chunks)
    rows = [first + len(chunk.token_ids) - 1 for first, chunk in zip(batch.first_rows, chunks)]
    runner.logits(hidden[torch.tensor(rows, dtype=torch.int64, device=hidden.device)])
    sync_device(runner.device)
    return time.perf_counter() - start


def _time_forward(runner: ModelRunner, chunks: list[Chunk], repeats: int) -> float:
    return min(time_step(runner, chunks) for _ in range(repeats))


def measure_step_cost(runner: ModelRunner, max_tokens: int, max_requests: int, repeats: int = 2) -> StepCost:
    """Times forward passes of a dozen shapes and fits the linear cost model (non-negative
    terms, relative error)."""
    timed_shapes, times = [], []
    shapes = _shapes(max_tokens, max(1, max_requests), runner.cache.num_device_blocks, runner.block_size)
    started = time.perf_counter()
    log.info("warm-up: timing forward passes of %d shapes (up to %d tokens, %d requests)",
             len(shapes), max_tokens, max_requests)
    _time_forward(runner, _chunks(*shapes[0], runner.block_size), 1)  # first call pays one-off costs
    for prefill, decodes, context in shapes:
        chunks = _chunks(prefill, decodes, context, runner.block_size)
        context_tokens = sum(c.start + len(c.token_ids) for c in chunks)
        seconds = _time_forward(runner, chunks, repeats)
        timed_shapes.append((prefill, decodes, context_tokens))
        times.append(seconds)
        log.debug("warm-up forward prefill=%d decodes=%d context=%d: %.4fs", prefill, decodes, context, seconds)
    log.info("warm-up: forward passes timed in %.1f s", time.perf_counter() - started)
    tokens_s, decodes_s, per_context = _router.fit_step_curve(timed_shapes, times)
    if not tokens_s:
        log.warning("warm-up: the timed steps leave a knot of the token curve unmeasured; steps are priced linearly")
    return StepCost(*_router.fit_step_cost(timed_shapes, times), tuple(tokens_s), tuple(decodes_s), per_context)


def _time_transfer(engine: TransferEngine, swap_out, swap_in, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        engine.submit(swap_out=swap_out, swap_in=swap_in).wait()
        best = min(best, time.perf_counter() - start)
    return best


def measure_transfer_cost(engine: TransferEngine, num_device: int, num_host: int, block_bytes: int, repeats: int = 3) -> TransferCost:
    """Times one-block and n-block copies each way and both ways at once (disjoint blocks)."""
    count = min(num_device // 2, num_host // 2, 64)
    if count < 1:
        return TransferCost(0.0, 0.0, 0.0, False)
    blocks = list(range(count))
    other = list(range(count, 2 * count))
    started = time.perf_counter()
    log.info("warm-up: timing transfers of %d blocks each way", count)
    overhead = _time_transfer(engine, ([0], [0]), None, repeats)
    out_s = _time_transfer(engine, (blocks, blocks), None, repeats)
    in_s = _time_transfer(engine, None, (blocks, blocks), repeats)
    both_s = _time_transfer(engine, (blocks, blocks), (other, other), repeats)
    log.info("warm-up: transfers timed in %.1f s", time.perf_counter() - started)
    moved = count * block_bytes
    out_bw = moved / max(out_s - overhead, 1e-9)
    in_bw = moved / max(in_s - overhead, 1e-9)
    # Duplex: both directions together clearly faster than one after the other.
    return TransferCost(out_bw, in_bw, overhead, both_s < 0.75 * (out_s + in_s))
