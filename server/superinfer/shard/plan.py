"""Validation of a whole Step plan before anything changes: a plan either passes every check
here or is rejected (PlanError → INVALID_ARGUMENT) with the shard's state untouched.

Device-block rules for one step: a block a scheduled request *writes* (the blocks its new
tokens land in) has one writer, and no transfer may touch it. Other requests of the same step
may read it, at the same place in their block tables (the same positions): every layer writes
the whole step's K/V before any attention reads the cache, so they read what this step wrote —
how n choices of one prompt, admitted together, share its computation (prefix caching). Full
blocks that are only read may be shared freely. A transfer in's destination may not be read or
written by compute in the same step."""
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..pb import shard_pb2
from .errors import PlanError
from .requests import RequestState, SamplingParams


@dataclass(frozen=True)
class PlanLimits:
    num_device_blocks: int
    num_host_blocks: int
    block_size: int
    vocab_size: int
    max_position_embeddings: int
    max_top_n_tokens: int = 64
    # The LoRA adapters loaded, slot -> id (the executor's own table, which LoadAdapter and
    # UnloadAdapter change between steps); a request names one or none.
    adapters: Mapping[int, str] = field(default_factory=dict, hash=False)


@dataclass(frozen=True)
class InFlight:
    """Blocks held by transfers submitted in earlier steps and not yet acknowledged."""

    transfer_ids: frozenset[int]
    host_written: frozenset[int]  # rotate-out destinations
    host_read: frozenset[int]  # rotate-in sources
    device_written: frozenset[int]  # rotate-in destinations
    device_read: frozenset[int]  # rotate-out sources


def read_sampling_params(message: shard_pb2.SamplingParameters) -> SamplingParams:
    """The message's parameters as sampling reads them (unchecked: `sampling_params` checks)."""
    return SamplingParams(
        do_sample=message.do_sample,
        temperature=message.temperature if message.do_sample else 1.0,
        top_k=message.top_k,
        top_p=message.top_p if message.do_sample and message.top_p else 1.0,
        typical_p=message.typical_p if message.do_sample and message.typical_p else 1.0,
        repetition_penalty=message.repetition_penalty or 1.0,
        frequency_penalty=message.frequency_penalty,
        presence_penalty=message.presence_penalty,
        seed=message.seed,
        top_n_tokens=message.top_n_tokens,
        logit_bias=dict(message.logit_bias),
        min_tokens=message.min_tokens,
        end_token_ids=tuple(message.end_token_ids) if message.min_tokens else (),
        min_p=message.min_p if message.do_sample else 0.0,
        allowed_token_ids=tuple(message.allowed_token_ids),
        bad_words=tuple(tuple(word.ids) for word in message.bad_words),
    )


def sampling_params(message: shard_pb2.SamplingParameters, request_id: int, limits: PlanLimits) -> SamplingParams:
    params = read_sampling_params(message)
    problems = []
    if params.do_sample and not params.temperature > 0:
        problems.append(f"temperature must be > 0 when sampling, got {params.temperature}")
    if not 0 < params.top_p <= 1:
        problems.append(f"top_p must be in (0, 1], got {params.top_p}")
    if not 0 < params.typical_p <= 1:
        problems.append(f"typical_p must be in (0, 1], got {params.typical_p}")
    if not (math.isfinite(params.frequency_penalty) and math.isfinite(params.presence_penalty)):
        problems.append("frequency_penalty and presence_penalty must be finite")
    if not 0 <= params.min_p <= 1:
        problems.append(f"min_p must be in [0, 1], got {params.min_p}")
    if not params.repetition_penalty > 0:
        problems.append(f"repetition_penalty must be > 0, got {params.repetition_penalty}")
    if any(token >= limits.vocab_size for token in params.logit_bias):
        problems.append(f"logit_bias names a token id outside the vocabulary ({limits.vocab_size})")
    if any(token >= limits.vocab_size for token in params.end_token_ids):
        problems.append(f"end_token_ids names a token id outside the vocabulary ({limits.vocab_size})")
    if any(token >= limits.vocab_size for token in params.allowed_token_ids):
        problems.append(f"allowed_token_ids names a token id outside the vocabulary ({limits.vocab_size})")
    if any(not word or max(word) >= limits.vocab_size for word in params.bad_words):
        problems.append(f"bad_words holds an empty sequence or a token id outside the vocabulary ({limits.vocab_size})")
    if not all(math.isfinite(bias) for bias in params.logit_bias.values()):
        problems.append("logit_bias must be finite")
    if params.top_n_tokens > limits.max_top_n_tokens:
        problems.append(f"top_n_tokens must be <= {limits.max_top_n_tokens}, got {params.top_n_tokens}")
    if problems:
        raise PlanError(f"request {request_id}: " + "; ".join(problems))
    return params


