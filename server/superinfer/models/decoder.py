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


class Linear(nn.Module):
    """nn.Linear without weight initialisation: every parameter comes from the checkpoint, and
    initialising on the meta device would import torch's decompositions (seconds at start-up)."""

    def __init__(self, in_features: int, out_features: int, bias: bool):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(out_features), requires_grad=False) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


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
        q, k, v = self.qkv_proj(x).split(self.split, dim=-1)
        q = apply_rotary(q.view(num_tokens, self.num_heads, self.head_dim), *rope)  # [T, H, D]
        k = apply_rotary(k.view(num_tokens, self.num_kv_heads, self.head_dim), *rope)  # [T, Hkv, D]
        write_kv(kv_cache, layer, k, v.view(num_tokens, self.num_kv_heads, self.head_dim), meta)
        return self.o_proj(paged_attention(q, kv_cache, layer, meta))


class MLP(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.intermediate_size = config.intermediate_size
        self.gate_up_proj = Linear(config.hidden_size, 2 * config.intermediate_size, bias=config.mlp_bias)
        self.down_proj = Linear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).split(self.intermediate_size, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.self_attn = Attention(config)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x, rope, kv_cache, layer, meta):
        x = x + self.self_attn(self.input_layernorm(x), rope, kv_cache, layer, meta)
        return x + self.mlp(self.post_attention_layernorm(x))


class DecoderModel(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.embed_tokens = Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(config)


class DecoderForCausalLM(nn.Module):
    """Parameter names follow the Hugging Face checkpoints, except the fused projections."""

    # The MLP activations (config.json's names) this architecture implements.
    ACTIVATIONS: tuple[str, ...] = ("silu",)

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
        rope = self.model.rotary_emb(meta.positions, x.dtype)
        for index, layer in enumerate(self.model.layers):
            x = layer(x, rope, kv_cache, index, meta)
        return self.model.norm(x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor | None:
        """hidden: [R, hidden] (only the rows that need logits) -> [R, vocab] float32; None on
        the ranks > 0 of a tensor-parallel model, whose LM head gathers the logits on rank 0."""
        logits = self.lm_head(hidden)
        return None if logits is None else logits.float()
