"""RotaSched against the reactive baselines on workloads drawn at random, none of them the suite's:
prompt and reply lengths (fixed, ShareGPT or the Azure trace's, with drawn limits), arrivals
(Poisson, gamma of a drawn burstiness, or the trace's), the device pool, the number of requests,
a share of class-0 requests, objective scales of 3, 5 or 10 and a rate around what the pool
serves. Workload `i` is drawn from seed `i` alone, so a range of indices names the same workloads
on every machine. Each is simulated (`superinfer simulate`, fcfs, swap, recompute and RotaSched)
on `--profile`; `run` keeps each policy's attainment, gaps and throughput per workload in
`results.json` (the `simulate.json` files are not kept) and prints, per workload, RotaSched's
joint attainment minus the best baseline's (points) and its p99 gap over that baseline's;
`compare` reads two such files and prints, for each, the workloads where RotaSched is more than
the suite's margin behind, those within the suite's p99 ratio, those within 5% of the best
baseline's throughput, and the joint differences summed; then the single-class workloads where a
gap passed the stall bound and, in those with priority classes, class 0's first tokens on time
and class 1's longest gaps.

    .venv/bin/python scripts/random_workloads.py run --first 0 --count 60 --out DIR
    .venv/bin/python scripts/random_workloads.py compare BEFORE/results.json AFTER/results.json
"""
import argparse
import concurrent.futures
import json
import random
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from superinfer.bench.suite import JOINT_MARGIN, P99_GAP_RATIO

ROOT = Path(__file__).resolve().parent.parent
PROFILE = "measured:docs/results/suite/warmup-cpu-pinned.json"
POLICIES = ("fcfs", "swap", "recompute", "rotasched")
BASELINES = ("swap", "recompute")


