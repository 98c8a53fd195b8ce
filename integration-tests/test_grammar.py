"""Structured output end to end, through unmodified clients: TGI's `grammar` (text_generation's
`Grammar`), OpenAI's `response_format` (the openai client, streamed and not) and
huggingface_hub's `chat_completion(response_format=...)`. Every output that the grammar ended
is parsed and validated with `jsonschema` (or `re.fullmatch` for a regex), greedy and sampled;
a schema llguidance cannot compile is a 422; a constrained request rotated out to host memory
and back still ends valid. The schemas bound their outputs (lengths, ranges, item counts) so
that the small model's answers end well within the token limit."""
import json
import re
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import pytest
import requests
from huggingface_hub import InferenceClient
from openai import OpenAI
from text_generation import Client
from text_generation.errors import ValidationError
from text_generation.types import Grammar, GrammarType

from conftest import launch
from test_rotation import PUNCTUAL_SLO, SMALL_POOL, assert_pools_drained, wait_for

MAX_NEW_TOKENS = 160
PROMPT = "Reply with one JSON value that matches the schema.\nJSON:"


def _object(properties: dict, required: list[str] | None = None) -> dict:
    return {"type": "object", "properties": properties, "required": list(properties) if required is None else required,
            "additionalProperties": False}


SHORT = {"type": "string", "maxLength": 12}
DIGIT = {"type": "integer", "minimum": 0, "maximum": 9}
PERSON = _object({"name": SHORT, "age": {"type": "integer", "minimum": 0, "maximum": 120}})
TREE = {"$defs": {"node": _object({"v": DIGIT, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}})},
        "$ref": "#/$defs/node"}

# Easiest first: scalars, then flat objects, arrays with bounds, enums and consts, anyOf,
# string formats and patterns, nesting, $ref (recursive last).
SCHEMAS = [
    {"type": "boolean"},
    {"type": "null"},
    {"enum": ["red", "green", "blue"]},
    {"const": "fixed"},
    DIGIT,
    {"type": "integer", "minimum": -50, "maximum": 50},
    {"type": "integer", "exclusiveMinimum": 10, "exclusiveMaximum": 20},
    SHORT,
    {"type": "string", "minLength": 3, "maxLength": 6},
    {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"},
    {"type": "string", "format": "date"},
    {"type": "string", "format": "uuid"},
    {"type": "string", "format": "ipv4"},
    {"type": "string", "format": "email", "maxLength": 30},
    {"type": "string", "enum": ["yes", "no", "maybe"]},
    {"type": ["integer", "boolean"], "minimum": 0, "maximum": 5},
    _object({"ok": {"type": "boolean"}}),
    _object({"name": SHORT}),
    PERSON,
    _object({"id": DIGIT, "label": SHORT, "active": {"type": "boolean"}}),
    _object({"a": DIGIT, "b": {"type": "null"}}),
    _object({"colour": {"enum": ["red", "green"]}, "size": {"enum": [1, 2, 3]}}),
    _object({"kind": {"const": "point"}, "x": DIGIT, "y": DIGIT}),
    _object({"name": SHORT, "nick": SHORT}, required=["name"]),
    _object({"when": {"type": "string", "format": "date"}}),
    _object({"code": {"type": "string", "pattern": "^[a-f0-9]{4}$"}}),
    {"type": "array", "items": {"type": "boolean"}, "maxItems": 3},
    {"type": "array", "items": DIGIT, "minItems": 2, "maxItems": 4},
    {"type": "array", "items": SHORT, "minItems": 1, "maxItems": 2},
    {"type": "array", "items": {"enum": ["a", "b"]}, "minItems": 3, "maxItems": 3},
    {"type": "array", "prefixItems": [DIGIT, {"type": "boolean"}], "items": False},
    {"type": "array", "items": PERSON, "maxItems": 2},
    _object({"tags": {"type": "array", "items": SHORT, "maxItems": 3}}),
    _object({"scores": {"type": "array", "items": DIGIT, "minItems": 1, "maxItems": 3}, "best": DIGIT}),
    {"anyOf": [{"type": "boolean"}, DIGIT]},
    {"anyOf": [{"type": "null"}, SHORT]},
    {"anyOf": [_object({"cat": SHORT}), _object({"dog": DIGIT})]},
    _object({"value": {"anyOf": [DIGIT, {"type": "boolean"}, {"type": "null"}]}}),
    _object({"owner": PERSON}),
    _object({"a": _object({"b": _object({"c": DIGIT})})}),
    _object({"point": _object({"x": DIGIT, "y": DIGIT}), "label": SHORT}),
    _object({"people": {"type": "array", "items": PERSON, "maxItems": 2}, "count": DIGIT}),
    _object({"matrix": {"type": "array", "maxItems": 2, "items": {"type": "array", "items": DIGIT, "maxItems": 2}}}),
    _object({"id": {"type": "string", "format": "uuid"}, "on": {"type": "string", "format": "date"}}),
    _object({"ip": {"type": "string", "format": "ipv4"}, "port": {"type": "integer", "minimum": 1, "maximum": 65535}}),
    _object({"status": {"enum": ["open", "closed"]}, "items": {"type": "array", "items": {"enum": [1, 2]}, "maxItems": 3}}),
    {"$defs": {"d": DIGIT}, "type": "array", "items": {"$ref": "#/$defs/d"}, "maxItems": 3},
    {"$defs": {"p": PERSON}, "$ref": "#/$defs/p"},
    {"$defs": {"name": SHORT, "pair": _object({"first": {"$ref": "#/$defs/name"}, "last": {"$ref": "#/$defs/name"}})},
     "$ref": "#/$defs/pair"},
    {"$defs": {"p": PERSON}, **_object({"lead": {"$ref": "#/$defs/p"}, "team": {"type": "array", "items": {"$ref": "#/$defs/p"}, "maxItems": 2}})},
    {"definitions": {"flag": {"type": "boolean"}}, **_object({"f": {"$ref": "#/definitions/flag"}})},
    {"$defs": {"v": {"anyOf": [DIGIT, {"type": "null"}]}}, **_object({"a": {"$ref": "#/$defs/v"}, "b": {"$ref": "#/$defs/v"}})},
    {"allOf": [_object({"x": DIGIT})]},
    _object({"event": _object({"name": SHORT, "day": {"type": "string", "format": "date"},
                                "guests": {"type": "array", "items": _object({"email": {"type": "string", "format": "email", "maxLength": 24}}), "maxItems": 2}})}),
    TREE,
    {"$defs": TREE["$defs"], **_object({"root": {"$ref": "#/$defs/node"}, "depth": DIGIT})},
]

REGEXES = [
    r"[0-9]{3}",
    r"(yes|no)",
    r"[A-Z][a-z]{1,8}",
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}",
    r"(cat|dog|bird)s?",
    r"[a-z]+ [a-z]+\.",
    r"\d{1,3}(\.\d{1,3}){3}",
    r"(ab|cd){2,4}!",
]

