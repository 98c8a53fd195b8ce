"""The typed model configuration every architecture is built from, parsed once from a Hugging
Face `config.json` dictionary."""
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


class ConfigError(ValueError):
    """A model config is missing a field or asks for something this server does not support."""


@dataclass(frozen=True)
class RopeConfig:
    theta: float
    # "default", "linear", "llama3", "longrope" or "yarn".
    kind: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    # The leading fraction of head_dim that is rotated (Phi-4-mini: 0.75); the rest passes as is.
    partial_rotary_factor: float = 1.0
    # "longrope" (Phi-3): a divisor per frequency for sequences up to / longer than
    # original_max_position_embeddings, and the multiplier of cos and sin.
    short_factor: tuple[float, ...] = ()
    long_factor: tuple[float, ...] = ()
    attention_factor: float = 1.0
    # "yarn" (Qwen2.5/3 long context, DeepSeek): frequencies slowed by `factor` below
    # `beta_slow` rotations over the original context, kept above `beta_fast`, blended between
    # (the band's edges rounded outwards unless not `truncate`); cos and sin times attention_factor.
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = True


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    rope: RopeConfig
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_proj_bias: bool = False
    mlp_bias: bool = False
    # Keys further back than this many positions are not attended (Mistral); None: full causal.
    sliding_window: int | None = None
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)
    # The MLP's activation as the checkpoint names it (`hidden_act` / `hidden_activation`); each
    # architecture says which it implements (`architectures.Architecture.activations`).
    activation: str = "silu"
    # The whole `config.json`, for the fields only one architecture reads (its module parses them).
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)


_SUPPORTED_ROPE = ("default", "linear", "llama3", "longrope", "yarn")
# Earlier names of a supported scaling: Phi-3's first checkpoints call LongRoPE "su".
_ROPE_ALIASES = {"su": "longrope"}


def rope_from_hf(raw: dict[str, Any]) -> RopeConfig:
    # transformers >= 5 writes `rope_parameters`; older configs `rope_theta` + `rope_scaling`.
    params = dict(raw.get("rope_parameters") or {})
    if not params:
        params = {"rope_theta": raw.get("rope_theta", 10000.0), **(raw.get("rope_scaling") or {})}
    kind = params.get("rope_type", params.get("type", "default"))
    kind = _ROPE_ALIASES.get(kind, kind)
    if kind not in _SUPPORTED_ROPE:
        raise ConfigError(f"unsupported rope scaling {kind!r}; supported: {', '.join(_SUPPORTED_ROPE)}")
    if kind == "longrope":
        return _longrope_from_hf(raw, params)
    if kind == "yarn":
        return _yarn_from_hf(raw, params)
    return RopeConfig(
        theta=float(params.get("rope_theta", raw.get("rope_theta", 10000.0))),
        kind=kind,
        factor=float(params.get("factor", 1.0)),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=int(
            params.get("original_max_position_embeddings", raw.get("max_position_embeddings", 8192))
        ),
        partial_rotary_factor=_partial_rotary_factor(raw, params),
    )


