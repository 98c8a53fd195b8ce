"""IBM Granite (3.x dense): the Llama decoder with four multipliers from its config — the
embeddings times `embedding_multiplier`, each attention and MLP output times
`residual_multiplier` before it joins the residual stream, `attention_multiplier` as the softmax
scale (in place of 1/sqrt(head_dim)), and the logits divided by `logits_scaling`."""
from .attention import AttentionMetadata, paged_attention
from .config import ConfigError, ModelConfig
from .decoder import MLP, Attention, DecoderForCausalLM, DecoderLayer, project


def _multiplier(config: ModelConfig, name: str) -> float:
    value = float(config.raw.get(name, 1.0))
    if value <= 0:
        raise ConfigError(f"{name} must be positive, got {value}")
    return value


class GraniteAttention(Attention):
    def __init__(self, config: ModelConfig):
        super().__init__(config)
        self.scale = float(config.raw.get("attention_multiplier", config.head_dim**-0.5))

    def attend(self, q, kv_cache, layer: int, meta: AttentionMetadata):
        return paged_attention(q, kv_cache, layer, meta, scale=self.scale)


class GraniteDecoderLayer(DecoderLayer):
    def __init__(self, config: ModelConfig):
        super().__init__(config)
        self.self_attn = GraniteAttention(config)
        self.residual_multiplier = _multiplier(config, "residual_multiplier")

    def forward(self, x, rope, kv_cache, layer, meta):
        x = x + self.self_attn(self.input_layernorm(x), rope, kv_cache, layer, meta) * self.residual_multiplier
        lora = meta.lora if isinstance(self.mlp, MLP) else None
        return x + project(self.mlp, self.post_attention_layernorm(x), lora) * self.residual_multiplier


class GraniteForCausalLM(DecoderForCausalLM):
    @classmethod
    def check_config(cls, config: ModelConfig) -> None:
        for name in ("embedding_multiplier", "residual_multiplier", "logits_scaling"):
            _multiplier(config, name)

    def __init__(self, config: ModelConfig):
        super().__init__(config)
        for index in range(config.num_layers):
            self.model.layers[index] = GraniteDecoderLayer(config)
        self.embedding_multiplier = _multiplier(config, "embedding_multiplier")
        self.logits_scaling = _multiplier(config, "logits_scaling")

    def forward(self, input_ids, kv_cache, meta: AttentionMetadata):
        x = self.model.embed_tokens(input_ids) * self.embedding_multiplier
        rope = self.model.rotary_emb(meta.positions, x.dtype, meta.sequence_lengths)
        for index, layer in enumerate(self.model.layers):
            x = layer(x, rope, kv_cache, index, meta)
        return self.model.norm(x)

    def compute_logits(self, hidden):
        logits = super().compute_logits(hidden)
        return None if logits is None else logits / self.logits_scaling
