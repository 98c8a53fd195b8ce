"""Two runs of the simulated headline (`python -m superinfer.simulate.headline`), compared per
policy and rate: the KV bytes each direction moved, the blocks rotated out without a copy (host
mirrors), and joint attainment, with the paired per-seed differences.

    .venv/bin/python scripts/headline_compare.py BEFORE.json AFTER.json

Each file is a run's summaries as `docs/results/gh200/*.json` and `docs/results/host-mirrors/`
keep them: {"command", "seeds": {"seed-N": [{"series", "rate", "summary"}]}}."""
import json
import statistics
import sys


def runs(path: str) -> dict[tuple[str, float], dict[str, dict]]:
    """(policy, rate) -> seed -> summary."""
    out: dict[tuple[str, float], dict[str, dict]] = {}
    for seed, seed_runs in json.load(open(path))["seeds"].items():
        for run in seed_runs:
            out.setdefault((run["series"], run["rate"]), {})[seed] = run["summary"]
    return out


def median(values) -> float:
    return statistics.median(list(values))


def main(before_path: str, after_path: str) -> int:
    before, after = runs(before_path), runs(after_path)
    print("| policy | rate | KV out, GB (median): before → after | KV in, GB | blocks rotated out uncopied | "
          "joint attainment (median): before → after | after − before per seed (points) |")
    print("|---|---|---|---|---|---|---|")
    for key in sorted(after):
        if key not in before:
            continue
        old, new = before[key], after[key]
        seeds = [s for s in new if s in old]
        sim = lambda summary: summary["simulator"]  # noqa: E731
        out_old = median(sim(old[s])["bytes_out"] for s in seeds) / 1e9
        out_new = median(sim(new[s])["bytes_out"] for s in seeds) / 1e9
        in_new = median(sim(new[s])["bytes_in"] for s in seeds) / 1e9
        mirrored = median(sim(new[s])["scheduler"].get("blocks_out_mirrored", 0) for s in seeds)
        joint_old = median(old[s]["attainment"]["both"] for s in seeds)
        joint_new = median(new[s]["attainment"]["both"] for s in seeds)
        diffs = ", ".join(f"{round(100 * (new[s]['attainment']['both'] - old[s]['attainment']['both'])):+d}" for s in seeds)
        print(f"| {key[0]} | {key[1]:g} | {out_old:.1f} → {out_new:.1f} | {in_new:.1f} | {mirrored:,.0f} | "
              f"{100 * joint_old:.0f}% → {100 * joint_new:.0f}% | {diffs} |")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2]))
