"""Host-to-device copies of a step's inputs. Every one goes through `upload`: on a GPU the host
tensor is staged in pinned memory and copied on the current stream without blocking, so
building step N+1's inputs never waits for step N's compute (a copy from pageable memory, such
as `torch.tensor(values, device=...)`, blocks the host until the stream has run everything
queued before it). PyTorch's pinned allocator keeps a staged buffer until its copy has run, so
a buffer is never rewritten under a copy in flight.

On the CPU the host tensor is the device tensor: nothing is copied."""
import torch


def upload(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`host` (a CPU tensor) on `device`, copied without blocking the host."""
    if device.type == "cpu":
        return host
    staged = host if host.is_pinned() else host.pin_memory()
    return staged.to(device, non_blocking=True)
