"""The `openai` client against the launched server's /v1 endpoints."""
import uuid

import requests
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


def test_n_choices_compute_the_prompt_once(server):
    """n choices are n engine requests admitted together: the first computes the prompt, the
    others take its full KV blocks from the prefix cache in the same step; greedy, every choice
    is the answer one request gets."""
    openai = client(server.url)
    prompt = f"Note {uuid.uuid4().hex}: " + " ".join(["the quick brown fox jumps over the lazy dog"] * 6)
    queried, hits = (server.metric(f"superinfer_prefix_cache_{kind}_tokens_total") for kind in ("queried", "hit"))
    reply = openai.completions.create(model="tgi", prompt=prompt, max_tokens=8, temperature=0, n=4)
    prompt_tokens = reply.usage.prompt_tokens
    full_blocks = (prompt_tokens - 1) // 16  # the last prompt token is always computed
    assert full_blocks >= 3
    assert server.metric("superinfer_prefix_cache_queried_tokens_total") - queried == 4 * prompt_tokens
    assert server.metric("superinfer_prefix_cache_hit_tokens_total") - hits == 3 * full_blocks * 16
    one = openai.completions.create(model="tgi", prompt=prompt, max_tokens=8, temperature=0)
    assert [choice.text for choice in reply.choices] == [one.choices[0].text] * 4


def test_logit_bias_bans_and_forces_tokens(url):
    import requests

    prompt = "The three primary colors are"
    greedy = requests.post(f"{url}/generate", json={"inputs": prompt, "parameters": {
        "max_new_tokens": 1, "details": True}}, timeout=120).json()["details"]["tokens"][0]
    banned = client(url).completions.create(model="tgi", prompt=prompt, max_tokens=1, temperature=0,
                                             logit_bias={str(greedy["id"]): -100})
    assert banned.choices[0].text != greedy["text"]
    forced_id = requests.post(f"{url}/tokenize", json={"inputs": " banana"}, timeout=60).json()[-1]["id"]
    forced = client(url).chat.completions.create(
        model="tgi", messages=[{"role": "user", "content": prompt}], max_tokens=3, temperature=0,
        logit_bias={str(forced_id): 100})
    assert forced.choices[0].message.content == " banana" * 3


def test_models_are_listed_and_retrieved_by_id(url):
    import openai

    served = [model.id for model in client(url).models.list().data]
    assert served
    assert client(url).models.retrieve(served[0]).id == served[0]
    try:
        client(url).models.retrieve("no-such-model")
    except openai.NotFoundError as error:
        assert "no-such-model" in error.response.json()["error"]
    else:
        raise AssertionError("an unknown model was found")


def test_continue_final_message_continues_the_assistants_text(url):
    # vLLM's extra body fields through the OpenAI client: the prompt ends inside the last
    # (assistant) message, so the answer continues it: exactly what /generate answers for the
    # text the template wrote (greedy).
    messages = [{"role": "user", "content": "Count from one to ten."},
                {"role": "assistant", "content": "One, two, three,"}]
    answer = client(url).chat.completions.create(
        model="tgi", messages=messages, max_tokens=8, temperature=0,
        extra_body={"continue_final_message": True, "add_generation_prompt": False})
    templated = requests.post(f"{url}/chat_tokenize", json={"messages": messages, "continue_final_message": True},
                              timeout=60).json()["templated_text"]
    assert templated.endswith("<|im_start|>assistant\nOne, two, three,")
    generated = requests.post(f"{url}/generate", json={"inputs": templated, "parameters": {"max_new_tokens": 8}},
                              timeout=120).json()["generated_text"]
    assert answer.choices[0].message.content == generated
    refused = requests.post(f"{url}/v1/chat/completions", timeout=60, json={
        "messages": messages, "continue_final_message": True, "add_generation_prompt": True})
    assert refused.status_code == 422 and "cannot both be true" in refused.json()["error"]


def test_stop_sequences_are_left_out_as_openai_leaves_them(url):
    # OpenAI (and vLLM) return the text before the stop sequence; TGI's /generate keeps it.
    prompt, stop = "1, 2, 3, 4,", [" 7"]
    tgi = requests.post(f"{url}/generate", timeout=120, json={
        "inputs": prompt, "parameters": {"max_new_tokens": 16, "stop": stop}}).json()["generated_text"]
    assert tgi.endswith(" 7"), tgi
    completion = client(url).completions.create(model="tgi", prompt=prompt, max_tokens=16, temperature=0, stop=stop)
    assert completion.choices[0].text == tgi[:-len(" 7")]
    assert completion.choices[0].finish_reason == "stop"
    streamed = client(url).completions.create(model="tgi", prompt=prompt, max_tokens=16, temperature=0, stop=stop,
                                              stream=True)
    assert "".join(chunk.choices[0].text for chunk in streamed if chunk.choices) == completion.choices[0].text
    kept = client(url).completions.create(model="tgi", prompt=prompt, max_tokens=16, temperature=0, stop=stop,
                                          extra_body={"include_stop_str_in_output": True})
    assert kept.choices[0].text == tgi
    seven = requests.post(f"{url}/tokenize", json={"inputs": "7"}, timeout=60).json()[-1]["id"]
    by_token = client(url).completions.create(model="tgi", prompt=prompt, max_tokens=16, temperature=0,
                                              extra_body={"stop_token_ids": [seven]})
    assert by_token.choices[0].text == tgi and by_token.choices[0].finish_reason == "stop"


