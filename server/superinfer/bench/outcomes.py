"""Latency metrics and SLO attainment. A request meets its TTFT objective when its first token
came within `ttft_ms`, and its TBT objective when the chosen percentile of its gaps between
tokens is within `tbt_ms` and no gap exceeds the stall bound `max_stall_ms` (a request with one
token has no gap and meets it). A failed request meets neither. Goodput counts the requests that
met both, per second of the run (DistServe's definition).
Shared by `bench` (outcomes from streamed timestamps) and `simulate` (outcomes from Rust).

The percentile and the verdict are the scheduler crate's (`superinfer_scheduler::attainment`,
through the extension), the definitions the server's /metrics and the simulator use."""
from dataclasses import asdict, dataclass

import numpy as np

from superinfer import _router

# The scheduler crate's defaults (policies, objectives, TBT percentile, step limits): the
# router's flags are defined from the same constants.
SCHEDULER_DEFAULTS = _router.scheduler_defaults()


@dataclass(frozen=True)
class Slo:
    ttft_ms: float
    tbt_ms: float
    # Which percentile of a request's gaps is held against tbt_ms (the scheduler's default).
    tbt_percentile: float = SCHEDULER_DEFAULTS["tbt_percentile"]
    # The longest gap allowed at all; None: the scheduler crate's default multiple of tbt_ms.
    max_stall_ms: float | None = None

    def __post_init__(self):
        if self.ttft_ms <= 0 or self.tbt_ms <= 0:
            raise ValueError(f"objectives must be positive, got ttft {self.ttft_ms} ms, tbt {self.tbt_ms} ms")
        if not 0 < self.tbt_percentile <= 100:
            raise ValueError(f"tbt_percentile must lie in (0, 100], got {self.tbt_percentile}")
        if self.max_stall_ms is not None and not self.max_stall_ms >= self.tbt_ms:
            raise ValueError(f"the stall bound ({self.max_stall_ms} ms) must be at least tbt_ms ({self.tbt_ms} ms)")

    @property
    def stall_ms(self) -> float:
        """The stall bound in force (the server's default rule when none is given)."""
        return self.max_stall_ms if self.max_stall_ms is not None else _router.default_stall_factor() * self.tbt_ms

    def request_json(self) -> dict:
        """The objectives as a request's `slo` parameter."""
        body = {"ttft_ms": self.ttft_ms, "tbt_ms": self.tbt_ms}
        if self.max_stall_ms is not None:
            body["max_stall_ms"] = self.max_stall_ms
        return body


@dataclass(frozen=True)
class Outcome:
    """One request's latencies in seconds (None for a request that failed)."""

    index: int
    ok: bool
    output_tokens: int
    ttft_s: float | None
    e2e_s: float | None
    # The Slo's percentile of this request's gaps; 0 when it produced fewer than two tokens.
    tbt_s: float | None
    # Its longest gap (0 with fewer than two tokens), held against the stall bound.
    max_gap_s: float | None = None
    priority: int = 0
    # Refused at once (429) with the seconds the refusal took; never started.
    refused: bool = False
    refusal_s: float | None = None

    @property
    def longest_gap_s(self) -> float | None:
        """Its longest gap; outcomes recorded without one (older reports) fall back to the gaps'
        percentile."""
        return self.max_gap_s if self.max_gap_s is not None else self.tbt_s

    def _verdict(self, slo: Slo) -> tuple[bool, bool]:
        if not self.ok or self.ttft_s is None or self.tbt_s is None:
            return False, False
        return _router.meets(self.ttft_s, self.tbt_s, self.longest_gap_s, slo.ttft_ms / 1e3, slo.tbt_ms / 1e3,
                             slo.stall_ms / 1e3)

    def meets_stall(self, slo: Slo) -> bool:
        return self.ok and self.longest_gap_s is not None and self.longest_gap_s <= slo.stall_ms / 1e3

    def meets_ttft(self, slo: Slo) -> bool:
        return self._verdict(slo)[0]

    def meets_tbt(self, slo: Slo) -> bool:
        return self._verdict(slo)[1]


