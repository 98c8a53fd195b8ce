"""The grammar's allowed-token mask on the shard: bit order, padding past the mask's end, and
every sampling path (greedy, sampled, penalties, top tokens) restricted to the allowed tokens,
through `sample` and through a Step."""
import pytest
import torch
from conftest import TINY_VOCAB, make_executor

from superinfer.pb import shard_pb2 as pb
from superinfer.shard.errors import PlanError
from superinfer.shard.requests import RequestState, SamplingParams
from superinfer.shard.sampling import SamplingFailure, sample
from superinfer.shard.token_mask import unpack_allowed


def pack(allowed: set[int], num_bits: int) -> bytes:
    """What the router sends: token t is bit t % 8 of byte t / 8."""
    packed = bytearray(-(-num_bits // 8))
    for token in allowed:
        packed[token // 8] |= 1 << (token % 8)
    return bytes(packed)


def test_bits_are_little_endian_within_each_byte():
    allowed = unpack_allowed([pack({0, 9, 15}, 16), b"", bytes(2)], 16, torch.device("cpu"))
    assert allowed.bias[0].isfinite().nonzero().flatten().tolist() == [0, 9, 15]
    assert (allowed.bias[1] == 0).all()  # an unconstrained row in a constrained batch
    assert allowed.empty_rows == [2]
    assert unpack_allowed([b"", b""], 16, torch.device("cpu")) is None


def test_ids_past_the_mask_are_disallowed():
    # The model's vocabulary (padded to 24) is wider than the tokenizer's 10 tokens the mask covers.
    allowed = unpack_allowed([b"\xff\xff"], 24, torch.device("cpu"))
    assert allowed.bias[0].isfinite().nonzero().flatten().tolist() == list(range(16))
    allowed = unpack_allowed([pack(set(range(10)), 10)], 24, torch.device("cpu"))
    assert allowed.bias[0].isfinite().nonzero().flatten().tolist() == list(range(10))


def _request(**params) -> RequestState:
    return RequestState(1, [0, 1], 1, SamplingParams(**params))


@pytest.mark.parametrize("params", [
    {}, {"repetition_penalty": 1.5}, {"do_sample": True, "temperature": 1.5, "seed": 3},
    {"do_sample": True, "top_k": 3, "top_p": 0.9, "seed": 4}, {"do_sample": True, "temperature": 1e-9},
], ids=["greedy", "penalty", "sampled", "warped", "tiny-temperature"])
def test_every_path_samples_only_allowed_tokens(params):
    logits = torch.randn(1, 40, generator=torch.Generator().manual_seed(0)) * 4
    favourite = int(logits.argmax())
    allowed_ids = {3, 17, 29} - {favourite}
    allowed = unpack_allowed([pack(allowed_ids, 40)], 40, torch.device("cpu"))
    request = _request(top_n_tokens=5, **params)
    for _ in range(30):
        token = sample(logits, [request], allowed)[0]
        assert token.token_id in allowed_ids
        # Logprobs and alternatives are over the allowed tokens: finite, and they sum to one.
        assert token.logprob > float("-inf")
        assert {tid for tid, _ in token.top_tokens} <= allowed_ids
        assert len(token.top_tokens) <= 5
        assert abs(sum(torch.tensor([lp for _, lp in token.top_tokens]).exp().tolist()) - 1) < 1e-5


def test_a_row_with_nothing_allowed_fails_alone():
    logits = torch.randn(2, 16, generator=torch.Generator().manual_seed(1))
    allowed = unpack_allowed([bytes(2), b""], 16, torch.device("cpu"))
    empty, free = sample(logits, [_request(), _request()], allowed)
    assert isinstance(empty, SamplingFailure) and "grammar" in empty.message
    assert free.token_id == int(logits[1].argmax())


def test_a_step_applies_each_requests_mask(tiny_llama_dir):
    executor = make_executor(tiny_llama_dir)
    prompt = list(range(3, 20))
    greedy = pb.SamplingParameters(top_n_tokens=3)
    sampled = pb.SamplingParameters(do_sample=True, temperature=1.0, seed=7, top_n_tokens=3)
    new = [pb.NewRequest(id=rid, prompt_token_ids=prompt, parameters=params)
           for rid, params in ((1, greedy), (2, sampled), (3, greedy))]
    free = executor.step(pb.StepRequest(step_id=1, new_requests=new, scheduled=[
        pb.ScheduledRequest(id=3, num_computed_tokens=0, num_new_tokens=len(prompt), block_table=[0, 1], sample=True)]))
    unconstrained = free.outputs[0].token.id
    allowed_ids = {5, 6, 100} - {unconstrained}
    mask = pack(allowed_ids, TINY_VOCAB)
    # A mask shorter than the vocabulary leaves every later id out (a padded model vocabulary).
    short = pack({4}, 8)
    reply = executor.step(pb.StepRequest(step_id=2, scheduled=[
        pb.ScheduledRequest(id=1, num_computed_tokens=0, num_new_tokens=len(prompt), block_table=[2, 3], sample=True,
                            allowed_tokens=mask),
        pb.ScheduledRequest(id=2, num_computed_tokens=0, num_new_tokens=len(prompt), block_table=[4, 5], sample=True,
                            allowed_tokens=short),
    ]))
    constrained, narrow = reply.outputs
    assert constrained.token.id in allowed_ids
    assert {top.id for top in constrained.token.top_tokens} <= allowed_ids
    assert narrow.token.id == 4 and narrow.token.logprob == 0.0


def test_a_mask_must_go_with_sampling_and_fit_the_vocabulary(tiny_llama_dir):
    executor = make_executor(tiny_llama_dir)
    new = [pb.NewRequest(id=1, prompt_token_ids=list(range(3, 20)), parameters=pb.SamplingParameters())]
    chunk = pb.ScheduledRequest(id=1, num_computed_tokens=0, num_new_tokens=8, block_table=[0, 1], sample=False,
                                allowed_tokens=b"\x01")
    with pytest.raises(PlanError, match="does not sample"):
        executor.step(pb.StepRequest(step_id=1, new_requests=new, scheduled=[chunk]))
    too_long = pb.ScheduledRequest(id=1, num_computed_tokens=0, num_new_tokens=17, block_table=[0, 1], sample=True,
                                   allowed_tokens=bytes(TINY_VOCAB // 8 + 1))
    with pytest.raises(PlanError, match="more than the vocabulary"):
        executor.step(pb.StepRequest(step_id=1, new_requests=new, scheduled=[too_long]))
    assert executor.requests == {}  # rejected plans change nothing
