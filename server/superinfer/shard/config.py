"""The shard's typed configuration, parsed once at the CLI edge. Importing it does not import
torch: the launcher reads DEFAULT_BLOCK_SIZE before any shard starts."""
from __future__ import annotations

import pathlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .host_memory import DEFAULT_HOST_KV_MEMORY_FRACTION
from .hub import HubOptions

if TYPE_CHECKING:
    import torch

# Tokens per KV block: the shard's default, which the launcher converts token counts with
# (TGI's --max-batch-total-tokens); the router learns the shard's actual size from Info.
DEFAULT_BLOCK_SIZE = 16

# --attention-backend's choices besides "auto" (`attention_backends` implements each).
ATTENTION_BACKEND_NAMES = ("sdpa", "triton", "flashinfer")


def parse_cuda_graphs(text: str | None) -> tuple[int, ...] | None:
    """TGI's --cuda-graphs: batch sizes separated by commas, "0" for none; None or "auto": the
    shard's default (decided at warm-up from the step's request limit)."""
    if text is None or text.strip().lower() in ("", "auto"):
        return None
    try:
        sizes = [int(part) for part in text.split(",")]
    except ValueError:
        raise ValueError(f"--cuda-graphs must be batch sizes separated by commas, or 0, got {text!r}") from None
    if sizes == [0]:
        return ()
    if any(size < 1 for size in sizes):
        raise ValueError(f"--cuda-graphs batch sizes must be positive (or the single value 0), got {text!r}")
    return tuple(sorted(set(sizes)))


def parse_cpu_list(text: str | None) -> tuple[int, ...] | None:
    """A CPU list as taskset and cpusets write it ("1", "0-3,8"); None or "": none given."""
    if text is None or not text.strip():
        return None
    cpus: set[int] = set()
    try:
        for part in text.split(","):
            first, _, last = part.strip().partition("-")
            low, high = int(first), int(last or first)
            if low < 0 or high < low:
                raise ValueError
            cpus.update(range(low, high + 1))
    except ValueError:
        raise ValueError(f"a CPU list is numbers and ranges separated by commas (e.g. 1 or 0-3,8), got {text!r}") from None
    return tuple(sorted(cpus))


@dataclass(frozen=True)
class LoraAdapterSpec:
    """One adapter of `--lora-adapters`: the id requests name it by, and where it is."""

    adapter_id: str
    # A local directory in PEFT's format (adapter_config.json, adapter_model.safetensors) or a
    # Hugging Face model id.
    source: str


def parse_lora_adapters(text: str | None) -> tuple[LoraAdapterSpec, ...]:
    """TGI's --lora-adapters: entries separated by commas, each `id=path` or a bare path or
    hub id (then also its id); None or "": none."""
    if text is None or not text.strip():
        return ()
    specs: list[LoraAdapterSpec] = []
    for entry in (part.strip() for part in text.split(",")):
        if not entry:
            continue
        adapter_id, separator, source = (part.strip() for part in entry.partition("="))
        if not separator:
            source = adapter_id
        if not adapter_id or not source:
            raise ValueError(f"--lora-adapters entries are id=path or a path, got {entry!r}")
        if any(spec.adapter_id == adapter_id for spec in specs):
            raise ValueError(f"--lora-adapters names the adapter id {adapter_id!r} twice")
        specs.append(LoraAdapterSpec(adapter_id, source))
    return tuple(specs)


@dataclass(frozen=True)
class ParallelConfig:
    """This process's place in a tensor-parallel shard (`--num-shard`); one rank: none."""

    rank: int = 0
    world_size: int = 1
    # The rendezvous: rank 0 listens there (a TCP store), the other ranks connect.
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    # Longest wait in one of the model's collectives (a peer that stopped answering), and for
    # every rank to join at start-up.
    timeout_s: float = 600.0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


@dataclass(frozen=True)
class ShardConfig:
    # "default", a local directory, a .gguf file or a Hugging Face model id.
    model: str
    cache_dir: pathlib.Path
    device: torch.device
    dtype: torch.dtype
    block_size: int = DEFAULT_BLOCK_SIZE
    # CPU: the device pool size. GPU: ignored unless set (then an upper bound).
    device_kv_blocks: int | None = None
    # None: sized at start-up (`cli.with_host_pool_size`: 256 on the CPU, a share of the
    # available host memory on a GPU).
    host_kv_blocks: int | None = 0
    # GPU without host_kv_blocks: the share of the available host memory the host pool takes.
    host_kv_memory_fraction: float = DEFAULT_HOST_KV_MEMORY_FRACTION
    # GPU: share of the free memory (after a worst-case forward) given to the KV pool.
    kv_memory_fraction: float = 0.9
    # Used by Warmup when the router sends 0.
    max_batch_tokens: int = 2048
    # How a model id is found: revision, hub cache, offline, token.
    hub: HubOptions = HubOptions()
    warmup_repeats: int = 2
    # Where Warmup writes what it measured (cost model, pools, geometry) as JSON: the
    # `measured:` profile of the simulator. None: nowhere.
    warmup_report: pathlib.Path | None = None
    parallel: ParallelConfig = ParallelConfig()
    # "triton" (paged kernels) or "sdpa" (gather + SDPA); None: the model runner's choice for
    # the device (triton on a GPU, sdpa on the CPU).
    attention_backend: str | None = None
    # Batch sizes of the decode CUDA graphs (`--cuda-graphs`, TGI's flag); None: 1, 2, 4 and
    # multiples of 8 up to the step's request limit; (): none. GPU only.
    cuda_graphs: tuple[int, ...] | None = None
    # LoRA adapters served beside the base model (`--lora-adapters`), in slot order: slot k + 1
    # is the k-th (slot 0 is the base model).
    lora_adapters: tuple[LoraAdapterSpec, ...] = ()


DEFAULT_CPU_KV_BLOCKS = 512