FORMATS = jsonschema.Draft202012Validator.FORMAT_CHECKER
GREEDY = {}
SAMPLED = {"do_sample": True, "temperature": 0.8, "top_p": 0.95, "seed": 7}


def tgi_generate(url: str, grammar: Grammar, sampling: dict):
    client = Client(url, timeout=300)
    return client.generate(PROMPT, max_new_tokens=MAX_NEW_TOKENS, grammar=grammar, **sampling)


def run_all(url: str, grammars: list[Grammar], sampling: dict) -> list:
    with ThreadPoolExecutor(max_workers=32) as pool:
        return list(pool.map(lambda grammar: tgi_generate(url, grammar, sampling), grammars))


def check_json(schema: dict, text: str) -> None:
    jsonschema.validate(json.loads(text), schema, format_checker=FORMATS)


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_every_schema_is_followed(url, sampling):
    assert len(SCHEMAS) >= 50
    responses = run_all(url, [Grammar(type=GrammarType.Json, value=schema) for schema in SCHEMAS], sampling)
    ended = 0
    for schema, response in zip(SCHEMAS, responses):
        reason = response.details.finish_reason
        if reason == "length":
            continue  # cut off by the token limit: a valid prefix, not a whole value
        ended += 1
        assert reason == "eos_token", (schema, response.generated_text)
        try:
            check_json(schema, response.generated_text)
        except (json.JSONDecodeError, jsonschema.ValidationError) as error:
            pytest.fail(f"{json.dumps(schema)}\n{response.generated_text!r}\n{error}")
    assert ended >= 0.9 * len(SCHEMAS), f"only {ended} of {len(SCHEMAS)} outputs ended within {MAX_NEW_TOKENS} tokens"


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_every_regex_is_matched(url, sampling):
    responses = run_all(url, [Grammar(type=GrammarType.Regex, value=regex) for regex in REGEXES], sampling)
    for regex, response in zip(REGEXES, responses):
        assert response.details.finish_reason == "eos_token", (regex, response.generated_text)
        assert re.fullmatch(regex, response.generated_text), (regex, response.generated_text)


def test_a_schema_llguidance_cannot_compile_is_422(url):
    with pytest.raises(ValidationError, match="grammar is not valid: .*nsatisfiable"):
        Client(url, timeout=60).generate(PROMPT, grammar=Grammar(
            type=GrammarType.Json, value={"type": "integer", "minimum": 5, "maximum": 1}))
    body = {"inputs": PROMPT, "parameters": {"grammar": {"type": "regex", "value": "a("}}}
    response = requests.post(f"{url}/generate", json=body, timeout=60)
    assert response.status_code == 422
    assert response.json()["error_type"] == "validation"
    assert response.json()["error"].startswith("Input validation error: grammar is not valid: ")


