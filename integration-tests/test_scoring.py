"""Scoring through `/v1/completions` as lm-evaluation-harness's `local-completions` model does:
prompts as token ids, `echo` with `logprobs`, one token generated. The prompt's logprobs must be
the model's: those the generation route reports for the same tokens, with each greedy token the
most likely at its position."""
import pytest
import requests
from openai import OpenAI

PROMPT = "The three primary colors are"


def greedy_details(url, max_new_tokens=6):
    body = {"inputs": PROMPT, "parameters": {"max_new_tokens": max_new_tokens, "details": True,
                                              "decoder_input_details": True}}
    response = requests.post(url + "/generate", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()["details"]


def test_echoed_token_prompt_scores_as_the_model_generated_it(url):
    details = greedy_details(url)
    prompt = [token["id"] for token in details["prefill"]]
    continuation = [token["id"] for token in details["tokens"]]
    client = OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=120)
    scored = client.completions.create(model="tgi", prompt=prompt + continuation, max_tokens=1,
                                       temperature=0, logprobs=1, echo=True)
    logprobs = scored.choices[0].logprobs
    assert len(logprobs.tokens) == len(prompt) + len(continuation) + 1
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    # The prompt's tokens: the logprobs the generation route gives them.
    expected = [token["logprob"] for token in details["prefill"][1:]]
    assert logprobs.token_logprobs[1:len(prompt)] == pytest.approx(expected, abs=1e-3)
    # Their positions' alternatives are the model's: the prompt is not the model's greedy text, so
    # somewhere another token is more likely than the prompt's own.
    assert any(max(top.values()) > logprob + 1e-3
               for top, logprob in zip(logprobs.top_logprobs[1:len(prompt)], logprobs.token_logprobs[1:len(prompt)]))
    assert all(max(top.values()) >= logprob - 1e-6
               for top, logprob in zip(logprobs.top_logprobs[1:len(prompt)], logprobs.token_logprobs[1:len(prompt)]))
    # The greedy continuation: each token is its position's most likely, at the logprob it was
    # generated with (lm-evaluation-harness's `is_greedy`).
    for position, token in enumerate(details["tokens"]):
        at = len(prompt) + position
        assert logprobs.token_logprobs[at] == pytest.approx(token["logprob"], abs=1e-3)
        assert logprobs.token_logprobs[at] == pytest.approx(max(logprobs.top_logprobs[at].values()), abs=1e-6)
    assert scored.choices[0].text.startswith(PROMPT)


def test_lm_evaluation_harness_loglikelihood_payload(url):
    # The body its `local-completions` model posts for loglikelihood requests (a batch of
    # tokenized context + continuation), read as it reads the answer.
    details = greedy_details(url, max_new_tokens=3)
    context = [token["id"] for token in details["prefill"]]
    continuation = [token["id"] for token in details["tokens"]]
    body = {"model": "tgi", "prompt": [context + continuation, context + continuation[:1]],
            "temperature": 0, "max_tokens": 1, "logprobs": 1, "seed": 1234, "echo": True}
    response = requests.post(url + "/v1/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    choices = sorted(response.json()["choices"], key=lambda choice: choice["index"])
    assert len(choices) == 2
    for choice, length in zip(choices, [len(continuation), 1]):
        token_logprobs = choice["logprobs"]["token_logprobs"][len(context):-1]
        top_logprobs = choice["logprobs"]["top_logprobs"][len(context):-1]
        assert len(token_logprobs) == length
        assert sum(token_logprobs) == pytest.approx(sum(t["logprob"] for t in details["tokens"][:length]), abs=1e-3)
        assert all(logprob == pytest.approx(max(top.values()), abs=1e-6) for logprob, top in zip(token_logprobs, top_logprobs))


def test_characters_split_over_tokens_keep_their_names_offsets_and_bytes(url):
    # An emoji is several byte-level tokens. lm-evaluation-harness's `is_greedy` looks the
    # sampled token up among its alternatives by name, so every token is named by its own bytes,
    # the same way in both places (`bytes:\xNN` for part of a character), and `text_offset`
    # points into the text the choice shows.
    prompt = "Coffee: ☕ ☕ ☕ ☕"
    client = OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=120)
    scored = client.completions.create(model="tgi", prompt=prompt, max_tokens=6, temperature=0,
                                       logprobs=1, echo=True)
    choice = scored.choices[0]
    logprobs = choice.logprobs
    assert any(name.startswith("bytes:\\x") for name in logprobs.tokens)
    for name, offset in zip(logprobs.tokens, logprobs.text_offset):
        if not name.startswith("bytes:"):
            assert choice.text[offset:offset + len(name)] == name
    assert logprobs.text_offset == sorted(logprobs.text_offset)
    assert logprobs.text_offset[-1] <= len(choice.text)
    for name, top in zip(logprobs.tokens[1:], logprobs.top_logprobs[1:]):
        assert name in top
    # Chat: each token's bytes, joined, are the answer's.
    chat = client.chat.completions.create(
        model="tgi", messages=[{"role": "user", "content": "Write three coffee emoji: ☕☕☕"}],
        max_tokens=12, temperature=0, logprobs=True, top_logprobs=2)
    content = chat.choices[0].logprobs.content
    joined = b"".join(bytes(entry.bytes) for entry in content)
    assert joined.decode("utf-8", errors="replace") == chat.choices[0].message.content
    for entry in content:
        assert entry.token in [top.token for top in entry.top_logprobs]


