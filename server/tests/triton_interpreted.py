"""The Triton attention checks that run the kernels under TRITON_INTERPRET=1, in a process of
their own: the interpreter is chosen when triton is first imported, so it cannot be switched
on inside a pytest session without changing every later triton user. test_triton_attention.py
runs this file and compares what it saves: per kernel case the outputs of the Triton kernels,
of the SDPA path and of a dense float64 reference; for the model, each backend's greedy tokens
and logits."""
import math
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


def dense_reference(q, kv_cache, chunk: Chunk, window: int | None) -> torch.Tensor:
    """One chunk's attention in float64 straight from its block table: q [Q, H, D] -> [Q, H·D]."""
    block_size, num_kv_heads, head_dim = kv_cache.shape[3:]
    num_heads = q.shape[1]
    context = chunk.start + len(chunk.token_ids)
    positions = torch.arange(context)
    blocks = torch.tensor(chunk.block_table)[positions // block_size]
    k = kv_cache[blocks, LAYER, 0, positions % block_size].double()  # [S, Hkv, D]
    v = kv_cache[blocks, LAYER, 1, positions % block_size].double()
    k = k.repeat_interleave(num_heads // num_kv_heads, dim=1)  # [S, H, D]
    v = v.repeat_interleave(num_heads // num_kv_heads, dim=1)
    scores = torch.einsum("qhd,shd->hqs", q.double(), k) / math.sqrt(head_dim)
    query_pos = torch.arange(chunk.start, context)[:, None]
    visible = positions[None, :] <= query_pos
    if window is not None:
        visible &= positions[None, :] > query_pos - window
    scores = scores.masked_fill(~visible[None], float("-inf"))
    return torch.einsum("hqs,shd->qhd", scores.softmax(-1), v).reshape(len(chunk.token_ids), -1)


def chunks_for(case: str, num_blocks: int, block_size: int, generator: torch.Generator) -> list[Chunk]:
    """Requests as (computed, new) token counts; each gets shuffled, non-contiguous blocks."""
    shapes = {
        # Mixed context lengths: one token, a partly filled last block, several full blocks.
        "decode": [(0, 1), (6, 1), (3 * block_size - 1, 1)],
        # Long enough for a context cut into splits (some of them empty for the short ones).
        "split-decode": [(0, 1), (44, 1), (129, 1)],
        # Whole prompts and chunks after computed tokens, next to decodes in the same step.
        "mixed": [(0, 5), (block_size + 2, 3), (5, 1), (2, 2 * block_size + 1), (2 * block_size, 1)],
    }[case]
    free = torch.randperm(num_blocks, generator=generator).tolist()
    chunks = []
    for index, (computed, new) in enumerate(shapes):
        needed = -(-(computed + new) // block_size)
        table, free = free[:needed], free[needed:]
        tokens = torch.randint(0, 100, (new,), generator=generator).tolist()
        chunks.append(Chunk(tokens, computed, table))
    return chunks


def kernel_case(case: str, dtype: torch.dtype, num_kv_heads: int, groups: int, head_dim: int, block_size: int,
                window: int | None, seed: int, device: torch.device = torch.device("cpu")) -> dict:
    """Both backends on one step's chunks over a random pool. "split-decode" calls the decode
    kernel directly with its context cut into 3 splits (the runner splits only long contexts)."""
    generator = torch.Generator().manual_seed(seed)
    num_blocks = 64
    chunks = chunks_for(case, num_blocks, block_size, generator)
    # The whole pool random: the chunks' own K/V count as written (write_kv runs first), and
    # blocks of other requests hold values the kernels must not read.
    kv_cache = torch.randn(num_blocks, NUM_LAYERS, 2, block_size, num_kv_heads, head_dim, generator=generator)
    kv_cache = kv_cache.to(device, dtype)
    outputs = {}
    for backend in ("sdpa", "triton"):
        layout = BatchLayout(block_size, NUM_LAYERS, num_kv_heads, groups, head_dim, dtype, window)
        batch = select_attention_backend(backend, layout, device).build_batch(chunks)
        if backend == "sdpa":
            q = torch.randn(len(batch.input_ids), num_kv_heads * groups, head_dim, generator=generator)
            q = q.to(device, dtype)
        if backend == "triton" and case == "split-decode":
            from superinfer.models.triton_attention import NO_WINDOW, decode_attention

            (group,) = batch.meta.kernel_groups
            out = q.new_empty(len(chunks), q.shape[1] * head_dim)
            decode_attention(q, kv_cache, LAYER, group.block_tables, group.context_lens, out,
                             NO_WINDOW if window is None else window, num_splits=3)
            outputs[backend] = out.double().cpu()
            continue
        outputs[backend] = paged_attention(q, kv_cache, LAYER, batch.meta).double().cpu()
    # Rows follow the batch's order; first_rows maps each chunk back.
    dense = torch.empty_like(outputs["sdpa"])
    for chunk, first in zip(chunks, batch.first_rows):
        rows = slice(first, first + len(chunk.token_ids))
        dense[rows] = dense_reference(q[rows].cpu(), kv_cache.cpu(), chunk, window)
    return {"triton": outputs["triton"], "sdpa": outputs["sdpa"], "dense": dense}


KERNEL_CASES = {
    f"{case}-{dtype_name}-{name}": (case, dtype, num_kv_heads, groups, head_dim, block_size, window)
    for case in ("decode", "split-decode", "mixed")
    for dtype_name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16), ("float16", torch.float16))
    for name, num_kv_heads, groups, head_dim, block_size, window in (
        ("gqa", 2, 4, 32, 4, None),
        ("mha", 3, 1, 24, 8, None),  # head size not a power of two
        ("gqa-window", 1, 2, 16, 4, 7),
        ("gqa-wide", 1, 8, 64, 16, None),  # G·D large enough for a narrower decode key tile
    )
}


def step_chunks(step: int, prompts, tables, tokens, split: int = 5) -> list[tuple[int, Chunk]]:
    """(request, chunk) pairs of one step: request 0's prompt in two chunks (steps 0 and 1, the
    first `split` tokens first), request 1's whole in step 0, then a decode for every request
    with a token."""
    if step == 0:
        return [(1, Chunk(prompts[1], 0, tables[1])), (0, Chunk(prompts[0][:split], 0, tables[0]))]
    chunks = [(0, Chunk(prompts[0][split:], split, tables[0]))] if step == 1 else []
    for request in (0, 1):
        if tokens[request]:
            position = len(prompts[request]) + len(tokens[request]) - 1
            chunks.append((request, Chunk([tokens[request][-1]], position, tables[request])))
    return chunks


def greedy_case() -> dict:
    """A tiny random Llama's greedy continuations of two prompts, batched together (one prefill
    in two chunks next to the other's decodes), through the model runner on each backend."""
    sys.path.insert(0, str(pathlib.Path(__file__).parent))
    from conftest import build_tiny_model

    directory = pathlib.Path(tempfile.mkdtemp()) / "tiny-llama"
    build_tiny_model(directory, "llama")
    prompts = [[5, 17, 99, 3, 42, 7, 250, 11, 64], [8, 300, 21]]
    tables = [[9, 2, 14, 0], [5, 11, 3]]  # long enough for every position the steps reach
    return greedy_on_backends(directory, prompts, tables, steps=8)


def greedy_on_backends(directory: pathlib.Path, prompts, tables, steps: int, split: int = 5) -> dict:
    """Per backend (SDPA, Triton), the greedy tokens of `prompts` and every logit row they were
    picked from, over `steps` steps of `step_chunks` through the model runner."""
    from superinfer.shard.loader import load_model
    from superinfer.shard.model_runner import ModelRunner
    from superinfer.shard.model_source import ModelSource

    results = {}
    for backend in ("sdpa", "triton"):
        loaded = load_model(ModelSource(str(directory), directory), torch.float32, torch.device("cpu"))
        runner = ModelRunner(loaded, torch.device("cpu"), torch.float32, 4, attention_backend=backend)
        runner.allocate(16, 0)
        tokens = [[], []]
        logits_seen = []
        for step in range(steps):
            requests_chunks = step_chunks(step, prompts, tables, tokens, split)
            hidden, batch = runner.forward([chunk for _, chunk in requests_chunks])
            logits = runner.logits(hidden)
            for (request, chunk), first in zip(requests_chunks, batch.first_rows):
                if chunk.start + len(chunk.token_ids) == len(prompts[request]) + len(tokens[request]):
                    logits_seen.append(logits[first + len(chunk.token_ids) - 1])
                    tokens[request].append(int(logits_seen[-1].argmax()))
        results[backend] = {"tokens": tokens, "logits": torch.stack(logits_seen)}
    return results


def graphs_case() -> dict:
    """Three requests of a tiny random Llama: prefilled together (an eager mixed step), then
    decoded — three at a time, then two once the third stops — eagerly on each backend and
    through the decode graphs' buckets (1, 2, 4: the three-request steps run in bucket 4 with
    one padding row). Reports each run's greedy tokens and logits, and for the graphed run
    which device blocks hold anything."""
    sys.path.insert(0, str(pathlib.Path(__file__).parent))
    from conftest import build_tiny_model

    from superinfer.shard.loader import load_model
    from superinfer.shard.model_runner import ModelRunner
    from superinfer.shard.model_source import ModelSource

    directory = pathlib.Path(tempfile.mkdtemp()) / "tiny-llama"
    build_tiny_model(directory, "llama")
    prompts = [[5, 17, 99, 3, 42, 7, 250, 11, 64], [8, 300, 21], [77, 4, 4, 19, 120]]
    tables = [[9, 2, 14, 0], [5, 11, 3], [12, 7, 1]]
    stop_after = [7, 7, 3]  # request 2 stops early: later steps decode two requests (bucket 2)
    results = {}
    for run in ("sdpa", "triton", "graphs"):
        loaded = load_model(ModelSource(str(directory), directory), torch.float32, torch.device("cpu"))
        runner = ModelRunner(loaded, torch.device("cpu"), torch.float32, 4,
                             attention_backend="sdpa" if run == "sdpa" else "triton")
        cache = runner.allocate(16, 0, padding_block=run == "graphs")
        if run == "graphs":
            runner.capture_decode_graphs((1, 2, 4))
        tokens, logits_seen, buckets = [[], [], []], [], []
        for step in range(7):
            if step == 0:
                requests = [(r, Chunk(prompts[r], 0, tables[r])) for r in range(3)]
            else:
                requests = [(r, Chunk([tokens[r][-1]], len(prompts[r]) + len(tokens[r]) - 1, tables[r]))
                            for r in range(3) if len(tokens[r]) < stop_after[r]]
            chunks = [chunk for _, chunk in requests]
            graphed = runner.graphs is not None and runner.graphs.fits(chunks)
            hidden, batch = runner.forward(chunks)
            if graphed:
                buckets.append(len(batch.meta.kernel_groups[0].context_lens))  # the bucket it ran in
            logits = runner.logits(hidden)
            for (request, chunk), first in zip(requests, batch.first_rows):
                logits_seen.append(logits[first + len(chunk.token_ids) - 1])
                tokens[request].append(int(logits_seen[-1].argmax()))
        used = sorted({block for table in tables for block in table})
        written = [int(b) for b in range(cache.device.shape[0]) if bool(cache.device[b].abs().sum() > 0)]
        results[run] = {"tokens": tokens, "logits": torch.stack(logits_seen), "buckets": buckets,
                        "written_blocks": written, "used_blocks": used, "padding_block": cache.padding_block}
    return results


def main(out_path: str) -> None:
    # The interpreter is decided at triton's import, which comes later (on first use).
    if os.environ.get("TRITON_INTERPRET") != "1" or "triton" in sys.modules:
        sys.exit("run with TRITON_INTERPRET=1 set before triton is imported (see test_triton_attention.py)")
    torch.set_num_threads(1)
    report = {name: kernel_case(*args, seed=index) for index, (name, args) in enumerate(KERNEL_CASES.items())}
    report["greedy"] = greedy_case()
    report["graphs"] = graphs_case()
    torch.save(report, out_path)


if __name__ == "__main__":
    main(sys.argv[1])
