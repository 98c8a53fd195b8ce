"""Validation of the simulator on this machine: the same workload is benched against the real
server (`superinfer bench compare`, every policy's server up at once, interleaved) and
simulated, then attainment and p50/p99 TTFT are compared, for every policy. The simulation
predicts from what was known before the measured runs: the cost model (token curve and linear terms) each shard measured
at warm-up ("warm-up", with the step charges given: `--step-overhead-ms`, `--transfer-stall`,
planning), and a two-term model built from the unloaded latencies the bench measured first
("unloaded"). Nothing is fitted to the run it is compared with. Prints the relative error of
every figure, counts those within 15% apart from the trivial ones (an attainment of 100%
measured and simulated), and writes `validation.json`.

    python -m superinfer.simulate.validate --out runs/validate --rates 1,2,4

`--measured DIR` analyses an existing `superinfer bench compare --out DIR` instead of launching
one: its `compare.json` gives the workload, the seeds, the objectives and the unloaded
latencies, its `warmup-<policy>.json` each server's warm-up fit and the pools and batch limits
it ran with (trace workloads read the trace from `--trace`). `--step-overhead-from-unloaded`
charges every step the unloaded gap between tokens less the warm-up fit's lone decode step:
a per-step cost measured by the bench before its runs.

    python -m superinfer.simulate.validate --measured runs/compare --out runs/validate

`--profile SPEC` simulates every run a third time on another machine's cost model (e.g. the
warm-up the suite is simulated on) with each server's pools and limits. Every source's verdict
— RotaSched's joint attainment minus the best baseline's, per rate and repetition — is printed
beside the measured one, so a simulated lead can be checked seed by seed.
"""
import argparse
import json
import statistics
from dataclasses import replace
from pathlib import Path

from superinfer import _router
from superinfer.bench.outcomes import SCHEDULER_DEFAULTS, Slo
from superinfer.bench.prompts import LengthLimits
from superinfer.bench.report import read_json
from superinfer.bench.suite import verdicts as suite_verdicts
from superinfer.bench.trace import DEFAULT_TRACE, Trace, load_trace
from superinfer.bench.workload import WorkloadRequest, WorkloadConfig, requests_for
from superinfer.cli import main as superinfer_main
from superinfer.simulate.profiles import Profile, from_bench, measured as measured_profile, resolve
from superinfer.simulate.cli import add_charge_arguments, with_charges
from superinfer.simulate.runner import SimOptions, simulate

FIGURES = (("attainment", "ttft"), ("attainment", "tbt"), ("attainment", "both"), ("ttft_s", "p50"), ("ttft_s", "p99"))


def _relative(simulated: float | None, measured: float | None) -> float | None:
    if simulated is None or measured is None:
        return None
    if measured == 0:
        return 0.0 if simulated == 0 else None
    return (simulated - measured) / measured


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def compare_runs(measured: dict, simulated: dict) -> dict:
    """{figure: (measured, simulated, relative error)} for one (policy, rate)."""
    rows = {}
    for group, key in FIGURES:
        m, s = measured[group][key], simulated[group][key]
        rows[f"{group}.{key}"] = (m, s, _relative(s, m))
    return rows


def trivial(name: str, measured: float | None, simulated: float | None) -> bool:
    """An attainment of 100% on both sides: right whatever the model, so it shows nothing."""
    return name.startswith("attainment.") and measured == 1.0 and simulated == 1.0


def tally(report: list[dict], within: float = 0.15) -> dict:
    """Per profile: figures compared, trivial ones, and non-trivial ones within `within`."""
    counts: dict[str, dict[str, int]] = {}
    for entry in report:
        row = counts.setdefault(entry["profile"], {"figures": 0, "trivial": 0, "within": 0, "missing": 0})
        for name, (m, s, error) in entry["figures"].items():
            row["figures"] += 1
            if trivial(name, m, s):
                row["trivial"] += 1
            elif error is None:
                row["missing"] += 1
            elif abs(error) <= within:
                row["within"] += 1
    return counts


