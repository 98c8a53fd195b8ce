"""One step in flight (`--async-scheduling`): the router sends step N+1 while the shard
computes step N, and applies stops one step late. Through the public API nothing changes for
greedy requests: a server with the flag answers a concurrent mix — prompts of different
lengths, stop sequences, EOS, max_new_tokens from 1 to 40, streamed and not, a grammar —
exactly as one without it, never streams a token past a stop, and leaks no block (a small
pool, so requests are rotated or recomputed while steps are in flight)."""
import json
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from conftest import launch

POOL = ["--device-kv-blocks", "40", "--host-kv-blocks", "512", "--max-batch-tokens", "512",
        "--ttft-slo-ms", "30000", "--tbt-slo-ms", "5000"]
WORDS = ["rivers", "volcanoes", "bread", "chess", "owls", "glaciers", "violins", "tea", "comets", "bridges",
         "honeybees", "deserts", "lighthouses", "maps", "octopuses", "clocks", "coral", "trains", "paper", "thunder"]


def cases() -> list[dict]:
    out = []
    for i, word in enumerate(WORDS * 2):
        text = f"Here is a paragraph about {word}" + ", and about its history" * (i % 7) + ":"
        parameters = {"max_new_tokens": 1 + (i * 13) % 40, "details": True, "ignore_eos": i % 3 == 0}
        if i % 4 == 1:
            parameters["stop"] = [" the", "."]
        out.append({"inputs": text, "parameters": parameters, "stream": i % 5 == 2})
    # A grammar: never scheduled ahead, same answer.
    out.append({"inputs": "A digit:", "parameters": {"max_new_tokens": 8, "details": True,
                                                      "grammar": {"type": "regex", "value": "[0-9]{3}"}}})
    return out


def run(url: str, case: dict) -> dict:
    if case.get("stream"):
        body = {k: v for k, v in case.items() if k != "stream"}
        tokens, final = [], None
        with requests.post(f"{url}/generate_stream", json=body, stream=True, timeout=300) as response:
            response.raise_for_status()
            for line in response.iter_lines():
                if line.startswith(b"data:"):
                    event = json.loads(line[5:])
                    tokens.append(event["token"]["id"])
                    if event.get("generated_text") is not None:
                        final = event
        return {"tokens": tokens, "text": final["generated_text"], "finish": final["details"]["finish_reason"]}
    response = requests.post(f"{url}/generate", json=case, timeout=300)
    response.raise_for_status()
    answer = response.json()
    return {"tokens": [t["id"] for t in answer["details"]["tokens"]], "text": answer["generated_text"],
            "finish": answer["details"]["finish_reason"]}


def serve_all(url: str) -> list[dict]:
    with ThreadPoolExecutor(max_workers=16) as pool:
        return list(pool.map(lambda case: run(url, case), cases()))


def assert_pools_drained(server) -> None:
    deadline = time.monotonic() + 60
    while server.metric("superinfer_engine_requests") != 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    for pool in ("device", "host"):
        used = server.metric(f"superinfer_kv_{pool}_blocks_used")
        assert used == 0, f"{used} {pool} KV blocks still in use\n{server.log_tail()}"


@pytest.fixture(scope="module")
def answers(tmp_path_factory) -> dict[str, list[dict]]:
    out = {}
    for name, flags in (("sync", []), ("async", ["--async-scheduling"])):
        with launch(tmp_path_factory.mktemp(name), POOL + flags) as server:
            out[name] = serve_all(server.url)
            out[name + "-again"] = serve_all(server.url)
            out[name + "-beside-a-grammar"] = tokens_beside_a_grammar(server.url)
            assert_pools_drained(server)
    return out


def tokens_beside_a_grammar(url: str) -> tuple[int, int]:
    """A long free request streams; once it decodes, a request under a grammar joins it. Returns
    the gaps between the constrained request's tokens and how many tokens the free one got in
    them: one each while a grammar holds the engine to one step at a time, two each if the
    constrained request were scheduled every other step while steps ran ahead."""
    stamps: dict[str, list[float]] = {"free": [], "grammar": []}

    def stream(name: str, body: dict) -> None:
        with requests.post(f"{url}/generate_stream", json=body, stream=True, timeout=300) as response:
            response.raise_for_status()
            for line in response.iter_lines():
                if line.startswith(b"data:"):
                    stamps[name].append(time.monotonic())

    free = {"inputs": "Here is a paragraph about rivers:", "parameters": {"max_new_tokens": 80, "ignore_eos": True}}
    grammar = {"inputs": "A number:", "parameters": {"max_new_tokens": 12,
                                                     "grammar": {"type": "regex", "value": "[0-9]{12}"}}}
    with ThreadPoolExecutor(max_workers=2) as pool:
        free_done = pool.submit(stream, "free", free)
        while len(stamps["free"]) < 3 and not free_done.done():
            time.sleep(0.005)
        pool.submit(stream, "grammar", grammar).result()
        free_done.result()
    first, last = stamps["grammar"][0], stamps["grammar"][-1]
    assert stamps["free"][-1] > last, "the free request ended before the constrained one"
    return len(stamps["grammar"]) - 1, sum(first < t <= last for t in stamps["free"])


def test_greedy_answers_are_identical_with_one_step_in_flight(answers):
    for i, (one, other) in enumerate(zip(answers["sync"], answers["async"])):
        assert one == other, f"case {i}: {cases()[i]}"
    # The mix exercised what it should: stops, limits and a grammar all ended requests.
    finishes = {a["finish"] for a in answers["async"]}
    assert {"length", "stop_sequence"} <= finishes, finishes
    assert answers["async"] == answers["async-again"]


def test_no_token_is_streamed_past_a_stop(answers):
    for case, answer in zip(cases(), answers["async"]):
        limit = case["parameters"]["max_new_tokens"]
        assert len(answer["tokens"]) <= limit
        if answer["finish"] == "stop_sequence":
            assert any(answer["text"].endswith(stop) for stop in case["parameters"]["stop"]), answer


def test_a_grammar_is_served_every_step_with_one_step_in_flight(answers):
    for name in ("sync", "async"):
        gaps, others = answers[name + "-beside-a-grammar"]
        assert gaps == 11
        # Every step computed both (11 gaps, 11 tokens of the other; a token's delivery may
        # jitter across a boundary), not the free request twice per constrained token.
        assert others <= gaps + 3, (name, gaps, others)
