"""The longest gaps between tokens in simulated `superinfer suite` runs, which `suite.json` does
not keep: per workload and policy, the median and the largest over every rate and seed of each
run's longest gap (and of its p99 gap). Writes `gaps.json` beside each run's `suite.json`, with
each run's joint attainment and its p99 and longest first token too.

    .venv/bin/python scripts/suite_gaps.py SUITE_OUT [SUITE_OUT ...]
"""
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
                         "p99_ttft_s": ttft.get("p99"), "max_ttft_s": ttft.get("max")})
    return {"runs": rows}


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    for arg in argv:
        root = Path(arg)
        doc = gaps(root)
        (root / "gaps.json").write_text(json.dumps(doc, indent=1))
        by = {}
        for r in doc["runs"]:
            if r["max_gap_s"] is not None:
                by.setdefault((r["workload"], r["policy"]), []).append(r["max_gap_s"])
        print(f"{root}: longest gap per run, median / largest (s)")
        for (workload, policy), values in sorted(by.items()):
            print(f"  {workload:12s} {policy:10s} {statistics.median(values):6.2f} / {max(values):6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
