"""Builds a model from a Hugging Face directory: typed config, architecture from the
registry, weights from safetensors (with the renames our fused modules need), tokenizer info.

Checkpoint names map onto the modules one to one except: q/k/v projections are concatenated
into `qkv_proj`, gate/up into `gate_up_proj`, a sparse MLP's per-expert tensors are stacked
(`_EXPERT_PART`; Mixtral's `block_sparse_moe` becomes `mlp`), a tied `lm_head.weight` is skipped and stale rotary buffers are ignored.

Under tensor parallelism each rank reads only its slice of every sharded tensor
(`models.tensor_parallel.checkpoint_slice`) straight from the files, so its resident weights
are about 1/N of the model's. Checkpoints that store the projections already fused (Phi-3's
`qkv_proj`, `gate_up_proj`) are taken as they are; a rank reads its rows of each fused part."""
import json
import logging
import pathlib
import re
import time
from dataclasses import dataclass

import torch
from safetensors import SafetensorError, safe_open

from ..models.config import ConfigError, ModelConfig
from ..models.decoder import DecoderForCausalLM
from ..models.moe import moe_config
from ..models.quantization import SKIPPED_SUFFIXES, Fp8Layout, fp8_layout
from ..models.registry import check_config, model_class
from ..models.tensor_parallel import (FusedRankSlice, Partition, RankSlice, TensorParallelGroup, checkpoint_slice,
                                     parallelize, partition)
from .errors import LoaderError
from .model_source import ModelSource
from .progress import PROGRESS_INTERVAL_S, ProgressLog
from .tokenizer_info import TokenizerInfo, read_tokenizer_info

log = logging.getLogger(__name__)

# checkpoint suffix -> (fused module, position of this part)
_FUSED_PARTS = {
    "self_attn.q_proj": ("self_attn.qkv_proj", 0),
    "self_attn.k_proj": ("self_attn.qkv_proj", 1),
    "self_attn.v_proj": ("self_attn.qkv_proj", 2),
    "mlp.gate_proj": ("mlp.gate_up_proj", 0),
    "mlp.up_proj": ("mlp.gate_up_proj", 1),
}
_FUSED_COUNT = {"self_attn.qkv_proj": 3, "mlp.gate_up_proj": 2}
_LAYER_PART = re.compile(r"^(model\.layers\.\d+)\.(self_attn\.[qkv]_proj|mlp\.(?:gate|up)_proj)\.(weight|bias)$")
# A sparse MLP's experts, one tensor per expert in the checkpoints (Qwen3-MoE's names; Mixtral's
# original w1/w3/w2 under block_sparse_moe), stacked into mlp.experts.gate_up_proj [E, 2I, H]
# (gate then up rows per expert) and mlp.experts.down_proj [E, H, I].
_EXPERT_PART = re.compile(
    r"^(model\.layers\.\d+)\.(?:mlp|block_sparse_moe)\.experts\.(\d+)\.(gate_proj|up_proj|down_proj|w1|w3|w2)\.weight$")
# checkpoint name -> (stacked parameter, position of this part within an expert's rows)
_EXPERT_PARTS = {"gate_proj": ("gate_up_proj", 0), "w1": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1),
                 "w3": ("gate_up_proj", 1), "down_proj": ("down_proj", 0), "w2": ("down_proj", 0)}
_EXPERT_WIDTH = {"gate_up_proj": 2, "down_proj": 1}
# Mixtral's router, `mlp.gate` here as in Qwen3-MoE.
_MIXTRAL_ROUTER = re.compile(r"^(model\.layers\.\d+)\.block_sparse_moe\.gate\.weight$")


@dataclass
class LoadedModel:
    model_id: str
    config: ModelConfig
    model: DecoderForCausalLM
    tokenizer: TokenizerInfo
    # What this rank holds of the model (the whole of it without tensor parallelism).
    partition: Partition | None = None
    # The LoRA adapters of --lora-adapters installed at start-up (`shard.lora`), by id: adapters[k]
    # is slot k + 1. Those loaded and unloaded later are the executor's (`ShardExecutor.adapters`).
    adapters: tuple[str, ...] = ()


