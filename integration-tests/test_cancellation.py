"""A client that disconnects mid-stream is cancelled at once and its KV blocks return to the
pool, as /metrics shows, while the other requests keep running."""
import threading

import requests
from faults import wait_for

STORY = "Count from 1 to 500, separated by commas: 1, 2, 3,"


def stream(url: str, max_new_tokens: int) -> requests.Response:
    body = {"inputs": STORY, "parameters": {"max_new_tokens": max_new_tokens}}
    response = requests.post(f"{url}/generate_stream", json=body, stream=True, timeout=300)
    response.raise_for_status()
    return response


def test_disconnected_stream_frees_its_blocks(server):
    assert wait_for(lambda: server.metric("superinfer_engine_requests") == 0)
    keeper_done = threading.Event()

    def keep_engine_busy():
        with stream(server.url, 64) as response:
            for _ in response.iter_lines():
                pass
        keeper_done.set()

    keeper = threading.Thread(target=keep_engine_busy)
    keeper.start()
    victim = stream(server.url, 400)
    events = victim.iter_lines()
    received = 0
    while received < 3:
        if next(events).startswith(b"data:"):
            received += 1
    assert server.metric("superinfer_engine_requests") == 2
    steps_at_disconnect = server.metric("superinfer_steps_total")
    victim.close()

    assert wait_for(lambda: server.metric("superinfer_engine_requests") <= 1, interval_s=0.02), server.log_tail()
    steps_to_cancel = server.metric("superinfer_steps_total") - steps_at_disconnect
    # The server sees the closed socket on its next write (one or two steps); the engine then
    # frees the request before the following step.
    assert steps_to_cancel <= 4, f"cancelled only after {steps_to_cancel} steps"
    assert not keeper_done.is_set(), "the keeper finished early; the check saw an idle engine"

    keeper.join(timeout=300)
    assert wait_for(lambda: server.metric("superinfer_engine_requests") == 0)
    assert wait_for(lambda: server.metric("superinfer_kv_device_blocks_used") == 0), (
        f"{server.metric('superinfer_kv_device_blocks_used')} device blocks still in use"
    )
