"""The shard's traces: a span for each RPC it serves (Step, with the phases of the step under
it), exported over OTLP/gRPC when an endpoint is configured and not recorded at all otherwise.
Each RPC span continues the trace whose W3C context (`traceparent`) the router sent in the
call's metadata, so a Step's spans are children of the router's step span. Owns the tracer
provider and its export thread; nothing is installed globally."""
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import grpc
from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

if TYPE_CHECKING:  # the SDK is needed only when traces are exported
    from opentelemetry.sdk.trace.export import SpanExporter

SERVICE_NAME = "superinfer.shard"
# What the executor's phases use when nobody passes a tracer: records nothing.
NO_TRACES: trace.Tracer = trace.NoOpTracer()


class ShardTraces:
    """`exporter`: where finished spans go (batched); None: nowhere, and no span is recorded."""

    def __init__(self, exporter: "SpanExporter | None" = None, service_name: str = SERVICE_NAME):
        self._provider = None
        self.tracer = NO_TRACES
        if exporter is not None:
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor

            self._provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
            self._provider.add_span_processor(BatchSpanProcessor(exporter))
            self.tracer = self._provider.get_tracer("superinfer.shard")

    @classmethod
    def from_endpoint(cls, otlp_endpoint: str | None, service_name: str = SERVICE_NAME) -> "ShardTraces":
        """Exports to the OTLP/gRPC collector at `otlp_endpoint` (e.g. http://localhost:4317);
        None or empty: traces are off."""
        if not otlp_endpoint:
            return cls()
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        return cls(OTLPSpanExporter(endpoint=otlp_endpoint), service_name)

    @contextmanager
    def rpc(self, name: str, context: grpc.ServicerContext) -> Iterator[trace.Span]:
        """The span of one RPC, current while the block runs, child of the caller's span when
        the call's metadata carries one. An exception leaving the block marks it failed."""
        carrier = {key: value for key, value in context.invocation_metadata() or () if isinstance(value, str)}
        parent = TraceContextTextMapPropagator().extract(carrier)
        with self.tracer.start_as_current_span(name, context=parent, kind=trace.SpanKind.SERVER) as span:
            yield span

    def close(self) -> None:
        """Exports the spans still buffered and stops the export thread."""
        if self._provider is not None:
            self._provider.shutdown()
            self._provider = None
