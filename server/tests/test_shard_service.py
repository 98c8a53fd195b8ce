"""The shard's gRPC service over a unix socket: Info, Health, Warmup, Steps with requests
joining and leaving, bad plans rejected with INVALID_ARGUMENT while the shard keeps serving,
and `superinfer serve` as a process that stops cleanly on SIGTERM."""
import json
import signal
import subprocess
import sys

import grpc
import pytest
from conftest import TINY_VOCAB, make_executor

from superinfer.pb import shard_pb2 as pb
from superinfer.pb import shard_pb2_grpc
from superinfer.shard.server import ShardServer


@pytest.fixture
def stub(tiny_llama_dir, tmp_path):
    server = ShardServer(make_executor(tiny_llama_dir, device_blocks=32, host_blocks=8), tmp_path / "shard.sock")
    server.start()
    channel = grpc.insecure_channel(f"unix://{tmp_path / 'shard.sock'}")
    yield shard_pb2_grpc.ShardStub(channel)
    channel.close()
    server.stop(grace_s=1)


def _schedule(rid, computed, count, blocks, sample=True):
    return pb.ScheduledRequest(id=rid, num_computed_tokens=computed, num_new_tokens=count, block_table=blocks,
                               sample=sample)


def test_info_describes_model_and_tokenizer(stub):
    info = stub.Info(pb.InfoRequest())
    assert (info.architecture, info.dtype, info.device_type) == ("llama", "float32", "cpu")
    assert (info.num_layers, info.num_kv_heads, info.head_dim, info.block_size) == (2, 2, 16, 16)
    assert info.block_bytes == 2 * 2 * 16 * 2 * 16 * 4
    assert info.vocab_size == TINY_VOCAB and info.max_position_embeddings == 512
    assert json.loads(info.tokenizer_json)["model"]["type"] == "WordLevel"
    assert info.eos_token == "t2" and 2 in info.eos_token_ids and info.bos_token == "t1"
    assert "messages" in info.chat_template
    stub.Health(pb.HealthRequest())


def test_requests_join_and_leave_across_steps(stub):
    warm = stub.Warmup(pb.WarmupRequest(max_batch_tokens=64, max_batch_requests=4))
    assert warm.num_device_blocks == 32 and warm.num_host_blocks == 8
    assert warm.cost_model.per_prefill_token_s >= 0 and warm.cost_model.swap_out_bytes_per_s > 0
    first = stub.Step(pb.StepRequest(step_id=1, new_requests=[pb.NewRequest(id=1, prompt_token_ids=[5, 6, 7])],
                                     scheduled=[_schedule(1, 0, 3, [0])]))
    assert first.outputs[0].HasField("token") and first.timings.total_ns >= first.timings.forward_ns > 0
    # Request 2 joins with a chunk that does not reach its end: no token yet.
    second = stub.Step(pb.StepRequest(step_id=2, new_requests=[pb.NewRequest(id=2, prompt_token_ids=list(range(10, 30)))],
                                      scheduled=[_schedule(1, 3, 1, [0]), _schedule(2, 0, 16, [1, 2], sample=False)]))
    assert [o.request_id for o in second.outputs] == [1, 2]
    assert second.outputs[0].HasField("token") and not second.outputs[1].HasField("token")
    third = stub.Step(pb.StepRequest(step_id=3, forget=[1], scheduled=[_schedule(2, 16, 4, [1, 2])]))
    assert third.outputs[0].HasField("token")
    # Request 1 is gone: scheduling it is rejected, and it may be registered again.
    with pytest.raises(grpc.RpcError) as err:
        stub.Step(pb.StepRequest(step_id=4, scheduled=[_schedule(1, 4, 1, [0])]))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    again = stub.Step(pb.StepRequest(step_id=5, new_requests=[pb.NewRequest(id=1, prompt_token_ids=[5, 6, 7])],
                                     scheduled=[_schedule(1, 0, 3, [0])]))
    assert again.outputs[0].token.id == first.outputs[0].token.id


