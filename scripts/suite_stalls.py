"""RotaSched's longest gap against the stall bound, and its output throughput over the faster
reactive baseline's, per workload, seed and rate of one `superinfer suite --simulate` run (read
from the run's `WORKLOAD/seed-S/simulate.json` files, which `suite.json` does not hold).

    .venv/bin/python scripts/suite_stalls.py SUITE_OUT_DIR
"""

import json
import sys
from pathlib import Path

from superinfer import _router

BASELINES = ("swap", "recompute")


def stall_bound_s(slo: dict) -> float:
    """The request's stall bound: its own, or the default multiple of its TBT objective."""
    return (slo["max_stall_ms"] or _router.default_stall_factor() * slo["tbt_ms"]) / 1000


def main(root: Path) -> None:
    for path in sorted(root.glob("*/seed-*/simulate.json")):
        runs: dict[float, dict[str, dict]] = {}
        for run in json.loads(path.read_text())["runs"]:
            runs.setdefault(run["rate"], {})[run["series"]] = run["summary"]
        cells = []
        for rate, by_policy in sorted(runs.items()):
            ours = by_policy["rotasched"]
            fastest = max(by_policy[b]["throughput_tokens_per_s"] for b in BASELINES if b in by_policy)
            cells.append(f"{rate}: longest gap {ours['request_max_gap_s']['max']:.2f} s / bound {stall_bound_s(ours['slo']):.2f} s, "
                         f"throughput x{ours['throughput_tokens_per_s'] / fastest:.2f}")
        print(f"{path.parent.parent.name:12} {path.parent.name}  " + " | ".join(cells))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
