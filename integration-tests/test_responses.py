"""OpenAI's Responses API (`/v1/responses`) through the unmodified `openai` client: the reply is
the chat route's (greedy), whole and streamed through the client's own event accumulator, a
structured output parsed by the client, a tool loop whose output items are sent back as
input, and the same loop continued by `previous_response_id` from the kept response."""
import json
import uuid

import jsonschema
import openai
import pytest
from openai import OpenAI
from pydantic import BaseModel

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16},
                                            "unit": {"enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"], "additionalProperties": False}
TOOLS = [{"type": "function", "name": "get_weather", "description": "The current weather in a city",
          "parameters": WEATHER, "strict": True}]
QUESTION = "What is the capital of France?"


def client(url: str) -> OpenAI:
    return OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=120)


def test_a_response_is_the_chat_reply(url):
    api = client(url)
    # Instructions no other request had: the prompt's blocks are not in the prefix cache yet.
    instructions = f"Answer briefly ({uuid.uuid4().hex[:8]})."
    response = api.responses.create(model="tgi", input=QUESTION, instructions=instructions,
                                    max_output_tokens=20, temperature=0)
    chat = api.chat.completions.create(model="tgi", max_tokens=20, temperature=0, messages=[
        {"role": "system", "content": instructions}, {"role": "user", "content": QUESTION}])
    assert response.output_text == chat.choices[0].message.content
    assert "Paris" in api.responses.create(model="tgi", input=QUESTION, max_output_tokens=20, temperature=0).output_text
    assert response.status == ("incomplete" if chat.choices[0].finish_reason == "length" else "completed")
    assert response.usage.input_tokens == chat.usage.prompt_tokens
    assert response.usage.output_tokens == chat.usage.completion_tokens
    # Both rendered the same conversation: the second took its full blocks from the prefix cache.
    assert response.usage.input_tokens_details.cached_tokens == 0
    assert 0 < chat.usage.prompt_tokens_details.cached_tokens < chat.usage.prompt_tokens


def test_a_streamed_response_through_the_clients_accumulator(url):
    api = client(url)
    whole = api.responses.create(model="tgi", input=QUESTION, max_output_tokens=12, temperature=0)
    deltas = []
    with api.responses.stream(model="tgi", input=QUESTION, max_output_tokens=12, temperature=0) as stream:
        for event in stream:
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
        final = stream.get_final_response()
    assert "".join(deltas) == final.output_text == whole.output_text
    assert final.status == whole.status
    assert final.usage.output_tokens == whole.usage.output_tokens
    # The plain stream of typed events, numbered in order.
    events = list(api.responses.create(model="tgi", input=QUESTION, max_output_tokens=4, temperature=0, stream=True))
    assert [event.sequence_number for event in events] == list(range(len(events)))
    assert events[0].type == "response.created" and events[-1].type in ("response.completed", "response.incomplete")


def test_logprobs_are_the_chat_routes(url):
    api = client(url)
    response = api.responses.create(model="tgi", input=QUESTION, max_output_tokens=8, temperature=0, top_logprobs=2,
                                    include=["message.output_text.logprobs"])
    chat = api.chat.completions.create(model="tgi", messages=[{"role": "user", "content": QUESTION}], max_tokens=8,
                                       temperature=0, logprobs=True, top_logprobs=2)
    ours = response.output[0].content[0].logprobs
    theirs = chat.choices[0].logprobs.content
    assert [lp.token for lp in ours] == [lp.token for lp in theirs]
    assert [lp.logprob for lp in ours] == pytest.approx([lp.logprob for lp in theirs], abs=1e-4)
    assert all(len(lp.top_logprobs) == 2 for lp in ours)


class City(BaseModel):
    name: str
    country: str


def test_a_structured_output_is_parsed_by_the_client(url):
    parsed = client(url).responses.parse(model="tgi", input="Name a city in France as JSON.", text_format=City,
                                         max_output_tokens=60, temperature=0)
    assert isinstance(parsed.output_parsed, City), parsed.output_text


def test_a_tool_loop_sends_the_output_items_back(url):
    api = client(url)
    conversation = [{"role": "user", "content": "What is the weather like in Paris today?"}]
    called = api.responses.create(model="tgi", input=conversation, tools=TOOLS, tool_choice="required",
                                  max_output_tokens=80, temperature=0)
    calls = [item for item in called.output if item.type == "function_call"]
    assert len(calls) == 1, called.output
    assert calls[0].name == "get_weather"
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER)
    answered = api.responses.create(model="tgi", tools=TOOLS, max_output_tokens=30, temperature=0, input=[
        *conversation, *called.output,
        {"type": "function_call_output", "call_id": calls[0].call_id, "output": '{"celsius": 21, "sky": "clear"}'}])
    assert answered.status in ("completed", "incomplete")
    assert answered.output and answered.usage.input_tokens > called.usage.input_tokens


def test_a_kept_response_is_continued_retrieved_and_deleted(url):
    """`store` (the client's default): the tool loop of the test above continued by
    `previous_response_id` alone gives what sending the items back gave, greedy; the client reads
    the kept response back and deletes it, after which neither reading nor continuing finds it."""
    api = client(url)
    conversation = [{"role": "user", "content": "What is the weather like in Paris today?"}]
    called = api.responses.create(model="tgi", input=conversation, tools=TOOLS, tool_choice="required",
                                  max_output_tokens=80, temperature=0)
    assert called.store
    call = next(item for item in called.output if item.type == "function_call")
    result = {"type": "function_call_output", "call_id": call.call_id, "output": '{"celsius": 21, "sky": "clear"}'}
    resent = api.responses.create(model="tgi", tools=TOOLS, max_output_tokens=30, temperature=0,
                                  input=[*conversation, *called.output, result])
    continued = api.responses.create(model="tgi", tools=TOOLS, max_output_tokens=30, temperature=0,
                                     input=[result], previous_response_id=called.id)
    assert continued.previous_response_id == called.id
    assert continued.output_text == resent.output_text
    assert continued.usage.input_tokens == resent.usage.input_tokens
    assert api.responses.retrieve(called.id).output[-1].call_id == call.call_id
    api.responses.delete(called.id)
    with pytest.raises(openai.NotFoundError):
        api.responses.retrieve(called.id)
    for stream in (False, True):
        with pytest.raises(openai.NotFoundError) as raised:
            api.responses.create(model="tgi", input="Hi", previous_response_id=called.id, stream=stream)
        assert raised.value.body == f"Response with id '{called.id}' not found.", raised.value.body


def test_what_needs_state_it_does_not_keep_is_refused(url):
    for stream in (False, True):
        with pytest.raises(openai.UnprocessableEntityError) as raised:
            client(url).responses.create(model="tgi", input="Hi", conversation="conv_1", stream=stream)
        # The client keeps the "error" member of the body.
        assert raised.value.body.startswith("Input validation error: `conversation` is not supported"), raised.value.body
