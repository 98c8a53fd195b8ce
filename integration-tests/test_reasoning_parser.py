"""`--reasoning-parser` through the launcher, against the embedded model: under deepseek_r1 the
template opened `<think>` in the prompt, so a reply that never closes it (the embedded model
does not think) is all reasoning — exactly the reply a server without a parser gives as
content — whole and streamed. Where the split falls is checked piece by piece in the router's
tests (`http::reasoning`)."""
import json

import pytest
from openai import OpenAI

from conftest import launch

MESSAGES = [{"role": "user", "content": "Name three rivers."}]


@pytest.fixture(scope="module")
def thinking_url(tmp_path_factory):
    with launch(tmp_path_factory.mktemp("reasoning"), ["--reasoning-parser", "deepseek_r1"]) as server:
        yield server.url


def chat(url: str, **extra):
    return OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=120).chat.completions.create(
        **{"model": "tgi", "messages": MESSAGES, "max_tokens": 16, "temperature": 0, **extra})


def test_an_unclosed_block_is_all_reasoning_whole_and_streamed(url, thinking_url):
    plain = chat(url).choices[0].message
    assert plain.content and getattr(plain, "reasoning_content", None) is None
    whole = chat(thinking_url).choices[0].message
    assert whole.reasoning_content == plain.content and not whole.content
    deltas = [chunk.choices[0].delta for chunk in chat(thinking_url, stream=True) if chunk.choices]
    assert "".join(getattr(delta, "reasoning_content", None) or "" for delta in deltas) == plain.content
    assert not "".join(delta.content or "" for delta in deltas)


def test_without_tag_tokens_a_format_holds_from_the_first_token(thinking_url):
    """The embedded model's tokenizer has no `<think>` token, so a grammar cannot wait for the
    reasoning to end: the reply follows it from the first token and is all content."""
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    message = chat(thinking_url, max_tokens=40, response_format={
        "type": "json_schema", "json_schema": {"name": "verdict", "schema": schema}}).choices[0].message
    assert getattr(message, "reasoning_content", None) is None
    assert isinstance(json.loads(message.content)["ok"], bool)
