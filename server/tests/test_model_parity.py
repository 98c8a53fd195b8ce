"""Our models against transformers' on the same weights: logits within 1e-3 (float32) and
identical 32-token greedy continuations, for SmolLM2 and random Llama (plain, with Llama-3
rope scaling and with YaRN's), Qwen2 with YaRN, Mistral (with a sliding window shorter than the sequence) and Qwen2; SmolLM2 also
in bfloat16 (the GPU dtype) and against transformers' own reading of the GGUF file it ships as
(not only our conversion of it)."""
import pytest
import torch
from conftest import build_tiny_model, make_runner, runner_greedy, runner_logits

PROMPT = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3717, 7018, 411, 2, 198, 1, 4093, 198] * 2
GREEDY_TOKENS = 32

TINY_CASES = {
    "llama": ("llama", {}),
    "llama3-rope": (
        "llama",
        {"rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 64}},
    ),
    # Qwen2.5's long-context setting, over a context the prompt and its continuation outgrow.
    "qwen2-yarn": ("qwen2", {"rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                                 "original_max_position_embeddings": 32}}),
    # DeepSeek's: the attention factor from mscale / mscale_all_dim, its own band, not rounded.
    "llama-yarn-mscale": ("llama", {"rope_parameters": {
        "rope_type": "yarn", "rope_theta": 500.0, "factor": 8.0, "original_max_position_embeddings": 16,
        "mscale": 0.707, "mscale_all_dim": 1.0, "beta_fast": 16, "beta_slow": 2, "truncate": False}}),
    "mistral-window": ("mistral", {"sliding_window": 24}),
    "qwen2": ("qwen2", {}),
}


def _reference(model, prompt: list[int]) -> tuple[torch.Tensor, list[int]]:
    with torch.inference_mode():
        logits = model(torch.tensor([prompt])).logits[0]
        generated = model.generate(torch.tensor([prompt]), max_new_tokens=GREEDY_TOKENS, do_sample=False,
                                   min_new_tokens=GREEDY_TOKENS, pad_token_id=0)
    return logits.float(), generated[0, len(prompt):].tolist()


def _check(runner, model, prompt: list[int]) -> None:
    reference_logits, reference_tokens = _reference(model, prompt)
    blocks = list(range(-(-(len(prompt) + GREEDY_TOKENS) // runner.block_size)))
    ours = runner_logits(runner, prompt, blocks)
    assert (ours - reference_logits).abs().max().item() <= 1e-3
    assert runner_greedy(runner, prompt, GREEDY_TOKENS, blocks) == reference_tokens


@pytest.mark.parametrize("case", sorted(TINY_CASES))
def test_random_model_matches_transformers(case, tmp_path):
    architecture, overrides = TINY_CASES[case]
    model = build_tiny_model(tmp_path, architecture, seed=3, **overrides)
    runner = make_runner(tmp_path)
    prompt = [p % 512 for p in PROMPT]
    _check(runner, model, prompt)


def test_qwen2_has_qkv_bias(tmp_path):
    build_tiny_model(tmp_path, "qwen2")
    runner = make_runner(tmp_path)
    assert runner.model.model.layers[0].self_attn.qkv_proj.bias is not None
    assert runner.model.model.layers[0].self_attn.o_proj.bias is None


def test_smollm2_matches_transformers(smollm2_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    runner = make_runner(smollm2_dir)
    _check(runner, model, PROMPT)


def test_smollm2_matches_transformers_in_bfloat16(smollm2_dir):
    # bf16 keeps 8 bits of mantissa: an implementation that rounds differently moves logits by
    # about one ulp (0.125 at 16..32) and may swap near-ties; the next token must agree wherever
    # the top two are apart. (Measured on 2026-11-30: the two agree exactly.)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.bfloat16).eval()
    runner = make_runner(smollm2_dir, dtype=torch.bfloat16)
    reference, _ = _reference(model, PROMPT)
    blocks = list(range(-(-len(PROMPT) // runner.block_size)))
    ours = runner_logits(runner, PROMPT, blocks).float()
    assert ours.dtype == reference.dtype == torch.float32
    assert (ours - reference).abs().max().item() <= 0.125
    top2 = reference.topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) > 0.25
    assert clear.sum() >= len(PROMPT) // 2
    assert torch.equal(ours.argmax(-1)[clear], reference.argmax(-1)[clear])


def test_smollm2_matches_transformers_reading_the_gguf_file(smollm2_dir):
    from transformers import AutoModelForCausalLM

    from superinfer.shard.model_source import default_gguf_path

    gguf = default_gguf_path()
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32).eval()
    _check(make_runner(smollm2_dir), model, PROMPT)
