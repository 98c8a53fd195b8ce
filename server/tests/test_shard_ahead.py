"""One step in flight (the router's --async-scheduling): step N+1 arrives while step N is
still to run, and a decode whose input is the token N samples says so (`input_from_shard`);
the shard feeds the token it sampled and kept. The tokens are the ones one step at a time
gives, the flag is checked both ways, steps run in the order `previous_step_id` fixes whatever
order gRPC delivers them in, and a request whose sampling failed answers a step planned before
the router knew with the same error."""
import threading
import time

import grpc
import pytest
from conftest import make_executor

from superinfer.pb import shard_pb2 as pb
from superinfer.pb import shard_pb2_grpc
from superinfer.shard.errors import PlanError
from superinfer.shard.server import ShardServer

PROMPTS = {1: [5, 6, 7, 8, 9], 2: list(range(20, 43))}
BLOCKS = {1: [0, 1], 2: [2, 3, 4]}


def _entry(rid, computed, count, sample=True, from_shard=False):
    return pb.ScheduledRequest(id=rid, num_computed_tokens=computed, num_new_tokens=count, block_table=BLOCKS[rid],
                               sample=sample, input_from_shard=from_shard)


def _steps(ahead: bool, new_tokens: int = 6) -> list[pb.StepRequest]:
    """What a router sends for PROMPTS, `new_tokens` greedy tokens each: with `ahead`, every
    step after the first is planned while the one before it runs."""
    steps = [pb.StepRequest(step_id=1, new_requests=[pb.NewRequest(id=r, prompt_token_ids=p) for r, p in PROMPTS.items()],
                            scheduled=[_entry(r, 0, len(p)) for r, p in PROMPTS.items()])]
    for step_id in range(2, new_tokens + 1):
        scheduled = [_entry(r, len(p) + step_id - 2, 1, from_shard=ahead) for r, p in PROMPTS.items()]
        steps.append(pb.StepRequest(step_id=step_id, scheduled=scheduled, previous_step_id=step_id - 1 if ahead else 0))
    return steps


def _tokens(replies) -> dict[int, list[int]]:
    tokens = {rid: [] for rid in PROMPTS}
    for reply in replies:
        for output in reply.outputs:
            assert not output.error, output.error
            tokens[output.request_id].append(output.token.id)
    return tokens


def test_tokens_fed_from_the_shard_are_the_tokens_of_one_step_at_a_time(tiny_llama_dir):
    reference = make_executor(tiny_llama_dir)
    one_at_a_time = _tokens([reference.step(s) for s in _steps(ahead=False)])
    executor = make_executor(tiny_llama_dir)
    ahead = _tokens([executor.step(s) for s in _steps(ahead=True)])
    assert ahead == one_at_a_time
    assert all(len(t) == 6 for t in ahead.values())


@pytest.mark.parametrize("case", ["flag without a previous step", "flag on a token the router knows",
                                  "no flag on a token only the shard knows", "a mask on an unseen input"])
def test_input_from_shard_is_checked_both_ways(tiny_llama_dir, case):
    executor = make_executor(tiny_llama_dir)
    executor.step(_steps(ahead=True)[0])
    executor.step(pb.StepRequest(step_id=2, scheduled=[_entry(1, 5, 1)]))  # the router had step 1's reply
    # Request 1's last token was sampled in step 2, request 2's in step 1.
    bad = {
        "flag without a previous step": pb.StepRequest(step_id=3, scheduled=[_entry(1, 6, 1, from_shard=True)]),
        "flag on a token the router knows": pb.StepRequest(step_id=3, previous_step_id=2, scheduled=[_entry(2, 23, 1, from_shard=True)]),
        "no flag on a token only the shard knows": pb.StepRequest(step_id=3, previous_step_id=2, scheduled=[_entry(1, 6, 1)]),
        "a mask on an unseen input": pb.StepRequest(step_id=3, previous_step_id=2, scheduled=[pb.ScheduledRequest(
            id=1, num_computed_tokens=6, num_new_tokens=1, block_table=BLOCKS[1], sample=True, input_from_shard=True,
            allowed_tokens=b"\xff")]),
    }[case]
    with pytest.raises(PlanError, match="input_from_shard|mask"):
        executor.step(bad)
    # Nothing changed: the consistent plan runs.
    good = pb.StepRequest(step_id=3, previous_step_id=2, scheduled=[_entry(1, 6, 1, from_shard=True), _entry(2, 23, 1)])
    assert all(o.HasField("token") for o in executor.step(good).outputs)


