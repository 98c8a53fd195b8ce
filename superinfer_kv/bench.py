"""DuplexKV benchmark: `python -m superinfer_kv.bench [--quick] [--out FILE]` prints JSON.

Every figure comes with its reference measured in the same run, and the ratio between them:
- CPU: scattered-block gather/scatter vs one contiguous copy of the same bytes (the memory
  bandwidth bound, target >= 0.70); vs a per-block Python loop of `copy_()` (target >= 5x);
  both directions at once vs one. Interleaved rounds (`--pairs`): every ratio is the median
  of per-round ratios with its range.
- GPU (when CUDA is present, see bench_gpu.py): per direction vs one large pinned copy, duplex
  vs one direction, vs vLLM's per-block cudaMemcpyAsync loop, and the slowdown of a bf16
  matmul while transfers run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy
import torch

from . import TransferEngine
from .cpu_backend import default_thread_count


@dataclass(frozen=True)
class BlockGeometry:
    """One KV block across all layers: [layers, K/V, block_size, kv_heads, head_dim]."""

    layers: int
    block_size: int
    kv_heads: int
    head_dim: int
    dtype: torch.dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.layers, 2, self.block_size, self.kv_heads, self.head_dim)

    @property
    def block_bytes(self) -> int:
        item = torch.empty(0, dtype=self.dtype).element_size()
        return self.layers * 2 * self.block_size * self.kv_heads * self.head_dim * item


# SmolLM2-135M (the embedded default model) on the CPU: float32, 16-token blocks.
SMOLLM2_CPU = BlockGeometry(layers=30, block_size=16, kv_heads=3, head_dim=64, dtype=torch.float32)


def median_seconds(run: Callable[[], None], repeats: int, warmup: int = 1) -> float:
    """Median wall time of `run` (which must finish its work before returning)."""
    for _ in range(warmup):
        run()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def scattered_ids(pool_blocks: int, count: int, seed: int) -> torch.Tensor:
    """`count` distinct block ids in random order: the fragmented case."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randperm(pool_blocks, generator=generator)[:count]


def _gbps(nbytes: int, seconds: float) -> float:
    return round(nbytes / seconds / 1e9, 3)


def _python_loop(src: torch.Tensor, dst: torch.Tensor, src_ids, dst_ids) -> None:
    for s, d in zip(src_ids, dst_ids):
        dst[d].copy_(src[s])


def _python_loop_per_layer(src: torch.Tensor, dst: torch.Tensor, src_ids, dst_ids) -> None:
    # vLLM V0's pattern: one copy per block, per layer, for K and V separately.
    layers = src.shape[1]
    for s, d in zip(src_ids, dst_ids):
        for layer in range(layers):
            dst[d, layer, 0].copy_(src[s, layer, 0])
            dst[d, layer, 1].copy_(src[s, layer, 1])


def spread(values: list[float]) -> dict:
    """A figure over the pairs: its median, range and values."""
    return {"median": round(statistics.median(values), 3), "min": round(min(values), 3),
            "max": round(max(values), 3), "values": [round(v, 3) for v in values]}


