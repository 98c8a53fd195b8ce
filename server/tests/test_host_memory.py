"""The host KV pool's default size: a share of the host memory available, bounded by the
container's limit, split between the ranks; as given when given; 256 blocks on the CPU."""
import pytest
import torch

from superinfer.shard.cli import with_host_pool_size
from superinfer.shard.config import ShardConfig
from superinfer.shard.host_memory import (DEFAULT_CPU_HOST_KV_BLOCKS, available_host_bytes, cgroup_headroom,
                                          host_blocks_for_memory, mem_available)

GIB = 1 << 30


def test_mem_available_reads_meminfo(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24000000 kB\nMemFree:         1000000 kB\nMemAvailable:   12000000 kB\n")
    assert mem_available(meminfo) == 12000000 * 1024
    assert mem_available(tmp_path / "missing") is None


@pytest.mark.parametrize(("files", "expected"), [
    ({"memory.max": "8589934592\n", "memory.current": "2147483648\n"}, 6 * GIB),  # cgroup v2
    ({"memory.max": "max\n", "memory.current": "2147483648\n"}, None),  # v2, no limit
    ({"memory/memory.limit_in_bytes": "4294967296\n", "memory/memory.usage_in_bytes": "1073741824\n"}, 3 * GIB),
    ({"memory/memory.limit_in_bytes": "9223372036854771712\n", "memory/memory.usage_in_bytes": "1\n"}, None),
    ({"memory.max": "1073741824\n", "memory.current": "2147483648\n"}, 0),  # over the limit already
    ({}, None),
])
def test_cgroup_headroom(tmp_path, files, expected):
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert cgroup_headroom(tmp_path) == expected


def test_available_host_bytes_is_positive_here():
    assert 0 < available_host_bytes() <= (mem_available() or available_host_bytes())


def test_blocks_for_memory():
    assert host_blocks_for_memory(100 * GIB, 0.5, GIB) == 50
    assert host_blocks_for_memory(100 * GIB, 0.5, GIB, ranks=4) == 12  # each rank holds a slice of every block
    assert host_blocks_for_memory(GIB, 0.5, 2 * GIB) == 0
    for fraction in (0.0, 1.5):
        with pytest.raises(ValueError, match="fraction"):
            host_blocks_for_memory(GIB, fraction, GIB)


def _config(device: str, host_kv_blocks, fraction: float = 0.5) -> ShardConfig:
    return ShardConfig(model="m", cache_dir=None, device=torch.device(device), dtype=torch.float32,
                       host_kv_blocks=host_kv_blocks, host_kv_memory_fraction=fraction)


def test_the_pool_size_given_wins_and_the_cpu_keeps_its_default():
    assert with_host_pool_size(_config("cpu", 7), 1024).host_kv_blocks == 7
    assert with_host_pool_size(_config("cpu", None), 1024).host_kv_blocks == DEFAULT_CPU_HOST_KV_BLOCKS


def test_a_gpu_without_a_size_takes_its_share_of_host_memory(monkeypatch):
    monkeypatch.setattr("superinfer.shard.host_memory.available_host_bytes", lambda: 64 * GIB)

    class Group:
        world_size = 2

        @staticmethod
        def minimum(values):  # another rank found less memory free
            return [min(values[0], 10)]

    config = _config("cuda", None, fraction=0.25)
    assert with_host_pool_size(config, GIB // 2).host_kv_blocks == 32  # 16 GiB in 512 MiB blocks
    assert with_host_pool_size(config, GIB // 2, Group()).host_kv_blocks == 10
    assert with_host_pool_size(_config("cuda", 3), GIB).host_kv_blocks == 3
