"""What time-sharing's rotations cost a shard's steps: a benchmark, not a test.

A shard warmed up as the server's (its pool, batch limits and threads) runs Step requests as
the router sends them: `--requests` decodes per step over `--context-tokens` contexts. In the
rotating runs, `k` of them (each `--rotating`) come back in the step that computes them and
leave again after computing (a copy in from host, the compute ordered after it, a copy out
after the compute, all in one step: `--time-share`'s pattern); in the plain runs every request
stays. A rotating run copies the request's whole table out; a mirrored run copies out only the
block the step wrote, as the router does once the host keeps a mirror of the sealed blocks
(`docs/architecture.md`, "Host mirrors"). Plain, rotating and mirrored runs alternate over
`--rounds` rounds after an unmeasured one; each figure is the median Step time over a run's
steps (its first two left out), and each cost the median over the rounds of (rotating − plain)
/ k, per rotation (one copy in of the request's blocks and one copy out).

    python -m superinfer.shard.rotation_bench [--requests 4] [--rotating 1 2] [--steps 20]
        [--model default] [--context-tokens 128] [--device-kv-blocks 64] [--rounds 5] [--threads N]"""
import argparse
import collections
import json
import statistics
import sys
import time

from ..pb import shard_pb2 as pb
from .cost_check import add_shard_arguments, warmed_shard

# Two slots per rotating request: each step reads one and writes the other.
HOST_BLOCKS = 64
KINDS = ("plain", "rotating", "mirrored")


class _Steps:
    def __init__(self, executor):
        self.executor = executor
        self.step_id = 0
        self.request_id = 0
        self.transfer_id = 0

    def step(self, **fields) -> pb.StepResponse:
        self.step_id += 1
        return self.executor.step(pb.StepRequest(step_id=self.step_id, **fields))

    def transfer(self, src: list[int], dst: list[int]) -> pb.Transfer:
        self.transfer_id += 1
        return pb.Transfer(id=self.transfer_id, src_blocks=src, dst_blocks=dst)


