"""Chooses, by measurement on this GPU, where `auto` switches from the gather/scatter kernel to
the copy engines.

Which path is faster for a given run size depends on the machine (PCIe generation, IOMMU,
driver, C2C on a superchip), so a constant threshold is wrong somewhere. Once per device and
process, both paths move scattered runs of doubling sizes between scratch pools — both
directions at once, as the shard submits them — and the threshold is the smallest run size
from which the kernel is less than KERNEL_MIN_ADVANTAGE times faster than the copy engines,
for it and every larger size tried. Ties go to the copy engines: they take no SMs at all,
while the kernel, even in short launches, competes with the model for them. About 0.3 s on
an H200; the scratch pools (2 × 64 MiB) are freed afterwards.
"""

from __future__ import annotations

import functools
import statistics
import time

import torch

KIB = 1024
RUN_SIZES = tuple(16 * KIB << shift for shift in range(8))  # 16 KiB … 2 MiB
SCRATCH_BYTES = 64 * 1024 * KIB
# Above every size tried: the kernel won everywhere.
KERNEL_ALWAYS = RUN_SIZES[-1] * 2
# How much faster than the copy engines the kernel must be to be worth the SMs it takes.
KERNEL_MIN_ADVANTAGE = 1.1


def _duplex_seconds(engine, plan_out, plan_in, repeats: int) -> float:
    samples = []
    for index in range(repeats + 1):
        torch.cuda.synchronize()
        start = time.perf_counter()
        engine.submit(swap_out=plan_out, swap_in=plan_in).wait()
        if index:  # the first run is warm-up
            samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def measure_path_speeds(
    device: torch.device, kernel_ctas: int, kernel_launch_bytes: int, repeats: int = 3
) -> dict[int, dict]:
    """Seconds per duplex submit of scattered runs, per run size and path (kernel, dma)."""
    from . import TransferConfig, TransferEngine

    device_scratch = torch.empty(SCRATCH_BYTES, dtype=torch.uint8, device=device)
    host_scratch = torch.empty(SCRATCH_BYTES, dtype=torch.uint8, pin_memory=True)
    generator = torch.Generator().manual_seed(0)
    speeds: dict[int, dict] = {}
    # Forced paths never read the threshold; an explicit one keeps these engines from
    # calibrating in turn.
    def config(method: str) -> TransferConfig:
        return TransferConfig(cuda_method=method, kernel_ctas=kernel_ctas, dma_min_run_bytes=0,
                              kernel_launch_bytes=kernel_launch_bytes)

    try:
        # This GPU's capabilities (they do not depend on the run size).
        probe = TransferEngine(device_scratch.view(1, -1), host_scratch.view(1, -1), config("auto"))
        native = probe._backend.native  # noqa: SLF001
        paths = {"dma": "batch_memcpy" if native.batch_memcpy_available else "memcpy_loop"}
        if native.kernel_available:
            paths["kernel"] = "kernel"
        probe.close()
        for run_bytes in RUN_SIZES:
            blocks = SCRATCH_BYTES // run_bytes
            device_pool = device_scratch.view(blocks, run_bytes)
            host_pool = host_scratch.view(blocks, run_bytes)
            half = blocks // 2
            device_order = torch.randperm(blocks, generator=generator)
            host_order = torch.randperm(blocks, generator=generator)
            # Disjoint halves, shuffled: few neighbours merge into a longer run.
            plan_out = (device_order[:half], host_order[:half])
            plan_in = (host_order[half:], device_order[half:])
            speeds[run_bytes] = {"kernel": float("inf")}
            for path, method in paths.items():
                engine = TransferEngine(device_pool, host_pool, config(method))
                speeds[run_bytes][path] = _duplex_seconds(engine, plan_out, plan_in, repeats)
                engine.close()
    finally:
        del device_scratch, host_scratch
    return speeds


def threshold_from_speeds(speeds: dict[int, dict]) -> int:
    """The smallest run size from which the kernel is never KERNEL_MIN_ADVANTAGE times faster
    than the copy engines (KERNEL_ALWAYS if it is at the largest size). Speeds are seconds."""
    threshold = KERNEL_ALWAYS
    for run_bytes in sorted(speeds, reverse=True):
        if speeds[run_bytes]["dma"] < KERNEL_MIN_ADVANTAGE * speeds[run_bytes]["kernel"]:
            threshold = run_bytes
        else:
            break
    return threshold


@functools.cache
def measured_dma_min_run_bytes(device_index: int, kernel_ctas: int, kernel_launch_bytes: int) -> int:
    """The calibrated `dma_min_run_bytes` for a CUDA device and kernel shape (measured once per
    process)."""
    device = torch.device("cuda", device_index)
    with torch.cuda.device(device):
        return threshold_from_speeds(measure_path_speeds(device, kernel_ctas, kernel_launch_bytes))
