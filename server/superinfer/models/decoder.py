"""The Llama-family decoder shared by every supported architecture: RMSNorm, fused QKV
attention over the paged KV cache, fused gate/up SwiGLU MLP.

Q/K/V and gate/up are single matmuls (the loader concatenates the checkpoint's separate
weights) because on the CPU one large GEMM is markedly faster than three small ones."""
import torch
import torch.nn.functional as F
from torch import nn

from .attention import AttentionMetadata, paged_attention, write_kv
from .config import ModelConfig
from .rotary import RotaryEmbedding, apply_rotary
from .row_padding import padded_rows


class Linear(nn.Module):
    """nn.Linear without weight initialisation: every parameter comes from the checkpoint, and
    initialising on the meta device would import torch's decompositions (seconds at start-up)."""

    def __init__(self, in_features: int, out_features: int, bias: bool):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(out_features), requires_grad=False) if bias else None
        # The row count each count of input rows is computed with (`row_padding`); empty: as
        # they come.
        self.row_padding: tuple[int, ...] = ()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.shape[0]
        padded = padded_rows(self.row_padding, rows) if x.dim() == 2 else rows
        if padded == rows:
            return F.linear(x, self.weight, self.bias)
        return F.linear(torch.cat([x, x.new_zeros(padded - rows, x.shape[1])]), self.weight, self.bias)[:rows]


def project(linear: nn.Module, x: torch.Tensor, lora) -> torch.Tensor:
    """`linear(x)` plus the step's LoRA deltas when the step has adapter rows (`lora`, a
    `models.lora.LoraBatch`; the projection is then a `LoraLinear`). Without, nothing more is
    passed: the projection runs exactly as in a model without adapters."""
    return linear(x) if lora is None else linear(x, lora)


class Embedding(nn.Module):
    """nn.Embedding without initialisation (see Linear)."""

    def __init__(self, num_embeddings: int, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_embeddings, dim), requires_grad=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.weight)


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size), requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in float32 whatever the compute dtype, as the reference implementation does.
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        q_size = config.num_heads * config.head_dim
        kv_size = config.num_kv_heads * config.head_dim
        self.split = (q_size, kv_size, kv_size)
        self.qkv_proj = Linear(config.hidden_size, q_size + 2 * kv_size, bias=config.qkv_bias)
        self.o_proj = Linear(q_size, config.hidden_size, bias=config.o_proj_bias)
        # Per-head norms of queries and keys over head_dim, applied before RoPE (Qwen3): an
        # architecture that has them sets both; replicated under tensor parallelism.
        self.q_norm: nn.Module | None = None
        self.k_norm: nn.Module | None = None

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        kv_cache: torch.Tensor,
        layer: int,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        """x: [T, hidden] -> [T, hidden]; kv_cache: [N, L, 2, block_size, Hkv, D]."""
        num_tokens = x.shape[0]
        q, k, v = project(self.qkv_proj, x, meta.lora).split(self.split, dim=-1)
        q = q.view(num_tokens, self.num_heads, self.head_dim)  # [T, H, D]
        k = k.view(num_tokens, self.num_kv_heads, self.head_dim)  # [T, Hkv, D]
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rotary(q, *rope), apply_rotary(k, *rope)
        write_kv(kv_cache, layer, k, v.view(num_tokens, self.num_kv_heads, self.head_dim), meta)
        return project(self.o_proj, self.attend(q, kv_cache, layer, meta), meta.lora)

    def attend(self, q: torch.Tensor, kv_cache: torch.Tensor, layer: int, meta: AttentionMetadata) -> torch.Tensor:
        """q: [T, H, D] (rotated) -> [T, H·D]; an architecture with its own sliding window per
        layer, softmax scale or score soft-capping overrides this (Gemma)."""
        return paged_attention(q, kv_cache, layer, meta)


class MLP(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.intermediate_size = config.intermediate_size
        self.gate_up_proj = Linear(config.hidden_size, 2 * config.intermediate_size, bias=config.mlp_bias)
        self.down_proj = Linear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias)

    def forward(self, x: torch.Tensor, lora=None) -> torch.Tensor:
        """x: [T, hidden] -> [T, hidden]; `lora`: the step's adapter rows (see `project`)."""
        gate, up = project(self.gate_up_proj, x, lora).split(self.intermediate_size, dim=-1)
        return project(self.down_proj, self.activation(gate) * up, lora)

    def activation(self, gate: torch.Tensor) -> torch.Tensor:
        """SwiGLU's gate activation; an architecture with another overrides this (Gemma: GeLU-tanh)."""
        return F.silu(gate)


class DecoderLayer(nn.Module):
    # Whether `forward` hands the step's LoRA rows to its dense MLP (`models.lora` refuses
    # MLP adapters on a layer whose forward of its own does not).
    MLP_TAKES_LORA = True

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.self_attn = Attention(config)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x, rope, kv_cache, layer, meta):
        x = x + self.self_attn(self.input_layernorm(x), rope, kv_cache, layer, meta)
        # A sparse MLP (mixture of experts) in the MLP's place takes no LoRA rows.
        lora = meta.lora if isinstance(self.mlp, MLP) else None
        return x + project(self.mlp, self.post_attention_layernorm(x), lora)


class DecoderModel(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.embed_tokens = Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(config)


class DecoderForCausalLM(nn.Module):
    """Parameter names follow the Hugging Face checkpoints, except the fused projections."""

    # Sliding windows some layers attend with instead of `config.sliding_window` (Gemma's local
    # layers): the batch builder prepares each one's attention groups once per step.
    layer_windows: tuple[int, ...] = ()

    @classmethod
    def check_config(cls, config: ModelConfig) -> None:
        """Raises ConfigError for a config this architecture cannot run (beyond the activation);
        called on config.json alone, before any weight is read or fetched."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.model = DecoderModel(config)
        self.lm_head = Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """input_ids: [T]; kv_cache: [N, L, 2, block_size, Hkv, D] -> final hidden states [T, hidden]."""
        x = self.model.embed_tokens(input_ids)
        rope = self.model.rotary_emb(meta.positions, x.dtype, meta.sequence_lengths)
        for index, layer in enumerate(self.model.layers):
            x = layer(x, rope, kv_cache, index, meta)
        return self.model.norm(x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor | None:
        """hidden: [R, hidden] (only the rows that need logits) -> [R, vocab] float32; None on
        the ranks > 0 of a tensor-parallel model, whose LM head gathers the logits on rank 0."""
        logits = self.lm_head(hidden)
        return None if logits is None else logits.float()
