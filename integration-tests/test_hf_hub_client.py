"""`huggingface_hub.InferenceClient` against the launched server (TGI and chat endpoints)."""
from huggingface_hub import InferenceClient


def test_text_generation_with_details(url):
    output = InferenceClient(base_url=url, timeout=120).text_generation(
        "Once upon a time", max_new_tokens=5, details=True
    )
    assert output.generated_text
    assert output.details.generated_tokens == len(output.details.tokens)


def test_text_generation_stream(url):
    client = InferenceClient(base_url=url, timeout=120)
    chunks = list(client.text_generation("Once upon a time", max_new_tokens=5, stream=True))
    assert 1 <= len(chunks) <= 5
    assert "".join(chunks) == client.text_generation("Once upon a time", max_new_tokens=5)


def test_chat_completion(url):
    client = InferenceClient(base_url=url, timeout=120)
    messages = [{"role": "user", "content": "Say hello."}]
    # Greedy, so the streamed reply must equal the whole one.
    reply = client.chat_completion(messages, max_tokens=8, temperature=0)
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].message.content
    assert reply.usage.completion_tokens <= 8
    streamed = "".join(
        chunk.choices[0].delta.content or ""
        for chunk in client.chat_completion(messages, max_tokens=8, temperature=0, stream=True)
        if chunk.choices
    )
    assert streamed == reply.choices[0].message.content
