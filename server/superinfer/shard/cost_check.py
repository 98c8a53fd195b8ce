"""How well the warm-up's step-cost model predicts decode steps (a benchmark, not a test).

The scheduler plans with, and the simulator predicts from, the linear model the shard fits at
warm-up (`warmup.measure_step_cost`): step ≈ c0 + c1·prefill tokens + c2·decode requests +
c3·context tokens. This warms a shard up as the server would (its pool, batch limits and
threads), then times decode-only steps of each batch size over the same context and
prefill-only steps of each prompt length, and mixed steps — a prefill chunk of a longer prompt
(its earlier chunks already computed) beside running decodes, the step RotaSched's step-time cap
sizes (`--mixed CHUNK:COMPUTED:DECODES`) — in `--rounds` interleaved rounds (after a warm-up round; the batch order rotated each round), measured as
warm-up measures (the forward and the logits of every sampled row, `warmup.time_step`), and
prints per step the measured median [range], the model's prediction (its token curve, and the
linear terms alone) and their ratios: a ratio far from 1 is an error the cost model carries
into every plan and simulation.

    python -m superinfer.shard.cost_check [--model default] [--batches 1 2 3 4 6 8 12 16]
        [--prefills 1 3 4 8 …] [--mixed 128:384:4 …] [--context-tokens 128] [--device-kv-blocks 32] [--max-batch-tokens 2048]
        [--max-batch-requests 256] [--rounds 5] [--threads N]

Prints a table and JSON."""
import argparse
import json
import os
import pathlib
import sys

import torch
from google.protobuf import json_format

from superinfer import _router

from ..pb import shard_pb2 as pb
from .cli import build_executor, cache_dir
from .config import ShardConfig
from .batch import Chunk
from .throughput_bench import spread
from .warmup import _chunks, time_step


def predicted_s(cost: dict, prefill: int, decodes: int, context_tokens: int) -> float:
    """The warm-up model's step time, by the scheduler crate's formula (the simulator's machine
    over the same fields): the token curve where the warm-up measured one, else linear."""
    return _router.step_time(json.dumps({"kind": "linear", **cost}), [(prefill, decodes, context_tokens)])[0]


