"""Granite (the Llama decoder with embedding, residual, attention and logits multipliers)
against transformers on a random checkpoint, chunked prefill, two gloo ranks; multipliers that
are not positive are refused from the config."""
import pytest
from architecture_checks import check_matches_transformers, check_tensor_parallel

from superinfer.models.config import ConfigError
from superinfer.models.registry import check_config

# Granite 3's own proportions (8B: embedding 12, residual 0.22, attention 1/128, logits 16),
# scaled to the tiny model so that every multiplier moves the logits.
MULTIPLIERS = dict(embedding_multiplier=6.0, residual_multiplier=0.3, attention_multiplier=0.125, logits_scaling=4.0)


def test_granite_matches_transformers(tmp_path):
    runner = check_matches_transformers(tmp_path, "granite", **MULTIPLIERS)
    assert runner.model.model.layers[0].self_attn.scale == 0.125


def test_granite_tensor_parallel(tmp_path):
    check_tensor_parallel(tmp_path, "granite", **MULTIPLIERS)


@pytest.mark.parametrize("name", ["embedding_multiplier", "residual_multiplier", "logits_scaling"])
def test_a_multiplier_that_is_not_positive_is_refused(name):
    raw = {"model_type": "granite", "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128,
           "num_hidden_layers": 2, "num_attention_heads": 4, name: 0.0}
    with pytest.raises(ConfigError, match=f"{name} must be positive"):
        check_config(raw)
