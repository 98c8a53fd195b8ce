"""Qwen3: the Llama decoder with an RMSNorm over head_dim on every query and key head before
RoPE (`q_norm` / `k_norm`), an explicit `head_dim` and the optional `attention_bias` (Q/K/V and
o_proj).

Qwen3's optional per-layer sliding window (`use_sliding_window`) is off in every released
checkpoint; a config that turns it on is refused."""
from dataclasses import replace

from .config import ConfigError, ModelConfig
from .decoder import DecoderForCausalLM, RMSNorm


class Qwen3ForCausalLM(DecoderForCausalLM):
    @classmethod
    def check_config(cls, config: ModelConfig) -> None:
        if config.raw.get("use_sliding_window"):
            raise ConfigError(f"{config.architecture} with use_sliding_window (a window on some layers only) is "
                              "not supported")

    def __init__(self, config: ModelConfig):
        super().__init__(replace(config, mlp_bias=False, sliding_window=None))
        for layer in self.model.layers:
            layer.self_attn.q_norm = RMSNorm(config.head_dim, config.rms_norm_eps)
            layer.self_attn.k_norm = RMSNorm(config.head_dim, config.rms_norm_eps)
