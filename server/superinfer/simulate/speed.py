"""Speed benchmark of the simulator (not a test): 100,000 requests with Azure-trace or fixed
lengths on the GH200 / Llama-3-8B profile, each policy; prints wall time, the ratio to the
one-minute target, and how many simulated seconds pass per wall second.

    python -m superinfer.simulate.speed [--requests 100000] [--rate 40] [--trace PATH]
"""
import argparse
import time

from superinfer.bench.outcomes import SCHEDULER_DEFAULTS, Slo
from superinfer.bench.trace import load_trace
from superinfer.bench.workload import WorkloadConfig, requests_for
from superinfer.simulate.profiles import derived
from superinfer.simulate.runner import SimOptions, run_raw

TARGET_S = 60.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--rate", type=float, default=40.0)
    parser.add_argument("--trace", help="Azure trace CSV for lengths (default: fixed 512 in / 128 out)")
    parser.add_argument("--policies", default=",".join(SCHEDULER_DEFAULTS["policies"]))
    args = parser.parse_args(argv)
    trace = load_trace(args.trace) if args.trace else None
    config = WorkloadConfig(arrival="poisson", rate=args.rate, num_requests=args.requests,
                            lengths="trace" if trace is not None else "fixed", prompt_tokens=512, output_tokens=128)
    specs = requests_for(config, trace)
    profile = derived("gh200", "llama-3-8b")
    tokens = sum(s.max_new_tokens for s in specs)
    print(f"{len(specs)} requests, {tokens} output tokens, {args.rate:g} req/s, profile {profile.name}")
    for policy in [p.strip() for p in args.policies.split(",") if p.strip()]:
        started = time.perf_counter()
        raw = run_raw(profile, specs, SimOptions(policy, Slo(2000, 200)))
        wall = time.perf_counter() - started
        finished = sum(raw["requests"]["finished"])
        print(f"{policy:>10}: {wall:7.2f} s wall ({wall / TARGET_S:.2f} × the {TARGET_S:.0f} s target), "
              f"{raw['steps']} steps, {finished} finished, "
              f"{raw['makespan_s'] / wall:.1f} simulated s per wall s, simulator core {raw['wall_s']:.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
