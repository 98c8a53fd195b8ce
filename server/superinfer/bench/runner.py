"""One replay of a workload against a server: requests are sent at their arrival offsets
(open loop: a slow server does not slow the arrivals), streamed concurrently, and reduced to a
`RunResult`. Also measures the unloaded latency that relative objectives are multiples of."""
import asyncio
import time
import urllib.request
from dataclasses import dataclass, field

import aiohttp
import numpy as np
from tqdm import tqdm

from superinfer.bench.client import Api, RequestRecord, send
from superinfer.bench.outcomes import Outcome, Slo, outcome_from_times, stats, summarize
from superinfer.bench.workload import WorkloadRequest

# Enough points for a smooth CDF; a run's report stays small whatever its size.
MAX_SAMPLES = 20_000


@dataclass(frozen=True)
class Target:
    url: str
    api: Api = "tgi"
    # Per-request limit, so that a stuck server cannot hang the bench.
    request_timeout_s: float = 600.0


@dataclass
class RunResult:
    """One (series, rate) point. `label` is "measured" or "simulated"."""

    series: str
    rate: float
    label: str
    summary: dict
    ttft_s: list[float] = field(default_factory=list)
    gaps_s: list[float] = field(default_factory=list)
    outcomes: list[Outcome] = field(default_factory=list)
    # In a repeated comparison: which repetition, its workload's seed, and the replay's place in
    # the interleaved order.
    repetition: int = 0
    seed: int | None = None
    position: int | None = None

    def to_json(self) -> dict:
        return {
            "series": self.series,
            "rate": self.rate,
            "label": self.label,
            "repetition": self.repetition,
            "seed": self.seed,
            "position": self.position,
            "summary": self.summary,
            "ttft_s": self.ttft_s,
            "gaps_s": self.gaps_s,
            "requests": [o.__dict__ for o in self.outcomes],
        }


def sample(values: np.ndarray, seed: int = 0) -> list[float]:
    """At most MAX_SAMPLES values, drawn uniformly (all of them when fewer)."""
    if values.size <= MAX_SAMPLES:
        return values.tolist()
    return np.random.default_rng(seed).choice(values, MAX_SAMPLES, replace=False).tolist()


async def _replay(target: Target, specs: list[WorkloadRequest], slo_sent: Slo | None, progress: bool) -> tuple[list[RequestRecord], float]:
    timeout = aiohttp.ClientTimeout(total=target.request_timeout_s)
    connector = aiohttp.TCPConnector(limit=0)
    origin = time.perf_counter()
    bar = tqdm(total=len(specs), desc="requests", unit="req", disable=not progress)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:

        async def one(spec: WorkloadRequest) -> RequestRecord:
            delay = spec.arrival_s - (time.perf_counter() - origin)
            if delay > 0:
                await asyncio.sleep(delay)
            record = await send(session, target.url, target.api, spec, slo_sent, origin)
            bar.update(1)
            return record

        records = await asyncio.gather(*(one(spec) for spec in specs))
    bar.close()
    return list(records), time.perf_counter() - origin


def reduce(records: list[RequestRecord], slo: Slo, series: str, rate: float, label: str = "measured") -> RunResult:
    """Outcomes, summary and samples of one replay."""
    outcomes = [
        outcome_from_times(r.index, r.sent_at, r.token_times, r.done_at, r.ok, slo.tbt_percentile, r.priority)
        if not r.refused else Outcome(r.index, False, 0, None, None, None, None, r.priority, True, r.done_at - r.sent_at)
        for r in records
    ]
    gaps = np.concatenate([np.diff(r.token_times) for r in records if r.ok] or [np.zeros(0)])
    sent = [r.sent_at for r in records]
    ended = [max(r.done_at, r.token_times[-1] if r.token_times else 0.0) for r in records]
    duration = max(max(ended) - min(sent), 1e-9) if records else 1e-9
    summary = summarize(outcomes, slo, duration, stats(gaps))
    ttft = np.array([o.ttft_s for o in outcomes if o.ok])
    return RunResult(series, rate, label, summary, sample(ttft), sample(gaps), outcomes)


