"""CPU backend: bit-exact round trips, duplex, large batches, ordering, completion."""

import pytest
import torch

from superinfer_kv import TransferEngine


def _geometry_pool(blocks: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    # [blocks, layers=3, K/V=2, block_size=16, kv_heads=2, head_dim=8]
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(blocks, 3, 2, 16, 2, 8, generator=generator).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_round_trip_is_bit_exact(dtype: torch.dtype) -> None:
    device_kv = _geometry_pool(64, dtype, seed=1)
    host_kv = torch.zeros(48, *device_kv.shape[1:], dtype=dtype)
    original = device_kv.clone()
    engine = TransferEngine(device_kv, host_kv)
    generator = torch.Generator().manual_seed(7)
    for _ in range(5):
        device_ids = torch.randperm(64, generator=generator)[:40]
        host_ids = torch.randperm(48, generator=generator)[:40]
        engine.submit(swap_out=(device_ids, host_ids)).wait()
        device_kv[device_ids] = 0
        back_ids = torch.randperm(64, generator=generator)[:40]
        engine.submit(swap_in=(host_ids, back_ids)).wait()
        # Bitwise comparison: NaN-safe and catches any conversion.
        moved, expected = device_kv[back_ids], original[device_ids]
        assert torch.equal(moved.view(torch.uint8), expected.view(torch.uint8))
        device_kv.copy_(original)


def test_both_directions_at_once_on_disjoint_blocks() -> None:
    device_kv = _geometry_pool(32, torch.float32, seed=2)
    host_kv = _geometry_pool(32, torch.float32, seed=3)
    device_before, host_before = device_kv.clone(), host_kv.clone()
    engine = TransferEngine(device_kv, host_kv)
    handle = engine.submit(
        swap_out=(list(range(0, 16)), list(range(16, 32))),
        swap_in=(list(range(0, 16)), list(range(16, 32))),
    )
    handle.wait()
    assert torch.equal(host_kv[16:], device_before[:16])
    assert torch.equal(device_kv[16:], host_before[:16])
    assert torch.equal(device_kv[:16], device_before[:16])
    assert torch.equal(host_kv[:16], host_before[:16])


def test_ten_thousand_blocks() -> None:
    # [blocks, layers=2, K/V=2, block_size=4, kv_heads=1, head_dim=4] — 256 bytes per block.
    device_kv = torch.arange(12_000 * 64, dtype=torch.float32).view(12_000, 2, 2, 4, 1, 4)
    host_kv = torch.zeros(10_000, 2, 2, 4, 1, 4)
    generator = torch.Generator().manual_seed(11)
    device_ids = torch.randperm(12_000, generator=generator)[:10_000]
    host_ids = torch.randperm(10_000, generator=generator)
    engine = TransferEngine(device_kv, host_kv)
    engine.submit(swap_out=(device_ids, host_ids)).wait()
    assert torch.equal(host_kv[host_ids], device_kv[device_ids])
    device_kv.zero_()
    engine.submit(swap_in=(host_ids, device_ids)).wait()
    assert torch.equal(device_kv[device_ids], host_kv[host_ids])


def test_transfer_sees_compute_issued_before_submit() -> None:
    device_kv = torch.zeros(4, 2, 2, 4, 1, 8)
    host_kv = torch.zeros(4, 2, 2, 4, 1, 8)
    engine = TransferEngine(device_kv, host_kv)
    device_kv[1].add_(3.5)  # the "compute" that writes block 1
    engine.submit(swap_out=([1], [2])).wait()
    assert bool((host_kv[2] == 3.5).all())


def test_compute_after_swap_in_sees_the_copy() -> None:
    device_kv = torch.zeros(4, 2, 2, 4, 1, 8)
    host_kv = torch.full((4, 2, 2, 4, 1, 8), 2.0)
    engine = TransferEngine(device_kv, host_kv)
    handle = engine.submit(swap_in=([0, 1, 2, 3], [3, 2, 1, 0]))
    handle.order_compute_after_in()
    assert handle.in_done()
    assert float(device_kv.sum()) == 2.0 * device_kv.numel()


def test_completion_flags() -> None:
    device_kv = _geometry_pool(256, torch.float32, seed=4)
    host_kv = torch.zeros_like(device_kv)
    engine = TransferEngine(device_kv, host_kv)
    handles = [engine.submit(swap_out=([i], [i])) for i in range(0, 256, 2)]
    handles += [engine.submit(swap_in=([i], [i])) for i in range(1, 256, 2)]
    for handle in handles:
        handle.wait()
        assert handle.done() and handle.out_done() and handle.in_done()
    assert torch.equal(host_kv[::2], device_kv[::2])
    assert not host_kv[1::2].any()


def test_methods_report_the_path() -> None:
    device_kv = torch.zeros(4, 8)
    engine = TransferEngine(device_kv, torch.zeros(4, 8))
    handle = engine.submit(swap_out=([0], [1]))
    handle.wait()
    assert handle.methods == ("threads", "none")


def test_blocks_larger_than_a_work_piece_are_split_and_exact() -> None:
    # 3 MiB blocks: runs are cut into 256 KiB pieces spread over the threads.
    device_kv = torch.randn(6, 3, 256, 1024)
    host_kv = torch.zeros(6, 3, 256, 1024)
    engine = TransferEngine(device_kv, host_kv)
    engine.submit(swap_out=([0, 1, 2, 5], [3, 4, 5, 0])).wait()
    assert torch.equal(host_kv[3:6], device_kv[0:3]) and torch.equal(host_kv[0], device_kv[5])


def test_native_layer_checks_ids_itself() -> None:
    # The extension re-checks ranges so a bad id can never reach memcpy.
    from superinfer_kv.extension import load_cpu_extension

    native = load_cpu_extension().CpuTransfer(torch.zeros(4, 8), torch.zeros(2, 8), 1)
    with pytest.raises(IndexError, match="out of range"):
        native.copy(True, torch.tensor([0]), torch.tensor([2]))
    with pytest.raises(RuntimeError, match="int64"):
        native.copy(True, torch.tensor([0], dtype=torch.int32), torch.tensor([1]))
