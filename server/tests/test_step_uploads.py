"""A step's host-to-device copies. Every input reaches the device through `staging.upload`
(pinned and non-blocking on a GPU); none is a tensor made on the device from a Python list
(`torch.tensor(values, device=...)`) or a host tensor moved with `.to(device)` — each a copy from
pageable memory that blocks the host until the device has run everything queued before it,
which would make launching step N+1 wait for step N's forward.

Counted on the CPU, where the same code runs with the CPU as the device: every call the counter
sees is one a GPU would turn into a copy."""
import sys

import pytest
import torch
from conftest import make_executor
from torch.overrides import TorchFunctionMode

from superinfer.pb import shard_pb2 as pb
from superinfer.shard import staging

PROMPTS = {1: [5, 6, 7, 8, 9, 10, 11], 2: list(range(20, 43)), 3: [3, 4]}
BLOCKS = {1: [0, 1], 2: [2, 3, 4], 3: [5, 6]}
_MAKERS = (torch.tensor, torch.as_tensor, torch.asarray)


def _names_a_device(args, kwargs) -> bool:
    return kwargs.get("device") is not None or any(isinstance(a, (torch.device, str)) for a in args[1:])


class CopyCounter(TorchFunctionMode):
    """Counts, while active, the host-to-device copies that bypass `staging.upload` (`direct`:
    a tensor made from host values on a device, or moved to a device with `.to`/`.cuda`) and
    the uploads that go through it (`staged`)."""

    def __init__(self, monkeypatch):
        super().__init__()
        self.direct: list[str] = []
        self.staged = 0
        self._inside_upload = False
        original = staging.upload

        def counted(host, device):
            self.staged += 1
            self._inside_upload = True
            try:
                return original(host, device)
            finally:
                self._inside_upload = False

        # Every module that imported the function by name.
        for module in list(sys.modules.values()):
            if getattr(module, "__name__", "").startswith("superinfer") and getattr(module, "upload", None) is original:
                monkeypatch.setattr(module, "upload", counted)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not self._inside_upload:
            if func in _MAKERS and kwargs.get("device") is not None:
                self.direct.append(f"{func.__name__}(..., device=...)")
            elif func in (torch.Tensor.to, torch.Tensor.cuda) and (func is torch.Tensor.cuda or _names_a_device(args, kwargs)):
                self.direct.append(f"Tensor.{func.__name__}(device)")
        return func(*args, **kwargs)


def _prefill() -> pb.StepRequest:
    return pb.StepRequest(step_id=1, new_requests=[pb.NewRequest(id=r, prompt_token_ids=p) for r, p in PROMPTS.items()],
                          scheduled=[pb.ScheduledRequest(id=r, num_computed_tokens=0, num_new_tokens=len(p),
                                                         block_table=BLOCKS[r], sample=True)
                                     for r, p in PROMPTS.items()])


def _decode(step_id: int) -> pb.StepRequest:
    return pb.StepRequest(step_id=step_id, scheduled=[
        pb.ScheduledRequest(id=r, num_computed_tokens=len(p) + step_id - 2, num_new_tokens=1, block_table=BLOCKS[r],
                            sample=True)
        for r, p in PROMPTS.items()])


def test_the_counter_sees_a_direct_copy(monkeypatch):
    # The check below can fail: each kind of direct copy is counted, a staged one is not.
    with CopyCounter(monkeypatch) as counter:
        torch.tensor([1, 2, 3], device="cpu")
        torch.zeros(3).to("cpu", non_blocking=True)
        torch.zeros(3).to(device=torch.device("cpu"))
        torch.zeros(3).to(torch.int32)  # a dtype, no device: not a copy between memories
        staging.upload(torch.zeros(3), torch.device("cpu"))
    assert len(counter.direct) == 3 and counter.staged == 1


@pytest.mark.parametrize("kind", ["decode", "mixed"])
def test_a_step_copies_nothing_to_the_device_but_through_staging(tiny_llama_dir, monkeypatch, kind):
    executor = make_executor(tiny_llama_dir)
    executor.step(_prefill())
    executor.step(_decode(2))
    if kind == "decode":
        request = _decode(3)
    else:  # a new prompt's prefill beside the decodes
        request = _decode(3)
        request.new_requests.append(pb.NewRequest(id=4, prompt_token_ids=list(range(50, 70))))
        request.scheduled.append(pb.ScheduledRequest(id=4, num_computed_tokens=0, num_new_tokens=20,
                                                     block_table=[7, 8], sample=True))
    with CopyCounter(monkeypatch) as counter:
        reply = executor.step(request)
    assert all(not output.error for output in reply.outputs)
    assert counter.direct == []
    # positions, slots and their offsets, the gather rows and the token ids at least.
    assert counter.staged >= 5


def test_upload_on_the_cpu_is_the_host_tensor():
    host = torch.arange(4)
    assert staging.upload(host, torch.device("cpu")) is host
