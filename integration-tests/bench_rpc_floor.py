"""The floor of one unary gRPC call into a Python grpcio server over a unix socket — the hop
every Step takes — for the thread-pool server the shard uses and for grpc.aio, each in its own
process, with an empty Health RPC (no model, no protobuf payload to speak of). Prints the
median round trip of each, in microseconds, and their ratio.

    .venv/bin/python integration-tests/bench_rpc_floor.py [--calls 3000]
"""
import argparse
import asyncio
import json
import multiprocessing
import statistics
import tempfile
import time
from concurrent import futures
from pathlib import Path

import grpc

from superinfer.pb import shard_pb2, shard_pb2_grpc


class _Sync(shard_pb2_grpc.ShardServicer):
    def Health(self, request, context):
        return shard_pb2.HealthResponse()


class _Async(shard_pb2_grpc.ShardServicer):
    async def Health(self, request, context):
        return shard_pb2.HealthResponse()


def _serve_threads(path: str, ready) -> None:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))  # as the shard does
    shard_pb2_grpc.add_ShardServicer_to_server(_Sync(), server)
    server.add_insecure_port(f"unix://{path}")
    server.start()
    ready.set()
    server.wait_for_termination()


def _serve_aio(path: str, ready) -> None:
    async def main() -> None:
        server = grpc.aio.server()
        shard_pb2_grpc.add_ShardServicer_to_server(_Async(), server)
        server.add_insecure_port(f"unix://{path}")
        await server.start()
        ready.set()
        await server.wait_for_termination()

    asyncio.run(main())


def _median_round_trip_us(path: str, calls: int) -> float:
    stub = shard_pb2_grpc.ShardStub(grpc.insecure_channel(f"unix://{path}"))
    for _ in range(200):  # connection set-up and warm caches
        stub.Health(shard_pb2.HealthRequest())
    samples = []
    for _ in range(calls):
        start = time.perf_counter()
        stub.Health(shard_pb2.HealthRequest())
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3000)
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as folder:
        for name, serve in (("thread_pool", _serve_threads), ("aio", _serve_aio)):
            ready = multiprocessing.Event()
            path = str(Path(folder) / f"{name}.sock")
            process = multiprocessing.Process(target=serve, args=(path, ready), daemon=True)
            process.start()
            ready.wait(30)
            results[f"{name}_p50_us"] = round(_median_round_trip_us(path, args.calls), 1)
            process.terminate()
            process.join()
    results["aio_vs_thread_pool"] = round(results["aio_p50_us"] / results["thread_pool_p50_us"], 3)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
