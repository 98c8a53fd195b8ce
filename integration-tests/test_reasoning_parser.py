"""`--reasoning-parser` through the launcher, against the embedded model: under deepseek_r1 the
template opened `<think>` in the prompt, so a reply that never closes it (the embedded model
does not think) is all reasoning — exactly the reply a server without a parser gives as
content — whole and streamed. Where the split falls is checked piece by piece in the router's
tests (`http::reasoning`). A random checkpoint whose tokenizer has `<think>` and `</think>` as
tokens of their own shows a grammar waiting for the reasoning to end, through the real shard."""
import json
import subprocess

import pytest
from openai import OpenAI

from conftest import REPO, SUPERINFER, launch

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


SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
VERDICT = {"type": "json_schema", "json_schema": {"name": "verdict", "schema": SCHEMA}}


def test_without_tag_tokens_a_format_holds_from_the_first_token(thinking_url):
    """The embedded model's tokenizer has no `<think>` token, so a grammar cannot wait for the
    reasoning to end: the reply follows it from the first token and is all content."""
    message = chat(thinking_url, max_tokens=40, response_format=VERDICT).choices[0].message
    assert getattr(message, "reasoning_content", None) is None
    assert isinstance(json.loads(message.content)["ok"], bool)


# SmolLM2's tokenizer with the tags added after its vocabulary, as Qwen 3's and DeepSeek-R1's
# have them (not special: their text stays in the reply).
THINK, END_THINK = 49152, 49153
# DeepSeek-R1's way: the generation prompt opens the block; Qwen 3's `enable_thinking: false`
# closes an empty one instead.
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
            "<|im_start|>assistant\n{% if enable_thinking is defined and not enable_thinking %}"
            "<think>\n\n</think>\n\n{% else %}<think>\n{% endif %}")


@pytest.fixture(scope="module")
def tagged_url(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tagged-model")
    subprocess.run([str(SUPERINFER.parent / "python"), str(REPO / "integration-tests" / "architecture_reference.py"),
                    "build", str(directory), "llama", json.dumps({"vocab_size": END_THINK + 1})],
                   cwd=REPO, check=True, capture_output=True, timeout=300)
    tokenizer = json.loads((REPO / "router" / "tests" / "fixtures" / "smollm2_tokenizer.json").read_text())
    for token_id, content in [(THINK, "<think>"), (END_THINK, "</think>")]:
        tokenizer["added_tokens"].append({"id": token_id, "content": content, "single_word": False, "lstrip": False,
                                          "rstrip": False, "normalized": False, "special": False})
    (directory / "tokenizer.json").write_text(json.dumps(tokenizer))
    (directory / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "chat_template": TEMPLATE}))
    with launch(tmp_path_factory.mktemp("tagged"), ["--model-id", str(directory), "--reasoning-parser",
                                                    "deepseek_r1"]) as server:
        yield server.url


def test_a_grammar_holds_only_after_the_reasoning(tagged_url):
    """The random model's reasoning is free: under a format it writes the very tokens it writes
    without one until it closes the block. Biased to close it at once, what follows is the
    format's. With the block closed in the prompt, the format holds from the first token (a
    block the reply opens itself is kept out by a bias)."""
    free = chat(tagged_url, max_tokens=12).choices[0]
    held = chat(tagged_url, max_tokens=12, response_format=VERDICT).choices[0]
    assert free.message.reasoning_content and not free.message.content
    assert (held.message.reasoning_content, held.message.content) == (free.message.reasoning_content, "")
    for stream in (False, True):
        closing = {"max_tokens": 30, "response_format": VERDICT, "logit_bias": {str(END_THINK): 100}}
        if stream:
            deltas = [c.choices[0].delta for c in chat(tagged_url, stream=True, **closing) if c.choices]
            content = "".join(delta.content or "" for delta in deltas)
            assert not "".join(getattr(delta, "reasoning_content", None) or "" for delta in deltas)
        else:
            message = chat(tagged_url, **closing).choices[0].message
            content = message.content
            assert not message.reasoning_content
        assert isinstance(json.loads(content)["ok"], bool), content
    # The reply may still open a block of its own (this random model would): kept from it here.
    closed = chat(tagged_url, max_tokens=30, response_format=VERDICT, logit_bias={str(THINK): -100},
                  extra_body={"chat_template_kwargs": {"enable_thinking": False}}).choices[0].message
    assert getattr(closed, "reasoning_content", None) is None
    assert isinstance(json.loads(closed.content)["ok"], bool), closed.content