def test_min_tokens_hold_the_end_back(url):
    # vLLM's min_tokens: the greedy reply goes on past where it ended, the same text up to there.
    messages = [{"role": "user", "content": "Answer with one word: is the sky blue?"}]
    short = client(url).chat.completions.create(model="tgi", messages=messages, max_tokens=40, temperature=0)
    ended = short.usage.completion_tokens
    assert short.choices[0].finish_reason == "stop" and ended < 30
    longer = client(url).chat.completions.create(model="tgi", messages=messages, max_tokens=40, temperature=0,
                                                 extra_body={"min_tokens": ended + 6})
    assert longer.usage.completion_tokens >= ended + 6
    assert longer.choices[0].message.content.startswith(short.choices[0].message.content)
    # A stop token is held back too; past min_tokens it ends the generation again.
    prompt = "1, 2, 3, 4,"
    seven = requests.post(f"{url}/tokenize", json={"inputs": "7"}, timeout=60).json()[-1]["id"]
    first = client(url).completions.create(model="tgi", prompt=prompt, max_tokens=16, temperature=0,
                                           extra_body={"stop_token_ids": [seven]})
    held = client(url).completions.create(model="tgi", prompt=prompt, max_tokens=16, temperature=0,
                                          extra_body={"stop_token_ids": [seven], "min_tokens": first.usage.completion_tokens + 1})
    assert held.usage.completion_tokens > first.usage.completion_tokens
    assert held.choices[0].text.startswith(first.choices[0].text[:-1])


def test_min_p_one_keeps_only_the_most_likely_token(url):
    # vLLM's min_p: at 1.0 nothing less likely than the top token is left, so sampling is greedy.
    prompt = "The three primary colors are"
    greedy = client(url).completions.create(model="tgi", prompt=prompt, max_tokens=12, temperature=0)
    for seed in (1, 2):
        sampled = client(url).completions.create(model="tgi", prompt=prompt, max_tokens=12, temperature=1.0,
                                                 seed=seed, extra_body={"min_p": 1.0})
        assert sampled.choices[0].text == greedy.choices[0].text


def test_presence_penalty_zero_is_no_penalty(url):
    # OpenAI's default, which its sample code sends: the reply is the same as without it.
    messages = [{"role": "user", "content": "List the days of the week."}]
    plain = client(url).chat.completions.create(model="tgi", messages=messages, max_tokens=24, temperature=0)
    zero = client(url).chat.completions.create(model="tgi", messages=messages, max_tokens=24, temperature=0,
                                               presence_penalty=0, frequency_penalty=0)
    assert zero.choices[0].message.content == plain.choices[0].message.content
    # A penalty moves greedy decoding (a negative one, toward tokens it already said: this
    # model's margins are wider than 2 on this list).
    penalized = client(url).chat.completions.create(model="tgi", messages=messages, max_tokens=24, temperature=0,
                                                    presence_penalty=-2)
    assert penalized.choices[0].message.content != plain.choices[0].message.content


def _token_ids(url, text):
    reply = requests.post(f"{url}/tokenize", json={"inputs": text}, timeout=30)
    reply.raise_for_status()
    return [token["id"] for token in reply.json()]


def test_allowed_token_ids_keep_the_reply_to_those_tokens(url):
    # vLLM's allowed_token_ids: greedy and sampled replies hold only those tokens.
    allowed = _token_ids(url, " red green blue")
    prompt = "The three primary colors are"
    for extra in ({"temperature": 0}, {"temperature": 1.0, "seed": 5}):
        reply = client(url).completions.create(model="tgi", prompt=prompt, max_tokens=6,
                                               extra_body={"allowed_token_ids": allowed}, **extra)
        assert reply.usage.completion_tokens == 6
        assert set(_token_ids(url, reply.choices[0].text)) <= set(allowed), reply.choices[0].text


def test_bad_words_keep_a_word_out_of_the_reply(url):
    prompt = "The capital of France is"
    greedy = client(url).completions.create(model="tgi", prompt=prompt, max_tokens=8, temperature=0)
    assert "Paris" in greedy.choices[0].text
    banned = client(url).completions.create(model="tgi", prompt=prompt, max_tokens=8, temperature=0,
                                            extra_body={"bad_words": ["Paris"]})
    assert "Paris" not in banned.choices[0].text and banned.choices[0].text


def test_continuous_usage_stats_count_tokens_as_they_stream(url):
    chunks = list(client(url).completions.create(
        model="tgi", prompt="Count to ten:", max_tokens=5, temperature=0, stream=True,
        extra_body={"stream_options": {"include_usage": True, "continuous_usage_stats": True}}))
    counted = [chunk.usage.completion_tokens for chunk in chunks if chunk.choices]
    assert counted == list(range(1, 6))
    assert chunks[-1].usage.completion_tokens == 5 and not chunks[-1].choices
    assert len({chunk.usage.prompt_tokens for chunk in chunks}) == 1


def test_skip_special_tokens_false_keeps_their_text(url):
    messages = [{"role": "user", "content": "Say hi."}]
    first = client(url).chat.completions.create(model="tgi", messages=messages, max_tokens=60, temperature=0)
    assert first.choices[0].finish_reason == "stop"
    # The end-of-turn token that ends the reply stays out of the text either way.
    kept = client(url).chat.completions.create(model="tgi", messages=messages, max_tokens=60, temperature=0,
                                               extra_body={"skip_special_tokens": False})
    assert kept.choices[0].message.content == first.choices[0].message.content
    # Generated past it (ignore_eos), its text is there only when asked for.
    past = first.usage.completion_tokens + 3
    for skip in (False, True):
        reply = client(url).chat.completions.create(model="tgi", messages=messages, max_tokens=past, temperature=0,
                                                    extra_body={"skip_special_tokens": skip, "ignore_eos": True})
        assert ("<|im_end|>" in reply.choices[0].message.content) == (not skip), reply.choices[0].message.content
