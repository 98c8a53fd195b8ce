"""Phi-3 / Phi-4-mini (`phi3`) against transformers on random checkpoints: partial rotary
embeddings with a sliding window shorter than the sequence, LongRoPE past its original context
(from the prompt on, and crossing it mid-generation), chunked prefill, the fused Q/K/V and
gate/up checkpoint tensors sliced for two gloo ranks."""
import os
import pathlib
import subprocess
import sys

import pytest
import torch
import torch.multiprocessing as mp
from conftest import build_tiny_model, make_runner, runner_greedy, runner_logits
from test_model_parity import GREEDY_TOKENS, PROMPT, _check, _reference
from test_tensor_parallel import _free_port, _rank, _whole

from superinfer.models.config import ConfigError, model_config_from_hf
from superinfer.models.rotary import inverse_frequencies
from superinfer.models.tensor_parallel import FusedRankSlice, RankSlice, checkpoint_slice, partition

TINY_PROMPT = [p % 512 for p in PROMPT]  # 36 tokens


def _longrope(pairs: int, partial: float = 1.0) -> dict:
    # Distinct divisors per frequency, the long ones larger (slower), as in Phi-3's configs.
    return {"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": partial,
            "short_factor": [1.0 + 0.1 * i for i in range(pairs)],
            "long_factor": [1.0 + 2.5 * i for i in range(pairs)]}


CASES = {
    # Phi-4-mini's 0.75 of each 32-wide head rotated; a window of 24 < the 36 + 32 tokens; tied.
    "partial-window": dict(hidden_size=128, num_attention_heads=4, num_key_value_heads=2,
                           partial_rotary_factor=0.75, sliding_window=24, tie_word_embeddings=True),
    # LongRoPE whose original context (16) the prompt already exceeds: the long factors throughout.
    "longrope": dict(hidden_size=128, num_attention_heads=8, num_key_value_heads=4, num_hidden_layers=3,
                     rope_parameters=_longrope(8), original_max_position_embeddings=16),
}
# Phi-4-mini-like: partial LongRoPE, the prompt within the original context (48), the
# continuation past it.
CROSSING = dict(hidden_size=128, num_attention_heads=4, num_key_value_heads=1, sliding_window=40,
                rope_parameters=_longrope(12, partial=0.75), original_max_position_embeddings=48)


def _build(directory, case: str):
    # Seed 3 samples EOS (id 2) after the partial-window prompt, which generate's
    # min_new_tokens suppresses; seed 4 does not.
    seed = 4 if case == "partial-window" else 3
    return build_tiny_model(directory, "phi3", seed=seed, pad_token_id=0, **CASES[case])


