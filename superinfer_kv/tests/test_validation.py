"""Entry checks of TransferEngine: bad pools and bad plans raise ValueError, change nothing."""

import pytest
import torch

from superinfer_kv import TransferEngine


def _pools(device_blocks: int = 8, host_blocks: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    # [blocks, layers=2, K/V=2, block_size=4, kv_heads=1, head_dim=8]
    return torch.randn(device_blocks, 2, 2, 4, 1, 8), torch.zeros(host_blocks, 2, 2, 4, 1, 8)


def test_pool_checks() -> None:
    device_kv, host_kv = _pools()
    with pytest.raises(ValueError, match="block geometry"):
        TransferEngine(device_kv, torch.zeros(6, 2, 2, 4, 1, 4))
    with pytest.raises(ValueError, match="dtype"):
        TransferEngine(device_kv, host_kv.to(torch.float64))
    with pytest.raises(ValueError, match="contiguous"):
        TransferEngine(device_kv.transpose(1, 2), host_kv.transpose(1, 2))
    with pytest.raises(ValueError, match="leading block dimension"):
        TransferEngine(torch.tensor(1.0), torch.tensor(1.0))
    with pytest.raises(TypeError):
        TransferEngine(device_kv.numpy(), host_kv)
    assert TransferEngine(device_kv, host_kv).backend in ("cpu", "cuda")


@pytest.mark.parametrize(
    ("swap_out", "swap_in", "message"),
    [
        (([0, 1], [2]), None, "2 source ids but 1 destination"),
        (([0, 8], [0, 1]), None, "block id 8 is out of range \\[0, 8\\)"),
        (([0, 1], [0, 6]), None, "block id 6 is out of range \\[0, 6\\)"),
        (None, ([-1], [0]), "block id -1 is out of range"),
        (([3, 3], [0, 1]), None, "swap_out source ids: block id 3 appears more than once"),
        (None, ([0, 1], [5, 5]), "swap_in destination ids: block id 5 appears more than once"),
        (([2], [0]), ([1], [2]), "device block 2 is both read by swap_out and written"),
        (([2], [4]), ([4], [3]), "host block 4 is both written by swap_out and read"),
        (([0.0], [1]), None, "integer block ids"),
        ((torch.tensor([[0]]), [1]), None, "must be 1-D"),
        (([0], [1], [2]), None, "must be a pair"),
    ],
)
def test_bad_plans_are_rejected(swap_out, swap_in, message) -> None:
    device_kv, host_kv = _pools()
    before = (device_kv.clone(), host_kv.clone())
    engine = TransferEngine(device_kv, host_kv)
    with pytest.raises(ValueError, match=message):
        engine.submit(swap_out=swap_out, swap_in=swap_in)
    assert torch.equal(device_kv, before[0]) and torch.equal(host_kv, before[1])


def test_engine_stays_usable_after_errors() -> None:
    device_kv, host_kv = _pools()
    engine = TransferEngine(device_kv, host_kv)
    for _ in range(3):
        with pytest.raises(ValueError):
            engine.submit(swap_out=([0, 0], [1, 2]))
    handle = engine.submit(swap_out=([4, 7], [5, 0]))
    handle.wait()
    assert torch.equal(host_kv[5], device_kv[4]) and torch.equal(host_kv[0], device_kv[7])


def test_empty_and_none_directions() -> None:
    device_kv, host_kv = _pools()
    engine = TransferEngine(device_kv, host_kv)
    for handle in (
        engine.submit(),
        engine.submit(swap_out=([], []), swap_in=None),
        engine.submit(swap_out=(torch.empty(0, dtype=torch.int64), []), swap_in=([], [])),
    ):
        handle.wait()
        assert handle.done() and handle.out_done() and handle.in_done()
    assert not host_kv.any()


def test_closed_engine_refuses_work() -> None:
    device_kv, host_kv = _pools()
    with TransferEngine(device_kv, host_kv) as engine:
        engine.submit(swap_out=([1], [1])).wait()
    engine.close()
    with pytest.raises(RuntimeError, match="closed"):
        engine.submit(swap_out=([2], [2]))


def test_config_is_checked() -> None:
    from superinfer_kv import TransferConfig

    with pytest.raises(ValueError, match="cuda_method"):
        TransferConfig(cuda_method="fast")
    with pytest.raises(ValueError, match="kernel_ctas"):
        TransferConfig(kernel_ctas=0)
    with pytest.raises(ValueError, match="cpu_threads"):
        TransferConfig(cpu_threads=-1)
