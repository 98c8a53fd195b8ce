"""Router + gRPC overhead per output token (a benchmark, not a test).

    .venv/bin/python integration-tests/bench_overhead.py [--url http://host:port]

Without --url it launches `superinfer launch` on the embedded model. For 1 and 32 concurrent
streams it measures the client-observed time between tokens and subtracts the shard-reported
forward time per step over the same decode-only window (from /metrics): what is left is the
router, the gRPC hop, the HTTP stream and sampling. Means on both sides (the forward time is
only known as a mean over the window), so the parts add up. The measurement is repeated
(`--repeats`, 1 and 32 streams alternating) and each figure reported as the median over the
repeats with its range. Then 256 concurrent streams must all complete without errors.
Targets: overhead <= 0.5 ms per token at 1 stream, <= 10% of the forward at 32 streams.

Launched, it measures two servers side by side (`--modes default,async`, both up at once, the
order alternating each repeat): one step at a time (the default) and one step in flight
(`--async-scheduling`), and prints their paired difference per repeat. With one step in
flight the split into router and gRPC hop no longer applies: a step's RPC includes the wait
for the step before it. `--url` measures the one server given."""
import argparse
import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import aiohttp

from superinfer.shard.throughput_bench import spread

REPO = Path(__file__).resolve().parent.parent
PROMPT = "Count from 1 to 500, separated by commas: 1, 2, 3,"


def parse_metrics(text: str) -> dict[str, float]:
    return {m.group(1): float(m.group(2)) for m in re.finditer(r"^(\w+) (\S+)$", text, re.MULTILINE)}


def mean_between(before: dict, after: dict, name: str) -> float:
    count = after.get(f"{name}_count", 0) - before.get(f"{name}_count", 0)
    total = after.get(f"{name}_sum", 0) - before.get(f"{name}_sum", 0)
    return total / count if count else float("nan")


async def one_stream(session: aiohttp.ClientSession, url: str, parameters: dict, arrivals: list[float]) -> None:
    """Appends the arrival time (client clock) of each of the stream's tokens."""
    body = {"inputs": PROMPT, "parameters": parameters}
    async with session.post(f"{url}/generate_stream", json=body) as response:
        response.raise_for_status()
        async for line in response.content:
            if line.startswith(b"data:"):
                event = json.loads(line[5:])
                if "error" in event:
                    raise RuntimeError(event["error"])
                arrivals.append(time.perf_counter())


async def wait_until(condition, tasks) -> None:
    while not condition() and not all(task.done() for task in tasks):
        await asyncio.sleep(0.001)


async def run_streams(url: str, concurrency: int, max_new_tokens: int) -> dict:
    """Runs the streams; scrapes /metrics when every stream is decoding and again before the
    first one ends, so the window holds only decode steps of all `concurrency` streams."""
    timeout = aiohttp.ClientTimeout(total=1800)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as session:
        async def scrape() -> tuple[float, dict]:
            async with session.get(f"{url}/metrics") as response:
                return time.perf_counter(), parse_metrics(await response.text())

        arrivals = [[] for _ in range(concurrency)]
        tasks = [asyncio.create_task(one_stream(session, url, {"max_new_tokens": max_new_tokens}, a)) for a in arrivals]
        await wait_until(lambda: all(len(a) >= 2 for a in arrivals), tasks)
        start, before = await scrape()
        await wait_until(lambda: any(len(a) >= max_new_tokens - 2 for a in arrivals), tasks)
        end, after = await scrape()
        results = await asyncio.gather(*tasks, return_exceptions=True)
    errors = [r for r in results if isinstance(r, BaseException)]
    for error in errors[:3]:
        print(f"  error: {error!r}")
    gaps = [b - a for times in arrivals for a, b in zip(times, times[1:]) if a >= start and b <= end]
    return {"errors": len(errors), "tokens": sum(map(len, arrivals)), "gaps": gaps, "before": before, "after": after}


def measure(url: str, concurrency: int, max_new_tokens: int) -> dict:
    run = asyncio.run(run_streams(url, concurrency, max_new_tokens))
    gaps, before, after = run["gaps"], run["before"], run["after"]
    ms = lambda name: mean_between(before, after, name) * 1e3  # noqa: E731
    gap_p50 = statistics.median(gaps) * 1e3 if gaps else float("nan")
    gap_mean = statistics.fmean(gaps) * 1e3 if gaps else float("nan")
    forward = ms("superinfer_forward_duration")
    step = ms("superinfer_step_duration")
    hop = ms("superinfer_step_overhead_duration")
    return {
        "concurrency": concurrency, "errors": run["errors"], "tokens": run["tokens"], "window_gaps": len(gaps),
        "client_gap_p50_ms": gap_p50, "client_gap_mean_ms": gap_mean, "forward_mean_ms": forward,
        "step_round_trip_mean_ms": step, "grpc_hop_mean_ms": hop,
        "engine_turn_mean_ms": ms("superinfer_engine_turn_duration"),
        # Per token, means over one window: what the client waits beyond the forward pass, and
        # where it goes (router between steps and HTTP/SSE delivery; the gRPC hop; the shard
        # outside its forward).
        "overhead_mean_ms": gap_mean - forward,
        "overhead_share_of_forward": (gap_mean - forward) / forward,
        "router_and_http_mean_ms": gap_mean - step,
        "shard_outside_forward_mean_ms": step - hop - forward,
    }


FIGURES = ("overhead_mean_ms", "overhead_share_of_forward", "router_and_http_mean_ms", "engine_turn_mean_ms",
           "grpc_hop_mean_ms", "shard_outside_forward_mean_ms", "forward_mean_ms", "client_gap_mean_ms")


