"""The Triton attention checks of Gemma's attention features, run under TRITON_INTERPRET=1 in a
process of their own (see triton_interpreted.py for why): per case, the kernels' and the SDPA
path's outputs with a softmax scale, score soft-capping and a layer's own sliding window against
a dense float64 reference; and a tiny random Gemma 2's greedy continuation through the model
runner on each backend. test_model_gemma.py runs this file and compares what it saves."""
import os
import pathlib
import sys
import tempfile

import torch

from superinfer.models.attention import paged_attention
from superinfer.shard.attention_backends import select_attention_backend
from superinfer.shard.batch import BatchLayout, Chunk

NUM_LAYERS = 2
LAYER = 1


def dense_reference(q, kv_cache, chunk: Chunk, window: int | None, scale: float, softcap: float | None):
    """One chunk's attention in float64 from its block table: q [Q, H, D] -> [Q, H·D]."""
    block_size, num_kv_heads = kv_cache.shape[3:5]
    context = chunk.start + len(chunk.token_ids)
    positions = torch.arange(context)
    blocks = torch.tensor(chunk.block_table)[positions // block_size]
    groups = q.shape[1] // num_kv_heads
    k = kv_cache[blocks, LAYER, 0, positions % block_size].double().repeat_interleave(groups, dim=1)  # [S, H, D]
    v = kv_cache[blocks, LAYER, 1, positions % block_size].double().repeat_interleave(groups, dim=1)
    scores = torch.einsum("qhd,shd->hqs", q.double(), k) * scale
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    query_pos = torch.arange(chunk.start, context)[:, None]
    visible = positions[None, :] <= query_pos
    if window is not None:
        visible &= positions[None, :] > query_pos - window
    scores = scores.masked_fill(~visible[None], float("-inf"))
    return torch.einsum("hqs,shd->qhd", scores.softmax(-1), v).reshape(len(chunk.token_ids), -1)


# name -> (layer window, scale, softcap): a local layer and a global one of the same step.
CASES = {
    "local-softcap": (5, 0.3, 1.5),
    "global-softcap": (None, 0.3, 1.5),
    "local-scale": (5, 0.5, None),
}


def kernel_case(window: int | None, scale: float, softcap: float | None, seed: int) -> dict:
    generator = torch.Generator().manual_seed(seed)
    num_kv_heads, groups, head_dim, block_size = 2, 2, 16, 4
    # Prefill chunks after computed tokens (mid-block), a whole prompt, decodes near and far.
    shapes = [(0, 6), (block_size + 3, 4), (2, 1), (3 * block_size + 1, 1), (9, 2)]
    free = torch.randperm(48, generator=generator).tolist()
    chunks = []
    for computed, new in shapes:
        needed = -(-(computed + new) // block_size)
        table, free = free[:needed], free[needed:]
        chunks.append(Chunk(torch.randint(0, 100, (new,), generator=generator).tolist(), computed, table))
    kv_cache = torch.randn(48, NUM_LAYERS, 2, block_size, num_kv_heads, head_dim, generator=generator)
    outputs, q = {}, None
    for backend in ("sdpa", "triton"):
        # The model's windows as Gemma declares them: local layers 5, the step's own none.
        layout = BatchLayout(block_size, NUM_LAYERS, num_kv_heads, groups, head_dim, torch.float32, None,
                             layer_windows=(5,))
        batch = select_attention_backend(backend, layout, torch.device("cpu")).build_batch(chunks)
        if q is None:
            q = torch.randn(len(batch.input_ids), num_kv_heads * groups, head_dim, generator=generator)
        outputs[backend] = paged_attention(q, kv_cache, LAYER, batch.meta, window, scale, softcap).double()
    dense = torch.empty_like(outputs["sdpa"])
    for chunk, first in zip(chunks, batch.first_rows):
        rows = slice(first, first + len(chunk.token_ids))
        dense[rows] = dense_reference(q[rows], kv_cache, chunk, window, scale, softcap)
    return {**outputs, "dense": dense}


def greedy_case() -> dict:
    """A tiny random Gemma 2 (window 6, soft-capped) decoding two prompts batched together,
    one prefilled in two chunks, through the model runner on each backend."""
    sys.path.insert(0, str(pathlib.Path(__file__).parent))
    from conftest import build_tiny_model
    from triton_interpreted import greedy_on_backends

    directory = pathlib.Path(tempfile.mkdtemp()) / "tiny-gemma2"
    build_tiny_model(directory, "gemma2", head_dim=16, sliding_window=6, attn_logit_softcapping=2.0,
                     final_logit_softcapping=8.0)
    prompts = [[5, 17, 99, 3, 42, 7, 250, 11, 64, 8, 31], [8, 300, 21]]
    tables = [[9, 2, 14, 0, 6], [5, 11, 3, 1]]
    return greedy_on_backends(directory, prompts, tables, steps=6, split=7)


def main(out_path: str) -> None:
    if os.environ.get("TRITON_INTERPRET") != "1" or "triton" in sys.modules:
        sys.exit("run with TRITON_INTERPRET=1 set before triton is imported (see test_model_gemma.py)")
    torch.set_num_threads(1)
    kernels = {name: kernel_case(*args, seed=index) for index, (name, args) in enumerate(CASES.items())}
    torch.save({"kernels": kernels, "greedy": greedy_case()}, out_path)


if __name__ == "__main__":
    main(sys.argv[1])
