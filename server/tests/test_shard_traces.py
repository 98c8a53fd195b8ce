"""The shard's spans through its real gRPC service: a Step sent with a `traceparent` is a child of
the caller's span, its phases (transfers, forward, sampling) are children of the Step, a
rejected plan marks its span failed, and with traces off nothing is recorded."""
import grpc
import pytest
from conftest import make_executor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from superinfer.pb import shard_pb2 as pb
from superinfer.pb import shard_pb2_grpc
from superinfer.shard.server import ShardServer
from superinfer.shard.telemetry import NO_TRACES, ShardTraces

TRACE_ID = 0x4BF92F3577B34DA6A3CE929D0E0E4736
CALLER_SPAN_ID = 0x00F067AA0BA902B7
TRACEPARENT = (("traceparent", f"00-{TRACE_ID:032x}-{CALLER_SPAN_ID:016x}-01"),)


@pytest.fixture
def traced_shard(tiny_llama_dir, tmp_path):
    """A stub of a shard whose spans go to the returned exporter once `stop` is called."""
    exporter = InMemorySpanExporter()
    server = ShardServer(make_executor(tiny_llama_dir, device_blocks=32, host_blocks=8), tmp_path / "shard.sock",
                         ShardTraces(exporter))
    server.start()
    channel = grpc.insecure_channel(f"unix://{tmp_path / 'shard.sock'}")

    def stop():
        channel.close()
        server.stop(grace_s=1)  # flushes the spans
        return exporter.get_finished_spans()

    yield shard_pb2_grpc.ShardStub(channel), stop


def test_a_step_continues_the_callers_trace(traced_shard):
    stub, stop = traced_shard
    stub.Step(pb.StepRequest(step_id=1, new_requests=[pb.NewRequest(id=1, prompt_token_ids=[5, 6, 7])],
                             scheduled=[pb.ScheduledRequest(id=1, num_computed_tokens=0, num_new_tokens=3,
                                                            block_table=[0], sample=True)],
                             rotate_out=[pb.Transfer(id=4, src_blocks=[3], dst_blocks=[0])]),
              metadata=TRACEPARENT)
    stub.Health(pb.HealthRequest())
    spans = {span.name: span for span in stop()}
    step = spans["Step"]
    assert step.kind == SpanKind.SERVER
    assert step.context.trace_id == TRACE_ID and step.parent.span_id == CALLER_SPAN_ID and step.parent.is_remote
    assert step.attributes["step_id"] == 1 and step.attributes["scheduled"] == 1
    for phase in ("transfers", "forward", "sampling"):
        assert spans[phase].parent.span_id == step.context.span_id, phase
        assert spans[phase].context.trace_id == TRACE_ID
    assert spans["transfers"].attributes["blocks_out"] == 1
    assert spans["forward"].attributes["tokens"] == 3
    assert spans["Step"].resource.attributes["service.name"] == "superinfer.shard"
    # A call without trace context starts a trace of its own.
    assert spans["Health"].parent is None and spans["Health"].context.trace_id != TRACE_ID


def test_a_rejected_plan_fails_its_span(traced_shard):
    stub, stop = traced_shard
    with pytest.raises(grpc.RpcError):
        stub.Step(pb.StepRequest(step_id=1, scheduled=[pb.ScheduledRequest(id=99, num_computed_tokens=0,
                                                                           num_new_tokens=1, block_table=[0])]),
                  metadata=TRACEPARENT)
    [step] = [span for span in stop() if span.name == "Step"]
    assert step.status.status_code == StatusCode.ERROR


def test_traces_are_off_without_an_endpoint():
    traces = ShardTraces.from_endpoint(None)
    assert traces.tracer is NO_TRACES
    with traces.tracer.start_as_current_span("Step") as span:
        assert not span.is_recording()
    traces.close()
