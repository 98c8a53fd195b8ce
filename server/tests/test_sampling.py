"""Sampling: penalties against hand-computed values, warpers restrict the support as defined,
seeded sampling reproducible and independent of the batch, logprobs of the unmodified logits."""
import math
import random

import pytest
import torch

from superinfer.shard.requests import RequestState, SamplingParams
from superinfer.shard.sampling import (
    SamplingFailure,
    apply_frequency_penalty,
    completed_bad_words,
    apply_presence_penalty,
    apply_repetition_penalty,
    min_p_filter,
    prompt_logprobs,
    sample,
    top_k_filter,
    top_p_filter,
    typical_p_filter,
)
from superinfer.shard.token_mask import AllowedTokens


def _request(rid=1, tokens=(0,), prompt_len=1, **params) -> RequestState:
    return RequestState(rid, list(tokens), prompt_len, SamplingParams(**params))


def test_repetition_penalty_divides_positive_and_multiplies_negative():
    logits = torch.tensor([2.0, -1.0, 0.5, 3.0])
    out = apply_repetition_penalty(logits, torch.tensor([0, 1, 1]), 2.0)
    assert out.tolist() == [1.0, -2.0, 0.5, 3.0]


def test_frequency_penalty_subtracts_per_occurrence():
    logits = torch.tensor([1.0, 1.0, 1.0])
    out = apply_frequency_penalty(logits, torch.tensor([2, 2, 0]), 0.5)
    assert out.tolist() == [0.5, 1.0, 0.0]


def test_penalties_apply_over_the_right_tokens():
    # Repetition over prompt + generated, frequency over generated only (prompt is [0, 1]).
    logits = torch.tensor([[4.0, 4.0, 4.0, 3.9]])
    request = _request(tokens=(0, 1, 2, 2), prompt_len=2, repetition_penalty=2.0)
    assert sample(logits, [request])[0].token_id == 3  # 0, 1, 2 all halved to 2.0
    request = _request(tokens=(0, 1, 2, 2), prompt_len=2, frequency_penalty=0.1)
    # 2 -> 3.8; 0 and 1 untouched (prompt); argmax is the first of the tied 4.0s.
    assert sample(logits, [request])[0].token_id == 0


def test_top_k_keeps_k_largest():
    logits = torch.tensor([1.0, 5.0, 3.0, 4.0, 2.0])
    kept = torch.isfinite(top_k_filter(logits, 2)).nonzero().flatten().tolist()
    assert kept == [1, 3]


def test_top_p_keeps_smallest_set_reaching_mass():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log()
    assert torch.isfinite(top_p_filter(logits, 0.7)).tolist() == [True, True, False, False]
    assert torch.isfinite(top_p_filter(logits, 0.85)).tolist() == [True, True, True, False]
    assert torch.isfinite(top_p_filter(logits, 0.01)).tolist() == [True, False, False, False]


def test_typical_p_keeps_tokens_near_the_entropy():
    probs = torch.tensor([0.4, 0.3, 0.2, 0.1])
    logits = probs.log()
    entropy = -(probs * probs.log()).sum()
    surprise_distance = (-probs.log() - entropy).abs()
    order = surprise_distance.argsort().tolist()
    kept = torch.isfinite(typical_p_filter(logits, 0.5)).nonzero().flatten().tolist()
    # The closest-to-entropy tokens, in that order, until their mass reaches 0.5.
    mass, expected = 0.0, []
    for index in order:
        expected.append(index)
        mass += float(probs[index])
        if mass >= 0.5:
            break
    assert sorted(kept) == sorted(expected)


def test_top_k_and_top_p_restrict_sampled_support():
    logits = torch.randn(1, 100, generator=torch.Generator().manual_seed(0)) * 3
    top5 = set(torch.topk(logits[0], 5).indices.tolist())
    request = _request(do_sample=True, temperature=1.0, top_k=5, seed=1)
    drawn = {sample(logits, [request])[0].token_id for _ in range(200)}
    assert drawn <= top5 and len(drawn) > 1
    request = _request(do_sample=True, temperature=1.0, top_p=0.3, seed=2)
    kept = set(torch.isfinite(top_p_filter(logits[0], 0.3)).nonzero().flatten().tolist())
    drawn = {sample(logits, [request])[0].token_id for _ in range(200)}
    assert drawn <= kept


