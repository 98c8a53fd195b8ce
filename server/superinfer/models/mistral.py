"""Mistral: the Llama decoder without biases, with the sliding attention window of its config
(Mistral 7B v0.1 uses 4096; later versions set none)."""
from dataclasses import replace

from .config import ModelConfig
from .decoder import DecoderForCausalLM


class MistralForCausalLM(DecoderForCausalLM):
    def __init__(self, config: ModelConfig):
        super().__init__(replace(config, qkv_bias=False, o_proj_bias=False, mlp_bias=False))