def paired_joint(report: list[dict]) -> list[dict]:
    """Per rate and source (measured, then each simulated profile): RotaSched's joint
    attainment minus the best baseline's, per repetition — the suite's verdict
    (`suite.verdicts`), so that a simulated lead can be checked against the measured one seed
    by seed."""
    runs: dict[str, list[dict]] = {}
    for entry in report:
        measured, simulated, _ = entry["figures"]["attainment.both"]
        for source, joint in (("measured", measured), (entry["profile"], simulated)):
            runs.setdefault(source, []).append({
                "series": entry["policy"], "rate": entry["rate"], "repetition": entry["repetition"],
                "summary": {"attainment": {"both": joint}, "tbt_s": {}}})
    rows = [{"rate": row["rate"], "source": source, "repetitions": row["repetitions"],
             "differences": row["joint_minus_best"]}
            for source, source_runs in runs.items() for row in suite_verdicts(source_runs)]
    order = list(runs)
    return sorted(rows, key=lambda row: (row["rate"], order.index(row["source"])))


def lone_decode_s(cost: dict, context_tokens: float) -> float:
    """A cost model's step time for one decode at the given context (the scheduler's formula:
    its token curve when it has one)."""
    return _router.step_time(json.dumps({"kind": "linear", **cost}), [(0, 1, round(context_tokens))])[0]


_STEP_TERMS = ("step_base_s", "per_prefill_token_s", "per_decode_request_s", "per_context_token_s")


def shared_machine(step_times: list[dict]) -> dict:
    """One simulated machine for every server of a run (they ran on the same cores, their
    warm-ups one after the other, and one warm-up is one noisy sample of that machine): each
    step term of their warm-up models, and each knot of their token curves, the median over
    the servers. Transfers keep each server's own link."""
    machine = dict(step_times[0])
    for key in _STEP_TERMS:
        machine[key] = statistics.median(float(step_time[key]) for step_time in step_times)
    curves = [step_time.get("token_curve") or {} for step_time in step_times]
    if all(curve.get("tokens_s") for curve in curves):
        def knots(name: str) -> list[float]:
            count = min(len(curve.get(name, [])) for curve in curves)
            return [statistics.median(curve[name][i] for curve in curves) for i in range(count)]
        machine["token_curve"] = {"tokens_s": knots("tokens_s"), "decodes_s": knots("decodes_s"),
                                  "per_context_token_s": statistics.median(c.get("per_context_token_s", 0.0)
                                                                           for c in curves)}
    else:
        machine.pop("token_curve", None)
    return machine


def unloaded_profile(compare_json: Path, calibration: list[WorkloadRequest], like: Profile) -> Profile:
    """The two-term model from the unloaded latencies (`profiles.from_bench`), its prefill cost
    spread over the calibration requests' own prompts (`from_bench` reads the fixed
    `prompt_tokens` of the workload, which trace or ShareGPT lengths do not use), with the
    pools and batch limits of `like`."""
    profile = from_bench(compare_json)
    written = max(int(json.loads(compare_json.read_text())["workload"].get("prompt_tokens", 1)), 1)
    actual = statistics.median(s.prompt_tokens for s in calibration) if calibration else written
    scale = written / actual
    step_time = {**profile.step_time, "per_prefill_token_s": profile.step_time["per_prefill_token_s"] * scale}
    cost_model = {**profile.cost_model, "per_prefill_token_s": profile.cost_model["per_prefill_token_s"] * scale}
    return replace(profile, step_time=step_time, cost_model=cost_model, num_device_blocks=like.num_device_blocks,
                   num_host_blocks=like.num_host_blocks, max_batch_tokens=like.max_batch_tokens,
                   max_batch_requests=like.max_batch_requests)


def _trace_for(config: WorkloadConfig, path: Path | None) -> Trace | None:
    if "trace" not in (config.arrival, config.lengths):
        return None
    return load_trace(path or DEFAULT_TRACE)


