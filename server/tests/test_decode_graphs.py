"""The decode graphs' bucket logic and padded inputs, and the padding block outside the pool
the router allocates from. The graphed forward itself (kernels under the Triton interpreter,
greedy tokens against the eager paths) is in test_triton_attention.py; capture needs a GPU
(test_shard_gpu.py)."""
import pytest
import torch

from superinfer.shard.batch import Chunk
from superinfer.shard.decode_graphs import bucket_for, decode_inputs, default_batch_sizes
from superinfer.shard.kv_cache import KVCache, KVGeometry


def test_default_buckets_cover_every_batch_up_to_the_request_limit_with_little_padding():
    assert default_batch_sizes(32) == (1, 2, 4, 8, 16, 24, 32)
    assert default_batch_sizes(3) == (1, 2, 3)
    assert default_batch_sizes(50) == (1, 2, 4, 8, 16, 24, 32, 40, 48, 50)
    sizes = default_batch_sizes(256)
    for n in range(1, 257):
        bucket = bucket_for(n, sizes)
        assert bucket >= n and bucket - n < 8
    assert bucket_for(257, sizes) is None


def test_padded_inputs_put_padding_rows_on_the_padding_block_with_one_key():
    block_size, padding = 4, 99
    chunks = [Chunk([7], 9, [3, 5, 8]), Chunk([11], 0, [6]), Chunk([13], 4, [1, 2])]
    rows, tables = decode_inputs(chunks, 4, block_size, padding, width=128)
    input_ids, positions, slot_blocks, slot_offsets, context_lens = rows.tolist()
    assert input_ids == [7, 11, 13, 0] and positions == [9, 0, 4, 0]
    # Position 9 is in the request's third block (index 2), offset 1; the padding row writes
    # slot 0 of the padding block.
    assert slot_blocks == [8, 6, 2, padding] and slot_offsets == [1, 0, 0, 0]
    assert context_lens == [10, 1, 5, 1]
    # As wide as the widest context; shorter rows repeat their first block, padding rows the padding block.
    assert tables.tolist() == [[3, 5, 8], [6, 6, 6], [1, 2, 1], [padding] * 3]
    assert rows.dtype == torch.int64 and tables.dtype == torch.int32


def test_padded_inputs_refuse_what_a_graph_cannot_run():
    with pytest.raises(ValueError, match="decodes only"):
        decode_inputs([Chunk([1, 2], 0, [0])], 2, 4, 9, 8)
    with pytest.raises(ValueError, match="do not fit"):
        decode_inputs([Chunk([1], 0, [0])] * 3, 2, 4, 9, 8)
    with pytest.raises(ValueError, match="longer than the graphs"):
        decode_inputs([Chunk([1], 40, list(range(11)))], 1, 4, 99, width=8)


def test_the_padding_block_is_allocated_but_never_offered():
    geometry = KVGeometry(2, 4, 2, 8, torch.float32)
    cache = KVCache(geometry, 10, 3, torch.device("cpu"), padding_block=True)
    assert cache.num_device_blocks == 10 and cache.padding_block == 10 and cache.device.shape[0] == 11
    plain = KVCache(geometry, 10, 3, torch.device("cpu"))
    assert plain.num_device_blocks == 10 and plain.padding_block is None and plain.device.shape[0] == 10


def test_the_cpu_captures_no_graphs(tiny_llama_dir):
    from conftest import make_runner

    from superinfer.shard.config import ShardConfig
    from superinfer.shard.warm_start import graph_batch_sizes

    runner = make_runner(tiny_llama_dir)
    config = ShardConfig(model=str(tiny_llama_dir), cache_dir=tiny_llama_dir, device=torch.device("cpu"),
                         dtype=torch.float32)
    assert graph_batch_sizes(runner, config, None, 32) == ()
    with pytest.raises(ValueError, match="triton"):
        runner.capture_decode_graphs((1, 2))  # the CPU's sdpa backend has no fixed-shape metadata