def stats(values) -> dict:
    """count, mean, p50, p90, p99 (linear interpolation, as numpy) and max; None when empty."""
    array = np.asarray(values, dtype=float)
    if array.size == 0:
        return {"count": 0, "mean": None, "p50": None, "p90": None, "p99": None, "max": None}
    listed = array.tolist()
    p50, p90, p99 = (_router.percentile(listed, p) for p in (50, 90, 99))
    return {"count": int(array.size), "mean": float(array.mean()), "p50": p50, "p90": p90, "p99": p99,
            "max": float(array.max())}


def outcome_from_times(
    index: int, sent_at: float, token_times: list[float], done_at: float, ok: bool, tbt_percentile: float,
    priority: int = 0,
) -> Outcome:
    """Latencies of one streamed request: TTFT from sending to the first token, end-to-end from
    sending to the end of the stream, gaps between consecutive tokens."""
    if not ok or not token_times:
        return Outcome(index, False, len(token_times), None, None, None, None, priority)
    gaps = np.diff(np.asarray(token_times, dtype=float))
    tbt = _router.percentile(gaps.tolist(), tbt_percentile) if gaps.size else 0.0
    max_gap = float(gaps.max()) if gaps.size else 0.0
    end = max(done_at, token_times[-1])
    return Outcome(index, True, len(token_times), token_times[0] - sent_at, end - sent_at, tbt, max_gap, priority)


def attainment(outcomes: list[Outcome], slo: Slo) -> dict:
    """Shares of `outcomes` meeting TTFT, TBT (stall bound included), the stall bound alone, and
    both objectives."""
    total = len(outcomes)
    share = (lambda k: k / total) if total else (lambda k: 0.0)
    return {
        "ttft": share(sum(o.meets_ttft(slo) for o in outcomes)),
        "tbt": share(sum(o.meets_tbt(slo) for o in outcomes)),
        "stall": share(sum(o.meets_stall(slo) for o in outcomes)),
        "both": share(sum(o.meets_ttft(slo) and o.meets_tbt(slo) for o in outcomes)),
    }


def summarize(outcomes: list[Outcome], slo: Slo, duration_s: float, gap_stats: dict) -> dict:
    """Everything a report shows for one run. `gap_stats` is `stats()` of every gap between
    tokens of every request (the caller holds the gaps; a simulator need not return them)."""
    if duration_s <= 0:
        raise ValueError(f"a run needs a positive duration, got {duration_s}")
    total = len(outcomes)
    done = [o for o in outcomes if o.ok]
    meets_both = sum(o.meets_ttft(slo) and o.meets_tbt(slo) for o in outcomes)
    output_tokens = sum(o.output_tokens for o in done)
    classes = sorted({o.priority for o in outcomes})
    refused = [o for o in outcomes if o.refused]
    admitted = [o for o in outcomes if not o.refused]
    summary = {
        "requests": total,
        "completed": len(done),
        "failed": total - len(done),
        "duration_s": duration_s,
        "slo": asdict(slo),
        "ttft_s": stats([o.ttft_s for o in done]),
        "tbt_s": gap_stats,
        "request_tbt_s": stats([o.tbt_s for o in done]),
        "request_max_gap_s": stats([o.max_gap_s for o in done if o.max_gap_s is not None]),
        "e2e_s": stats([o.e2e_s for o in done]),
        "attainment": attainment(outcomes, slo),
        "goodput_rps": meets_both / duration_s,
        "throughput_rps": len(done) / duration_s,
        "throughput_tokens_per_s": output_tokens / duration_s,
        "output_tokens": output_tokens,
    }
    if refused:
        # Admission's own figures: how fast it refused, and what the admitted requests got.
        summary["refused"] = len(refused)
        summary["refusal_s"] = stats([o.refusal_s for o in refused if o.refusal_s is not None])
        summary["admitted_attainment"] = attainment(admitted, slo)
    if len(classes) > 1:
        summary["by_priority"] = {
            str(c): {"requests": sum(o.priority == c for o in outcomes),
                     "attainment": attainment([o for o in outcomes if o.priority == c], slo),
                     # A lower class's stalls are what strict classes cost it: its longest gaps.
                     "request_max_gap_s": stats([o.max_gap_s for o in done
                                                 if o.priority == c and o.max_gap_s is not None])}
            for c in classes
        }
    return summary