def summarize(rows: list[dict]) -> dict:
    """Each figure's median over the repeats, with its range and values."""
    summary = {"concurrency": rows[0]["concurrency"], "repeats": len(rows), "errors": sum(r["errors"] for r in rows)}
    for name in FIGURES:
        values = [r[name] for r in rows]
        summary[name] = {"median": statistics.median(values), "min": min(values), "max": max(values), "values": values}
    return summary


def report(summary: dict) -> None:
    def cell(name: str, unit: str = "ms", scale: float = 1.0) -> str:
        figure = summary[name]
        fmt = "{:.1%}" if unit == "%" else "{:.2f}"
        return (f"{fmt.format(figure['median'] * scale)} [{fmt.format(figure['min'] * scale)}–"
                f"{fmt.format(figure['max'] * scale)}]" + ("" if unit == "%" else f" {unit}"))

    print(f"{summary['concurrency']:>3} streams, median [min–max] of {summary['repeats']} repeats: "
          f"client gap mean {cell('client_gap_mean_ms')}, shard forward mean {cell('forward_mean_ms')} (reference)")
    print(f"    overhead per token {cell('overhead_mean_ms')} ({cell('overhead_share_of_forward', '%')} of forward; "
          f"target <= 0.5 ms at 1 stream, <= 10% at 32) = router between steps and HTTP/SSE delivery {cell('router_and_http_mean_ms')} "
          f"(engine turn {cell('engine_turn_mean_ms')}) + engine<->shard gRPC hop {cell('grpc_hop_mean_ms')} "
          f"+ shard outside forward {cell('shard_outside_forward_mean_ms')}; errors {summary['errors']}")


# What each measured mode adds to the launch.
MODES = {"default": [], "async": ["--async-scheduling"]}


def launch(port: int, extra: list[str] = ()) -> subprocess.Popen:
    argv = [str(REPO / ".venv/bin/superinfer"), "launch", "--port", str(port), "--hostname", "127.0.0.1",
            "--device-kv-blocks", "512", "--host-kv-blocks", "256", *extra]
    # Each mode says what it runs with: the environment's ASYNC_SCHEDULING would turn the
    # default mode into the other one.
    env = {k: v for k, v in os.environ.items() if k != "ASYNC_SCHEDULING"}
    # The server's log goes to stderr, so a failed start explains itself.
    return subprocess.Popen(argv, start_new_session=True, stdout=sys.stderr, stderr=subprocess.STDOUT, env=env)


def wait_healthy(url: str, process: subprocess.Popen | None, timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise SystemExit(f"the server exited with {process.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise SystemExit("the server did not become healthy")


@contextlib.contextmanager
def served(url: str | None, extra: list[str] = ()) -> Iterator[str]:
    """`url`, or the embedded model's server launched on a free loopback port with `extra`
    flags (stopped at the end); healthy either way."""
    process = None
    if url is None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        url = f"http://127.0.0.1:{port}"
        process = launch(port, extra)
    try:
        wait_healthy(url, process)
        yield url
    finally:
        if process is not None and process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=60)


def paired_difference(rows: dict, name: str, concurrency: int) -> dict:
    """async − default of one figure, per repeat (the two measured in the same repeat)."""
    return spread([a[name] - d[name] for a, d in zip(rows["async"][concurrency], rows["default"][concurrency])])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="a running server (default: launch one per mode)")
    parser.add_argument("--modes", default="default,async",
                        help=f"servers launched side by side, of {', '.join(MODES)} (without --url)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5, help="measurements of 1 and 32 streams, alternating")
    args = parser.parse_args()
    modes = ["given"] if args.url else args.modes.split(",")
    if unknown := [m for m in modes if m != "given" and m not in MODES]:
        parser.error(f"unknown modes {unknown}: choose from {', '.join(MODES)}")
    with contextlib.ExitStack() as stack:
        urls = {mode: stack.enter_context(served(args.url, MODES.get(mode, []))) for mode in modes}
        for url in urls.values():
            measure(url, 4, 8)  # warm the path
        rows = {mode: {1: [], 32: []} for mode in modes}
        for repeat in range(args.repeats):
            for mode in (modes if repeat % 2 == 0 else modes[::-1]):
                for concurrency in ((1, 32) if repeat % 2 == 0 else (32, 1)):
                    rows[mode][concurrency].append(measure(urls[mode], concurrency, args.max_new_tokens))
        result, failed = {}, False
        for mode, url in urls.items():
            print(f"{mode}:")
            summaries = [summarize(rows[mode][c]) for c in (1, 32)]
            for summary in summaries:
                report(summary)
            big = measure(url, 256, 16)
            # Only completion counts here: 16 tokens at 256 streams leave no all-decoding window.
            print(f"256 streams: {big['tokens']} tokens, errors {big['errors']}")
            result[mode] = {"summaries": summaries, "256": big}
            failed |= bool(big["errors"] or any(s["errors"] for s in summaries))
        if {"default", "async"} <= set(modes):
            result["async_minus_default"] = {}
            for concurrency in (1, 32):
                diff = paired_difference(rows, "overhead_mean_ms", concurrency)
                result["async_minus_default"][concurrency] = diff
                print(f"one step in flight − one at a time, overhead per token at {concurrency} streams, paired per "
                      f"repeat: {diff['median']:+.2f} ms [{diff['min']:+.2f} – {diff['max']:+.2f}]")
        print(json.dumps(result))
        return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
