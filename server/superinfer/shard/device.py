"""Which device the shard serves on (`--device`): a GPU that was asked for and is missing is an
error at start-up, never a quiet fall-back to the CPU.

A GPU counts as asked for when `--device` names one (`cuda`, `cuda:N`), or, under `auto`, when
the environment assigns GPUs to the process: `NVIDIA_VISIBLE_DEVICES` (set by the NVIDIA
container runtime for `docker run --gpus ...` and by Kubernetes' device plugin) or
`CUDA_VISIBLE_DEVICES` naming devices. `auto` with neither serves on a GPU when one is visible
and otherwise on the CPU, saying so in a warning.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

import torch

log = logging.getLogger(__name__)

# Values that assign no device: NVIDIA's runtime reads "void" and "none" so; "-1" and "" hide
# every GPU from CUDA.
_NO_DEVICES = {"", "void", "none", "-1"}
_GPU_VARIABLES = ("NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")


class DeviceError(ValueError):
    """The requested device does not exist here, or cannot be used by this torch build."""


def gpus_assigned(environ: Mapping[str, str]) -> tuple[str, str] | None:
    """The first variable (and its value) that assigns GPUs to this process, if any."""
    for name in _GPU_VARIABLES:
        value = environ.get(name)
        if value is not None and value.strip().lower() not in _NO_DEVICES:
            return name, value
    return None


def _why_no_gpu() -> str:
    if torch.version.cuda is None:
        return f"this torch build ({torch.__version__}) has no CUDA support"
    return (
        "torch sees no CUDA device (no NVIDIA driver, or none passed to this process; "
        "a container needs `--gpus all`)"
    )


def resolve_device(
    requested: str,
    environ: Mapping[str, str],
    device_count: Callable[[], int] = torch.cuda.device_count,
) -> torch.device:
    """The device `--device requested` means here; raises DeviceError when it is missing."""
    if requested == "auto":
        count = device_count()
        if count > 0:
            return torch.device("cuda", 0)
        if (assigned := gpus_assigned(environ)) is not None:
            name, value = assigned
            raise DeviceError(
                f"{name}={value} assigns GPUs to this process, but {_why_no_gpu()}; "
                "pass --device cpu to serve on the CPU"
            )
        log.warning("no GPU is visible: serving on the CPU (--device cuda makes a missing GPU an error)")
        return torch.device("cpu")
    try:
        device = torch.device(requested)
    except RuntimeError as err:
        raise DeviceError(f'--device {requested!r}: {err} (expected "auto", "cpu", "cuda" or "cuda:N")') from None
    if device.type == "cpu":
        return device
    if device.type != "cuda":
        raise DeviceError(f'--device {requested!r}: only "auto", "cpu", "cuda" and "cuda:N" are served')
    count = device_count()
    if count == 0:
        raise DeviceError(f"--device {requested}: {_why_no_gpu()}")
    index = 0 if device.index is None else device.index
    if index >= count:
        raise DeviceError(f"--device {requested}: only {count} CUDA device(s) are visible (cuda:0..cuda:{count - 1})")
    return torch.device("cuda", index)
