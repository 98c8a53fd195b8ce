"""The decode-only fast path of the batch builder against the general one: the same attention
output over the same cache, with and without a sliding window and with contexts of different
lengths (a mask) or all equal (none)."""
import pytest
import torch

from superinfer.models.attention import paged_attention
from superinfer.shard.batch import BatchLayout, Chunk, general_batch, sdpa_batch


@pytest.mark.parametrize("window", [None, 5])
@pytest.mark.parametrize("starts", [[9, 0, 14, 14], [14, 14]])
def test_decode_fast_path_attends_exactly_as_the_general_path(window, starts):
    layout = BatchLayout(4, 2, 2, 3, 8, torch.float32, window)
    generator = torch.Generator().manual_seed(0)
    cache = torch.randn(40, 2, 2, 4, 2, 8, generator=generator)  # [N, L, 2, block_size, Hkv, D]
    tables = [[3, 7, 1, 20], [5, 21, 22, 23], [8, 2, 9, 11], [12, 13, 14, 15]]
    chunks = [Chunk([index + 1], start, tables[index]) for index, start in enumerate(starts)]
    fast = sdpa_batch(chunks, layout, torch.device("cpu"))
    general = general_batch(chunks, layout, torch.device("cpu"))
    assert fast.first_rows == general.first_rows
    for name in ("positions", "slot_blocks", "slot_offsets"):
        assert torch.equal(getattr(fast.meta, name), getattr(general.meta, name)), name
    assert torch.equal(fast.input_ids, general.input_ids)
    assert (fast.meta.groups[0].mask is None) == (general.meta.groups[0].mask is None)
    q = torch.randn(len(chunks), 6, 8, generator=generator)
    for layer in (0, 1):
        torch.testing.assert_close(paged_attention(q, cache, layer, fast.meta),
                                   paged_attention(q, cache, layer, general.meta), atol=1e-6, rtol=1e-6)
