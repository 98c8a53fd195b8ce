"""Where "auto" switches from the kernel to the copy engines: the rule on synthetic timings
(everywhere), and the measurement itself on a GPU."""

import pytest
import torch

from superinfer_kv.calibrate import KERNEL_ALWAYS, RUN_SIZES, threshold_from_speeds

KIB = 1024


def _speeds(kernel_wins_below: int) -> dict:
    return {
        size: {"kernel": 1.0, "dma": 2.0 if size < kernel_wins_below else 0.5} for size in RUN_SIZES
    }


def test_threshold_is_the_smallest_size_from_which_dma_always_wins() -> None:
    assert threshold_from_speeds(_speeds(128 * KIB)) == 128 * KIB
    assert threshold_from_speeds(_speeds(0)) == RUN_SIZES[0]
    assert threshold_from_speeds(_speeds(10**9)) == KERNEL_ALWAYS


def test_a_noisy_win_below_a_loss_does_not_count() -> None:
    speeds = _speeds(256 * KIB)
    speeds[32 * KIB]["dma"] = 0.5  # DMA wins at 32 KiB, loses at 64 and 128 KiB
    assert threshold_from_speeds(speeds) == 256 * KIB


def test_the_kernel_must_win_clearly() -> None:
    # The copy engines leave the SMs to the model: a tie or a small kernel win goes to them.
    speeds = {size: {"kernel": 1.0, "dma": 1.0} for size in RUN_SIZES}
    assert threshold_from_speeds(speeds) == RUN_SIZES[0]
    # Measured on an H200 (GB/s, duplex): kernel 24/33/39, copy engines 5.6/28/41 at 16/32/64 KiB.
    speeds = {size: {"kernel": 1.0, "dma": 1.0} for size in RUN_SIZES}
    speeds[16 * KIB] = {"kernel": 1 / 24.1, "dma": 1 / 5.59}
    speeds[32 * KIB] = {"kernel": 1 / 33.0, "dma": 1 / 28.0}
    speeds[64 * KIB] = {"kernel": 1 / 39.0, "dma": 1 / 40.8}
    assert threshold_from_speeds(speeds) == 64 * KIB
    speeds[32 * KIB] = {"kernel": 1 / 33.0, "dma": 1 / 31.0}  # a 6% kernel win is not enough
    assert threshold_from_speeds(speeds) == 32 * KIB


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_engine_measures_its_threshold_once() -> None:
    from superinfer_kv import TransferConfig, TransferEngine

    device_kv = torch.zeros(8, 4096, device="cuda")
    host_kv = torch.zeros(8, 4096, pin_memory=True)
    first = TransferEngine(device_kv, host_kv)
    assert first.dma_min_run_bytes in (*RUN_SIZES, KERNEL_ALWAYS)
    assert TransferEngine(device_kv, host_kv).dma_min_run_bytes == first.dma_min_run_bytes
    forced = TransferEngine(device_kv, host_kv, TransferConfig(dma_min_run_bytes=1234))
    assert forced.dma_min_run_bytes == 1234
