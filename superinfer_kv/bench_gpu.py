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


def _one_way_gbps(pools: _Pools, config: TransferConfig, repeats: int, host=None) -> dict:
    """Each direction alone through an engine of `config` (over `host` if given)."""
    engine = TransferEngine(pools.device, pools.host if host is None else host, config)
    out = _seconds(lambda: engine.submit(swap_out=pools.swap_out).wait(), repeats)
    into = _seconds(lambda: engine.submit(swap_in=pools.swap_in).wait(), repeats)
    engine.close()
    return {"out_gbps": _gbps(pools.nbytes, out), "in_gbps": _gbps(pools.nbytes, into)}


def _kernel_cta_sweep(pools: _Pools, repeats: int) -> dict:
    figures = {}
    for ctas in (1, 2, 4, 8, 16, 32):
        config = TransferConfig(cuda_method="kernel", kernel_ctas=ctas)
        figures[str(ctas)] = _one_way_gbps(pools, config, repeats)
    return figures


def _matmul_slowdown(
    pools: _Pools, iterations: int, config: TransferConfig | None = None, priority: int = 0, pairs: int = 5
) -> dict:
    """A bf16 matmul loop timed alone and while duplex transfers run the whole time, in `pairs`
    interleaved pairs (after an unmeasured one; the order alternating); the slowdown is the
    median of the per-pair ratios, with its range.

    The matmuls run on a side stream: the engine orders each transfer after the work already
    queued on the *current* stream, so transfers submitted while the matmuls run start at once.
    The host keeps submitting until the matmuls end, so copies are in flight throughout.
    `priority` < 0 gives the matmul stream a higher priority than the copy streams."""
    # a, b: [8192, 8192] bf16 — about 1.1 TFLOP per matmul.
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    side = torch.cuda.Stream(priority=priority)
    engine = TransferEngine(pools.device, pools.host, config)

    def launch_matmuls() -> tuple[torch.cuda.Event, torch.cuda.Event]:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(side):
            start.record()
            for _ in range(iterations):
                torch.matmul(a, b)
            end.record()
        return start, end

    def alone_seconds() -> float:
        torch.cuda.synchronize()
        start, end = launch_matmuls()
        end.synchronize()
        return start.elapsed_time(end) / 1e3

    def with_transfers_seconds() -> tuple[float, list, bool]:
        torch.cuda.synchronize()
        handles = [engine.submit(swap_out=pools.swap_out, swap_in=pools.swap_in) for _ in range(2)]
        start, end = launch_matmuls()
        while not end.query():
            handles.append(engine.submit(swap_out=pools.swap_out, swap_in=pools.swap_in))
        covered = not handles[-1].done()
        end.synchronize()
        seconds = start.elapsed_time(end) / 1e3
        for handle in handles:
            handle.wait()
        return seconds, handles, covered

    alone_seconds(), with_transfers_seconds()  # warm-up pair
    alone, loaded, submits, covered_all, methods = [], [], [], True, None
    for index in range(pairs):
        if index % 2 == 0:
            alone.append(alone_seconds())
            seconds, handles, covered = with_transfers_seconds()
        else:
            seconds, handles, covered = with_transfers_seconds()
            alone.append(alone_seconds())
        loaded.append(seconds)
        submits.append(len(handles))
        covered_all &= covered
        methods = list(handles[0].methods)
    engine.close()
    slowdowns = [w / a_ - 1 for a_, w in zip(alone, loaded)]
    return {
        "paths": methods,
        "pairs": pairs,
        "matmul_alone_s": round(statistics.median(alone), 4),
        "matmul_with_transfers_s": round(statistics.median(loaded), 4),
        "slowdown": round(statistics.median(slowdowns), 4),
        "slowdown_min": round(min(slowdowns), 4),
        "slowdown_max": round(max(slowdowns), 4),
        "slowdowns": [round(x, 4) for x in slowdowns],
        "submits_during_matmuls": submits,
        "transfers_outlasted_matmuls": covered_all,
        "target_slowdown_max": 0.10,
    }


def _reference_duplex(pools: _Pools, repeats: int) -> float:
    """One large copy each way at once, on two streams: the link's own duplex limit."""
    n = pools.blocks
    out_stream, in_stream = torch.cuda.Stream(), torch.cuda.Stream()

    def both() -> None:
        with torch.cuda.stream(out_stream):
            pools.host[:n].copy_(pools.device[:n], non_blocking=True)
        with torch.cuda.stream(in_stream):
            pools.device[n:].copy_(pools.host[n:], non_blocking=True)

    return _seconds(both, repeats)


