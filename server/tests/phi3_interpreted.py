"""Run by test_model_phi3.py under TRITON_INTERPRET=1 (set before triton is imported): a tiny
Phi-3 checkpoint (its original context 16 tokens) decoding two requests batched together — one
past its original context, one within it — through the model runner on the SDPA backend, the
Triton backend and the decode graphs' eager replay. Saves each run's greedy tokens and logits."""
import os
import pathlib
import sys

import torch

PROMPTS = [list(range(5, 25)), [8, 300, 21, 7, 9]]
TABLES = [list(range(0, 8)), list(range(8, 16))]  # blocks of 4 tokens: 32 positions each
DECODES = 8


def _steps(tokens):
    """Step 0: request 0's first 12 prompt tokens (within the original 16) and request 1's
    prompt; step 1: request 0's other 8 (past it) next to request 1's first decode; then decodes."""
    from superinfer.shard.batch import Chunk

    yield [(0, Chunk(PROMPTS[0][:12], 0, TABLES[0])), (1, Chunk(PROMPTS[1], 0, TABLES[1]))]
    yield [(0, Chunk(PROMPTS[0][12:], 12, TABLES[0])), (1, Chunk([tokens[1][-1]], 5, TABLES[1]))]
    for _ in range(DECODES):
        yield [(r, Chunk([tokens[r][-1]], len(PROMPTS[r]) + len(tokens[r]) - 1, TABLES[r])) for r in (0, 1)]


def run(directory: pathlib.Path, mode: str) -> dict:
    from superinfer.shard.loader import load_model
    from superinfer.shard.model_runner import ModelRunner
    from superinfer.shard.model_source import ModelSource

    loaded = load_model(ModelSource(str(directory), directory), torch.float32, torch.device("cpu"))
    runner = ModelRunner(loaded, torch.device("cpu"), torch.float32, 4,
                         attention_backend="sdpa" if mode == "sdpa" else "triton")
    runner.allocate(20, 0, padding_block=mode == "graphs")
    if mode == "graphs":
        runner.capture_decode_graphs((1, 2))
    tokens, logits_seen, graphed = [[], []], [], 0
    for requests in _steps(tokens):
        chunks = [chunk for _, chunk in requests]
        graphed += runner.graphs is not None and runner.graphs.fits(chunks)
        hidden, batch = runner.forward(chunks)
        logits = runner.logits(hidden)
        for (request, chunk), first in zip(requests, batch.first_rows):
            if chunk.start + len(chunk.token_ids) == len(PROMPTS[request]) + len(tokens[request]):
                logits_seen.append(logits[first + len(chunk.token_ids) - 1])
                tokens[request].append(int(logits_seen[-1].argmax()))
    return {"tokens": tokens, "logits": torch.stack(logits_seen), "graphed_steps": graphed}


def main(directory: str, out_path: str) -> None:
    if os.environ.get("TRITON_INTERPRET") != "1" or "triton" in sys.modules:
        sys.exit("run with TRITON_INTERPRET=1 set before triton is imported")
    torch.set_num_threads(1)
    torch.save({mode: run(pathlib.Path(directory), mode) for mode in ("sdpa", "triton", "graphs")}, out_path)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
