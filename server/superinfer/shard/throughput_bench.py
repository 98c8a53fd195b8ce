"""Benchmark of the shard's model runner (not a test): decode throughput at batch 1, 8 and 32
with 512-token contexts against transformers' `generate` on the same model with static batches
of the same size; prefill throughput of a 512-token prompt against one transformers forward that
also computes the last position's logits only; the share of Step time spent outside the model
forward. On the CPU in float32; with `--device cuda` in bfloat16 on the GPU (both sides), where
it also reports the decode graphs' capture time and memory, each batch's step against the HBM
roofline (weights plus K/V read per step over the copy bandwidth measured in the same run), and
the share of the decode steps' wall time the GPU runs no kernel (torch profiler), with the
steps one after the other and as one step in flight runs them (step N+1 launched before N is
finished).

Like for like: both sides are warmed up with one unmeasured pair first, then run in `--pairs`
interleaved pairs (the order alternating, shard first in even pairs, transformers first in odd
ones), and each ratio is the median of the per-pair ratios, reported with its range. Each side's
throughput is its median over the pairs; the fastest single step ("best") is a secondary figure,
labelled as such. Prints JSON.

    python -m superinfer.shard.throughput_bench [--model default] [--batches 1 8 32] [--decode-steps 16]
                                     [--pairs 5] [--device cpu|cuda] [--cuda-graphs 0|1,2,4,...]
                                     [--attention-backend auto|triton|sdpa]"""
import argparse
import json
import os
import pathlib
import statistics
import sys
import time

import torch

from ..pb import shard_pb2 as pb
from .cli import ATTENTION_BACKENDS, attention_backend, build_executor
from .config import ShardConfig, parse_cuda_graphs
from .warmup import sync_device

# Default context length of every request (prompt tokens before decoding).
CONTEXT = 512


class _TokenClock:
    """A generate() streamer that timestamps every step (the first call carries the prompt)."""

    def __init__(self):
        self.times: list[float] = []

    def put(self, _value) -> None:
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


