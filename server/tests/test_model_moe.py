"""Sparse mixture-of-experts models: the grouped expert computation against a per-token
reference, Qwen3-MoE (dense layers among the sparse ones, top-k renormalised or not) and
Mixtral against transformers, Mixtral's original per-expert weight names, and gloo ranks each
holding a slice of every expert."""
import json

import pytest
import torch
from architecture_checks import check_matches_transformers, check_tensor_parallel
from conftest import build_tiny_model, make_runner, runner_logits
from safetensors.torch import load_file, save_file

from superinfer.models.config import ConfigError, model_config_from_hf
from superinfer.models.moe import SparseMoeBlock, dense_experts, grouped_experts, route
from superinfer.models.registry import check_config
from superinfer.models.tensor_parallel import partition


def _naive_experts(x, weights, experts, gate_up, down):
    # One token and one of its experts at a time.
    out = torch.zeros_like(x)
    for token in range(x.shape[0]):
        for slot in range(experts.shape[1]):
            expert = int(experts[token, slot])
            gate, up = (gate_up[expert] @ x[token]).chunk(2)
            out[token] += weights[token, slot] * (down[expert] @ (torch.nn.functional.silu(gate) * up))
    return out


@pytest.mark.parametrize("tokens, num_experts, top_k, normalize", [(1, 4, 2, True), (13, 5, 2, False), (40, 8, 3, True)])
def test_grouped_experts_equal_a_per_token_reference(tokens, num_experts, top_k, normalize):
    generator = torch.Generator().manual_seed(tokens)
    hidden, inner = 16, 12
    x = torch.randn(tokens, hidden, generator=generator)
    gate_up = torch.randn(num_experts, 2 * inner, hidden, generator=generator)
    down = torch.randn(num_experts, hidden, inner, generator=generator)
    weights, experts = route(torch.randn(tokens, num_experts, generator=generator), top_k, normalize)
    if normalize:
        torch.testing.assert_close(weights.sum(-1), torch.ones(tokens))
    expected = _naive_experts(x, weights, experts, gate_up, down)
    torch.testing.assert_close(grouped_experts(x, weights, experts, gate_up, down), expected, rtol=1e-5, atol=1e-4)
    # The fixed-shape form CUDA graphs capture.
    torch.testing.assert_close(dense_experts(x, weights, experts, gate_up, down), expected, rtol=1e-5, atol=1e-4)


QWEN3_MOE_SHAPES = {
    # Layer 0 dense, layer 1 sparse; top-2 weights as the softmax leaves them.
    "sparse-step-2": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, decoder_sparse_step=2,
                          norm_topk_prob=False),
    # Layer 0 dense by mlp_only_layers, 8 experts, top-3 renormalised, head_dim 32 over 8 heads.
    "mlp-only-layer-0": dict(num_hidden_layers=3, num_attention_heads=8, num_key_value_heads=2, head_dim=32,
                             num_experts=8, num_experts_per_tok=3, moe_intermediate_size=48, mlp_only_layers=[0],
                             norm_topk_prob=True),
}


@pytest.mark.parametrize("shape", sorted(QWEN3_MOE_SHAPES))
def test_qwen3_moe_matches_transformers(shape, tmp_path):
    runner = check_matches_transformers(tmp_path, "qwen3_moe", **QWEN3_MOE_SHAPES[shape])
    layers = runner.model.model.layers
    assert not isinstance(layers[0].mlp, SparseMoeBlock)
    assert all(isinstance(layer.mlp, SparseMoeBlock) for layer in layers[1:])
    assert layers[0].self_attn.q_norm is not None


MIXTRAL_SHAPES = {
    "4-experts-top-2": dict(num_local_experts=4, num_experts_per_tok=2),
    # A sliding window shorter than the prompt, four KV heads, three layers.
    "window": dict(num_local_experts=4, num_experts_per_tok=2, num_hidden_layers=3, num_attention_heads=8,
                   num_key_value_heads=4, intermediate_size=96, sliding_window=24),
}