BAD_PLANS = {
    "unknown": pb.StepRequest(scheduled=[_schedule(99, 0, 1, [5])]),
    "out of range": pb.StepRequest(scheduled=[_schedule(1, 3, 1, [400])]),
    "written by requests 1 and 2": pb.StepRequest(scheduled=[_schedule(1, 3, 1, [0]), _schedule(2, 20, 1, [1, 0])]),
    "longer than the model's context": pb.StepRequest(
        new_requests=[pb.NewRequest(id=3, prompt_token_ids=[4] * 600)], scheduled=[_schedule(1, 3, 1, [0])]),
    "too short": pb.StepRequest(scheduled=[_schedule(2, 20, 1, [1])]),
    "only 21 tokens are known": pb.StepRequest(scheduled=[_schedule(2, 20, 2, [1, 2])]),
    "duplicate id": pb.StepRequest(new_requests=[pb.NewRequest(id=1, prompt_token_ids=[4])]),
    "scheduled twice": pb.StepRequest(scheduled=[_schedule(1, 3, 1, [0]), _schedule(1, 3, 1, [0])]),
    "disagrees with the chunk": pb.StepRequest(scheduled=[_schedule(1, 3, 1, [0], sample=False)]),
    "outside the vocabulary": pb.StepRequest(new_requests=[pb.NewRequest(id=4, prompt_token_ids=[TINY_VOCAB])]),
    "end_token_ids names a token id outside": pb.StepRequest(new_requests=[pb.NewRequest(
        id=4, prompt_token_ids=[4], parameters=pb.SamplingParameters(min_tokens=2, end_token_ids=[TINY_VOCAB]))]),
    "allowed_token_ids names a token id outside": pb.StepRequest(new_requests=[pb.NewRequest(
        id=4, prompt_token_ids=[4], parameters=pb.SamplingParameters(allowed_token_ids=[1, TINY_VOCAB]))]),
    "bad_words holds an empty sequence": pb.StepRequest(new_requests=[pb.NewRequest(
        id=4, prompt_token_ids=[4], parameters=pb.SamplingParameters(bad_words=[pb.TokenSequence(ids=[])]))]),
    "prompt_top_n must be <=": pb.StepRequest(new_requests=[pb.NewRequest(
        id=4, prompt_token_ids=[4], prompt_logprobs=True, prompt_top_n=100_000)]),
    "min_p must be in [0, 1]": pb.StepRequest(new_requests=[pb.NewRequest(
        id=4, prompt_token_ids=[4], parameters=pb.SamplingParameters(do_sample=True, temperature=1, min_p=1.5))]),
    "temperature": pb.StepRequest(new_requests=[pb.NewRequest(id=4, prompt_token_ids=[4],
                                                              parameters=pb.SamplingParameters(do_sample=True))]),
}


def test_bad_plans_are_rejected_and_the_shard_keeps_serving(stub):
    stub.Warmup(pb.WarmupRequest(max_batch_tokens=64, max_batch_requests=4))
    stub.Step(pb.StepRequest(new_requests=[pb.NewRequest(id=1, prompt_token_ids=[5, 6, 7]),
                                           pb.NewRequest(id=2, prompt_token_ids=list(range(10, 30)))],
                             scheduled=[_schedule(1, 0, 3, [0]), _schedule(2, 0, 20, [1, 2])]))
    for message, plan in BAD_PLANS.items():
        with pytest.raises(grpc.RpcError) as err:
            stub.Step(plan)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, message
        assert message in err.value.details()
    # Nothing changed: both requests continue (request 3 of the rejected plan never registered).
    reply = stub.Step(pb.StepRequest(scheduled=[_schedule(1, 3, 1, [0]), _schedule(2, 20, 1, [1, 2])]))
    assert all(o.HasField("token") for o in reply.outputs)
    with pytest.raises(grpc.RpcError) as err:
        stub.Step(pb.StepRequest(scheduled=[_schedule(3, 0, 600, list(range(38)))]))
    assert "unknown" in err.value.details()