def read_config(directory: pathlib.Path) -> ModelConfig:
    path = directory / "config.json"
    if not path.is_file():
        raise LoaderError(f"{directory} has no config.json")
    try:
        return check_config(json.loads(path.read_text()))
    except json.JSONDecodeError as err:
        raise LoaderError(f"{path} is not valid JSON: {err}") from None


def _safetensors_files(directory: pathlib.Path) -> list[pathlib.Path]:
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        files = [directory / name for name in names]
    else:
        files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise LoaderError(f"{directory} has no *.safetensors weights")
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise LoaderError(f"weight files listed in the index are missing: {', '.join(missing)}")
    return files


def _tensor_files(files: list[pathlib.Path]) -> dict[str, pathlib.Path]:
    """Each tensor's file, from the files' headers alone (no tensor is read)."""
    where: dict[str, pathlib.Path] = {}
    try:
        for path in files:
            with safe_open(str(path), framework="pt") as handle:
                where.update((name, path) for name in handle.keys())
        return where
    except (SafetensorError, OSError) as err:
        raise LoaderError(f"cannot read weights from {path}: {err}") from None


def _read_slice(handle, name: str, part: Partition | None, head_dim: int,
                fp8: "_Fp8Weights | None" = None) -> torch.Tensor:
    lazy = handle.get_slice(name)
    if lazy.get_dtype().startswith("F8"):
        if fp8 is None:
            raise LoaderError(f"weight {name} is FP8 but config.json has no quantization_config to de-quantize it by")
        return _cut(fp8.dequantize(name, handle.get_tensor(name)), name, part, head_dim)
    if part is None:
        return handle.get_tensor(name)
    piece = checkpoint_slice(name, tuple(lazy.get_shape()), part, head_dim)
    if piece is None:
        return handle.get_tensor(name)
    return _take(lazy, piece)


def _cut(tensor: torch.Tensor, name: str, part: Partition | None, head_dim: int) -> torch.Tensor:
    """This rank's part of a tensor already in memory (`_read_slice`'s cut)."""
    piece = None if part is None else checkpoint_slice(name, tuple(tensor.shape), part, head_dim)
    return tensor if piece is None else _take(tensor, piece)


def _take(lazy, piece: "RankSlice | FusedRankSlice") -> torch.Tensor:
    """`piece` of a tensor, read from a safetensors slice or cut from a tensor."""
    if isinstance(piece, FusedRankSlice):
        return torch.cat([lazy[rows.start : rows.stop] for rows in piece.parts], dim=0)
    index = (slice(None),) * piece.dim + (slice(piece.start, piece.stop),)
    return _pad(lazy[index], piece)


