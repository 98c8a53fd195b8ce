"""Gemma 2 and Gemma 3 (text) against transformers on the same random weights: logits within
1e-3 (float32) and identical 32-token greedy continuations, with sliding windows shorter than
the prompt (local layers really differ from global ones), soft-capping that bites, and norm
weights away from zero; the prompt in chunks next to another request's decode; 2-rank tensor
parallelism; the SDPA path's per-window metadata; config.json refusals. The Triton kernels'
scale, soft-cap and per-layer window are checked interpreted (triton_interpreted_gemma.py)."""
import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest
import torch
import torch.multiprocessing as mp

from conftest import build_tiny_model, make_runner, runner_greedy, runner_logits
from superinfer.models.config import ConfigError
from superinfer.models.registry import check_config
from superinfer.shard.batch import BatchLayout, Chunk, sdpa_batch

HERE = pathlib.Path(__file__).parent
PROMPT = [(7 * index + 3) % 512 for index in range(36)]
GREEDY_TOKENS = 32

CASES = {
    # Layers alternate local/global (transformers' default layer_types); a cap of 2 on the
    # attention scores and 8 on the logits, both well inside the range the scores reach.
    "gemma2": ("gemma2", dict(head_dim=16, sliding_window=8, attn_logit_softcapping=2.0,
                              final_logit_softcapping=8.0)),
    # More heads per KV head, a wider head, three layers, tied embeddings, its own scale.
    "gemma2-wide": ("gemma2", dict(num_attention_heads=8, num_key_value_heads=2, head_dim=32, num_hidden_layers=3,
                                   sliding_window=11, query_pre_attn_scalar=24, tie_word_embeddings=True)),
    # Local layers every other layer, linear rope scaling on the global ones only.
    "gemma3": ("gemma3_text", dict(head_dim=16, num_hidden_layers=3, sliding_window=8, sliding_window_pattern=2,
                                   rope_scaling={"rope_type": "linear", "factor": 4.0}, rope_local_base_freq=100.0)),
    # One KV head for six query heads, explicit layer_types, final soft-capping, tied embeddings.
    "gemma3-wide": ("gemma3_text", dict(hidden_size=96, num_attention_heads=6, num_key_value_heads=1, head_dim=24,
                                        num_hidden_layers=4, sliding_window=10, final_logit_softcapping=6.0,
                                        layer_types=["sliding_attention", "sliding_attention", "full_attention",
                                                     "sliding_attention"], tie_word_embeddings=True)),
}


def _build(directory: pathlib.Path, case: str, seed: int = 3):
    """The case's random transformers model, saved with its norm weights drawn away from zero
    (transformers initialises them to zero, where 1 + w hides a missing offset)."""
    architecture, overrides = CASES[case]
    model = build_tiny_model(directory, architecture, seed=seed, **overrides)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("norm.weight"):
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.5)
    model.save_pretrained(directory)
    return model


def _reference(model, prompt: list[int]) -> tuple[torch.Tensor, list[int]]:
    with torch.inference_mode():
        logits = model(torch.tensor([prompt])).logits[0].float()
        generated = model.generate(torch.tensor([prompt]), max_new_tokens=GREEDY_TOKENS, do_sample=False,
                                   min_new_tokens=GREEDY_TOKENS, pad_token_id=0)
    return logits, generated[0, len(prompt):].tolist()


@pytest.fixture(scope="module", params=sorted(CASES))
def built(request, tmp_path_factory):
    directory = tmp_path_factory.mktemp(request.param)
    model = _build(directory, request.param)
    return request.param, directory, model, *_reference(model, PROMPT)


