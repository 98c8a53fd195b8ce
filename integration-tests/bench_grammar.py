"""The cost of constrained decoding per step (a benchmark, not a test).

    .venv/bin/python integration-tests/bench_grammar.py [--url http://host:port] [--streams 32]

Without --url it launches `superinfer launch` on the embedded model. In one run it decodes
`--streams` concurrent streams twice with the same prompts and length: unconstrained, then each
under a JSON schema that cannot end within the token limit (so every stream decodes to the
end). Over a window where every step is a decode step of every stream it reports, from
/metrics: the router's mask computation per token per request (p50/p99 from
`superinfer_grammar_mask_seconds`, mean exact), the masks' share of each step, and the step
cycle (engine turn + Step round trip, the time between two steps) of both runs. Target: the
constrained step is at most 5% slower.

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
        "forward_ms": ms("superinfer_forward_duration"),
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="a running server (default: launch one)")
    parser.add_argument("--streams", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    args = parser.parse_args()
    with served(args.url) as url:
        asyncio.run(run(url, 4, 8, constrained=True))  # warm both paths
        asyncio.run(run(url, 4, 8, constrained=False))
        free = asyncio.run(run(url, args.streams, args.max_new_tokens, constrained=False))
        constrained = asyncio.run(run(url, args.streams, args.max_new_tokens, constrained=True))
        slowdown = constrained["step_cycle_ms"] / free["step_cycle_ms"] - 1
        outside_forward = lambda row: row["step_cycle_ms"] - row["forward_ms"]  # noqa: E731
        added_ms = outside_forward(constrained) - outside_forward(free)
        added = added_ms / free["step_cycle_ms"]
        print(f"{args.streams} streams, {args.max_new_tokens} tokens each, decode-only window")
        print(f"  mask per token per request: p50 {constrained['mask_p50_us']:.0f} µs, "
              f"p99 {constrained['mask_p99_us']:.0f} µs, mean {constrained['mask_mean_us']:.0f} µs "
              f"({constrained['masks']:.0f} masks)")
        print(f"  masks per step: {constrained['step_masks_ms']:.2f} ms = "
              f"{constrained['step_masks_ms'] / constrained['step_cycle_ms']:.1%} of the constrained step cycle")
        for row in (free, constrained):
            label = "constrained  " if row["constrained"] else "unconstrained"
            print(f"  {label} step cycle {row['step_cycle_ms']:.2f} ms = engine turn {row['engine_turn_ms']:.2f} "
                  f"+ Step round trip {row['step_round_trip_ms']:.2f} (forward {row['forward_ms']:.2f}); "
                  f"{row['window_steps']:.0f} steps, errors {row['errors']}")
        print(f"  constrained step cycle {slowdown:+.1%} against the unconstrained one (forward included)")
        print(f"  added outside the forward: {added_ms:.2f} ms per step = {added:+.1%} of the unconstrained step "
              f"(target <= +5%)")
        print(json.dumps({"unconstrained": free, "constrained": constrained, "slowdown": slowdown,
                          "added_outside_forward_ms": added_ms, "added_share": added}))
        return 1 if free["errors"] or constrained["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
