"""The tables of docs/evidence.md and docs/simulation.md (2026-12-03) from their committed raw
results: per rate and policy, median [range] over the repetitions (or seeds) of first-token and
joint attainment, p99 and longest gap and output throughput (or goodput); for a measured
comparison also TBT attainment, the p99 first token and goodput, RotaSched's joint attainment minus the best
baseline's, its p99 gap over that baseline's and its output throughput against the faster
baseline's per repetition, and its requests with a gap past
the suite's p99 ratio (how many of them lost their first token).

    .venv/bin/python scripts/evidence_tables.py docs/results/evidence/2026-12-03/azure/compare.json
    .venv/bin/python scripts/evidence_tables.py docs/results/gh200/headline-charged.json

Runs that mix priority classes or refused requests also get the per-class and admission figures
(`superinfer.bench.report.breakdowns`); several `simulate.json` files (one per seed) are read as
repetitions of one run:

    .venv/bin/python scripts/evidence_tables.py docs/results/priority/2026-12-03/simulated/seed-*.json
"""

import json
import statistics
import sys

from superinfer.bench.outcomes import Outcome, Slo
from superinfer.bench.suite import P99_GAP_RATIO

POLICIES = ["fcfs", "recompute", "swap", "rotasched"]


def spread(values: list[float], show) -> str:
    low, mid, high = show(min(values)), show(statistics.median(values)), show(max(values))
    return mid if low == high else f"{mid} [{low}–{high}]"


def pct(x: float) -> str:
    return f"{x * 100:.0f}%"


def measured(document: dict) -> None:
    slo, unloaded = document["slo"], document["unloaded"]
    print(f"objectives TTFT {slo['ttft_ms']:.0f} ms, TBT {slo['tbt_ms']:.0f} ms (p{slo['tbt_percentile']:g}); "
          f"unloaded {unloaded['ttft_s'] * 1000:.0f} / {unloaded['tbt_s'] * 1000:.0f} ms")
    print("| rate | policy | TTFT ok | joint (stall bound included) | gap p99 (s) | longest gap (s) | output tokens/s |")
    print("|---|---|---|---|---|---|---|")
    runs = document["runs"]
    for rate in sorted({r["rate"] for r in runs}):
        for policy in document["policies"]:
            s = [r["summary"] for r in runs if r["rate"] == rate and r["series"] == policy]
            print(f"| {rate:g} | {policy} | {spread([x['attainment']['ttft'] for x in s], pct)} | "
                  f"{spread([x['attainment']['both'] for x in s], pct)} | "
                  f"{spread([x['tbt_s']['p99'] for x in s], lambda v: f'{v:.2f}')} | "
                  f"{spread([x['tbt_s']['max'] for x in s], lambda v: f'{v:.2f}')} | "
                  f"{spread([x['throughput_tokens_per_s'] for x in s], lambda v: f'{v:.1f}')} |")
        cells = []
        for policy in document["policies"]:
            s = [r["summary"] for r in runs if r["rate"] == rate and r["series"] == policy]
            cells.append(f"{policy} {spread([x['attainment']['tbt'] for x in s], pct)} / "
                         f"{spread([x['ttft_s']['p99'] for x in s], lambda v: f'{v:.1f}')} / "
                         f"{spread([x['goodput_rps'] for x in s], lambda v: f'{v:.2f}')}")
        print(f"rate {rate:g}: TBT ok / p99 first token (s) / goodput (req/s): {'; '.join(cells)}")
        if not any(p != "rotasched" for p in document["policies"]):
            continue
        diffs, ratios, above, gaps, throughput = [], [], [], [], []
        for repetition in sorted({r["repetition"] for r in runs if r["rate"] == rate}):
            same = {r["series"]: r for r in runs if r["rate"] == rate and r["repetition"] == repetition}
            if any(p not in same for p in document["policies"]):
                continue  # a repetition still running (the file of a run in progress), or cut short
            ours = same["rotasched"]["summary"]
            best = max((same[p]["summary"] for p in document["policies"] if p != "rotasched"),
                       key=lambda s: s["attainment"]["both"])
            diffs.append((ours["attainment"]["both"] - best["attainment"]["both"]) * 100)
            ratios.append(ours["tbt_s"]["p99"] / best["tbt_s"]["p99"])
            gaps.append((ours["tbt_s"]["p99"], best["tbt_s"]["p99"]))
            faster = max(same[p]["summary"]["throughput_tokens_per_s"] for p in document["policies"] if p != "rotasched")
            throughput.append((ours["throughput_tokens_per_s"] / faster - 1.0) * 100)
            above.append(_above_ratio(same["rotasched"].get("requests", []), P99_GAP_RATIO * best["tbt_s"]["p99"],
                                      Slo(**slo)))
        print(f"rate {rate:g}: RotaSched joint − best baseline's per repetition: "
              f"{', '.join(f'{d:+.0f}' for d in diffs)}; p99 gap ratio: {', '.join(f'{r:.2f}' for r in ratios)} "
              f"({', '.join(f'{a:.2f} / {b:.2f} s' for a, b in gaps)}); output tokens/s against the faster baseline: "
              f"{', '.join(f'{t:+.0f}%' for t in throughput)}")
        print(f"rate {rate:g}: RotaSched's requests with a gap above {P99_GAP_RATIO:g}× the best baseline's p99 gap, "
              f"per repetition, first token lost / all: {', '.join(f'{lost}/{n}' for lost, n in above)}")


def _above_ratio(requests: list[dict], threshold_s: float, slo: Slo) -> tuple[int, int]:
    """(whose first token missed its objective, all): the requests (a run's `requests`, as the
    bench records each `Outcome`) with a gap longer than `threshold_s`, the ones that can set a
    p99 gap past the suite's ratio."""
    over = [o for o in (Outcome(**q) for q in requests) if (o.max_gap_s or 0.0) > threshold_s]
    return sum(not o.meets_ttft(slo) for o in over), len(over)


def simulated(document: dict) -> None:
    runs: dict = {}
    for seed_runs in document["seeds"].values():
        for r in seed_runs:
            runs.setdefault((r["rate"], r["series"]), []).append(r["summary"])
    print("| rate | policy | TTFT ok | joint (stall bound included) | gap p99 (ms) | longest gap (ms) | goodput (req/s) |")
    print("|---|---|---|---|---|---|---|")
    ms = lambda v: f"{v * 1000:,.0f}"  # noqa: E731
    for (rate, policy), s in sorted(runs.items(), key=lambda k: (k[0][0], POLICIES.index(k[0][1]))):
        print(f"| {rate:g} | {policy} | {spread([x['attainment']['ttft'] for x in s], pct)} | "
              f"{spread([x['attainment']['both'] for x in s], pct)} | {spread([x['tbt_s']['p99'] for x in s], ms)} | "
              f"{spread([x['tbt_s']['max'] for x in s], ms)} | {spread([x['goodput_rps'] for x in s], lambda v: f'{v:.1f}')} |")


def breakdowns(paths: list[str]) -> None:
    from superinfer.bench import report

    results = []
    for repetition, path in enumerate(paths):
        for run in report.read_json(path):
            if len(paths) > 1:
                run.repetition = repetition
            results.append(run)
    text = report.breakdowns(results)
    if text:
        print(text)


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        document = json.load(f)
    if len(argv) == 1 and "seeds" in document and isinstance(document["seeds"], dict):
        simulated(document)
        return 0
    if len(argv) == 1 and "policies" in document and "slo" in document and "unloaded" in document:
        measured(document)
    breakdowns(argv)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
