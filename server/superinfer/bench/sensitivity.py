"""How the suite's verdicts move with the objectives: every workload chosen, under each TTFT/TBT
objective scale (both objectives that multiple of the unloaded latency, the stall bound the
server's rule of the TBT objective) and each TBT percentile, measured (`bench compare`) or
simulated (`--simulate PROFILE`), as `superinfer suite` runs them. Per setting, workload and rate:
every policy's joint attainment (median over the repetitions), RotaSched's paired difference
from the best baseline of each repetition (median [range]) and its p99 gap over that baseline's
(median [max]). Writes `<out>/scale-<s>-p<p>/` (each a suite run, raw results included) and
`<out>/sensitivity.json`; prints the table as Markdown.

    python -m superinfer.bench.sensitivity --simulate measured:docs/results/suite/warmup-cpu-pinned.json \\
        --workloads azure,long-prompt --repeats 5 --out DIR
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from superinfer.bench import suite

SCALES = (3.0, 5.0, 10.0)
PERCENTILES = (90.0, 99.0)


def setting_dir(out: Path, scale: float, percentile: float) -> Path:
    return out / f"scale-{scale:g}-p{percentile:g}"


def rows_for(out: Path, workloads: list[str], simulated: bool, scale: float, percentile: float) -> list[dict]:
    """One row per (workload, rate) of one setting's suite run."""
    rows = []
    for name in workloads:
        runs = suite.load_runs(setting_dir(out, scale, percentile) / name, simulated)
        by_key = {(r["series"], r["rate"], r.get("repetition", 0)): r["summary"] for r in runs}
        policies = sorted({r["series"] for r in runs})
        verdicts = {v["rate"]: v for v in suite.verdicts(runs)}
        for rate in sorted({r["rate"] for r in runs}):
            joint = {}
            for policy in policies:
                values = [s["attainment"]["both"] for (p, r, _), s in by_key.items() if p == policy and r == rate]
                joint[policy] = statistics.median(values) if values else None
            verdict = verdicts.get(rate)
            rows.append({
                "scale": scale, "percentile": percentile, "workload": name, "rate": rate,
                "joint_median": joint,
                "joint_minus_best": verdict["joint_minus_best"] if verdict else [],
                "p99_gap_ratio": verdict["p99_gap_ratio"] if verdict else [],
            })
    return rows


def markdown(rows: list[dict]) -> str:
    policies = sorted({p for row in rows for p in row["joint_median"]}, key=lambda p: (p == "rotasched", p))
    head = ["objectives", "TBT pct", "workload", "rate", *[f"{p} joint" for p in policies],
            "RotaSched − best (points), median [range]", "p99 gap ratio, median [max]"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        joint = [f"{row['joint_median'][p] * 100:.0f}%" if row["joint_median"].get(p) is not None else "—"
                 for p in policies]
        deltas = [d * 100 for d in row["joint_minus_best"]]
        ratios = row["p99_gap_ratio"]
        delta = f"{statistics.median(deltas):+.0f} [{min(deltas):+.0f} – {max(deltas):+.0f}]" if deltas else "—"
        ratio = f"{statistics.median(ratios):.2f} [{max(ratios):.2f}]" if ratios else "—"
        lines.append(f"| {row['scale']:g}× | p{row['percentile']:g} | {row['workload']} | {row['rate']:g} | "
                     + " | ".join(joint) + f" | {delta} | {ratio} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    suite.add_arguments(parser)
    parser.add_argument("--scales", default=",".join(f"{s:g}" for s in SCALES),
                        help="objective scales: TTFT and TBT objectives this multiple of the unloaded latency")
    parser.add_argument("--percentiles", default=",".join(f"{p:g}" for p in PERCENTILES),
                        help="TBT percentiles held to the objective")
    args = parser.parse_args(argv)
    scales = [float(s) for s in args.scales.split(",")]
    percentiles = [float(p) for p in args.percentiles.split(",")]
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    out: Path = args.out
    rows = []
    for scale in scales:
        for percentile in percentiles:
            setting = argparse.Namespace(**vars(args))
            setting.out = setting_dir(out, scale, percentile)
            setting.extra = (f"{args.extra} --ttft-slo-scale {scale:g} --tbt-slo-scale {scale:g} "
                             f"--tbt-percentile {percentile:g}").strip()
            print(f"=== objectives {scale:g}x the unloaded latency, TBT at p{percentile:g}")
            code = suite.run(setting)
            if code:
                return code
            rows += rows_for(out, workloads, bool(args.simulate), scale, percentile)
    out.mkdir(parents=True, exist_ok=True)
    document = {"simulated": args.simulate, "repeats": args.repeats, "workloads": workloads,
                "extra": args.extra, "rows": rows}
    (out / "sensitivity.json").write_text(json.dumps(document, indent=1))
    table = markdown(rows)
    (out / "sensitivity.md").write_text(table + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
