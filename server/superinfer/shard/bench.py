"""Benchmark of the shard's model runner (not a test): decode throughput at batch 1, 8 and 32
with 512-token contexts against transformers' `generate` on the same model with static batches
of the same size, measured in the same run; prefill throughput of 512-token prompts; the share
of Step time spent outside the model forward. Prints JSON. On the CPU in float32; with
`--device cuda` in bfloat16 on the GPU (both sides).

    python -m superinfer.shard.bench [--model default] [--batches 1 8 32] [--decode-steps 16]
                                     [--device cpu|cuda]"""
import argparse
import json
import os
import pathlib
import sys
import time

import torch

from ..pb import shard_pb2 as pb
from .cli import build_executor
from .config import ShardConfig
from .warmup import sync_device

CONTEXT = 512


class _TokenClock:
    """A generate() streamer that timestamps every step (the first call carries the prompt)."""

    def __init__(self):
        self.times: list[float] = []

    def put(self, _value) -> None:
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


def _prompts(batch: int, vocab: int, seed: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(10, vocab, (batch, CONTEXT), generator=generator).tolist()


def _rates(batch: int, step_seconds: list[float]) -> dict:
    """Tokens/s over all steps and at the fastest step. Other processes on a shared machine
    only ever slow a step down, so the fastest step is the figure least disturbed by them."""
    return {"tokens_per_s": batch * len(step_seconds) / sum(step_seconds), "best_tokens_per_s": batch / min(step_seconds)}


def _transformers_decode(model, prompts: list[list[int]], steps: int) -> dict:
    """Decode throughput of generate() with a static batch (prefill excluded). On a GPU,
    generate's per-step stopping check reads the tokens back, so each step is synchronized."""
    clock = _TokenClock()
    inputs = torch.tensor(prompts, device=model.device)
    with torch.inference_mode():
        model.generate(inputs, attention_mask=torch.ones_like(inputs), max_new_tokens=steps + 1,
                       min_new_tokens=steps + 1, do_sample=False, streamer=clock, pad_token_id=0)
    # times[0]: prompt echoed; times[1]: first token (after prefill); the rest: one per decode.
    decode = clock.times[1:]
    return _rates(len(prompts), [after - before for before, after in zip(decode, decode[1:])])


def _transformers_prefill(model, prompt: list[int], repeats: int) -> float:
    inputs = torch.tensor([prompt], device=model.device)
    with torch.inference_mode():
        model(inputs)  # first call pays one-off costs
        best = float("inf")
        for _ in range(repeats):
            sync_device(model.device)
            start = time.perf_counter()
            model(inputs)
            sync_device(model.device)
            best = min(best, time.perf_counter() - start)
    return len(prompt) / best


class _ShardDriver:
    """Feeds Steps to the executor the way the router would, one block range per request."""

    def __init__(self, executor):
        self.executor = executor
        self.step_id = 0
        self.next_id = 1
        self.blocks_per_request = -(-(CONTEXT + 64) // executor.runner.block_size)

    def step(self, **fields) -> pb.StepResponse:
        self.step_id += 1
        return self.executor.step(pb.StepRequest(step_id=self.step_id, **fields))

    def prefill(self, prompts: list[list[int]], chunk_tokens: int) -> list[tuple[int, list[int], int]]:
        """Registers and prefills the prompts; returns (id, block table, known length) each."""
        live = []
        for index, prompt in enumerate(prompts):
            blocks = list(range(index * self.blocks_per_request, (index + 1) * self.blocks_per_request))
            rid, self.next_id = self.next_id, self.next_id + 1
            new = [pb.NewRequest(id=rid, prompt_token_ids=prompt)]
            for start in range(0, len(prompt), chunk_tokens):
                count = min(chunk_tokens, len(prompt) - start)
                self.step(new_requests=new, scheduled=[pb.ScheduledRequest(
                    id=rid, num_computed_tokens=start, num_new_tokens=count, block_table=blocks,
                    sample=start + count == len(prompt))])
                new = []
            live.append((rid, blocks, len(prompt) + 1))
        return live

    def decode(self, live, steps: int) -> dict:
        replies, seconds = [], []
        for step in range(steps):
            started = time.perf_counter()
            scheduled = [pb.ScheduledRequest(id=rid, num_computed_tokens=known + step - 1, num_new_tokens=1,
                                             block_table=blocks, sample=True) for rid, blocks, known in live]
            replies.append(self.step(scheduled=scheduled))
            seconds.append(time.perf_counter() - started)
        total = sum(r.timings.total_ns for r in replies)
        forward = sum(r.timings.forward_ns for r in replies)
        return {
            **_rates(len(live), seconds),
            "step_ms": 1e3 * sum(seconds) / steps,
            "outside_forward_share": 1 - forward / total,
            "sampling_share": sum(r.timings.sampling_ns for r in replies) / total,
        }

    def forget(self, live) -> None:
        self.step(forget=[rid for rid, _, _ in live])


def _shard_prefill(driver: _ShardDriver, prompt: list[int], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats + 1):  # the first run pays one-off costs
        start = time.perf_counter()
        live = driver.prefill([prompt], CONTEXT)
        best = min(best, time.perf_counter() - start)
        driver.forget(live)
    return len(prompt) / best


def run_benchmark(args: argparse.Namespace) -> dict:
    from transformers import AutoModelForCausalLM

    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    config = ShardConfig(model=args.model, cache_dir=args.cache_dir, device=device, dtype=dtype,
                         device_kv_blocks=max(args.batches) * (-(-(CONTEXT + 64) // 16)), host_kv_blocks=0,
                         warmup_repeats=1)
    executor = build_executor(config)
    executor.warmup(pb.WarmupRequest(max_batch_tokens=CONTEXT, max_batch_requests=max(args.batches)))
    reference = AutoModelForCausalLM.from_pretrained(_model_dir(args), dtype=dtype).to(device).eval()
    vocab = executor.runner.config.vocab_size
    driver = _ShardDriver(executor)
    results: dict = {"model": args.model, "device": str(device), "dtype": str(dtype).removeprefix("torch."),
                     "context_tokens": CONTEXT, "decode_steps": args.decode_steps,
                     "threads": torch.get_num_threads(), "decode": {}}
    if device.type == "cuda":
        results["gpu"] = torch.cuda.get_device_name(device)
    for batch in args.batches:
        prompts = _prompts(batch, vocab, seed=batch)
        live = driver.prefill(prompts, CONTEXT)
        ours = driver.decode(live, args.decode_steps)
        driver.forget(live)
        theirs = _transformers_decode(reference, prompts, args.decode_steps)
        results["decode"][str(batch)] = {
            "shard": ours, "transformers": theirs,
            "ratio": ours["tokens_per_s"] / theirs["tokens_per_s"],
            "best_ratio": ours["best_tokens_per_s"] / theirs["best_tokens_per_s"],
        }
        print(f"batch {batch}: shard {ours['tokens_per_s']:.1f} (best {ours['best_tokens_per_s']:.1f}) tok/s, "
              f"transformers {theirs['tokens_per_s']:.1f} (best {theirs['best_tokens_per_s']:.1f}) tok/s", file=sys.stderr)
    prompt = _prompts(1, vocab, seed=99)[0]
    ours_prefill = _shard_prefill(driver, prompt, args.repeats)
    theirs_prefill = _transformers_prefill(reference, prompt, args.repeats)
    results["prefill_512"] = {"shard_tokens_per_s": ours_prefill, "transformers_tokens_per_s": theirs_prefill,
                              "ratio": ours_prefill / theirs_prefill}
    decode = results["decode"]
    largest, smallest = str(max(args.batches)), str(min(args.batches))
    results["targets"] = {
        f"batch{largest}_vs_transformers_batch{largest}": decode[largest]["ratio"],
        f"batch{largest}_vs_transformers_batch{largest}_best_step": decode[largest]["best_ratio"],
        f"batch{largest}_vs_transformers_batch{smallest}":
            decode[largest]["shard"]["tokens_per_s"] / decode[smallest]["transformers"]["tokens_per_s"],
        f"outside_forward_share_batch{largest}": decode[largest]["shard"]["outside_forward_share"],
    }
    return results


def _model_dir(args: argparse.Namespace) -> pathlib.Path:
    from .model_source import resolve_model

    return resolve_model(args.model, args.cache_dir).directory


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="default")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--decode-steps", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--device", default="cpu", help="cpu (float32) or cuda (bfloat16)")
    parser.add_argument("--cache-dir", type=pathlib.Path,
                        default=pathlib.Path(os.environ.get("SUPERINFER_CACHE", pathlib.Path.home() / ".cache" / "superinfer")))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads or os.cpu_count() or 1)
    print(json.dumps(run_benchmark(args), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
