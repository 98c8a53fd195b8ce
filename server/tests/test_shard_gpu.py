"""The shard on a GPU (skipped without one): bf16 compute, pinned host pool, the CUDA
transfer path, and a swap round trip that continues exactly as without the swap."""
import pytest
import torch
from conftest import make_executor
from test_shard_swap import PROMPT, Driver, _start

from superinfer.pb import shard_pb2 as pb

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_gpu_pools_and_dtype(tiny_llama_dir):
    executor = make_executor(tiny_llama_dir, device="cuda")
    cache = executor.runner.cache
    assert cache.device.is_cuda and cache.device.dtype == torch.bfloat16
    assert cache.host.is_pinned()
    assert executor.info().dtype == "bfloat16" and executor.info().device_type == "cuda"


def test_gpu_swap_round_trip(tiny_llama_dir):
    reference = Driver(make_executor(tiny_llama_dir, device="cuda"))
    expected = _start(reference, 1, [0, 1, 2, 3])
    reference.decode(1, expected, len(PROMPT), [0, 1, 2, 3], 12)

    driver = Driver(make_executor(tiny_llama_dir, device="cuda"))
    tokens = _start(driver, 1, [0, 1, 2, 3])
    driver.decode(1, tokens, len(PROMPT), [0, 1, 2, 3], 4)
    driver.step(swap_out=[pb.Transfer(id=1, src_blocks=[0, 1, 2, 3], dst_blocks=[3, 2, 1, 0])])
    driver.wait_for(1)
    _start(driver, 2, [0, 1, 2, 3], prompt=list(range(100, 160)))
    driver.step(forget=[2], swap_in=[pb.Transfer(id=2, src_blocks=[3, 2, 1, 0], dst_blocks=[9, 8, 7, 6])])
    driver.wait_for(2)
    driver.decode(1, tokens, len(PROMPT), [9, 8, 7, 6], 8)
    assert tokens == expected


def test_gpu_without_a_host_pool(tiny_llama_dir):
    executor = make_executor(tiny_llama_dir, device="cuda", host_blocks=0)
    assert executor.runner.cache.num_host_blocks == 0
    driver = Driver(executor)
    tokens = _start(driver, 1, [0, 1, 2, 3])
    driver.decode(1, tokens, len(PROMPT), [0, 1, 2, 3], 4)
    assert len(tokens) == 5
