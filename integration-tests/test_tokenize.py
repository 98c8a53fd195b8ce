"""vLLM's `/tokenize`, `/detokenize` and `/version` through the real server, as tools that count
a prompt before sending it call them: a conversation's count is the chat route's
`usage.prompt_tokens` (tools included), a text's the completion route's, and detokenizing gives
the text back. TGI's `/tokenize` shape stays on the same path."""
import requests

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


def post(url, path, body):
    response = requests.post(url + path, json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


def test_a_conversations_count_is_the_chat_routes_prompt_tokens(url):
    for extra in ({}, {"tools": TOOLS}):
        chat = {"messages": [{"role": "system", "content": "Answer briefly."},
                             {"role": "user", "content": "What is the weather in Paris?"}], **extra}
        tokenized = post(url, "/tokenize", {"model": "default", **chat})
        assert tokenized["count"] == len(tokenized["tokens"])
        usage = post(url, "/v1/chat/completions", {**chat, "max_tokens": 1})["usage"]
        assert usage["prompt_tokens"] == tokenized["count"], extra
        assert tokenized["max_model_len"] == requests.get(url + "/info", timeout=30).json()["max_total_tokens"]


def test_a_text_tokenizes_as_a_completion_and_detokenizes_back(url):
    text = "Naïve café owners serve ☕ at 7:30 — don't they?"
    tokenized = post(url, "/tokenize", {"prompt": text, "return_token_strs": True})
    usage = post(url, "/v1/completions", {"prompt": text, "max_tokens": 1})["usage"]
    assert usage["prompt_tokens"] == tokenized["count"]
    assert len(tokenized["token_strs"]) == tokenized["count"]
    assert post(url, "/detokenize", {"tokens": tokenized["tokens"]}) == {"prompt": text}
    # TGI's form on the same path: the same ids, with their spans as byte offsets (a character
    # split over byte tokens is each one's span, as the tokenizer's offsets say).
    tgi = post(url, "/tokenize", {"inputs": text})
    assert [token["id"] for token in tgi] == tokenized["tokens"]
    assert all(token["text"] == text.encode()[token["start"]:token["stop"]].decode() for token in tgi)


def test_bad_bodies_get_422_and_version_answers(url):
    response = requests.post(url + "/detokenize", json={"tokens": [10 ** 9]}, timeout=30)
    assert response.status_code == 422 and "1000000000" in response.json()["error"], response.text
    response = requests.post(url + "/tokenize", json={"model": "default"}, timeout=30)
    assert response.status_code == 422 and "`prompt` or `messages`" in response.json()["error"], response.text
    version = requests.get(url + "/version", timeout=30).json()["version"]
    assert version == requests.get(url + "/info", timeout=30).json()["version"]
