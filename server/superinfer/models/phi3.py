"""Phi-3 and Phi-4-mini (`phi3`): the Llama decoder without biases, with the sliding attention
window of its config on every layer (Phi-3-mini-4k: 2047), RoPE over the leading
`partial_rotary_factor` of each head (Phi-4-mini: 0.75) and LongRoPE scaling for the long-context
checkpoints (rotary.py says how its frequency set is chosen per sequence).

The checkpoints store Q/K/V and gate/up already fused, in the layout of our fused modules."""
from dataclasses import replace

from .config import ModelConfig
from .decoder import DecoderForCausalLM


class Phi3ForCausalLM(DecoderForCausalLM):
    def __init__(self, config: ModelConfig):
        super().__init__(replace(config, qkv_bias=False, o_proj_bias=False, mlp_bias=False))
