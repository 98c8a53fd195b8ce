"""The failure model through the real server (docs/architecture.md, "Failure model"): a bad
request fails only itself; a stalled shard fails the requests it held within the step deadline
and the server serves again once it answers; a shard that does not come back, or dies, makes
the launcher exit non-zero; SIGTERM lets the streams in flight finish and exits 0.

The tests of the first server run in file order and share it; the last one stops it."""
import signal
import time

import pytest
import requests

from conftest import SERVER_ARGS, launch
from faults import Stream, children, health, send, wait_for

# Long enough that a 16-stream step on a loaded 2-core machine never hits it (3 s did once, with
# a build beside the tests); the stall tests' deadlines are derived from it.
STEP_TIMEOUT_S = 6.0
FLAGS = [*SERVER_ARGS, "--step-timeout-s", str(STEP_TIMEOUT_S), "--shard-recovery-timeout-s", "60",
         "--graceful-termination-timeout-s", "120"]
PROMPT = "Count from 1 to 500, separated by commas: 1, 2, 3,"


def generate(url: str, parameters: dict, timeout_s: float = 120) -> requests.Response:
    body = {"inputs": PROMPT, "parameters": {"max_new_tokens": 4, **parameters}}
    return requests.post(f"{url}/generate", json=body, timeout=timeout_s)


def assert_serving(url: str) -> None:
    response = generate(url, {"max_new_tokens": 2})
    assert response.status_code == 200, response.text
    assert health(url) == 200


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with launch(tmp_path_factory.mktemp("failure-model"), FLAGS) as instance:
        yield instance


def test_a_tiny_temperature_samples_greedily_and_the_server_keeps_serving(server):
    greedy = generate(server.url, {"max_new_tokens": 8})
    assert greedy.status_code == 200, greedy.text
    for temperature in (1e-44, 1e-30, 1e-6):
        response = generate(server.url, {"max_new_tokens": 8, "temperature": temperature})
        assert response.status_code == 200, (temperature, response.text)
        assert response.json()["generated_text"] == greedy.json()["generated_text"], temperature
        assert_serving(server.url)


def test_an_objective_too_large_is_refused_and_a_large_one_is_served(server):
    response = generate(server.url, {"slo": {"ttft_ms": 1e30, "tbt_ms": 100}})
    assert response.status_code == 422, response.text
    assert response.json()["error_type"] == "validation"
    assert_serving(server.url)
    hour = 3_600_000
    response = generate(server.url, {"max_new_tokens": 2, "slo": {"ttft_ms": hour, "tbt_ms": hour}})
    assert response.status_code == 200, response.text
    assert_serving(server.url)


def test_an_idle_stall_longer_than_the_health_probe_is_not_permanent(server):
    shard = children(server.process.pid)["shard"]
    send(shard, signal.SIGSTOP)
    try:
        # The engine's probe waits 10 s for the stopped shard, then reports it failed.
        statuses = [health(server.url, timeout_s=20) for _ in range(2)]
    finally:
        send(shard, signal.SIGCONT)
    assert 503 in statuses, statuses
    assert wait_for(lambda: health(server.url) == 200, timeout_s=60), server.log_tail()
    assert_serving(server.url)


def test_a_stall_fails_the_streams_in_flight_within_the_deadline_then_recovers(server):
    shard = children(server.process.pid)["shard"]
    streams = [Stream(server.url, {"inputs": PROMPT, "parameters": {"max_new_tokens": 300}}).start()
               for _ in range(3)]
    for stream in streams:
        assert stream.first_token.wait(120), server.log_tail()
    send(shard, signal.SIGSTOP)
    stopped_at = time.monotonic()
    try:
        for stream in streams:
            assert stream.join(STEP_TIMEOUT_S + 30), "a stream hung on a stopped shard"
        # Refused while recovering, with TGI's shape, at once, and when to retry (the next probe).
        refused = generate(server.url, {}, timeout_s=10)
        assert refused.status_code == 503, refused.text
        assert refused.json()["error_type"] == "unavailable"
        assert refused.headers["retry-after"] == "1", refused.headers
        assert health(server.url, timeout_s=5) == 503
    finally:
        send(shard, signal.SIGCONT)
    for stream in streams:
        assert stream.error is not None and stream.final is None, (stream.error, stream.failure)
        assert stream.error["error_type"] == "generation", stream.error
        # A step already under way when the shard stopped can add up to one step deadline.
        assert stream.ended_at - stopped_at < 2 * STEP_TIMEOUT_S + 5, stream.ended_at - stopped_at
    assert wait_for(lambda: health(server.url) == 200, timeout_s=60), server.log_tail()
    assert_serving(server.url)
    assert wait_for(lambda: server.metric("superinfer_kv_device_blocks_used") == 0, timeout_s=30)


def test_sigterm_lets_the_streams_in_flight_finish_and_exits_zero(server):
    streams = [Stream(server.url, {"inputs": f"{PROMPT} {i}", "parameters": {"max_new_tokens": 24}}).start()
               for i in range(16)]
    assert wait_for(lambda: server.metric("superinfer_engine_requests") == 16, timeout_s=60)
    server.process.send_signal(signal.SIGTERM)
    # Draining: new requests are refused with 503 while the 16 run on, with no time to retry
    # here (the server is going away).
    last = {}

    def refused() -> bool:
        last["response"] = generate(server.url, {}, timeout_s=10)
        return last["response"].status_code == 503

    assert wait_for(refused, timeout_s=10)
    assert "retry-after" not in last["response"].headers, last["response"].headers
    for stream in streams:
        assert stream.join(300), "a stream did not end"
        assert stream.final is not None, (stream.error, stream.failure, stream.tokens)
        assert stream.final["details"]["generated_tokens"] == 24
    assert server.process.wait(timeout=60) == 0, server.log_tail()


def test_streams_left_when_the_grace_ends_get_an_error_event_and_the_launcher_exits_zero(tmp_path):
    with launch(tmp_path, [*SERVER_ARGS, "--graceful-termination-timeout-s", "2"]) as server:
        stream = Stream(server.url, {"inputs": PROMPT, "parameters": {"max_new_tokens": 300}}).start()
        assert stream.first_token.wait(120), server.log_tail()
        server.process.send_signal(signal.SIGTERM)
        assert stream.join(60), "the stream hung"
        # An error event the client can read, not a response cut off by a closed connection.
        assert stream.failure is None and stream.error is not None, (stream.failure, stream.final)
        assert server.process.wait(timeout=60) == 0, server.log_tail()


@pytest.mark.parametrize("fault", ["stall past the recovery bound", "kill"])
def test_a_shard_that_does_not_come_back_makes_the_launcher_exit_non_zero(tmp_path, fault):
    flags = [*SERVER_ARGS, "--step-timeout-s", "2", "--shard-recovery-timeout-s", "5"]
    with launch(tmp_path, flags) as server:
        shard = children(server.process.pid)["shard"]
        stream = Stream(server.url, {"inputs": PROMPT, "parameters": {"max_new_tokens": 300}}).start()
        assert stream.first_token.wait(120), server.log_tail()
        send(shard, signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
        assert stream.join(30), "the stream hung"
        assert stream.error is not None or stream.failure is not None, stream
        started = time.monotonic()
        code = server.process.wait(timeout=60)
        assert code != 0, server.log_tail()
        print(f"{fault}: the launcher exited with {code} {time.monotonic() - started:.1f} s after the stream failed")
