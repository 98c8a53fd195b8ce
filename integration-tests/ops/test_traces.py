"""Traces end to end, read back from a real Jaeger (all-in-one, memory storage; `make test-ops`
builds it from its Go module into target/jaeger/). Requests that carry a known `traceparent`
yield one connected trace: the router's HTTP span is a child of the caller's span; the step
spans that served the request link to it; the shard's Step span is a child of the router's
step span, with its phases under it; rotations are events with their bytes on the step spans.
A device KV pool far too small for the requests makes RotaSched rotate."""
import os
import secrets
import signal
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from conftest import REPO, free_port, launch

JAEGER_BIN = Path(os.environ.get("JAEGER_BIN", REPO / "target" / "jaeger" / "bin" / "all-in-one"))
ROUTER, SHARD = "superinfer.router", "superinfer.shard"
TOPICS = ["rivers", "volcanoes", "bread", "chess", "owls", "glaciers", "violins", "tea", "comets", "bridges"]
MAX_NEW_TOKENS = 24
# ~20 prompt + 24 generated tokens: 3 blocks of 16 each; 12 device blocks hold four requests
# at a time, so ten arriving together make RotaSched rotate (test_rotation.py's reasoning).
SERVER_ARGS = ["--device-kv-blocks", "12", "--host-kv-blocks", "512", "--max-batch-tokens", "512",
               "--scheduler", "rotasched", "--ttft-slo-ms", "30000", "--tbt-slo-ms", "5000"]
# Both exporters batch for up to 5 s; the HTTP span ends when its response does.
EXPORT_WAIT_S = 60


@dataclass
class Jaeger:
    otlp_endpoint: str
    query_url: str

    def trace(self, trace_id: str) -> dict | None:
        response = requests.get(f"{self.query_url}/api/traces/{trace_id}", timeout=10)
        if response.status_code == 404:
            return None
        response.raise_for_status()
        [trace] = response.json()["data"]
        return trace

    def traces(self, service: str, operation: str, since_us: int) -> list[dict]:
        params = {"service": service, "operation": operation, "start": since_us, "limit": 5000}
        response = requests.get(f"{self.query_url}/api/traces", params=params, timeout=30)
        response.raise_for_status()
        return response.json()["data"]


@pytest.fixture(scope="module")
def jaeger(tmp_path_factory) -> Iterator[Jaeger]:
    if not JAEGER_BIN.exists():
        pytest.skip(f"{JAEGER_BIN} is missing: `make test-ops` builds it")
    otlp_port, query_port = free_port(), free_port()
    loopback_any = "127.0.0.1:0"  # ports the test does not use: anywhere, on loopback only
    args = ["--collector.otlp.grpc.host-port", f"127.0.0.1:{otlp_port}",
            "--query.http-server.host-port", f"127.0.0.1:{query_port}",
            "--collector.otlp.http.host-port", loopback_any, "--collector.grpc-server.host-port", loopback_any,
            "--collector.http-server.host-port", loopback_any, "--query.grpc-server.host-port", loopback_any,
            "--admin.http.host-port", loopback_any]
    log_path = tmp_path_factory.mktemp("jaeger") / "jaeger.log"
    # Jaeger would trace itself otherwise.
    env = {**os.environ, "SPAN_STORAGE_TYPE": "memory", "OTEL_TRACES_SAMPLER": "always_off"}
    with open(log_path, "wb") as log:
        process = subprocess.Popen([str(JAEGER_BIN), *args], stdout=log, stderr=subprocess.STDOUT, env=env,
                                   start_new_session=True)
    instance = Jaeger(f"http://127.0.0.1:{otlp_port}", f"http://127.0.0.1:{query_port}")
    try:
        deadline = time.monotonic() + 60
        while not _answers(f"{instance.query_url}/api/services"):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"Jaeger did not start:\n{log_path.read_text(errors='replace')[-3000:]}")
            time.sleep(0.2)
        yield instance
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _answers(url: str) -> bool:
    try:
        return requests.get(url, timeout=2).status_code == 200
    except requests.ConnectionError:
        return False


def traceparent() -> tuple[str, str, str]:
    """A fresh caller context: (trace id, span id, header value), sampled."""
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return trace_id, span_id, f"00-{trace_id}-{span_id}-01"


def generate(url: str, topic: str, header: str) -> None:
    body = {"inputs": f"Here is a short paragraph about {topic}, written for a curious child:",
            "parameters": {"max_new_tokens": MAX_NEW_TOKENS, "ignore_eos": True}}
    response = requests.post(f"{url}/generate", json=body, headers={"traceparent": header}, timeout=300)
    response.raise_for_status()


def service(trace: dict, span: dict) -> str:
    return trace["processes"][span["processID"]]["serviceName"]


