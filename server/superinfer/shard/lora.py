"""Reads LoRA adapters in PEFT's format — `adapter_config.json` and `adapter_model.safetensors`,
from a local directory or a Hugging Face model id — checks each against the loaded model
(`read_adapter`) and installs it (`install`, `models.lora`) in its slot: slot k + 1 for the k-th
of `--lora-adapters` at start-up (`load_adapters`), the slot LoadAdapter names for one loaded
later (`executor`, which reads it off the model thread and installs it between steps). Owns no
state; the adapters' tensors end up in the model's projections.

An adapter is refused, saying why, when it uses what this server does not compute (DoRA,
modules_to_save, trained biases, LoRA variants that change the forward), when it targets a
module other than the attention's q/k/v/o projections and a dense MLP's gate/up/down (an
embedding, the LM head, a sparse MLP's experts), or when its tensors do not fit the model.
PEFT's `fan_in_fan_out` concerns Conv1D base layers (GPT-2) only; on linear layers PEFT itself
turns it off, so it is ignored here."""
import json
import logging
import math
import pathlib
import re
from dataclasses import dataclass, replace

import torch
from safetensors import SafetensorError, safe_open

from ..models.config import ModelConfig
from ..models.lora import AdapterTensors, check_adapter, install_adapter
from ..models.tensor_parallel import FusedRankSlice, Partition, checkpoint_slice
from .config import LoraAdapterSpec
from .errors import LoaderError, LoraError
from .host_memory import available_host_bytes
from .hub import HubOptions, snapshot
from .loader import LoadedModel

log = logging.getLogger(__name__)

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"

# A LoRA tensor of a decoder layer: `base_model.model.` + the module's name in the model (under
# `model.` for a *ForCausalLM, without it for a bare decoder) + `.lora_A.weight` / `.lora_B.weight`.
_TENSOR = re.compile(r"^base_model\.model\.(?:model\.)?layers\.(\d+)\.(.+)\.lora_([AB])\.weight$")
# A checkpoint module -> (our projection, its part of the fused projection; None: all of it).
_TARGETS = {
    "self_attn.q_proj": ("self_attn.qkv_proj", 0),
    "self_attn.k_proj": ("self_attn.qkv_proj", 1),
    "self_attn.v_proj": ("self_attn.qkv_proj", 2),
    "self_attn.qkv_proj": ("self_attn.qkv_proj", None),  # Phi-3's checkpoints fuse them already
    "self_attn.o_proj": ("self_attn.o_proj", None),
    "mlp.gate_proj": ("mlp.gate_up_proj", 0),
    "mlp.up_proj": ("mlp.gate_up_proj", 1),
    "mlp.gate_up_proj": ("mlp.gate_up_proj", None),
    "mlp.down_proj": ("mlp.down_proj", None),
}
_SUPPORTED = "q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj (or the fused qkv_proj, gate_up_proj)"
# adapter_config.json fields whose non-default value changes the forward in a way not computed
# here -> what it is.
_UNSUPPORTED_FIELDS = {
    "use_dora": "DoRA (use_dora)",
    "modules_to_save": "modules_to_save (whole modules trained beside the LoRA)",
    "lora_bias": "a trained bias on lora_B (lora_bias)",
    "target_parameters": "LoRA on parameters (target_parameters, e.g. a sparse MLP's experts)",
    "trainable_token_indices": "trainable tokens (trainable_token_indices)",
    "alora_invocation_tokens": "activated LoRA (alora_invocation_tokens)",
    "layer_replication": "layer replication (layer_replication)",
    "use_qalora": "QA-LoRA (use_qalora)",
    "use_bdlora": "block-diagonal LoRA (use_bdlora)",
    "arrow_config": "Arrow routing (arrow_config)",
    "kasa_config": "KaSA (kasa_config)",
    "monteclora_config": "MonteCLoRA (monteclora_config)",
    "velora_config": "VeLoRA (velora_config)",
}


@dataclass(frozen=True)
class AdapterConfig:
    """What the forward needs of adapter_config.json."""

    rank: int
    alpha: float
    use_rslora: bool
    rank_pattern: dict
    alpha_pattern: dict

    def scale(self, module_name: str, rank: int) -> float:
        """The delta's multiplier for `module_name` (its name in the base model, as PEFT matches
        the patterns), whose tensors have rank `rank`."""
        expected = self.rank_pattern.get(_pattern_key(self.rank_pattern, module_name), self.rank)
        if rank != expected:
            raise ValueError(f"{module_name} has LoRA rank {rank} where {CONFIG_FILE} says {expected}")
        alpha = self.alpha_pattern.get(_pattern_key(self.alpha_pattern, module_name), self.alpha)
        return alpha / math.sqrt(rank) if self.use_rslora else alpha / rank