def test_seeded_sampling_is_reproducible_and_independent_of_the_batch():
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))

    def draws(requests, rows, steps=20):
        return [[t.token_id for t in sample(logits[rows], requests)] for _ in range(steps)]

    alone = draws([_request(rid=7, do_sample=True, temperature=1.0, seed=42)], [1])
    again = draws([_request(rid=7, do_sample=True, temperature=1.0, seed=42)], [1])
    batched = draws([_request(rid=1, do_sample=True, temperature=1.0, seed=3),
                     _request(rid=7, do_sample=True, temperature=1.0, seed=42),
                     _request(rid=9)], [0, 1, 2])
    assert alone == again
    assert [row[0] for row in alone] == [row[1] for row in batched]
    other_seed = draws([_request(rid=7, do_sample=True, temperature=1.0, seed=43)], [1])
    assert other_seed != alone


def test_logprobs_come_from_unmodified_logits_with_top_n():
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0]])
    request = _request(tokens=(1,), repetition_penalty=10.0, top_n_tokens=2)
    token = sample(logits, [request])[0]
    reference = logits.log_softmax(-1)[0]
    assert token.token_id == 2  # the penalty on 1 changed the choice
    assert math.isclose(token.logprob, float(reference[2]), rel_tol=1e-6)
    assert [t for t, _ in token.top_tokens] == [1, 2]
    assert math.isclose(token.top_tokens[0][1], float(reference[1]), rel_tol=1e-6)


def test_greedy_batch_takes_argmax():
    logits = torch.randn(16, 30, generator=torch.Generator().manual_seed(4))
    tokens = sample(logits, [_request(rid=i) for i in range(16)])
    assert [t.token_id for t in tokens] == logits.argmax(-1).tolist()
    assert all(t.top_tokens == [] for t in tokens)


def test_prompt_logprobs_score_the_next_tokens():
    logits = torch.randn(4, 10, generator=torch.Generator().manual_seed(1))
    values, ranks, tops = prompt_logprobs(logits, [3, 7, 1])
    expected = [float(logits[i].log_softmax(-1)[t]) for i, t in enumerate([3, 7, 1])]
    assert values == expected
    assert tops == [[], [], []]
    # Rank: 1 + how many tokens are more likely at that position.
    assert ranks == [int((logits[i] > logits[i, t]).sum()) + 1 for i, t in enumerate([3, 7, 1])]
    best = logits[0].argmax().item()
    assert prompt_logprobs(logits[:1], [best])[1] == [1]


def test_prompt_logprobs_give_the_most_likely_tokens_at_each_position():
    logits = torch.randn(4, 10, generator=torch.Generator().manual_seed(2))
    values, _, tops = prompt_logprobs(logits, [3, 7, 1], top_n=2)
    assert len(tops) == 3
    for row, top in enumerate(tops):
        logprobs = logits[row].log_softmax(-1)
        best = logprobs.argsort(descending=True)[:2].tolist()
        assert [token for token, _ in top] == best
        assert [value for _, value in top] == [float(logprobs[t]) for t in best]
        # The prompt token's own logprob is at most the best one.
        assert values[row] <= top[0][1]


def test_a_temperature_too_small_to_divide_by_samples_greedily():
    # 1e-44 is a float32 subnormal: logits / it overflow to inf and softmax gives NaN.
    logits = torch.tensor([[1.0, 3.0, 2.0, -5.0]])
    for temperature in (1e-44, 1e-30, 1e-6):
        token = sample(logits, [_request(do_sample=True, temperature=temperature, seed=3)])[0]
        assert token.token_id == 1 and math.isfinite(token.logprob), temperature


def test_logits_that_overflow_under_temperature_fall_back_to_greedy():
    # Finite logits a model may produce, divided by a temperature that passes the greedy bound.
    logits = torch.tensor([[3.0e38, 1.0, -3.0e38, 2.0e38]])
    token = sample(logits, [_request(do_sample=True, temperature=1e-3, seed=1, top_p=0.5, top_k=2)])[0]
    assert token.token_id == 0