def draw(index: int) -> str:
    """Workload `index`'s `superinfer simulate` flags (seed `index` included)."""
    g = random.Random(1000 + index)
    kind = g.choice(["fixed", "sharegpt", "trace"])
    if kind == "fixed":
        prompt, output = g.choice([16, 32, 64, 128, 256, 512]), g.choice([16, 32, 64, 128, 256])
        lengths = f"--lengths fixed --prompt-tokens {prompt} --output-tokens {output}"
        mean_output, total = output, prompt + output
    elif kind == "sharegpt":
        max_prompt, total = g.choice([64, 128, 256]), g.choice([192, 256, 384, 512])
        total = max(total, max_prompt + 64)
        lengths = f"--lengths sharegpt --max-prompt-tokens {max_prompt} --max-total-tokens {total}"
        mean_output = (total - max_prompt) * 0.6
    else:
        max_prompt, total = g.choice([48, 96, 192]), g.choice([160, 320, 512])
        total = max(total, max_prompt + 64)
        lengths = f"--lengths trace --max-prompt-tokens {max_prompt} --max-total-tokens {total}"
        mean_output = (total - max_prompt) * 0.5
    arrival = g.choice(["poisson", "gamma", "trace"])
    arrivals = f"--arrival {arrival}" + (f" --burstiness {g.choice([0.2, 0.3, 0.5, 0.7])}" if arrival == "gamma" else "")
    # At least one whole request and two blocks to grow into.
    blocks = max(g.choice([24, 32, 48, 64, 96, 128]), -(-total // 16) + 2)
    count = g.choice([30, 40, 60])
    # Around what the pool serves: ~35 output tokens/s on the embedded model's CPU profile, more
    # with a larger pool; from half of it to 1.6 times.
    load = g.uniform(0.5, 1.6)
    rate = round(load * 35.0 / mean_output * (blocks / 32) ** 0.5, 3)
    high_priority = g.choice([0.0, 0.0, 0.3])
    ttft_scale, tbt_scale = g.choice([3, 5, 10]), g.choice([3, 5, 10])
    return (f"{lengths} {arrivals} --ignore-eos --device-kv-blocks {blocks} --host-kv-blocks 2048 "
            f"--num-requests {count} --high-priority-share {high_priority} --ttft-slo-scale {ttft_scale} "
            f"--tbt-slo-scale {tbt_scale} --rates {rate} --seed {index}")


def simulate(index: int, profile: str) -> dict:
    flags = draw(index)
    with tempfile.TemporaryDirectory() as out:
        argv = [sys.executable, "-m", "superinfer.cli", "simulate", "--profile", profile, *shlex.split(flags),
                "--policies", ",".join(POLICIES), "--no-progress", "--out", out]
        subprocess.run(argv, check=True, capture_output=True, cwd=ROOT)
        report = json.loads((Path(out) / "simulate.json").read_text())
    policies = {}
    for run in report["runs"]:
        summary = run["summary"]
        policies[run["series"]] = {
            "joint": summary["attainment"]["both"], "ttft": summary["attainment"]["ttft"],
            "tbt": summary["attainment"]["tbt"], "p99_gap_s": summary["tbt_s"]["p99"],
            "max_gap_s": summary["tbt_s"]["max"], "tokens_per_s": summary["throughput_tokens_per_s"],
            # The share of requests none of whose gaps passed the stall bound.
            "stall": summary["attainment"]["stall"],
        }
        classes = summary.get("by_priority") or {}
        if len(classes) > 1:
            policies[run["series"]]["by_class"] = {
                name: {"ttft": c["attainment"]["ttft"], "joint": c["attainment"]["both"],
                       "stall": c["attainment"]["stall"], "max_gap_s": c["request_max_gap_s"]["max"]}
                for name, c in classes.items()}
    return {"index": index, "flags": flags, "slo": report["slo"], "policies": policies}


def verdict(workload: dict) -> dict:
    """RotaSched against the baseline with the best joint attainment."""
    p = workload["policies"]
    best = max(BASELINES, key=lambda name: p[name]["joint"])
    rota = p["rotasched"]
    return {
        "joint_minus_best": rota["joint"] - p[best]["joint"],
        "p99_gap_ratio": rota["p99_gap_s"] / max(p[best]["p99_gap_s"], 1e-9),
        "throughput_ratio": rota["tokens_per_s"] / max(p[name]["tokens_per_s"] for name in BASELINES),
    }


def run(args: argparse.Namespace) -> int:
    indices = range(args.first, args.first + args.count)
    with concurrent.futures.ProcessPoolExecutor(args.jobs) as pool:
        results = list(pool.map(simulate, indices, [args.profile] * len(indices)))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    # One workload a line: small, and diffs read per workload.
    lines = ",\n".join(json.dumps(w) for w in results)
    (out / "results.json").write_text(f'{{"profile": {json.dumps(args.profile)}, "workloads": [\n{lines}\n]}}\n')
    for w in results:
        v = verdict(w)
        print(f"{w['index']:4d}  fcfs joint {w['policies']['fcfs']['joint'] * 100:4.0f}%  "
              f"rotasched - best {v['joint_minus_best'] * 100:+4.0f}  p99 gap x{v['p99_gap_ratio']:.2f}  "
              f"throughput x{v['throughput_ratio']:.2f}  {w['flags']}")
    print(f"wrote {out / 'results.json'}")
    return 0


def compare(args: argparse.Namespace) -> int:
    runs = [{w["index"]: w for w in json.loads(Path(path).read_text())["workloads"]} for path in args.results]
    common = sorted(set.intersection(*(set(r) for r in runs)))
    for path, workloads in zip(args.results, runs):
        verdicts = [verdict(workloads[i]) for i in common]
        behind = [i for i, v in zip(common, verdicts) if v["joint_minus_best"] < JOINT_MARGIN - 1e-9]
        print(f"{path}: {len(common)} workloads; joint below the best "
              f"baseline {JOINT_MARGIN * 100:+.0f} points in {len(behind)} {behind}; p99 gap within {P99_GAP_RATIO}x in "
              f"{sum(v['p99_gap_ratio'] <= P99_GAP_RATIO for v in verdicts)}; throughput within 5% in "
              f"{sum(v['throughput_ratio'] >= 0.95 for v in verdicts)}; joint - best summed "
              f"{sum(v['joint_minus_best'] for v in verdicts) * 100:+.0f} points")
        print("  " + stall_and_classes([workloads[i] for i in common]))
    return 0


def stall_and_classes(workloads: list[dict]) -> str:
    """Where some request's gap passed its stall bound (RotaSched; the better baseline by that
    measure), and in the runs with priority classes, class 0's first tokens on time and class 1's
    longest gap. Empty for results written before these were kept."""
    kept = [w for w in workloads if "stall" in w["policies"]["rotasched"]]
    if not kept:
        return "(no stall-bound figures in this file)"
    single = [w for w in kept if "by_class" not in w["policies"]["rotasched"]]
    broken = [w["index"] for w in single if w["policies"]["rotasched"]["stall"] < 1.0]
    broken_baseline = [w["index"] for w in single if max(w["policies"][b]["stall"] for b in BASELINES) < 1.0]
    text = (f"single-class: a gap past the stall bound in {len(broken)} of {len(single)} {broken} "
            f"(the better baseline: {len(broken_baseline)})")
    classed = [w["policies"]["rotasched"]["by_class"] for w in kept if "by_class" in w["policies"]["rotasched"]]
    if classed:
        high = statistics.median(c["0"]["ttft"] for c in classed)
        lead = statistics.median(c["0"]["ttft"] - c["1"]["ttft"] for c in classed)
        long_low = sum(c["1"]["max_gap_s"] > 5.0 for c in classed)
        high_joint = sum(c["0"]["joint"] for c in classed)
        low_within = sum(c["1"]["stall"] for c in classed)
        text += (f"; {len(classed)} with classes: class 0 first tokens on time median {high * 100:.0f}%, "
                 f"ahead of class 1 by {lead * 100:+.0f} points (median); class 1's longest gap "
                 f"over 5 s in {long_low}; summed over them, class 0's joint {high_joint:.1f}, class 1's share "
                 f"within the stall bound {low_within:.1f}")
    return text


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    r = commands.add_parser("run")
    r.add_argument("--first", type=int, default=0)
    r.add_argument("--count", type=int, default=60)
    r.add_argument("--profile", default=PROFILE)
    r.add_argument("--jobs", type=int, default=2)
    r.add_argument("--out", required=True)
    c = commands.add_parser("compare")
    c.add_argument("results", nargs="+")
    args = parser.parse_args(argv)
    return run(args) if args.command == "run" else compare(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
