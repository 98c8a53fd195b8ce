"""The shard's typed configuration, parsed once at the CLI edge."""
import pathlib
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ShardConfig:
    # "default", a local directory, a .gguf file or a hub id in the local cache.
    model: str
    cache_dir: pathlib.Path
    device: torch.device
    dtype: torch.dtype
    block_size: int = 16
    # CPU: the device pool size. GPU: ignored unless set (then an upper bound).
    device_kv_blocks: int | None = None
    host_kv_blocks: int = 0
    # GPU: share of the free memory (after a worst-case forward) given to the KV pool.
    kv_memory_fraction: float = 0.9
    # Used by Warmup when the router sends 0.
    max_batch_tokens: int = 2048
    revision: str | None = None
    # The Hugging Face hub cache searched for model ids (None: huggingface_hub's default).
    hub_cache: pathlib.Path | None = None
    warmup_repeats: int = 2
    # Where Warmup writes what it measured (cost model, pools, geometry) as JSON: the
    # `measured:` profile of the simulator. None: nowhere.
    warmup_report: pathlib.Path | None = None


DEFAULT_CPU_KV_BLOCKS = 512
