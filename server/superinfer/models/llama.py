"""Llama (Llama 2, Llama 3 with its rope scaling, SmolLM2): the plain decoder, with the
optional `attention_bias` / `mlp_bias` of its config."""
from dataclasses import replace

from .config import ModelConfig
from .decoder import DecoderForCausalLM


class LlamaForCausalLM(DecoderForCausalLM):
    def __init__(self, config: ModelConfig):
        # Llama attends over the full causal context whatever a config says about windows.
        super().__init__(replace(config, sliding_window=None))
