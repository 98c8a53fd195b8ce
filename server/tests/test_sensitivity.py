"""The sensitivity table: the suite under each objective scale and TBT percentile, simulated."""
import json
from pathlib import Path

from superinfer.bench import sensitivity

PROFILE = Path(__file__).resolve().parents[2] / "docs" / "results" / "suite" / "warmup-cpu.json"


def test_each_setting_runs_the_suite_under_its_own_objectives(tmp_path):
    argv = ["--simulate", f"measured:{PROFILE}", "--workloads", "long-prompt", "--repeats", "1",
            "--scales", "3,10", "--percentiles", "90,99", "--out", str(tmp_path)]
    assert sensitivity.main(argv) == 0
    document = json.loads((tmp_path / "sensitivity.json").read_text())
    rows = document["rows"]
    # 2 scales x 2 percentiles x the workload's 2 rates.
    assert len(rows) == 8 and {(r["scale"], r["percentile"]) for r in rows} == {(3, 90), (3, 99), (10, 90), (10, 99)}
    slos = {}
    for scale, percentile in [(3, 90), (10, 99)]:
        run = json.loads((sensitivity.setting_dir(tmp_path, scale, percentile)
                          / "long-prompt" / "seed-0" / "simulate.json").read_text())
        slos[scale] = run["slo"]
        assert run["slo"]["tbt_percentile"] == percentile
    # The objectives are multiples of the same unloaded latency.
    assert abs(slos[10]["ttft_ms"] / slos[3]["ttft_ms"] - 10 / 3) < 1e-6
    assert abs(slos[10]["tbt_ms"] / slos[3]["tbt_ms"] - 10 / 3) < 1e-6
    for row in rows:
        assert set(row["joint_median"]) == {"fcfs", "recompute", "swap", "rotasched"}
        assert len(row["joint_minus_best"]) == 1 and len(row["p99_gap_ratio"]) == 1
    table = (tmp_path / "sensitivity.md").read_text().splitlines()
    assert len(table) == 2 + len(rows) and table[2].startswith("| 3× | p90 | long-prompt | 0.6 |")