def _pattern_key(patterns: dict, module_name: str) -> str:
    # PEFT's own matching (peft.utils.other.get_pattern_key): the first pattern that matches
    # the name's end, after a dot.
    for pattern in patterns:
        if re.match(rf"(.*\.)?({pattern})$", module_name):
            return pattern
    return module_name


def read_adapter_config(path: pathlib.Path) -> AdapterConfig:
    """ValueError naming what is not supported."""
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ValueError(f"{path} cannot be read: {err}") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path} is not a JSON object")
    if raw.get("peft_type", "LORA") != "LORA":
        raise ValueError(f"it is a {raw['peft_type']} adapter; only LORA adapters are supported")
    used = [what for name, what in _UNSUPPORTED_FIELDS.items() if raw.get(name)]
    if raw.get("bias", "none") != "none":
        used.append(f"trained biases (bias={raw['bias']!r}; only 'none' is supported)")
    if used:
        raise ValueError(f"it uses {', '.join(used)}, which is not supported")
    try:
        config = AdapterConfig(int(raw["r"]), float(raw["lora_alpha"]), bool(raw.get("use_rslora", False)),
                               dict(raw.get("rank_pattern") or {}), dict(raw.get("alpha_pattern") or {}))
    except KeyError as missing:
        raise ValueError(f"{path} lacks the field {missing.args[0]!r}") from None
    except (TypeError, ValueError) as err:
        raise ValueError(f"{path} has a malformed r, lora_alpha, rank_pattern or alpha_pattern: {err}") from None
    for pattern in (*config.rank_pattern, *config.alpha_pattern):
        try:
            re.compile(pattern)
        except re.error as err:
            raise ValueError(f"rank_pattern / alpha_pattern key {pattern!r} is not a regular expression: "
                             f"{err}") from None
    return config


def _unsupported_target(key: str) -> str:
    if "experts" in key:
        return f"it targets a sparse MLP's experts ({key}), which is not supported"
    return f"it targets a module that is not supported ({key}); supported: {_SUPPORTED}"


def read_adapter_tensors(path: pathlib.Path) -> dict[tuple[int, str], dict[str, tuple[str, torch.Tensor]]]:
    """(layer, checkpoint module) -> {"A"|"B": (the module's name in the base model, tensor)}."""
    found: dict[tuple[int, str], dict[str, tuple[str, torch.Tensor]]] = {}
    try:
        with safe_open(str(path), framework="pt") as handle:
            for key in handle.keys():
                match = _TENSOR.match(key)
                if match is None or match.group(2) not in _TARGETS:
                    raise ValueError(_unsupported_target(key))
                layer, module, which = int(match.group(1)), match.group(2), match.group(3)
                name = key.removeprefix("base_model.model.").rsplit(".lora_", 1)[0]
                found.setdefault((layer, module), {})[which] = (name, handle.get_tensor(key).float())
    except (SafetensorError, OSError) as err:
        raise ValueError(f"cannot read {path}: {err}") from None
    if not found:
        raise ValueError(f"{path} holds no LoRA tensors")
    return found


def _projection_shapes(config: ModelConfig) -> dict[str, tuple[int, tuple[int, ...]]]:
    """Our projection -> (its input features, its parts' output features in fused order), of
    the whole (unsplit) model."""
    q_size, kv_size = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    inner = config.intermediate_size
    return {
        "self_attn.qkv_proj": (config.hidden_size, (q_size, kv_size, kv_size)),
        "self_attn.o_proj": (q_size, (config.hidden_size,)),
        "mlp.gate_up_proj": (config.hidden_size, (inner, inner)),
        "mlp.down_proj": (inner, (config.hidden_size,)),
    }