def test_a_request_that_cannot_sample_fails_alone(stub, failing_sampling):
    failing_sampling("cannot sample")
    stub.Warmup(pb.WarmupRequest(max_batch_tokens=64, max_batch_requests=4))
    sampled = pb.SamplingParameters(do_sample=True, temperature=0.8, seed=1)
    reply = stub.Step(pb.StepRequest(
        new_requests=[pb.NewRequest(id=1, prompt_token_ids=[5, 6]), pb.NewRequest(id=2, prompt_token_ids=[7], parameters=sampled)],
        scheduled=[_schedule(1, 0, 2, [0]), _schedule(2, 0, 1, [1])]))
    assert reply.outputs[0].HasField("token") and not reply.outputs[0].error
    assert not reply.outputs[1].HasField("token") and "cannot sample" in reply.outputs[1].error
    # The other request goes on.
    reply = stub.Step(pb.StepRequest(forget=[2], scheduled=[_schedule(1, 2, 1, [0])]))
    assert reply.outputs[0].HasField("token")


def test_reset_drops_every_request_and_keeps_the_pools(stub):
    stub.Warmup(pb.WarmupRequest(max_batch_tokens=64, max_batch_requests=4))
    first = stub.Step(pb.StepRequest(new_requests=[pb.NewRequest(id=1, prompt_token_ids=[5, 6, 7])],
                                     scheduled=[_schedule(1, 0, 3, [0])],
                                     rotate_out=[pb.Transfer(id=9, src_blocks=[3], dst_blocks=[0])]))
    assert stub.Reset(pb.ResetRequest()).dropped_requests == 1
    with pytest.raises(grpc.RpcError) as err:
        stub.Step(pb.StepRequest(scheduled=[_schedule(1, 3, 1, [0])]))
    assert "unknown" in err.value.details()
    # The same id starts over and computes the same token; the dropped transfer is never reported.
    again = stub.Step(pb.StepRequest(new_requests=[pb.NewRequest(id=1, prompt_token_ids=[5, 6, 7])],
                                     scheduled=[_schedule(1, 0, 3, [0])]))
    assert again.outputs[0].token.id == first.outputs[0].token.id
    assert 9 not in again.completed_transfers


def test_step_before_warmup_fails_precondition(tiny_llama_dir, tmp_path):
    server = ShardServer(make_executor(tiny_llama_dir, warm=False), tmp_path / "cold.sock")
    server.start()
    channel = grpc.insecure_channel(f"unix://{tmp_path / 'cold.sock'}")
    stub = shard_pb2_grpc.ShardStub(channel)
    with pytest.raises(grpc.RpcError) as err:
        stub.Step(pb.StepRequest())
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    channel.close()
    server.stop(grace_s=1)


def test_serve_process_stops_on_sigterm(tiny_llama_dir, tmp_path):
    socket_path = tmp_path / "serve.sock"
    command = [sys.executable, "-m", "superinfer.cli", "serve", "--uds-path", str(socket_path), "--model",
               str(tiny_llama_dir), "--device", "cpu", "--device-kv-blocks", "16", "--host-kv-blocks", "4",
               "--threads", "1", "--cache-dir", str(tmp_path / "cache")]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    try:
        channel = grpc.insecure_channel(f"unix://{socket_path}")
        grpc.channel_ready_future(channel).result(timeout=120)
        stub = shard_pb2_grpc.ShardStub(channel)
        assert stub.Info(pb.InfoRequest()).architecture == "llama"
        stub.Warmup(pb.WarmupRequest(max_batch_tokens=32, max_batch_requests=2))
        reply = stub.Step(pb.StepRequest(new_requests=[pb.NewRequest(id=1, prompt_token_ids=[4, 5])],
                                         scheduled=[_schedule(1, 0, 2, [0])]))
        assert reply.outputs[0].HasField("token")
        channel.close()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
        stderr = process.stderr.read()
        assert "ready in" in stderr and "shard stopped" in stderr
        assert not socket_path.exists()
    finally:
        if process.poll() is None:
            process.kill()
