"""What rank 0 tells the other ranks under tensor parallelism: one command per RPC that touches
the model, carrying only what every rank computes the same way. Rank 0 alone keeps the
request table (prompts, sampling state), validates plans and samples; a step reaches the
other ranks as its transfers and its chunks, already resolved to token ids."""
from dataclasses import dataclass

from .batch import Chunk


@dataclass(frozen=True)
class TransferOrder:
    """One router transfer (its id, and (src -> dst) block pairs), as `TransferTracker` takes it."""

    id: int
    src_blocks: list[int]
    dst_blocks: list[int]

    @classmethod
    def of(cls, transfer) -> "TransferOrder":
        return cls(transfer.id, list(transfer.src_blocks), list(transfer.dst_blocks))


@dataclass(frozen=True)
class RankWork:
    """One step's share of every rank: the same transfers on each rank's own KV slice, then one
    forward pass over the chunks."""

    rotate_out: list[TransferOrder]
    rotate_in: list[TransferOrder]
    chunks: list[Chunk]
    # Per chunk, the positions within it (0 = its first token) whose logits are needed, in
    # the order the logits' rows come out.
    logit_offsets: list[list[int]]


@dataclass(frozen=True)
class WarmupCommand:
    max_tokens: int
    max_requests: int


@dataclass(frozen=True)
class StepCommand:
    work: RankWork


@dataclass(frozen=True)
class HealthCommand:
    pass


@dataclass(frozen=True)
class ResetCommand:
    pass


@dataclass(frozen=True)
class StopCommand:
    pass


@dataclass(frozen=True)
class ReadAdapterCommand:
    """Start reading this rank's slices of the LoRA adapter rank 0 read and checked, for `slot`,
    on a thread beside the steps — from `directory` (where rank 0 found `source`) when this rank
    sees that directory, else from `source` (a hub id on another node) — so that the model
    thread does not wait for the disk. `AdapterReadCommand` asks how it went, and
    `LoadAdapterCommand` installs what was read."""

    adapter_id: str
    source: str
    slot: int
    directory: str = ""


@dataclass(frozen=True)
class AdapterReadCommand:
    """Every rank says how its read for `slot` went, as the smallest over the ranks
    (`RankGroup.minimum`): 1 read, 0 still reading, -1 failed (or never asked)."""

    slot: int


@dataclass(frozen=True)
class DropAdapterReadCommand:
    """Forget what was read for `slot`: the load will not happen (a rank could not read it)."""

    slot: int


@dataclass(frozen=True)
class LoadAdapterCommand:
    """Install in `slot`, between steps, what `ReadAdapterCommand` read for it (every rank read
    it: `AdapterReadCommand` said so)."""

    adapter_id: str
    slot: int


@dataclass(frozen=True)
class UnloadAdapterCommand:
    slot: int
