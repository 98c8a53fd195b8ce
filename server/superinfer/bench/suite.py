"""`superinfer bench suite`: every scheduler policy on every workload of the suite, measured
(`bench compare`, servers launched per policy) or simulated (`--simulate PROFILE`), so that no
change is judged on one workload. Each workload runs into `<out>/<name>/`; `<out>/suite.json`
and the printed table hold, per workload and rate, RotaSched against the best baseline paired
by repetition: its joint attainment (the stall bound included) minus the best baseline's, and
its 99th-percentile gap over that baseline's — the suite's targets are a difference of at least
-3 points in every repetition and a ratio of at most 1.5.

The workloads are shapes the scheduler was not tuned on as much as ones it was: chat with
bursty and with smooth arrivals (ShareGPT lengths), a code-assistant mix (long prompts, short
replies), the long-prompt workload and the Azure conversation trace. Their rates are set for
the embedded model on a 2-core CPU at fcfs's knee and past it (the Azure and long-prompt knees
were measured, the others are estimates: `fcfs` in the table says where each rate sits);
`--rate-scale` moves them for another machine."""
from __future__ import annotations

import argparse
import json
import shlex
import statistics
from dataclasses import dataclass
from pathlib import Path

from superinfer.bench.outcomes import SCHEDULER_DEFAULTS

# The suite's targets, per (workload, rate): RotaSched's joint attainment at most this far below
# the best baseline's in every repetition, and its p99 gap at most this multiple of that baseline's.
JOINT_MARGIN = -0.03
P99_GAP_RATIO = 1.5

# Every policy but the one the project is for (the scheduler crate's list).
BASELINES = tuple(policy for policy in SCHEDULER_DEFAULTS["policies"] if policy != "rotasched")


@dataclass(frozen=True)
class SuiteWorkload:
    name: str
    description: str
    # `bench compare` / `simulate` workload arguments, rates excluded.
    args: str
    rates: tuple[float, float]


# The chat mix: ShareGPT lengths, short prompts, replies to 128 tokens, a 32-block pool.
_CHAT = ("--lengths sharegpt --max-prompt-tokens 64 --max-total-tokens 192 --ignore-eos --device-kv-blocks 32 "
         "--host-kv-blocks 512 --num-requests 40")

SUITE = (
    SuiteWorkload("chat-bursty", "ShareGPT chat, short prompts, replies to 128 tokens, bursty arrivals",
                  f"{_CHAT} --arrival gamma --burstiness 0.3", (0.5, 0.8)),
    SuiteWorkload("chat-smooth", "the same chat mix, Poisson arrivals", f"{_CHAT} --arrival poisson", (0.5, 0.8)),
    SuiteWorkload("code", "code assistant: 256-token prompts, 24-token replies, bursty",
                  "--lengths fixed --prompt-tokens 256 --output-tokens 24 --arrival gamma --burstiness 0.5 "
                  "--ignore-eos --device-kv-blocks 48 --host-kv-blocks 512 --num-requests 30", (0.8, 1.2)),
    SuiteWorkload("long-prompt", "512-token prompts, 16-token replies, bursty (docs/benchmarks.md)",
                  "--lengths fixed --prompt-tokens 512 --output-tokens 16 --arrival gamma --burstiness 0.3 "
                  "--ignore-eos --device-kv-blocks 96 --host-kv-blocks 512 --num-requests 30", (0.6, 1.0)),
    SuiteWorkload("azure", "Azure LLM conversation trace, arrivals and lengths (docs/evidence.md)",
                  "--arrival trace --lengths trace --max-prompt-tokens 48 --max-total-tokens 160 --ignore-eos "
                  "--device-kv-blocks 32 --host-kv-blocks 512 --num-requests 30", (0.7, 1.0)),
)


# The CPU machine the suite is simulated on: the warm-up of a shard pinned to one core, as the
# real comparisons run (`--shard-cpus 1`); see docs/benchmarks.md, "The simulated machine
# against the real one".
CPU_PROFILE = "measured:docs/results/suite/warmup-cpu-pinned.json"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=Path("suite-results"))
    parser.add_argument("--workloads", default=",".join(w.name for w in SUITE),
                        help="comma-separated names: " + ", ".join(w.name for w in SUITE))
    parser.add_argument("--repeats", type=int, default=3, help="repetitions per workload (seeds 0, 1, …)")
    parser.add_argument("--rate-scale", type=float, default=1.0, help="multiplies every workload's rates")
    parser.add_argument("--policies", default=",".join(SCHEDULER_DEFAULTS["policies"]))
    parser.add_argument("--simulate", metavar="PROFILE", default=None,
                        help="simulate on PROFILE (as `superinfer simulate --profile`) instead of measuring")
    parser.add_argument("--extra", default="",
                        help="more arguments for every `bench compare` / `simulate` (one string), e.g. "
                        "\"--launch-args '--shard-cpus 1' --max-stall-scale 3\"")
    parser.add_argument("--summary-only", action="store_true", help="only summarise the runs already in --out")


