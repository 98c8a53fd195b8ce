"""TGI's own Python client (`text-generation`), sync and async, against the launched server."""
import asyncio

from text_generation import AsyncClient, Client

PROMPT = "The three primary colors are"


def test_generate_with_details(url):
    response = Client(url, timeout=120).generate(PROMPT, max_new_tokens=6, decoder_input_details=True)
    details = response.details
    assert response.generated_text
    assert details.generated_tokens == len(details.tokens) <= 6
    assert details.finish_reason in ("length", "eos_token")
    assert details.prefill and details.prefill[0].logprob is None  # position 0 has no logprob
    assert all(token.logprob <= 0 for token in details.tokens)
    assert "".join(token.text for token in details.tokens) == response.generated_text


def test_generate_stream(url):
    tokens, last = [], None
    for last in Client(url, timeout=120).generate_stream(PROMPT, max_new_tokens=6):
        tokens.append(last.token)
    assert 1 <= len(tokens) <= 6
    assert last.generated_text == "".join(token.text for token in tokens)
    assert last.details.generated_tokens == len(tokens)


def test_stream_matches_generate(url):
    client = Client(url, timeout=120)
    full = client.generate(PROMPT, max_new_tokens=6).generated_text
    streamed = "".join(r.token.text for r in client.generate_stream(PROMPT, max_new_tokens=6))
    assert streamed == full


def test_async_client(url):
    async def run():
        client = AsyncClient(url, timeout=120)
        response = await client.generate(PROMPT, max_new_tokens=5)
        streamed = [r async for r in client.generate_stream(PROMPT, max_new_tokens=5)]
        return response, streamed

    response, streamed = asyncio.run(run())
    assert response.details.generated_tokens >= 1
    assert streamed[-1].generated_text == response.generated_text