@pytest.mark.parametrize("shape", sorted(MIXTRAL_SHAPES))
def test_mixtral_matches_transformers(shape, tmp_path):
    runner = check_matches_transformers(tmp_path, "mixtral", **MIXTRAL_SHAPES[shape])
    assert all(isinstance(layer.mlp, SparseMoeBlock) for layer in runner.model.model.layers)


def test_mixtral_loads_its_original_per_expert_names_and_the_stacked_layout(tmp_path):
    """Hub checkpoints name each expert's weights block_sparse_moe.experts.{e}.w1/w3/w2 (and
    transformers writes them so); a checkpoint already stacked as our parameters loads too."""
    original, stacked = tmp_path / "original", tmp_path / "stacked"
    build_tiny_model(original, "mixtral", num_local_experts=4)
    weights = load_file(original / "model.safetensors")
    assert "model.layers.0.block_sparse_moe.experts.3.w2.weight" in weights
    assert "model.layers.0.block_sparse_moe.gate.weight" in weights
    prompt, blocks = list(range(3, 30)), [0, 1]
    expected = runner_logits(make_runner(original), prompt, blocks)

    renamed = {}
    for name, tensor in weights.items():
        if ".experts." not in name:
            renamed[name.replace("block_sparse_moe", "mlp")] = tensor
    for layer in range(2):
        prefix = f"model.layers.{layer}.block_sparse_moe.experts"
        renamed[f"model.layers.{layer}.mlp.experts.gate_up_proj"] = torch.stack(
            [torch.cat([weights[f"{prefix}.{e}.w1.weight"], weights[f"{prefix}.{e}.w3.weight"]]) for e in range(4)])
        renamed[f"model.layers.{layer}.mlp.experts.down_proj"] = torch.stack(
            [weights[f"{prefix}.{e}.w2.weight"] for e in range(4)])
    stacked.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (stacked / name).write_bytes((original / name).read_bytes())
    save_file(renamed, stacked / "model.safetensors")
    assert torch.equal(runner_logits(make_runner(stacked), prompt, blocks), expected)


def test_moe_tensor_parallel_qwen3_moe(tmp_path):
    # One dense and one sparse layer; each rank holds 1/2 of every expert's 32 columns.
    ranks = check_tensor_parallel(tmp_path, "qwen3_moe", num_experts=4, num_experts_per_tok=2,
                                  moe_intermediate_size=32, decoder_sparse_step=2, norm_topk_prob=True)
    assert ranks[0]["kv_shape"][4] == 1


def test_moe_tensor_parallel_mixtral(tmp_path):
    check_tensor_parallel(tmp_path, "mixtral", num_local_experts=4, num_experts_per_tok=2, num_key_value_heads=4)


def _raw(**changes):
    raw = {"model_type": "qwen3_moe", "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128,
           "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "num_experts": 4,
           "num_experts_per_tok": 2, "moe_intermediate_size": 30}
    raw.update(changes)
    return raw


def test_an_expert_size_the_ranks_do_not_divide_is_refused():
    config = model_config_from_hf(_raw())
    assert partition(config, 1, 2).expert_intermediate_start == 15
    with pytest.raises(ConfigError, match="each expert's inner dimension 30 cannot be split over 4 shards"):
        partition(config, 0, 4)


@pytest.mark.parametrize("changes, message", [
    (dict(num_experts_per_tok=5), "num_experts_per_tok 5 must be between 1 and the 4 experts"),
    (dict(model_type="mixtral", num_experts=None), "names no experts"),
    (dict(decoder_sparse_step=0), "decoder_sparse_step must be at least 1"),
])
def test_impossible_expert_configs_are_refused(changes, message):
    with pytest.raises(ConfigError, match=message):
        check_config(json.loads(json.dumps(_raw(**changes))))
