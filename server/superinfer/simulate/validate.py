"""Validation of the simulator on this machine: the same workload is benched against the real
server (`superinfer bench compare`, one launch per policy) and simulated, then attainment and
p50/p99 TTFT are compared. Three profiles are tried: the linear cost model the shard
fitted at warm-up (read from its log); that model scaled by how much slower than it the
server's steps ran during each measured run ("loaded": the router counts predicted and
measured step time, `step_load_factor` in the bench report); and one built from the unloaded
latencies the bench measured first. Prints the relative error of each figure and writes
`validation.json`.

    python -m superinfer.simulate.validate --out runs/validate --policies fcfs --rates 1,2,4
"""
import argparse
import json
from dataclasses import replace
from pathlib import Path

from superinfer.bench.metrics import Slo
from superinfer.bench.prompts import LengthLimits
from superinfer.bench.report import read_json
from superinfer.bench.workload import WorkloadConfig, plan
from superinfer.cli import main as superinfer_main
from superinfer.simulate.profiles import from_bench, measured as measured_profile, under_load
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--policies", default="fcfs")
    parser.add_argument("--rates", default="1,2,4")
    parser.add_argument("--num-requests", type=int, default=40)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--output-tokens", type=int, default=32)
    parser.add_argument("--device-kv-blocks", type=int, default=128)
    parser.add_argument("--host-kv-blocks", type=int, default=256)
    parser.add_argument("--max-batch-tokens", type=int, default=512)
    parser.add_argument("--ttft-slo-scale", type=float, default=5.0)
    parser.add_argument("--tbt-slo-scale", type=float, default=5.0)
    parser.add_argument("--reuse", action="store_true", help="analyse an earlier measured run in --out again")
    args = parser.parse_args(argv)
    measured_dir = args.out / "measured"
    code = 0 if args.reuse and (measured_dir / "compare.json").is_file() else superinfer_main([
        "bench", "compare", "--policies", args.policies, "--rates", args.rates, "--num-requests", str(args.num_requests),
        "--prompt-tokens", str(args.prompt_tokens), "--output-tokens", str(args.output_tokens), "--ignore-eos",
        "--ttft-slo-scale", str(args.ttft_slo_scale), "--tbt-slo-scale", str(args.tbt_slo_scale),
        "--device-kv-blocks", str(args.device_kv_blocks), "--host-kv-blocks", str(args.host_kv_blocks),
        "--launch-args", f"--max-batch-tokens {args.max_batch_tokens}", "--out", str(measured_dir), "--no-progress",
    ])
    if code:
        return code
    document = json.loads((measured_dir / "compare.json").read_text())
    slo = Slo(**document["slo"])
    config = WorkloadConfig(**{**document["workload"], "limits": LengthLimits(**document["workload"]["limits"])})
    measured = {(r.series, r.rate): r for r in read_json(measured_dir / "compare.json")}
    report = []
    # The unloaded latencies the bench measured just before the runs (the same for all).
    unloaded = from_bench(measured_dir / "compare.json")
    for (policy, rate), run in sorted(measured.items()):
        specs = plan(replace(config, rate=rate))
        # The linear model the shard fitted at warm-up, as the scheduler uses it.
        warm_up = measured_profile(measured_dir / f"warmup-{policy}.json")
        profiles = {"warm-up": warm_up, "unloaded": unloaded}
        if factor := run.summary.get("step_load_factor"):
            # The warm-up model scaled by how much slower the server's steps ran in this run.
            profiles["loaded"] = under_load(warm_up, factor)
        for source, profile in profiles.items():
            profile = replace(profile, num_device_blocks=args.device_kv_blocks,
                              num_host_blocks=args.host_kv_blocks, max_batch_tokens=args.max_batch_tokens)
            simulated = simulate(profile, specs, SimOptions(policy, slo), policy, rate)
            rows = compare_runs(run.summary, simulated.summary)
            report.append({"policy": policy, "rate": rate, "profile": source, "figures": rows})
            for name, (m, s, error) in rows.items():
                shown = "-" if error is None else f"{error * 100:+.0f}%"
                print(f"{policy:>10} @ {rate:g} req/s [{source:>8}] {name:<16} measured {_fmt(m):>8} "
                      f"simulated {_fmt(s):>8} error {shown}")
    (args.out / "validation.json").write_text(json.dumps({"slo": document["slo"], "runs": report}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