def _new_requests(step, known: dict[int, RequestState], limits: PlanLimits) -> list[RequestState]:
    forgotten = set(step.forget)
    created: dict[int, RequestState] = {}
    for new in step.new_requests:
        if new.id in created or (new.id in known and new.id not in forgotten):
            raise PlanError(f"request {new.id} is registered twice (duplicate id)")
        prompt = list(new.prompt_token_ids)
        if not prompt:
            raise PlanError(f"request {new.id} has an empty prompt")
        if len(prompt) > limits.max_position_embeddings:
            raise PlanError(
                f"request {new.id}: prompt of {len(prompt)} tokens is longer than the model's context "
                f"of {limits.max_position_embeddings}"
            )
        if max(prompt) >= limits.vocab_size:
            raise PlanError(f"request {new.id}: token id {max(prompt)} is outside the vocabulary ({limits.vocab_size})")
        params = sampling_params(new.parameters, new.id, limits)
        prompt_top_n = new.prompt_top_n if new.HasField("prompt_top_n") else params.top_n_tokens
        if prompt_top_n > limits.max_top_n_tokens:
            raise PlanError(f"request {new.id}: prompt_top_n must be <= {limits.max_top_n_tokens}, got {prompt_top_n}")
        created[new.id] = RequestState(new.id, prompt, len(prompt), params, new.prompt_logprobs,
                                       prompt_top_n=prompt_top_n, adapter=_adapter_slot(new, limits))
    return list(created.values())


def _adapter_slot(new, limits: PlanLimits) -> int:
    """The slot of the LoRA adapter `new` (a NewRequest) names; 0 for none (the base model).
    With `adapter_slot` that slot must hold `adapter_id`; without, the id is looked up (its
    newest slot)."""
    if new.adapter_slot:
        held = limits.adapters.get(new.adapter_slot)
        if held is None or held != new.adapter_id:
            holds = "no adapter" if held is None else f"LoRA adapter {held!r}"
            raise PlanError(f"request {new.id}: LoRA adapter slot {new.adapter_slot} holds {holds}, not "
                            f"{new.adapter_id!r} (loaded: {_loaded(limits)})")
        return new.adapter_slot
    if not new.adapter_id:
        return 0
    # The newest slot holding the id (one replaced in place is in two slots for a while).
    for slot, adapter in sorted(limits.adapters.items(), reverse=True):
        if adapter == new.adapter_id:
            return slot
    loaded = ", ".join(repr(adapter) for _, adapter in sorted(limits.adapters.items())) or "none"
    raise PlanError(f"request {new.id}: unknown LoRA adapter {new.adapter_id!r} (loaded: {loaded})")


def _loaded(limits: PlanLimits) -> str:
    return ", ".join(f"{adapter!r} in slot {slot}" for slot, adapter in sorted(limits.adapters.items())) or "none"


def _check_ids(blocks, limit: int, what: str, transfer_id: int) -> None:
    bad = [b for b in blocks if b >= limit]
    if bad:
        raise PlanError(f"transfer {transfer_id}: {what} block {bad[0]} out of range (pool has {limit})")


def after_compute(transfer, step_blocks: set[int]) -> bool:
    """Whether a copy out runs after the step's compute: its request computes in this step, in
    the blocks it copies (the request leaves with its token). Every other copy out runs beside
    the compute."""
    return not step_blocks.isdisjoint(transfer.src_blocks)