def _greedy_recomputing_the_crossing(runner, prompt: list[int], steps: int, original: int) -> list[int]:
    """Greedy decoding that recomputes the whole sequence, as one chunk from position 0, at
    the step its length first exceeds the original context — what transformers' generate does
    for Phi-3 — so that every key is rotated with the long set from then on."""
    blocks = list(range(-(-(len(prompt) + steps) // runner.block_size)))
    sequence = list(prompt)
    tokens = [int(runner_logits(runner, prompt, blocks)[-1].argmax())]
    while len(tokens) < steps:
        sequence.append(tokens[-1])
        if len(sequence) == original + 1:
            logits = runner_logits(runner, sequence, blocks)
        else:
            logits = runner_logits(runner, [tokens[-1]], blocks, start=len(sequence) - 1)
        tokens.append(int(logits[-1].argmax()))
    return tokens


def _chunked(runner, prompt: list[int], cuts: list[int], first_block: int) -> torch.Tensor:
    """Logits of the prompt computed in chunks ending at `cuts`, in blocks of its own."""
    blocks = list(range(first_block, first_block + -(-len(prompt) // runner.block_size)))
    bounds = [0, *cuts, len(prompt)]
    return torch.cat([runner_logits(runner, prompt[a:b], blocks, start=a) for a, b in zip(bounds, bounds[1:])])


@pytest.mark.parametrize("case", sorted(CASES))
def test_phi3_matches_transformers(case, tmp_path):
    model = _build(tmp_path, case)
    runner = make_runner(tmp_path)
    _check(runner, model, TINY_PROMPT)
    # Chunks crossing block boundaries (and, for "longrope", all past the original context).
    one_shot = runner_logits(runner, TINY_PROMPT, [10, 11, 12])
    chunked = _chunked(runner, TINY_PROMPT, [17, 29], first_block=20)
    assert (chunked - one_shot).abs().max().item() < 1e-4
    assert torch.equal(chunked.argmax(-1), one_shot.argmax(-1))


def test_longrope_crossing_the_original_context_mid_generation_matches_transformers(tmp_path):
    # transformers' generate recomputes the cache when the sequence first outgrows the original
    # context; decoding on over the prompt's short-rotated keys instead drifts away from it.
    model = build_tiny_model(tmp_path, "phi3", seed=3, pad_token_id=0, **CROSSING)
    runner = make_runner(tmp_path)
    reference_logits, reference_tokens = _reference(model, TINY_PROMPT)
    assert (runner_logits(runner, TINY_PROMPT, [0, 1, 2]) - reference_logits).abs().max().item() <= 1e-3
    assert _greedy_recomputing_the_crossing(runner, TINY_PROMPT, GREEDY_TOKENS, 48) == reference_tokens
    assert runner_greedy(runner, TINY_PROMPT, GREEDY_TOKENS, list(range(5))) != reference_tokens


def test_longrope_prompt_chunks_crossing_the_original_context_match_transformers_with_a_cache(tmp_path):
    # The first chunk (11 tokens) fits the original context (16): it takes the short set, as
    # transformers' forward over those tokens does; the rest takes the long one over those keys.
    model = _build(tmp_path, "longrope")
    runner = make_runner(tmp_path)
    with torch.inference_mode():
        first = model(torch.tensor([TINY_PROMPT[:11]]), use_cache=True)
        rest = model(torch.tensor([TINY_PROMPT[11:]]), past_key_values=first.past_key_values)
    reference = torch.cat([first.logits[0], rest.logits[0]]).float()
    ours = _chunked(runner, TINY_PROMPT, [11], first_block=0)
    assert (ours - reference).abs().max().item() <= 1e-3
    # Unlike one shot, whose every key is rotated with the long set.
    assert (ours - runner_logits(runner, TINY_PROMPT, [10, 11, 12])).abs().max().item() > 1e-2


def test_longrope_frequencies_and_scaling_match_transformers():
    from transformers import Phi3Config
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    # Phi-3-mini-128k's shape: 96-wide heads, 4096 -> 131072 positions, the legacy key.
    rope_scaling = {"type": "longrope", "short_factor": [1.0 + 0.02 * i for i in range(48)],
                    "long_factor": [1.0 + 1.3 * i for i in range(48)]}
    raw = {"model_type": "phi3", "vocab_size": 32064, "hidden_size": 3072, "intermediate_size": 8192,
           "num_hidden_layers": 32, "num_attention_heads": 32, "max_position_embeddings": 131072,
           "original_max_position_embeddings": 4096, "rope_theta": 10000.0, "rope_scaling": rope_scaling}
    rope = model_config_from_hf(raw).rope
    reference = Phi3Config(**{k: v for k, v in raw.items() if k != "model_type"})
    short, scaling = ROPE_INIT_FUNCTIONS["longrope"](reference)
    long, _ = ROPE_INIT_FUNCTIONS["longrope"](reference, seq_len=4097)
    assert rope.kind == "longrope" and rope.original_max_position_embeddings == 4096
    assert rope.attention_factor == pytest.approx(scaling) and scaling == pytest.approx(1.190238, abs=1e-6)
    assert torch.equal(inverse_frequencies(rope, 96), short)
    assert torch.equal(inverse_frequencies(rope, 96, long_context=True), long)
    # The first checkpoints' name for it.
    assert model_config_from_hf({**raw, "rope_scaling": {**rope_scaling, "type": "su"}}).rope == rope


def test_longrope_factor_lists_must_cover_the_rotated_dimensions():
    raw = {"model_type": "phi3", "vocab_size": 512, "hidden_size": 128, "intermediate_size": 256,
           "num_hidden_layers": 2, "num_attention_heads": 4, "max_position_embeddings": 512,
           "original_max_position_embeddings": 64, "rope_parameters": _longrope(16, partial=0.75)}
    with pytest.raises(ConfigError, match="must have 12 entries"):
        model_config_from_hf(raw)
    raw["rope_parameters"] = {"rope_type": "longrope", "short_factor": [1.0] * 12}
    with pytest.raises(ConfigError, match="short_factor and long_factor"):
        model_config_from_hf(raw)


def test_fused_checkpoint_tensors_are_sliced_per_part():
    # 4 heads, 2 KV heads of 16 dims, inner 128; rank 1 of 2 holds heads 2-3, KV head 1.
    config = model_config_from_hf({
        "model_type": "phi3", "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2})
    part = partition(config, 1, 2)
    qkv = checkpoint_slice("model.layers.0.self_attn.qkv_proj.weight", (128, 64), part, 16)
    assert qkv == FusedRankSlice((RankSlice(0, 32, 64), RankSlice(0, 80, 96), RankSlice(0, 112, 128)))
    gate_up = checkpoint_slice("model.layers.1.mlp.gate_up_proj.weight", (256, 64), part, 16)
    assert gate_up == FusedRankSlice((RankSlice(0, 64, 128), RankSlice(0, 192, 256)))
    # One KV head over two ranks: each holds its query heads and a copy of K and V.
    single_kv = model_config_from_hf({**config.raw, "num_key_value_heads": 1})
    q, k, v = torch.randn(64, 8), torch.randn(16, 8), torch.randn(16, 8)
    fused = torch.cat((q, k, v))
    for rank in range(2):
        piece = checkpoint_slice("model.layers.0.self_attn.qkv_proj.weight", tuple(fused.shape),
                                 partition(single_kv, rank, 2), 16)
        rows = torch.cat([fused[p.start:p.stop] for p in piece.parts])
        assert torch.equal(rows, torch.cat((q[32 * rank:32 * (rank + 1)], k, v)))


@pytest.mark.parametrize("kv_heads", [2, 1])
def test_phi3_tensor_parallel(kv_heads, tmp_path):
    # Two KV heads split over two ranks, or one replicated; partial LongRoPE past its original
    # context; the ranks read their rows of the fused Q/K/V and gate/up tensors.
    directory = tmp_path / "phi3"
    build_tiny_model(directory, "phi3", pad_token_id=0, hidden_size=128, num_attention_heads=4,
                     num_key_value_heads=kv_heads, rope_parameters=_longrope(12, partial=0.75),
                     original_max_position_embeddings=16)
    expected, whole_bytes, _ = _whole(directory)
    results = str(tmp_path / "rank")
    mp.spawn(_rank, args=(2, str(directory), _free_port(), results), nprocs=2, join=True)
    ranks = [torch.load(f"{results}.{rank}", weights_only=False) for rank in range(2)]
    for got, want in zip(ranks[0]["logits"], expected, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        assert torch.equal(got.argmax(-1), want.argmax(-1))
    for rank in ranks:
        assert rank["kv_shape"][4] == 1
        assert 0.45 < rank["bytes"] / whole_bytes < 0.6


def test_triton_backend_and_decode_graphs_match_sdpa_with_requests_on_either_side_of_the_original_context(
        tmp_path):
    # Under the Triton interpreter in a child process (see test_triton_attention.py).
    from phi3_interpreted import DECODES, PROMPTS

    directory = tmp_path / "phi3"
    model = build_tiny_model(directory, "phi3", seed=3, pad_token_id=0, hidden_size=128, num_attention_heads=4,
                             num_key_value_heads=2, sliding_window=12, rope_parameters=_longrope(12, partial=0.75),
                             original_max_position_embeddings=16)
    out = tmp_path / "runs.pt"
    script = pathlib.Path(__file__).parent / "phi3_interpreted.py"
    subprocess.run([sys.executable, str(script), str(directory), str(out)], env=dict(os.environ, TRITON_INTERPRET="1"),
                   check=True, timeout=300)
    runs = torch.load(out)
    sdpa = runs["sdpa"]
    for mode in ("triton", "graphs"):
        assert runs[mode]["tokens"] == sdpa["tokens"]
        torch.testing.assert_close(runs[mode]["logits"], sdpa["logits"], atol=1e-4, rtol=1e-4)
    assert runs["graphs"]["graphed_steps"] == DECODES
    # Request 1 stays within the original context next to request 0 past it: the short set is
    # its own, so it continues as transformers does alone.
    steps = len(sdpa["tokens"][1])
    with torch.inference_mode():
        alone = model.generate(torch.tensor([PROMPTS[1]]), max_new_tokens=steps, do_sample=False,
                               min_new_tokens=steps, pad_token_id=0)
    assert sdpa["tokens"][1] == alone[0, len(PROMPTS[1]):].tolist()
