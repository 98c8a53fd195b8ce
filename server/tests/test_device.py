"""`--device`: a GPU that was asked for and is missing stops the start-up with a reason; `auto`
without one serves on the CPU and says so."""
import logging
import subprocess
import sys

import pytest
import torch

from superinfer.shard.device import DeviceError, gpus_assigned, resolve_device


def no_gpu() -> int:
    return 0


def two_gpus() -> int:
    return 2


def test_auto_takes_the_first_gpu_when_one_is_visible():
    assert resolve_device("auto", {}, two_gpus) == torch.device("cuda", 0)


def test_auto_without_a_gpu_serves_on_the_cpu_aloud(caplog):
    with caplog.at_level(logging.WARNING, logger="superinfer.shard.device"):
        assert resolve_device("auto", {"CUDA_VISIBLE_DEVICES": ""}, no_gpu) == torch.device("cpu")
    assert "no GPU is visible: serving on the CPU" in caplog.text


@pytest.mark.parametrize(
    ("variable", "value"),
    [("NVIDIA_VISIBLE_DEVICES", "all"), ("NVIDIA_VISIBLE_DEVICES", "0,1"), ("CUDA_VISIBLE_DEVICES", "0"),
     ("CUDA_VISIBLE_DEVICES", "GPU-8a3f")],
)
def test_auto_refuses_gpus_the_environment_assigns_but_torch_cannot_see(variable, value):
    with pytest.raises(DeviceError, match=rf"{variable}={value} assigns GPUs to this process.*--device cpu"):
        resolve_device("auto", {variable: value}, no_gpu)


@pytest.mark.parametrize("value", ["", "void", "none", "NONE", "-1"])
def test_variables_that_assign_no_gpu_are_not_a_request(value):
    assert gpus_assigned({"NVIDIA_VISIBLE_DEVICES": value, "CUDA_VISIBLE_DEVICES": value}) is None
    assert resolve_device("auto", {"NVIDIA_VISIBLE_DEVICES": value}, no_gpu) == torch.device("cpu")


def test_a_named_gpu_must_exist():
    with pytest.raises(DeviceError, match="--device cuda: .*(no CUDA device|no CUDA support)"):
        resolve_device("cuda", {}, no_gpu)
    with pytest.raises(DeviceError, match=r"only 2 CUDA device\(s\) are visible \(cuda:0..cuda:1\)"):
        resolve_device("cuda:2", {}, two_gpus)
    assert resolve_device("cuda:1", {}, two_gpus) == torch.device("cuda", 1)
    assert resolve_device("cuda", {}, two_gpus) == torch.device("cuda", 0)


def test_the_cpu_and_unknown_devices():
    assert resolve_device("cpu", {"NVIDIA_VISIBLE_DEVICES": "all"}, no_gpu) == torch.device("cpu")
    with pytest.raises(DeviceError, match="only \"auto\", \"cpu\", \"cuda\" and \"cuda:N\""):
        resolve_device("meta", {}, no_gpu)
    with pytest.raises(DeviceError, match="--device 'gpu'"):
        resolve_device("gpu", {}, no_gpu)


@pytest.mark.skipif(torch.cuda.device_count() > 0, reason="needs a machine without a GPU")
def test_launching_on_a_missing_gpu_exits_with_the_reason(tmp_path):
    # Through the real launcher and shard: the shard refuses before loading anything, the
    # launcher exits non-zero at once instead of serving on the CPU.
    launched = subprocess.run(
        [sys.executable, "-m", "superinfer.cli", "launch", "--device", "cuda", "--port", "18471"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )
    assert launched.returncode == 1
    assert "cannot serve on the requested device: --device cuda:" in launched.stderr
    assert "shard exited with status 1 during start-up" in launched.stderr
