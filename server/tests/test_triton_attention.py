"""The Triton paged-attention kernels against the SDPA path and a dense reference, and the
model runner's greedy output on each backend. The kernels run under TRITON_INTERPRET=1 in a
child process (triton_interpreted.py): the interpreter is chosen when triton is imported, so
switching it on here would change every later triton user in this session."""
import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch

from superinfer.shard.attention_backends import select_attention_backend
from superinfer.shard.batch import BatchLayout, Chunk
from triton_interpreted import KERNEL_CASES

HERE = pathlib.Path(__file__).parent

# Outputs are convex combinations of V rows drawn from N(0, 1) (|out| < 4).
# float32: float32 accumulation over at most ~40 keys; observed errors are ~5e-7.
# float16 (11-bit significand, half an ulp = 2^-12 relative): the output's rounding and the
#   probabilities rounded to float16 for the P·V product, a few ulp in all; observed <= 1e-3.
# bfloat16 (8-bit significand, an ulp = 2^-7 relative): one ulp for the output's rounding (the
#   interpreter truncates rather than rounds) and one for the probabilities in P·V on a GPU.
# A wrong mask, block or head mapping moves outputs by O(0.1-1), far outside all of these.
TOLERANCES = {
    torch.float32: dict(atol=1e-5, rtol=1e-5),
    torch.float16: dict(atol=2e-3, rtol=2e-3),
    torch.bfloat16: dict(atol=1e-2, rtol=1.6e-2),
}


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("triton") / "results.pt"
    env = dict(os.environ, TRITON_INTERPRET="1")
    subprocess.run([sys.executable, str(HERE / "triton_interpreted.py"), str(out)], env=env, check=True, timeout=300)
    return torch.load(out)


@pytest.mark.parametrize("case", list(KERNEL_CASES))
def test_kernels_match_sdpa_and_dense(interpreted, case):
    dtype = KERNEL_CASES[case][1]
    result = interpreted[case]
    tolerance = TOLERANCES[dtype]
    torch.testing.assert_close(result["triton"], result["dense"], **tolerance)
    torch.testing.assert_close(result["sdpa"], result["dense"], **tolerance)
    doubled = {name: 2 * value for name, value in tolerance.items()}
    torch.testing.assert_close(result["triton"], result["sdpa"], **doubled)


def test_greedy_continuation_is_the_same_on_both_backends(interpreted):
    sdpa, triton = interpreted["greedy"]["sdpa"], interpreted["greedy"]["triton"]
    assert triton["tokens"] == sdpa["tokens"]
    assert [len(tokens) for tokens in sdpa["tokens"]] == [7, 8]
    # float32 end to end: the logits agree to rounding, not just their argmax.
    torch.testing.assert_close(triton["logits"], sdpa["logits"], atol=1e-4, rtol=1e-4)


def test_triton_metadata_is_tensors_of_the_step():
    layout = BatchLayout(4, 2, 2, 2, 16, torch.float32, None)
    chunks = [Chunk([1], 6, [7, 3]), Chunk([1, 2, 3], 5, [4, 9, 2]), Chunk([5], 0, [8])]
    meta = select_attention_backend("triton", layout, torch.device("cpu")).build_batch(chunks).meta
    assert meta.groups == ()
    prefill, decode = meta.kernel_groups
    assert (prefill.row_start, prefill.num_rows, prefill.max_query_len, prefill.max_context_len) == (0, 3, 3, 8)
    assert prefill.block_tables.tolist() == [[4, 9]]
    assert prefill.context_lens.tolist() == [8] and prefill.query_starts.tolist() == [0, 3]
    assert (decode.row_start, decode.num_rows, decode.max_query_len, decode.max_context_len) == (3, 2, 1, 7)
    # Padded to the step's widest table with the row's own first block.
    assert decode.block_tables.tolist() == [[7, 3], [8, 8]]
    assert decode.context_lens.tolist() == [7, 1] and decode.query_starts.tolist() == [0, 1, 2]
    assert {t.dtype for t in (decode.block_tables, decode.context_lens, decode.query_starts)} == {torch.int32}