def run_once(steps: _Steps, requests: int, rotating: int, context: int, block_size: int, num_steps: int,
             mirrored: bool = False) -> float:
    """Median Step time (s) of `num_steps` decode steps of `requests` requests, `rotating` of
    them coming in, computing and leaving in every step (`mirrored`: copying out only the block
    the step wrote, into a spare host block that then stands for it)."""
    blocks = -(-(context + num_steps + 1) // block_size)
    ids = [steps.request_id + i + 1 for i in range(requests)]
    steps.request_id += requests
    tables = {r: list(range(i * blocks, (i + 1) * blocks)) for i, r in enumerate(ids)}
    # Two host slots per rotating request: each step reads one and writes the other.
    hosts = [[list(range((2 * j + s) * blocks, (2 * j + s + 1) * blocks)) for s in (0, 1)] for j in range(rotating)]
    vocab = steps.executor.runner.config.vocab_size
    prompt = [[10 + (r * 31 + t) % (vocab - 10) for t in range(context)] for r in ids]
    steps.step(new_requests=[pb.NewRequest(id=r, prompt_token_ids=p) for r, p in zip(ids, prompt)],
               scheduled=[pb.ScheduledRequest(id=r, num_computed_tokens=0, num_new_tokens=context, block_table=tables[r],
                                              sample=True) for r in ids])
    computed = dict.fromkeys(ids, context)
    times = []
    # Mirrored: each request's host copy starts as slot 0; a step's written block goes to a spare
    # (slot 1's blocks), which then stands for it, and the block it replaces becomes a spare
    # after the step (the step's copy in reads it).
    home = [list(h[0]) for h in hosts]
    spares = [collections.deque(h[1]) for h in hosts]
    for index in range(num_steps):
        ins, outs, replaced = [], [], []
        for j, r in enumerate(ids[:rotating]):
            if not mirrored:
                if index:  # the first step only sends it out
                    ins.append(steps.transfer(hosts[j][(index + 1) % 2], tables[r]))
                outs.append(steps.transfer(tables[r], hosts[j][index % 2]))
                continue
            if index:
                ins.append(steps.transfer(home[j], tables[r]))
                written = computed[r] // block_size
                spare = spares[j].popleft()
                outs.append(steps.transfer([tables[r][written]], [spare]))
                replaced.append((j, home[j][written]))
                home[j][written] = spare
            else:
                outs.append(steps.transfer(tables[r], home[j]))
        scheduled = [pb.ScheduledRequest(id=r, num_computed_tokens=computed[r], num_new_tokens=1, block_table=tables[r],
                                         sample=True) for r in ids]
        start = time.perf_counter()
        reply = steps.step(scheduled=scheduled, rotate_in=ins, rotate_out=outs)
        times.append(time.perf_counter() - start)
        missing = {t.id for t in outs} - set(reply.completed_transfers)
        if missing:
            raise RuntimeError(f"copies out after the compute not acknowledged in their step: {sorted(missing)}")
        for r in ids:
            computed[r] += 1
        for j, block in replaced:
            spares[j].append(block)
    steps.step(forget=ids)
    return statistics.median(times[2:])


def run(args: argparse.Namespace) -> dict:
    executor, _ = warmed_shard(args, host_kv_blocks=HOST_BLOCKS)
    block_size = executor.runner.block_size
    blocks = -(-(args.context_tokens + args.steps + 1) // block_size)
    if args.requests * blocks > args.device_kv_blocks or 2 * max(args.rotating) * blocks > HOST_BLOCKS:
        raise SystemExit(f"{args.requests} requests of {blocks} blocks do not fit the pools; lower --context-tokens")
    steps = _Steps(executor)
    figures = {k: {f"{kind}_s": [] for kind in KINDS} for k in args.rotating}
    for round_index in range(args.rounds + 1):
        for k in args.rotating:
            shift = round_index % len(KINDS)
            for kind in KINDS[shift:] + KINDS[:shift]:
                seconds = run_once(steps, args.requests, 0 if kind == "plain" else k, args.context_tokens, block_size,
                                   args.steps, mirrored=kind == "mirrored")
                if round_index:  # the first round is a warm-up
                    figures[k][f"{kind}_s"].append(seconds)
    rows = []
    bytes_per_request = blocks * executor.runner.geometry.block_bytes
    for k, f in figures.items():
        row = {"rotating": k, "plain_ms": 1e3 * statistics.median(f["plain_s"])}
        for kind, label in (("rotating", ""), ("mirrored", "mirrored_")):
            per_rotation = [(r - p) / k for r, p in zip(f[f"{kind}_s"], f["plain_s"])]
            row.update({f"{kind}_ms": 1e3 * statistics.median(f[f"{kind}_s"]),
                        f"per_rotation_{label}ms": 1e3 * statistics.median(per_rotation),
                        f"per_rotation_{label}range_ms": [1e3 * min(per_rotation), 1e3 * max(per_rotation)]})
        rows.append(row)
    return {"model": args.model, "requests": args.requests, "context_tokens": args.context_tokens,
            "bytes_per_rotated_request": bytes_per_request, "steps": args.steps, "rounds": args.rounds, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_shard_arguments(parser, rounds=5)
    parser.set_defaults(device_kv_blocks=64)  # room for every request's blocks at 128-token contexts
    parser.add_argument("--requests", type=int, default=4, help="decodes per step")
    parser.add_argument("--rotating", type=int, nargs="+", default=[1, 2], help="of them, rotating every step")
    parser.add_argument("--steps", type=int, default=20, help="decode steps per run")
    args = parser.parse_args(argv)
    if any(k < 1 or k > args.requests for k in args.rotating):
        parser.error("--rotating takes counts between 1 and --requests")
    result = run(args)
    print(f"{args.requests} decodes per step over {args.context_tokens}-token contexts "
          f"({result['bytes_per_rotated_request'] / 2**20:.1f} MiB of KV per request), median Step time")
    print("rotating  plain ms  rotating ms  per rotation ms, median [range]  mirrored ms  per rotation ms, median [range]")
    for row in result["rows"]:
        low, high = row["per_rotation_range_ms"]
        m_low, m_high = row["per_rotation_mirrored_range_ms"]
        print(f"{row['rotating']:>8}  {row['plain_ms']:8.1f}  {row['rotating_ms']:11.1f}  "
              f"{row['per_rotation_ms']:6.2f} [{low:.2f}–{high:.2f}]{'':>14}{row['mirrored_ms']:11.1f}  "
              f"{row['per_rotation_mirrored_ms']:6.2f} [{m_low:.2f}–{m_high:.2f}]")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