def _prompts(batch: int, vocab: int, seed: int, context: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(10, vocab, (batch, context), generator=generator).tolist()


def _rates(batch: int, step_seconds: list[float]) -> dict:
    """Tokens/s over all steps, and (secondary) at the fastest step."""
    return {"tokens_per_s": batch * len(step_seconds) / sum(step_seconds), "best_tokens_per_s": batch / min(step_seconds)}


def spread(values: list[float]) -> dict:
    """Median and range of a figure over the pairs, with the values."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "values": values}


def interleave(run_ours, run_theirs, pairs: int) -> list[tuple]:
    """One unmeasured warm-up pair, then `pairs` measured ones with the order alternating (ours
    first in even pairs); returns [(ours, theirs)] of the measured pairs."""
    if pairs < 1:
        raise ValueError(f"--pairs must be at least 1, got {pairs}")
    run_ours(), run_theirs()
    results = []
    for index in range(pairs):
        if index % 2 == 0:
            ours = run_ours()
            theirs = run_theirs()
        else:
            theirs = run_theirs()
            ours = run_ours()
        results.append((ours, theirs))
    return results


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


def _transformers_prefill(model, prompt: list[int]) -> float:
    """Tokens/s of one forward over the prompt computing the last position's logits only, as
    the shard does for a prompt it samples from."""
    inputs = torch.tensor([prompt], device=model.device)
    with torch.inference_mode():
        sync_device(model.device)
        start = time.perf_counter()
        model(inputs, logits_to_keep=1)
        sync_device(model.device)
    return len(prompt) / (time.perf_counter() - start)


class _ShardDriver:
    """Feeds Steps to the executor the way the router would, one block range per request."""

    def __init__(self, executor, context: int, decode_steps: int):
        self.executor = executor
        self.step_id = 0
        self.next_id = 1
        self.blocks_per_request = -(-(context + decode_steps + 1) // executor.runner.block_size)

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

    def decode_ahead(self, live, steps: int) -> dict:
        """The decode steps as the router sends them with one step in flight (each naming the
        one before, its inputs fed from the shard) and as the servicer runs them: step N+1
        launched before N is finished whenever the executor allows (`can_run_ahead`)."""
        executor, launched, replies = self.executor, None, []
        started = time.perf_counter()
        for step in range(steps):
            self.step_id += 1
            request = pb.StepRequest(step_id=self.step_id, previous_step_id=self.step_id - 1 if step else 0, scheduled=[
                pb.ScheduledRequest(id=rid, num_computed_tokens=known + step - 1, num_new_tokens=1, block_table=blocks,
                                    sample=True, input_from_shard=step > 0) for rid, blocks, known in live])
            if launched is not None and not executor.can_run_ahead(launched, request):
                replies.append(executor.finish(launched))
                launched = None
            following = executor.launch(request)
            if launched is not None:
                replies.append(executor.finish(launched))
            launched = following
        replies.append(executor.finish(launched))
        seconds = time.perf_counter() - started
        return {"tokens_per_s": len(live) * steps / seconds, "step_ms": 1e3 * seconds / steps}

    def forget(self, live) -> None:
        self.step(forget=[rid for rid, _, _ in live])


def _shard_prefill(driver: _ShardDriver, prompt: list[int]) -> float:
    sync_device(driver.executor.runner.device)
    start = time.perf_counter()
    live = driver.prefill([prompt], len(prompt))
    seconds = time.perf_counter() - start
    driver.forget(live)
    return len(prompt) / seconds


def _shard_decode(driver: _ShardDriver, prompts: list[list[int]], steps: int) -> dict:
    live = driver.prefill(prompts, len(prompts[0]))
    measured = driver.decode(live, steps)
    driver.forget(live)
    return measured


def _decode_figures(pairs: list[tuple[dict, dict]]) -> dict:
    ours, theirs = [p[0] for p in pairs], [p[1] for p in pairs]
    return {
        "ratio": spread([a["tokens_per_s"] / b["tokens_per_s"] for a, b in pairs]),
        "shard_tokens_per_s": spread([a["tokens_per_s"] for a in ours]),
        "transformers_tokens_per_s": spread([b["tokens_per_s"] for b in theirs]),
        "outside_forward_share": spread([a["outside_forward_share"] for a in ours]),
        "sampling_share": spread([a["sampling_share"] for a in ours]),
        "step_ms": spread([a["step_ms"] for a in ours]),
        "secondary_best_step": {
            "shard_tokens_per_s": max(a["best_tokens_per_s"] for a in ours),
            "transformers_tokens_per_s": max(b["best_tokens_per_s"] for b in theirs),
            "ratio": max(a["best_tokens_per_s"] for a in ours) / max(b["best_tokens_per_s"] for b in theirs),
        },
    }


def copy_bandwidth(device: torch.device, nbytes: int = 1 << 30, repeats: int = 5) -> float:
    """Bytes per second a device-to-device copy moves (read plus write), median of `repeats`:
    the roofline's bandwidth, measured in the same run."""
    source = torch.empty(nbytes, dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    target.copy_(source)
    times = []
    for _ in range(repeats):
        sync_device(device)
        start = time.perf_counter()
        target.copy_(source)
        sync_device(device)
        times.append(time.perf_counter() - start)
    return 2 * nbytes / statistics.median(times)


def roofline(executor, batch: int, context: int, decode_steps: int, step_s: float, bandwidth: float) -> dict:
    """A decode step reads every weight once and each request's K/V: its bytes over the copy
    bandwidth is the fastest the step can be; `achieved` is that time over the measured step."""
    model = executor.runner.model
    weights = sum(p.numel() * p.element_size() for p in {id(p): p for p in model.parameters()}.values())
    geometry = executor.runner.geometry
    kv_per_token = geometry.block_bytes // geometry.block_size
    mean_context = context + decode_steps / 2
    step_bytes = weights + batch * mean_context * kv_per_token
    fastest = step_bytes / bandwidth
    return {"weight_bytes": weights, "kv_bytes": int(batch * mean_context * kv_per_token),
            "copy_bandwidth_bytes_per_s": bandwidth, "roofline_step_ms": 1e3 * fastest,
            "measured_step_ms": 1e3 * step_s, "achieved": fastest / step_s}


def gpu_idle_share(driver: "_ShardDriver", prompts: list[list[int]], steps: int, ahead: bool = False) -> dict:
    """Share of the wall time of `steps` decode steps in which the GPU runs no kernel: one
    minus the kernels' summed device time (torch profiler, one stream) over the steps' wall
    time. The profiler's own host cost makes this an upper bound. `ahead`: the steps as one
    step in flight runs them (`_ShardDriver.decode_ahead`)."""
    from torch.profiler import ProfilerActivity, profile

    live = driver.prefill(prompts, len(prompts[0]))
    device = driver.executor.runner.device
    sync_device(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        (driver.decode_ahead if ahead else driver.decode)(live, steps)
        sync_device(device)
        wall = time.perf_counter() - start
    driver.forget(live)
    busy_us = sum(getattr(event, "self_device_time_total", 0) or getattr(event, "self_cuda_time_total", 0)
                  for event in prof.key_averages())
    return {"wall_ms": 1e3 * wall, "kernel_ms": busy_us / 1e3, "idle_share": max(0.0, 1 - busy_us / 1e6 / wall)}


def run_benchmark(args: argparse.Namespace) -> dict:
    from transformers import AutoModelForCausalLM

    device = torch.device(args.device)
    context = args.context_tokens
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    config = ShardConfig(model=args.model, cache_dir=args.cache_dir, device=device, dtype=dtype,
                         device_kv_blocks=max(args.batches) * (-(-(context + args.decode_steps + 1) // 16)),
                         host_kv_blocks=0,
                         warmup_repeats=1, cuda_graphs=parse_cuda_graphs(args.cuda_graphs),
                         attention_backend=attention_backend(args.attention_backend))
    executor = build_executor(config)
    executor.warmup(pb.WarmupRequest(max_batch_tokens=context, max_batch_requests=max(args.batches)))
    reference = AutoModelForCausalLM.from_pretrained(_model_dir(args), dtype=dtype).to(device).eval()
    vocab = executor.runner.config.vocab_size
    driver = _ShardDriver(executor, context, args.decode_steps)
    results: dict = {"model": args.model, "device": str(device), "dtype": str(dtype).removeprefix("torch."),
                     "context_tokens": context, "decode_steps": args.decode_steps, "pairs": args.pairs,
                     "method": "interleaved pairs after a warm-up pair, order alternating; ratio = median of "
                               "per-pair ratios [min, max]; best-step figures are secondary",
                     "threads": torch.get_num_threads(), "decode": {}}
    if device.type == "cuda":
        results["gpu"] = torch.cuda.get_device_name(device)
        graphs = executor.graphs
        results["cuda_graphs"] = None if graphs is None else {
            "batch_sizes": list(graphs.batch_sizes), "capture_s": graphs.capture_s, "memory_bytes": graphs.memory_bytes}
        bandwidth = copy_bandwidth(device)
        results["roofline"], results["gpu_idle"], results["gpu_idle_ahead"] = {}, {}, {}
    for batch in args.batches:
        prompts = _prompts(batch, vocab, seed=batch, context=context)
        pairs = interleave(lambda: _shard_decode(driver, prompts, args.decode_steps),
                           lambda: _transformers_decode(reference, prompts, args.decode_steps), args.pairs)
        figures = results["decode"][str(batch)] = _decode_figures(pairs)
        ratio = figures["ratio"]
        if device.type == "cuda":
            results["roofline"][str(batch)] = roofline(executor, batch, context, args.decode_steps,
                                                       figures["step_ms"]["median"] / 1e3, bandwidth)
            results["gpu_idle"][str(batch)] = gpu_idle_share(driver, prompts, args.decode_steps)
            results["gpu_idle_ahead"][str(batch)] = gpu_idle_share(driver, prompts, args.decode_steps, ahead=True)
        print(f"batch {batch}: shard {figures['shard_tokens_per_s']['median']:.1f} tok/s, transformers "
              f"{figures['transformers_tokens_per_s']['median']:.1f} tok/s, ratio {ratio['median']:.2f} "
              f"[{ratio['min']:.2f}-{ratio['max']:.2f}]", file=sys.stderr)
    prompt = _prompts(1, vocab, seed=99, context=context)[0]
    prefill = interleave(lambda: _shard_prefill(driver, prompt), lambda: _transformers_prefill(reference, prompt),
                         args.pairs)
    results["prefill"] = {
        "ratio": spread([a / b for a, b in prefill]),
        "shard_tokens_per_s": spread([a for a, _ in prefill]),
        "transformers_tokens_per_s": spread([b for _, b in prefill]),
    }
    decode = results["decode"]
    largest, smallest = str(max(args.batches)), str(min(args.batches))
    results["targets"] = {
        f"batch{largest}_vs_transformers_batch{largest}": decode[largest]["ratio"]["median"],
        f"batch{largest}_vs_transformers_batch{smallest}":
            decode[largest]["shard_tokens_per_s"]["median"] / decode[smallest]["transformers_tokens_per_s"]["median"],
        f"outside_forward_share_batch{largest}": decode[largest]["outside_forward_share"]["median"],
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
    parser.add_argument("--context-tokens", type=int, default=CONTEXT, help="prompt tokens of every request")
    parser.add_argument("--pairs", type=int, default=5, help="measured interleaved pairs per figure (after a warm-up pair)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--device", default="cpu", help="cpu (float32) or cuda (bfloat16)")
    parser.add_argument("--attention-backend", choices=ATTENTION_BACKENDS, default="auto",
                        help="as the shard's flag: auto (Triton on a GPU, gather + SDPA on the CPU), triton or sdpa")
    parser.add_argument("--cuda-graphs", default=None, help="as the shard's flag: decode graph batch sizes, 0: none "
                        "(default: the shard's)")
    parser.add_argument("--cache-dir", type=pathlib.Path,
                        default=pathlib.Path(os.environ.get("SUPERINFER_CACHE", pathlib.Path.home() / ".cache" / "superinfer")))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads or os.cpu_count() or 1)
    print(json.dumps(run_benchmark(args), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