@pytest.fixture
def service(tiny_llama_dir, tmp_path):
    server = ShardServer(make_executor(tiny_llama_dir), tmp_path / "shard.sock")
    server.start()
    channel = grpc.insecure_channel(f"unix://{tmp_path / 'shard.sock'}")
    yield shard_pb2_grpc.ShardStub(channel)
    channel.close()
    server.stop(grace_s=1)


def test_a_step_runs_after_the_one_it_names_whatever_the_arrival_order(service, tiny_llama_dir):
    reference = make_executor(tiny_llama_dir)
    expected = _tokens([reference.step(s) for s in _steps(ahead=False, new_tokens=3)])
    service.Warmup(pb.WarmupRequest(max_batch_tokens=128, max_batch_requests=8))
    first, second, third = _steps(ahead=True, new_tokens=3)
    # The later steps arrive first: they wait for the ones they name.
    later = [service.Step.future(third), service.Step.future(second)]
    time.sleep(0.3)
    assert not any(f.done() for f in later)
    replies = [service.Step(first)] + [f.result(timeout=30) for f in reversed(later)]
    assert _tokens(replies) == expected


def test_an_abandoned_waiting_step_is_cancelled_and_reset_starts_over(service):
    service.Warmup(pb.WarmupRequest(max_batch_tokens=128, max_batch_requests=8))
    waiting = service.Step.future(pb.StepRequest(step_id=8, previous_step_id=7))
    time.sleep(0.1)
    waiting.cancel()
    service.Reset(pb.ResetRequest())
    first, second = _steps(ahead=True, new_tokens=2)
    done = threading.Event()
    reply = service.Step.future(second)
    reply.add_done_callback(lambda _: done.set())
    service.Step(first)
    assert done.wait(30) and reply.result().outputs[0].HasField("token")


def test_a_step_planned_before_a_sampling_failure_was_known_answers_with_it(tiny_llama_dir, failing_sampling):
    failing_sampling("cannot sample")
    executor = make_executor(tiny_llama_dir)
    first, second = _steps(ahead=True, new_tokens=2)
    first.new_requests[1].parameters.CopyFrom(pb.SamplingParameters(do_sample=True, temperature=0.8, seed=1))
    reply = executor.step(first)
    assert reply.outputs[1].request_id == 2 and "cannot sample" in reply.outputs[1].error
    # The router planned step 2 (request 2 on its placeholder) before reading step 1's reply.
    reply = executor.step(second)
    outputs = {o.request_id: o for o in reply.outputs}
    assert outputs[1].HasField("token") and not outputs[1].error
    assert not outputs[2].HasField("token") and "cannot sample" in outputs[2].error


# Launching step N+1 before finishing step N (the executor's `pipeline`, a GPU's default with
# one rank): the CPU runs the same code with its compute done at launch, so these check the
# bookkeeping — placeholders, inputs fed from the device picks, the reply's tokens — not overlap.

def _pipelined(directory):
    executor = make_executor(directory)
    executor.pipeline = True
    return executor


def test_steps_launched_before_the_previous_one_finished_give_the_same_tokens(tiny_llama_dir):
    reference = make_executor(tiny_llama_dir)
    steps = _steps(ahead=False, new_tokens=6)
    steps[0].new_requests[0].parameters.CopyFrom(pb.SamplingParameters(top_n_tokens=3))
    expected = [reference.step(s) for s in steps]
    executor = _pipelined(tiny_llama_dir)
    steps = _steps(ahead=True, new_tokens=6)
    steps[0].new_requests[0].parameters.CopyFrom(pb.SamplingParameters(top_n_tokens=3))
    launched = executor.launch(steps[0])
    replies = []
    for following in steps[1:]:
        assert launched.device is not None and executor.can_run_ahead(launched, following)
        ahead = executor.launch(following)  # its inputs come from `launched`'s device picks
        replies.append(executor.finish(launched))
        launched = ahead
    replies.append(executor.finish(launched))
    assert _tokens(replies) == _tokens(expected)
    for got, want in zip(replies, expected):
        for a, b in zip(got.outputs, want.outputs):
            # float32 on the CPU: the threads' summation order varies from run to run (2e-6 seen
            # at -2.9); the tokens above are what must not change.
            assert a.token.logprob == pytest.approx(b.token.logprob, abs=1e-5)
            assert [t.id for t in a.token.top_tokens] == [t.id for t in b.token.top_tokens]
    # Every placeholder was replaced by its token.
    assert all(token >= 0 for state in executor.requests.values() for token in state.token_ids)
    assert executor._pending == {}


