"""The longest gaps between tokens in simulated `superinfer suite` runs, which `suite.json` does
not keep: per workload and policy, the median and the largest over every rate and seed of each
run's longest gap (and of its p99 gap). Writes `gaps.json` beside each run's `suite.json`, with
each run's joint attainment, its p99 and longest first token, its output tokens and throughput,
and how many rotations back in it made too. With `--read`, reads the
`gaps.json` already there instead (a committed one: its `simulate.json` files are not kept) and
adds, per policy, how many runs had a gap longer than `--over` seconds (default 1.4: the
stall bound on the Azure workload, 1.26 s, and about one step) and the median of their p99 gaps.

    .venv/bin/python scripts/suite_gaps.py SUITE_OUT [SUITE_OUT ...]
    .venv/bin/python scripts/suite_gaps.py --read [--over 1.4] SUITE_OUT [SUITE_OUT ...]
"""
import argparse
import json
import statistics
import sys
from pathlib import Path


def gaps(root: Path) -> dict:
    rows = []
    for path in sorted(root.glob("*/seed-*/simulate.json")):
        seed = int(path.parent.name.split("-")[1])
        for run in json.loads(path.read_text())["runs"]:
            tbt = run["summary"]["tbt_s"]
            ttft = run["summary"]["ttft_s"]
            rows.append({"workload": path.parent.parent.name, "rate": run["rate"], "seed": seed,
                         "policy": run["series"], "max_gap_s": tbt.get("max"), "p99_gap_s": tbt.get("p99"),
                         "joint": run["summary"]["attainment"]["both"],
                         "p99_ttft_s": ttft.get("p99"), "max_ttft_s": ttft.get("max"),
                         "output_tokens": run["summary"].get("output_tokens"),
                         "throughput_tokens_per_s": run["summary"].get("throughput_tokens_per_s"),
                         "rotations_in": run["summary"].get("simulator", {}).get("scheduler", {}).get("rotations_in")})
    return {"runs": rows}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("roots", nargs="+", type=Path)
    parser.add_argument("--read", action="store_true", help="summarise the gaps.json already in each SUITE_OUT")
    parser.add_argument("--over", type=float, default=1.4, help="with --read: count runs with a gap longer than this (s)")
    args = parser.parse_args(argv)
    for root in args.roots:
        if args.read:
            doc = json.loads((root / "gaps.json").read_text())
        else:
            doc = gaps(root)
            (root / "gaps.json").write_text(json.dumps(doc, indent=1))
        by = {}
        for r in doc["runs"]:
            if r["max_gap_s"] is not None:
                by.setdefault((r["workload"], r["policy"]), []).append(r["max_gap_s"])
        print(f"{root}: longest gap per run, median / largest (s)")
        for (workload, policy), values in sorted(by.items()):
            print(f"  {workload:12s} {policy:10s} {statistics.median(values):6.2f} / {max(values):6.2f}")
        if args.read:
            for policy in sorted({r["policy"] for r in doc["runs"]}):
                runs = [r for r in doc["runs"] if r["policy"] == policy and r["max_gap_s"] is not None]
                if not runs:
                    continue
                over = sum(r["max_gap_s"] > args.over for r in runs)
                p99 = statistics.median(r["p99_gap_s"] for r in runs)
                print(f"  {policy:10s} runs with a gap over {args.over:g} s: {over} of {len(runs)}; "
                      f"median p99 gap {p99:.3f} s")
            returns = {}
            for r in doc["runs"]:
                if r["policy"] == "rotasched" and r.get("rotations_in") is not None and r.get("output_tokens"):
                    returns.setdefault((r["workload"], r["rate"]), []).append(r["rotations_in"] / r["output_tokens"])
            for (workload, rate), values in sorted(returns.items()):
                print(f"  rotasched {workload:12s} {rate:g} req/s: rotations back in per output token, "
                      f"median over seeds {statistics.median(values):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
