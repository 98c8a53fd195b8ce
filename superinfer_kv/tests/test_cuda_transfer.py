"""CUDA backend on a real GPU: exactness per copy path, duplex, ordering against compute on the
caller's stream, completion flags. Skipped cleanly where no CUDA device is present."""

import pytest
import torch

from superinfer_kv import TransferConfig, TransferEngine

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

METHODS = ["auto", "kernel", "batch_memcpy", "memcpy_loop"]


def _pools(device_blocks: int, host_blocks: int, dtype: torch.dtype, block_shape=(2, 2, 16, 2, 64)):
    """Random device pool and zeroed pinned host pool; the default block is 16 KiB in fp32."""
    # [blocks, layers, K/V, block_size, kv_heads, head_dim]
    generator = torch.Generator(device="cuda").manual_seed(0)
    device_kv = torch.randn(device_blocks, *block_shape, device="cuda", generator=generator)
    host_kv = torch.zeros(host_blocks, *block_shape, dtype=dtype, pin_memory=True)
    return device_kv.to(dtype), host_kv


def _engine(device_kv, host_kv, method: str = "auto") -> TransferEngine:
    return TransferEngine(device_kv, host_kv, TransferConfig(cuda_method=method))


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.contiguous().view(torch.uint8).cpu()


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_round_trip_is_bit_exact(method: str, dtype: torch.dtype) -> None:
    device_kv, host_kv = _pools(96, 80, dtype)
    original = device_kv.clone()
    engine = _engine(device_kv, host_kv, method)
    assert engine.backend == "cuda"
    generator = torch.Generator().manual_seed(3)
    for _ in range(4):
        device_ids = torch.randperm(96, generator=generator)[:64]
        host_ids = torch.randperm(80, generator=generator)[:64]
        engine.submit(swap_out=(device_ids, host_ids)).wait()
        assert torch.equal(_bits(host_kv[host_ids]), _bits(original[device_ids.cuda()]))
        device_kv.zero_()
        back_ids = torch.randperm(96, generator=generator)[:64]
        handle = engine.submit(swap_in=(host_ids, back_ids))
        handle.wait()
        assert torch.equal(_bits(device_kv[back_ids.cuda()]), _bits(original[device_ids.cuda()]))
        device_kv.copy_(original)


def test_auto_picks_kernel_for_small_runs_and_copy_engines_for_large() -> None:
    # 4 KiB blocks: [1 layer, K/V, 16 tokens, 1 head, 64] bf16.
    device_kv, host_kv = _pools(128, 128, torch.bfloat16, block_shape=(1, 2, 16, 1, 64))
    engine = _engine(device_kv, host_kv)
    # Single scattered blocks go to the kernel; 32 neighbours merge into one 128 KiB run that
    # goes to the copy engines. The two submits touch disjoint blocks, as they run unordered.
    scattered = engine.submit(swap_out=(list(range(0, 64, 2)), list(range(1, 64, 2))))
    contiguous = engine.submit(swap_in=(list(range(64, 96)), list(range(64, 96))))
    scattered.wait()
    contiguous.wait()
    assert scattered.methods == ("kernel", "none")
    assert contiguous.methods[1] in ("batch_memcpy", "memcpy_loop")


def test_both_directions_at_once_on_disjoint_blocks() -> None:
    device_kv, host_kv = _pools(64, 64, torch.float32)
    host_kv.copy_(torch.randn_like(host_kv))
    device_before, host_before = device_kv.clone(), host_kv.clone()
    engine = _engine(device_kv, host_kv)
    handle = engine.submit(
        swap_out=(list(range(0, 32)), list(range(32, 64))),
        swap_in=(list(range(0, 32)), list(range(32, 64))),
    )
    handle.wait()
    assert torch.equal(host_kv[32:], device_before[:32].cpu())
    assert torch.equal(device_kv[32:], host_before[:32].cuda())
    assert torch.equal(device_kv[:32], device_before[:32])


