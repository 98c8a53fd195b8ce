"""The workload suite's verdicts: RotaSched against the best baseline of each repetition."""
import argparse
from pathlib import Path

from superinfer.bench import suite


def _run(series: str, rate: float, repetition: int, both: float, p99: float) -> dict:
    return {"series": series, "rate": rate, "repetition": repetition,
            "summary": {"attainment": {"both": both}, "tbt_s": {"p99": p99}}}


def test_rotasched_is_judged_against_the_best_baseline_of_each_repetition():
    runs = [
        _run("fcfs", 1.0, 0, 0.50, 0.10), _run("swap", 1.0, 0, 0.70, 0.20), _run("rotasched", 1.0, 0, 0.69, 0.25),
        _run("fcfs", 1.0, 1, 0.60, 0.10), _run("swap", 1.0, 1, 0.40, 0.20), _run("rotasched", 1.0, 1, 0.50, 0.30),
    ]
    (row,) = suite.verdicts(runs)
    # Repetition 0: swap is best (-1 point, p99 1.25x); repetition 1: fcfs is (-10, 3x).
    assert [round(d, 2) for d in row["joint_minus_best"]] == [-0.01, -0.10]
    assert [round(r, 2) for r in row["p99_gap_ratio"]] == [1.25, 3.0]
    assert row["fcfs_joint"] == [0.5, 0.6]
    assert not row["meets_targets"]
    assert suite.verdicts(runs[:3])[0]["meets_targets"]


def test_each_workload_becomes_a_compare_or_a_simulate_command():
    args = argparse.Namespace(rate_scale=2.0, policies="swap,rotasched", extra="--max-stall-scale 3", simulate=None,
                              repeats=3)
    workload = suite.SUITE[0]
    argv = suite.workload_argv(workload, args, Path("out"))
    assert argv[0] == "compare" and argv[argv.index("--rates") + 1] == ",".join(f"{2 * r:g}" for r in workload.rates)
    assert argv[-2:] == ["--repeats", "3"] and "--max-stall-scale" in argv
    args.simulate = "gh200:llama-3-8b"
    simulated = suite.workload_argv(workload, args, Path("out"), seed=2)
    assert simulated[0] != "compare" and simulated[-4:] == ["--profile", "gh200:llama-3-8b", "--seed", "2"]
    assert len({w.name for w in suite.SUITE}) == 5
