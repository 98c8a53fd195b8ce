"""Decode attention alone, the Triton kernel against gather + SDPA (and FlashInfer's kernels
where `flashinfer` is installed and the device is a GPU), in one run: for each batch size and
context length, every backend reads the same random block-first pool (shuffled blocks,
Llama-3.2-1B's heads by default) through metadata built as the runner builds it.

Method: a warm-up pair, then --pairs interleaved pairs (the order alternating), each side of a
pair the mean of --iters calls between two synchronisations; reported per point: each side's
median, every per-pair ratio sdpa/triton (> 1: the kernel is faster), their median and range,
the kernel's K/V read rate, and with FlashInfer the median ratio triton/flashinfer (> 1:
FlashInfer is faster). Prints JSON.

  python -m superinfer.shard.attention_bench --device cuda
  TRITON_INTERPRET=1 python -m superinfer.shard.attention_bench --device cpu --batch-sizes 1 \\
      --context-lens 12 --head-dim 16 --block-size 4   # exercises the code; timings meaningless"""
import argparse
import json
import statistics
import sys
import time

import torch

from ..models.attention import paged_attention
from .attention_backends import select_attention_backend
from .batch import BatchLayout, Chunk

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", choices=DTYPES, default=None, help="default: bfloat16 on a GPU, float32 on the CPU")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32, 128])
    parser.add_argument("--context-lens", type=int, nargs="+", default=[512, 1024, 4096])
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20, help="calls per timed sample")
    parser.add_argument("--num-layers", type=int, default=16, help="layers in a block (sets the pool's strides)")
    parser.add_argument("--num-heads", type=int, default=32)
    parser.add_argument("--num-kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--block-size", type=int, default=16)
    args = parser.parse_args(argv)
    if args.pairs < 1 or args.iters < 1:
        parser.error("--pairs and --iters must be positive")
    return args


def _backends(device: torch.device) -> tuple[str, ...]:
    """SDPA (the reference) and Triton; FlashInfer too on a GPU that has it."""
    if device.type == "cuda":
        try:
            import flashinfer  # noqa: F401
        except ImportError:
            return ("sdpa", "triton")
        return ("sdpa", "triton", "flashinfer")
    return ("sdpa", "triton")


def _sample(call, iters: int, device: torch.device) -> float:
    """Seconds per call: the mean of `iters` calls between two synchronisations."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(iters):
        call()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - start) / iters


def _point(args: argparse.Namespace, batch: int, context: int, device: torch.device, dtype: torch.dtype) -> dict:
    blocks_each = -(-context // args.block_size)
    generator = torch.Generator().manual_seed(batch * 100_003 + context)
    order = torch.randperm(batch * blocks_each, generator=generator).tolist()
    chunks = [Chunk([0], context - 1, order[i * blocks_each:(i + 1) * blocks_each]) for i in range(batch)]
    pool = torch.randn(batch * blocks_each, args.num_layers, 2, args.block_size, args.num_kv_heads, args.head_dim,
                       device=device, dtype=dtype)
    q = torch.randn(batch, args.num_heads, args.head_dim, device=device, dtype=dtype)
    layer = args.num_layers // 2
    groups = args.num_heads // args.num_kv_heads
    calls = {}
    for backend in _backends(device):
        layout = BatchLayout(args.block_size, args.num_layers, args.num_kv_heads, groups, args.head_dim, dtype)
        # Once per step in the runner: not timed.
        meta = select_attention_backend(backend, layout, device).build_batch(chunks).meta
        calls[backend] = lambda meta=meta: paged_attention(q, pool, layer, meta)
    reference = calls["sdpa"]().float()
    max_abs_diff = {backend: float((call().float() - reference).abs().max()) for backend, call in calls.items()
                    if backend != "sdpa"}
    times = {backend: [] for backend in calls}
    for pair in range(args.pairs + 1):  # pair 0 warms up (compilation, allocator) and is dropped
        order_of_pair = list(calls) if pair % 2 == 0 else list(reversed(calls))
        sample = {backend: _sample(calls[backend], args.iters, device) for backend in order_of_pair}
        if pair:
            for backend in times:
                times[backend].append(sample[backend])
    ratios = [sdpa / triton for sdpa, triton in zip(times["sdpa"], times["triton"])]
    triton_s = statistics.median(times["triton"])
    kv_bytes = batch * context * 2 * args.num_kv_heads * args.head_dim * pool.element_size()
    del pool
    return {
        "batch": batch, "context": context,
        "sdpa_ms": statistics.median(times["sdpa"]) * 1e3, "triton_ms": triton_s * 1e3,
        "ratios": ratios, "ratio_median": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
        "triton_kv_gb_per_s": kv_bytes / triton_s / 1e9,
        "max_abs_diff": max_abs_diff["triton"],
        **({} if "flashinfer" not in times else {
            "flashinfer_ms": statistics.median(times["flashinfer"]) * 1e3,
            "triton_over_flashinfer_median": statistics.median(
                [t / f for t, f in zip(times["triton"], times["flashinfer"])]),
            "flashinfer_max_abs_diff": max_abs_diff["flashinfer"]}),
    }


def main(argv: list[str] | None = None) -> None:
    args = _parse(argv)
    device = torch.device(args.device)
    dtype = DTYPES[args.dtype] if args.dtype else (torch.float32 if device.type == "cpu" else torch.bfloat16)
    from ..models import triton_attention  # after parsing: --help does not need triton

    results = [_point(args, batch, context, device, dtype)
               for batch in args.batch_sizes for context in args.context_lens]
    report = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else device.type,
        "dtype": str(dtype).removeprefix("torch."),
        "interpreted": triton_attention.INTERPRETED,
        "note": ("TRITON_INTERPRET: the kernel ran in triton's Python interpreter; timings are meaningless"
                 if triton_attention.INTERPRETED else "decode attention of one layer, ratio = sdpa / triton"),
        "shape": {"num_layers": args.num_layers, "num_heads": args.num_heads, "num_kv_heads": args.num_kv_heads,
                  "head_dim": args.head_dim, "block_size": args.block_size},
        "method": {"pairs": args.pairs, "iters": args.iters, "warmup_pairs": 1},
        "results": results,
    }
    json.dump(report, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
