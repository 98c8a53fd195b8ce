"""KV rotation through the DuplexKV engine, driven by Step plans: a request rotated out to the
host, its device blocks overwritten by another request, and rotated back into different
device blocks continues exactly as if it had never left."""
import pytest
import torch
from conftest import make_executor

from superinfer.pb import shard_pb2 as pb
from superinfer.shard.errors import PlanError
from superinfer.shard.plan import InFlight, PlanLimits, validate_plan

PROMPT = list(range(3, 43))  # 40 tokens: 3 blocks of 16


class Driver:
    def __init__(self, executor):
        self.executor = executor
        self.step_id = 0
        self.completed: list[int] = []

    def step(self, **fields) -> pb.StepResponse:
        reply = self.executor.step(pb.StepRequest(step_id=self.step_id, **fields))
        self.step_id += 1
        self.completed.extend(reply.completed_transfers)
        return reply

    def decode(self, rid: int, tokens: list[int], prompt_len: int, blocks: list[int], count: int) -> None:
        for _ in range(count):
            computed = prompt_len + len(tokens) - 1
            reply = self.step(scheduled=[pb.ScheduledRequest(id=rid, num_computed_tokens=computed, num_new_tokens=1, block_table=blocks, sample=True)])
            tokens.append(reply.outputs[0].token.id)

    def wait_for(self, transfer_id: int) -> None:
        for _ in range(10_000):
            if transfer_id in self.completed:
                return
            self.step()
        raise TimeoutError(f"transfer {transfer_id} never completed")


def _start(driver: Driver, rid: int, blocks: list[int], prompt=PROMPT) -> list[int]:
    reply = driver.step(
        new_requests=[pb.NewRequest(id=rid, prompt_token_ids=prompt)],
        scheduled=[pb.ScheduledRequest(id=rid, num_computed_tokens=0, num_new_tokens=len(prompt), block_table=blocks,
                                     sample=True)],
    )
    return [reply.outputs[0].token.id]


def rotation_round_trip(directory, device: str, before: int, after: int, host_blocks: list[int],
                        new_blocks: list[int], ids=(7, 8), same_step: bool = False) -> tuple[Driver, list[int], list[int]]:
    """Request 1 decodes `before` tokens in blocks 0-3, is rotated out to `host_blocks`, has its
    device blocks overwritten by another request, comes back into `new_blocks` and decodes
    `after` more — with `same_step`, the first of them in the step that brings it back, as the
    router plans a return. Returns the driver, its tokens, and those of a run without the
    rotation."""
    reference = Driver(make_executor(directory, device=device))
    expected = _start(reference, 1, [0, 1, 2, 3])
    reference.decode(1, expected, len(PROMPT), [0, 1, 2, 3], before + after)

    driver = Driver(make_executor(directory, device=device))
    tokens = _start(driver, 1, [0, 1, 2, 3])
    driver.decode(1, tokens, len(PROMPT), [0, 1, 2, 3], before)
    out_id, in_id = ids
    driver.step(rotate_out=[pb.Transfer(id=out_id, src_blocks=[0, 1, 2, 3], dst_blocks=host_blocks)])
    driver.wait_for(out_id)
    # Another request now fills the same device blocks with its own K/V.
    _start(driver, 2, [0, 1, 2, 3], prompt=list(range(100, 160)))
    back = pb.Transfer(id=in_id, src_blocks=host_blocks, dst_blocks=new_blocks)
    if same_step:
        computed = len(PROMPT) + len(tokens) - 1
        reply = driver.step(forget=[2], rotate_in=[back], scheduled=[pb.ScheduledRequest(
            id=1, num_computed_tokens=computed, num_new_tokens=1, block_table=new_blocks, sample=True)])
        tokens.append(reply.outputs[0].token.id)
        after -= 1
    else:
        driver.step(forget=[2], rotate_in=[back])
    driver.wait_for(in_id)
    driver.decode(1, tokens, len(PROMPT), new_blocks, after)
    return driver, tokens, expected


def test_rotation_round_trip_into_other_blocks_continues_identically(tiny_llama_dir):
    driver, tokens, expected = rotation_round_trip(tiny_llama_dir, "cpu", 5, 10, [9, 4, 11, 2], [20, 31, 22, 25])
    assert driver.completed.count(7) == 1 and driver.completed.count(8) == 1
    assert tokens == expected


def test_a_request_computed_in_the_step_that_brings_it_back_continues_identically(tiny_llama_dir):
    """The compute waits for the copy in: the first token after the return is the one a run
    without rotation samples, and so is every later one."""
    driver, tokens, expected = rotation_round_trip(tiny_llama_dir, "cpu", 5, 10, [9, 4, 11, 2], [20, 31, 22, 25],
                                                   same_step=True)
    assert driver.completed.count(8) == 1
    assert tokens == expected