def parse_mixed(text: str) -> tuple[int, int, int]:
    try:
        chunk, computed, decodes = (int(part) for part in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--mixed takes CHUNK:COMPUTED:DECODES, got {text!r}") from None
    if chunk < 1 or computed < 0 or decodes < 0:
        raise argparse.ArgumentTypeError(f"--mixed needs CHUNK >= 1, COMPUTED >= 0, DECODES >= 0, got {text!r}")
    return chunk, computed, decodes


def _shape(kind: str, size, chunks: list[Chunk]) -> tuple[int, int, int]:
    """(prefill tokens, decode requests, context tokens) as the scheduler counts them."""
    context_tokens = sum(c.start + len(c.token_ids) for c in chunks)
    if kind == "prefill":
        return size, 0, context_tokens
    if kind == "decode":
        return 0, size, context_tokens
    chunk, _computed, decodes = size
    return chunk, decodes, context_tokens


def _rows(kind: str, sizes: list, steps: dict, times: dict, cost: dict) -> list[dict]:
    linear = {**cost, "token_curve": {}}
    rows = []
    for size in sizes:
        shape = _shape(kind, size, steps[(kind, size)])
        measured = times[(kind, size)]
        predicted, predicted_linear = predicted_s(cost, *shape), predicted_s(linear, *shape)
        rows.append({"size": size, "measured_ms": spread([1e3 * t for t in measured]),
                     "predicted_ms": 1e3 * predicted, "measured_over_predicted": spread([t / predicted for t in measured]),
                     "linear_predicted_ms": 1e3 * predicted_linear,
                     "measured_over_linear": spread([t / predicted_linear for t in measured])})
    return rows


def add_shard_arguments(parser: argparse.ArgumentParser, rounds: int) -> None:
    """The arguments of a CPU shard warmed up as the server's (`warmed_shard`) and of rounds of
    timed steps over it."""
    parser.add_argument("--model", default="default")
    parser.add_argument("--context-tokens", type=int, default=128, help="positions of every decode's KV")
    parser.add_argument("--device-kv-blocks", type=int, default=32, help="the served pool the warm-up fits over")
    parser.add_argument("--max-batch-tokens", type=int, default=2048)
    parser.add_argument("--max-batch-requests", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=rounds, help="measured rounds (after a warm-up round)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--cache-dir", type=pathlib.Path, default=None,
                        help="converted models (default: $SUPERINFER_CACHE or ~/.cache/superinfer)")


def warmed_shard(args: argparse.Namespace, host_kv_blocks: int = 0) -> tuple:
    """A CPU shard over `args.model` warmed up as the server's (its pool and batch limits):
    (its executor, the Warmup reply). Sets torch's threads from `--threads` (default: the CPUs
    the process may use)."""
    torch.set_num_threads(args.threads or len(os.sched_getaffinity(0)))
    config = ShardConfig(model=args.model, cache_dir=cache_dir(args.cache_dir), device=torch.device("cpu"), dtype=torch.float32,
                         device_kv_blocks=args.device_kv_blocks, host_kv_blocks=host_kv_blocks)
    executor = build_executor(config)
    warm = executor.warmup(pb.WarmupRequest(max_batch_tokens=args.max_batch_tokens,
                                            max_batch_requests=args.max_batch_requests))
    return executor, warm


def run(args: argparse.Namespace) -> dict:
    executor, warm = warmed_shard(args)
    runner = executor.runner
    cost = json_format.MessageToDict(warm.cost_model, preserving_proto_field_name=True,
                                     always_print_fields_with_no_presence=True)
    steps = {("decode", b): _chunks(0, b, args.context_tokens, runner.block_size) for b in args.batches}
    steps |= {("prefill", p): _chunks(p, 0, 0, runner.block_size) for p in args.prefills}
    steps |= {("mixed", (chunk, computed, decodes)): _chunks(chunk, decodes, args.context_tokens, runner.block_size, computed)
              for chunk, computed, decodes in args.mixed}
    # A pool for the largest step measured (the fit is the server pool's; this only has room).
    runner.allocate(max(max(c.block_table) + 1 for chunks in steps.values() for c in chunks), 0)
    order = list(steps)
    times: dict[tuple[str, int], list[float]] = {key: [] for key in order}
    for round_index in range(args.rounds + 1):
        shift = round_index % len(order)
        for key in order[shift:] + order[:shift]:
            seconds = time_step(runner, steps[key])
            if round_index:  # the first round is a warm-up
                times[key].append(seconds)
    return {"model": args.model, "threads": torch.get_num_threads(), "context_tokens": args.context_tokens,
            "device_kv_blocks": args.device_kv_blocks, "rounds": args.rounds,
            "cost_model": cost,
            "decode": _rows("decode", args.batches, steps, times, cost),
            "prefill": _rows("prefill", args.prefills, steps, times, cost),
            "mixed": _rows("mixed", args.mixed, steps, times, cost)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_shard_arguments(parser, rounds=5)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 2, 3, 4, 6, 8, 12, 16])
    parser.add_argument("--prefills", type=int, nargs="*", default=[1, 3, 4, 8, 12, 16, 32, 48, 100, 256],
                        help="prompt lengths of prefill-only steps (one request each)")
    parser.add_argument("--mixed", type=parse_mixed, nargs="*", default=[(128, 0, 4), (128, 384, 4), (256, 256, 4), (64, 448, 8)],
                        metavar="CHUNK:COMPUTED:DECODES",
                        help="mixed steps: a prefill chunk of CHUNK tokens after COMPUTED already computed, beside "
                             "DECODES decodes over --context-tokens")
    args = parser.parse_args(argv)
    result = run(args)
    print(f"warm-up fit: {result['cost_model']}")
    for kind, label in (("decode", "requests"), ("prefill", "tokens"), ("mixed", "chunk:computed:decodes")):
        print(f"{kind}: {label}  measured ms, median [range]  predicted ms (curve / linear)  "
              "measured / predicted, median [range]: curve / linear")
        for row in result[kind]:
            m, r, lr = row["measured_ms"], row["measured_over_predicted"], row["measured_over_linear"]
            size = row["size"] if kind != "mixed" else ":".join(map(str, row["size"]))
            print(f"{size:>5}  {m['median']:7.1f} [{m['min']:.1f}–{m['max']:.1f}]"
                  f"   {row['predicted_ms']:7.1f} / {row['linear_predicted_ms']:7.1f}"
                  f"   {r['median']:.2f} [{r['min']:.2f}–{r['max']:.2f}] / {lr['median']:.2f} [{lr['min']:.2f}–{lr['max']:.2f}]")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