def references(span: dict, kind: str) -> list[tuple[str, str]]:
    return [(ref["traceID"], ref["spanID"]) for ref in span.get("references", []) if ref["refType"] == kind]


def events(span: dict) -> list[dict]:
    """The span's events as {field: value}, the event's name under "event"."""
    return [{field["key"]: field["value"] for field in log["fields"]} for log in span.get("logs", [])]


def wait_for_trace(jaeger: Jaeger, trace_id: str, ready) -> dict:
    deadline = time.monotonic() + EXPORT_WAIT_S
    while True:
        trace = jaeger.trace(trace_id)
        if trace is not None and ready(trace):
            return trace
        if time.monotonic() > deadline:
            raise AssertionError(f"trace {trace_id} incomplete after {EXPORT_WAIT_S} s: {trace}")
        time.sleep(1)


def test_a_request_is_one_connected_trace_across_router_and_shard(jaeger, tmp_path):
    since_us = int(time.time() * 1e6)
    callers = [traceparent() for _ in TOPICS]
    with launch(tmp_path, [*SERVER_ARGS, "--otlp-endpoint", jaeger.otlp_endpoint]) as server:
        with ThreadPoolExecutor(max_workers=len(TOPICS)) as pool:
            list(pool.map(lambda args: generate(server.url, *args), zip(TOPICS, (h for _, _, h in callers))))
        # The engine publishes its figures for a step after the step's last responses went out.
        deadline = time.monotonic() + 30
        while server.metric("superinfer_engine_requests") > 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        rotations = server.metric("superinfer_rotations_out_total")
        bytes_out = server.metric("superinfer_kv_bytes_out_total")
    # Stopping the server flushed both exporters.
    trace_id, caller_span, _ = callers[0]

    # The router's HTTP span continues the caller's trace, as a child of the caller's span.
    request_trace = wait_for_trace(jaeger, trace_id, lambda t: any(s["operationName"] == "POST /generate"
                                                                 for s in t["spans"]))
    [http_span] = [s for s in request_trace["spans"] if s["operationName"] == "POST /generate"]
    assert service(request_trace, http_span) == ROUTER
    assert references(http_span, "CHILD_OF") == [(trace_id, caller_span)]
    request_spans = {s["spanID"] for s in request_trace["spans"]}
    assert all(s["traceID"] == trace_id for s in request_trace["spans"])

    # Step spans are roots of their own traces, linked to the spans of the requests they served.
    step_traces = jaeger.traces(ROUTER, "step", since_us)
    steps = [(t, s) for t in step_traces for s in t["spans"] if s["operationName"] == "step"]
    served = [(t, s) for t, s in steps
              if any(ref_trace == trace_id and ref_span in request_spans
                     for ref_trace, ref_span in references(s, "FOLLOWS_FROM"))]
    # At least its prefill and one step per further token.
    assert len(served) >= MAX_NEW_TOKENS, f"{len(served)} step spans link to the request ({len(steps)} steps)"
    for trace, step in served:
        assert references(step, "CHILD_OF") == []
        # The shard's Step span is a child of the router's step span, its phases under it.
        [shard_step] = [s for s in trace["spans"] if s["operationName"] == "Step"]
        assert service(trace, shard_step) == SHARD
        assert references(shard_step, "CHILD_OF") == [(step["traceID"], step["spanID"])]
        phases = {s["operationName"] for s in trace["spans"]
                  if references(s, "CHILD_OF") == [(shard_step["traceID"], shard_step["spanID"])]}
        assert {"transfers", "forward"} <= phases, phases

    # Every caller's request reached Jaeger as its own trace, linked from steps.
    linked_traces = {ref_trace for _, s in steps for ref_trace, _ in references(s, "FOLLOWS_FROM")}
    assert {caller_trace for caller_trace, _, _ in callers} <= linked_traces

    # Rotations are events on the step spans that started them, with the bytes they move.
    rotation_events = [event for _, s in steps for event in events(s)
                       if event.get("event") in ("rotate_out", "rotate_in")]
    if rotations > 0:
        # One event per rotation, and together they moved what /metrics counted.
        rotated_out = [event for event in rotation_events if event["event"] == "rotate_out"]
        assert len(rotated_out) == rotations, f"{len(rotated_out)} rotate_out events, {rotations} rotations"
        assert sum(event["bytes"] for event in rotated_out) == bytes_out
        assert any(event["event"] == "rotate_in" for event in rotation_events)
        block_bytes = {event["bytes"] / event["blocks"] for event in rotation_events}
        assert len(block_bytes) == 1 and block_bytes.pop() > 0, block_bytes
        assert all("request_id" in event and "transfer_id" in event for event in rotation_events)
    else:
        assert rotation_events == []
