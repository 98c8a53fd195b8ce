"""Bad numbers in every numeric parameter of every generation route: zero, negative zero,
denormals, values past f32/f64 range, integers past 64 bits, and other JSON types. Each must
be answered 2xx or 4xx (TGI's error body), never 5xx; the server must stay healthy after each
one and serve a normal request after each parameter's batch. The server has a small
--max-total-tokens so that whatever is accepted is short. Also: a prompt far too long is
refused from its byte length."""
import collections
import json

import pytest
import requests

from conftest import SERVER_ARGS, launch

BAD_VALUES = [0, -0.0, 1e-45, 1e-320, 1e308, -1e308, 2**64, 10**30, "1", [1], {"a": 1}, None, True]
TGI_PARAMETERS = [
    "best_of", "temperature", "repetition_penalty", "frequency_penalty", "top_k", "top_p",
    "typical_p", "max_new_tokens", "truncate", "seed", "top_n_tokens", "slo.ttft_ms", "slo.tbt_ms",
]
OPENAI_PARAMETERS = [
    "max_tokens", "max_completion_tokens", "temperature", "top_p", "seed", "frequency_penalty",
    "presence_penalty", "repetition_penalty", "n", "slo.ttft_ms", "slo.tbt_ms", "min_p", "min_tokens",
    "truncate_prompt_tokens",
]
# (route, parameter) pairs; each test sends every bad value for one of them.
CASES = (
    [(route, name) for route in ("/generate", "/generate_stream", "/") for name in TGI_PARAMETERS]
    + [(route, name) for route in ("/v1/completions", "/v1/chat/completions") for name in OPENAI_PARAMETERS]
    + [("/v1/chat/completions", "top_logprobs"), ("/tokenize", "truncate"), ("/tokenize", "temperature")]
)
TIMEOUT_S = 60
# A streamed error may only be the request's own fault, or a full server.
STREAMED_ERROR_TYPES = {"validation", "overloaded"}


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    args = [*SERVER_ARGS, "--max-total-tokens", "64"]
    with launch(tmp_path_factory.mktemp("bad-numbers"), args) as server:
        yield server


@pytest.fixture(scope="module")
def statuses():
    """Status counts over the module, printed at its end (`pytest -s` shows them)."""
    counts: collections.Counter = collections.Counter()
    yield counts
    print(f"\nbad numbers: {sum(counts.values())} requests; status counts {dict(sorted(counts.items()))}")


def with_value(body: dict, dotted: str, value) -> dict:
    """`body` with `value` at the dotted path (`slo.tbt_ms` fills the other objective)."""
    *parents, leaf = dotted.split(".")
    target = body
    for parent in parents:
        target = target.setdefault(parent, {"ttft_ms": 1000, "tbt_ms": 1000})
    target[leaf] = value
    return body


def request_body(route: str, name: str, value) -> dict:
    if route.startswith("/v1/"):
        # Short output unless the parameter under test is the limit itself.
        body = {"max_tokens": 2} if name not in ("max_tokens", "max_completion_tokens") else {}
        if route == "/v1/completions":
            body["prompt"] = "one two"
        else:
            body["messages"] = [{"role": "user", "content": "one two"}]
            if name == "top_logprobs":
                body["logprobs"] = True
        return with_value(body, name, value)
    parameters = {"max_new_tokens": 2} if name != "max_new_tokens" else {}
    body = {"inputs": "one two", "parameters": with_value(parameters, name, value)}
    if route == "/":
        body["stream"] = False
    return body


def check_error_body(text: str, context: str) -> dict:
    body = json.loads(text)
    assert isinstance(body, dict) and set(body) == {"error", "error_type"}, f"{context}: {text}"
    assert isinstance(body["error"], str) and isinstance(body["error_type"], str), f"{context}: {text}"
    return body


def check_answer(response: requests.Response, context: str) -> None:
    status = response.status_code
    assert 200 <= status < 500, f"{context}: {status} {response.text[:300]}"
    if status >= 400:
        check_error_body(response.text, context)
        return
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        for line in response.text.splitlines():
            if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                continue
            event = json.loads(line[5:])
            if "error" in event:
                error_type = check_error_body(line[5:], context)["error_type"]
                assert error_type in STREAMED_ERROR_TYPES, f"{context}: {line}"


def normal_request(server) -> None:
    body = {"inputs": "Hello", "parameters": {"max_new_tokens": 2}}
    response = requests.post(f"{server.url}/generate", json=body, timeout=TIMEOUT_S)
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("route,name", CASES, ids=[f"{route}:{name}" for route, name in CASES])
def test_bad_numbers_are_answered_and_leave_the_server_healthy(small, statuses, route, name):
    for value in BAD_VALUES:
        context = f"POST {route} {name}={value!r}"
        response = requests.post(small.url + route, json=request_body(route, name, value), timeout=TIMEOUT_S)
        statuses[response.status_code] += 1
        check_answer(response, context)
        status, text = small.get("/health")
        assert status == 200, f"after {context}: /health {status} {text}\n{small.log_tail()}"
    normal_request(small)


def test_a_prompt_far_too_long_is_refused_from_its_byte_length(small):
    # 63 tokens of at most 162 bytes (SmolLM2's longest) hold at most 10,206 bytes.
    response = requests.post(f"{small.url}/generate", json={"inputs": "x" * 20_000}, timeout=TIMEOUT_S)
    assert response.status_code == 422
    assert response.json()["error"].startswith(
        "Input validation error: `inputs` must have less than 63 tokens. Given: 20000 bytes")
    truncated = {"inputs": "x" * 20_000, "parameters": {"truncate": 8, "max_new_tokens": 2}}
    assert requests.post(f"{small.url}/generate", json=truncated, timeout=TIMEOUT_S).status_code == 200
