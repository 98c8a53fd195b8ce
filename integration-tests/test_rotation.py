"""Rotation end to end: with a device KV pool far too small for 32 concurrent greedy requests,
the rotating policies move KV caches to host memory and back (swap, rotasched) or drop and
re-prefill them (recompute), and every request still gets exactly the tokens it gets from a
server whose pool holds them all (batching does not change results: test_batching.py).
Clients that disconnect while caches are moving leak no block on either side."""
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from conftest import launch

TOPICS = [
    "rivers", "volcanoes", "bread", "chess", "owls", "glaciers", "violins", "tea", "comets",
    "bridges", "honeybees", "deserts", "lighthouses", "maps", "octopuses", "clocks", "coral",
    "trains", "paper", "thunder", "gardens", "kites", "salt", "mirrors", "wolves", "islands",
    "candles", "rain", "mountains", "bicycles", "libraries", "whales",
]
MAX_NEW_TOKENS = 32
# 16-token blocks: a request needs ~4 blocks by its end (~20 prompt + 32 generated tokens), so
# 32 requests need ~128; 24 device blocks hold about six of them at a time.
SMALL_POOL = ["--device-kv-blocks", "24", "--host-kv-blocks", "512", "--max-batch-tokens", "512"]
LARGE_POOL = ["--device-kv-blocks", "256", "--host-kv-blocks", "16", "--max-batch-tokens", "1024"]
# RotaSched only rotates for punctual requests (a request whose first token is already hopeless
# never displaces others), so the objectives are loose enough that none turns late even on a
# loaded machine: every waiting request then claims blocks, and the running requests with the
# most slack are rotated out for it (~70 rotations for this workload).
PUNCTUAL_SLO = ["--ttft-slo-ms", "30000", "--tbt-slo-ms", "5000"]


def prompt(topic: str) -> str:
    return f"Here is a short paragraph about {topic}, written for a curious child:"


def generate(url: str, text: str) -> list[int]:
    parameters = {"max_new_tokens": MAX_NEW_TOKENS, "details": True, "ignore_eos": True}
    response = requests.post(f"{url}/generate", json={"inputs": text, "parameters": parameters}, timeout=300)
    response.raise_for_status()
    return [token["id"] for token in response.json()["details"]["tokens"]]


def generate_concurrently(url: str, prompts: list[str]) -> list[list[int]]:
    with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
        return list(pool.map(lambda text: generate(url, text), prompts))


