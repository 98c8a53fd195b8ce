"""Chunked prefill equals one-shot prefill, and requests batched together (prefill chunks and
decodes mixed in one forward) produce exactly the tokens each produces alone."""
import pytest
import torch
from conftest import make_executor, make_runner, runner_logits

from superinfer.pb import shard_pb2 as pb

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
        """requests: id -> {prompt, blocks, params, joins_at}; returns id -> generated tokens."""
        computed = {rid: 0 for rid in requests}
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
