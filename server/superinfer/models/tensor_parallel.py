"""Megatron-style tensor parallelism as a transform of a plain decoder (built on the meta
device, before its weights are loaded): each rank keeps 1/N of the attention heads and of the
MLP's inner dimension, and 1/N of the vocabulary rows of the embedding and the LM head.

Per layer: Q/K/V and gate/up are column-parallel (each rank computes its heads / its slice of
the inner dimension, no communication), o_proj and down_proj row-parallel (partial sums, one
all-reduce after attention and one after the MLP). The embedding is vocab-parallel (each rank
looks up the ids in its rows, zeros elsewhere, one all-reduce): replicating it would keep the
tied embedding of small models (a fifth of SmolLM2's weights) whole on every rank, and with a
single non-zero term per element the sum is exact. The LM head is vocab-parallel and its
logits are gathered on rank 0, which samples. A sparse MLP keeps every expert and 1/N of each
one's inner dimension, with one all-reduce after the block (models.moe says why).

KV heads are split when the ranks divide them; when the ranks are a multiple of the KV heads
(more ranks than KV heads), each rank holds one KV head and the ranks sharing it hold copies,
as vLLM does. Any other shape is refused with the reason."""
from dataclasses import dataclass
import re
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .config import ConfigError, ModelConfig
from .decoder import DecoderForCausalLM, Linear
from .moe import SparseMoeBlock, moe_config


@dataclass(frozen=True)
class Partition:
    """What one rank holds of the model."""

    rank: int
    world_size: int
    # Query heads on this rank: [head_start, head_start + num_heads).
    head_start: int
    num_heads: int
    # KV heads on this rank: [kv_head_start, kv_head_start + num_kv_heads).
    kv_head_start: int
    num_kv_heads: int
    # Ranks holding a copy of each of this rank's KV heads (1: the KV heads are split).
    kv_replicas: int
    # This rank's slice of the MLP's inner dimension.
    intermediate_start: int
    intermediate_size: int
    # Rows of the embedding / LM head per rank (the vocabulary padded to a multiple of N);
    # this rank's are [vocab_start, vocab_start + vocab_rows), those past vocab_size zero.
    vocab_start: int
    vocab_rows: int
    # This rank's slice of every expert's inner dimension (a sparse MLP; see models.moe).
    expert_intermediate_start: int = 0
    expert_intermediate_size: int = 0

    @property
    def is_whole(self) -> bool:
        return self.world_size == 1