def analyse(measured_dir: Path, args: argparse.Namespace) -> dict:
    """Simulates every measured run of `measured_dir` (a `bench compare` output) twice, from the
    warm-up fit and from the unloaded latencies, and compares; returns the validation document."""
    compare_json = measured_dir / "compare.json"
    document = json.loads(compare_json.read_text())
    slo = Slo(**document["slo"])
    config = WorkloadConfig(**{**document["workload"], "limits": LengthLimits(**document["workload"]["limits"])})
    if config.lengths == "sharegpt":
        raise SystemExit("simulate validate: ShareGPT lengths need the conversations and tokenizer; not supported")
    trace = _trace_for(config, args.trace)
    runs = read_json(compare_json)
    rates = document.get("rates") or sorted({r.rate for r in runs})
    # What `bench compare` calibrated on: the first requests of the first workload at the lowest rate.
    unloaded_latency = document.get("unloaded") or {}
    calibration = requests_for(replace(config, rate=min(rates)), trace)[:int(unloaded_latency.get("requests", 0))]
    context = statistics.median(s.prompt_tokens + s.max_new_tokens / 2 for s in calibration) if calibration else 0.0
    profiles: dict[str, dict[str, Profile]] = {}
    overheads: dict[str, float] = {}
    policies = list(dict.fromkeys(r.series for r in runs))
    # The cost model each shard measured at warm-up, as its scheduler uses it; its pools and
    # batch limits are the ones that server ran with.
    warm_ups = {policy: measured_profile(measured_dir / f"warmup-{policy}.json") for policy in policies}
    if args.shared_machine:
        machine = shared_machine([profile.step_time for profile in warm_ups.values()])
        warm_ups = {policy: replace(profile, step_time=machine) for policy, profile in warm_ups.items()}
    other = resolve(args.profile) if args.profile else None
    for policy in policies:
        fitted = warm_ups[policy]
        if args.step_overhead_from_unloaded:
            if not unloaded_latency:
                raise SystemExit("simulate validate: the bench measured no unloaded latency")
            gap = unloaded_latency["tbt_s"] - lone_decode_s(fitted.cost_model, context)
            overheads[policy] = max(gap, 0.0)
            fitted = replace(fitted, charges={**fitted.charges, "per_step_s": overheads[policy]})
        warm_up = with_charges(fitted, args)
        profiles[policy] = {"warm-up": warm_up, "unloaded": with_charges(unloaded_profile(compare_json, calibration,
                                                                                          fitted), args)}
        if other is not None:
            # Another machine's cost model (e.g. the one the suite is simulated on), with the
            # pools and batch limits this server ran with.
            profiles[policy]["profile"] = with_charges(replace(
                other, num_device_blocks=fitted.num_device_blocks, num_host_blocks=fitted.num_host_blocks,
                max_batch_tokens=fitted.max_batch_tokens, max_batch_requests=fitted.max_batch_requests), args)
    for policy, overhead in overheads.items():
        print(f"{policy}: per-step charge {overhead * 1e3:.1f} ms = unloaded gap {unloaded_latency['tbt_s'] * 1e3:.1f} ms "
              f"- warm-up lone decode {lone_decode_s(profiles[policy]['warm-up'].cost_model, context) * 1e3:.1f} ms "
              f"(context {context:.0f})")
    report = []
    for run in sorted(runs, key=lambda r: (r.series, r.rate, r.repetition)):
        policy, rate = run.series, run.rate
        seed = run.seed if run.seed is not None else config.seed
        specs = requests_for(replace(config, rate=rate, seed=seed), trace)
        if run.summary.get("requests") not in (None, len(specs)):
            raise SystemExit(f"simulate validate: {policy} @ {rate:g} measured {run.summary['requests']} requests, "
                             f"the workload plans {len(specs)} (another trace?)")
        for source, profile in profiles[policy].items():
            simulated = simulate(profile, specs, SimOptions(policy, slo), policy, rate)
            rows = compare_runs(run.summary, simulated.summary)
            report.append({"policy": policy, "rate": rate, "repetition": run.repetition, "profile": source,
                           "load_factor": run.summary.get("step_load_factor"), "figures": rows})
            for name, (m, s, error) in rows.items():
                shown = "-" if error is None else f"{error * 100:+.0f}%"
                mark = " (trivial)" if trivial(name, m, s) else ""
                print(f"{policy:>10} @ {rate:g} req/s #{run.repetition} [{source:>8}] {name:<16} measured {_fmt(m):>8} "
                      f"simulated {_fmt(s):>8} error {shown}{mark}")
    counts = tally(report)
    by_policy = {policy: tally([e for e in report if e["policy"] == policy]) for policy in profiles}
    for policy, rows in by_policy.items():
        for source, row in rows.items():
            print(f"{policy:>10} [{source:>8}] {row['within']} of {row['figures'] - row['trivial']} non-trivial "
                  f"figures within 15% ({row['trivial']} trivial, {row['missing']} not comparable)")
    for source, row in counts.items():
        print(f"[{source}] {row['within']} of {row['figures'] - row['trivial']} non-trivial figures within 15% "
              f"({row['trivial']} trivial, {row['missing']} not comparable)")
    paired = paired_joint(report)
    for entry in paired:
        shown = " ".join(f"{d * 100:+.0f}" for d in entry["differences"])
        print(f"rotasched - best baseline, joint, points @ {entry['rate']:g} req/s [{entry['source']:>8}]: {shown}")
    return {"measured": str(measured_dir), "slo": document["slo"], "paired_joint": paired,
            "trace": None if trace is None else
            str(args.trace or DEFAULT_TRACE), "charges": {policy: {k: p.charges for k, p in both.items()}
                                                          for policy, both in profiles.items()},
            "tally": counts, "tally_by_policy": by_policy, "runs": report}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--policies", default=",".join(SCHEDULER_DEFAULTS["policies"]))
    parser.add_argument("--rates", default="1,2,4")
    parser.add_argument("--num-requests", type=int, default=40)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--output-tokens", type=int, default=32)
    parser.add_argument("--device-kv-blocks", type=int, default=128)
    parser.add_argument("--host-kv-blocks", type=int, default=256)
    parser.add_argument("--max-batch-tokens", type=int, default=512)
    parser.add_argument("--ttft-slo-scale", type=float, default=5.0)
    parser.add_argument("--tbt-slo-scale", type=float, default=5.0)
    parser.add_argument("--repeats", type=int, default=1, help="bench repetitions (seeds) per point")
    parser.add_argument("--reuse", action="store_true", help="analyse an earlier measured run in --out again")
    parser.add_argument("--measured", type=Path, default=None,
                        help="analyse this `bench compare --out` directory (compare.json, warmup-<policy>.json) "
                        "instead of measuring; the workload options above are then ignored")
    parser.add_argument("--trace", type=Path, default=None,
                        help="the trace a trace workload was built from (default: the repository's Azure trace)")
    parser.add_argument("--shared-machine", action="store_true",
                        help="simulate every server on one machine, each term and knot the median of the servers' "
                        "warm-ups (each scheduler still believes its own warm-up)")
    parser.add_argument("--step-overhead-from-unloaded", action="store_true",
                        help="charge every step the unloaded gap between tokens less the warm-up fit's lone "
                        "decode step (per policy; an explicit --step-overhead-ms overrides it)")
    parser.add_argument("--profile", default=None,
                        help="also simulate on this profile (as `superinfer simulate --profile`, e.g. the one the "
                        "suite is simulated on), with each server's pools and batch limits")
    add_charge_arguments(parser)
    args = parser.parse_args(argv)
    if args.measured is not None:
        measured_dir = args.measured
        if not (measured_dir / "compare.json").is_file():
            raise SystemExit(f"simulate validate: no compare.json in {measured_dir}")
        code = 0
    else:
        measured_dir = args.out / "measured"
        code = 0 if args.reuse and (measured_dir / "compare.json").is_file() else superinfer_main([
            "bench", "compare", "--policies", args.policies, "--rates", args.rates,
            "--num-requests", str(args.num_requests), "--prompt-tokens", str(args.prompt_tokens),
            "--output-tokens", str(args.output_tokens), "--ignore-eos",
            "--ttft-slo-scale", str(args.ttft_slo_scale), "--tbt-slo-scale", str(args.tbt_slo_scale),
            "--device-kv-blocks", str(args.device_kv_blocks), "--host-kv-blocks", str(args.host_kv_blocks),
            "--launch-args", f"--max-batch-tokens {args.max_batch_tokens}", "--out", str(measured_dir),
            "--no-progress", "--repeats", str(args.repeats),
        ])
    if code:
        return code
    validation = analyse(measured_dir, args)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "validation.json").write_text(json.dumps(validation, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
