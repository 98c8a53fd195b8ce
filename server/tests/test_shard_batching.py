"""Chunked prefill equals one-shot prefill, and requests batched together (prefill chunks and
decodes mixed in one forward) produce exactly the tokens each produces alone."""
import pytest
import torch
from conftest import make_executor, make_runner, runner_logits

from superinfer.pb import shard_pb2 as pb
from superinfer.shard.errors import PlanError
from superinfer.shard.plan import InFlight, PlanLimits, validate_plan

PROMPT_LEN = 230


@pytest.mark.parametrize("chunk", [1, 7, 16, 100])
def test_chunked_prefill_equals_one_shot(tiny_llama_dir, chunk):
    runner = make_runner(tiny_llama_dir)
    prompt = torch.randint(3, 512, (PROMPT_LEN,), generator=torch.Generator().manual_seed(5)).tolist()
    one_shot = runner_logits(runner, prompt, list(range(16)))
    pieces = [
        runner_logits(runner, prompt[start : start + chunk], list(range(16, 32)), start=start)
        for start in range(0, PROMPT_LEN, chunk)
    ]
    chunked = torch.cat(pieces)
    assert chunked.shape == one_shot.shape
    assert (chunked - one_shot).abs().max().item() < 1e-4
    assert chunked.argmax(-1).tolist() == one_shot.argmax(-1).tolist()
    # The caches written both ways hold the same K/V.
    cache = runner.cache.device
    assert torch.allclose(cache[0:15], cache[16:31], atol=1e-5)


class MiniScheduler:
    """Drives a ShardExecutor the way a router would: chunked prefill up to `chunk` tokens per
    request and step, then decodes, until each request has `new_tokens` tokens."""

    def __init__(self, executor, new_tokens: int, chunk: int):
        self.executor, self.new_tokens, self.chunk = executor, new_tokens, chunk
        self.step_id = 0

    def run(self, requests: dict[int, dict]) -> dict[int, list[int]]:
        """requests: id -> {prompt, blocks, params, joins_at, cached}; returns id -> generated
        tokens. `cached`: prompt positions whose K/V another request's blocks hold (default 0)."""
        computed = {rid: spec.get("cached", 0) for rid, spec in requests.items()}
        tokens = {rid: [] for rid in requests}
        sent: set[int] = set()
        while any(len(tokens[rid]) < self.new_tokens for rid in requests):
            new, scheduled, forget = [], [], []
            for rid, spec in requests.items():
                if spec.get("joins_at", 0) > self.step_id or len(tokens[rid]) >= self.new_tokens:
                    continue
                if rid not in sent:
                    new.append(pb.NewRequest(id=rid, prompt_token_ids=spec["prompt"], parameters=spec["params"]))
                    sent.add(rid)
                known = len(spec["prompt"]) + len(tokens[rid])
                count = min(self.chunk, known - computed[rid])
                scheduled.append(pb.ScheduledRequest(id=rid, num_computed_tokens=computed[rid], num_new_tokens=count,
                                                     block_table=spec["blocks"], sample=computed[rid] + count == known))
                computed[rid] += count
            reply = self.executor.step(pb.StepRequest(step_id=self.step_id, new_requests=new, scheduled=scheduled, forget=forget))
            for output in reply.outputs:
                if output.HasField("token"):
                    tokens[output.request_id].append(output.token.id)
            self.step_id += 1
        return tokens


def _requests() -> dict[int, dict]:
    generator = torch.Generator().manual_seed(11)
    requests = {}
    for index in range(8):
        length = [5, 40, 17, 64, 1, 33, 90, 12][index]
        sampled = index % 3 == 0
        params = pb.SamplingParameters(do_sample=sampled, temperature=0.8, top_k=50, top_p=0.9, seed=100 + index,
                                       repetition_penalty=1.2 if index == 4 else 1.0)
        requests[index + 1] = {
            "prompt": torch.randint(3, 512, (length,), generator=generator).tolist(),
            "blocks": list(range(index * 8, index * 8 + 8)),
            "params": params,
            "joins_at": index,  # staggered: later requests prefill while earlier ones decode
        }
    return requests


def test_batch_of_eight_matches_each_alone(tiny_llama_dir):
    requests = _requests()
    batched = MiniScheduler(make_executor(tiny_llama_dir), new_tokens=12, chunk=16).run(requests)
    for rid, spec in requests.items():
        alone_spec = dict(spec, joins_at=0)
        alone = MiniScheduler(make_executor(tiny_llama_dir), new_tokens=12, chunk=16).run({rid: alone_spec})
        assert batched[rid] == alone[rid], f"request {rid} differs when batched"


def test_requests_reading_blocks_written_in_the_same_step(tiny_llama_dir):
    """The Step protocol's contract that lets n choices of one prompt compute it once: a request
    whose block table starts with blocks another request of the same step writes (here listed
    before the writer) reads them as written, since every layer writes the whole step's K/V
    before any attention reads the cache."""
    prompt = torch.randint(3, 512, (37,), generator=torch.Generator().manual_seed(3)).tolist()
    greedy = pb.SamplingParameters(do_sample=False)
    choices = {rid: {"prompt": prompt, "blocks": [0, 1, 2 * rid, 2 * rid + 1], "params": greedy, "cached": 32}
               for rid in (2, 3, 4)}
    writer = {1: {"prompt": prompt, "blocks": [0, 1, 2, 3], "params": greedy}}
    shared = MiniScheduler(make_executor(tiny_llama_dir), new_tokens=6, chunk=64).run({**choices, **writer})
    alone = MiniScheduler(make_executor(tiny_llama_dir), new_tokens=6, chunk=64).run(writer)
    assert len(alone[1]) == 6
    for rid in (1, 2, 3, 4):
        assert shared[rid] == alone[1], f"request {rid} differs from the prompt computed alone"


