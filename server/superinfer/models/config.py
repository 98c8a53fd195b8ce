"""The typed model configuration every architecture is built from, parsed once from a Hugging
Face `config.json` dictionary."""
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


class ConfigError(ValueError):
    """A model config is missing a field or asks for something this server does not support."""


@dataclass(frozen=True)
class RopeConfig:
    theta: float
    # "default", "linear" or "llama3".
    kind: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


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
    # architecture says which it implements (`DecoderForCausalLM.ACTIVATIONS`).
    activation: str = "silu"
    # The whole `config.json`, for the fields only one architecture reads (its module parses them).
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)


_SUPPORTED_ROPE = ("default", "linear", "llama3")


def rope_from_hf(raw: dict[str, Any]) -> RopeConfig:
    # transformers >= 5 writes `rope_parameters`; older configs `rope_theta` + `rope_scaling`.
    params = dict(raw.get("rope_parameters") or {})
    if not params:
        params = {"rope_theta": raw.get("rope_theta", 10000.0), **(raw.get("rope_scaling") or {})}
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in _SUPPORTED_ROPE:
        raise ConfigError(f"unsupported rope scaling {kind!r}; supported: {', '.join(_SUPPORTED_ROPE)}")
    return RopeConfig(
        theta=float(params.get("rope_theta", raw.get("rope_theta", 10000.0))),
        kind=kind,
        factor=float(params.get("factor", 1.0)),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=int(
            params.get("original_max_position_embeddings", raw.get("max_position_embeddings", 8192))
        ),
    )


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
            rope=rope_from_hf(raw),
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