def partition(config: ModelConfig, rank: int, world_size: int) -> Partition:
    """Rank `rank`'s share of `config`; ConfigError when the model cannot be split N ways."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise ConfigError(f"rank {rank} is not in a group of {world_size}")
    heads, kv_heads, inner = config.num_heads, config.num_kv_heads, config.intermediate_size
    if heads % world_size:
        raise ConfigError(f"{heads} attention heads cannot be split over {world_size} shards "
                          f"(the number of shards must divide them)")
    if inner % world_size:
        raise ConfigError(f"the MLP's inner dimension {inner} cannot be split over {world_size} shards")
    experts = moe_config(config)
    expert_inner = 0 if experts is None else experts.intermediate_size
    if expert_inner % world_size:
        raise ConfigError(f"each expert's inner dimension {expert_inner} cannot be split over {world_size} shards")
    local_heads = heads // world_size
    if kv_heads % world_size == 0:
        local_kv, replicas, kv_start = kv_heads // world_size, 1, rank * (kv_heads // world_size)
    elif world_size % kv_heads == 0:
        replicas = world_size // kv_heads
        local_kv, kv_start = 1, rank // replicas
    else:
        raise ConfigError(f"{kv_heads} KV heads can be neither split over {world_size} shards nor replicated "
                          f"across them (the shards must divide the KV heads or be a multiple of them)")
    vocab_rows = -(-config.vocab_size // world_size)
    local_inner = inner // world_size
    return Partition(rank, world_size, rank * local_heads, local_heads, kv_start, local_kv, replicas,
                     rank * local_inner, local_inner, rank * vocab_rows, vocab_rows,
                     rank * (expert_inner // world_size), expert_inner // world_size)


class TensorParallelGroup:
    """The collectives the sharded model runs, over one torch.distributed process group, and
    the time spent in them (the all-reduce's share of a step)."""

    def __init__(self, group: dist.ProcessGroup, rank: int, world_size: int):
        self.group = group
        self.rank = rank
        self.world_size = world_size
        self.collective_ns = 0

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        started = time.perf_counter_ns()
        dist.all_reduce(tensor, group=self.group)
        self.collective_ns += time.perf_counter_ns() - started
        return tensor

    def gather_last_dim(self, tensor: torch.Tensor) -> torch.Tensor | None:
        """[R, C] on every rank -> [R, N·C] on rank 0 (ranks in order); None elsewhere."""
        started = time.perf_counter_ns()
        parts = [torch.empty_like(tensor) for _ in range(self.world_size)] if self.rank == 0 else None
        dist.gather(tensor.contiguous(), parts, dst=dist.get_global_rank(self.group, 0), group=self.group)
        self.collective_ns += time.perf_counter_ns() - started
        return torch.cat(parts, dim=-1) if parts is not None else None


class RowParallelLinear(Linear):
    """A slice of the input features; the partial products are summed over the ranks, then
    the (whole, replicated) bias is added once."""

    def __init__(self, in_features: int, out_features: int, bias: bool, group: TensorParallelGroup):
        super().__init__(in_features, out_features, bias)
        self.tp_group = group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.tp_group.all_reduce(F.linear(x, self.weight))
        return out if self.bias is None else out + self.bias


class VocabParallelEmbedding(nn.Module):
    """Rows [vocab_start, vocab_start + rows) of the embedding; other ids look up zeros here
    and their row on the rank that holds it."""

    def __init__(self, rows: int, dim: int, vocab_start: int, group: TensorParallelGroup):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(rows, dim), requires_grad=False)
        self.vocab_start = vocab_start
        self.tp_group = group

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        # ids: [T] -> [T, dim]
        local = ids - self.vocab_start
        outside = (local < 0) | (local >= self.weight.shape[0])
        out = F.embedding(local.masked_fill(outside, 0), self.weight)
        return self.tp_group.all_reduce(out.masked_fill_(outside[:, None], 0))


class VocabParallelLMHead(Linear):
    """This rank's vocabulary rows; the logits are gathered on rank 0 (trimmed to the true
    vocabulary). Other ranks get None: only rank 0 samples."""

    def __init__(self, in_features: int, rows: int, vocab_size: int, group: TensorParallelGroup):
        super().__init__(in_features, rows, bias=False)
        self.vocab_size = vocab_size
        self.tp_group = group

    def forward(self, hidden: torch.Tensor) -> torch.Tensor | None:
        # hidden: [R, hidden] -> [R, vocab] float32 on rank 0
        local = F.linear(hidden, self.weight).float()
        gathered = self.tp_group.gather_last_dim(local)
        return None if gathered is None else gathered[:, : self.vocab_size]


def parallelize(model: DecoderForCausalLM, part: Partition, group: TensorParallelGroup) -> None:
    """Replaces `model`'s projections, embedding and LM head by this rank's slices. Call it on
    the meta device, before loading: the new parameters are empty."""
    config = model.config
    hidden, head_dim = config.hidden_size, config.head_dim
    q_size, kv_size = part.num_heads * head_dim, part.num_kv_heads * head_dim
    for layer in model.model.layers:
        attention = layer.self_attn
        attention.num_heads, attention.num_kv_heads = part.num_heads, part.num_kv_heads
        attention.split = (q_size, kv_size, kv_size)
        attention.qkv_proj = Linear(hidden, q_size + 2 * kv_size, bias=config.qkv_bias)
        attention.o_proj = RowParallelLinear(q_size, hidden, config.o_proj_bias, group)
        mlp = layer.mlp
        if isinstance(mlp, SparseMoeBlock):
            mlp.parallelize(part.expert_intermediate_size, group)
            continue
        mlp.intermediate_size = part.intermediate_size
        mlp.gate_up_proj = Linear(hidden, 2 * part.intermediate_size, bias=config.mlp_bias)
        mlp.down_proj = RowParallelLinear(part.intermediate_size, hidden, config.mlp_bias, group)
    model.model.embed_tokens = VocabParallelEmbedding(part.vocab_rows, hidden, part.vocab_start, group)
    model.lm_head = VocabParallelLMHead(hidden, part.vocab_rows, config.vocab_size, group)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight


@dataclass(frozen=True)
class RankSlice:
    """The part of a checkpoint tensor one rank loads: [start, stop) along `dim`, zero-padded
    to `rows` along it when given (the vocabulary's last rank)."""

    dim: int
    start: int
    stop: int
    rows: int | None = None


@dataclass(frozen=True)
class FusedRankSlice:
    """Rows of a checkpoint tensor that stores several projections one after another along
    dim 0 ([q; k; v] or [gate; up], as Phi-3's checkpoints do): the rank's slice of each part,
    concatenated in order — the layout of the rank's own fused module."""

    parts: tuple[RankSlice, ...]


_FUSED_TENSOR = re.compile(r"^model\.layers\.\d+\.(self_attn\.qkv_proj|mlp\.gate_up_proj)\.(?:weight|bias)$")


def _fused_slice(module: str, part: Partition, head_dim: int) -> FusedRankSlice:
    # (offset of the part in the fused rows, the rank's start within the part, its row count)
    if module == "mlp.gate_up_proj":
        inner = part.intermediate_size * part.world_size
        own = (part.intermediate_start, part.intermediate_size)
        pieces = [(0, *own), (inner, *own)]
    else:
        q_rows = part.num_heads * part.world_size * head_dim
        kv_rows = part.num_kv_heads * part.world_size // part.kv_replicas * head_dim
        own_kv = (part.kv_head_start * head_dim, part.num_kv_heads * head_dim)
        pieces = [(0, part.head_start * head_dim, part.num_heads * head_dim), (q_rows, *own_kv),
                  (q_rows + kv_rows, *own_kv)]
    return FusedRankSlice(tuple(RankSlice(0, offset + start, offset + start + size) for offset, start, size in pieces))


_LAYER_TENSOR = re.compile(r"^model\.layers\.\d+\.(self_attn\.[qkvo]_proj|mlp\.(?:gate|up|down)_proj)\.(weight|bias)$")
_EXPERT_TENSOR = re.compile(
    r"^model\.layers\.\d+\.(?:mlp|block_sparse_moe)\.experts\.\d+\.(gate_proj|up_proj|down_proj|w1|w3|w2)\.weight$")


def checkpoint_slice(name: str, shape: tuple[int, ...], part: Partition,
                     head_dim: int) -> RankSlice | FusedRankSlice | None:
    """The slice of checkpoint tensor `name` (of `shape`) rank `part.rank` holds; None: whole."""
    if part.is_whole:
        return None
    if name in ("model.embed_tokens.weight", "lm_head.weight"):
        return RankSlice(0, min(part.vocab_start, shape[0]), min(part.vocab_start + part.vocab_rows, shape[0]),
                         part.vocab_rows)
    expert = _EXPERT_TENSOR.match(name)
    if expert is not None:
        # Every expert's inner dimension, as the dense MLP's (the router: replicated).
        start, stop = part.expert_intermediate_start, part.expert_intermediate_start + part.expert_intermediate_size
        return RankSlice(1 if expert.group(1) in ("down_proj", "w2") else 0, start, stop)
    fused = _FUSED_TENSOR.match(name)
    if fused is not None:
        return _fused_slice(fused.group(1), part, head_dim)
    match = _LAYER_TENSOR.match(name)
    if match is None:
        return None  # norms: replicated
    module, kind = match.groups()
    heads = RankSlice(0, part.head_start * head_dim, (part.head_start + part.num_heads) * head_dim)
    kv_heads = RankSlice(0, part.kv_head_start * head_dim, (part.kv_head_start + part.num_kv_heads) * head_dim)
    inner = RankSlice(0, part.intermediate_start, part.intermediate_start + part.intermediate_size)
    if module == "self_attn.q_proj":
        return heads
    if module in ("self_attn.k_proj", "self_attn.v_proj"):
        return kv_heads
    if module in ("mlp.gate_proj", "mlp.up_proj"):
        return inner
    if kind == "bias":
        return None  # a row-parallel layer's bias is added once, after the all-reduce
    column = heads if module == "self_attn.o_proj" else inner
    return RankSlice(1, column.start, column.stop)
