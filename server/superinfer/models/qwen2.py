"""Qwen2: the Llama decoder with biases on the Q/K/V projections (not on o_proj or the MLP).

Qwen2's optional per-layer sliding window (`use_sliding_window`) is off in every released
checkpoint; it is not applied."""
from dataclasses import replace

from .config import ModelConfig
from .decoder import DecoderForCausalLM


class Qwen2ForCausalLM(DecoderForCausalLM):
    def __init__(self, config: ModelConfig):
        super().__init__(
            replace(config, qkv_bias=True, o_proj_bias=False, mlp_bias=False, sliding_window=None)
        )
