"""The `openai` client against the launched server's /v1 endpoints."""
from openai import OpenAI


def client(url: str) -> OpenAI:
    return OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=120)


def test_capital_of_france(url):
    reply = client(url).chat.completions.create(
        model="tgi",
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=20,
        temperature=0,
    )
    assert "Paris" in reply.choices[0].message.content


def test_chat_stream_with_usage(url):
    chunks = list(
        client(url).chat.completions.create(
            model="tgi",
            messages=[{"role": "user", "content": "Count to three."}],
            max_tokens=8,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    usage = chunks[-1].usage
    assert usage is not None and 1 <= usage.completion_tokens <= 8
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_completions(url):
    openai = client(url)
    reply = openai.completions.create(model="tgi", prompt="The sky is", max_tokens=6, temperature=0)
    assert reply.choices[0].text
    assert reply.usage.completion_tokens <= 6
    chunks = list(
        openai.completions.create(
            model="tgi", prompt="The sky is", max_tokens=6, temperature=0,
            stream=True, stream_options={"include_usage": True},
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == reply.choices[0].text
    assert chunks[-1].usage.completion_tokens == reply.usage.completion_tokens


def test_completion_logprobs_and_chat_stream_logprobs(url):
    openai = client(url)
    reply = openai.completions.create(model="tgi", prompt="The sky is", max_tokens=6, temperature=0, logprobs=2)
    logprobs = reply.choices[0].logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == len(logprobs.top_logprobs) >= 1
    assert all(lp <= 0 for lp in logprobs.token_logprobs)
    # Greedy: the sampled token is the most likely of its alternatives.
    for token, chosen, alternatives in zip(logprobs.tokens, logprobs.token_logprobs, logprobs.top_logprobs):
        assert alternatives[token] == chosen and chosen >= max(alternatives.values()) - 1e-4
    chunks = list(openai.chat.completions.create(
        model="tgi", messages=[{"role": "user", "content": "Count to three."}], max_tokens=5,
        stream=True, logprobs=True))
    streamed = [c.choices[0].logprobs for c in chunks if c.choices and c.choices[0].delta.content]
    assert streamed and all(lp is not None and len(lp.content) == 1 for lp in streamed)