def _partial_rotary_factor(raw: dict[str, Any], params: dict[str, Any]) -> float:
    return float(params.get("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0)))


def _context_extension(raw: dict[str, Any], params: dict[str, Any]) -> tuple[int, float]:
    """LongRoPE's and YaRN's original context and factor, as transformers reads them: a
    top-level `original_max_position_embeddings` (where Phi-3 keeps it) wins over the rope
    parameters' (then the model's max); without `factor`, max / original max."""
    max_positions = int(raw.get("max_position_embeddings", 2048))
    original = int(raw.get("original_max_position_embeddings")
                   or params.get("original_max_position_embeddings") or max_positions)
    return original, float(params.get("factor") or max_positions / original)


def _longrope_from_hf(raw: dict[str, Any], params: dict[str, Any]) -> RopeConfig:
    """LongRoPE as transformers reads it (`_context_extension`); the factor sets the default
    cos/sin multiplier."""
    original, factor = _context_extension(raw, params)
    attention_factor = params.get("attention_factor")
    if attention_factor is None:
        attention_factor = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    try:
        short_factor = tuple(float(f) for f in params["short_factor"])
        long_factor = tuple(float(f) for f in params["long_factor"])
    except (KeyError, TypeError, ValueError):
        raise ConfigError("longrope scaling needs short_factor and long_factor lists of numbers") from None
    return RopeConfig(
        theta=float(params.get("rope_theta", raw.get("rope_theta", 10000.0))),
        kind="longrope",
        factor=factor,
        original_max_position_embeddings=original,
        partial_rotary_factor=_partial_rotary_factor(raw, params),
        short_factor=short_factor,
        long_factor=long_factor,
        attention_factor=float(attention_factor),
    )


def _yarn_from_hf(raw: dict[str, Any], params: dict[str, Any]) -> RopeConfig:
    """YaRN as transformers reads it (`_context_extension`); without `attention_factor`,
    0.1 ln(factor) + 1, or the ratio of that with `mscale` to that with `mscale_all_dim` when
    both are given (DeepSeek)."""
    original, factor = _context_extension(raw, params)

    def magnitude(scale: float, mscale: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0

    attention_factor = params.get("attention_factor")
    if attention_factor is None:
        mscale, mscale_all_dim = params.get("mscale"), params.get("mscale_all_dim")
        attention_factor = (magnitude(factor, mscale) / magnitude(factor, mscale_all_dim) if mscale and mscale_all_dim
                            else magnitude(factor))
    return RopeConfig(
        theta=float(params.get("rope_theta", raw.get("rope_theta", 10000.0))),
        kind="yarn",
        factor=factor,
        original_max_position_embeddings=original,
        partial_rotary_factor=_partial_rotary_factor(raw, params),
        attention_factor=float(attention_factor),
        beta_fast=float(params.get("beta_fast") or 32),
        beta_slow=float(params.get("beta_slow") or 1),
        truncate=bool(params.get("truncate", True)),
    )


def _check_rope(rope: RopeConfig, head_dim: int) -> RopeConfig:
    rotary_dim = int(head_dim * rope.partial_rotary_factor)
    if rotary_dim <= 0 or rotary_dim % 2:
        raise ConfigError(f"partial_rotary_factor {rope.partial_rotary_factor} rotates {rotary_dim} of the "
                          f"{head_dim} dimensions of a head; that must be a positive even number")
    if rope.kind == "longrope" and not len(rope.short_factor) == len(rope.long_factor) == rotary_dim // 2:
        raise ConfigError(f"longrope short_factor and long_factor must have {rotary_dim // 2} entries (half the "
                          f"rotated dimensions), got {len(rope.short_factor)} and {len(rope.long_factor)}")
    return rope


def _as_ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)


def model_config_from_hf(raw: dict[str, Any]) -> ModelConfig:
    """Reads the fields every supported decoder needs; raises ConfigError naming a missing one."""
    try:
        num_heads = int(raw["num_attention_heads"])
        hidden_size = int(raw["hidden_size"])
        head_dim = int(raw.get("head_dim") or hidden_size // num_heads)
        return ModelConfig(
            architecture=str(raw["model_type"]),
            vocab_size=int(raw["vocab_size"]),
            hidden_size=hidden_size,
            intermediate_size=int(raw["intermediate_size"]),
            num_layers=int(raw["num_hidden_layers"]),
            num_heads=num_heads,
            num_kv_heads=int(raw.get("num_key_value_heads") or num_heads),
            head_dim=head_dim,
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
            rope=_check_rope(rope_from_hf(raw), head_dim),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            qkv_bias=bool(raw.get("attention_bias", False)),
            o_proj_bias=bool(raw.get("attention_bias", False)),
            mlp_bias=bool(raw.get("mlp_bias", False)),
            sliding_window=raw.get("sliding_window"),
            bos_token_id=raw.get("bos_token_id"),
            eos_token_ids=_as_ids(raw.get("eos_token_id")),
            activation=str(raw.get("hidden_act") or raw.get("hidden_activation") or "silu"),
            raw=raw,
        )
    except KeyError as missing:
        raise ConfigError(f"model config lacks the field {missing.args[0]!r}") from None