def _transfers(step, limits: PlanLimits, in_flight: InFlight) -> tuple[set[int], set[int]]:
    """Checks rotate_out / rotate_in; returns (device blocks rotated out beside the compute,
    device blocks rotated in). A copy out after the compute may read what this step's copies in
    write: the copy in, the compute and the copy out run in that order."""
    ids: set[int] = set()
    host_written, host_read = set(in_flight.host_written), set(in_flight.host_read)
    device_in, device_out = set(in_flight.device_written), set()
    device_read_in_flight = in_flight.device_read
    step_blocks = {b for item in step.scheduled for b in item.block_table}
    step_in = {b for t in step.rotate_in for b in t.dst_blocks}
    # Checked in the order they run: copies out beside the compute and copies in, then the
    # copies out after it (which may read what the copies in wrote).
    beside = [t for t in step.rotate_out if not after_compute(t, step_blocks)]
    after = [t for t in step.rotate_out if after_compute(t, step_blocks)]
    for direction, transfers in (("rotate_out", beside), ("rotate_in", step.rotate_in), ("rotate_out", after)):
        for transfer in transfers:
            if transfer.id in ids or transfer.id in in_flight.transfer_ids:
                raise PlanError(f"transfer id {transfer.id} is used twice")
            ids.add(transfer.id)
            if len(transfer.src_blocks) != len(transfer.dst_blocks):
                raise PlanError(f"transfer {transfer.id}: {len(transfer.src_blocks)} sources but {len(transfer.dst_blocks)} destinations")
            out = direction == "rotate_out"
            device_blocks, host_blocks = (transfer.src_blocks, transfer.dst_blocks) if out else (transfer.dst_blocks, transfer.src_blocks)
            _check_ids(device_blocks, limits.num_device_blocks, "device", transfer.id)
            _check_ids(host_blocks, limits.num_host_blocks, "host", transfer.id)
            for block in host_blocks:
                if block in host_written or (out and block in host_read):
                    raise PlanError(f"transfer {transfer.id}: host block {block} is already being written by a transfer")
                (host_written if out else host_read).add(block)
            late = out and after_compute(transfer, step_blocks)
            for block in device_blocks:
                written = block in device_in and not (late and block in step_in and block not in in_flight.device_written)
                if written or (not out and (block in device_out or block in device_read_in_flight)):
                    raise PlanError(f"transfer {transfer.id}: device block {block} is already being written by a transfer")
                if not late:
                    (device_out if out else device_in).add(block)
    return device_out, device_in


@dataclass(frozen=True)
class ScheduledWork:
    request_id: int
    start: int
    num_new: int
    block_table: list[int]
    # Sample the next token after this chunk (the router's decision, checked here).
    sample: bool
    # The grammar's allowed next tokens, packed (`token_mask`); b"" when unconstrained.
    allowed_tokens: bytes = b""


@dataclass(frozen=True)
class ValidatedPlan:
    forget: list[int]
    new_requests: list[RequestState]
    scheduled: list[ScheduledWork]
    # Scheduled requests whose sampling failed in an earlier step: answered with that error,
    # not computed (the router planned them before it read the failure).
    failed: list[tuple[int, str]] = ()


