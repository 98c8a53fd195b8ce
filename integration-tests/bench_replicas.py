"""What vllm-router in front of a replica adds to a request's latency (a benchmark, not a test).

    .venv-clients/bin/python integration-tests/bench_replicas.py [--url http://host:port] [--pairs 200]

Without --url it launches one replica (`superinfer launch`, embedded model). It starts the
pinned vllm-router (`round_robin`, that one worker) in front and sends the same small request
(`/v1/chat/completions`, greedy, one token) alternately to the replica and through the router,
one at a time on kept-alive connections, after an unmeasured warm-up. It prints each side's p50
and the router's overhead as p50(router) - p50(direct), with the median of the per-pair
differences beside it and the ratio of the two p50s. Target: overhead <= 2 ms."""
import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import requests

from conftest import launch
from replicas.test_replicas import REPLICA_ARGS, vllm_router

TARGET_MS = 2.0
BODY = {"model": "tgi", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1, "temperature": 0}


def timed(session: requests.Session, url: str) -> float:
    """Seconds for one request, answered 200."""
    start = time.perf_counter()
    response = session.post(f"{url}/v1/chat/completions", json=BODY, timeout=60)
    elapsed = time.perf_counter() - start
    if response.status_code != 200:
        raise SystemExit(f"{url} answered {response.status_code}: {response.text[:200]}")
    return elapsed


def measure(direct_url: str, router_url: str, pairs: int, warmup: int) -> dict:
    direct, routed = requests.Session(), requests.Session()
    for _ in range(warmup):
        timed(direct, direct_url)
        timed(routed, router_url)
    direct_ms, router_ms = [], []
    for pair in range(pairs):
        # The order alternates, so neither side always follows the other.
        order = [(direct, direct_url, direct_ms), (routed, router_url, router_ms)]
        for session, url, samples in order if pair % 2 == 0 else order[::-1]:
            samples.append(timed(session, url) * 1e3)
    direct_p50, router_p50 = statistics.median(direct_ms), statistics.median(router_ms)
    return {
        "pairs": pairs,
        "direct_p50_ms": direct_p50,
        "router_p50_ms": router_p50,
        "overhead_p50_ms": router_p50 - direct_p50,
        "overhead_paired_median_ms": statistics.median(r - d for r, d in zip(router_ms, direct_ms)),
        "router_over_direct_p50": router_p50 / direct_p50,
        "direct_p90_ms": statistics.quantiles(direct_ms, n=10)[-1],
        "router_p90_ms": statistics.quantiles(router_ms, n=10)[-1],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="a running replica (default: launch one)")
    parser.add_argument("--pairs", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        logs = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-replicas-")))
        direct_url = args.url or stack.enter_context(launch(logs, REPLICA_ARGS)).url
        router_url = stack.enter_context(vllm_router(logs, [direct_url], "round_robin"))
        result = measure(direct_url, router_url, args.pairs, args.warmup)
    print(f"{result['pairs']} pairs, one small chat request (1 token) at a time, alternating:")
    print(f"  direct to the replica  p50 {result['direct_p50_ms']:.2f} ms  (p90 {result['direct_p90_ms']:.2f} ms)")
    print(f"  through vllm-router    p50 {result['router_p50_ms']:.2f} ms  (p90 {result['router_p90_ms']:.2f} ms)")
    print(f"  router overhead: p50 difference {result['overhead_p50_ms']:+.2f} ms, median of paired differences "
          f"{result['overhead_paired_median_ms']:+.2f} ms; ratio of p50s {result['router_over_direct_p50']:.3f} "
          f"(target: overhead <= {TARGET_MS} ms)")
    print(json.dumps(result))
    return 0 if result["overhead_p50_ms"] <= TARGET_MS else 1


if __name__ == "__main__":
    sys.exit(main())
