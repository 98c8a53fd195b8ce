"""Validation of the simulator on this machine: the same workload is benched against the real
server (`superinfer bench compare`, every policy's server up at once, interleaved) and
simulated, then attainment and p50/p99 TTFT are compared, for every policy. The simulation
predicts from what was known before the measured runs: the linear cost model each shard fitted
at warm-up ("warm-up", with the step charges given: `--step-overhead-ms`, `--transfer-stall`,
planning), and a two-term model built from the unloaded latencies the bench measured first
("unloaded"). Nothing is fitted to the run it is compared with. Prints the relative error of
every figure, counts those within 15% apart from the trivial ones (an attainment of 100%
measured and simulated), and writes `validation.json`.

    python -m superinfer.simulate.validate --out runs/validate --rates 1,2,4
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
from superinfer.simulate.profiles import from_bench, measured as measured_profile
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--policies", default="fcfs,recompute,swap,rotasched")
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
    add_charge_arguments(parser)
    args = parser.parse_args(argv)
    measured_dir = args.out / "measured"
    code = 0 if args.reuse and (measured_dir / "compare.json").is_file() else superinfer_main([
        "bench", "compare", "--policies", args.policies, "--rates", args.rates, "--num-requests", str(args.num_requests),
        "--prompt-tokens", str(args.prompt_tokens), "--output-tokens", str(args.output_tokens), "--ignore-eos",
        "--ttft-slo-scale", str(args.ttft_slo_scale), "--tbt-slo-scale", str(args.tbt_slo_scale),
        "--device-kv-blocks", str(args.device_kv_blocks), "--host-kv-blocks", str(args.host_kv_blocks),
        "--launch-args", f"--max-batch-tokens {args.max_batch_tokens}", "--out", str(measured_dir), "--no-progress",
        "--repeats", str(args.repeats),
    ])
    if code:
        return code
    document = json.loads((measured_dir / "compare.json").read_text())
    slo = Slo(**document["slo"])
    config = WorkloadConfig(**{**document["workload"], "limits": LengthLimits(**document["workload"]["limits"])})
    runs = read_json(measured_dir / "compare.json")
    report = []
    # The unloaded latencies the bench measured just before the runs (the same for all).
    unloaded = with_charges(from_bench(measured_dir / "compare.json"), args)
    for run in sorted(runs, key=lambda r: (r.series, r.rate, r.repetition)):
        policy, rate = run.series, run.rate
        seed = run.seed if run.seed is not None else config.seed
        specs = plan(replace(config, rate=rate, seed=seed))
        # The linear model the shard fitted at warm-up, as the scheduler uses it.
        warm_up = with_charges(measured_profile(measured_dir / f"warmup-{policy}.json"), args)
        for source, profile in {"warm-up": warm_up, "unloaded": unloaded}.items():
            profile = replace(profile, num_device_blocks=args.device_kv_blocks,
                              num_host_blocks=args.host_kv_blocks, max_batch_tokens=args.max_batch_tokens)
            simulated = simulate(profile, specs, SimOptions(policy, slo), policy, rate)
            rows = compare_runs(run.summary, simulated.summary)
            report.append({"policy": policy, "rate": rate, "repetition": run.repetition, "profile": source,
                           "figures": rows})
            for name, (m, s, error) in rows.items():
                shown = "-" if error is None else f"{error * 100:+.0f}%"
                mark = " (trivial)" if trivial(name, m, s) else ""
                print(f"{policy:>10} @ {rate:g} req/s #{run.repetition} [{source:>8}] {name:<16} measured {_fmt(m):>8} "
                      f"simulated {_fmt(s):>8} error {shown}{mark}")
    counts = tally(report)
    for source, row in counts.items():
        print(f"[{source}] {row['within']} of {row['figures'] - row['trivial']} non-trivial figures within 15% "
              f"({row['trivial']} trivial, {row['missing']} not comparable)")
    (args.out / "validation.json").write_text(json.dumps({"slo": document["slo"], "tally": counts, "runs": report},
                                                         indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
