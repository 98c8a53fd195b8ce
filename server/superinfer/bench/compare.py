"""`superinfer bench compare`: like-for-like measurements of scheduler policies.

Every policy's server is started at once, with the same model and limits, and stays up; the
workload of each repetition (its own seed) is replayed against every policy in turn, the order
rotated from one repetition to the next (A B C, B C A, C A B, …). A machine whose speed drifts
then drifts under every policy alike, instead of favouring whichever ran first. Each figure is
reported as the median over the repetitions with its range, and each policy's attainment is
compared with every other one's pair by pair (same seed, same rate).

The idle servers cost a little memory and nothing else: only the policy being measured runs.
On a GPU give the device pool explicitly (`--device-kv-blocks`), so that every server gets the
same one whatever the others took first.
"""
from __future__ import annotations

import statistics
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, replace

from superinfer.bench.outcomes import Slo
from superinfer.bench.runner import RunResult, Target, kv_moves, load_factor, reduce, replay, step_counters, step_time
from superinfer.bench.server_process import LaunchedServer, LaunchOptions
from superinfer.bench.sweep import SloRequest, WorkloadInputs, calibrate, workloads_for
from superinfer.bench.workload import WorkloadConfig


@dataclass(frozen=True)
class Slot:
    """One replay in a comparison: repetition (its seed), rate, policy."""

    repetition: int
    seed: int
    rate: float
    policy: str


def interleaved(policies: list[str], rates: list[float], repeats: int, seed: int) -> Iterator[Slot]:
    """Repetition by repetition, rate by rate, every policy once, the order rotated by one
    policy per repetition."""
    if repeats < 1:
        raise ValueError(f"--repeats must be at least 1, got {repeats}")
    for repetition in range(repeats):
        shift = repetition % len(policies)
        order = policies[shift:] + policies[:shift]
        for rate in sorted(rates):
            for policy in order:
                yield Slot(repetition, seed + repetition, rate, policy)


# The figures summarised over repetitions: name -> how to read it from a run's summary.
FIGURES = {
    "ttft_attainment": lambda s: s["attainment"]["ttft"],
    "tbt_attainment": lambda s: s["attainment"]["tbt"],
    "stall_attainment": lambda s: s["attainment"].get("stall"),
    "both_attainment": lambda s: s["attainment"]["both"],
    "ttft_p50_s": lambda s: s["ttft_s"]["p50"],
    "ttft_p99_s": lambda s: s["ttft_s"]["p99"],
    "gap_p50_s": lambda s: s["tbt_s"].get("p50"),
    "gap_p90_s": lambda s: s["tbt_s"].get("p90"),
    "tbt_p99_s": lambda s: s["tbt_s"]["p99"],
    "gap_max_s": lambda s: s["tbt_s"].get("max"),
    "goodput_rps": lambda s: s["goodput_rps"],
    "throughput_tokens_per_s": lambda s: s["throughput_tokens_per_s"],
}
# Pairwise differences are taken of these (same repetition, same rate).
PAIRED = ("ttft_attainment", "both_attainment", "goodput_rps")


def spread(values: list[float | None]) -> dict:
    """Median, min and max of the values present, and the values themselves."""
    present = [v for v in values if v is not None]
    if not present:
        return {"median": None, "min": None, "max": None, "n": 0, "values": values}
    return {"median": statistics.median(present), "min": min(present), "max": max(present),
            "n": len(present), "values": values}


def _by_point(results: list[RunResult]) -> dict[tuple[str, float], list[RunResult]]:
    grouped: dict[tuple[str, float], list[RunResult]] = {}
    for result in results:
        grouped.setdefault((result.series, result.rate), []).append(result)
    for runs in grouped.values():
        runs.sort(key=lambda r: r.repetition)
    return grouped


def aggregate(results: list[RunResult]) -> list[dict]:
    """Per (policy, rate): every figure's median and range over the repetitions."""
    points = []
    for (series, rate), runs in _by_point(results).items():
        figures = {name: spread([read(r.summary) for r in runs]) for name, read in FIGURES.items()}
        points.append({"series": series, "rate": rate, "repetitions": len(runs), "figures": figures})
    return points