def test_decode_splits_fill_the_gpu_only_where_contexts_are_long():
    # Importing triton here is harmless: nothing is compiled or launched.
    from superinfer.models.triton_attention import MAX_SPLITS, decode_splits

    assert decode_splits(batch=1, num_kv_heads=8, max_context_len=4096) == 16  # 512 programs / 8 heads
    assert decode_splits(batch=1, num_kv_heads=8, max_context_len=300) == 1  # under 2 x 256 keys
    assert decode_splits(batch=128, num_kv_heads=8, max_context_len=4096) == 1  # the batch fills it
    assert decode_splits(batch=1, num_kv_heads=1, max_context_len=1 << 20) == MAX_SPLITS


def test_unknown_backend_is_refused():
    with pytest.raises(ValueError, match="attention backend"):
        select_attention_backend("flash", BatchLayout(4, 2, 2, 2, 16, torch.float32, None), torch.device("cpu"))


def test_cpu_runner_keeps_sdpa_by_default(tiny_llama_dir):
    from conftest import make_runner

    assert make_runner(tiny_llama_dir).attention.name == "sdpa"


def test_attention_bench_runs_interpreted_on_the_cpu():
    env = dict(os.environ, TRITON_INTERPRET="1")
    command = [sys.executable, "-m", "superinfer.shard.attention_bench", "--device", "cpu", "--batch-sizes", "1", "2",
               "--context-lens", "12", "600", "--pairs", "2", "--iters", "1", "--num-layers", "2", "--num-heads", "4",
               "--num-kv-heads", "2", "--head-dim", "16", "--block-size", "4"]
    completed = subprocess.run(command, env=env, capture_output=True, text=True, check=True, timeout=120)
    report = json.loads(completed.stdout)
    assert report["device"] == "cpu" and report["interpreted"] is True
    # 600 keys are cut into splits (decode_splits), so the bench's numbers check those too.
    assert [(row["batch"], row["context"]) for row in report["results"]] == [(1, 12), (1, 600), (2, 12), (2, 600)]
    for row in report["results"]:
        assert row["max_abs_diff"] < 1e-2
        assert len(row["ratios"]) == 2 and row["ratio_min"] <= row["ratio_median"] <= row["ratio_max"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (compiled kernels)")
@pytest.mark.parametrize("case", list(KERNEL_CASES))
def test_compiled_kernels_on_gpu(case):
    # Not interpreted: triton compiles for the GPU here, and bfloat16 products run in bfloat16.
    from triton_interpreted import kernel_case

    result = kernel_case(*KERNEL_CASES[case], seed=0, device=torch.device("cuda"))
    torch.testing.assert_close(result["triton"], result["dense"], **TOLERANCES[KERNEL_CASES[case][1]])


@pytest.mark.parametrize(("flag", "expected"), [([], None), (["--attention-backend", "triton"], "triton")])
def test_shard_flag_reaches_the_config(flag, expected):
    import argparse

    from superinfer.shard.cli import add_arguments, shard_config

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--uds-path", "/tmp/shard.sock", "--device", "cpu", *flag])
    assert shard_config(args).attention_backend == expected


def test_decode_graphs_buckets_give_the_eager_tokens_and_padding_rows_touch_only_their_block(interpreted):
    runs = interpreted["graphs"]
    sdpa, eager, graphs = runs["sdpa"], runs["triton"], runs["graphs"]
    assert graphs["tokens"] == eager["tokens"] == sdpa["tokens"]
    assert [len(tokens) for tokens in graphs["tokens"]] == [7, 7, 3]
    torch.testing.assert_close(graphs["logits"], eager["logits"], atol=1e-4, rtol=1e-4)
    # Steps 1-2 decode three requests in bucket 4 (one padding row), steps 3-6 two in bucket 2.
    assert graphs["buckets"] == [4, 4, 2, 2, 2, 2] and eager["buckets"] == []
    # The padding row wrote its block and nothing else: every written block is a request's or it.
    padding = graphs["padding_block"]
    assert padding == 16 and padding in graphs["written_blocks"]
    assert set(graphs["written_blocks"]) - {padding} <= set(graphs["used_blocks"])
    assert eager["padding_block"] is None and eager["written_blocks"] == graphs["written_blocks"][:-1]
