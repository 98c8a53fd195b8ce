"""What serving LoRA adapters costs a decode step, in one run: a batch of decodes (32 by
default) through the model runner with every request on the base model, then with the requests
spread over 4 adapters (of ranks 8, 16, 32 and 64 on all seven projections), the adapters'
requests either interleaved in the batch (each adapter's rows gathered and scatter-added) or
grouped (each adapter's rows contiguous, sliced); and the base model loaded without adapters.

The adapters are random, written in PEFT's format into a temporary directory and loaded as
`--lora-adapters` loads them. The model is the embedded SmolLM2-135M by default. Method: a
warm-up round, then --rounds rounds over the variants (their order rotating), each sample the
mean of --iters steps (forward and LM head over the sampled rows); reported per variant: the
median step time, and the ratio of each LoRA variant to the base model in the same runner.
Prints JSON.

  python -m superinfer.shard.lora_bench
  python -m superinfer.shard.lora_bench --device cuda --batch 64 --context 1024"""
import argparse
import json
import pathlib
import statistics
import sys
import tempfile
import time

import torch
from safetensors.torch import save_file

from .batch import Chunk
from .config import LoraAdapterSpec
from .hub import HubOptions
from .lora import CONFIG_FILE, WEIGHTS_FILE, load_adapters
from .model_runner import ModelRunner

_MODULES = {"self_attn": ("q_proj", "k_proj", "v_proj", "o_proj"), "mlp": ("gate_proj", "up_proj", "down_proj")}


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="default", help="as `superinfer serve --model` takes it")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch", type=int, default=32, help="decodes per step")
    parser.add_argument("--context", type=int, default=256, help="tokens before each decode")
    parser.add_argument("--ranks", type=int, nargs="+", default=[8, 16, 32, 64], help="one adapter per rank")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--iters", type=int, default=10, help="steps per timed sample")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    args = parser.parse_args(argv)
    if min(args.batch, args.context, args.rounds, args.iters, *args.ranks) < 1:
        parser.error("--batch, --context, --rounds, --iters and --ranks must be positive")
    return args


def write_adapter(directory: pathlib.Path, config, rank: int, seed: int) -> None:
    """A random LoRA adapter of `rank` on every projection of `config`'s model, in PEFT's format."""
    generator = torch.Generator().manual_seed(seed)
    q_size, kv_size = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    shapes = {"q_proj": (config.hidden_size, q_size), "k_proj": (config.hidden_size, kv_size),
              "v_proj": (config.hidden_size, kv_size), "o_proj": (q_size, config.hidden_size),
              "gate_proj": (config.hidden_size, config.intermediate_size),
              "up_proj": (config.hidden_size, config.intermediate_size),
              "down_proj": (config.intermediate_size, config.hidden_size)}
    tensors = {}
    for layer in range(config.num_layers):
        for owner, modules in _MODULES.items():
            for module in modules:
                in_features, out_features = shapes[module]
                prefix = f"base_model.model.model.layers.{layer}.{owner}.{module}"
                tensors[f"{prefix}.lora_A.weight"] = torch.randn(rank, in_features, generator=generator) * 0.01
                tensors[f"{prefix}.lora_B.weight"] = torch.randn(out_features, rank, generator=generator) * 0.01
    directory.mkdir(parents=True)
    save_file(tensors, directory / WEIGHTS_FILE)
    targets = [module for modules in _MODULES.values() for module in modules]
    (directory / CONFIG_FILE).write_text(json.dumps(
        {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": targets, "bias": "none"}))


def _sample(runner: ModelRunner, chunks: list[Chunk], iters: int) -> float:
    """Seconds per step: the mean of `iters` steps between two synchronisations."""
    cuda = runner.device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(runner.device)
    started = time.perf_counter()
    for _ in range(iters):
        hidden, _ = runner.forward(chunks)
        runner.logits(hidden)
    if cuda:
        torch.cuda.synchronize(runner.device)
    return (time.perf_counter() - started) / iters


def _runners(args: argparse.Namespace, work: pathlib.Path) -> tuple[ModelRunner, ModelRunner, int]:
    """The runner with the adapters, the runner without, and the blocks each request holds."""
    from .cli import cache_dir
    from .loader import load_model
    from .model_source import resolve_model

    device = torch.device(args.device)
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    source = resolve_model(args.model, cache_dir(None))
    blocks_each = -(-(args.context + 1) // 16)
    runners = []
    for with_adapters in (True, False):
        loaded = load_model(source, dtype, device)
        if with_adapters:
            for slot, rank in enumerate(args.ranks, start=1):
                write_adapter(work / f"rank{rank}", loaded.config, rank, seed=slot)
            specs = tuple(LoraAdapterSpec(f"rank{rank}", str(work / f"rank{rank}")) for rank in args.ranks)
            loaded = load_adapters(loaded, specs, HubOptions(offline=True))
        runner = ModelRunner(loaded, device, dtype, 16)
        runner.allocate(args.batch * blocks_each, 0)
        runners.append(runner)
    return runners[0], runners[1], blocks_each


def main(argv: list[str] | None = None) -> None:
    args = _parse(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="lora-bench-") as work:
        adapted, plain, blocks_each = _runners(args, pathlib.Path(work))
        tables = [list(range(i * blocks_each, (i + 1) * blocks_each)) for i in range(args.batch)]
        count = len(args.ranks)

        def decodes(slot_of) -> list[Chunk]:
            return [Chunk([7], args.context, table, slot_of(i)) for i, table in enumerate(tables)]

        per_adapter = -(-args.batch // count)
        variants = {
            "base": (adapted, decodes(lambda i: 0)),
            "lora_interleaved": (adapted, decodes(lambda i: 1 + i % count)),
            "lora_grouped": (adapted, decodes(lambda i: 1 + i // per_adapter)),
            "base_without_adapters_loaded": (plain, decodes(lambda i: 0)),
        }
        names = list(variants)
        times: dict[str, list[float]] = {name: [] for name in names}
        for round_index in range(args.rounds + 1):  # round 0 warms up and is dropped
            shift = round_index % len(names)
            for name in names[shift:] + names[:shift]:
                runner, chunks = variants[name]
                sample = _sample(runner, chunks, args.iters)
                if round_index:
                    times[name].append(sample)
    medians = {name: statistics.median(samples) for name, samples in times.items()}
    report = {
        "model": args.model, "device": args.device, "threads": torch.get_num_threads(),
        "batch": args.batch, "context": args.context, "adapter_ranks": args.ranks,
        "method": {"rounds": args.rounds, "iters": args.iters, "warmup_rounds": 1},
        "median_step_ms": {name: value * 1e3 for name, value in medians.items()},
        "ratio_to_base": {name: medians[name] / medians["base"] for name in names if name != "base"},
    }
    json.dump(report, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
