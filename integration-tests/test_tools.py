"""Tool calls end to end through unmodified clients: the openai client (non-streamed and
streamed) and huggingface_hub's `chat_completion(tools=...)`. Every call's name is one of the
tools and its arguments (a JSON string) validate against the tool's parameters. Under
`--tool-call-parser hermes`, `auto` replies are the model's own text, read for calls."""
import json
import shutil
import subprocess

import jsonschema
import pytest
import requests
from huggingface_hub import InferenceClient
from openai import OpenAI

from conftest import REPO, SUPERINFER, launch

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16},
                                            "unit": {"enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"]}
DICE = {"type": "object", "properties": {"sides": {"type": "integer", "minimum": 2, "maximum": 20}}, "required": ["sides"]}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "The current weather in a city",
                                      "parameters": WEATHER}},
    {"type": "function", "function": {"name": "roll_dice", "description": "Roll a die", "parameters": DICE}},
]
PARAMETERS = {"get_weather": WEATHER, "roll_dice": DICE}
MESSAGES = [{"role": "user", "content": "What is the weather like in Paris today?"}]


def check_call(name: str, arguments: str) -> None:
    assert name in PARAMETERS, name
    jsonschema.validate(json.loads(arguments), PARAMETERS[name])


def test_openai_required_and_named_tool_calls(url):
    client = OpenAI(base_url=f"{url}/v1", api_key="-")
    required = client.chat.completions.create(model="tgi", messages=MESSAGES, tools=TOOLS, tool_choice="required",
                                              max_tokens=80, temperature=0)
    choice = required.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert choice.message.content is None
    call = choice.message.tool_calls[0]
    assert call.type == "function"
    check_call(call.function.name, call.function.arguments)

    named = client.chat.completions.create(model="tgi", messages=MESSAGES, tools=TOOLS, max_tokens=80, seed=5,
                                           tool_choice={"type": "function", "function": {"name": "roll_dice"}})
    call = named.choices[0].message.tool_calls[0]
    assert call.function.name == "roll_dice"
    check_call(call.function.name, call.function.arguments)


def test_openai_streamed_tool_call(url):
    client = OpenAI(base_url=f"{url}/v1", api_key="-")
    stream = client.chat.completions.create(model="tgi", messages=MESSAGES, tools=TOOLS, tool_choice="required",
                                            max_tokens=80, temperature=0, stream=True)
    chunks = [chunk for chunk in stream if chunk.choices]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    pieces = [piece for chunk in chunks for piece in chunk.choices[0].delta.tool_calls or []]
    # The call arrives in pieces as it is generated: the first names it, the rest add arguments.
    assert len(pieces) > 1 and all(piece.index == 0 for piece in pieces)
    assert pieces[0].id and pieces[0].type == "function" and pieces[0].function.name
    assert all(piece.function.name is None for piece in pieces[1:])
    check_call(pieces[0].function.name, "".join(piece.function.arguments for piece in pieces))


def test_openai_auto_and_none(url):
    client = OpenAI(base_url=f"{url}/v1", api_key="-")
    auto = client.chat.completions.create(model="tgi", messages=MESSAGES, tools=TOOLS, max_tokens=80, temperature=0)
    message = auto.choices[0].message
    if message.tool_calls:  # the model may call a tool or answer in text (no_tool)
        check_call(message.tool_calls[0].function.name, message.tool_calls[0].function.arguments)
    else:
        assert isinstance(message.content, str)
    none = client.chat.completions.create(model="tgi", messages=MESSAGES, tools=TOOLS, tool_choice="none",
                                          max_tokens=8, temperature=0)
    assert none.choices[0].message.tool_calls is None
    assert none.choices[0].message.content


def test_huggingface_hub_chat_completion_with_tools(url):
    client = InferenceClient(base_url=url, timeout=120)
    output = client.chat_completion(messages=MESSAGES, tools=TOOLS, tool_choice="required", max_tokens=80)
    call = output.choices[0].message.tool_calls[0]
    assert output.choices[0].finish_reason == "tool_calls"
    arguments = call.function.arguments
    check_call(call.function.name, arguments if isinstance(arguments, str) else json.dumps(arguments))


def test_the_tool_loop_sends_the_call_back_with_its_result(url):
    # OpenAI's tool loop, as an agent runs it: the model calls a tool, the client appends the
    # assistant message as the client library returned it (content None, tool_calls) and the
    # tool's result, and asks again. The model must see its call before the result.
    client = OpenAI(base_url=f"{url}/v1", api_key="-")
    first = client.chat.completions.create(model="tgi", messages=MESSAGES, tools=TOOLS, tool_choice="required",
                                           max_tokens=80, temperature=0)
    assistant = first.choices[0].message
    call = assistant.tool_calls[0]
    history = MESSAGES + [assistant.model_dump(exclude_none=True),
                          {"role": "tool", "tool_call_id": call.id, "content": "18 degrees, sunny"}]
    second = client.chat.completions.create(model="tgi", messages=history, max_tokens=16, temperature=0)
    assert second.choices[0].message.content
    # What the template wrote: the call (its name and arguments) ahead of the result.
    templated = requests.post(f"{url}/chat_tokenize", json={"model": "tgi", "messages": history},
                              timeout=60).json()["templated_text"]
    assert call.function.name in templated
    assert templated.index(call.function.name) < templated.index("18 degrees, sunny")
    # A message with neither content nor calls is refused, as OpenAI refuses it.
    refused = requests.post(f"{url}/v1/chat/completions", json={"messages": [{"role": "user", "content": None}]},
                            timeout=60)
    assert refused.status_code == 422 and "messages[0]" in refused.json()["error"], refused.text


