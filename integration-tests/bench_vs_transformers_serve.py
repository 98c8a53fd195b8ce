"""SuperInfer against transformers' own continuous-batching server (a benchmark, not a test).

    .venv/bin/python integration-tests/bench_vs_transformers_serve.py [--streams 1 8 32] [--pairs 5]
        [--superinfer-arg=--async-scheduling ...] [--serve-path DIR]

Both servers run the embedded model as SuperInfer converts it (the same directory, float32, on
the CPU): `superinfer launch` and `transformers serve --continuous-batching`. For each number of
concurrent streams, both are sent the same streamed `/v1/completions` requests (a prompt of
`--prompt-words` words, `--max-tokens` greedy tokens), in interleaved pairs after an unmeasured
warm-up pair (the order alternating: SuperInfer first in even pairs). Per run: each stream's
time per output token after its first (mean of its gaps), the median over the streams; the
time to first token, median over the streams; output tokens per second over the run's wall
time. Each ratio (SuperInfer over transformers for throughput, transformers over SuperInfer for
time per token: above 1 means SuperInfer is faster) is the median of the per-pair ratios, with
its range. Prints a table and JSON.

`transformers serve` needs transformers' `serving` extra (fastapi, uvicorn, openai), which the
project's environment does not install: `--serve-path DIR` adds a directory holding them to
its PYTHONPATH (e.g. `.venv/bin/pip install --target DIR fastapi uvicorn openai starlette`)."""
import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_overhead import wait_healthy  # noqa: E402
from superinfer.shard.throughput_bench import interleave, spread  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
TEXT = ("The river town woke slowly that spring, its ferries idle and its market stalls half built, while the "
        "old clockmaker on the square wound every clock in his shop and told anyone who passed that time, "
        "like water, only ever seems to stand still. ")


def prompt(words: int) -> str:
    pool = TEXT.split()
    return " ".join(pool[i % len(pool)] for i in range(words)) + "\n\nWhat happened next was"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def model_directory() -> Path:
    sys.path.insert(0, str(REPO / "server"))
    from superinfer.shard.model_source import resolve_model

    cache = Path(os.environ.get("SUPERINFER_CACHE", Path.home() / ".cache" / "superinfer"))
    return resolve_model("default", cache).directory


@contextlib.contextmanager
def started(argv: list[str], url: str, env: dict | None = None) -> Iterator[str]:
    process = subprocess.Popen(argv, start_new_session=True, stdout=sys.stderr, stderr=subprocess.STDOUT, env=env)
    try:
        wait_healthy(url, process)
        yield url
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)


async def one_stream(session: aiohttp.ClientSession, url: str, body: dict) -> list[float]:
    """Arrival times (client clock) of the stream's chunks that carry text."""
    arrivals = []
    async with session.post(f"{url}/v1/completions", json=body) as response:
        if response.status != 200:
            raise RuntimeError(f"{url}: HTTP {response.status}: {(await response.text())[:300]}")
        async for line in response.content:
            if not line.startswith(b"data:") or line.strip() == b"data: [DONE]":
                continue
            event = json.loads(line[5:])
            if "error" in event:
                raise RuntimeError(f"{url}: {event['error']}")
            if any(choice.get("text") for choice in event.get("choices", [])):
                arrivals.append(time.perf_counter())
    return arrivals


def run(url: str, model: str, streams: int, text: str, max_tokens: int) -> dict:
    body = {"model": model, "prompt": text, "max_tokens": max_tokens, "temperature": 0, "stream": True}

    async def all_streams():
        timeout = aiohttp.ClientTimeout(total=1800)
        async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as session:
            start = time.perf_counter()
            results = await asyncio.gather(*(one_stream(session, url, body) for _ in range(streams)))
            return start, time.perf_counter(), results

    start, end, results = asyncio.run(all_streams())
    per_token = [(times[-1] - times[0]) / (len(times) - 1) for times in results if len(times) > 1]
    return {
        "ms_per_token": 1e3 * statistics.median(per_token),
        "ttft_ms": 1e3 * statistics.median(times[0] - start for times in results),
        "tokens_per_s": sum(map(len, results)) / (end - start),
        "chunks": [len(times) for times in results],
    }


def compare(ours, theirs, pairs: int) -> dict:
    measured = interleave(ours, theirs, pairs)
    return {
        "throughput_ratio": spread([a["tokens_per_s"] / b["tokens_per_s"] for a, b in measured]),
        "per_token_ratio": spread([b["ms_per_token"] / a["ms_per_token"] for a, b in measured]),
        "superinfer": {name: spread([a[name] for a, _ in measured]) for name in ("ms_per_token", "ttft_ms", "tokens_per_s")},
        "transformers": {name: spread([b[name] for _, b in measured]) for name in ("ms_per_token", "ttft_ms", "tokens_per_s")},
        "chunks": {"superinfer": measured[0][0]["chunks"][:4], "transformers": measured[0][1]["chunks"][:4]},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--prompt-words", type=int, default=200)
    parser.add_argument("--superinfer-arg", action="append", default=[], help="extra `superinfer launch` flag (repeat)")
    parser.add_argument("--serve-path", help="directory with transformers' serving extra (fastapi, uvicorn, openai)")
    args = parser.parse_args()
    directory = model_directory()
    text = prompt(args.prompt_words)
    ours_port, theirs_port = free_port(), free_port()
    ours_argv = [str(REPO / ".venv/bin/superinfer"), "launch", "--port", str(ours_port), "--hostname", "127.0.0.1",
                 *args.superinfer_arg]
    theirs_argv = [str(REPO / ".venv/bin/transformers"), "serve", str(directory), "--continuous-batching",
                   "--device", "cpu", "--dtype", "float32", "--host", "127.0.0.1", "--port", str(theirs_port)]
    env = dict(os.environ)
    if args.serve_path:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [args.serve_path, env.get("PYTHONPATH")]))
    results = {"model": str(directory), "prompt_words": args.prompt_words, "max_tokens": args.max_tokens,
               "pairs": args.pairs, "superinfer_args": args.superinfer_arg, "threads": os.cpu_count(), "streams": {}}
    with started(ours_argv, f"http://127.0.0.1:{ours_port}") as ours_url, \
            started(theirs_argv, f"http://127.0.0.1:{theirs_port}", env) as theirs_url:
        for streams in args.streams:
            figures = compare(lambda: run(ours_url, "superinfer", streams, text, args.max_tokens),
                              lambda: run(theirs_url, str(directory), streams, text, args.max_tokens), args.pairs)
            results["streams"][str(streams)] = figures
            ours, theirs = figures["superinfer"], figures["transformers"]
            print(f"{streams:>3} streams: ms/token {ours['ms_per_token']['median']:.1f} vs "
                  f"{theirs['ms_per_token']['median']:.1f}, tok/s {ours['tokens_per_s']['median']:.1f} vs "
                  f"{theirs['tokens_per_s']['median']:.1f}, TTFT {ours['ttft_ms']['median']:.0f} vs "
                  f"{theirs['ttft_ms']['median']:.0f} ms; throughput ratio "
                  f"{figures['throughput_ratio']['median']:.2f} [{figures['throughput_ratio']['min']:.2f}–"
                  f"{figures['throughput_ratio']['max']:.2f}], per-token ratio {figures['per_token_ratio']['median']:.2f} "
                  f"[{figures['per_token_ratio']['min']:.2f}–{figures['per_token_ratio']['max']:.2f}]", flush=True)
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
