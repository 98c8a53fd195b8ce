"""Every validation rule, limit and guard answers TGI's status code and message through the
real server (its own instance, launched with an API key in its environment and small limits),
and TGI's and OpenAI's clients raise the matching errors."""
import json
import subprocess

import openai
import pytest
import requests
from text_generation import Client
from text_generation.errors import OverloadedError, ValidationError

from conftest import SERVER_ARGS, launch

API_KEY = "validation-secret"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
LIMITS = [
    "--max-concurrent-requests", "1", "--max-input-tokens", "32",
    "--max-total-tokens", "64", "--max-stop-sequences", "2", "--max-best-of", "2",
    "--max-top-n-tokens", "3", "--payload-limit", "4000", "--max-client-batch-size", "2",
]


@pytest.fixture(scope="module")
def guarded(tmp_path_factory):
    env = {"API_KEY": API_KEY}
    with launch(tmp_path_factory.mktemp("guarded"), [*SERVER_ARGS, *LIMITS], env=env) as server:
        yield server


def post(server, path, body, headers=AUTH, **kwargs):
    return requests.post(server.url + path, json=body, headers=headers, timeout=120, **kwargs)


def validation_error(message):
    return {"error": f"Input validation error: {message}", "error_type": "validation"}


RULES = [
    ({"temperature": 0.0}, "`temperature` must be strictly positive"),
    ({"repetition_penalty": 0.0}, "`repetition_penalty` must be strictly positive"),
    ({"frequency_penalty": 3.0}, "`frequency_penalty` must be >= -2.0 and <= 2.0"),
    ({"top_p": 1.0}, "`top_p` must be > 0.0 and < 1.0"),
    ({"typical_p": 0.0}, "`typical_p` must be > 0.0 and < 1.0"),
    ({"top_k": 0}, "`top_k` must be strictly positive"),
    ({"max_new_tokens": 0}, "`max_new_tokens` must be strictly positive"),
    ({"stop": ["a", "b", "c"]}, "`stop` supports up to 2 stop sequences. Given: 3"),
    ({"top_n_tokens": 4}, "`top_n_tokens` must be >= 0 and <= 3. Given: 4"),
    ({"truncate": 0}, "`truncate` must be strictly positive and less than 32. Given: 0"),
    ({"best_of": 3, "do_sample": True}, "`best_of` must be > 0 and <= 2. Given: 3"),
    ({"best_of": 2}, "you must use sampling when `best_of` is > 1"),
    ({"best_of": 2, "do_sample": True, "seed": 1}, "`seed` must not be set when `best_of` > 1"),
    ({"max_new_tokens": 60}, "`inputs` tokens + `max_new_tokens` must be <= 64. Given: 5 `inputs` tokens and 60 `max_new_tokens`"),
    ({"grammar": {"type": "yaml", "value": "a: 1"}},
     "grammar is not valid: unknown variant `yaml`, expected one of `json`, `json_object`, `regex`"),
    ({"watermark": True}, "watermark is not supported"),
    ({"slo": {"ttft_ms": 0, "tbt_ms": 50}}, "`slo.ttft_ms` must be a strictly positive number of milliseconds"),
    ({"slo": {"ttft_ms": 1e30, "tbt_ms": 100}},
     "`slo.ttft_ms` must be at most 3600000 milliseconds. Given: 1000000000000000000000000000000"),
    ({"temperature": 1e308}, "`temperature` must be a finite number"),
    ({"top_p": -1e308}, "`top_p` must be a finite number"),
    ({"stop": ["x" * 1025]}, "each stop sequence must be at most 1024 bytes long. Given: 1025"),
]


@pytest.mark.parametrize("parameters,message", RULES, ids=[m[:40] for _, m in RULES])
def test_each_rule_is_422_with_tgi_message(guarded, parameters, message):
    response = post(guarded, "/generate", {"inputs": "one two three four five", "parameters": parameters})
    assert response.status_code == 422, response.text
    assert response.json() == validation_error(message)


def test_input_length_and_empty_input(guarded):
    long_prompt = " ".join(["word"] * 40)
    response = post(guarded, "/generate", {"inputs": long_prompt, "parameters": {"max_new_tokens": 1}})
    assert response.status_code == 422
    assert response.json() == validation_error("`inputs` must have less than 32 tokens. Given: 40")
    response = post(guarded, "/generate", {"inputs": "", "parameters": {}})
    assert response.json() == validation_error("`inputs` cannot be empty")
    # truncate keeps the last tokens, which makes the long prompt acceptable
    truncated = {"inputs": long_prompt, "parameters": {"max_new_tokens": 1, "truncate": 8, "details": True}}
    response = post(guarded, "/generate", truncated)
    assert response.status_code == 200, response.text
    assert response.headers["x-prompt-tokens"] == "8"


def test_streaming_errors_are_sse_events_with_status_200(guarded):
    response = post(guarded, "/generate_stream", {"inputs": "x", "parameters": {"top_k": -1}})
    assert response.status_code == 200
    events = [json.loads(line[5:]) for line in response.text.splitlines() if line.startswith("data:")]
    assert events == [validation_error("`top_k` must be strictly positive")]
    body = {"inputs": "x", "parameters": {"best_of": 2, "do_sample": True}, "stream": True}
    events = [line for line in post(guarded, "/", body).text.splitlines() if line.startswith("data:")]
    assert json.loads(events[0][5:]) == validation_error("`best_of` != 1 is not supported when streaming tokens")


