"""Gemma 2 and Gemma 3 (text): the Llama decoder with Gemma's RMSNorm (x·(1 + w), in float32),
four norms per layer (before and after attention, before and after the MLP), a GeLU-tanh MLP,
embeddings scaled by sqrt(hidden), softmax scale query_pre_attn_scalar^-1/2, and local
(sliding-window) layers alternating with global ones. Gemma 2 soft-caps attention scores and
final logits; Gemma 3 normalises queries and keys per head, gives its local layers a RoPE base
of their own (`rope_local_base_freq`) and soft-caps final logits only when its config says so
(its attention never caps, as in the reference implementation, whatever `attn_logit_softcapping`
says).

KV memory: a local layer reads at most `sliding_window` keys per query — the SDPA path gathers
only those (`AttentionMetadata.window_groups`), the Triton kernels start their key loop at the
window — but every layer's K/V is still written for every position, and blocks outside the
window stay allocated: a block holds the K/V of every layer for its positions (the pool is
block-first) and the global layers read the whole context, so no block falls out of use while
its request lives. The router's block manager frees them when the request ends, as for any
model; KV memory per token is that of a full-attention model of the same shape."""
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .attention import AttentionMetadata, paged_attention
from .config import ConfigError, ModelConfig, RopeConfig, rope_from_hf
from .decoder import MLP, Attention, DecoderForCausalLM, DecoderLayer, RMSNorm, project
from .rotary import RotaryEmbedding

_LAYER_TYPES = ("sliding_attention", "full_attention")


@dataclass(frozen=True)
class GemmaSpec:
    """What a Gemma config.json says beyond the fields every decoder reads."""

    # Per layer: True for a local (sliding-window) layer, False for a global one.
    sliding: tuple[bool, ...]
    # Keys a local layer's query sees, its own included; None: local layers attend globally.
    window: int | None
    scale: float
    attn_softcap: float | None
    final_softcap: float | None
    local_rope: RopeConfig
    global_rope: RopeConfig


def _layer_kinds(raw: Mapping[str, Any], num_layers: int, pattern: int) -> tuple[bool, ...]:
    """`layer_types` when the config lists them; else every `pattern`-th layer is global."""
    types = raw.get("layer_types")
    if types is None:
        return tuple(bool((index + 1) % pattern) for index in range(num_layers))
    if len(types) != num_layers or not set(types) <= set(_LAYER_TYPES):
        raise ConfigError(f"layer_types must name {num_layers} layers, each one of {', '.join(_LAYER_TYPES)}; "
                          f"got {list(types)}")
    return tuple(kind == "sliding_attention" for kind in types)


def _optional_float(raw: Mapping[str, Any], key: str, default: float | None) -> float | None:
    value = raw.get(key, default)
    return None if value is None else float(value)


def _spec(config: ModelConfig, pattern: int, attn_softcap: float | None, final_softcap: float | None,
          local_rope: RopeConfig, global_rope: RopeConfig) -> GemmaSpec:
    raw = config.raw
    if raw.get("use_bidirectional_attention"):
        raise ConfigError("bidirectional attention (use_bidirectional_attention) is not supported")
    if raw.get("hidden_activation", "gelu_pytorch_tanh") != "gelu_pytorch_tanh":
        raise ConfigError(f"unsupported hidden_activation {raw['hidden_activation']!r} for {config.architecture}; "
                          f"supported: gelu_pytorch_tanh")
    window = raw.get("sliding_window", 4096)
    if window is not None and int(window) < 1:
        raise ConfigError(f"sliding_window must be positive, got {window}")
    for name, cap in (("attn_logit_softcapping", attn_softcap), ("final_logit_softcapping", final_softcap)):
        if cap is not None and cap <= 0:
            raise ConfigError(f"{name} must be positive, got {cap}")
    return GemmaSpec(
        sliding=_layer_kinds(raw, config.num_layers, pattern),
        window=None if window is None else int(window),
        scale=float(raw.get("query_pre_attn_scalar", 256)) ** -0.5,
        attn_softcap=attn_softcap, final_softcap=final_softcap, local_rope=local_rope, global_rope=global_rope,
    )


def gemma2_spec(config: ModelConfig) -> GemmaSpec:
    # Defaults are transformers' Gemma2Config's: layers alternate local (even) and global (odd).
    raw = config.raw
    return _spec(config, 2, _optional_float(raw, "attn_logit_softcapping", 50.0),
                 _optional_float(raw, "final_logit_softcapping", 30.0), config.rope, config.rope)


def _gemma3_ropes(raw: Mapping[str, Any]) -> tuple[RopeConfig, RopeConfig]:
    """(local, global) RoPE: transformers >= 5 writes `rope_parameters` per layer type; older
    configs `rope_theta` + `rope_scaling` (global) and `rope_local_base_freq` (local)."""
    params = raw.get("rope_parameters") or {}
    if "full_attention" in params or "sliding_attention" in params:
        full, local = dict(params.get("full_attention") or {}), dict(params.get("sliding_attention") or {})
    else:
        full = dict(params) or {**(raw.get("rope_scaling") or {})}
        local = {}
    full.setdefault("rope_theta", raw.get("rope_theta", 1_000_000.0))
    local.setdefault("rope_theta", raw.get("rope_local_base_freq", 10_000.0))
    positions = {"max_position_embeddings": raw.get("max_position_embeddings", 8192)}
    return (rope_from_hf({**positions, "rope_parameters": local}),
            rope_from_hf({**positions, "rope_parameters": full}))


