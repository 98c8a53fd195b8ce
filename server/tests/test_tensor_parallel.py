"""Tensor parallelism below the server: how a model is split (heads, KV heads split or
replicated, MLP, padded vocabulary), and real gloo ranks (torch.multiprocessing) that load
only their slices and together compute the logits the whole model computes."""
import pathlib
import socket

import pytest
import torch
import torch.multiprocessing as mp

from conftest import build_tiny_model
from superinfer.models.config import ConfigError, model_config_from_hf
from superinfer.models.tensor_parallel import partition


def _config(heads: int, kv_heads: int, inner: int = 256, vocab: int = 512):
    return model_config_from_hf({
        "model_type": "llama", "vocab_size": vocab, "hidden_size": 16 * heads, "intermediate_size": inner,
        "num_hidden_layers": 2, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
    })


def test_kv_heads_are_split_when_the_ranks_divide_them():
    parts = [partition(_config(8, 4), rank, 2) for rank in range(2)]
    assert [(p.head_start, p.num_heads, p.kv_head_start, p.num_kv_heads, p.kv_replicas) for p in parts] == [
        (0, 4, 0, 2, 1), (4, 4, 2, 2, 1)]
    assert [(p.intermediate_start, p.intermediate_size) for p in parts] == [(0, 128), (128, 128)]


def test_kv_heads_are_replicated_when_the_ranks_outnumber_them():
    # Four ranks, two KV heads: ranks 0-1 hold KV head 0, ranks 2-3 KV head 1, each with the
    # query heads that read it.
    parts = [partition(_config(8, 2), rank, 4) for rank in range(4)]
    assert [(p.head_start, p.num_heads, p.kv_head_start, p.num_kv_heads, p.kv_replicas) for p in parts] == [
        (0, 2, 0, 1, 2), (2, 2, 0, 1, 2), (4, 2, 1, 1, 2), (6, 2, 1, 1, 2)]


def test_shapes_that_cannot_be_split_are_refused_with_the_reason():
    # The embedded SmolLM2-135M: 9 heads, 3 KV heads: 3 ranks split it, 2 cannot.
    smollm2 = _config(9, 3, inner=1536, vocab=49152)
    assert partition(smollm2, 2, 3).kv_head_start == 2
    with pytest.raises(ConfigError, match="9 attention heads cannot be split over 2 shards"):
        partition(smollm2, 0, 2)
    with pytest.raises(ConfigError, match="4 KV heads can be neither split over 6 shards nor replicated"):
        partition(_config(12, 4, inner=252), 0, 6)


def test_the_vocabulary_is_padded_to_a_multiple_of_the_ranks():
    parts = [partition(_config(8, 4, vocab=509), rank, 2) for rank in range(2)]
    assert [(p.vocab_start, p.vocab_rows) for p in parts] == [(0, 255), (255, 255)]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


PROMPT = list(range(3, 40))


def _rank(rank: int, world_size: int, directory: str, port: int, results: str) -> None:
    """One gloo rank: loads its slice, runs a prefill and two decodes through the paged cache."""
    from superinfer.shard.batch import Chunk
    from superinfer.shard.config import ParallelConfig
    from superinfer.shard.loader import load_model, parameter_bytes
    from superinfer.shard.model_runner import ModelRunner
    from superinfer.shard.model_source import ModelSource
    from superinfer.shard.rank_group import RankGroup

    torch.set_num_threads(1)
    group = RankGroup(ParallelConfig(rank, world_size, "127.0.0.1", port, 60.0), torch.device("cpu"))
    try:
        loaded = load_model(ModelSource(directory, pathlib.Path(directory)), torch.float32, torch.device("cpu"),
                            group.tensor_parallel)
        runner = ModelRunner(loaded, torch.device("cpu"), torch.float32, 16)
        runner.allocate(8, 0)
        hidden, _ = runner.forward([Chunk(PROMPT, 0, [0, 1, 2])])
        logits = [runner.logits(hidden)]
        for position, token in ((len(PROMPT), 7), (len(PROMPT) + 1, 9)):
            hidden, _ = runner.forward([Chunk([token], position, [0, 1, 2])])
            logits.append(runner.logits(hidden))
        torch.save({"logits": logits if rank == 0 else None, "bytes": parameter_bytes(loaded.model),
                    "kv_shape": tuple(runner.cache.device.shape)}, f"{results}.{rank}")
    finally:
        group.close()


def _whole(directory: pathlib.Path):
    from superinfer.shard.batch import Chunk
    from superinfer.shard.loader import load_model, parameter_bytes
    from superinfer.shard.model_runner import ModelRunner
    from superinfer.shard.model_source import ModelSource

    loaded = load_model(ModelSource(str(directory), directory), torch.float32, torch.device("cpu"))
    runner = ModelRunner(loaded, torch.device("cpu"), torch.float32, 16)
    runner.allocate(8, 0)
    hidden, _ = runner.forward([Chunk(PROMPT, 0, [0, 1, 2])])
    logits = [runner.logits(hidden)]
    for position, token in ((len(PROMPT), 7), (len(PROMPT) + 1, 9)):
        hidden, _ = runner.forward([Chunk([token], position, [0, 1, 2])])
        logits.append(runner.logits(hidden))
    return logits, parameter_bytes(loaded.model), tuple(runner.cache.device.shape)


@pytest.mark.parametrize("architecture, world_size, overrides", [
    # Four KV heads over two ranks: two each.
    ("llama", 2, dict(num_attention_heads=8, num_key_value_heads=4, hidden_size=128, intermediate_size=256)),
    # One KV head, two ranks: replicated; Q/K/V biases; a vocabulary that is not a multiple of 2.
    ("qwen2", 2, dict(num_attention_heads=4, num_key_value_heads=1, hidden_size=64, intermediate_size=128,
                      vocab_size=509, tie_word_embeddings=True)),
    # SmolLM2-135M's heads (9, 3 KV heads, tied embedding) over three ranks: one KV head each.
    ("llama", 3, dict(num_attention_heads=9, num_key_value_heads=3, hidden_size=144, intermediate_size=384,
                      tie_word_embeddings=True)),
])
def test_gloo_ranks_compute_the_whole_models_logits_from_their_share_of_the_weights(
        tmp_path, architecture, world_size, overrides):
    directory = tmp_path / architecture
    build_tiny_model(directory, architecture, **overrides)
    expected, whole_bytes, whole_kv = _whole(directory)
    results = str(tmp_path / "rank")
    mp.spawn(_rank, args=(world_size, str(directory), _free_port(), results), nprocs=world_size, join=True)
    ranks = [torch.load(f"{results}.{rank}", weights_only=False) for rank in range(world_size)]
    for got, want in zip(ranks[0]["logits"], expected):
        assert got.shape == want.shape
        # Only the summation order of the row-parallel layers differs.
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        assert torch.equal(got.argmax(-1), want.argmax(-1))
    kv_heads = overrides["num_key_value_heads"]
    for rank in ranks:
        # The weights are really split: each rank holds about 1/N (the norms are replicated).
        share = rank["bytes"] / whole_bytes
        assert 0.9 / world_size < share < 1.1 / world_size, (rank["bytes"], whole_bytes)
        # Each rank's KV blocks hold its own KV heads: 1/N of them, or the one it replicates.
        assert rank["kv_shape"][4] == max(1, kv_heads // world_size)
        assert rank["kv_shape"][:4] == whole_kv[:4]