def test_tgi_client_raises_validation_error(guarded):
    client = Client(guarded.url, headers=AUTH, timeout=120)
    with pytest.raises(ValidationError, match="`temperature` must be strictly positive"):
        client.generate("hello", temperature=-1.0)
    with pytest.raises(ValidationError, match="must be strictly positive"):
        list(client.generate_stream("hello", top_k=-2))


def test_openai_routes_validate(guarded):
    client = openai.OpenAI(base_url=f"{guarded.url}/v1", api_key=API_KEY, timeout=120)
    with pytest.raises(openai.UnprocessableEntityError) as raised:
        client.chat.completions.create(model="tgi", messages=[{"role": "user", "content": "hi"}], n=5)
    # The client keeps the "error" member of the body.
    # This server's --max-client-batch-size is 2 (LIMITS).
    assert raised.value.body == ("Input validation error: `n` must be between 1 and 2, and `n` times the prompts "
                                 "at most 2. Given: 5")
    # Streamed, invalid input is answered with its status before the stream starts (as OpenAI and
    # vLLM answer it), so the client raises the 422's error when the request is made.
    body = {"messages": [{"role": "user", "content": "hi"}], "stream": True, "top_p": 5}
    response = post(guarded, "/v1/chat/completions", body)
    assert response.status_code == 422
    assert response.json() == {"error": "Input validation error: `top_p` must be > 0.0 and < 1.0",
                               "error_type": "validation"}
    with pytest.raises(openai.UnprocessableEntityError) as raised:
        client.chat.completions.create(model="tgi", messages=[{"role": "user", "content": "hi"}], stream=True, top_p=5)
    assert raised.value.body == "Input validation error: `top_p` must be > 0.0 and < 1.0"
    response = post(guarded, "/v1/completions", {"prompt": ["a", "b", "c"], "max_tokens": 1})
    assert response.status_code == 422
    assert response.json() == validation_error("`prompt` supports up to 2 prompts. Given: 3")


def test_malformed_body_is_422(guarded):
    response = requests.post(guarded.url + "/generate", data="{not json", headers={**AUTH, "Content-Type": "application/json"}, timeout=30)
    assert response.status_code == 422
    assert response.json()["error_type"] == "validation"


def test_api_key_is_required_on_generation_routes(guarded):
    body = {"inputs": "hello", "parameters": {"max_new_tokens": 1}}
    for path in ["/", "/generate", "/generate_stream", "/tokenize", "/chat_tokenize", "/vertex"]:
        assert post(guarded, path, body, headers={}).status_code == 401, path
    assert post(guarded, "/generate", body, headers={"Authorization": "Bearer wrong"}).status_code == 401
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    assert post(guarded, "/v1/chat/completions", chat, headers={}).status_code == 401
    assert post(guarded, "/generate", body).status_code == 200
    # The scheme in any case (RFC 7235), the key exactly.
    assert post(guarded, "/generate", body, headers={"Authorization": f"bEARER {API_KEY}"}).status_code == 200
    assert post(guarded, "/generate", body, headers={"Authorization": f"Bearer {API_KEY.upper()}"}).status_code == 401
    assert guarded.get("/health")[0] == 200
    assert guarded.get("/info")[0] == 200


def test_the_api_key_is_on_no_command_line(guarded):
    # What every local user can read: no process shows the key in its arguments.
    listed = subprocess.run(["ps", "-eo", "args="], capture_output=True, text=True, check=True).stdout
    assert "superinfer.router_main" in listed
    assert API_KEY not in listed


def test_empty_prompt_list_and_conversation_are_422(guarded):
    response = post(guarded, "/v1/completions", {"prompt": [], "max_tokens": 5})
    assert response.status_code == 422
    assert response.json() == validation_error("`prompt` must hold at least one prompt")
    response = post(guarded, "/v1/chat/completions", {"messages": []})
    assert response.status_code == 422
    assert response.json() == validation_error("`messages` must hold at least one message")



def test_payload_over_the_limit_is_413(guarded):
    response = post(guarded, "/generate", {"inputs": "x" * 5000})
    assert response.status_code == 413
    assert response.json()["error_type"] == "payload_too_large"


def test_over_the_concurrency_limit_is_429(guarded):
    body = {"inputs": "Count to fifty:", "parameters": {"max_new_tokens": 50, "ignore_eos": True}}
    with post(guarded, "/generate_stream", body, stream=True) as running:
        lines = running.iter_lines()
        while not next(lines).startswith(b"data:"):
            pass
        response = post(guarded, "/generate", {"inputs": "hello", "parameters": {"max_new_tokens": 1}})
        assert response.status_code == 429 and response.headers["Retry-After"] == "1"
        assert response.json() == {"error": "Model is overloaded", "error_type": "overloaded"}
        with pytest.raises(OverloadedError):
            Client(guarded.url, headers=AUTH, timeout=120).generate("hello", max_new_tokens=1)
        # A stream refused before it starts gets the status too (TGI sends 200 and an error event),
        # so that a router in front can retry it; TGI's client raises the same error.
        stream = post(guarded, "/generate_stream", {"inputs": "hello"})
        assert stream.status_code == 429
        assert stream.json() == {"error": "Model is overloaded", "error_type": "overloaded"}
        with pytest.raises(OverloadedError):
            list(Client(guarded.url, headers=AUTH, timeout=120).generate_stream("hello", max_new_tokens=1))
