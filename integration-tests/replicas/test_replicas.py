"""Three replicas on loopback behind the real vllm-router (the pinned PyPI release, started as
its own process with `--worker-urls`, no adapter in between): load spreads under its
`round_robin` and `power_of_two` policies (counted from each replica's own /metrics), a request
one replica refuses (429, SLO admission) is retried on another, TGI's and OpenAI's routes work
through it, a replica drained with SIGTERM finishes what it accepted and leaves the pool, and a
replica killed with SIGKILL costs at most the requests it held.

The third replica runs `--admission slo` with a default first-token objective so far away that
it admits every ordinary request; a request carrying its own 1 ms objective is refused there
(and admitted by the two others, which admit everything)."""
import concurrent.futures
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests
from text_generation import Client

from conftest import free_port, launch
from faults import wait_for

# The router installed beside the Python the tests run under (.venv-clients).
VLLM_ROUTER = Path(os.environ.get("VLLM_ROUTER_BIN", Path(sys.executable).with_name("vllm-router")))
# Small pools and batches (a shorter warm-up): three replicas share two cores and start side by
# side; the requests here are short, but two cores shared by three replicas under load can take
# over a second a token, so the drain is given far more than the requests held need.
REPLICA_ARGS = ["--device-kv-blocks", "128", "--host-kv-blocks", "64", "--max-batch-tokens", "256",
                "--max-batch-requests", "16", "--router-startup-timeout-s", "600",
                "--graceful-termination-timeout-s", "180"]
REFUSING_ARGS = ["--admission", "slo", "--ttft-slo-ms", "600000"]
# Unreachable anywhere: a replica under SLO admission refuses it, the others serve it.
TIGHT_SLO = {"ttft_ms": 1, "tbt_ms": 1000}
ROUTER_START_S = 60
CHAT = {"model": "tgi", "messages": [{"role": "user", "content": "Say something."}], "max_tokens": 4}


def success_count(replica) -> float:
    return replica.metric("superinfer_request_success")


def reported_load(replica) -> int:
    """The `load` the replica's `/get_load` reports: what power_of_two compares."""
    return requests.get(f"{replica.url}/get_load", timeout=10).json()["load"]


def in_flight(replica) -> float:
    """Requests the replica has received and not yet answered, from one scrape (counters read
    from separate scrapes undercount when a request finishes between them)."""
    status, text = replica.get("/metrics")
    assert status == 200, text[:200]

    def total(name: str) -> float:
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith((f"{name} ", f"{name}{{")))

    return total("superinfer_request_count") - total("superinfer_request_success") \
        - total("superinfer_request_failure")


@contextlib.contextmanager
def vllm_router(log_dir: Path, worker_urls: list[str], policy: str, *extra: str, log_level: str = "warning"):
    """vllm-router in front of `worker_urls`; yields its URL once it answers /readiness. Its log:
    `log_dir/vllm-router-{policy}-{port}.log`."""
    port, metrics_port = free_port(), free_port()
    argv = [str(VLLM_ROUTER), "--host", "127.0.0.1", "--port", str(port), "--worker-urls", *worker_urls,
            "--policy", policy, "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port),
            # Health checks every second, a worker out after two failures: a drained or killed
            # replica leaves the pool within seconds.
            "--health-check-endpoint", "/health", "--health-check-interval-secs", "1",
            "--health-failure-threshold", "2", "--worker-startup-check-interval", "1",
            "--log-level", log_level, *extra]
    log_path = log_dir / f"vllm-router-{policy}-{port}.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + ROUTER_START_S
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"vllm-router exited with {process.returncode}:\n{log_path.read_text()[-3000:]}")
            with contextlib.suppress(requests.RequestException):
                if requests.get(f"{url}/readiness", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"vllm-router not ready after {ROUTER_START_S} s:\n{log_path.read_text()[-3000:]}")
            time.sleep(0.2)
        yield url
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


@pytest.fixture(scope="module")
def replicas(tmp_path_factory):
    """Three replicas, started side by side; the third under SLO admission."""
    assert VLLM_ROUTER.exists(), f"{VLLM_ROUTER} missing: `make clients` installs vllm-router"
    with contextlib.ExitStack() as stack, concurrent.futures.ThreadPoolExecutor(3) as pool:
        args = [REPLICA_ARGS, REPLICA_ARGS, REPLICA_ARGS + REFUSING_ARGS]
        starts = [pool.submit(stack.enter_context, launch(tmp_path_factory.mktemp(f"replica{i}"), a))
                  for i, a in enumerate(args)]
        yield [start.result() for start in starts]


