"""Benchmark of tensor parallelism (not a test): decode step time with N ranks (gloo on the
CPU, NCCL on GPUs) at the given batch sizes, each request with a `--context-tokens` context,
and the shares of the step spent inside the model's collectives (the all-reduces and the
logits' gather: communication plus waiting for the slowest rank) and in rank 0's broadcast of
the step to the other ranks, and (CPU) what one step's collectives cost alone, every rank
entering them together. Steps go to rank 0's executor as the router sends them (no gRPC);
with `--num-shard 1` there is no process group. Prints JSON.

    python -m superinfer.shard.tp_bench [--model default|DIR] [--num-shard 2] [--batches 1 32]
                                        [--context-tokens 256] [--decode-steps 8]
    python -m superinfer.shard.tp_bench --random-llama DIR ...   # SmolLM2-135M's size, 8/4 heads

SmolLM2-135M's 9 heads split over 3 ranks, not 2; `--random-llama` writes a random-weight Llama
of the same size and shapes but 8 heads and 4 KV heads (head_dim 72), which splits over 2."""
import argparse
import json
import os
import pathlib
import socket
import time

import torch
import torch.multiprocessing as mp

from ..pb import shard_pb2 as pb
from .throughput_bench import _ShardDriver
from .config import ParallelConfig, ShardConfig


def write_random_llama(directory: pathlib.Path) -> pathlib.Path:
    """A random Llama with SmolLM2-135M's width, depth and vocabulary, 8 heads / 4 KV heads."""
    import transformers

    if (directory / "config.json").is_file():
        return directory
    config = transformers.LlamaConfig(
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=8,
        num_key_value_heads=4, max_position_embeddings=8192, tie_word_embeddings=True, bos_token_id=1,
        eos_token_id=2)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(directory)
    # A word-level tokenizer ("t0", "t1", ...): the benchmark sends token ids, never text.
    tokenizer = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
                 "pre_tokenizer": {"type": "Whitespace"}, "post_processor": None, "decoder": None,
                 "model": {"type": "WordLevel", "vocab": {f"t{i}": i for i in range(config.vocab_size)},
                           "unk_token": "t0"}}
    (directory / "tokenizer.json").write_text(json.dumps(tokenizer))
    return directory


def _measure(executor, group, args: argparse.Namespace) -> dict:
    """Rank 0: warms up, then per batch size prefills and times decode steps."""
    executor.warmup(pb.WarmupRequest(max_batch_tokens=args.context_tokens, max_batch_requests=max(args.batches)))
    vocab = executor.runner.config.vocab_size
    results = {}
    for batch in args.batches:
        driver = _ShardDriver(executor, args.context_tokens, args.decode_steps + 1)
        prompts = [[(7 * b + 13 * i) % (vocab - 3) + 3 for i in range(args.context_tokens)] for b in range(batch)]
        live = driver.prefill(prompts, args.context_tokens)
        driver.decode(live, 1)  # the first decode after a prefill pays one-off costs
        collective, command = _counters(group)
        figures = driver.decode([(rid, blocks, known + 1) for rid, blocks, known in live], args.decode_steps)
        collective_after, command_after = _counters(group)
        step_ns = figures["step_ms"] * 1e6 * args.decode_steps
        results[f"batch_{batch}"] = {
            "step_ms": round(figures["step_ms"], 2),
            "tokens_per_s": round(figures["tokens_per_s"], 1),
            "collective_share": round((collective_after - collective) / step_ns, 3),
            "broadcast_ms_per_step": round((command_after - command) / 1e6 / args.decode_steps, 3),
        }
        driver.forget(live)
    return results


