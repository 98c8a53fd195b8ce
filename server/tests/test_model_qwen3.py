"""Qwen3 (per-head q/k RMSNorm before RoPE, explicit head_dim, optional attention bias)
against transformers on random checkpoints of two shapes, chunked prefill, two gloo ranks."""
import pytest
from architecture_checks import check_matches_transformers, check_tensor_parallel

from superinfer.models.config import ConfigError
from superinfer.models.registry import check_config

SHAPES = {
    # head_dim 32 while hidden / heads is 16.
    "wide-heads": dict(num_attention_heads=4, num_key_value_heads=2, head_dim=32),
    "biased": dict(num_hidden_layers=3, num_attention_heads=8, num_key_value_heads=4, head_dim=16,
                   attention_bias=True, tie_word_embeddings=True),
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_qwen3_matches_transformers(shape, tmp_path):
    runner = check_matches_transformers(tmp_path, "qwen3", **SHAPES[shape])
    attention = runner.model.model.layers[0].self_attn
    assert tuple(attention.q_norm.weight.shape) == tuple(attention.k_norm.weight.shape) == (attention.head_dim,)
    assert (attention.o_proj.bias is not None) == SHAPES[shape].get("attention_bias", False)


def test_qwen3_tensor_parallel(tmp_path):
    # Two KV heads over two ranks; the q/k norms are replicated.
    check_tensor_parallel(tmp_path, "qwen3", num_attention_heads=4, num_key_value_heads=2, head_dim=32)


def test_a_per_layer_sliding_window_is_refused():
    raw = {"model_type": "qwen3", "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128,
           "num_hidden_layers": 2, "num_attention_heads": 4, "use_sliding_window": True, "sliding_window": 16}
    with pytest.raises(ConfigError, match="use_sliding_window"):
        check_config(raw)
