"""GPU half of the DuplexKV benchmark (run through `python -m superinfer_kv.bench`).

For each block size, scattered blocks move per copy path ("kernel", "batch_memcpy", "auto");
each figure is set against a reference from the same run: one large pinned copy of the same
bytes per direction, one direction alone for the duplex ratio, vLLM's per-block
cudaMemcpyAsync loop, and a bf16 matmul run alone for the compute slowdown.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

from . import TransferConfig, TransferEngine
from .cuda_backend import CudaBackend

KIB = 1024
MIB = 1024 * KIB
BLOCK_SIZES = (4 * KIB, 16 * KIB, 32 * KIB, 64 * KIB, 256 * KIB, 2 * MIB)
QUICK_BLOCK_SIZES = (4 * KIB, 32 * KIB, 64 * KIB, 2 * MIB)
METHODS = ("kernel", "batch_memcpy", "auto")


def _seconds(run: Callable[[], None], repeats: int) -> float:
    """Median wall time of `run`, device idle before each sample and synchronized after."""
    samples = []
    for index in range(repeats + 1):
        torch.cuda.synchronize()
        start = time.perf_counter()
        run()
        torch.cuda.synchronize()
        if index:  # the first sample is warm-up
            samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def _gbps(nbytes: int, seconds: float) -> float:
    return round(nbytes / seconds / 1e9, 2)


class _Pools:
    """A device and a pinned host pool of 2·blocks blocks, with disjoint scattered plans."""

    def __init__(self, block_bytes: int, blocks: int) -> None:
        # [2·blocks, block_bytes / 2] bf16: the engine only needs each block contiguous.
        self.block_bytes, self.blocks = block_bytes, blocks
        self.device = torch.randn(2 * blocks, block_bytes // 2, device="cuda").bfloat16()
        self.host = torch.zeros(2 * blocks, block_bytes // 2, dtype=torch.bfloat16, pin_memory=True)
        order = torch.randperm(2 * blocks, generator=torch.Generator().manual_seed(0))
        host_order = torch.randperm(2 * blocks, generator=torch.Generator().manual_seed(1))
        # Swap-out reads device blocks order[:n] into host host_order[:n]; swap-in reads the other
        # host half into the other device half: disjoint, so both may share one submit.
        self.swap_out = (order[:blocks], host_order[:blocks])
        self.swap_in = (host_order[blocks:], order[blocks:])

    @property
    def nbytes(self) -> int:
        return self.blocks * self.block_bytes


def _reference_copies(pools: _Pools, repeats: int) -> dict[str, float]:
    n = pools.blocks
    out = _seconds(lambda: pools.host[:n].copy_(pools.device[:n], non_blocking=True), repeats)
    into = _seconds(lambda: pools.device[:n].copy_(pools.host[n:], non_blocking=True), repeats)
    return {"out": out, "in": into}


def _method_figures(pools: _Pools, method: str, reference: dict, repeats: int) -> dict:
    engine = TransferEngine(pools.device, pools.host, TransferConfig(cuda_method=method))
    out = _seconds(lambda: engine.submit(swap_out=pools.swap_out).wait(), repeats)
    into = _seconds(lambda: engine.submit(swap_in=pools.swap_in).wait(), repeats)
    both = _seconds(
        lambda: engine.submit(swap_out=pools.swap_out, swap_in=pools.swap_in).wait(), repeats
    )
    probe = engine.submit(swap_out=pools.swap_out, swap_in=pools.swap_in)
    probe.wait()
    engine.close()
    one_direction = (pools.nbytes / out + pools.nbytes / into) / 2
    return {
        "paths": list(probe.methods),
        "out_gbps": _gbps(pools.nbytes, out),
        "in_gbps": _gbps(pools.nbytes, into),
        "out_ratio_vs_one_large_copy": round(reference["out"] / out, 3),
        "in_ratio_vs_one_large_copy": round(reference["in"] / into, 3),
        "both_aggregate_gbps": _gbps(2 * pools.nbytes, both),
        "duplex_ratio_vs_one_direction": round(2 * pools.nbytes / both / one_direction, 3),
    }


def _per_block_loop_figures(pools: _Pools, repeats: int) -> dict:
    backend = CudaBackend(pools.device, pools.host, TransferConfig())
    src, dst = pools.swap_out
    loop_out = _seconds(lambda: backend.native.copy_per_block(True, src, dst), repeats)
    src, dst = pools.swap_in
    loop_in = _seconds(lambda: backend.native.copy_per_block(False, src, dst), repeats)
    return {
        "loop_out_gbps": _gbps(pools.nbytes, loop_out),
        "loop_in_gbps": _gbps(pools.nbytes, loop_in),
    }


def _kernel_cta_sweep(pools: _Pools, repeats: int) -> dict:
    figures = {}
    for ctas in (4, 8, 16, 32, 64):
        config = TransferConfig(cuda_method="kernel", kernel_ctas=ctas)
        engine = TransferEngine(pools.device, pools.host, config)
        out = _seconds(lambda: engine.submit(swap_out=pools.swap_out).wait(), repeats)
        into = _seconds(lambda: engine.submit(swap_in=pools.swap_in).wait(), repeats)
        figures[str(ctas)] = {
            "out_gbps": _gbps(pools.nbytes, out),
            "in_gbps": _gbps(pools.nbytes, into),
        }
        engine.close()
    return figures


def _matmul_slowdown(pools: _Pools, iterations: int) -> dict:
    # a, b: [8192, 8192] bf16 — about 1.1 TFLOP per matmul.
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)

    def timed_matmuls() -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iterations):
            torch.matmul(a, b)
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3

    timed_matmuls()
    alone = statistics.median(timed_matmuls() for _ in range(3))
    engine = TransferEngine(pools.device, pools.host)
    # Queue enough duplex transfers to outlast the matmuls (they start at once: the event they
    # wait on is recorded before the matmuls are issued).
    per_submit = 2 * pools.nbytes / 100e9  # assume a fast link: queue too many
    handles = [engine.submit(swap_out=pools.swap_out, swap_in=pools.swap_in)
               for _ in range(int(alone * 1.5 / per_submit) + 2)]  # fmt: skip
    with_transfers = timed_matmuls()
    covered = not handles[-1].done()
    for handle in handles:
        handle.wait()
    engine.close()
    return {
        "paths": list(handles[0].methods),
        "matmul_alone_s": round(alone, 4),
        "matmul_with_transfers_s": round(with_transfers, 4),
        "slowdown": round(with_transfers / alone - 1, 4),
        "transfers_outlasted_matmuls": covered,
        "target_slowdown_max": 0.10,
    }


def gpu_bench(quick: bool = False) -> dict:
    """All GPU figures as a JSON-ready dict."""
    repeats = 3 if quick else 5
    total_bytes = (128 if quick else 256) * MIB
    report: dict = {"device": torch.cuda.get_device_name(), "cuda": torch.version.cuda, "sizes": {}}
    for block_bytes in QUICK_BLOCK_SIZES if quick else BLOCK_SIZES:
        pools = _Pools(block_bytes, total_bytes // block_bytes)
        reference = _reference_copies(pools, repeats)
        entry: dict = {
            "blocks": pools.blocks,
            "one_large_copy_out_gbps": _gbps(pools.nbytes, reference["out"]),
            "one_large_copy_in_gbps": _gbps(pools.nbytes, reference["in"]),
        }
        for method in METHODS:
            entry[method] = _method_figures(pools, method, reference, repeats)
        if block_bytes == 32 * KIB:
            loop = _per_block_loop_figures(pools, repeats)
            auto = entry["auto"]
            entry["per_block_memcpy_loop"] = {
                **loop,
                "speedup_out": round(auto["out_gbps"] / loop["loop_out_gbps"], 2),
                "speedup_in": round(auto["in_gbps"] / loop["loop_in_gbps"], 2),
                "target_speedup": 3.0,
            }
            entry["kernel_cta_sweep"] = _kernel_cta_sweep(pools, repeats)
        if block_bytes in (32 * KIB, 2 * MIB):
            entry["matmul_slowdown"] = _matmul_slowdown(pools, 60 if quick else 150)
        report["sizes"][f"{block_bytes // KIB}KiB"] = entry
        del pools
        torch.cuda.empty_cache()
    return report