def gemma3_spec(config: ModelConfig) -> GemmaSpec:
    raw = config.raw
    pattern = int(raw.get("sliding_window_pattern", raw.get("_sliding_window_pattern", 6)))
    if pattern < 1:
        raise ConfigError(f"sliding_window_pattern must be positive, got {pattern}")
    local_rope, global_rope = _gemma3_ropes(raw)
    return _spec(config, pattern, None, _optional_float(raw, "final_logit_softcapping", None), local_rope,
                 global_rope)


class GemmaRMSNorm(RMSNorm):
    """Scales by 1 + w: checkpoints store the offset from one (zero: the identity)."""

    def __init__(self, size: int, eps: float):
        super().__init__(size, eps)
        self.weight = nn.Parameter(torch.zeros(size), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalised and scaled in float32, rounded once at the end, as the reference does.
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x32 * (1.0 + self.weight.float())).to(x.dtype)


class GemmaMLP(MLP):
    def activation(self, gate: torch.Tensor) -> torch.Tensor:
        return F.gelu(gate, approximate="tanh")


class GemmaAttention(Attention):
    def __init__(self, config: ModelConfig, spec: GemmaSpec, sliding: bool, qk_norm: bool):
        super().__init__(config)
        self.window = spec.window if sliding else None
        self.scale = spec.scale
        self.softcap = spec.attn_softcap
        if qk_norm:
            self.q_norm = GemmaRMSNorm(config.head_dim, config.rms_norm_eps)
            self.k_norm = GemmaRMSNorm(config.head_dim, config.rms_norm_eps)

    def attend(self, q: torch.Tensor, kv_cache: torch.Tensor, layer: int, meta: AttentionMetadata) -> torch.Tensor:
        return paged_attention(q, kv_cache, layer, meta, self.window, self.scale, self.softcap)


class GemmaDecoderLayer(DecoderLayer):
    def __init__(self, config: ModelConfig, attention: GemmaAttention):
        super().__init__(config)
        self.self_attn = attention
        self.mlp = GemmaMLP(config)
        size, eps = config.hidden_size, config.rms_norm_eps
        self.input_layernorm = GemmaRMSNorm(size, eps)
        self.post_attention_layernorm = GemmaRMSNorm(size, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(size, eps)
        self.post_feedforward_layernorm = GemmaRMSNorm(size, eps)

    def forward(self, x, rope, kv_cache, layer, meta):
        # Each block's output is normalised too before it joins the residual stream.
        x = x + self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), rope, kv_cache, layer, meta))
        return x + self.post_feedforward_layernorm(project(self.mlp, self.pre_feedforward_layernorm(x), meta.lora))


class GemmaForCausalLM(DecoderForCausalLM):
    """What Gemma 2 and 3 share; each version says how its config reads (`spec`) and whether
    its attention normalises queries and keys."""

    QK_NORM = False

    @staticmethod
    def spec(config: ModelConfig) -> GemmaSpec:
        raise NotImplementedError

    @classmethod
    def check_config(cls, config: ModelConfig) -> None:
        cls.spec(config)

    def __init__(self, config: ModelConfig):
        spec = self.spec(config)
        # Windows are per layer here (`layer_windows`), not the step's; the MLP has no biases.
        super().__init__(replace(config, sliding_window=None, mlp_bias=False, rope=spec.global_rope))
        self.gemma = spec
        self.layer_windows = (spec.window,) if spec.window is not None and any(spec.sliding) else ()
        self.model.layers = nn.ModuleList(
            GemmaDecoderLayer(self.config, GemmaAttention(self.config, spec, sliding, self.QK_NORM))
            for sliding in spec.sliding
        )
        self.model.norm = GemmaRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.model.local_rotary_emb = (
            None if spec.local_rope == spec.global_rope else RotaryEmbedding(replace(self.config, rope=spec.local_rope))
        )

    def forward(self, input_ids: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """input_ids: [T]; kv_cache: [N, L, 2, block_size, Hkv, D] -> final hidden states [T, hidden]."""
        x = self.model.embed_tokens(input_ids)
        # sqrt(hidden) rounded to the compute dtype first, as the reference scales.
        x = x * torch.tensor(self.config.hidden_size**0.5).to(x.dtype).item()
        global_rope = self.model.rotary_emb(meta.positions, x.dtype)
        local_rope = global_rope
        if self.model.local_rotary_emb is not None:
            local_rope = self.model.local_rotary_emb(meta.positions, x.dtype)
        for index, (layer, sliding) in enumerate(zip(self.model.layers, self.gemma.sliding)):
            x = layer(x, local_rope if sliding else global_rope, kv_cache, index, meta)
        return self.model.norm(x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor | None:
        logits = super().compute_logits(hidden)
        cap = self.gemma.final_softcap
        if logits is None or cap is None:
            return logits
        return torch.tanh(logits / cap) * cap


class Gemma2ForCausalLM(GemmaForCausalLM):
    spec = staticmethod(gemma2_spec)


class Gemma3TextForCausalLM(GemmaForCausalLM):
    QK_NORM = True
    spec = staticmethod(gemma3_spec)