# A Hermes-style template (Qwen's): it writes the tools, and earlier calls as <tool_call> blocks.
HERMES_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nYou may call these tools:\n<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}"
    "</tools>\nCall one as <tool_call>{\"name\": ..., \"arguments\": ...}</tool_call><|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content or '' }}{% if m.tool_calls %}{% for c in m.tool_calls %}"
    "<tool_call>{\"name\": \"{{ c.function.name }}\", \"arguments\": {{ c.function.arguments }}}</tool_call>"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}<|im_start|>assistant\n")


@pytest.fixture(scope="module")
def hermes_url(tmp_path_factory):
    """A random checkpoint with SmolLM2's tokenizer and a template that writes the tools, served
    with `--tool-call-parser hermes`."""
    directory = tmp_path_factory.mktemp("hermes-model")
    subprocess.run([str(SUPERINFER.parent / "python"), str(REPO / "integration-tests" / "architecture_reference.py"),
                    "build", str(directory), "llama", json.dumps({"vocab_size": 49152})],
                   cwd=REPO, check=True, capture_output=True, timeout=300)
    shutil.copy(REPO / "router" / "tests" / "fixtures" / "smollm2_tokenizer.json", directory / "tokenizer.json")
    (directory / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "chat_template": HERMES_TEMPLATE}))
    with launch(tmp_path_factory.mktemp("hermes"), ["--model-id", str(directory), "--tool-call-parser", "hermes"]) as server:
        yield server.url


def test_under_a_tool_call_parser_auto_replies_freely_and_required_keeps_the_grammar(hermes_url):
    """With `auto` the reply is the model's own (no grammar, no TGI instruction): the very text a
    completion of the rendered prompt gives, streamed as content as it comes. This random model
    writes no <tool_call> block, so it calls nothing; the router's tests read calls out of
    scripted replies (`http::tests::tool_parser`). `required` still gets TGI's one call."""
    client = OpenAI(base_url=f"{hermes_url}/v1", api_key="-", timeout=120)
    request = {"model": "tgi", "messages": MESSAGES, "tools": TOOLS, "max_tokens": 12, "temperature": 0}
    whole = client.chat.completions.create(**request).choices[0]
    rendered = requests.post(f"{hermes_url}/v1/chat/completions/render", json=request, timeout=60).json()["token_ids"]
    free = requests.post(f"{hermes_url}/v1/completions", json={"prompt": rendered, "max_tokens": 12, "temperature": 0},
                         timeout=120).json()["choices"][0]["text"]
    assert (whole.message.content, whole.message.tool_calls) == (free.rstrip(), None)
    assert whole.finish_reason == "length"
    deltas = [chunk.choices[0].delta for chunk in client.chat.completions.create(**request, stream=True) if chunk.choices]
    assert "".join(delta.content or "" for delta in deltas) == whole.message.content
    assert sum(bool(delta.content) for delta in deltas) > 1
    called = client.chat.completions.create(**{**request, "max_tokens": 60, "tool_choice": "required"}).choices[0]
    assert called.finish_reason == "tool_calls"
    check_call(called.message.tool_calls[0].function.name, called.message.tool_calls[0].function.arguments)


def test_openai_required_with_parallel_calls_gives_a_list(url):
    """`parallel_tool_calls=True` asks TGI's grammar for a list of one or more calls: each is one
    of the tools with arguments that validate, each has its own id, and the stream's pieces add
    up to the same calls. Without it (above) the answer is TGI's one call. This small model adds
    call after call to the token limit: the reply then ends `length` with the calls it finished."""
    client = OpenAI(base_url=f"{url}/v1", api_key="-")
    request = {"model": "tgi", "messages": [{"role": "user", "content": "The weather in Paris and in Rome?"}],
               "tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": True, "max_tokens": 80,
               "temperature": 0}
    choice = client.chat.completions.create(**request).choices[0]
    calls = choice.message.tool_calls
    assert choice.finish_reason in ("tool_calls", "length") and choice.message.content is None, choice
    # The list is what the field asks for: greedy, this model writes more than one call under it,
    # and exactly one without it (TGI's answer).
    assert len(calls) > 1 and [call.id for call in calls] == [str(index) for index in range(len(calls))], calls
    one = client.chat.completions.create(**{k: v for k, v in request.items() if k != "parallel_tool_calls"}).choices[0]
    assert len(one.message.tool_calls) == 1 and one.finish_reason == "tool_calls", one
    for call in calls:
        check_call(call.function.name, call.function.arguments)
    rebuilt = {}
    for chunk in client.chat.completions.create(**request, stream=True):
        for piece in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            if piece.function.name:
                assert piece.index == len(rebuilt) and piece.id == str(piece.index), piece
                rebuilt[piece.index] = [piece.function.name, ""]
            rebuilt[piece.index][1] += piece.function.arguments or ""
    # Greedy, so the same calls; cut short, the stream also began the unfinished one.
    assert [rebuilt[index] for index in range(len(calls))] == [[c.function.name, c.function.arguments] for c in calls]
    assert len(rebuilt) - len(calls) <= (choice.finish_reason == "length")
