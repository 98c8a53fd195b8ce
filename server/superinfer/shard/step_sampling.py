"""Rank 0's part of a step after the forward: which logits rows belong to which request, and
the sampling — on the host (`sample_on_host`: any parameters, grammar masks, prompt logprobs)
or, for a step of plain greedy rows that may run ahead, on the device (`sample_on_device`: the
picks stay there; each request's token list holds a placeholder until the step is finished)."""
from dataclasses import dataclass, field

import torch

from ..pb import shard_pb2
from .device_sampling import PENDING_TOKEN, DeviceSample, plain_greedy
from .plan import ScheduledWork, read_sampling_params
from .rank_commands import RankWork
from .requests import RequestState
from .sampling import SamplingFailure, prompt_logprobs, sample
from .token_mask import unpack_allowed


@dataclass
class DevicePicks:
    """A step's plain greedy picks kept on the device, and per pick (output index, request
    state, position in its token list, row)."""

    sample: DeviceSample
    rows: list = field(default_factory=list)


def samples_plain_greedy(request: shard_pb2.StepRequest, requests: dict[int, RequestState]) -> bool:
    """Whether every row `request` samples is plain greedy without prompt logprobs, so it may run
    before the step ahead of it is finished (a request it does not know: no, let the plan be
    refused in order)."""
    new = {n.id: n for n in request.new_requests}
    for item in request.scheduled:
        if item.id in new:
            params, prompt_logprobs = read_sampling_params(new[item.id].parameters), new[item.id].prompt_logprobs
            do_sample, penalty = params.do_sample, params.needs_host_after(0)
        elif item.id in requests:
            state = requests[item.id]
            do_sample, penalty, prompt_logprobs = state.params.do_sample, state.needs_host, state.prompt_logprobs
        else:
            return False
        if prompt_logprobs or (item.sample and not plain_greedy(do_sample, penalty, item.allowed_tokens)):
            return False
    return True


def logit_rows(scheduled: list[ScheduledWork], work: RankWork, requests: dict[int, RequestState]):
    """Where each request's logits are: the sampled rows as (index in `scheduled`, row) and
    the prompt rows as index -> (first row, next prompt tokens)."""
    sample_rows: list[tuple[int, int]] = []
    prompt_rows: dict[int, tuple[int, list[int]]] = {}
    row = 0
    for index, (item, offsets) in enumerate(zip(scheduled, work.logit_offsets)):
        prompt_count = len(offsets) - (1 if item.sample else 0)
        if prompt_count:
            state = requests[item.request_id]
            prompt_rows[index] = (row, state.token_ids[item.start + 1 : item.start + 1 + prompt_count])
        if item.sample:
            sample_rows.append((index, row + prompt_count))
        row += len(offsets)
    return sample_rows, prompt_rows


def _rows_of(logits: torch.Tensor, rows: list[int]) -> torch.Tensor:
    # [S, V]; the common step (every row sampled, in order) needs no copy.
    return logits if rows == list(range(logits.shape[0])) else logits[rows]


def sample_on_device(states: list[RequestState], logits: torch.Tensor, sample_rows: list[tuple[int, int]],
                     step_id: int, pending: dict[int, tuple[DeviceSample, int]]) -> DevicePicks:
    """Plain greedy picks kept on the device (`states`: the sampled rows' requests); each
    request's token list gets a placeholder at the picked token's position until the step is
    finished, and `pending` says where its token is meanwhile."""
    picks = DevicePicks(DeviceSample(_rows_of(logits, [row for _, row in sample_rows]),
                                     max(state.params.top_n_tokens for state in states)))
    for k, ((index, _), state) in enumerate(zip(sample_rows, states)):
        picks.rows.append((index, state, len(state.token_ids), k))
        state.token_ids.append(PENDING_TOKEN)
        state.sampled_in_step = step_id
        pending[state.request_id] = (picks.sample, k)
    return picks


def finish_device_picks(picks: DevicePicks, outputs: list[shard_pb2.RequestOutput],
                        pending: dict[int, tuple[DeviceSample, int]]) -> None:
    """Waits for the picks' host copy and writes each token into its request and its output."""
    tokens, logprobs, top_values, top_ids = picks.sample.result()
    for index, state, position, row in picks.rows:
        if state.token_ids[position] == PENDING_TOKEN:
            state.token_ids[position] = tokens[row]
        if pending.get(state.request_id, (None,))[0] is picks.sample:
            del pending[state.request_id]
        top_n = state.params.top_n_tokens
        outputs[index].token.CopyFrom(shard_pb2.SampledToken(
            id=tokens[row], logprob=logprobs[row],
            top_tokens=[shard_pb2.TokenLogprob(id=i, logprob=lp)
                        for i, lp in zip(top_ids[row][:top_n], top_values[row][:top_n])],
        ))


def sample_on_host(scheduled: list[ScheduledWork], requests: dict[int, RequestState], logits,
                   sample_rows: list[tuple[int, int]], prompt_rows: dict[int, tuple[int, list[int]]], step_id: int,
                   outputs: list[shard_pb2.RequestOutput]) -> None:
    """Samples where the plan says so, into `outputs`; each sampled token is kept in the
    request's state (the next step's input, whether or not the router has seen it yet)."""
    if sample_rows:
        sampled_states = [requests[scheduled[i].request_id] for i, _ in sample_rows]
        sampled_logits = _rows_of(logits, [row for _, row in sample_rows])
        allowed = unpack_allowed([scheduled[i].allowed_tokens for i, _ in sample_rows],
                                 sampled_logits.shape[-1], sampled_logits.device)
        tokens = sample(sampled_logits, sampled_states, allowed)
        for (index, _), state, token in zip(sample_rows, sampled_states, tokens):
            if isinstance(token, SamplingFailure):
                outputs[index].error = token.message
                state.failure = token.message
                continue
            state.token_ids.append(token.token_id)
            state.sampled_in_step = step_id
            # Its prompt's logprobs are sent with its first token (this step scored the rest):
            # a re-prefill after a recompute scores nothing again, and its steps may run ahead.
            state.prompt_logprobs = False
            outputs[index].token.CopyFrom(shard_pb2.SampledToken(
                id=token.token_id, logprob=token.logprob,
                top_tokens=[shard_pb2.TokenLogprob(id=i, logprob=lp) for i, lp in token.top_tokens],
            ))
    for index, (first, targets) in prompt_rows.items():
        top_n = requests[scheduled[index].request_id].prompt_top_n
        chosen, ranks, tops = prompt_logprobs(logits[first : first + len(targets)], targets, top_n)
        outputs[index].prompt_logprobs.extend(chosen)
        outputs[index].prompt_ranks.extend(ranks)
        if top_n:
            for top in tops:
                outputs[index].prompt_top_tokens.add().tokens.extend(
                    shard_pb2.TokenLogprob(id=i, logprob=lp) for i, lp in top)
