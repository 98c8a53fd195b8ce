"""The cost of constrained decoding per step (a benchmark, not a test).

    .venv/bin/python integration-tests/bench_grammar.py [--url http://host:port] [--streams 32] [--pairs 5]

Without --url it launches `superinfer launch` on the embedded model. It decodes `--streams`
concurrent streams with the same prompts and length, unconstrained (ignoring EOS) and each under
a JSON schema that cannot end within the token limit (so every stream decodes to the end), in
`--pairs` interleaved pairs after one unmeasured pair (the order alternating: constrained first
in even pairs). Over a window where every step is a decode step of every stream it reads from
/metrics the router's mask computation per token per request (p50/p99 from
`superinfer_grammar_mask_seconds`, mean exact), the masks' share of each step, and the step
cycle (engine turn + Step round trip, the time between two steps) of both runs. Each figure is
the median over the pairs with its range; each ratio the median of the per-pair ratios. Target:
the constrained step is at most 5% slower.

The forward pass does the same work in both runs (one decode per stream at the same positions)
but varies with the machine's load between them, so the constraint's cost is also given as
what it adds outside the forward (router masks, the shard applying them) over the
unconstrained step cycle: the figure to judge the target by on a shared machine."""
import argparse
import asyncio
import json
import re
import sys

import aiohttp

from bench_overhead import mean_between, one_stream, parse_metrics, served
from superinfer.shard.throughput_bench import interleave, spread

PROMPT = "Write a long list of short notes about the sea, as a JSON array of strings:"
# At least 200 strings: no stream can complete it within the token limit, so each decodes to
# the end, like the unconstrained run (which ignores EOS).
SCHEMA = {"type": "array", "items": {"type": "string", "minLength": 1, "maxLength": 40}, "minItems": 200}
MASK = "superinfer_grammar_mask_seconds"
STEP_MASKS = "superinfer_grammar_step_mask_seconds"


def parse_buckets(text: str, name: str) -> dict[float, float]:
    """Cumulative counts of a histogram's buckets, by upper bound."""
    pattern = rf'^{name}_bucket{{le="([^"]+)"}} (\S+)$'
    return {float(m.group(1)): float(m.group(2)) for m in re.finditer(pattern, text, re.MULTILINE)}