def test_logits_and_greedy_continuation_match_transformers(built):
    _, directory, _, reference_logits, reference_tokens = built
    runner = make_runner(directory)
    blocks = list(range(-(-(len(PROMPT) + GREEDY_TOKENS) // runner.block_size)))
    ours = runner_logits(runner, PROMPT, blocks)
    assert (ours - reference_logits).abs().max().item() <= 1e-3
    assert runner_greedy(runner, PROMPT, GREEDY_TOKENS, blocks) == reference_tokens


def test_prompt_in_chunks_next_to_a_decode_matches_transformers(built):
    # Blocks of 4 tokens, shuffled: the second chunk's window starts mid-block, past block 0.
    _, directory, model, reference_logits, _ = built
    runner = make_runner(directory, block_size=4)
    table, other_table = [5, 1, 9, 3, 12, 0, 7, 2, 11, 6], [4, 8, 10, 13, 14, 15]
    other = PROMPT[5:20]
    with torch.inference_mode():
        other_reference = model(torch.tensor([other + [42]])).logits[0, -1].float()
    first = runner_logits(runner, PROMPT[:13], table)
    runner_logits(runner, other, other_table)
    hidden, batch = runner.forward([Chunk(PROMPT[13:], 13, table), Chunk([42], len(other), other_table)])
    logits = runner.logits(hidden)
    rest, decode = logits[batch.first_rows[0]:batch.first_rows[0] + len(PROMPT) - 13], logits[batch.first_rows[1]]
    assert (torch.cat([first, rest]) - reference_logits).abs().max().item() <= 1e-3
    assert (decode - other_reference).abs().max().item() <= 1e-3


def test_local_layers_attend_only_within_their_window(built, tmp_path):
    # The same weights with a window longer than the prompt: every layer global, other logits
    # from the first position past the window on.
    case, directory, _, reference_logits, _ = built
    for path in directory.iterdir():
        if path.is_file():
            shutil.copy(path, tmp_path / path.name)
    config = json.loads((directory / "config.json").read_text())
    window = config["sliding_window"]
    (tmp_path / "config.json").write_text(json.dumps({**config, "sliding_window": 4096}))
    runner = make_runner(tmp_path)
    wide = runner_logits(runner, PROMPT, [0, 1, 2])
    assert (wide[:window] - reference_logits[:window]).abs().max().item() <= 1e-3
    assert (wide[window:] - reference_logits[window:]).abs().max().item() > 1e-2, case


def test_window_groups_gather_only_the_keys_a_window_reaches():
    layout = BatchLayout(4, 2, 1, 2, 8, torch.float32, None, layer_windows=(5,))
    chunks = [Chunk([1, 2, 3], 9, [3, 7, 1]), Chunk([4], 14, [8, 2, 9, 11]), Chunk([5], 2, [6])]
    meta = sdpa_batch(chunks, layout, torch.device("cpu")).meta
    assert meta.groups_for(None) is meta.groups
    prefill, decode = meta.groups_for(5)
    # The chunk at 9..11 reaches back to position 5; the decodes at 14 and 2 to 10 and 0.
    assert prefill.context_rows.shape[-1] == 12 - 5
    assert decode.context_rows.shape[-1] == 5 and decode.mask is not None
    assert [g.row_start for g in (prefill, decode)] == [g.row_start for g in meta.groups]
    with pytest.raises(ValueError, match="no groups for a sliding window of 7"):
        meta.groups_for(7)


def _config(model_type: str, **fields):
    return {"model_type": model_type, "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
            "hidden_activation": "gelu_pytorch_tanh", **fields}


def test_config_defaults_follow_transformers():
    from superinfer.models.gemma import gemma2_spec, gemma3_spec

    gemma2 = gemma2_spec(check_config(_config("gemma2")))
    assert gemma2.sliding == (True, False, True, False)
    assert (gemma2.window, gemma2.attn_softcap, gemma2.final_softcap, gemma2.scale) == (4096, 50.0, 30.0, 1 / 16)
    # A Hub-style Gemma 3 config (before transformers 5): every sixth layer global, rope
    # scaling on the global layers, the local base frequency of its own.
    gemma3 = gemma3_spec(check_config(_config(
        "gemma3_text", num_hidden_layers=7, rope_theta=1e6, rope_local_base_freq=1e4, sliding_window=512,
        rope_scaling={"rope_type": "linear", "factor": 8.0}, final_logit_softcapping=None)))
    assert gemma3.sliding == (True,) * 5 + (False, True)
    assert (gemma3.global_rope.theta, gemma3.global_rope.kind, gemma3.global_rope.factor) == (1e6, "linear", 8.0)
    assert (gemma3.local_rope.theta, gemma3.local_rope.kind) == (1e4, "default")
    assert gemma3.attn_softcap is None and gemma3.final_softcap is None


@pytest.mark.parametrize("fields, message", [
    (dict(hidden_activation="gelu"), "unsupported activation 'gelu'"),
    (dict(use_bidirectional_attention=True), "bidirectional attention"),
    (dict(layer_types=["sliding_attention"] * 3), "layer_types must name 4 layers"),
    (dict(rope_parameters={"full_attention": {"rope_type": "dynamic", "rope_theta": 1e6}}), "unsupported rope scaling"),
])
def test_unsupported_configs_are_refused_before_any_weight(fields, message):
    with pytest.raises(ConfigError, match=message):
        check_config(_config("gemma3_text", **fields))


def test_gloo_ranks_compute_the_whole_models_logits(tmp_path):
    # Reuses the tensor-parallel test's ranks: a prefill and two decodes of a 37-token prompt,
    # longer than the windows, on each rank's half of the heads (Gemma 2) or a replicated
    # KV head (Gemma 3).
    from test_tensor_parallel import _free_port, _rank, _whole

    for case in ("gemma2", "gemma3-wide"):
        directory = tmp_path / case
        _build(directory, case)
        expected, whole_bytes, _ = _whole(directory)
        results = str(tmp_path / f"{case}-rank")
        mp.spawn(_rank, args=(2, str(directory), _free_port(), results), nprocs=2, join=True)
        ranks = [torch.load(f"{results}.{rank}", weights_only=False) for rank in range(2)]
        for got, want in zip(ranks[0]["logits"], expected):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
            assert torch.equal(got.argmax(-1), want.argmax(-1))
        for rank in ranks:
            assert 0.4 < rank["bytes"] / whole_bytes < 0.6, case


def test_triton_kernels_take_scale_softcap_and_the_layers_window(tmp_path):
    out = tmp_path / "results.pt"
    env = dict(os.environ, TRITON_INTERPRET="1")
    subprocess.run([sys.executable, str(HERE / "triton_interpreted_gemma.py"), str(out)], env=env, check=True,
                   timeout=300)
    report = torch.load(out)
    for name, result in report["kernels"].items():
        torch.testing.assert_close(result["triton"], result["dense"], atol=1e-5, rtol=1e-5, msg=name)
        torch.testing.assert_close(result["sdpa"], result["dense"], atol=1e-5, rtol=1e-5, msg=name)
    sdpa, triton = report["greedy"]["sdpa"], report["greedy"]["triton"]
    assert triton["tokens"] == sdpa["tokens"]
    torch.testing.assert_close(triton["logits"], sdpa["logits"], atol=1e-4, rtol=1e-4)
