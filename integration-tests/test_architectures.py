"""Every supported architecture through the HTTP API: a random checkpoint written by
transformers (no network), served over two tensor-parallel ranks with a device pool too small
for the prompts (so requests rotate out to host memory and back), gives transformers'
`generate` greedy continuations token for token — or parts only where transformers' top two
candidates are a near-tie (the ranks' all-reduce sums in another order)."""
import json
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from conftest import REPO, SUPERINFER, launch

STEPS = 32
NEAR_TIE_LOGPROB = 1e-3
# 16-token blocks; a request needs 3-5 by its end: 10 hold two or three of the 12 at a time.
SMALL_POOL = ["--device-kv-blocks", "10", "--host-kv-blocks", "256", "--max-batch-tokens", "256",
              "--ttft-slo-ms", "30000", "--tbt-slo-ms", "5000", "--scheduler", "rotasched"]
PROMPTS = [" ".join(f"t{(11 * i + 7 * j) % 500 + 3}" for j in range(5 + 3 * i)) for i in range(12)]
# Rounds of the prompts at most until a request has rotated: how many requests overlap depends
# on the machine's speed, so one round may by chance fit the pool without rotating.
MAX_ROUNDS = 3
REFERENCE = REPO / "integration-tests" / "architecture_reference.py"
PYTHON = SUPERINFER.parent / "python"

# model_type -> config overrides of the shard tests' tiny checkpoint (vocabulary 512, 2 layers,
# 4 heads over 2 KV heads unless said): shapes other than the shard tests' own, with each
# architecture's distinctive features switched on.
CASES = {
    "qwen3": {"head_dim": 32},
    "qwen3_moe": {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                  "decoder_sparse_step": 2, "norm_topk_prob": True},
    "mixtral": {"num_local_experts": 4, "num_experts_per_tok": 2},
    "gemma2": {"head_dim": 16, "sliding_window": 8, "attn_logit_softcapping": 2.0, "final_logit_softcapping": 8.0},
    "gemma3_text": {"head_dim": 16, "num_hidden_layers": 3, "sliding_window": 8, "sliding_window_pattern": 2,
                    "rope_scaling": {"rope_type": "linear", "factor": 4.0}, "rope_local_base_freq": 100.0},
    "phi3": {"pad_token_id": 0, "hidden_size": 128, "partial_rotary_factor": 0.75, "sliding_window": 24},
}


def build(directory: Path, model_type: str) -> Path:
    subprocess.run([str(PYTHON), str(REFERENCE), "build", str(directory), model_type, json.dumps(CASES[model_type])],
                   cwd=REPO, check=True, capture_output=True, timeout=300)
    return directory


def transformers_greedy(directory: Path, prompts: list[list[int]]) -> list[dict]:
    done = subprocess.run([str(PYTHON), str(REFERENCE), "greedy", str(directory), str(STEPS)], cwd=REPO,
                          input=json.dumps(prompts), check=True, capture_output=True, text=True, timeout=600)
    return json.loads(done.stdout)


def generate(url: str, text: str) -> dict:
    parameters = {"max_new_tokens": STEPS, "details": True, "decoder_input_details": True, "ignore_eos": True}
    response = requests.post(f"{url}/generate", json={"inputs": text, "parameters": parameters}, timeout=600)
    response.raise_for_status()
    return response.json()["details"]


@pytest.mark.parametrize("model_type", sorted(CASES))
def test_greedy_tokens_equal_transformers_generate_on_two_rotating_ranks(model_type, tmp_path):
    model = build(tmp_path / "model", model_type)
    rounds = []
    with launch(tmp_path, ["--model-id", str(model), "--num-shard", "2", *SMALL_POOL]) as server:
        while len(rounds) < MAX_ROUNDS and not server.metric("superinfer_rotations_in_total"):
            with ThreadPoolExecutor(max_workers=len(PROMPTS)) as pool:
                rounds.append(list(pool.map(lambda text: generate(server.url, text), PROMPTS)))
        assert server.metric("superinfer_rotations_out_total") > 0, server.log_tail()
        assert server.metric("superinfer_rotations_in_total") > 0
    prompts = [[token["id"] for token in details["prefill"]] for details in rounds[0]]
    reference = transformers_greedy(model, prompts)
    for served in rounds:
        assert_as_transformers(model_type, reference, served)


def assert_as_transformers(model_type: str, reference: list[dict], served: list[dict]) -> None:
    parted = 0
    for index, (want, got) in enumerate(zip(reference, served)):
        got_ids = [token["id"] for token in got["tokens"]]
        if got_ids == want["tokens"]:
            continue
        position = next(p for p, (a, b) in enumerate(zip(want["tokens"], got_ids)) if a != b)
        assert want["gaps"][position] < NEAR_TIE_LOGPROB, (
            f"{model_type}: prompt {index} parts from transformers at token {position}, where its top two are "
            f"{want['gaps'][position]:.2e} apart: {want['tokens']} vs {got_ids}")
        parted += 1
    assert parted <= 1, f"{model_type}: {parted} of {len(PROMPTS)} continuations parted at near-ties"