def test_openai_response_format_streamed_and_not(url):
    client = OpenAI(base_url=f"{url}/v1", api_key="-")
    messages = [{"role": "user", "content": "Describe a person as JSON."}]
    response_format = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    completion = client.chat.completions.create(model="tgi", messages=messages, max_tokens=MAX_NEW_TOKENS,
                                                temperature=0, response_format=response_format)
    assert completion.choices[0].finish_reason == "stop"
    check_json(PERSON, completion.choices[0].message.content)
    stream = client.chat.completions.create(model="tgi", messages=messages, max_tokens=MAX_NEW_TOKENS, temperature=0.7,
                                            seed=3, response_format={"type": "json_object"}, stream=True)
    chunks = list(stream)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    if chunks[-1].choices[0].finish_reason == "stop":
        assert isinstance(json.loads(text), dict), text
    else:
        assert text.startswith("{"), text


def test_vllm_structured_outputs_through_the_openai_client(url):
    # What a client written for vLLM sends in `extra_body`: the newer `structured_outputs` and
    # the older `guided_*` fields; both constrain the answer.
    client = OpenAI(base_url=f"{url}/v1", api_key="-")
    messages = [{"role": "user", "content": "Is the sky green? Answer yes or no."}]
    for extra_body in ({"guided_choice": ["yes", "no"]}, {"structured_outputs": {"choice": ["yes", "no"]}}):
        answer = client.chat.completions.create(model="tgi", messages=messages, max_tokens=10, temperature=0.8,
                                                seed=1, extra_body=extra_body)
        assert answer.choices[0].message.content in ("yes", "no"), answer
        assert answer.choices[0].finish_reason == "stop"
    person = client.chat.completions.create(model="tgi", max_tokens=MAX_NEW_TOKENS, temperature=0,
                                            messages=[{"role": "user", "content": "Describe a person as JSON."}],
                                            extra_body={"guided_json": PERSON})
    check_json(PERSON, person.choices[0].message.content)
    code = client.completions.create(model="tgi", prompt="A four-digit PIN:", max_tokens=10, temperature=0,
                                     extra_body={"structured_outputs": {"regex": "[0-9]{4}"}})
    assert re.fullmatch("[0-9]{4}", code.choices[0].text), code


def test_temperature_zero_is_greedy_whatever_top_p_and_top_k_say(url):
    # OpenAI clients often send top_p (and vLLM clients top_k) beside temperature 0: still greedy.
    client = OpenAI(base_url=f"{url}/v1", api_key="-")
    greedy = client.completions.create(model="tgi", prompt="Once upon a time", max_tokens=8, temperature=0)
    for seed in (1, 2, 3):
        narrowed = client.completions.create(model="tgi", prompt="Once upon a time", max_tokens=8, temperature=0,
                                             top_p=0.9, seed=seed, extra_body={"top_k": 20})
        assert narrowed.choices[0].text == greedy.choices[0].text


def test_huggingface_hub_response_format(url):
    client = InferenceClient(base_url=url, timeout=120)
    schema = _object({"answer": {"enum": ["yes", "no"]}})
    output = client.chat_completion(messages=[{"role": "user", "content": "Is water wet?"}], max_tokens=40,
                                    response_format={"type": "json", "value": schema})
    assert output.choices[0].finish_reason == "stop"
    check_json(schema, output.choices[0].message.content)


@pytest.fixture(scope="module")
def rotating_server(tmp_path_factory):
    args = [*SMALL_POOL, *PUNCTUAL_SLO, "--scheduler", "rotasched"]
    with launch(tmp_path_factory.mktemp("grammar-rotation"), args) as server:
        yield server


def test_constrained_requests_rotated_out_and_back_end_valid(rotating_server):
    # 32 constrained requests of ~50 tokens on a pool that holds about six: most are rotated
    # out to host memory and back (or recomputed) between their tokens.
    schema = _object({"words": {"type": "array", "items": {"type": "string", "minLength": 3, "maxLength": 8},
                                "minItems": 5, "maxItems": 5}})
    grammar = Grammar(type=GrammarType.Json, value=schema)
    moved_before = (rotating_server.metric("superinfer_rotations_out_total")
                    + rotating_server.metric("superinfer_recomputes_total"))

    def generate(seed: int):
        return Client(rotating_server.url, timeout=300).generate(
            f"List five words about topic number {seed}.\nJSON:", max_new_tokens=MAX_NEW_TOKENS, grammar=grammar,
            **({"do_sample": True, "seed": seed} if seed % 2 else {}))

    with ThreadPoolExecutor(max_workers=32) as pool:
        responses = list(pool.map(generate, range(32)))
    moved = (rotating_server.metric("superinfer_rotations_out_total")
             + rotating_server.metric("superinfer_recomputes_total")) - moved_before
    assert moved > 0, rotating_server.log_tail()
    for response in responses:
        assert response.details.finish_reason == "eos_token", response.generated_text
        check_json(schema, response.generated_text)
    assert wait_for(lambda: rotating_server.metric("superinfer_engine_requests") == 0)
    assert_pools_drained(rotating_server)