def test_a_streamed_echo_starts_with_the_prompt_and_its_logprobs(url):
    # vLLM streams an echoed prompt: each choice's first chunk, then the generated tokens.
    client = OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=120)
    whole = client.completions.create(model="tgi", prompt=PROMPT, max_tokens=4, temperature=0, logprobs=1, echo=True)
    chunks = list(client.completions.create(model="tgi", prompt=PROMPT, max_tokens=4, temperature=0, logprobs=1,
                                            echo=True, stream=True))
    assert chunks[0].choices[0].text == PROMPT
    assert "".join(chunk.choices[0].text for chunk in chunks if chunk.choices) == whole.choices[0].text
    prompt_tokens = len(chunks[0].choices[0].logprobs.tokens)
    assert chunks[0].choices[0].logprobs.token_logprobs[0] is None
    assert chunks[0].choices[0].logprobs.token_logprobs[1:] == pytest.approx(
        whole.choices[0].logprobs.token_logprobs[1:prompt_tokens], abs=1e-3)


def test_vllm_prompt_logprobs_are_the_models(url):
    # vLLM's `prompt_logprobs`: each prompt token's logprob (the generation route's for the same
    # tokens), its rank, and the k most likely tokens at its position; the greedy continuation,
    # scored as a prompt, is rank 1 everywhere.
    details = greedy_details(url, max_new_tokens=4)
    prompt = [token["id"] for token in details["prefill"]]
    continuation = [token["id"] for token in details["tokens"]]
    client = OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=120)
    scored = client.completions.create(model="tgi", prompt=prompt + continuation, max_tokens=1, temperature=0,
                                       extra_body={"prompt_logprobs": 3})
    positions = scored.choices[0].model_extra["prompt_logprobs"]
    assert len(positions) == len(prompt) + len(continuation) and positions[0] is None
    tokens = prompt + continuation
    for position in range(1, len(tokens)):
        entry = positions[position]
        own = entry[str(tokens[position])]
        alternatives = sorted((value for key, value in entry.items() if value["rank"] <= 3), key=lambda v: v["rank"])
        assert [value["rank"] for value in alternatives] == [1, 2, 3]
        assert all(a["logprob"] >= b["logprob"] for a, b in zip(alternatives, alternatives[1:]))
        # Its rank agrees with the alternatives: as many of them are more likely as its rank says.
        more_likely = sum(value["logprob"] > own["logprob"] + 1e-4 for value in alternatives)
        assert more_likely == min(own["rank"] - 1, 3) or abs(alternatives[min(own["rank"], 3) - 1]["logprob"] - own["logprob"]) < 1e-3
        if position < len(prompt):
            assert own["logprob"] == pytest.approx(details["prefill"][position]["logprob"], abs=1e-3)
        else:
            assert own["rank"] == 1 and own["logprob"] == pytest.approx(details["tokens"][position - len(prompt)]["logprob"], abs=1e-3)
    # The prompt is not the model's greedy text: somewhere its token is not the most likely.
    assert any(positions[p][str(tokens[p])]["rank"] > 1 for p in range(1, len(prompt)))
    # Chat: once, for the conversation.
    chat = client.chat.completions.create(model="tgi", messages=[{"role": "user", "content": PROMPT}], max_tokens=1,
                                          extra_body={"prompt_logprobs": 0})
    positions = chat.model_extra["prompt_logprobs"]
    assert len(positions) == chat.usage.prompt_tokens and positions[0] is None
    assert all(len(entry) == 1 for entry in positions[1:])


def test_a_prompt_scored_again_is_not_served_from_the_prefix_cache(url):
    # lm-evaluation-harness scores one context with many continuations: the context's blocks are
    # cached after the first, but a request that asks for its prompt's logprobs must compute
    # every position, or the cached ones would have none (and the rest would be misplaced).
    context = ("The quick brown fox jumps over the lazy dog while five boxing wizards jump quickly, "
               "and a wizard of the north casts spells over the frozen lake at dawn")
    client = OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=120)
    scores = [client.completions.create(model="tgi", prompt=context + ending, max_tokens=1, temperature=0,
                                        logprobs=0, echo=True).choices[0].logprobs.token_logprobs
              for ending in (" today.", " today.", " tonight.")]
    assert len(scores[0]) > 34, "the context spans more than two 16-token blocks"
    assert scores[1] == pytest.approx(scores[0], abs=1e-3)
    shared = len(scores[0]) - 3
    assert scores[2][:shared] == pytest.approx(scores[0][:shared], abs=1e-3)
    assert all(value is not None for value in scores[2][1:])
    positions = [requests.post(url + "/v1/completions", json={"prompt": context, "max_tokens": 1, "prompt_logprobs": 0},
                               timeout=120).json()["choices"][0]["prompt_logprobs"] for _ in range(2)]
    assert all(entry is not None for entry in positions[1][1:])
    assert [v["logprob"] for entry in positions[1][1:] for v in entry.values()] == pytest.approx(
        [v["logprob"] for entry in positions[0][1:] for v in entry.values()], abs=1e-3)