def _scheduled(step, states: dict[int, RequestState], limits: PlanLimits, device_out: set[int]):
    work: list[ScheduledWork] = []
    failed: list[tuple[int, str]] = []
    writer: dict[int, tuple[int, int]] = {}  # device block -> (request writing it, index in its table)
    readers: dict[int, list[tuple[int, int]]] = {}  # device block -> (request only reading it, index)
    seen: set[int] = set()
    for item in step.scheduled:
        rid, start, count = item.id, item.num_computed_tokens, item.num_new_tokens
        if rid not in states:
            raise PlanError(f"scheduled request {rid} is unknown (never registered, or forgotten)")
        if rid in seen:
            raise PlanError(f"request {rid} is scheduled twice in one step")
        seen.add(rid)
        state = states[rid]
        if state.failure:
            failed.append((rid, state.failure))
            continue
        if state.adapter and state.adapter not in limits.adapters:
            raise PlanError(f"request {rid} runs with LoRA adapter slot {state.adapter}, which holds no adapter "
                            f"any more (unloaded)")
        known = len(state.token_ids)
        if count < 1:
            raise PlanError(f"request {rid}: num_new_tokens must be at least 1")
        end = start + count
        if end > known:
            raise PlanError(f"request {rid}: computing up to position {end} but only {known} tokens are known")
        if end > limits.max_position_embeddings:
            raise PlanError(f"request {rid}: {end} tokens exceed the model's context of {limits.max_position_embeddings}")
        reaches_end = end == known
        if item.sample != reaches_end:
            raise PlanError(f"request {rid}: sample={item.sample} disagrees with the chunk, which ends at position {end} "
                            f"of {known} known tokens")
        # The router cannot know a token the outstanding step sampled: the chunk's last input
        # is that token exactly when the request sampled in that step and the chunk ends there.
        from_shard = bool(step.previous_step_id) and state.sampled_in_step == step.previous_step_id and reaches_end
        if item.input_from_shard != from_shard:
            raise PlanError(f"request {rid}: input_from_shard={item.input_from_shard} disagrees with the shard, whose last "
                            f"token for it was sampled in step {state.sampled_in_step or 'none'} (previous step "
                            f"{step.previous_step_id or 'none'}; the chunk ends at position {end} of {known})")
        if item.input_from_shard and item.allowed_tokens:
            raise PlanError(f"request {rid}: a grammar's mask for a chunk whose input the router has not seen")
        if item.allowed_tokens and not item.sample:
            raise PlanError(f"request {rid}: allowed_tokens given for a chunk that does not sample")
        if len(item.allowed_tokens) > -(-limits.vocab_size // 8):
            raise PlanError(f"request {rid}: allowed_tokens holds {len(item.allowed_tokens) * 8} bits, more than the "
                            f"vocabulary's {limits.vocab_size} tokens")
        table = list(item.block_table)
        needed = -(-end // limits.block_size)
        if len(table) < needed:
            raise PlanError(f"request {rid}: block table of {len(table)} blocks is too short for {end} tokens ({needed} needed)")
        table = table[:needed]
        if len(set(table)) != len(table):
            raise PlanError(f"request {rid}: a device block appears twice in its block table")
        for block in table:
            if block >= limits.num_device_blocks:
                raise PlanError(f"request {rid}: device block {block} out of range (pool has {limits.num_device_blocks})")
        first_written = start // limits.block_size
        for index, block in enumerate(table):
            if index < first_written:
                _check_shared_read(block, (rid, index), writer.get(block))
                readers.setdefault(block, []).append((rid, index))
                continue
            if block in writer:
                raise PlanError(f"device block {block} is written by requests {writer[block][0]} and {rid} in one step")
            for reader in readers.get(block, []):
                _check_shared_read(block, reader, (rid, index))
            if block in device_out:
                raise PlanError(f"request {rid}: device block {block} is being rotated out while written")
            writer[block] = (rid, index)
        work.append(ScheduledWork(rid, start, count, table, item.sample, item.allowed_tokens))
    return work, failed


def _check_shared_read(block: int, reader: tuple[int, int], writer: tuple[int, int] | None) -> None:
    """A block read by one request while another writes it must hold the same positions for
    both: the same index in their block tables."""
    if writer is None or reader[1] == writer[1]:
        return
    raise PlanError(f"device block {block} is read by request {reader[0]} as its block {reader[1]} while request "
                    f"{writer[0]} writes it as its block {writer[1]}")


def validate_plan(step, known: dict[int, RequestState], limits: PlanLimits, in_flight: InFlight) -> ValidatedPlan:
    """Checks `step` (a StepRequest) against the shard's state; raises PlanError, changing nothing."""
    new_requests = _new_requests(step, known, limits)
    forgotten = set(step.forget)
    states = {rid: r for rid, r in known.items() if rid not in forgotten}
    states.update({r.request_id: r for r in new_requests})
    # A chunk may read and write the blocks a transfer in (this step's or one in flight) is
    # writing: its compute is ordered after that copy (`TransferTracker.order_before_compute`).
    device_out, _ = _transfers(step, limits, in_flight)
    scheduled, failed = _scheduled(step, states, limits, device_out)
    return ValidatedPlan(list(dict.fromkeys(step.forget)), new_requests, scheduled, failed)