@pytest.fixture(scope="module")
def router_logs(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("vllm-router")


def chat(url: str, body: dict = CHAT, timeout: float = 120) -> requests.Response:
    return requests.post(f"{url}/v1/chat/completions", json=body, timeout=timeout)


def run_concurrently(count: int, workers: int, request) -> list:
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        return list(pool.map(lambda _: request(), range(count)))


# The least share of 30 requests each replica serves: round robin deals them out in turn;
# power_of_two sends each to the less loaded of two replicas by the `/get_load` it last polled
# (every `--worker-startup-check-interval`), so a replica that answers faster, or read idle at
# the last poll, rightly takes more (a run gave 5, 8, 17); it must still reach every replica.
LEAST_SHARE = {"round_robin": 0.2 * 30, "power_of_two": 1}


@pytest.mark.parametrize("policy", ["round_robin", "power_of_two"])
def test_load_spreads_over_every_replica(replicas, router_logs, policy):
    with vllm_router(router_logs, [r.url for r in replicas], policy) as url:
        before = [success_count(r) for r in replicas]
        responses = run_concurrently(30, 6, lambda: chat(url))
        assert [r.status_code for r in responses] == [200] * 30, [r.text for r in responses if r.status_code != 200][:3]
        served = [success_count(r) - b for r, b in zip(replicas, before)]
    assert sum(served) == 30, served
    assert all(count >= LEAST_SHARE[policy] for count in served), f"{policy}: {served} requests per replica"


def test_power_of_two_steers_clear_of_a_replica_its_load_shows_busy(replicas, router_logs):
    """Three long streams held on one replica directly (not through the router): its `/get_load`
    reads 3, the others at most 2 (two requests in flight through the router), so it loses every
    pair it is drawn in and the router's requests go to the two others, each drawn in two pairs
    of three."""
    busy = replicas[0]
    # As long as the replica allows: they must outlast the router's requests.
    longest = requests.get(f"{busy.url}/info", timeout=10).json()["max_total_tokens"] - 8
    body = {"inputs": "Count:", "parameters": {"max_new_tokens": longest, "ignore_eos": True}}
    with contextlib.ExitStack() as held:
        for _ in range(3):
            stream = held.enter_context(requests.post(f"{busy.url}/generate_stream", json=body, stream=True, timeout=300))
            assert stream.status_code == 200, stream.text
        assert wait_for(lambda: reported_load(busy) == 3, timeout_s=60)
        with vllm_router(router_logs, [r.url for r in replicas], "power_of_two") as url:
            time.sleep(3)  # three polls of every replica's load
            before = [r.metric("superinfer_request_count") for r in replicas]
            responses = run_concurrently(24, 2, lambda: chat(url))
            received = [r.metric("superinfer_request_count") - b for r, b in zip(replicas, before)]
            still_busy = reported_load(busy)
    # The held streams were closed: the replica lets them go (and the tests after start idle).
    assert wait_for(lambda: reported_load(busy) == 0, timeout_s=60)
    assert [r.status_code for r in responses] == [200] * 24, [r.text for r in responses if r.status_code != 200][:3]
    assert still_busy == 3, "the held streams ended before the router's requests did: hold longer ones"
    assert received[0] == 0 and received[1] >= 1 and received[2] >= 1 and sum(received) == 24, received


def test_get_load_and_server_info_are_what_the_router_reads(replicas):
    replica = replicas[0]
    info = requests.get(f"{replica.url}/get_server_info", timeout=10).json()
    assert info["kv_block_size"] > 0 and info["num_device_blocks"] == 128, info
    assert len({requests.get(f"{r.url}/get_server_info", timeout=10).json()["instance_id"] for r in replicas}) == 3
    assert reported_load(replica) == 0
    # While streams run, the load counts them.
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        body = {"inputs": "Count:", "parameters": {"max_new_tokens": 40, "ignore_eos": True}}
        streams = [pool.submit(requests.post, f"{replica.url}/generate", json=body, timeout=300) for _ in range(2)]
        peak = 0
        while not all(s.done() for s in streams):
            peak = max(peak, reported_load(replica))
            time.sleep(0.05)
        assert all(s.result().status_code == 200 for s in streams)
    assert peak == 2, peak
    assert requests.get(f"{replica.url}/health_generate", timeout=60).status_code == 200


def test_a_refused_request_spills_over_to_another_replica(replicas, router_logs):
    refusing = replicas[2]
    direct = chat(refusing.url, {**CHAT, "slo": TIGHT_SLO})
    assert direct.status_code == 429, direct.text
    with vllm_router(router_logs, [r.url for r in replicas], "round_robin",
                     "--retry-max-retries", "5", "--retry-initial-backoff-ms", "10") as url:
        refused_before = refusing.metric("superinfer_admission_refused_total")
        served_before = [success_count(r) for r in replicas]
        responses = run_concurrently(12, 3, lambda: chat(url, {**CHAT, "slo": TIGHT_SLO}))
        assert [r.status_code for r in responses] == [200] * 12, [r.text for r in responses if r.status_code != 200][:3]
        assert all(r.json()["choices"][0]["message"]["content"] for r in responses)
        # Streams too: the replica refuses one before it starts, with 429 rather than 200 and an
        # error event, so the router retries it.
        refused = refusing.metric("superinfer_admission_refused_total") - refused_before
        streamed = run_concurrently(6, 3, lambda: stream_chat(url, 4, extra={"slo": TIGHT_SLO}))
        assert streamed == [None] * 6, streamed
        served = [success_count(r) - b for r, b in zip(replicas, served_before)]
        refused_streams = refusing.metric("superinfer_admission_refused_total") - refused_before - refused
    # Round robin sent a third of them to the refusing replica first; all were answered elsewhere.
    assert served[2] == 0 and served[0] + served[1] == 18, served
    assert refused >= 1 and refused_streams >= 1, (refused, refused_streams)


def test_tgi_and_openai_routes_through_the_router(replicas, router_logs):
    with vllm_router(router_logs, [r.url for r in replicas], "round_robin") as url:
        # vllm-router parses /generate as its own type, whose prompt field is `text` (it drops
        # TGI's `inputs`); the replica reads `text` as `inputs`.
        response = requests.post(f"{url}/generate", json={"text": "Hello", "parameters": {"max_new_tokens": 4}}, timeout=60)
        assert response.status_code == 200, response.text
        assert response.json()["generated_text"]
        dropped = requests.post(f"{url}/generate", json={"inputs": "Hello", "parameters": {"max_new_tokens": 4}}, timeout=60)
        assert dropped.status_code == 422, "vllm-router now forwards `inputs`: docs/deploy.md can drop its note"
        # /generate_stream and / are not the router's routes: it forwards them as they are.
        response = requests.post(f"{url}/generate_stream", json={"inputs": "Hello", "parameters": {"max_new_tokens": 4}},
                                 stream=True, timeout=60)
        assert response.status_code == 200, response.text
        events = [json.loads(line[5:]) for line in response.iter_lines() if line.startswith(b"data:")]
        assert len(events) == 4 and events[-1]["generated_text"], events
        client = Client(url, timeout=60)
        assert client.generate("Hello", max_new_tokens=4).generated_text
        streamed = list(client.generate_stream("Hello", max_new_tokens=4))
        assert len(streamed) == 4 and streamed[-1].generated_text
        response = chat(url)
        assert response.status_code == 200, response.text
        assert response.json()["choices"][0]["message"]["content"]
        response = requests.post(f"{url}/v1/chat/completions", json={**CHAT, "stream": True}, stream=True, timeout=60)
        assert response.status_code == 200
        assert [line for line in response.iter_lines() if line][-1] == b"data: [DONE]"


def stream_chat(url: str, max_tokens: int, answered=lambda: None, extra: dict | None = None) -> str | None:
    """A streamed chat completion (`extra` added to its body); None when it completed (a finish
    reason, then [DONE]), else what went wrong. `answered` is called once the response headers
    came, or the request failed without them."""
    body = {**CHAT, "max_tokens": max_tokens, "stream": True, **(extra or {})}
    try:
        try:
            response = requests.post(f"{url}/v1/chat/completions", json=body, stream=True, timeout=120)
        finally:
            answered()
        if response.status_code != 200:
            return f"{response.status_code}: {response.text[:200]}"
        finished, done = False, False
        for line in response.iter_lines():
            if line == b"data: [DONE]":
                done = True
            elif line.startswith(b"data:"):
                chunk = json.loads(line[5:])
                if "error" in chunk:
                    return f"error event: {chunk}"
                finished |= bool(chunk["choices"] and chunk["choices"][0].get("finish_reason"))
        return None if finished and done else f"cut short (finish reason: {finished}, [DONE]: {done})"
    except (requests.RequestException, ValueError) as error:
        return repr(error)


class Load:
    """Streams sent back to back by `workers` threads until stopped; collects each outcome."""

    def __init__(self, url: str, workers: int, max_tokens: int):
        self.url, self.max_tokens, self.outcomes, self.stopped = url, max_tokens, [], False
        # Streams sent so far, and those sent that have no response headers yet: a replica
        # counts a request as received before it answers the headers, so only these may still
        # reach a replica after its counters were read.
        self.lock, self.started, self.unanswered = threading.Lock(), 0, 0
        self.pool = concurrent.futures.ThreadPoolExecutor(workers)
        self.loops = [self.pool.submit(self.loop) for _ in range(workers)]

    def loop(self):
        while not self.stopped:
            with self.lock:
                self.started += 1
                self.unanswered += 1
            self.outcomes.append(stream_chat(self.url, self.max_tokens, self.answered))

    def answered(self):
        with self.lock:
            self.unanswered -= 1

    def counts(self) -> tuple[int, int]:
        with self.lock:
            return self.started, self.unanswered

    def stop(self) -> list:
        self.stopped = True
        for loop in self.loops:
            loop.result()
        self.pool.shutdown()
        return self.outcomes


def kill_replica(replica) -> None:
    """SIGKILL to every process of a replica at once: the launcher and the router and shard it
    started (each in a session of its own, so not in the launcher's process group)."""
    children = Path(f"/proc/{replica.process.pid}/task/{replica.process.pid}/children").read_text().split()
    for pid in [*map(int, children), replica.process.pid]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    replica.process.wait(timeout=30)


def router_worker_health(url: str) -> dict[str, bool]:
    return {w["url"]: w["is_healthy"] for w in requests.get(f"{url}/workers", timeout=10).json()["workers"]}


def test_a_replica_drained_with_sigterm_finishes_its_requests_and_leaves_the_pool(replicas, router_logs):
    draining = replicas[0]
    with vllm_router(router_logs, [r.url for r in replicas], "round_robin") as url:
        load = Load(url, workers=6, max_tokens=24)
        try:
            assert wait_for(lambda: in_flight(draining) >= 1, timeout_s=60), "the replica holds a request"
            held = in_flight(draining)
            draining.process.send_signal(signal.SIGTERM)
            assert wait_for(lambda: not router_worker_health(url).get(draining.url, True), timeout_s=30), \
                       "the router takes the draining replica out of its pool"
            assert draining.process.wait(timeout=240) == 0, draining.log_tail()
            finished_at = len(load.outcomes)
            assert wait_for(lambda: len(load.outcomes) >= finished_at + 6, timeout_s=120), "the others serve more streams"
        finally:
            outcomes = load.stop()
    errors = [o for o in outcomes if o is not None]
    assert held >= 1 and not errors, f"{len(errors)} of {len(outcomes)} streams failed: {errors[:3]}"


def test_a_killed_replica_costs_at_most_the_requests_it_held(replicas, router_logs):
    alive = [r for r in replicas if r.process.poll() is None]
    assert len(alive) >= 2, "the drain test left fewer than two replicas"
    killed = alive[0]
    with vllm_router(router_logs, [r.url for r in alive], "round_robin") as url:
        load = Load(url, workers=6, max_tokens=24)
        try:
            assert wait_for(lambda: in_flight(killed) >= 1, timeout_s=60), "the replica holds a request"
            # What the replica held when killed: its count, plus every stream that could still
            # reach it between the count and the kill (sent, not yet answered, or sent later).
            started, unanswered = load.counts()
            held = in_flight(killed)
            kill_replica(killed)
            held += unanswered + load.counts()[0] - started
            before = len(load.outcomes)
            assert wait_for(lambda: not router_worker_health(url).get(killed.url, True), timeout_s=30), \
                       "the router takes the killed replica out of its pool"
            assert wait_for(lambda: len(load.outcomes) >= before + 6, timeout_s=120), "the others serve more streams"
            after_removal = len(load.outcomes)
        finally:
            outcomes = load.stop()
    errors = [o for o in outcomes if o is not None]
    assert len(errors) <= held, f"{len(errors)} streams failed, the replica held {held}: {errors[:3]}"
    assert all(o is None for o in outcomes[after_removal:]), "streams failed after the replica left the pool"
    assert len(outcomes) - len(errors) > 6
