"""Trace loading and scaling, arrival processes, and workload construction."""
import argparse
import hashlib
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from superinfer.bench.arrivals import gamma_arrivals
from superinfer.bench.prompts import LengthLimits, PromptBuilder
from superinfer.bench.sharegpt import Conversation, load_conversations
from superinfer.bench.trace import DEFAULT_TRACE, load_trace
from superinfer.bench.workload import WorkloadConfig, attach_prompts, requests_for, trace_start



class WordTokenizer:
    """Whitespace words as tokens (with their trailing space), for exact expectations."""

    def spans(self, text):
        spans, start = [], None
        for i, char in enumerate(text):
            if not char.isspace() and (start is None or text[i - 1].isspace()):
                if start is not None:
                    spans.append((start, i))
                start = i
        if start is not None:
            spans.append((start, len(text)))
        return spans


def write_trace(path: Path) -> Path:
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.0000000,100,10\n"
        "2023-11-16 18:15:47.5000000,200,20\n"
        "2023-11-16 18:15:50.0000000,3000,30\n"
        "2023-11-16 18:15:56.0000000,400,40"
    )
    return path


def test_trace_loading_and_rate_scaling(tmp_path):
    trace = load_trace(write_trace(tmp_path / "t.csv"))
    assert trace.offsets_s.tolist() == [0.0, 1.5, 4.0, 10.0]
    assert trace.prompt_tokens.tolist() == [100, 200, 3000, 400]
    assert trace.mean_rate == pytest.approx(0.3)  # 3 gaps over 10 s
    scaled = trace.scaled_to(3.0)
    assert scaled.mean_rate == pytest.approx(3.0)
    assert scaled.offsets_s.tolist() == pytest.approx([0.0, 0.15, 0.4, 1.0])  # burst shape kept
    assert scaled.head(2, None).offsets_s.tolist() == pytest.approx([0.0, 0.15])
    assert len(scaled.head(None, 0.5)) == 3


def test_trace_arrivals_with_clipped_trace_lengths(tmp_path):
    trace = load_trace(write_trace(tmp_path / "t.csv"))
    config = WorkloadConfig(arrival="trace", rate=3.0, num_requests=None, duration_s=5.0, lengths="trace",
                            limits=LengthLimits(max_prompt_tokens=1024, max_total_tokens=1050))
    specs = requests_for(config, trace)
    assert [s.arrival_s for s in specs] == pytest.approx([0.0, 0.15, 0.4, 1.0])
    assert [(s.prompt_tokens, s.max_new_tokens) for s in specs] == [(100, 10), (200, 20), (1024, 26), (400, 40)]


def test_seeds_replay_different_stretches_of_the_trace():
    """Seed 0 replays the trace's head (as every earlier measurement did); another seed a window
    it draws, rebased to start at 0 and compressed by the same factor, its lengths from the
    same rows."""
    trace = load_trace(DEFAULT_TRACE)
    config = WorkloadConfig(arrival="trace", rate=1.0, num_requests=30, lengths="trace",
                            limits=LengthLimits(max_prompt_tokens=100_000, max_total_tokens=200_000))
    head = requests_for(config, trace)
    scaled = trace.scaled_to(1.0)
    assert [s.arrival_s for s in head] == pytest.approx(scaled.offsets_s[:30].tolist())
    starts = {trace_start(replace(config, seed=seed), trace) for seed in range(1, 6)}
    assert 0 not in starts and len(starts) == 5 and max(starts) <= len(trace) - 30
    seed = 3
    start = trace_start(replace(config, seed=seed), trace)
    window = requests_for(replace(config, seed=seed), trace)
    assert [s.arrival_s for s in window] == pytest.approx((scaled.offsets_s[start:start + 30]
                                                           - scaled.offsets_s[start]).tolist())
    assert [s.prompt_tokens for s in window] == trace.prompt_tokens[start:start + 30].tolist()
    assert requests_for(replace(config, seed=seed), trace) == window  # still reproducible


def test_shipped_azure_trace_is_the_published_file():
    readme = (DEFAULT_TRACE.parent / "README.md").read_text()
    assert hashlib.sha256(DEFAULT_TRACE.read_bytes()).hexdigest() in readme
    assert "Attribution 4.0 International" in (DEFAULT_TRACE.parent / "LICENSE").read_text()