def _collectives_alone(group, model_dir: str, batches: list[int], repeats: int = 5) -> dict:
    """Every rank: one decode step's collectives back to back (2 all-reduces per layer and the
    embedding's of [B, hidden], the logits' gather of [B, vocab / N]), all ranks entering
    together: their cost without the wait for a slower rank."""
    import torch.distributed as dist

    from ..models.tensor_parallel import partition
    from .loader import read_config

    config = read_config(pathlib.Path(model_dir))
    vocab_rows = partition(config, group.rank, group.world_size).vocab_rows
    figures = {}
    for batch in batches:
        hidden, logits = torch.zeros(batch, config.hidden_size), torch.zeros(batch, vocab_rows)
        dist.barrier()
        started = time.perf_counter()
        for _ in range(repeats):
            for _ in range(2 * config.num_layers + 1):
                group.tensor_parallel.all_reduce(hidden)
            group.tensor_parallel.gather_last_dim(logits)
        figures[f"batch_{batch}"] = round((time.perf_counter() - started) * 1e3 / repeats, 2)
    return figures


def _counters(group) -> tuple[int, int]:
    if group is None:
        return 0, 0
    return group.tensor_parallel.collective_ns, group.command_ns


def _rank(rank: int, args: argparse.Namespace, port: int, out: str | None) -> None:
    from .cli import build_executor
    from .follower import follow
    from .rank_group import RankGroup

    torch.set_num_threads(args.threads or max(1, (os.cpu_count() or 1) // args.num_shard))
    torch.set_num_interop_threads(1)
    device = torch.device(args.device if args.num_shard == 1 or args.device == "cpu" else f"cuda:{rank}")
    parallel = ParallelConfig(rank, args.num_shard, "127.0.0.1", port)
    config = ShardConfig(model=str(args.model), cache_dir=args.cache_dir, device=device,
                         dtype=torch.float32 if device.type == "cpu" else torch.bfloat16,
                         device_kv_blocks=max(args.batches) * (-(-(args.context_tokens + args.decode_steps + 2) // 16)),
                         host_kv_blocks=0, warmup_repeats=1, parallel=parallel)
    group = RankGroup(parallel, device) if parallel.enabled else None
    alone = _collectives_alone(group, str(args.model), args.batches) if group is not None and device.type == "cpu" else {}
    executor = build_executor(config, group)
    if group is not None:
        group.wait_for_all()
    if rank > 0:
        follow(executor, group)
        return
    results = _measure(executor, group, args)
    for batch, milliseconds in alone.items():
        results[batch]["collectives_alone_ms_per_step"] = milliseconds
    executor.close()
    pathlib.Path(out).write_text(json.dumps(results))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_benchmark(args: argparse.Namespace) -> dict:
    out = pathlib.Path(args.cache_dir) / f"tp_bench-{os.getpid()}.json"
    started = time.perf_counter()
    mp.spawn(_rank, args=(args, _free_port(), str(out)), nprocs=args.num_shard, join=True)
    results = json.loads(out.read_text())
    out.unlink()
    return {"model": str(args.model), "num_shard": args.num_shard, "device": args.device,
            "threads_per_rank": args.threads or max(1, (os.cpu_count() or 1) // args.num_shard),
            "context_tokens": args.context_tokens, "decode_steps": args.decode_steps, **results,
            "wall_s": round(time.perf_counter() - started, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="default")
    parser.add_argument("--random-llama", type=pathlib.Path, default=None,
                        help="write (once) and use a random Llama of SmolLM2-135M's size with 8 heads / 4 KV heads")
    parser.add_argument("--num-shard", type=int, default=2)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--context-tokens", type=int, default=256)
    parser.add_argument("--decode-steps", type=int, default=8)
    parser.add_argument("--threads", type=int, default=None, help="per rank (default: the cores shared out)")
    parser.add_argument("--device", default="cpu", help="cpu (float32, gloo) or cuda (bfloat16, NCCL, cuda:0..N-1)")
    parser.add_argument("--cache-dir", type=pathlib.Path,
                        default=pathlib.Path(os.environ.get("SUPERINFER_CACHE", pathlib.Path.home() / ".cache" / "superinfer")))
    args = parser.parse_args(argv)
    if args.random_llama is not None:
        args.model = str(write_random_llama(args.random_llama))
    print(json.dumps(run_benchmark(args), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