def wait_for(condition, timeout_s: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


def assert_pools_drained(server) -> None:
    assert wait_for(lambda: server.metric("superinfer_engine_requests") == 0), server.log_tail()
    for pool in ("device", "host"):
        used = server.metric(f"superinfer_kv_{pool}_blocks_used")
        assert used == 0, f"{used} {pool} KV blocks still in use\n{server.log_tail()}"
    # Host mirrors go with their request.
    assert server.metric("superinfer_kv_host_blocks_mirrored") == 0, server.log_tail()


@pytest.fixture(scope="module")
def prompts() -> list[str]:
    return [prompt(topic) for topic in TOPICS]


@pytest.fixture(scope="module")
def rotasched(tmp_path_factory):
    args = [*SMALL_POOL, *PUNCTUAL_SLO, "--scheduler", "rotasched"]
    with launch(tmp_path_factory.mktemp("rotasched"), args) as server:
        yield server


@pytest.fixture(scope="module")
def reference_outputs(prompts, tmp_path_factory) -> list[list[int]]:
    """The 32 prompts on a pool that holds them all: nothing is ever preempted."""
    with launch(tmp_path_factory.mktemp("reference"), [*LARGE_POOL, "--scheduler", "fcfs"]) as server:
        outputs = generate_concurrently(server.url, prompts)
        moved = server.metric("superinfer_rotations_out_total") + server.metric("superinfer_recomputes_total")
        assert moved == 0, "the reference run preempted requests; its pool is too small"
    return outputs


def test_rotasched_rotates_and_keeps_greedy_outputs(rotasched, prompts, reference_outputs):
    names = ["superinfer_rotations_out_total", "superinfer_rotations_in_total", "superinfer_kv_bytes_out_total",
             "superinfer_kv_bytes_in_total", "superinfer_token_lag_seconds_count",
             *(f"superinfer_slo_{objective}_{verdict}_total" for objective in ("ttft", "tbt") for verdict in ("met", "missed"))]
    before = {name: rotasched.metric(name) for name in names}
    together = generate_concurrently(rotasched.url, prompts)
    # The engine publishes its figures for a step after the step's last responses went out.
    assert wait_for(lambda: rotasched.metric("superinfer_engine_requests") == 0), rotasched.log_tail()
    grew = {name: rotasched.metric(name) - before[name] for name in names}
    rotated_out, rotated_in = grew["superinfer_rotations_out_total"], grew["superinfer_rotations_in_total"]
    assert rotated_out > 0 and rotated_in > 0, f"out {rotated_out}, in {rotated_in}\n{rotasched.log_tail()}"
    # Bytes follow the rotations: every rotation moves at least one block each way.
    assert grew["superinfer_kv_bytes_out_total"] > 0 and grew["superinfer_kv_bytes_in_total"] > 0, grew
    assert grew["superinfer_token_lag_seconds_count"] >= len(prompts) * MAX_NEW_TOKENS, grew
    for objective in ("ttft", "tbt"):
        judged = grew[f"superinfer_slo_{objective}_met_total"] + grew[f"superinfer_slo_{objective}_missed_total"]
        assert judged == len(prompts), f"{judged} requests judged on {objective}, {len(prompts)} finished"
    mismatches = [i for i, (a, b) in enumerate(zip(reference_outputs, together)) if a != b]
    assert not mismatches, f"outputs under rotation differ for prompts {mismatches}"
    assert all(len(tokens) == MAX_NEW_TOKENS for tokens in together)
    assert_pools_drained(rotasched)


@pytest.mark.parametrize(
    ("policy", "counter"),
    [("swap", "superinfer_rotations_out_total"), ("recompute", "superinfer_recomputes_total")],
)
def test_reactive_policies_preempt_and_keep_greedy_outputs(
    policy, counter, prompts, reference_outputs, tmp_path_factory
):
    with launch(tmp_path_factory.mktemp(policy), [*SMALL_POOL, "--scheduler", policy]) as server:
        together = generate_concurrently(server.url, prompts)
        preempted = server.metric(counter)
        assert preempted > 0, f"{counter} = {preempted}\n{server.log_tail()}"
        if policy == "swap":
            assert server.metric("superinfer_rotations_in_total") > 0
        mismatches = [i for i, (a, b) in enumerate(zip(reference_outputs, together)) if a != b]
        assert not mismatches, f"{policy}: outputs differ for prompts {mismatches}"
        assert_pools_drained(server)


def stream_then_maybe_hang_up(url: str, text: str, hang_up_after: int | None) -> int:
    """Streams one generation; closes the connection after `hang_up_after` tokens (None: reads
    to the end). Returns the tokens read."""
    parameters = {"max_new_tokens": MAX_NEW_TOKENS, "ignore_eos": True}
    received = 0
    with requests.post(f"{url}/generate_stream", json={"inputs": text, "parameters": parameters},
                       stream=True, timeout=300) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if line.startswith(b"data:"):
                received += 1
                if hang_up_after is not None and received >= hang_up_after:
                    break
    return received


def test_disconnects_during_rotation_leak_no_blocks(rotasched, prompts):
    out_before = rotasched.metric("superinfer_rotations_out_total")
    rotated_seen = threading.Event()
    finished = threading.Event()

    def watch_rotation():
        while not finished.is_set():
            if rotasched.metric("superinfer_rotated_requests") > 0:
                rotated_seen.set()
            time.sleep(0.02)

    watcher = threading.Thread(target=watch_rotation)
    watcher.start()
    # Every other client hangs up part way, at staggered points, while others are rotated.
    hang_ups = [None if i % 2 else 2 + (i % 11) for i in range(len(prompts))]
    try:
        with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
            received = list(pool.map(lambda args: stream_then_maybe_hang_up(rotasched.url, *args),
                                     zip(prompts, hang_ups)))
    finally:
        finished.set()
        watcher.join()
    assert all(n == MAX_NEW_TOKENS for n, h in zip(received, hang_ups) if h is None)
    assert rotasched.metric("superinfer_rotations_out_total") > out_before, rotasched.log_tail()
    assert rotated_seen.is_set(), "no request was ever rotated out while clients hung up"
    assert_pools_drained(rotasched)


@pytest.mark.parametrize("time_share", [[], ["--time-share", "false"]], ids=["time-shared", "swap-way"])
def test_overloaded_rotasched_keeps_greedy_outputs(prompts, reference_outputs, tmp_path_factory, time_share):
    """Objectives no request on this pool can meet: RotaSched is in its overload mode
    throughout. By default it time-shares the device — requests come back computing in the step
    that copies them in and leave after computing (the copy out after the forward, in the same
    step), copying out only the blocks written since the host last held them (the rest have host
    mirrors); with `--time-share false` it serves the overload as swap does, every copy a step of
    its own. Either way every request gets exactly its tokens and nothing leaks."""
    args = [*SMALL_POOL, "--ttft-slo-ms", "100", "--tbt-slo-ms", "20", "--scheduler", "rotasched", *time_share]
    with launch(tmp_path_factory.mktemp("overloaded"), args) as server:
        together = generate_concurrently(server.url, prompts)
        rotated = server.metric("superinfer_rotations_out_total")
        assert rotated > 0 and server.metric("superinfer_rotations_in_total") > 0, server.log_tail()
        in_step = (server.metric("superinfer_rotations_in_computed_total"),
                   server.metric("superinfer_rotations_out_after_compute_total"))
        if time_share:
            assert in_step == (0, 0), server.log_tail()
        else:
            # Both in-step halves of a rotation happened on the real shard.
            assert in_step[0] > 0 and in_step[1] > 0, server.log_tail()
            # Rotations out reused host mirrors instead of copying those blocks.
            assert server.metric("superinfer_kv_blocks_out_mirrored_total") > 0, server.log_tail()
        mismatches = [i for i, (a, b) in enumerate(zip(reference_outputs, together)) if a != b]
        assert not mismatches, f"outputs differ for prompts {mismatches}"
        assert all(len(tokens) == MAX_NEW_TOKENS for tokens in together)
        assert_pools_drained(server)