def quantile(before: dict[float, float], after: dict[float, float], q: float) -> float:
    """Prometheus's histogram_quantile over the window's bucket increments (linear inside a
    bucket)."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    total = counts[-1] if counts else 0.0
    if total == 0:
        return float("nan")
    rank, lower, below = q * total, 0.0, 0.0
    for bound, cumulative in zip(bounds, counts):
        if cumulative >= rank:
            if bound == float("inf"):
                return lower
            return lower + (bound - lower) * (rank - below) / max(cumulative - below, 1e-12)
        lower, below = bound, cumulative
    return lower


async def run(url: str, streams: int, max_new_tokens: int, constrained: bool) -> dict:
    """Scrapes /metrics once every stream decodes and again before the first one ends."""
    parameters = {"max_new_tokens": max_new_tokens, "ignore_eos": True}
    if constrained:
        parameters["grammar"] = {"type": "json", "value": SCHEMA}
    timeout = aiohttp.ClientTimeout(total=1800)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as session:
        async def scrape() -> str:
            async with session.get(f"{url}/metrics") as response:
                return await response.text()

        async def until(condition) -> None:
            while not condition() and not all(task.done() for task in tasks):
                await asyncio.sleep(0.001)

        arrivals = [[] for _ in range(streams)]
        tasks = [asyncio.create_task(one_stream(session, url, parameters, a)) for a in arrivals]
        await until(lambda: all(len(a) >= 2 for a in arrivals))
        before = await scrape()
        await until(lambda: any(len(a) >= max_new_tokens - 2 for a in arrivals))
        after = await scrape()
        results = await asyncio.gather(*tasks, return_exceptions=True)
    errors = [r for r in results if isinstance(r, BaseException)]
    for error in errors[:3]:
        print(f"  error: {error!r}", file=sys.stderr)
    flat_before, flat_after = parse_metrics(before), parse_metrics(after)
    ms = lambda name: mean_between(flat_before, flat_after, name) * 1e3  # noqa: E731
    steps = flat_after.get("superinfer_step_duration_count", 0) - flat_before.get("superinfer_step_duration_count", 0)
    row = {
        "constrained": constrained, "errors": len(errors), "window_steps": steps,
        "step_round_trip_ms": ms("superinfer_step_duration"), "engine_turn_ms": ms("superinfer_engine_turn_duration"),
        "forward_ms": ms("superinfer_forward_duration"), "sampling_ms": ms("superinfer_sampling_duration"),
        "step_overhead_ms": ms("superinfer_step_overhead_duration"),
    }
    row["step_cycle_ms"] = row["step_round_trip_ms"] + row["engine_turn_ms"]
    if constrained:
        masks_before, masks_after = parse_buckets(before, MASK), parse_buckets(after, MASK)
        row.update({
            "masks": flat_after.get(f"{MASK}_count", 0) - flat_before.get(f"{MASK}_count", 0),
            "mask_p50_us": quantile(masks_before, masks_after, 0.50) * 1e6,
            "mask_p99_us": quantile(masks_before, masks_after, 0.99) * 1e6,
            "mask_mean_us": mean_between(flat_before, flat_after, MASK) * 1e6,
            "step_masks_ms": ms(STEP_MASKS),
        })
    return row


def outside_forward(row: dict) -> float:
    return row["step_cycle_ms"] - row["forward_ms"]


def summarise(pairs: list[tuple[dict, dict]]) -> dict:
    """Median [range] over the (constrained, unconstrained) pairs of each figure and ratio."""
    figures = {
        "mask_p50_us": [c["mask_p50_us"] for c, _ in pairs],
        "mask_p99_us": [c["mask_p99_us"] for c, _ in pairs],
        "mask_mean_us": [c["mask_mean_us"] for c, _ in pairs],
        "step_masks_ms": [c["step_masks_ms"] for c, _ in pairs],
        "mask_share": [c["step_masks_ms"] / c["step_cycle_ms"] for c, _ in pairs],
        "unconstrained_cycle_ms": [u["step_cycle_ms"] for _, u in pairs],
        "constrained_cycle_ms": [c["step_cycle_ms"] for c, _ in pairs],
        "unconstrained_forward_ms": [u["forward_ms"] for _, u in pairs],
        "constrained_forward_ms": [c["forward_ms"] for c, _ in pairs],
        "slowdown": [c["step_cycle_ms"] / u["step_cycle_ms"] - 1 for c, u in pairs],
        "added_outside_forward_ms": [outside_forward(c) - outside_forward(u) for c, u in pairs],
        "added_share": [(outside_forward(c) - outside_forward(u)) / u["step_cycle_ms"] for c, u in pairs],
        # Where the added time goes: the router's turn (masks included), the shard's sampling
        # (masks applied there), the Step's transport (round trip minus the shard's own time).
        "added_engine_turn_ms": [c["engine_turn_ms"] - u["engine_turn_ms"] for c, u in pairs],
        "added_sampling_ms": [c["sampling_ms"] - u["sampling_ms"] for c, u in pairs],
        "added_transport_ms": [c["step_overhead_ms"] - u["step_overhead_ms"] for c, u in pairs],
    }
    return {name: spread(values) for name, values in figures.items()}


def _shown(figure: dict, fmt: str) -> str:
    return f"{format(figure['median'], fmt)} [{format(figure['min'], fmt)} – {format(figure['max'], fmt)}]"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="a running server (default: launch one)")
    parser.add_argument("--streams", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--pairs", type=int, default=5, help="measured (constrained, unconstrained) pairs")
    args = parser.parse_args()
    with served(args.url) as url:
        measure = lambda constrained: asyncio.run(  # noqa: E731
            run(url, args.streams, args.max_new_tokens, constrained=constrained))
        pairs = interleave(lambda: measure(True), lambda: measure(False), args.pairs)
        figures = summarise(pairs)
        errors = sum(c["errors"] + u["errors"] for c, u in pairs)
        print(f"{args.streams} streams, {args.max_new_tokens} tokens each, decode-only window; "
              f"median [min – max] over {args.pairs} interleaved pairs")
        print(f"  mask per token per request: p50 {_shown(figures['mask_p50_us'], '.0f')} µs, "
              f"p99 {_shown(figures['mask_p99_us'], '.0f')} µs, mean {_shown(figures['mask_mean_us'], '.0f')} µs")
        print(f"  masks per step: {_shown(figures['step_masks_ms'], '.2f')} ms = "
              f"{_shown(figures['mask_share'], '.1%')} of the constrained step cycle")
        for label, key in (("unconstrained", "unconstrained"), ("constrained  ", "constrained")):
            print(f"  {label} step cycle {_shown(figures[key + '_cycle_ms'], '.1f')} ms "
                  f"(forward {_shown(figures[key + '_forward_ms'], '.1f')} ms)")
        print(f"  constrained step cycle against the unconstrained one (forward included): "
              f"{_shown(figures['slowdown'], '+.1%')}")
        print(f"  added outside the forward: {_shown(figures['added_outside_forward_ms'], '.2f')} ms per step = "
              f"{_shown(figures['added_share'], '+.1%')} of the unconstrained step (target <= +5%); errors {errors}")
        print(f"    of which router turn {_shown(figures['added_engine_turn_ms'], '+.2f')} ms, shard sampling "
              f"{_shown(figures['added_sampling_ms'], '+.2f')} ms, Step transport "
              f"{_shown(figures['added_transport_ms'], '+.2f')} ms (the rest: the shard's other work)")
        print(json.dumps({"pairs": [{"constrained": c, "unconstrained": u} for c, u in pairs], "figures": figures}))
        return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