def workload_argv(workload: SuiteWorkload, args: argparse.Namespace, out: Path, seed: int | None = None) -> list[str]:
    rates = ",".join(f"{r * args.rate_scale:g}" for r in workload.rates)
    argv = [*shlex.split(workload.args), "--rates", rates, "--policies", args.policies, "--out", str(out),
            "--no-progress", *shlex.split(args.extra)]
    if args.simulate:
        argv += ["--profile", args.simulate, "--seed", str(seed or 0)]
    else:
        argv = ["compare", *argv, "--repeats", str(args.repeats)]
    return argv


def load_runs(out: Path, simulated: bool) -> list[dict]:
    """Every run of one workload, each with its repetition (simulated: one file per seed)."""
    if not simulated:
        path = out / "compare.json"
        return json.loads(path.read_text())["runs"] if path.exists() else []
    runs = []
    for path in sorted(out.glob("seed-*/simulate.json")):
        repetition = int(path.parent.name.split("-")[1])
        runs += [{**run, "repetition": repetition} for run in json.loads(path.read_text())["runs"]]
    return runs


def verdicts(runs: list[dict]) -> list[dict]:
    """Per rate: RotaSched against the best baseline of each repetition (the one with the highest
    joint attainment), and fcfs's own joint attainment (where the rate sits against its knee)."""
    by_key = {(r["series"], r["rate"], r.get("repetition", 0)): r["summary"] for r in runs}
    rows = []
    for rate in sorted({r["rate"] for r in runs}):
        deltas, ratios, fcfs = [], [], []
        for repetition in sorted({r.get("repetition", 0) for r in runs if r["rate"] == rate}):
            ours = by_key.get(("rotasched", rate, repetition))
            baselines = [by_key[(b, rate, repetition)] for b in BASELINES if (b, rate, repetition) in by_key]
            if ours is None or not baselines:
                continue
            best = max(baselines, key=lambda s: s["attainment"]["both"])
            deltas.append(ours["attainment"]["both"] - best["attainment"]["both"])
            if best["tbt_s"].get("p99") and ours["tbt_s"].get("p99") is not None:
                ratios.append(ours["tbt_s"]["p99"] / best["tbt_s"]["p99"])
            if ("fcfs", rate, repetition) in by_key:
                fcfs.append(by_key[("fcfs", rate, repetition)]["attainment"]["both"])
        if deltas:
            rows.append({
                "rate": rate, "repetitions": len(deltas), "joint_minus_best": deltas,
                "p99_gap_ratio": ratios, "fcfs_joint": fcfs,
                "meets_targets": min(deltas) >= JOINT_MARGIN and (not ratios or max(ratios) <= P99_GAP_RATIO),
            })
    return rows


def summary_table(summary: dict) -> str:
    lines = ["RotaSched vs the best baseline per repetition: joint attainment difference (points), "
             "p99 gap ratio; fcfs's joint attainment (knee)"]
    for name, rows in summary.items():
        for row in rows:
            deltas = ", ".join(f"{d * 100:+.0f}" for d in row["joint_minus_best"])
            ratios = ", ".join(f"{r:.2f}" for r in row["p99_gap_ratio"])
            fcfs = ", ".join(f"{f * 100:.0f}%" for f in row["fcfs_joint"])
            mark = "ok" if row["meets_targets"] else "MISSED"
            lines.append(f"  {name:12s} rate {row['rate']:g}: joint {deltas} | p99 gap x{ratios} | fcfs {fcfs} | {mark}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from superinfer.bench import cli as bench_cli
    from superinfer.simulate import cli as simulate_cli

    chosen = [w.strip() for w in args.workloads.split(",") if w.strip()]
    known = {w.name: w for w in SUITE}
    unknown = [name for name in chosen if name not in known]
    if unknown:
        raise SystemExit(f"superinfer bench suite: unknown workloads {unknown}; the suite has {sorted(known)}")
    summary = {}
    for name in chosen:
        workload = known[name]
        out = args.out / name
        if not args.summary_only:
            print(f"== {name}: {workload.description}")
            if args.simulate:
                for seed in range(args.repeats):
                    parser = argparse.ArgumentParser(prog="superinfer simulate", allow_abbrev=False)
                    simulate_cli.add_arguments(parser)
                    simulate_cli.run(parser.parse_args(workload_argv(workload, args, out / f"seed-{seed}", seed)))
            else:
                parser = argparse.ArgumentParser(prog="superinfer bench", allow_abbrev=False)
                bench_cli.add_arguments(parser)
                bench_cli.run(parser.parse_args(workload_argv(workload, args, out)))
        summary[name] = verdicts(load_runs(out, bool(args.simulate)))
    document = {"simulated": args.simulate, "rate_scale": args.rate_scale, "repeats": args.repeats,
                "workloads": {w.name: {"args": w.args, "rates": w.rates} for w in SUITE if w.name in chosen},
                "verdicts": summary,
                "median_joint_minus_best": {
                    name: statistics.median(d for row in rows for d in row["joint_minus_best"]) if rows else None
                    for name, rows in summary.items()}}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "suite.json").write_text(json.dumps(document, indent=1))
    print(summary_table(summary))
    print(f"wrote {args.out / 'suite.json'}")
    return 0