def _combine(parts: list, in_features: int, part_sizes: tuple[int, ...],
             config: AdapterConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """One projection's A [R, in] (the parts' A stacked) and block-diagonal B [out, R] (each
    part's B, times its scale, in its rows of the fused output). `parts`: (part index or None
    for the whole projection, module name, A [r, in], B [out_part, r])."""
    offsets = [sum(part_sizes[:i]) for i in range(len(part_sizes) + 1)]
    blocks, placed, covered, rank_total = [], [], set(), 0
    for part, name, lora_a, lora_b in sorted(parts, key=lambda p: -1 if p[0] is None else p[0]):
        first, last = (0, len(part_sizes)) if part is None else (part, part + 1)
        if covered & set(range(first, last)):
            raise ValueError(f"{name} overlaps another target of the same fused projection")
        covered |= set(range(first, last))
        rows = (offsets[first], offsets[last])
        rank = lora_a.shape[0]
        if lora_a.dim() != 2 or lora_a.shape[1] != in_features or lora_b.shape != (rows[1] - rows[0], rank):
            raise ValueError(f"{name}'s LoRA tensors have shapes {tuple(lora_a.shape)} (A) and {tuple(lora_b.shape)} "
                             f"(B); this model needs [r, {in_features}] and [{rows[1] - rows[0]}, r] (an adapter for a "
                             f"model of other dimensions?)")
        if rank < 1:
            raise ValueError(f"{name} has LoRA rank 0")
        blocks.append(lora_a)
        placed.append((rows, rank_total, lora_b * config.scale(name, rank)))
        rank_total += rank
    lora_b = torch.zeros(offsets[-1], rank_total)
    for (start, stop), column, block in placed:
        lora_b[start:stop, column : column + block.shape[1]] = block
    return torch.cat(blocks), lora_b


def _rank_slice(index: int, projection: str, lora_a: torch.Tensor, lora_b: torch.Tensor, in_features: int,
                part: Partition | None, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's share: a column-parallel projection's rows of B (q/k/v by heads, gate/up by
    the inner dimension, as its weight's rows), a row-parallel one's input columns of A."""
    if part is None:
        return lora_a, lora_b
    name = f"model.layers.{index}.{projection}.weight"
    if projection in ("self_attn.o_proj", "mlp.down_proj"):
        piece = checkpoint_slice(name, (lora_b.shape[0], in_features), part, head_dim)
        return (lora_a if piece is None else lora_a[:, piece.start : piece.stop]), lora_b
    piece = checkpoint_slice(name, tuple(lora_b.shape), part, head_dim)
    if piece is None:
        return lora_a, lora_b
    parts = piece.parts if isinstance(piece, FusedRankSlice) else (piece,)
    return lora_a, torch.cat([lora_b[rows.start : rows.stop] for rows in parts])


def adapter_tensors(directory: pathlib.Path, config: ModelConfig, part: Partition | None) -> AdapterTensors:
    """The adapter in `directory` as `models.lora.install_adapter` takes it (this rank's
    slices, float32); ValueError saying what does not fit."""
    if not (directory / CONFIG_FILE).is_file():
        raise ValueError(f"{directory} has no {CONFIG_FILE} (a PEFT LoRA adapter's directory holds {CONFIG_FILE} "
                         f"and {WEIGHTS_FILE})")
    if not (directory / WEIGHTS_FILE).is_file():
        raise ValueError(f"{directory} has no {WEIGHTS_FILE} (only safetensors adapters are read)")
    adapter_config = read_adapter_config(directory / CONFIG_FILE)
    grouped: dict[tuple[int, str], list] = {}
    for (layer, module), pair in read_adapter_tensors(directory / WEIGHTS_FILE).items():
        if set(pair) != {"A", "B"}:
            present = next(iter(pair))
            raise ValueError(f"{pair[present][0]} has lora_{present} but no lora_{'B' if present == 'A' else 'A'}")
        if not 0 <= layer < config.num_layers:
            raise ValueError(f"{pair['A'][0]} is in layer {layer}; the model has {config.num_layers} layers")
        projection, fused_part = _TARGETS[module]
        grouped.setdefault((layer, projection), []).append((fused_part, pair["A"][0], pair["A"][1], pair["B"][1]))
    shapes = _projection_shapes(config)
    tensors = {}
    for (layer, projection), parts in grouped.items():
        in_features, part_sizes = shapes[projection]
        lora_a, lora_b = _combine(parts, in_features, part_sizes, adapter_config)
        tensors[(layer, projection)] = _rank_slice(layer, projection, lora_a, lora_b, in_features, part,
                                                   config.head_dim)
    return tensors


def _adapter_directory(spec: LoraAdapterSpec, hub: HubOptions) -> pathlib.Path:
    """A local directory as it is; otherwise a Hugging Face model id, from the hub cache or
    downloaded (the model's --revision is the model's, not the adapter's)."""
    path = pathlib.Path(spec.source).expanduser()
    if path.is_dir():
        return path
    if path.exists() or spec.source.startswith((".", "/", "~")) or spec.source.count("/") > 1:
        raise LoraError(f"LoRA adapter {spec.adapter_id!r}: {spec.source!r} is not a directory")
    try:
        return snapshot(spec.source, replace(hub, revision=None))
    except LoaderError as err:
        raise LoraError(f"LoRA adapter {spec.adapter_id!r}: {err}") from None


@dataclass(frozen=True)
class ReadAdapter:
    """An adapter read and checked against the model, not installed yet."""

    adapter_id: str
    # Where its files were read (a hub id resolved to its snapshot).
    directory: pathlib.Path
    # This rank's slices (`adapter_tensors`).
    tensors: AdapterTensors


def read_adapter(spec: LoraAdapterSpec, loaded: LoadedModel, hub: HubOptions) -> ReadAdapter:
    """Reads `spec`'s adapter (this rank's slices) and checks that `loaded`'s model can take it
    (`models.lora.check_adapter`, the slot aside); LoraError naming the adapter and the
    reason when it cannot be served. Touches no state: may run beside the model's forward."""
    directory = _adapter_directory(spec, hub)
    try:
        tensors = adapter_tensors(directory, loaded.model.config, loaded.partition)
        check_adapter(loaded.model, tensors)
    except ValueError as err:
        raise LoraError(f"LoRA adapter {spec.adapter_id!r} ({spec.source}): {err}") from None
    return ReadAdapter(spec.adapter_id, directory, tensors)


# A load at run time may take at most this share of the memory free where the model's weights
# live: the KV pool was sized at start-up from what the weights and a worst-case step left free
# (on a GPU, `--kv-memory-fraction` of it), and the rest is what every later step's activations
# (and, on a GPU, the decode graphs' pool) run in. An adapter that took all of it would fail the
# steps after it, every request's, instead of its own load.
RUNTIME_LOAD_SHARE = 0.5


def adapter_bytes(adapter: ReadAdapter, dtype: torch.dtype) -> int:
    """What `adapter`'s tensors (this rank's slices) take once installed in `dtype` (the model's
    weights', `models.lora.LoraLinear.add_adapter`)."""
    size = torch.empty((), dtype=dtype).element_size()
    return sum((a.numel() + b.numel()) * size for a, b in adapter.tensors.values())


def free_memory_bytes(device: torch.device) -> int:
    """Memory free for new tensors on `device`: on a GPU, what the driver reports free plus what
    torch's caching allocator holds unused; on the CPU, what the host can spare
    (`host_memory.available_host_bytes`)."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return available_host_bytes()


def check_memory_for(loaded: LoadedModel, adapter: ReadAdapter) -> None:
    """LoraError when installing `adapter` now would take more than `RUNTIME_LOAD_SHARE` of the
    memory free where the model's weights are (a load at run time; at start-up the KV pool is
    sized after the adapters)."""
    weight = next(loaded.model.parameters())
    needed = adapter_bytes(adapter, weight.dtype)
    free = free_memory_bytes(weight.device)
    if needed > RUNTIME_LOAD_SHARE * free:
        raise LoraError(f"LoRA adapter {adapter.adapter_id!r}: its weights take {needed / 2**20:.1f} MiB on "
                        f"{weight.device.type}, more than {RUNTIME_LOAD_SHARE:.0%} of the {free / 2**20:.1f} MiB "
                        "free there, which the steps need; unload an adapter or start the server with it")


def install(loaded: LoadedModel, slot: int, adapter: ReadAdapter) -> None:
    """Installs `adapter` (`read_adapter`) in `slot` of `loaded`'s model; ValueError, nothing
    changed, when the slot holds one already."""
    install_adapter(loaded.model, slot, adapter.tensors)
    ranks = sorted({int(a.shape[0]) for a, _ in adapter.tensors.values()})
    log.info("LoRA adapter %r in slot %d from %s: %d projections in %d layers, ranks (summed over fused parts) %s",
             adapter.adapter_id, slot, adapter.directory, len(adapter.tensors),
             len({layer for layer, _ in adapter.tensors}), ranks)


def load_adapters(loaded: LoadedModel, specs: tuple[LoraAdapterSpec, ...], hub: HubOptions) -> LoadedModel:
    """`loaded` with `specs` installed, in order (slot k + 1 for specs[k]); LoraError naming
    the adapter and the reason when one cannot be served."""
    for slot, spec in enumerate(specs, start=1):
        adapter = read_adapter(spec, loaded, hub)
        try:
            install(loaded, slot, adapter)
        except ValueError as err:
            raise LoraError(f"LoRA adapter {spec.adapter_id!r} ({spec.source}): {err}") from None
    return replace(loaded, adapters=tuple(spec.adapter_id for spec in specs))
