"""The shard's ranks under tensor parallelism (`--num-shard N`): one process per rank, joined
with `torch.distributed` (NCCL between GPUs, gloo on the CPU) over a TCP rendezvous.

Rank 0 serves the router's gRPC and sends every RPC that touches the model to the other ranks
as a command (`rank_commands`), broadcast over a gloo group of its own: commands wait as long
as the server is idle, so that group has no deadline, while the model's collectives (the
default group) time out after `timeout_s`. Every rank then runs the same collectives in the
same order. A rank that dies closes its connections, and the others' next collective fails;
a failure inside a collective leaves the ranks out of step, which nothing repairs: `fail`
marks the group failed and ends the process with a non-zero status (`on_failure`)."""
import logging
import time
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist

from ..models.tensor_parallel import TensorParallelGroup
from .config import ParallelConfig

log = logging.getLogger(__name__)

# Commands wait for the next RPC, however long the server is idle.
_COMMAND_TIMEOUT = timedelta(days=365)


class RankGroup:
    """This process's membership: the model's collectives (`tensor_parallel`) and the command
    channel from rank 0."""

    def __init__(self, config: ParallelConfig, device: torch.device):
        self.config = config
        self.rank = config.rank
        self.world_size = config.world_size
        self.failure: str | None = None
        # Time rank 0 spent handing commands to the other ranks (the per-step cost of the
        # broadcast), for benchmarks.
        self.command_ns = 0
        self.on_failure: Callable[[str], None] = lambda reason: None
        backend = "nccl" if device.type == "cuda" else "gloo"
        log.info("rank %d of %d: joining the group at %s:%d (%s)", self.rank, self.world_size,
                 config.master_addr, config.master_port, backend)
        dist.init_process_group(backend, init_method=f"tcp://{config.master_addr}:{config.master_port}",
                                rank=self.rank, world_size=self.world_size,
                                timeout=timedelta(seconds=config.timeout_s),
                                device_id=device if device.type == "cuda" else None)
        self.tensor_parallel = TensorParallelGroup(dist.group.WORLD, self.rank, self.world_size)
        self._commands = dist.new_group(backend="gloo", timeout=_COMMAND_TIMEOUT)
        log.info("rank %d of %d: joined", self.rank, self.world_size)

    def send(self, command) -> None:
        """Rank 0: hands `command` to every other rank."""
        started = time.perf_counter_ns()
        dist.broadcast_object_list([command], src=0, group=self._commands)
        self.command_ns += time.perf_counter_ns() - started

    def receive(self):
        """Ranks > 0: the next command from rank 0 (waits as long as it takes)."""
        box = [None]
        dist.broadcast_object_list(box, src=0, group=self._commands)
        return box[0]

    def wait_for_all(self) -> None:
        """Returns once every rank got here (after loading: rank 0 serves only then)."""
        dist.barrier(group=self._commands)

    def all_true(self, flags: list[bool]) -> list[bool]:
        """Per position, whether the flag holds on every rank."""
        agreed = torch.tensor(flags, dtype=torch.uint8)
        dist.all_reduce(agreed, op=dist.ReduceOp.MIN, group=self._commands)
        return [bool(flag) for flag in agreed.tolist()]

    def minimum(self, values: list[float]) -> list[float]:
        """Per position, the smallest value over the ranks."""
        agreed = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(agreed, op=dist.ReduceOp.MIN, group=self._commands)
        return agreed.tolist()

    def fail(self, reason: str) -> None:
        """The ranks are out of step: recorded, logged, and the process told to end."""
        if self.failure is None:
            self.failure = reason
            log.error("rank %d of %d: the tensor-parallel group failed (%s); the shard stops", self.rank,
                      self.world_size, reason)
            self.on_failure(reason)

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
