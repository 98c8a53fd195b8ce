"""The attention backends, chosen in one place (`select_attention_backend`): each builds its
own metadata over the same pool, says whether decode graphs can replay it, and is refused with
the reason where it cannot run. FlashInfer's kernels need a GPU; its step description (CSR page
lists, last-page fills, query offsets) is checked here against the chunks it describes."""
import pytest
import torch

from superinfer.models.flashinfer_attention import paged_rows
from superinfer.shard.attention_backends import flashinfer_plan, select_attention_backend
from superinfer.shard.batch import BatchLayout, Chunk
from superinfer.shard.cli import ATTENTION_BACKENDS
from superinfer.shard.config import ATTENTION_BACKEND_NAMES

LAYOUT = BatchLayout(4, 2, 2, 3, 8, torch.float32, None)
CPU = torch.device("cpu")


def test_every_name_the_cli_offers_is_a_backend():
    assert ATTENTION_BACKENDS == ("auto", *ATTENTION_BACKEND_NAMES)
    assert select_attention_backend(None, LAYOUT, CPU).name == "sdpa"
    assert select_attention_backend("triton", LAYOUT, CPU).graphs
    assert not select_attention_backend("sdpa", LAYOUT, CPU).graphs


def test_flashinfer_is_refused_with_its_reason_on_the_cpu():
    with pytest.raises(ValueError, match="flashinfer needs a CUDA device"):
        select_attention_backend("flashinfer", LAYOUT, CPU)


def test_sdpa_and_triton_agree_on_the_rows_they_share():
    chunks = [Chunk([1], 6, [7, 3]), Chunk([1, 2, 3], 5, [4, 9, 2]), Chunk([5], 0, [8])]
    sdpa = select_attention_backend("sdpa", LAYOUT, CPU).build_batch(chunks)
    triton = select_attention_backend("triton", LAYOUT, CPU).build_batch(chunks)
    assert sdpa.first_rows == triton.first_rows == [3, 0, 4]
    for name in ("positions", "slot_blocks", "slot_offsets"):
        assert getattr(sdpa.meta, name).tolist() == getattr(triton.meta, name).tolist()
    assert sdpa.input_ids.tolist() == triton.input_ids.tolist() == [1, 2, 3, 1, 5]
    assert sdpa.meta.kernel_groups is None and triton.meta.groups == ()


def test_paged_rows_describe_each_context_page_by_page():
    # Contexts 7, 8 and 1 tokens over blocks of 4: pages 2, 2 and 1, last pages 3, 4 and 1 full.
    rows = paged_rows([1, 3, 1], [6, 5, 0], [[7, 3], [4, 9, 2], [8]], row_start=2, block_size=4, decode=False)
    assert rows.kv_indptr.tolist() == [0, 2, 4, 5]
    assert rows.kv_indices.tolist() == [7, 3, 4, 9, 8]  # a table's blocks past the context are not listed
    assert rows.last_page_len.tolist() == [3, 4, 1]
    assert rows.qo_indptr.tolist() == [0, 1, 4, 5]
    assert (rows.row_start, rows.num_rows) == (2, 5)
    assert {t.dtype for t in (rows.kv_indptr, rows.kv_indices, rows.last_page_len, rows.qo_indptr)} == {torch.int32}
    with pytest.raises(ValueError, match="needs 3 blocks"):
        paged_rows([2], [7], [[1, 2]], 0, 4, decode=True)


def test_flashinfer_plan_groups_follow_the_flat_batch():
    chunks = [Chunk([1], 6, [7, 3]), Chunk([1, 2, 3], 5, [4, 9, 2]), Chunk([5], 0, [8]), Chunk([4, 4], 0, [5])]
    plan = flashinfer_plan(chunks, [1, 3], [0, 2], LAYOUT, wrappers=None)
    prefill, decode = plan.groups
    # The flat batch: the prefill chunks' 3 + 2 rows first, then the two decodes.
    assert (prefill.decode, prefill.row_start, prefill.num_rows) == (False, 0, 5)
    assert prefill.qo_indptr.tolist() == [0, 3, 5] and prefill.kv_indices.tolist() == [4, 9, 5]
    assert (decode.decode, decode.row_start, decode.num_rows) == (True, 5, 2)
    assert decode.kv_indices.tolist() == [7, 3, 8] and decode.last_page_len.tolist() == [3, 1]
    assert (plan.num_qo_heads, plan.num_kv_heads, plan.head_dim, plan.block_size) == (6, 2, 8, 4)


def test_the_pinned_flashinfer_takes_what_the_backend_passes():
    # The kernels need a GPU; the API the backend calls is checked against the pinned package.
    import inspect

    import flashinfer

    prefill = inspect.signature(flashinfer.BatchPrefillWithPagedKVCacheWrapper.plan).parameters
    assert {"qo_indptr", "paged_kv_indptr", "paged_kv_indices", "paged_kv_last_page_len", "causal", "window_left",
            "logits_soft_cap", "sm_scale", "q_data_type", "kv_data_type"} <= prefill.keys()
    assert list(prefill)[1:9] == ["qo_indptr", "paged_kv_indptr", "paged_kv_indices", "paged_kv_last_page_len",
                                  "num_qo_heads", "num_kv_heads", "head_dim_qk", "page_size"]
    decode = inspect.signature(flashinfer.BatchDecodeWithPagedKVCacheWrapper.plan).parameters
    assert list(decode)[1:8] == ["indptr", "indices", "last_page_len", "num_qo_heads", "num_kv_heads", "head_dim",
                                 "page_size"]
    decode_doc = flashinfer.BatchDecodeWithPagedKVCacheWrapper.plan.__doc__
    assert all(name in decode_doc for name in ("window_left", "logits_soft_cap", "sm_scale", "q_data_type"))
    assert "use_tensor_cores" in inspect.signature(flashinfer.BatchDecodeWithPagedKVCacheWrapper.__init__).parameters
    for wrapper in (flashinfer.BatchPrefillWithPagedKVCacheWrapper, flashinfer.BatchDecodeWithPagedKVCacheWrapper):
        assert {"q", "paged_kv_cache"} <= inspect.signature(wrapper.run).parameters.keys()
