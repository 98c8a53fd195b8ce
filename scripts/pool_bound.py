"""What bounds the suite's Azure points: the same workload (the suite's arguments, its rates and
seeds), simulated with every policy at several device pools — the suite's own, larger ones and
one no request ever fills — so the joint attainment every policy could reach with more memory,
and what a given share more of it is worth, can be read beside RotaSched's at the suite's pool.

    .venv/bin/python scripts/pool_bound.py --out DIR [--pools 32,38,48,100000] [--repeats 5]

Writes DIR/pool-bound.json (per pool, rate and seed: every policy's joint and TTFT attainment and
p99 gap) and prints, per pool and rate, the best baseline's and RotaSched's joint attainment per
seed and their medians.
"""
from __future__ import annotations

import argparse
import json
import shlex
import shutil
import statistics
import sys
from pathlib import Path

from superinfer.bench.outcomes import SCHEDULER_DEFAULTS
from superinfer.bench.suite import BASELINES, CPU_PROFILE, SUITE, workload_argv
from superinfer.simulate import cli as simulate_cli

def simulate(argv: list[str]) -> dict:
    parser = argparse.ArgumentParser(prog="superinfer simulate", allow_abbrev=False)
    simulate_cli.add_arguments(parser)
    args = parser.parse_args(argv)
    simulate_cli.run(args)
    return json.loads((args.out / "simulate.json").read_text())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--workload", default="azure")
    parser.add_argument("--pools", default="32,38,48,100000")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--profile", default=CPU_PROFILE)
    args = parser.parse_args()
    workload = {w.name: w for w in SUITE}[args.workload]
    results = []
    for pool in (int(p) for p in args.pools.split(",")):
        # The suite's own arguments for the workload; a later --device-kv-blocks overrides its pool.
        suite_args = argparse.Namespace(rate_scale=1.0, policies=",".join(SCHEDULER_DEFAULTS["policies"]),
                                        extra=f"--device-kv-blocks {pool} --no-charge-planning",
                                        simulate=args.profile)
        for seed in range(args.repeats):
            out = args.out / f"pool-{pool}" / f"seed-{seed}"
            doc = simulate(workload_argv(workload, suite_args, out, seed))
            for run in doc["runs"]:
                s = run["summary"]
                results.append({"pool": pool, "rate": run["rate"], "seed": seed, "policy": run["series"],
                                "joint": s["attainment"]["both"], "ttft": s["attainment"]["ttft"],
                                "gap_p99_s": s["tbt_s"].get("p99")})
        # Only the figures are kept: the per-request files are large and re-derive.
        shutil.rmtree(args.out / f"pool-{pool}")
    args.out.mkdir(parents=True, exist_ok=True)
    document = {"workload": args.workload, "args": workload.args, "profile": args.profile,
                "command": "python scripts/pool_bound.py " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
                "results": results}
    (args.out / "pool-bound.json").write_text(json.dumps(document, indent=1))
    print(table(results))
    return 0


def table(results: list[dict]) -> str:
    joint = {(r["pool"], r["rate"], r["seed"], r["policy"]): r["joint"] for r in results}
    lines = [f"{'pool':>7} {'rate':>5}  best baseline's joint per seed (median) | RotaSched's (median)"]
    for pool in sorted({r["pool"] for r in results}):
        for rate in sorted({r["rate"] for r in results}):
            seeds = sorted({r["seed"] for r in results if r["pool"] == pool and r["rate"] == rate})
            best = [max(joint.get((pool, rate, s, b), 0.0) for b in BASELINES) for s in seeds]
            ours = [joint.get((pool, rate, s, "rotasched"), 0.0) for s in seeds]
            fmt = lambda xs: " ".join(f"{x * 100:3.0f}" for x in xs) + f" ({statistics.median(xs) * 100:.0f}%)"
            lines.append(f"{pool:>7} {rate:>5g}  {fmt(best)} | {fmt(ours)}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