_STEP_COUNTERS = ("superinfer_step_model_microseconds_total", "superinfer_step_shard_microseconds_total")
# What the scheduler moved or dropped: the KV side of a policy, next to its latencies.
_MOVE_COUNTERS = {"rotations_out": "superinfer_rotations_out_total", "rotations_in": "superinfer_rotations_in_total",
                  "rotations_in_computed": "superinfer_rotations_in_computed_total",
                  "rotations_out_after_compute": "superinfer_rotations_out_after_compute_total",
                  "blocks_out_mirrored": "superinfer_kv_blocks_out_mirrored_total",
                  "recomputes": "superinfer_recomputes_total"}
# Where a run's wall time went, step by step: how many steps, their round trips, the forward
# passes within them, the shard's time beyond the forward, and the engine's time between steps.
_TIME_COUNTERS = {"steps": "superinfer_steps_total", "round_trip_s": "superinfer_step_duration_sum",
                  "forward_s": "superinfer_forward_duration_sum", "overhead_s": "superinfer_step_overhead_duration_sum",
                  "between_steps_s": "superinfer_engine_turn_duration_sum"}


def step_counters(target: Target) -> dict[str, float] | None:
    """The server's step-time and KV-move counters from /metrics (0 before its first step;
    None when the page cannot be read)."""
    try:
        with urllib.request.urlopen(f"{target.url.rstrip('/')}/metrics", timeout=10) as response:
            text = response.read().decode()
    except OSError:
        return None
    found = dict.fromkeys((*_STEP_COUNTERS, *_MOVE_COUNTERS.values(), *_TIME_COUNTERS.values()), 0.0)
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in found:
            found[name] = float(value)
    return found


def kv_moves(before: dict | None, after: dict | None) -> dict[str, int] | None:
    """Requests rotated out, rotated back in and dropped for recompute between two scrapes, and
    the blocks rotated out without a copy (the host held a mirror)."""
    if before is None or after is None:
        return None
    return {key: int(after.get(name, 0.0) - before.get(name, 0.0)) for key, name in _MOVE_COUNTERS.items()}


def step_time(before: dict | None, after: dict | None) -> dict[str, float] | None:
    """Steps run between two scrapes and where their time went (seconds, summed): round trip,
    forward, round trip beyond the shard's own time, and the engine's time between steps."""
    if before is None or after is None:
        return None
    return {key: after.get(name, 0.0) - before.get(name, 0.0) for key, name in _TIME_COUNTERS.items()}


def load_factor(before: dict | None, after: dict | None) -> float | None:
    """Measured / warm-up-predicted step time over the steps between two scrapes: how much
    slower than its warm-up fit the server ran under this load."""
    if before is None or after is None:
        return None
    model, shard = (after[name] - before[name] for name in _STEP_COUNTERS)
    return shard / model if model > 0 else None


def replay(target: Target, specs: list[WorkloadRequest], slo_sent: Slo | None, progress: bool = True) -> list[RequestRecord]:
    """Sends every spec at its arrival offset and waits for all of them."""
    records, _elapsed = asyncio.run(_replay(target, specs, slo_sent, progress))
    return records


def unloaded_latency(target: Target, specs: list[WorkloadRequest], count: int = 3) -> dict:
    """Median TTFT and median gap between tokens of `count` requests sent one at a time (the
    first `count` specs, all at offset 0 so none waits for another)."""
    if not specs:
        raise ValueError("measuring the unloaded latency needs at least one request")
    ttfts, gaps = [], []
    for spec in specs[:count]:
        (record,) = replay(target, [WorkloadRequest(spec.index, 0.0, spec.prompt_tokens, spec.max_new_tokens, spec.ignore_eos, spec.prompt)], None, progress=False)
        if not record.ok:
            raise RuntimeError(f"unloaded request failed: {record.error}")
        ttfts.append(record.token_times[0] - record.sent_at)
        gaps.extend(np.diff(record.token_times).tolist())
    return {
        "requests": len(ttfts),
        "ttft_s": float(np.median(ttfts)),
        "tbt_s": float(np.median(gaps)) if gaps else float(np.median(ttfts)),
    }
