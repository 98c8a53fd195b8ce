"""Qwen3-MoE: Qwen3 attention with sparse mixture-of-experts MLPs (`moe.SparseMoeBlock`). Layer
i is sparse unless it is in `mlp_only_layers` or (i + 1) is not a multiple of
`decoder_sparse_step`; the others keep a dense MLP of `intermediate_size`."""
from .config import ConfigError, ModelConfig
from .moe import SparseMoeBlock, moe_config
from .qwen3 import Qwen3ForCausalLM


def sparse_layers(config: ModelConfig) -> list[int]:
    """Indices of the layers whose MLP is a mixture of experts."""
    if moe_config(config) is None:
        return []
    step = int(config.raw.get("decoder_sparse_step", 1))
    if step < 1:
        raise ConfigError(f"decoder_sparse_step must be at least 1, got {step}")
    dense = set(config.raw.get("mlp_only_layers") or ())
    return [i for i in range(config.num_layers) if i not in dense and (i + 1) % step == 0]


class Qwen3MoeForCausalLM(Qwen3ForCausalLM):
    @classmethod
    def check_config(cls, config: ModelConfig) -> None:
        super().check_config(config)
        sparse_layers(config)

    def __init__(self, config: ModelConfig):
        super().__init__(config)
        moe = moe_config(config)
        for index in sparse_layers(config):
            self.model.layers[index].mlp = SparseMoeBlock(config.hidden_size, moe)