def test_non_finite_logits_never_reach_multinomial():
    nan_row = torch.tensor([[float("nan"), 1.0, 2.0]])
    all_masked = torch.tensor([[float("-inf")] * 3])
    for logits in (nan_row, all_masked):
        token = sample(logits, [_request(do_sample=True, temperature=0.7, seed=5, repetition_penalty=1e-38)])[0]
        assert 0 <= token.token_id < 3


def test_a_row_that_fails_fails_its_own_request_only(failing_sampling):
    from superinfer.shard import sampling

    failing_sampling("device-side assert")
    logits = torch.tensor([[0.0, 5.0], [5.0, 0.0], [1.0, 2.0]])
    requests = [_request(rid, do_sample=True, temperature=0.5, seed=rid) for rid in (1, 2, 3)]
    first, failed, third = sample(logits, requests)
    assert isinstance(failed, sampling.SamplingFailure) and "device-side assert" in failed.message
    assert first.token_id in (0, 1) and third.token_id in (0, 1)


def test_logit_bias_moves_the_greedy_choice_and_the_reported_logprobs():
    logits = torch.tensor([[3.0, 1.0, 2.0, 0.0], [3.0, 1.0, 2.0, 0.0]])
    plain, biased = sample(logits, [_request(rid=1, top_n_tokens=2), _request(rid=2, top_n_tokens=2, logit_bias={2: 5.0, 0: -100.0})])
    assert plain.token_id == 0
    assert biased.token_id == 2
    # Its logprobs are the model's, as with penalties.
    expected = logits[1].log_softmax(-1)
    assert biased.logprob == pytest.approx(float(expected[2]))
    assert biased.top_tokens == plain.top_tokens
    # The caller's logits are left as they were.
    assert logits[1].tolist() == [3.0, 1.0, 2.0, 0.0]


def test_a_biased_sampled_request_never_draws_a_banned_token():
    logits = torch.zeros(1, 6)
    request = _request(do_sample=True, temperature=1.0, seed=4, logit_bias={t: -100.0 for t in range(5)})
    assert all(sample(logits, [request])[0].token_id == 5 for _ in range(20))


def test_min_tokens_hold_back_the_end_tokens_until_reached():
    """vLLM's min_tokens: an end token gets no probability while fewer tokens than that are
    generated (greedy and sampled alike); the reported logprob stays the model's."""
    logits = torch.tensor([[0.0, 1.0, 5.0, 2.0]])
    held = _request(tokens=(0, 3), prompt_len=1, min_tokens=2, end_token_ids=(2,), top_n_tokens=1)
    [token] = sample(logits, [held])
    assert token.token_id == 3 and held.holds_back_end
    assert token.logprob == pytest.approx(float(logits[0].log_softmax(-1)[3]))
    reached = _request(tokens=(0, 3, 3), prompt_len=1, min_tokens=2, end_token_ids=(2,))
    assert sample(logits, [reached])[0].token_id == 2 and not reached.holds_back_end
    drawn = _request(do_sample=True, seed=5, min_tokens=4, end_token_ids=(2, 3))
    assert all(sample(logits, [drawn])[0].token_id in (0, 1) for _ in range(20))
    # Without end tokens named, min_tokens holds nothing back.
    assert sample(logits, [_request(min_tokens=5)])[0].token_id == 2


def test_min_tokens_yield_to_a_grammar_that_can_only_end():
    """A row whose every other token is already impossible keeps its end token."""
    logits = torch.tensor([[float("-inf"), float("-inf"), 1.0]])
    request = _request(min_tokens=3, end_token_ids=(2,))
    assert sample(logits, [request])[0].token_id == 2


def test_min_p_leaves_out_tokens_below_its_share_of_the_most_likely():
    logits = torch.tensor([2.0, 2.0 + math.log(0.5), 2.0 + math.log(0.09), -1.0])
    kept = torch.isfinite(min_p_filter(logits, 0.1)).tolist()
    assert kept == [True, True, False, False]
    assert torch.equal(min_p_filter(logits, 0.0), logits)
    # min_p 1 keeps only the most likely: a sampled request then draws the greedy token.
    request = _request(do_sample=True, temperature=1.0, seed=9, min_p=1.0)
    assert all(sample(torch.tensor([[0.5, 3.0, 2.9]]), [request])[0].token_id == 1 for _ in range(20))


