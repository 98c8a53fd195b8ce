"""Two runs of `superinfer suite` side by side: per (workload, rate), RotaSched's joint attainment
minus the best baseline's (points, per repetition) and its p99 gap over that baseline's, then
how many runs meet the suite's targets (p99 gap within 1.5x; joint within 3 points in every
repetition) and the joint differences summed over every run (points), over the workloads both
runs have.

    .venv/bin/python scripts/suite_compare.py BEFORE/suite.json AFTER/suite.json
"""

import json
import sys

from superinfer.bench.suite import JOINT_MARGIN, P99_GAP_RATIO


def verdicts(path: str) -> dict:
    with open(path) as f:
        return json.load(f)["verdicts"]


def row(verdict: dict) -> str:
    joint = " ".join(f"{d * 100:+.0f}" for d in verdict["joint_minus_best"])
    gaps = " ".join(f"{r:.2f}" for r in verdict["p99_gap_ratio"])
    return f"{joint} | {gaps}"


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    runs = [verdicts(path) for path in argv]
    totals = [[0, 0, 0, 0, 0.0] for _ in runs]
    print("workload      rate  joint - best (points) | p99 gap ratio   ->   the same, second run")
    # Workloads both runs have (a run of some workloads, `--workloads`, against a whole suite).
    for workload, points in runs[0].items():
        if workload not in runs[1]:
            continue
        for i, first in enumerate(points):
            pair = [first, runs[1][workload][i]]
            for total, verdict in zip(totals, pair):
                ratios, joints = verdict["p99_gap_ratio"], verdict["joint_minus_best"]
                total[0] += sum(r <= P99_GAP_RATIO for r in ratios)
                total[1] += len(ratios)
                total[2] += all(j >= JOINT_MARGIN - 1e-9 for j in joints)
                total[3] += 1
                total[4] += sum(joints) * 100
            print(f"{workload:12s} {first['rate']:5}: {row(pair[0]):48s} -> {row(pair[1])}")
    for path, (p99_ok, runs_n, joint_ok, points_n, joint_sum) in zip(argv, totals):
        print(f"{path}: p99 gap <= {P99_GAP_RATIO}x the best baseline's in {p99_ok} of {runs_n} runs; "
              f"joint >= best {JOINT_MARGIN * 100:+.0f} points in every repetition at {joint_ok} of {points_n} points; "
              f"joint - best summed over every run {joint_sum:+.0f} points")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