def test_a_block_written_in_a_step_is_read_at_its_own_position_only():
    limits = PlanLimits(num_device_blocks=32, num_host_blocks=16, block_size=16, vocab_size=512, max_position_embeddings=512)
    nothing = InFlight(frozenset(), frozenset(), frozenset(), frozenset(), frozenset())
    prompt = list(range(3, 43))
    new = [pb.NewRequest(id=rid, prompt_token_ids=prompt) for rid in (1, 2)]

    def plan(second_table: list[int], second_start: int = 32) -> pb.StepRequest:
        return pb.StepRequest(new_requests=new, scheduled=[
            pb.ScheduledRequest(id=2, num_computed_tokens=second_start, num_new_tokens=40 - second_start,
                                block_table=second_table, sample=True),
            pb.ScheduledRequest(id=1, num_computed_tokens=0, num_new_tokens=40, block_table=[0, 1, 2], sample=True)])

    assert len(validate_plan(plan([0, 1, 3]), {}, limits, nothing).scheduled) == 2
    with pytest.raises(PlanError, match="read by request 2 as its block 1 while request 1 writes it as its block 0"):
        validate_plan(plan([1, 0, 3]), {}, limits, nothing)
    with pytest.raises(PlanError, match="written by requests 2 and 1"):
        validate_plan(plan([0, 4, 5], second_start=0), {}, limits, nothing)


def test_a_prompt_scored_once_is_not_scored_again_when_recomputed(tiny_llama_dir):
    """Once its first token is sampled a request's prompt logprobs are sent: a re-prefill after
    a recompute scores nothing (the router would drop it), gives the same next token as a
    request that never asked, and its steps are plain greedy again (they may run ahead)."""
    from superinfer.shard.step_sampling import samples_plain_greedy

    prompt = torch.randint(3, 512, (20,), generator=torch.Generator().manual_seed(4)).tolist()
    tokens = {}
    for asks in (True, False):
        executor = make_executor(tiny_llama_dir)
        new = pb.NewRequest(id=1, prompt_token_ids=prompt, prompt_logprobs=asks)
        first = executor.step(pb.StepRequest(step_id=1, new_requests=[new], scheduled=[
            pb.ScheduledRequest(id=1, num_computed_tokens=0, num_new_tokens=len(prompt), block_table=[0, 1], sample=True)]))
        assert len(first.outputs[0].prompt_logprobs) == (len(prompt) - 1 if asks else 0)
        again = pb.StepRequest(step_id=2, scheduled=[
            pb.ScheduledRequest(id=1, num_computed_tokens=0, num_new_tokens=len(prompt) + 1, block_table=[2, 3], sample=True)])
        assert samples_plain_greedy(again, executor.requests)
        second = executor.step(again).outputs[0]
        assert not second.prompt_logprobs and not second.prompt_ranks
        tokens[asks] = [first.outputs[0].token.id, second.token.id]
    assert tokens[True] == tokens[False]


@pytest.mark.parametrize("top_n", [None, 0, 3])
def test_prompt_logprobs_over_chunks_carry_ranks_and_their_own_top_n(tiny_llama_dir, top_n):
    """A prompt scored in two chunks: each position's logprob, rank and alternatives are the
    one-shot forward's; `prompt_top_n` (vLLM's prompt_logprobs) sets the alternatives, unset
    they follow top_n_tokens (TGI's, 2 here)."""
    prompt = torch.randint(3, 512, (40,), generator=torch.Generator().manual_seed(9)).tolist()
    logprobs = runner_logits(make_runner(tiny_llama_dir), prompt, [0, 1, 2]).log_softmax(-1)
    executor = make_executor(tiny_llama_dir)
    new = pb.NewRequest(id=1, prompt_token_ids=prompt, prompt_logprobs=True,
                        parameters=pb.SamplingParameters(top_n_tokens=2))
    if top_n is not None:
        new.prompt_top_n = top_n
    outputs = []
    for step_id, (start, count) in enumerate([(0, 24), (24, 16)], start=1):
        step = pb.StepRequest(step_id=step_id, new_requests=[new] if step_id == 1 else [], scheduled=[
            pb.ScheduledRequest(id=1, num_computed_tokens=start, num_new_tokens=count, block_table=[0, 1, 2],
                                sample=start + count == len(prompt))])
        outputs.extend(executor.step(step).outputs)
    values = [v for o in outputs for v in o.prompt_logprobs]
    ranks = [r for o in outputs for r in o.prompt_ranks]
    tops = [t for o in outputs for t in o.prompt_top_tokens]
    assert len(values) == len(ranks) == len(prompt) - 1
    for position in range(1, len(prompt)):
        row, token = logprobs[position - 1], prompt[position]
        assert abs(values[position - 1] - float(row[token])) < 1e-4
        assert ranks[position - 1] == int((row > row[token]).sum()) + 1
    expected_n = 2 if top_n is None else top_n
    assert len(tops) == (len(prompt) - 1 if expected_n else 0)
    for position, top in enumerate(tops, start=1):
        assert [t.id for t in top.tokens] == logprobs[position - 1].topk(expected_n).indices.tolist()
