"""A rate sweep: the same seeded workload at each rate, replayed one rate after another against
one server, with objectives fixed once (absolute, or multiples of the unloaded latency)."""
from dataclasses import dataclass, replace

import numpy as np

from superinfer.bench.outcomes import SCHEDULER_DEFAULTS, Slo
from superinfer.bench.prompts import PromptBuilder
from superinfer.bench.runner import RunResult, Target, kv_moves, load_factor, reduce, replay, step_counters, step_time, unloaded_latency
from superinfer.bench.sharegpt import Conversation
from superinfer.bench.tokenizer import Tokenizer
from superinfer.bench.trace import Trace
from superinfer.bench.workload import WorkloadRequest, WorkloadConfig, attach_prompts, requests_for


@dataclass(frozen=True)
class SloRequest:
    """Absolute objectives win; otherwise multiples of the unloaded latency."""

    ttft_ms: float | None = None
    tbt_ms: float | None = None
    ttft_scale: float = 5.0
    tbt_scale: float = 5.0
    tbt_percentile: float = SCHEDULER_DEFAULTS["tbt_percentile"]
    calibration_requests: int = 3
    # The stall bound: absolute, else a multiple of the TBT objective, else the server's rule.
    max_stall_ms: float | None = None
    max_stall_scale: float | None = None

    @property
    def needs_calibration(self) -> bool:
        return self.ttft_ms is None or self.tbt_ms is None

    def resolve(self, unloaded: dict | None) -> Slo:
        if self.needs_calibration and unloaded is None:
            raise ValueError("relative objectives need the unloaded latency")
        ttft = self.ttft_ms if self.ttft_ms is not None else unloaded["ttft_s"] * 1e3 * self.ttft_scale
        tbt = self.tbt_ms if self.tbt_ms is not None else unloaded["tbt_s"] * 1e3 * self.tbt_scale
        stall = self.max_stall_ms
        if stall is None and self.max_stall_scale is not None:
            stall = self.max_stall_scale * tbt
        return Slo(ttft, tbt, self.tbt_percentile, stall)


@dataclass
class WorkloadInputs:
    """What workload construction reads: the trace, real texts, and a tokenizer."""

    trace: Trace | None
    conversations: list[Conversation]
    tokenizer: Tokenizer

    def specs(self, config: WorkloadConfig) -> list[WorkloadRequest]:
        """The workload with prompt text; the same config gives the same texts."""
        planned = requests_for(config, self.trace, self.conversations, self.tokenizer)
        builder = PromptBuilder(self.conversations, self.tokenizer, np.random.default_rng(config.seed + 1))
        return attach_prompts(planned, builder)


def calibrate(target: Target, slo_request: SloRequest, specs: list[WorkloadRequest]) -> tuple[Slo, dict | None]:
    unloaded = unloaded_latency(target, specs, slo_request.calibration_requests) if slo_request.needs_calibration else None
    return slo_request.resolve(unloaded), unloaded


def sweep(
    target: Target,
    workloads: dict[float, list[WorkloadRequest]],
    slo: Slo,
    send_slo: bool,
    series: str,
    progress: bool = True,
) -> list[RunResult]:
    """Replays the workload of each rate, lowest first."""
    results = []
    for rate in sorted(workloads):
        before = step_counters(target)
        records = replay(target, workloads[rate], slo if send_slo else None, progress)
        result = reduce(records, slo, series, rate)
        # How far the load moved the server's steps from its warm-up model (None: no counters).
        after = step_counters(target)
        result.summary["step_load_factor"] = load_factor(before, after)
        result.summary["kv_moves"] = kv_moves(before, after)
        result.summary["step_time"] = step_time(before, after)
        results.append(result)
    return results


def workloads_for(inputs: WorkloadInputs, config: WorkloadConfig, rates: list[float]) -> dict[float, list[WorkloadRequest]]:
    return {rate: inputs.specs(replace(config, rate=rate)) for rate in rates}