def test_ten_thousand_blocks() -> None:
    device_kv, host_kv = _pools(12_000, 10_000, torch.float16, block_shape=(2, 2, 4, 1, 16))
    generator = torch.Generator().manual_seed(5)
    device_ids = torch.randperm(12_000, generator=generator)[:10_000]
    host_ids = torch.randperm(10_000, generator=generator)
    engine = _engine(device_kv, host_kv)
    engine.submit(swap_out=(device_ids, host_ids)).wait()
    assert torch.equal(host_kv[host_ids].cuda(), device_kv[device_ids.cuda()])
    expected = device_kv.clone()
    device_kv.zero_()
    engine.submit(swap_in=(host_ids, device_ids)).wait()
    moved = device_ids.cuda()
    assert torch.equal(device_kv[moved], expected[moved])


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("side_stream", [False, True])
def test_swap_out_sees_compute_issued_before_submit(method: str, side_stream: bool) -> None:
    device_kv, host_kv = _pools(16, 16, torch.float32)
    engine = _engine(device_kv, host_kv, method)
    stream = torch.cuda.Stream() if side_stream else torch.cuda.current_stream()
    with torch.cuda.stream(stream):
        # Delay the stream so an unordered copy would read the block before the write lands;
        # long (about half a second) so a loaded host cannot reach the check after it ends.
        torch.cuda._sleep(1_000_000_000)
        device_kv[5].fill_(7.25)  # the "kernel" that writes block 5
        handle = engine.submit(swap_out=([5], [9]))
        assert not handle.out_done()  # still queued behind the sleep, and did not block
    handle.wait()
    assert bool((host_kv[9] == 7.25).all())


@pytest.mark.parametrize("method", METHODS)
def test_compute_ordered_after_swap_in_sees_the_copy(method: str) -> None:
    device_kv, host_kv = _pools(512, 512, torch.float32)
    host_kv.fill_(3.0)
    device_kv.zero_()
    engine = _engine(device_kv, host_kv, method)
    handle = engine.submit(swap_in=(list(range(512)), list(range(511, -1, -1))))
    handle.order_compute_after_in()
    total = device_kv.sum()  # runs on the current stream, after the copy, without a host sync
    assert float(total) == 3.0 * device_kv.numel()
    assert handle.in_done() and handle.done()


def test_completion_flags_and_reuse_after_errors() -> None:
    device_kv, host_kv = _pools(32, 32, torch.float32)
    engine = _engine(device_kv, host_kv)
    with pytest.raises(ValueError, match="appears more than once"):
        engine.submit(swap_out=([1, 1], [2, 3]))
    with pytest.raises(ValueError, match="out of range"):
        engine.submit(swap_in=([40], [0]))
    torch.cuda._sleep(1_000_000_000)  # about half a second: the copies queue behind it
    handle = engine.submit(swap_out=([0, 1], [2, 3]), swap_in=([4], [5]))
    assert not handle.done()
    handle.wait()
    assert handle.out_done() and handle.in_done() and handle.done()
    assert torch.equal(host_kv[2:4], device_kv[0:2].cpu())


def test_unpinned_host_pool_is_rejected() -> None:
    device_kv = torch.zeros(4, 8, device="cuda")
    with pytest.raises(ValueError, match="pinned"):
        TransferEngine(device_kv, torch.zeros(4, 8))


def test_empty_host_pool_is_accepted_and_never_addressed() -> None:
    # A shard without a host pool: nothing is pinned, nothing can be swapped, nothing fails.
    device_kv = torch.zeros(4, 8, device="cuda")
    engine = TransferEngine(device_kv, torch.zeros(0, 8, pin_memory=True))
    with pytest.raises(ValueError, match="out of range"):
        engine.submit(swap_out=([0], [0]))
    engine.submit().wait()


@pytest.mark.parametrize("launch_bytes", [1, 3 * 16384 + 100, 1 << 30])
def test_kernel_split_into_launches_is_bit_exact(launch_bytes: int) -> None:
    device_kv, host_kv = _pools(64, 64, torch.bfloat16)
    engine = TransferEngine(
        device_kv, host_kv, TransferConfig(cuda_method="kernel", kernel_launch_bytes=launch_bytes)
    )
    order = torch.randperm(64, generator=torch.Generator().manual_seed(5))
    engine.submit(swap_out=(order[:40], order[24:])).wait()
    assert torch.equal(_bits(host_kv[order[24:]]), _bits(device_kv[order[:40]]))