def cpu_bench(geometry: BlockGeometry, blocks: int, repeats: int, pairs: int = 5) -> dict:
    """CPU backend figures for `blocks` scattered blocks per direction. Like for like: after one
    unmeasured round, `pairs` rounds each time every variant (the references and the engine, in
    an order that alternates between rounds) on the same bytes; each ratio is the median of the
    per-round ratios, with its range."""
    pool_blocks = 2 * blocks
    device_kv = torch.randn(pool_blocks, *geometry.shape).to(geometry.dtype)
    host_kv = torch.zeros(pool_blocks, *geometry.shape, dtype=geometry.dtype)
    nbytes = blocks * geometry.block_bytes
    out_src, out_dst = scattered_ids(pool_blocks, blocks, 1), scattered_ids(pool_blocks, blocks, 2)
    # Swap-in reads host blocks the swap-out does not write, and writes device blocks the
    # swap-out does not read, so both can run in one submit.
    in_dst = torch.tensor(sorted(set(range(pool_blocks)) - set(out_src.tolist())))[:blocks]
    in_src = torch.tensor(sorted(set(range(pool_blocks)) - set(out_dst.tolist())))[:blocks]
    in_dst = in_dst[torch.randperm(blocks, generator=torch.Generator().manual_seed(3))]
    engine = TransferEngine(device_kv, host_kv)
    # The bandwidth reference: the faster of torch's (multi-threaded) copy_ and numpy's
    # single-threaded memcpy of one contiguous range of the same size.
    flat_src, flat_dst = device_kv[:blocks], host_kv[:blocks]
    numpy_src, numpy_dst = flat_src.numpy(), flat_dst.numpy()
    src_list, dst_list = out_src.tolist(), out_dst.tolist()
    variants: dict[str, Callable[[], None]] = {
        "torch_copy": lambda: flat_dst.copy_(flat_src),
        "numpy_copy": lambda: numpy.copyto(numpy_dst, numpy_src),
        "engine_one_direction": lambda: engine.submit(swap_out=(out_src, out_dst)).wait(),
        "engine_both_directions": lambda: engine.submit(swap_out=(out_src, out_dst), swap_in=(in_src, in_dst)).wait(),
        "python_loop_per_block": lambda: _python_loop(device_kv, host_kv, src_list, dst_list),
        "python_loop_per_layer_kv": lambda: _python_loop_per_layer(device_kv, host_kv, src_list, dst_list),
    }
    rounds: list[dict[str, float]] = []
    for index in range(pairs + 1):  # round 0 warms every path up and is not reported
        order = list(variants) if index % 2 == 0 else list(reversed(variants))
        seconds = {name: median_seconds(variants[name], repeats, warmup=0) for name in order}
        if index:
            rounds.append(seconds)
    engine.close()

    def figure(compute: Callable[[dict[str, float]], float]) -> dict:
        return spread([compute(r) for r in rounds])

    contiguous = lambda r: min(r["torch_copy"], r["numpy_copy"])  # noqa: E731
    return {
        "geometry": {**asdict(geometry), "dtype": str(geometry.dtype)},
        "block_bytes": geometry.block_bytes,
        "blocks_per_direction": blocks,
        "bytes_per_direction": nbytes,
        "engine_threads": default_thread_count(),
        "torch_threads": torch.get_num_threads(),
        "method": f"{pairs} interleaved rounds after a warm-up round, the order reversed every other round, "
                  f"each variant the median of {repeats} runs in its round; ratio = median of per-round ratios",
        "contiguous_copy_gbps": figure(lambda r: _gbps(nbytes, contiguous(r))),
        "engine_one_direction_gbps": figure(lambda r: _gbps(nbytes, r["engine_one_direction"])),
        "ratio_vs_contiguous": figure(lambda r: contiguous(r) / r["engine_one_direction"]),
        "target_ratio_vs_contiguous": 0.70,
        "python_loop_per_block_gbps": figure(lambda r: _gbps(nbytes, r["python_loop_per_block"])),
        "speedup_vs_python_loop_per_block": figure(lambda r: r["python_loop_per_block"] / r["engine_one_direction"]),
        "python_loop_per_layer_kv_gbps": figure(lambda r: _gbps(nbytes, r["python_loop_per_layer_kv"])),
        "speedup_vs_python_loop_per_layer_kv": figure(
            lambda r: r["python_loop_per_layer_kv"] / r["engine_one_direction"]),
        "target_speedup_vs_python_loop": 5.0,
        "engine_both_directions_aggregate_gbps": figure(lambda r: _gbps(2 * nbytes, r["engine_both_directions"])),
        "duplex_aggregate_ratio_vs_one_direction": figure(
            lambda r: 2 * r["engine_one_direction"] / r["engine_both_directions"]),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer blocks and repeats")
    parser.add_argument("--cpu-blocks", type=int, default=128)
    parser.add_argument("--pairs", type=int, default=5, help="CPU: measured interleaved rounds (after a warm-up one)")
    parser.add_argument("--skip-cpu", action="store_true", help="GPU figures only")
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args = parser.parse_args(argv)
    repeats = 3 if args.quick else 7
    report: dict = {"torch": torch.__version__}
    if not args.skip_cpu:
        report["cpu"] = cpu_bench(SMOLLM2_CPU, 32 if args.quick else args.cpu_blocks, repeats, 2 if args.quick else args.pairs)
    if torch.cuda.is_available():
        from .bench_gpu import gpu_bench

        report["gpu"] = gpu_bench(quick=args.quick)
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
