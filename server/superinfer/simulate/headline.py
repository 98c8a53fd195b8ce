"""The paper's headline setting, simulated: Llama-3-8B on GH200, ShareGPT-like lengths
(vLLM's filter, max_new_tokens = recorded output, EOS ignored), Poisson arrivals over a 120 s
window, 35–60 req/s, all four policies, the scheduler's planning time charged to the
simulated steps. Writes `simulate.json`, the PNGs and a
Markdown table (`headline.md`) into `--out`, for docs/simulation.md.

`--seeds` (default 42, the one the docs' earlier tables used) simulates each seed's arrivals
and lengths into `--out/seed-<seed>/`; with more than one, `headline.md` and the printed table
give each figure's median over the seeds with its range, and the paired differences of the
policies on the same seed.

    python -m superinfer.simulate.headline --out docs/sim-gh200 [--device-kv-blocks N] [--seeds 42,1,2,3,4]
"""
import argparse
from pathlib import Path

from superinfer.bench.outcomes import SCHEDULER_DEFAULTS
from superinfer.cli import main as superinfer_main


def arguments(out: Path, rates: str, policies: str, ttft_ms: float, tbt_ms: float, duration: float,
              device_blocks: int | None, profile: str, charge_planning: bool = True, seed: int = 42) -> list[str]:
    argv = [
        "simulate", "--profile", profile, "--policies", policies, "--rates", rates,
        "--arrival", "poisson", "--duration", str(duration), "--seed", str(seed),
        "--lengths", "sharegpt", "--ignore-eos", "--ttft-slo-ms", str(ttft_ms), "--tbt-slo-ms", str(tbt_ms),
        "--out", str(out), "--charge-planning" if charge_planning else "--no-charge-planning",
    ]
    if device_blocks is not None:
        argv += ["--device-kv-blocks", str(device_blocks)]
    return argv


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--profile", default="gh200:llama-3-8b")
    parser.add_argument("--rates", default="35,40,45,50,55,60")
    parser.add_argument("--policies", default=",".join(SCHEDULER_DEFAULTS["policies"]))
    parser.add_argument("--ttft-slo-ms", type=float, default=1000.0)
    parser.add_argument("--tbt-slo-ms", type=float, default=100.0)
    parser.add_argument("--duration", type=float, default=120.0)
    parser.add_argument("--device-kv-blocks", type=int, default=None)
    parser.add_argument("--charge-planning", action=argparse.BooleanOptionalAction, default=True,
                        help="charge the scheduler's planning time to the simulated steps (default: on)")
    parser.add_argument("--seeds", default="42", help="comma-separated workload seeds, each simulated in full")
    parser.add_argument("--merge", type=Path, action="append", default=[],
                        help="simulate.json of earlier runs: only merge them into one table and plots")
    args = parser.parse_args(argv)
    from superinfer.bench.plots import write_plots
    from superinfer.bench.report import markdown_table, read_json

    seeds = [int(seed) for seed in args.seeds.split(",")]
    if args.merge:
        results = [run for path in args.merge for run in read_json(path)]
        write_plots(results, args.out, prefix="simulate_")
    elif len(seeds) == 1:
        code = superinfer_main(arguments(args.out, args.rates, args.policies, args.ttft_slo_ms, args.tbt_slo_ms,
                                         args.duration, args.device_kv_blocks, args.profile, args.charge_planning,
                                         seeds[0]))
        if code:
            return code
        results = read_json(args.out / "simulate.json")
    else:
        return _over_seeds(args, seeds)
    table = markdown_table(results, ("TTFT ok", "TBT ok", "both", "TTFT p99", "gap p99", "gap max", "goodput"))
    (args.out / "headline.md").write_text(table + "\n")
    print(table)
    return 0


def _over_seeds(args: argparse.Namespace, seeds: list[int]) -> int:
    """Every seed simulated into its own directory; each figure's median [range] over them."""
    from dataclasses import replace

    from superinfer.bench import compare
    from superinfer.bench.plots import write_plots
    from superinfer.bench.report import paired_table, read_json, spread_table

    results = []
    for index, seed in enumerate(seeds):
        out = args.out / f"seed-{seed}"
        code = superinfer_main(arguments(out, args.rates, args.policies, args.ttft_slo_ms, args.tbt_slo_ms,
                                         args.duration, args.device_kv_blocks, args.profile, args.charge_planning,
                                         seed))
        if code:
            return code
        results += [replace(run, repetition=index, seed=seed) for run in read_json(out / "simulate.json")]
    points, pairs = compare.aggregate(results), compare.paired_differences(results)
    write_plots(compare.median_runs(results), args.out, prefix="simulate_")
    text = "\n".join([spread_table(points, f"simulated, {len(seeds)} seeds ({args.seeds})"),
                      paired_table(pairs, "ttft_attainment"), paired_table(pairs, "both_attainment")])
    (args.out / "headline.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
