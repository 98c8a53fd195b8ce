"""Ranks > 0 of a tensor-parallel shard: no gRPC, only the commands rank 0 sends, each run on
this rank's slice of the model and of the KV blocks. A command that fails here leaves the ranks
out of step: the rank stops with status 1, its peers' collectives fail, and the launcher ends
the server as it does when a shard dies."""
import logging

from .executor import ShardExecutor
from .rank_commands import (AdapterReadCommand, DropAdapterReadCommand, HealthCommand, LoadAdapterCommand,
                            ReadAdapterCommand, ResetCommand, StepCommand, StopCommand, UnloadAdapterCommand,
                            WarmupCommand)
from .rank_group import RankGroup
from .rank_step import run_rank_step

log = logging.getLogger(__name__)


def follow(executor: ShardExecutor, group: RankGroup) -> int:
    """Runs rank 0's commands until it says stop (0) or something fails (1)."""
    try:
        while True:
            command = group.receive()
            match command:
                case StepCommand(work):  # the step function rank 0 runs too: the same collectives
                    run_rank_step(executor.runner, executor.tracker, work)
                case WarmupCommand(max_tokens, max_requests):
                    executor.warm_up(max_tokens, max_requests)
                case HealthCommand():
                    executor.check_device()
                case ResetCommand():
                    executor.tracker.drain()
                case ReadAdapterCommand(adapter_id, source, slot, directory):
                    executor.read_rank_adapter(adapter_id, source, slot, directory)
                case AdapterReadCommand(slot):
                    group.minimum([executor.rank_read_state(slot)])
                case DropAdapterReadCommand(slot):
                    executor.drop_rank_read(slot)
                case LoadAdapterCommand(adapter_id, slot):
                    executor.load_rank_adapter(adapter_id, slot)
                case UnloadAdapterCommand(slot):
                    executor.unload_rank_adapter(slot)
                case StopCommand():
                    log.info("rank %d: rank 0 stopped", group.rank)
                    return 0
                case _:
                    raise RuntimeError(f"unknown command from rank 0: {command!r}")
    except Exception as err:  # the ranks are out of step: this rank ends, and says why
        log.exception("rank %d failed", group.rank)
        group.fail(f"{type(err).__name__}: {err}")
        return 1