def test_real_azure_trace_matches_its_readme():
    trace = load_trace(DEFAULT_TRACE)
    assert len(trace) == 19366
    assert trace.mean_rate == pytest.approx(5.5, rel=0.05)
    assert trace.prompt_tokens.max() == 14050 and trace.output_tokens.max() == 1000
    scaled = trace.scaled_to(40.0).head(None, 60.0)
    assert 40 * 60 * 0.5 < len(scaled) < 40 * 60 * 2


def test_gamma_arrivals_keep_the_rate_and_burstiness_raises_variance():
    rng = np.random.default_rng(1)
    poisson = np.diff(gamma_arrivals(10.0, 20001, 1.0, rng))
    bursty = np.diff(gamma_arrivals(10.0, 20001, 0.25, rng))
    assert poisson.mean() == pytest.approx(0.1, rel=0.05) and bursty.mean() == pytest.approx(0.1, rel=0.05)
    # Coefficient of variation of a gamma with shape k is 1/sqrt(k): 1 for Poisson, 2 for k=0.25.
    assert poisson.std() / poisson.mean() == pytest.approx(1.0, rel=0.1)
    assert bursty.std() / bursty.mean() == pytest.approx(2.0, rel=0.1)


def test_same_seed_same_workload_and_duration_bound():
    config = WorkloadConfig(arrival="gamma", rate=20.0, burstiness=0.5, num_requests=None, duration_s=3.0, seed=5)
    first, second = requests_for(config), requests_for(config)
    assert first == second and all(s.arrival_s < 3.0 for s in first)
    assert requests_for(WorkloadConfig(seed=6, num_requests=10)) != requests_for(WorkloadConfig(seed=5, num_requests=10))
    with pytest.raises(ValueError):
        WorkloadConfig(num_requests=None, duration_s=None)


def test_prompts_are_cut_at_an_exact_token_count():
    conversations = [Conversation("alpha beta gamma delta", "x y z w"), Conversation("one two three", "a b c d")]
    builder = PromptBuilder(conversations, WordTokenizer(), np.random.default_rng(0))
    for tokens in (1, 5, 37):
        assert len(WordTokenizer().spans(builder.build(tokens))) == tokens
    specs = attach_prompts(requests_for(WorkloadConfig(num_requests=3, prompt_tokens=9)), builder)
    assert all(len(WordTokenizer().spans(s.prompt)) == 9 for s in specs)


def test_sharegpt_lengths_follow_the_filter(tmp_path):
    path = tmp_path / "sharegpt.json"
    path.write_text(
        '[{"id": "a", "conversations": [{"from": "human", "value": "w w w w w"}, {"from": "gpt", "value": "r r r r r r"}]},'
        ' {"id": "b", "conversations": [{"from": "human", "value": "too short"}, {"from": "gpt", "value": "r r r r"}]},'
        ' {"id": "c", "conversations": [{"from": "gpt", "value": "starts with the model"}]}]'
    )
    conversations = load_conversations(path)
    assert len(conversations) == 2
    specs = requests_for(WorkloadConfig(num_requests=3, lengths="sharegpt"), None, conversations, WordTokenizer())
    assert [(s.prompt_tokens, s.max_new_tokens, s.prompt) for s in specs] == [(5, 6, "w w w w w")] * 3


def test_a_truncated_sharegpt_file_keeps_its_complete_entries(tmp_path):
    path = tmp_path / "cut.json"
    path.write_text(
        '[{"id": "a", "conversations": [{"from": "human", "value": "p"}, {"from": "gpt", "value": "r"}]},\n'
        ' {"id": "b", "conversations": [{"from": "human", "value": "cut off mid-str'
    )
    assert load_conversations(path) == [Conversation("p", "r")]


def test_trace_workloads_default_to_the_shipped_trace(tmp_path):
    from superinfer.bench import cli

    parser = argparse.ArgumentParser()
    cli.add_workload_arguments(parser)
    assert len(cli.workload_trace(parser.parse_args(["--arrival", "trace"]))) == 19366
    assert len(cli.workload_trace(parser.parse_args(["--lengths", "trace"]))) == 19366
    assert cli.workload_trace(parser.parse_args([])) is None
    given = write_trace(tmp_path / "t.csv")
    assert len(cli.workload_trace(parser.parse_args(["--lengths", "trace", "--trace", str(given)]))) == len(load_trace(given))
