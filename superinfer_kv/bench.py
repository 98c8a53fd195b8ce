"""DuplexKV benchmark: `python -m superinfer_kv.bench [--quick] [--out FILE]` prints JSON.

Every figure comes with its reference measured in the same run, and the ratio between them:
- CPU: scattered-block gather/scatter vs one contiguous copy of the same bytes (the memory
  bandwidth bound, target >= 0.70); vs a per-block Python loop of `copy_()` (target >= 5x);
  both directions at once vs one.
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


def cpu_bench(geometry: BlockGeometry, blocks: int, repeats: int) -> dict:
    """CPU backend figures for `blocks` scattered blocks per direction."""
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

    def one_direction() -> None:
        engine.submit(swap_out=(out_src, out_dst)).wait()

    def both_directions() -> None:
        engine.submit(swap_out=(out_src, out_dst), swap_in=(in_src, in_dst)).wait()

    # The bandwidth reference: the faster of torch's (multi-threaded) copy_ and numpy's
    # single-threaded memcpy of one contiguous range of the same size.
    flat_src, flat_dst = device_kv[:blocks], host_kv[:blocks]
    torch_copy = median_seconds(lambda: flat_dst.copy_(flat_src), repeats)
    numpy_src, numpy_dst = flat_src.numpy(), flat_dst.numpy()
    numpy_copy = median_seconds(lambda: numpy.copyto(numpy_dst, numpy_src), repeats)
    contiguous = min(torch_copy, numpy_copy)
    engine_out = median_seconds(one_direction, repeats)
    duplex = median_seconds(both_directions, repeats)
    src_list, dst_list = out_src.tolist(), out_dst.tolist()
    loop = median_seconds(lambda: _python_loop(device_kv, host_kv, src_list, dst_list), repeats)
    loop_layers = median_seconds(
        lambda: _python_loop_per_layer(device_kv, host_kv, src_list, dst_list), repeats
    )
    engine.close()
    return {
        "geometry": {**asdict(geometry), "dtype": str(geometry.dtype)},
        "block_bytes": geometry.block_bytes,
        "blocks_per_direction": blocks,
        "bytes_per_direction": nbytes,
        "engine_threads": default_thread_count(),
        "torch_threads": torch.get_num_threads(),
        "contiguous_torch_copy_gbps": _gbps(nbytes, torch_copy),
        "contiguous_numpy_copy_gbps": _gbps(nbytes, numpy_copy),
        "contiguous_copy_gbps": _gbps(nbytes, contiguous),
        "engine_one_direction_gbps": _gbps(nbytes, engine_out),
        "ratio_vs_contiguous": round(contiguous / engine_out, 3),
        "target_ratio_vs_contiguous": 0.70,
        "python_loop_per_block_gbps": _gbps(nbytes, loop),
        "speedup_vs_python_loop_per_block": round(loop / engine_out, 2),
        "python_loop_per_layer_kv_gbps": _gbps(nbytes, loop_layers),
        "speedup_vs_python_loop_per_layer_kv": round(loop_layers / engine_out, 2),
        "target_speedup_vs_python_loop": 5.0,
        "engine_both_directions_aggregate_gbps": _gbps(2 * nbytes, duplex),
        "duplex_aggregate_ratio_vs_one_direction": round(2 * engine_out / duplex, 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer blocks and repeats")
    parser.add_argument("--cpu-blocks", type=int, default=128)
    parser.add_argument("--skip-cpu", action="store_true", help="GPU figures only")
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args = parser.parse_args(argv)
    repeats = 3 if args.quick else 7
    report: dict = {"torch": torch.__version__}
    if not args.skip_cpu:
        report["cpu"] = cpu_bench(SMOLLM2_CPU, 32 if args.quick else args.cpu_blocks, repeats)
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
