"""The shard on a GPU (skipped without one): bf16 compute, pinned host pool, the CUDA
transfer path, and a rotation round trip that continues exactly as without the rotation."""
import pytest
import torch
from conftest import make_executor
from test_shard_rotation import PROMPT, Driver, _start, rotation_round_trip

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_gpu_pools_and_dtype(tiny_llama_dir):
    executor = make_executor(tiny_llama_dir, device="cuda")
    cache = executor.runner.cache
    assert cache.device.is_cuda and cache.device.dtype == torch.bfloat16
    assert cache.host.is_pinned()
    assert executor.info().dtype == "bfloat16" and executor.info().device_type == "cuda"


def test_gpu_rotation_round_trip(tiny_llama_dir):
    _, tokens, expected = rotation_round_trip(tiny_llama_dir, "cuda", 4, 8, [3, 2, 1, 0], [9, 8, 7, 6], ids=(1, 2))
    assert tokens == expected


def test_gpu_without_a_host_pool(tiny_llama_dir):
    executor = make_executor(tiny_llama_dir, device="cuda", host_blocks=0)
    assert executor.runner.cache.num_host_blocks == 0
    driver = Driver(executor)
    tokens = _start(driver, 1, [0, 1, 2, 3])
    driver.decode(1, tokens, len(PROMPT), [0, 1, 2, 3], 4)
    assert len(tokens) == 5
