"""`superinfer simulate --profile gh200:llama-3-8b --policies fcfs,rotasched --rates 35,60 …`:
the same workload options as `superinfer bench`, replayed through the scheduler on a
simulated machine, one run per (policy, rate). Writes `<out>/simulate.json` and PNGs, and
prints the side-by-side table; everything is labelled "simulated". With `--step-log`, each run's
planned steps go to `<out>/step-log-<policy>-<rate>.jsonl` too (`python -m
superinfer.simulate.step_log` follows requests through them)."""
import argparse
import json
from dataclasses import asdict, replace

from superinfer import _router
from superinfer.bench import plots, report
from superinfer.bench.cli import add_workload_arguments, slo_request, workload_config, workload_trace
from superinfer.bench.outcomes import SCHEDULER_DEFAULTS, Slo
from superinfer.bench.sharegpt import load_conversations
from superinfer.bench.tokenizer import local_tokenizer
from superinfer.bench.workload import WorkloadRequest, WorkloadConfig, requests_for
from superinfer.simulate.profiles import resolve
from superinfer.simulate.runner import SimOptions, run_raw, to_result, unloaded_latency


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--profile", default="gh200:llama-3-8b",
                        help="HARDWARE:MODEL (gh200, gh200-144g, h200-pcie : llama-3-8b, qwen2.5-32b, "
                             "mixtral-8x7b), measured:PATH (Warmup cost model JSON) or bench:PATH")
    parser.add_argument("--policies", default=",".join(_router.scheduler_defaults()["policies"]))
    parser.add_argument("--device-kv-blocks", type=int, default=None, help="override the profile's pool")
    parser.add_argument("--host-kv-blocks", type=int, default=None)
    parser.add_argument("--max-batch-tokens", type=int, default=None)
    parser.add_argument("--max-batch-requests", type=int, default=None)
    parser.add_argument("--no-prefix-caching", action="store_true")
    parser.add_argument("--time-share", nargs="?", const="true", default=None, choices=("true", "false"),
                        metavar="BOOL",
                        help="whether RotaSched time-shares the device under overload, as the router's "
                        "--time-share ('false' serves overload as swap does; default: the router's, "
                        f"{str(SCHEDULER_DEFAULTS['time_share']).lower()})")
    parser.add_argument("--no-send-slo", action="store_true", help="requests carry no objectives (server defaults)")
    parser.add_argument("--tokenizer", default="default", help="for ShareGPT lengths: 'default' or a path")
    parser.add_argument("--step-log", action="store_true",
                        help="also write every planned step of each run (what it computed and moved, where each "
                             "request stood) to <out>/step-log-<policy>-<rate>.jsonl, one JSON object per line")
    add_charge_arguments(parser)
    add_workload_arguments(parser)


def add_charge_arguments(parser: argparse.ArgumentParser) -> None:
    """What a simulated step costs beyond its forward; each overrides the profile's value."""
    group = parser.add_argument_group("charges beyond the forward pass (default: the profile's)")
    group.add_argument("--step-overhead-ms", type=float, default=None,
                       help="every step's fixed cost outside the forward (router turn, gRPC hop, shard work around "
                       "the model), also for steps that compute nothing")
    group.add_argument("--transfer-stall", type=float, default=None,
                       help="share of each transfer's link time that delays the step it rides with: 0 where copies "
                       "run beside compute (a GPU's copy engines), 1 where they share the forward's cores (CPU)")
    group.add_argument("--charge-planning", action=argparse.BooleanOptionalAction, default=None,
                       help="charge the scheduler's planning as it runs (its wall time; results then vary slightly "
                       "from run to run)")


def with_charges(profile, args: argparse.Namespace):
    charges = dict(profile.charges)
    if args.step_overhead_ms is not None:
        charges["per_step_s"] = args.step_overhead_ms / 1e3
    if args.transfer_stall is not None:
        charges["transfer_stall"] = args.transfer_stall
    if args.charge_planning is not None:
        charges["planning"] = args.charge_planning
    return replace(profile, charges=charges)


def _profile(args: argparse.Namespace):
    profile = resolve(args.profile)
    overrides = {
        "num_device_blocks": args.device_kv_blocks, "num_host_blocks": args.host_kv_blocks,
        "max_batch_tokens": args.max_batch_tokens, "max_batch_requests": args.max_batch_requests,
    }
    return with_charges(replace(profile, **{k: v for k, v in overrides.items() if v is not None}), args)


def planned_workloads(args: argparse.Namespace) -> tuple[WorkloadConfig, dict[float, list[WorkloadRequest]]]:
    """The workload options' config and, per rate, its arrivals and lengths (no prompt text)."""
    config = workload_config(args)
    trace = workload_trace(args)
    conversations = tokenizer = None
    if config.lengths == "sharegpt":
        conversations, tokenizer = load_conversations(args.sharegpt), local_tokenizer(args.tokenizer)
    return config, {rate: requests_for(replace(config, rate=rate), trace, conversations, tokenizer) for rate in args.rates}


def objectives(args: argparse.Namespace, profile, workloads: dict[float, list[WorkloadRequest]],
               policy: str) -> tuple[Slo, dict | None]:
    """The objectives the options ask for and, when they are scales of the unloaded latency, that
    latency: one request of the lowest rate's mean lengths alone on the simulated machine."""
    wanted = slo_request(args)
    unloaded = None
    if wanted.needs_calibration:
        first = workloads[min(workloads)]
        mean_prompt = round(sum(s.prompt_tokens for s in first) / len(first))
        mean_output = round(sum(s.max_new_tokens for s in first) / len(first))
        unloaded = unloaded_latency(profile, mean_prompt, mean_output, policy)
    return wanted.resolve(unloaded), unloaded


def run(args: argparse.Namespace) -> int:
    profile = _profile(args)
    config, workloads = planned_workloads(args)
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    slo, unloaded = objectives(args, profile, workloads, policies[0])
    results = []
    for policy in policies:
        options = SimOptions(policy, slo, send_slo=not args.no_send_slo, prefix_caching=not args.no_prefix_caching,
                             step_log=args.step_log,
                             time_share=None if args.time_share is None else args.time_share == "true")
        for rate in sorted(workloads):
            raw = run_raw(profile, workloads[rate], options)
            if args.step_log:
                write_step_log(args.out / f"step-log-{policy}-{rate:g}.jsonl", raw["step_log"])
            results.append(to_result(raw, slo, policy, rate))
            if not args.no_progress:
                sim = results[-1].summary["simulator"]
                print(f"simulated {policy} @ {rate:g} req/s: {len(workloads[rate])} requests, "
                      f"{sim['steps']} steps in {sim['wall_s']:.2f} s")
    header = {"label": "simulated", "command": "simulate", "profile": profile.describe(), "policies": policies,
              "workload": asdict(config), "rates": args.rates, "slo": asdict(slo), "unloaded": unloaded}
    report.write_json(args.out / "simulate.json", header, results)
    written = plots.write_plots(results, args.out, prefix="simulate_")
    print(report.table(results))
    if extra := report.breakdowns(results):
        print(extra)
    print(f"wrote {args.out / 'simulate.json'} and {len(written)} plots in {args.out}")
    return 0


def write_step_log(path, steps: list[dict]) -> None:
    """One planned step per line: `time`, the ids it `scheduled` (computed), `rotate_out`,
    `rotate_in` and `recomputed`, and `requests`: [id, phase, objectives lost] for every request
    the scheduler held once it was planned (ids are the workload's request indexes)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for step in steps:
            f.write(json.dumps(step, separators=(",", ":")) + "\n")