def test_presence_penalty_subtracts_once_per_generated_token():
    logits = torch.tensor([1.0, 1.0, 1.0, 1.0])
    assert apply_presence_penalty(logits, torch.tensor([2, 2, 0]), 0.5).tolist() == [0.5, 1.0, 0.5, 1.0]
    # Over the generated tokens only (the prompt is token 3), as OpenAI's: greedy moves off the
    # token it already said.
    request = _request(tokens=(3, 1), prompt_len=1, presence_penalty=1.0)
    assert sample(torch.tensor([[0.0, 2.0, 1.5, 5.0]]), [request])[0].token_id == 3
    assert sample(torch.tensor([[0.0, 2.0, 1.5, 0.0]]), [request])[0].token_id == 2


def test_allowed_token_ids_restrict_greedy_and_sampled_choices():
    logits = torch.tensor([[5.0, 1.0, 2.0, 0.5]])
    assert sample(logits, [_request(allowed_token_ids=(1, 3))])[0].token_id == 1
    sampled = _request(do_sample=True, temperature=5.0, seed=3, allowed_token_ids=(2, 3))
    assert {sample(logits, [sampled])[0].token_id for _ in range(40)} == {2, 3}
    # The logprob reported stays the model's, as with a logit bias.
    assert sample(logits, [_request(allowed_token_ids=(1,))])[0].logprob == pytest.approx(
        logits.log_softmax(-1)[0, 1].item())
    # Another request of the batch is not restricted.
    assert [s.token_id for s in sample(logits.repeat(2, 1), [_request(allowed_token_ids=(3,)), _request()])] == [3, 0]


def test_allowed_token_ids_the_grammar_rules_out_fail_the_request_alone():
    logits = torch.tensor([[5.0, 1.0, 2.0, 0.5]]).repeat(2, 1)
    grammar = AllowedTokens(bias=torch.tensor([[0.0, float("-inf"), float("-inf"), float("-inf")]] * 2), empty_rows=[])
    out = sample(logits, [_request(allowed_token_ids=(1, 2)), _request()], grammar)
    assert isinstance(out[0], SamplingFailure) and "allowed_token_ids" in out[0].message
    assert out[1].token_id == 0


def test_bad_words_ban_the_token_that_would_complete_them():
    logits = torch.tensor([[1.0, 4.0, 3.0, 0.0]])
    # A one-token word is never chosen.
    assert sample(logits, [_request(bad_words=((1,),))])[0].token_id == 2
    # A two-token word (2, 1): token 1 is banned only right after a generated 2.
    word = ((2, 1),)
    assert sample(logits, [_request(tokens=(0, 3), bad_words=word)])[0].token_id == 1
    assert sample(logits, [_request(tokens=(0, 3, 2), bad_words=word)])[0].token_id == 2
    # The prompt does not count: the 2 there is not a generated token.
    assert sample(logits, [_request(tokens=(0, 2), prompt_len=2, bad_words=word)])[0].token_id == 1
    # A ban that would leave nothing is not applied.
    only = torch.tensor([[float("-inf"), 1.0, float("-inf"), float("-inf")]])
    assert sample(only, [_request(bad_words=((1,),))])[0].token_id == 1


def test_bad_words_index_bans_what_comparing_every_word_bans():
    """The per-length index gives, for any generated tail, the tokens a word-by-word comparison
    gives: words of one to four tokens sharing leads, a tail shorter than some words."""
    rng = random.Random(7)
    words = tuple({tuple(rng.randrange(6) for _ in range(rng.randint(1, 4))) for _ in range(300)})
    for _ in range(200):
        prompt = [rng.randrange(6) for _ in range(3)]
        generated = [rng.randrange(6) for _ in range(rng.randint(0, 5))]
        request = _request(tokens=prompt + generated, prompt_len=3, bad_words=words)
        expected = sorted(word[-1] for word in words
                          if len(word) - 1 <= len(generated)
                          and (len(word) == 1 or tuple(generated[len(generated) - len(word) + 1:]) == word[:-1]))
        assert sorted(completed_bad_words(request)) == expected, (generated, expected)


def test_allowed_tokens_and_bad_words_are_chosen_on_the_host():
    assert SamplingParams(allowed_token_ids=(1,)).needs_host
    assert SamplingParams(bad_words=((1, 2),)).needs_host
    assert not SamplingParams().needs_host