def paired_differences(results: list[RunResult]) -> list[dict]:
    """For every rate and every ordered pair of policies (a, b): a's figure minus b's in the same
    repetition, summarised as a spread (positive: a met more)."""
    grouped = _by_point(results)
    series = list(dict.fromkeys(r.series for r in results))
    rates = sorted({r.rate for r in results})
    pairs = []
    for rate in rates:
        for a in series:
            for b in series:
                if a == b or (a, rate) not in grouped or (b, rate) not in grouped:
                    continue
                runs_b = {r.repetition: r for r in grouped[(b, rate)]}
                for figure in PAIRED:
                    read = FIGURES[figure]
                    deltas = [read(r.summary) - read(runs_b[r.repetition].summary)
                              for r in grouped[(a, rate)] if r.repetition in runs_b]
                    pairs.append({"rate": rate, "a": a, "b": b, "figure": figure, **spread(deltas)})
    return pairs


def median_runs(results: list[RunResult]) -> list[RunResult]:
    """One run per (policy, rate) for plots: the median figures, and every repetition's samples
    pooled for the distributions."""
    merged = []
    for (series, rate), runs in _by_point(results).items():
        first = runs[0]
        summary = {
            **first.summary,
            "attainment": {key: statistics.median(r.summary["attainment"][key] for r in runs)
                           for key in ("ttft", "tbt", "both")},
            "ttft_s": {**first.summary["ttft_s"], "p99": spread([r.summary["ttft_s"]["p99"] for r in runs])["median"]},
            "goodput_rps": statistics.median(r.summary["goodput_rps"] for r in runs),
            "throughput_tokens_per_s": statistics.median(r.summary["throughput_tokens_per_s"] for r in runs),
        }
        summary["tbt_s"] = {**first.summary["tbt_s"], "p99": spread([r.summary["tbt_s"]["p99"] for r in runs])["median"]}
        merged.append(RunResult(series, rate, first.label, summary,
                                [t for r in runs for t in r.ttft_s], [g for r in runs for g in r.gaps_s]))
    return merged


def run_comparison(
    policies: list[str],
    options: LaunchOptions,
    inputs_for,
    config: WorkloadConfig,
    rates: list[float],
    repeats: int,
    slo_request: SloRequest,
    api: str,
    request_timeout_s: float,
    send_slo: bool,
    progress: bool,
    on_run: Callable[[list[RunResult], Slo, dict | None], None] | None = None,
) -> tuple[list[RunResult], Slo, dict | None]:
    """Starts every policy's server, replays each slot of `interleaved(...)` and returns the runs
    (each tagged with its repetition and seed), the objectives and the unloaded latency.
    `inputs_for(url)` gives the WorkloadInputs (the first server's tokenizer is used).
    `on_run(runs so far, objectives, unloaded)` is called after every slot, so a caller can keep
    what was measured if a later slot fails or the run is interrupted."""
    if len(set(policies)) != len(policies):
        raise ValueError(f"each policy once, got {policies}")
    with ExitStack() as stack:
        servers = {}
        for policy in policies:
            servers[policy] = stack.enter_context(LaunchedServer(policy, options))
            print(f"policy {policy}: {servers[policy].url}", flush=True)
        targets = {policy: Target(server.url, api, request_timeout_s) for policy, server in servers.items()}
        inputs: WorkloadInputs = inputs_for(servers[policies[0]].url)
        workloads = {k: workloads_for(inputs, replace(config, seed=config.seed + k), rates) for k in range(repeats)}
        # One set of objectives for every policy and repetition, from the first workload.
        slo, unloaded = calibrate(targets[policies[0]], slo_request, workloads[0][min(rates)])
        results = []
        for position, slot in enumerate(interleaved(policies, rates, repeats, config.seed)):
            target = targets[slot.policy]
            before = step_counters(target)
            records = replay(target, workloads[slot.repetition][slot.rate], slo if send_slo else None, progress)
            result = reduce(records, slo, slot.policy, slot.rate)
            after = step_counters(target)
            result.summary["step_load_factor"] = load_factor(before, after)
            result.summary["kv_moves"] = moves = kv_moves(before, after)
            result.summary["step_time"] = step_time(before, after)
            result.repetition, result.seed, result.position = slot.repetition, slot.seed, position
            attainment = result.summary["attainment"]
            moved = "" if moves is None else (f", {moves['rotations_out']} rotated out, "
                                              f"{moves['recomputes']} recomputed")
            print(f"repetition {slot.repetition} (seed {slot.seed}) rate {slot.rate:g} {slot.policy}: "
                  f"TTFT ok {attainment['ttft']:.0%}, both {attainment['both']:.0%}{moved}", flush=True)
            results.append(result)
            if on_run is not None:
                on_run(results, slo, unloaded)
    return results, slo, unloaded
