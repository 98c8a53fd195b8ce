"""Decode steps with and without the projections' row padding (`models.row_padding`): a
benchmark, not a test.

Warms a shard up as the server would (its pool, batch limits and threads; the warm-up measures
the padding table), then times decode-only steps of each batch size over the same context as
warm-up times them (`warmup.time_step`: the forward and the logits of every sampled row), with
the warm-up's table and with none, in `--rounds` interleaved rounds after a warm-up round (the
order alternating each round). Prints per batch size both medians [range] and the median of
the per-round ratios padded / unpadded, then JSON.

    python -m superinfer.shard.row_padding_bench [--model default] [--batches 1 2 3 4 5 6 7 8 12 16]
        [--context-tokens 128] [--device-kv-blocks 32] [--rounds 7] [--threads N]"""
import argparse
import json
import statistics
import sys

import torch

from ..models.row_padding import head_times
from .cost_check import add_shard_arguments, warmed_shard
from .throughput_bench import spread
from .warmup import _chunks, time_step


def run(args: argparse.Namespace) -> dict:
    runner = warmed_shard(args)[0].runner
    table = runner.row_padding
    steps = {b: _chunks(0, b, args.context_tokens, runner.block_size) for b in args.batches}
    runner.allocate(max(max(c.block_table) + 1 for chunks in steps.values() for c in chunks), 0)
    times = {(b, padded): [] for b in args.batches for padded in (True, False)}
    for round_index in range(args.rounds + 1):
        for batch, chunks in steps.items():
            for padded in ((True, False) if round_index % 2 else (False, True)):
                runner.set_row_padding(table if padded else ())
                seconds = time_step(runner, chunks)
                if round_index:  # the first round is a warm-up
                    times[(batch, padded)].append(seconds)
    runner.set_row_padding(())
    head_ms = [1e3 * t for t in head_times(runner.model.lm_head, runner.config.hidden_size, runner.dtype, runner.device)]
    runner.set_row_padding(table)
    rows = []
    for batch in args.batches:
        on, off = times[(batch, True)], times[(batch, False)]
        rows.append({"requests": batch, "padded_to": table[batch - 1] if batch <= len(table) else batch,
                     "padded_ms": spread([1e3 * t for t in on]), "unpadded_ms": spread([1e3 * t for t in off]),
                     "padded_over_unpadded": statistics.median(a / b for a, b in zip(on, off))})
    return {"model": args.model, "threads": torch.get_num_threads(), "context_tokens": args.context_tokens,
            "rounds": args.rounds, "table": list(table),
            "lm_head_ms_by_rows": head_ms, "decode": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_shard_arguments(parser, rounds=7)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 2, 3, 4, 5, 6, 7, 8, 12, 16])
    args = parser.parse_args(argv)
    result = run(args)
    print(f"padding table (rows 1..{len(result['table'])} computed as): {result['table']}")
    print("LM head alone, unpadded, ms by rows 1..:", " ".join(f"{t:.1f}" for t in result["lm_head_ms_by_rows"]))
    print("requests  padded to  padded ms, median [range]  unpadded ms, median [range]  padded / unpadded")
    for row in result["decode"]:
        p, u = row["padded_ms"], row["unpadded_ms"]
        print(f"{row['requests']:>8}  {row['padded_to']:>9}  {p['median']:7.1f} [{p['min']:.1f}–{p['max']:.1f}]"
              f"        {u['median']:7.1f} [{u['min']:.1f}–{u['max']:.1f}]          {row['padded_over_unpadded']:.2f}")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
