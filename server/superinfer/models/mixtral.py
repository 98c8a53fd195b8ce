"""Mixtral: Mistral attention (with the sliding window of its config, if any) and a sparse
mixture-of-experts MLP in every layer (`moe.SparseMoeBlock`; the checkpoints' `block_sparse_moe`
with experts w1/w3/w2 is renamed by the loader)."""
from dataclasses import replace

from .config import ConfigError, ModelConfig
from .decoder import DecoderForCausalLM
from .moe import SparseMoeBlock, moe_config


class MixtralForCausalLM(DecoderForCausalLM):
    @classmethod
    def check_config(cls, config: ModelConfig) -> None:
        if moe_config(config) is None:
            raise ConfigError(f"{config.architecture} config names no experts (num_local_experts)")

    def __init__(self, config: ModelConfig):
        super().__init__(replace(config, qkv_bias=False, o_proj_bias=False, mlp_bias=False))
        # Mixtral always renormalises its top-k weights (its config has no norm_topk_prob).
        moe = replace(moe_config(config), normalize_top_k=True)
        for layer in self.model.layers:
            layer.mlp = SparseMoeBlock(config.hidden_size, moe)
