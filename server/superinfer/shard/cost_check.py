"""How well the warm-up's step-cost model predicts decode steps (a benchmark, not a test).

The scheduler plans with, and the simulator predicts from, the linear model the shard fits at
warm-up (`warmup.measure_step_cost`): step ≈ c0 + c1·prefill tokens + c2·decode requests +
c3·context tokens. This warms a shard up as the server would (its pool, batch limits and
threads), then times decode-only steps of each batch size over the same context, in `--rounds`
interleaved rounds (after a warm-up round; the batch order rotated each round), measured as
warm-up measures (the forward and the logits of every sampled row, `warmup.time_step`), and
prints per batch size the measured median [range], the model's prediction and their ratio: a
ratio far from 1 is an error the cost model carries into every plan and simulation.

    python -m superinfer.shard.cost_check [--model default] [--batches 1 2 3 4 6 8 12 16]
        [--context-tokens 128] [--device-kv-blocks 32] [--max-batch-tokens 2048]
        [--max-batch-requests 256] [--rounds 5] [--threads N]

Prints a table and JSON."""
import argparse
import json
import os
import pathlib
import sys

import torch

from superinfer import _router

from ..pb import shard_pb2 as pb
from .cli import build_executor, cache_dir
from .config import ShardConfig
from .throughput_bench import spread
from .warmup import _chunks, time_step


def predicted_s(cost: dict, prefill: int, decodes: int, context_tokens: int) -> float:
    """The warm-up model's step time, by the scheduler crate's formula (the simulator's linear
    machine over the same fields)."""
    return _router.step_time(json.dumps({"kind": "linear", **cost}), [(prefill, decodes, context_tokens)])[0]


def run(args: argparse.Namespace) -> dict:
    config = ShardConfig(model=args.model, cache_dir=cache_dir(args.cache_dir), device=torch.device("cpu"), dtype=torch.float32,
                         device_kv_blocks=args.device_kv_blocks, host_kv_blocks=0)
    executor = build_executor(config)
    warm = executor.warmup(pb.WarmupRequest(max_batch_tokens=args.max_batch_tokens,
                                            max_batch_requests=args.max_batch_requests))
    runner = executor.runner
    cost = {field.name: getattr(warm.cost_model, field.name) for field in warm.cost_model.DESCRIPTOR.fields}
    # A pool for the largest batch measured (the fit is the server pool's; this only has room).
    per_request = -(-args.context_tokens // runner.block_size)
    runner.allocate(max(args.batches) * per_request, 0)
    steps = {b: _chunks(0, b, args.context_tokens, runner.block_size) for b in args.batches}
    times: dict[int, list[float]] = {b: [] for b in args.batches}
    for round_index in range(args.rounds + 1):
        shift = round_index % len(args.batches)
        for batch in args.batches[shift:] + args.batches[:shift]:
            seconds = time_step(runner, steps[batch])
            if round_index:  # the first round is a warm-up
                times[batch].append(seconds)
    rows = []
    for batch in args.batches:
        context_tokens = sum(c.start + len(c.token_ids) for c in steps[batch])
        predicted = predicted_s(cost, 0, batch, context_tokens)
        ratios = [t / predicted for t in times[batch]]
        rows.append({"batch": batch, "measured_ms": spread([1e3 * t for t in times[batch]]),
                     "predicted_ms": 1e3 * predicted, "measured_over_predicted": spread(ratios)})
    return {"model": args.model, "threads": torch.get_num_threads(), "context_tokens": args.context_tokens,
            "device_kv_blocks": args.device_kv_blocks, "rounds": args.rounds,
            "cost_model": cost,
            "decode": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="default")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 2, 3, 4, 6, 8, 12, 16])
    parser.add_argument("--context-tokens", type=int, default=128, help="positions of every request's KV")
    parser.add_argument("--device-kv-blocks", type=int, default=32, help="the served pool the warm-up fits over")
    parser.add_argument("--max-batch-tokens", type=int, default=2048)
    parser.add_argument("--max-batch-requests", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=5, help="measured rounds (after a warm-up round)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--cache-dir", type=pathlib.Path, default=None,
                        help="converted models (default: $SUPERINFER_CACHE or ~/.cache/superinfer)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads or len(os.sched_getaffinity(0)))
    result = run(args)
    print(f"warm-up fit: {result['cost_model']}")
    print("batch  measured ms, median [range]   predicted ms   measured / predicted, median [range]")
    for row in result["decode"]:
        m, r = row["measured_ms"], row["measured_over_predicted"]
        print(f"{row['batch']:5d}  {m['median']:7.1f} [{m['min']:.1f}–{m['max']:.1f}]"
              f"{row['predicted_ms']:17.1f}   {r['median']:.2f} [{r['min']:.2f}–{r['max']:.2f}]")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
