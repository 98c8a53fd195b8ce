"""The checks every architecture's test file runs on a random checkpoint: parity with
transformers (logits and greedy tokens), chunked prefill equal to one-shot, and gloo ranks
computing the whole model's logits."""
import pathlib

import torch
import torch.multiprocessing as mp
from conftest import build_tiny_model, make_runner, runner_logits
from test_model_parity import PROMPT, _check
from test_tensor_parallel import _free_port, _rank, _whole

TINY_PROMPT = [p % 512 for p in PROMPT]


def check_matches_transformers(directory: pathlib.Path, architecture: str, **overrides):
    """Builds the checkpoint, checks logits (1e-3) and 32 greedy tokens against transformers
    and chunked prefill against one shot; returns our runner."""
    model = build_tiny_model(directory, architecture, seed=3, **overrides)
    runner = make_runner(directory)
    _check(runner, model, TINY_PROMPT)
    check_chunked_prefill(runner, TINY_PROMPT)
    return runner


def check_chunked_prefill(runner, prompt: list[int], chunk: int = 11) -> None:
    """The prompt in chunks of `chunk` tokens (crossing block boundaries) gives the logits of
    one shot, in blocks of its own."""
    width = -(-len(prompt) // runner.block_size)
    one_shot = runner_logits(runner, prompt, list(range(width)))
    blocks = list(range(width, 2 * width))
    chunked = torch.cat([runner_logits(runner, prompt[start:start + chunk], blocks, start=start)
                         for start in range(0, len(prompt), chunk)])
    assert (chunked - one_shot).abs().max().item() < 1e-4
    assert torch.equal(chunked.argmax(-1), one_shot.argmax(-1))


def check_tensor_parallel(tmp_path: pathlib.Path, architecture: str, world_size: int = 2, **overrides) -> list[dict]:
    """Gloo ranks loading their slices compute the whole model's logits (prefill and two
    decodes); returns what each rank reported (its parameter bytes, KV cache shape)."""
    directory = tmp_path / architecture
    build_tiny_model(directory, architecture, **overrides)
    expected, whole_bytes, _ = _whole(directory)
    results = str(tmp_path / "rank")
    mp.spawn(_rank, args=(world_size, str(directory), _free_port(), results), nprocs=world_size, join=True)
    ranks = [torch.load(f"{results}.{rank}", weights_only=False) for rank in range(world_size)]
    for got, want in zip(ranks[0]["logits"], expected, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        assert torch.equal(got.argmax(-1), want.argmax(-1))
    for rank in ranks:
        # Each rank holds about 1/N of the weights (norms and routers are replicated).
        assert 0.85 / world_size < rank["bytes"] / whole_bytes < 1.1 / world_size, (rank["bytes"], whole_bytes)
    return ranks