def test_a_request_forgotten_while_its_token_is_on_the_device_is_dropped_cleanly(tiny_llama_dir):
    executor = _pipelined(tiny_llama_dir)
    first, second, _ = _steps(ahead=True, new_tokens=3)
    launched = executor.launch(first)
    del second.scheduled[1]
    second.forget.append(2)  # the client went away while step 1 ran
    ahead = executor.launch(second)
    assert 2 not in executor.requests and 2 not in executor._pending
    assert {o.request_id for o in executor.finish(launched).outputs} == {1, 2}
    assert [o.request_id for o in executor.finish(ahead).outputs] == [1]
    assert all(token >= 0 for token in executor.requests[1].token_ids)


@pytest.mark.parametrize("case", ["sampling", "a penalty", "min_tokens", "a grammar mask", "prompt logprobs"])
def test_only_plain_greedy_steps_run_ahead(tiny_llama_dir, case):
    executor = _pipelined(tiny_llama_dir)
    first, second = _steps(ahead=True, new_tokens=2)
    request = first.new_requests[0]
    if case == "sampling":
        request.parameters.CopyFrom(pb.SamplingParameters(do_sample=True, temperature=0.7, seed=3))
    elif case == "a penalty":
        request.parameters.CopyFrom(pb.SamplingParameters(repetition_penalty=1.3))
    elif case == "min_tokens":
        request.parameters.CopyFrom(pb.SamplingParameters(min_tokens=3, end_token_ids=[2]))
    elif case == "prompt logprobs":
        request.prompt_logprobs = True
    if case == "a grammar mask":
        launched = executor.launch(first)
        assert launched.device is not None  # step 1 has no mask: its picks stay on the device
        second = pb.StepRequest(step_id=2, previous_step_id=1, scheduled=[_entry(2, 23, 1, from_shard=True)])
        executor.finish(launched)
        launched = executor.launch(second)
        third = pb.StepRequest(step_id=3, previous_step_id=2, scheduled=[pb.ScheduledRequest(
            id=2, num_computed_tokens=24, num_new_tokens=1, block_table=BLOCKS[2], sample=True,
            input_from_shard=True, allowed_tokens=b"\xff" * 8)])
        assert not executor.can_run_ahead(launched, third)
        executor.finish(launched)
        return
    launched = executor.launch(first)
    # Step 1 samples request 1 on the host (its tokens are known at once), so nothing runs ahead.
    assert launched.device is None and not executor.can_run_ahead(launched, second)
    executor.finish(launched)


def test_the_servicer_launches_the_next_step_while_the_device_computes(tiny_llama_dir, tmp_path, monkeypatch):
    """Over gRPC: a step reports its device work unfinished until the next one has been
    launched on its thread; the replies are the tokens of one step at a time."""
    from superinfer.shard import executor as executor_module

    reference = make_executor(tiny_llama_dir)
    expected = _tokens([reference.step(s) for s in _steps(ahead=False, new_tokens=4)])
    executor = _pipelined(tiny_llama_dir)
    server = ShardServer(executor, tmp_path / "shard.sock")
    servicer = server.servicer
    launched_ahead = []
    last_step = 4

    def ready(self):  # the "device" finishes a step only once the next one has been launched ahead
        return self.request.step_id == last_step or self.request.step_id + 1 in servicer._launched_ahead

    def can_run_ahead(launched, request):
        launched_ahead.append(request.step_id)
        return type(executor).can_run_ahead(executor, launched, request)

    monkeypatch.setattr(executor_module.LaunchedStep, "ready", ready)
    monkeypatch.setattr(executor, "can_run_ahead", can_run_ahead)
    server.start()
    channel = grpc.insecure_channel(f"unix://{tmp_path / 'shard.sock'}")
    try:
        stub = shard_pb2_grpc.ShardStub(channel)
        stub.Warmup(pb.WarmupRequest(max_batch_tokens=128, max_batch_requests=8))
        steps = _steps(ahead=True, new_tokens=last_step)
        replies, pending = [], stub.Step.future(steps[0])
        for following in steps[1:]:
            time.sleep(0.05)
            later = stub.Step.future(following)  # sent while the one before runs, as the router does
            replies.append(pending.result(timeout=30))
            pending = later
        replies.append(pending.result(timeout=30))
    finally:
        channel.close()
        server.stop(grace_s=1)
    assert _tokens(replies) == expected
    # Step 1 named no previous step, so the servicer did not yet know steps come ahead.
    assert launched_ahead == [3, 4]