class _Fp8Weights:
    """De-quantizes a checkpoint's FP8 weights as they are read (`models.quantization`): each
    times its scale, per block, output channel or tensor, in float32 (the state builder then
    casts to the compute dtype). A scale may be in another file than its weight."""

    def __init__(self, layout: Fp8Layout, where: dict[str, pathlib.Path]):
        self.layout = layout
        # Each tensor's file (`_tensor_files`).
        self.where = where
        self.count = 0

    def dequantize(self, name: str, weight: torch.Tensor) -> torch.Tensor:
        scale_name = name.removesuffix(".weight") + self.layout.scale_suffix
        if not name.endswith(".weight") or scale_name not in self.where:
            raise LoaderError(f"FP8 weight {name} has no scale {scale_name} in the checkpoint")
        with safe_open(str(self.where[scale_name]), framework="pt") as handle:
            scale = handle.get_tensor(scale_name).float()
        values = weight.float()
        if self.layout.block is not None:
            rows, cols = self.layout.block
            blocks = (-(-values.shape[0] // rows), -(-values.shape[1] // cols))
            if values.dim() != 2 or tuple(scale.shape) != blocks:
                raise LoaderError(f"{scale_name} has shape {tuple(scale.shape)}; {rows}x{cols} blocks of {name} "
                                  f"{tuple(values.shape)} need {blocks}")
            scale = scale.repeat_interleave(rows, 0)[: values.shape[0]].repeat_interleave(cols, 1)[:, : values.shape[1]]
        elif scale.numel() == values.shape[0] and values.dim() == 2:
            scale = scale.reshape(-1, 1)  # per output channel
        elif scale.numel() != 1:
            raise LoaderError(f"{scale_name} has shape {tuple(scale.shape)}: neither one scale nor one per row of "
                              f"{name} {tuple(values.shape)}")
        self.count += 1
        return values * scale


def _pad(tensor: torch.Tensor, piece: RankSlice) -> torch.Tensor:
    # The vocabulary's last rank: rows past the vocabulary are zeros (never looked up; their
    # logits are cut off after the gather).
    if piece.rows is None or tensor.shape[piece.dim] == piece.rows:
        return tensor
    shape = list(tensor.shape)
    shape[piece.dim] = piece.rows
    padded = tensor.new_zeros(shape)
    padded.narrow(piece.dim, 0, tensor.shape[piece.dim]).copy_(tensor)
    return padded


def _iter_checkpoint(files: list[pathlib.Path], part: Partition | None = None, head_dim: int = 0,
                     fp8: _Fp8Weights | None = None):
    for path in files:
        try:
            with safe_open(str(path), framework="pt") as handle:
                for name in handle.keys():
                    if fp8 is not None and name.endswith(SKIPPED_SUFFIXES):
                        continue  # scales: read with their weights, or not needed once de-quantized
                    yield name, _read_slice(handle, name, part, head_dim, fp8)
        except (SafetensorError, OSError) as err:
            raise LoaderError(f"cannot read weights from {path}: {err}") from None


def _aligned(tensor: torch.Tensor) -> torch.Tensor:
    # safetensors hands out tensors at their offset in the file, often not 64-byte aligned;
    # GEMM kernels read such weights markedly slower, so they get a fresh (aligned) copy.
    return tensor.clone() if tensor.data_ptr() % 64 else tensor


class _StateBuilder:
    """Collects checkpoint tensors into our parameter names, fusing split projections."""

    def __init__(self, config: ModelConfig, dtype: torch.dtype):
        self.config = config
        self.dtype = dtype
        self.state: dict[str, torch.Tensor] = {}
        self.parts: dict[str, dict[int, torch.Tensor]] = {}
        experts = moe_config(config)
        self.num_experts = 0 if experts is None else experts.num_experts

    def add(self, name: str, tensor: torch.Tensor) -> None:
        if name.endswith("rotary_emb.inv_freq"):
            return  # derived, recomputed by the model
        if name == "lm_head.weight" and self.config.tie_word_embeddings:
            return
        expert = _EXPERT_PART.match(name)
        if expert is not None and int(expert.group(2)) < self.num_experts:
            self._add_expert(*expert.groups(), tensor)
            return
        name = _MIXTRAL_ROUTER.sub(r"\1.mlp.gate.weight", name)
        match = _LAYER_PART.match(name)
        if match is None:
            self.state[name] = _aligned(tensor.to(self.dtype))
            return
        prefix, part, kind = match.groups()
        fused, position = _FUSED_PARTS[part]
        key = f"{prefix}.{fused}.{kind}"
        pieces = self.parts.setdefault(key, {})
        pieces[position] = tensor.to(self.dtype)
        if len(pieces) == _FUSED_COUNT[fused]:
            self.state[key] = torch.cat([pieces[i] for i in range(len(pieces))], dim=0)
            del self.parts[key]

    def _add_expert(self, prefix: str, expert: str, part: str, tensor: torch.Tensor) -> None:
        stacked, position = _EXPERT_PARTS[part]
        width = _EXPERT_WIDTH[stacked]
        key = f"{prefix}.mlp.experts.{stacked}"
        pieces = self.parts.setdefault(key, {})
        pieces[int(expert) * width + position] = tensor.to(self.dtype)
        if len(pieces) == width * self.num_experts:
            rows = [torch.cat([pieces[e * width + p] for p in range(width)]) for e in range(self.num_experts)]
            self.state[key] = torch.stack(rows)  # [E, 2I, H] or [E, H, I]
            del self.parts[key]

    def finish(self) -> dict[str, torch.Tensor]:
        if self.parts:
            raise LoaderError(f"checkpoint lacks parts of fused weights: {', '.join(sorted(self.parts))}")
        return self.state


def _load_weights(model: DecoderForCausalLM, directory: pathlib.Path, dtype: torch.dtype,
                  part: Partition | None) -> None:
    files = _safetensors_files(directory)
    where = _tensor_files(files)
    total = len(where)
    log.info("loading weights: %d tensors, %.2f GB in %d file(s)", total,
             sum(f.stat().st_size for f in files) / 1e9, len(files))
    builder = _StateBuilder(model.config, dtype)
    layout = fp8_layout(json.loads((directory / "config.json").read_text()))
    fp8 = None if layout is None else _Fp8Weights(layout, where)
    # A line every few seconds once it has taken that long: a small model logs none.
    with ProgressLog(total=total, desc="loading weights", unit="tensor", delay=PROGRESS_INTERVAL_S) as progress:
        for name, tensor in _iter_checkpoint(files, part, model.config.head_dim, fp8):
            builder.add(name, tensor)
            progress.update()
    if fp8 is not None:
        log.info("de-quantized %d FP8 weights into %s", fp8.count, dtype)
    state = builder.finish()
    expected = {name for name in model.state_dict() if not (model.config.tie_word_embeddings and name == "lm_head.weight")}
    missing, unexpected = sorted(expected - state.keys()), sorted(state.keys() - expected)
    if missing or unexpected:
        raise LoaderError(
            f"weights in {directory} do not match the {model.config.architecture} model: "
            f"missing {missing[:8]}{'...' if len(missing) > 8 else ''}, unexpected {unexpected[:8]}"
        )
    for name, param in model.named_parameters():
        if param.shape != state[name].shape:
            raise LoaderError(f"weight {name} has shape {tuple(state[name].shape)}, expected {tuple(param.shape)}")
    # assign=True adopts the loaded tensors as the parameters: no second copy of the weights.
    model.load_state_dict(state, strict=False, assign=True)


def load_model(source: ModelSource, dtype: torch.dtype, device: torch.device,
               parallel: TensorParallelGroup | None = None) -> LoadedModel:
    """Reads config, weights and tokenizer files of `source` into a model on `device`; with
    `parallel`, this rank's slice of it."""
    try:
        config = read_config(source.directory)
        cls = model_class(config.architecture)
        part = None if parallel is None else partition(config, parallel.rank, parallel.world_size)
    except ConfigError as err:
        raise LoaderError(f"{source.directory}: {err}") from None
    started = time.perf_counter()
    tokenizer = read_tokenizer_info(source.directory, config.eos_token_ids)
    # Built on the meta device, then the checkpoint's tensors become the parameters: random
    # initialisation of weights about to be replaced would cost seconds.
    with torch.device("meta"):
        model = cls(config)
        if part is not None:
            parallelize(model, part, parallel)
    _load_weights(model, source.directory, dtype, part)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    model = model.to(device).eval()
    log.info("loaded %s (%s, %d layers) from %s in %.1f s", source.model_id, config.architecture, config.num_layers,
             source.directory, time.perf_counter() - started)
    if part is not None:
        log.info("rank %d of %d holds query heads %d..%d, KV heads %d..%d%s, MLP columns %d..%d, vocabulary rows "
                 "%d..%d: %.1f MB of weights", part.rank, part.world_size, part.head_start,
                 part.head_start + part.num_heads - 1, part.kv_head_start, part.kv_head_start + part.num_kv_heads - 1,
                 f" (replicated on {part.kv_replicas} ranks: fewer KV heads than ranks)" if part.kv_replicas > 1 else "",
                 part.intermediate_start, part.intermediate_start + part.intermediate_size - 1, part.vocab_start,
                 part.vocab_start + part.vocab_rows - 1, parameter_bytes(model) / 1e6)
    return LoadedModel(model_id=source.model_id, config=model.config, model=model, tokenizer=tokenizer,
                       partition=part)


def parameter_bytes(model: torch.nn.Module) -> int:
    """Resident bytes of the model's parameters (a tied weight counted once)."""
    return sum(p.numel() * p.element_size() for p in {id(p): p for p in model.parameters()}.values())