def _hugepage_pinned(like: torch.Tensor):
    """A host pool like `like`, in transparent-huge-page memory registered with CUDA (mapped):
    fewer IOMMU/TLB entries for the kernel's scattered accesses than cudaHostAlloc's pages."""
    import mmap

    nbytes = like.numel() * like.element_size()
    size = -(-nbytes // (2 << 20)) * (2 << 20)
    buffer = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    buffer.madvise(mmap.MADV_HUGEPAGE)
    raw = torch.frombuffer(buffer, dtype=torch.uint8)
    raw.zero_()  # fault the pages in before registering
    error = torch.cuda.cudart().cudaHostRegister(raw.data_ptr(), size, 2)  # cudaHostRegisterMapped
    if int(error) != 0:
        raise RuntimeError(f"cudaHostRegister failed: {error}")
    host = raw[:nbytes].view(like.dtype).view(like.shape)
    return host, buffer, raw


def _hugepage_kernel_figures(pools: _Pools, repeats: int) -> dict:
    host, buffer, raw = _hugepage_pinned(pools.host)
    try:
        figures = _one_way_gbps(pools, TransferConfig(cuda_method="kernel"), repeats, host)
        return {f"kernel_{name}": value for name, value in figures.items()}
    finally:
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaHostUnregister(raw.data_ptr())
        del host, raw
        buffer.close()


def _auto_threshold() -> dict:
    from .calibrate import SCRATCH_BYTES, measure_path_speeds, threshold_from_speeds

    defaults = TransferConfig()
    speeds = measure_path_speeds(torch.device("cuda"), defaults.kernel_ctas, defaults.kernel_launch_bytes)
    return {
        "dma_min_run_bytes": threshold_from_speeds(speeds),
        "duplex_gbps_by_run_bytes": {
            str(size): {path: _gbps(SCRATCH_BYTES, seconds) for path, seconds in paths.items()}
            for size, paths in speeds.items()
        },
    }


def gpu_bench(quick: bool = False) -> dict:
    """All GPU figures as a JSON-ready dict."""
    repeats = 3 if quick else 5
    total_bytes = (128 if quick else 256) * MIB
    report: dict = {"device": torch.cuda.get_device_name(), "cuda": torch.version.cuda,
                    "auto_threshold": _auto_threshold(), "sizes": {}}
    for block_bytes in QUICK_BLOCK_SIZES if quick else BLOCK_SIZES:
        pools = _Pools(block_bytes, total_bytes // block_bytes)
        reference = _reference_copies(pools, repeats)
        duplex = _reference_duplex(pools, repeats)
        one_large = (pools.nbytes / reference["out"] + pools.nbytes / reference["in"]) / 2
        entry: dict = {
            "blocks": pools.blocks,
            "one_large_copy_out_gbps": _gbps(pools.nbytes, reference["out"]),
            "one_large_copy_in_gbps": _gbps(pools.nbytes, reference["in"]),
            "one_large_copy_both_gbps": _gbps(2 * pools.nbytes, duplex),
            "link_duplex_ratio": round(2 * pools.nbytes / duplex / one_large, 3),
        }
        for method in METHODS:
            entry[method] = _method_figures(pools, method, reference, repeats)
        if block_bytes <= 64 * KIB:
            try:
                entry["kernel_hugepage_host"] = _hugepage_kernel_figures(pools, repeats)
            except Exception as error:  # an experiment: report, never fail the run
                entry["kernel_hugepage_host"] = {"error": repr(error)}
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
        if block_bytes == 32 * KIB:
            # What the kernel's SMs cost the model, against the copy engines' nothing.
            kernel = {"cuda_method": "kernel"}
            variants = {
                "kernel_16_ctas_one_launch": (TransferConfig(**kernel, kernel_ctas=16, kernel_launch_bytes=0), 0),
                "kernel_2_ctas_one_launch": (TransferConfig(**kernel, kernel_ctas=2, kernel_launch_bytes=0), 0),
                "kernel_4_ctas_one_launch": (TransferConfig(**kernel, kernel_launch_bytes=0), 0),
                "kernel_4_ctas_one_launch_matmul_high_priority":
                    (TransferConfig(**kernel, kernel_launch_bytes=0), -1),
                "kernel_4_ctas_1MiB_launches": (TransferConfig(**kernel, kernel_launch_bytes=MIB), 0),
                "kernel_4_ctas_1MiB_launches_matmul_high_priority":
                    (TransferConfig(**kernel, kernel_launch_bytes=MIB), -1),
                "batch_memcpy": (TransferConfig(cuda_method="batch_memcpy"), 0),
            }
            entry["matmul_slowdown_by_path"] = {
                name: _matmul_slowdown(pools, 60 if quick else 150, config, priority)
                for name, (config, priority) in variants.items()
            }
            single = TransferConfig(**kernel, kernel_launch_bytes=0)
            entry["kernel_one_launch"] = _one_way_gbps(pools, single, repeats)
        report["sizes"][f"{block_bytes // KIB}KiB"] = entry
        del pools
        torch.cuda.empty_cache()
    return report