def leave_after_compute_round_trip(directory, device: str) -> tuple[Driver, list[int], list[int]]:
    """Request 1 decodes in blocks 0-3 and leaves in a step that also computes its next token
    (the copy out after the compute); another request overwrites those blocks; it comes back
    into blocks 20-23, computes and leaves again in one step (copy in, compute, copy out); its
    blocks are overwritten once more; it comes back into blocks 8-11 and decodes to the end.
    Returns the driver, its tokens, and those of a run without rotation."""
    before, after = 4, 8
    reference = Driver(make_executor(directory, device=device))
    expected = _start(reference, 1, [0, 1, 2, 3])
    reference.decode(1, expected, len(PROMPT), [0, 1, 2, 3], before + after + 2)

    driver = Driver(make_executor(directory, device=device))
    tokens = _start(driver, 1, [0, 1, 2, 3])
    driver.decode(1, tokens, len(PROMPT), [0, 1, 2, 3], before)

    def decode_step(blocks, **transfers) -> pb.StepResponse:
        computed = len(PROMPT) + len(tokens) - 1
        reply = driver.step(scheduled=[pb.ScheduledRequest(id=1, num_computed_tokens=computed, num_new_tokens=1,
                                                           block_table=blocks, sample=True)], **transfers)
        tokens.append(reply.outputs[0].token.id)
        return reply

    reply = decode_step([0, 1, 2, 3], rotate_out=[pb.Transfer(id=7, src_blocks=[0, 1, 2, 3], dst_blocks=[9, 4, 11, 2])])
    # Acknowledged in the reply of the step it leaves in: its blocks are free for the next one.
    assert 7 in reply.completed_transfers
    _start(driver, 2, [0, 1, 2, 3], prompt=list(range(100, 160)))
    reply = decode_step([20, 21, 22, 23], forget=[2],
                        rotate_in=[pb.Transfer(id=8, src_blocks=[9, 4, 11, 2], dst_blocks=[20, 21, 22, 23])],
                        rotate_out=[pb.Transfer(id=9, src_blocks=[20, 21, 22, 23], dst_blocks=[5, 6, 7, 3])])
    assert {8, 9} <= set(reply.completed_transfers)
    _start(driver, 3, [20, 21, 22, 23], prompt=list(range(200, 250)))
    driver.step(forget=[3], rotate_in=[pb.Transfer(id=10, src_blocks=[5, 6, 7, 3], dst_blocks=[8, 9, 10, 11])])
    driver.wait_for(10)
    driver.decode(1, tokens, len(PROMPT), [8, 9, 10, 11], after)
    return driver, tokens, expected


def test_a_request_that_leaves_after_computing_continues_identically(tiny_llama_dir):
    """A copy out of blocks the step computes in runs after the compute, so what it saves holds
    the step's own K/V — also when the copy in, the compute and the copy out share one step."""
    _, tokens, expected = leave_after_compute_round_trip(tiny_llama_dir, "cpu")
    assert tokens == expected


def test_compute_on_a_block_an_earlier_copy_out_still_reads_waits_or_is_rejected():
    """Only a copy out of this step runs after its compute: one still in flight from an earlier
    step is reading the block, and neither a copy in nor a copy out may write over it."""
    in_flight = InFlight(transfer_ids=frozenset({1}), host_written=frozenset({3}), host_read=frozenset(),
                         device_written=frozenset({5}), device_read=frozenset({0}))
    limits = PlanLimits(num_device_blocks=32, num_host_blocks=16, block_size=16, vocab_size=512, max_position_embeddings=512)
    # A copy out after this step's compute may not read a block an earlier copy in still writes.
    late_out = pb.StepRequest(rotate_out=[pb.Transfer(id=2, src_blocks=[5], dst_blocks=[9])],
                              scheduled=[pb.ScheduledRequest(id=1, num_computed_tokens=0, num_new_tokens=1, block_table=[5])])
    with pytest.raises(PlanError, match="device block 5"):
        validate_plan(late_out, {}, limits, in_flight)


def test_blocks_of_transfers_in_flight_are_protected():
    in_flight = InFlight(transfer_ids=frozenset({1}), host_written=frozenset({3}), host_read=frozenset({8}),
                         device_written=frozenset({5}), device_read=frozenset({0}))
    limits = PlanLimits(num_device_blocks=32, num_host_blocks=16, block_size=16, vocab_size=512, max_position_embeddings=512)
    cases = {
        "host block 3": pb.StepRequest(rotate_out=[pb.Transfer(id=2, src_blocks=[1], dst_blocks=[3])]),
        "host block 8": pb.StepRequest(rotate_out=[pb.Transfer(id=2, src_blocks=[1], dst_blocks=[8])]),
        "used twice": pb.StepRequest(rotate_in=[pb.Transfer(id=1, src_blocks=[4], dst_blocks=[4])]),
        "device block 0": pb.StepRequest(rotate_in=[pb.Transfer(id=2, src_blocks=[4], dst_blocks=[0])]),
        "device block 5": pb.StepRequest(rotate_in=[pb.Transfer(id=2, src_blocks=[4], dst_blocks=[5])]),
    }
    for message, step in cases.items():
        with pytest.raises(PlanError, match=message):
            validate_plan(step, {}, limits, in_flight)
    # Reading host block 8 again, or a disjoint copy, is fine.
    validate_plan(pb.StepRequest(rotate_in=[pb.Transfer(id=2, src_blocks=[8], dst_blocks=[6])]), {}, limits, in_flight)


def test_device_pool_holds_rotated_data(tiny_llama_dir):
    executor = make_executor(tiny_llama_dir)
    cache = executor.runner.cache
    cache.device[6].copy_(torch.randn_like(cache.device[6]))
    driver = Driver(executor)
    driver.step(rotate_out=[pb.Transfer(id=1, src_blocks=[6], dst_blocks=[0])])
    driver.wait_for(1)
    assert torch.equal(cache.host[0], cache.device[6])
