"""One simulated run: the workload and profile become the simulator's JSON config; its answer
becomes a `RunResult` labelled "simulated", so reports and plots are the bench's own."""
import json
from dataclasses import dataclass

import numpy as np

from superinfer.bench.outcomes import Outcome, Slo, summarize
from superinfer.bench.runner import RunResult, sample
from superinfer.bench.workload import WorkloadRequest
from superinfer.simulate.profiles import Profile


@dataclass(frozen=True)
class SimOptions:
    policy: str
    # Objectives sent with every request (the scheduler's input) and held against the results.
    slo: Slo
    send_slo: bool = True
    prefix_caching: bool = True
    # Whether RotaSched time-shares the device under overload (the router's --time-share);
    # None: the scheduler's default.
    time_share: bool | None = None
    gap_samples: int = 2000
    max_sim_time_s: float = 1e6
    # Answer every planned step too (`raw["step_log"]`; the simulate CLI's `--step-log`).
    step_log: bool = False


def config_json(profile: Profile, specs: list[WorkloadRequest], options: SimOptions) -> str:
    """The simulator's input (see `router/src/simulate.rs`)."""
    slo = options.slo
    requests = {
        "arrival": [s.arrival_s for s in specs],
        "prompt_tokens": [s.prompt_tokens for s in specs],
        "max_new_tokens": [s.max_new_tokens for s in specs],
        "priority": [s.priority for s in specs],
    }
    if options.send_slo:
        requests["ttft_s"] = [slo.ttft_ms / 1e3] * len(specs)
        requests["tbt_s"] = [slo.tbt_ms / 1e3] * len(specs)
        requests["max_stall_s"] = [slo.stall_ms / 1e3] * len(specs)
    scheduler = {
        "policy": options.policy, "cost_model": profile.cost_model, "block_size": profile.block_size,
        "num_device_blocks": profile.num_device_blocks, "num_host_blocks": profile.num_host_blocks,
        "block_bytes": profile.block_bytes, "max_batch_tokens": profile.max_batch_tokens,
        "max_batch_requests": profile.max_batch_requests, "prefix_caching": options.prefix_caching,
        "default_slo": {"ttft_s": slo.ttft_ms / 1e3, "tbt_s": slo.tbt_ms / 1e3, "max_stall_s": slo.stall_ms / 1e3},
    }
    if options.time_share is not None:
        scheduler["time_share"] = options.time_share
    return json.dumps({
        "scheduler": scheduler, "step_time": profile.step_time, "link": profile.link, "charges": profile.charges,
        "requests": requests,
        "tbt_percentile": slo.tbt_percentile, "max_sim_time_s": options.max_sim_time_s,
        "gap_samples": options.gap_samples, "step_log": options.step_log,
    })


def run_raw(profile: Profile, specs: list[WorkloadRequest], options: SimOptions) -> dict:
    """The simulator's JSON answer, parsed."""
    from superinfer import _router

    if not hasattr(_router, "simulate"):
        raise RuntimeError("this build of superinfer._router has no simulator; rebuild with `make build`")
    return json.loads(_router.simulate(config_json(profile, specs, options)))


def to_result(raw: dict, slo: Slo, series: str, rate: float) -> RunResult:
    columns = raw["requests"]
    outcomes = [
        Outcome(int(i), bool(done), int(tokens), ttft, e2e, tbt, max_gap, int(priority))
        for i, done, tokens, ttft, e2e, tbt, max_gap, priority in zip(
            columns["id"], columns["finished"], columns["output_tokens"], columns["ttft_s"], columns["e2e_s"],
            columns["tbt_s"], columns["max_gap_s"], columns["priority"])
    ]
    gap_stats = dict(raw["gap_stats"])
    summary = summarize(outcomes, slo, max(raw["makespan_s"], 1e-9), gap_stats)
    summary["simulator"] = {k: raw[k] for k in ("steps", "stalled", "bytes_out", "bytes_in", "wall_s", "scheduler", "charged")}
    ttft = np.array([o.ttft_s for o in outcomes if o.ok], dtype=float)
    return RunResult(series, rate, "simulated", summary, sample(ttft), list(raw["gap_quantiles"]), outcomes)


def simulate(profile: Profile, specs: list[WorkloadRequest], options: SimOptions, series: str, rate: float) -> RunResult:
    return to_result(run_raw(profile, specs, options), options.slo, series, rate)


def unloaded_latency(profile: Profile, prompt_tokens: int, output_tokens: int, policy: str) -> dict:
    """TTFT and the gap between tokens of one request alone on the simulated machine."""
    spec = WorkloadRequest(0, 0.0, prompt_tokens, max(output_tokens, 2), True)
    raw = run_raw(profile, [spec], SimOptions(policy, Slo(1e9, 1e9), send_slo=False))
    ttft = raw["requests"]["ttft_s"][0]
    if ttft is None:
        raise RuntimeError(f"a lone request did not complete in simulation: {raw['requests']['error'][0]}")
    return {"requests": 1, "ttft_s": ttft, "tbt_s": raw["gap_stats"]["p50"]}
