"""The shard benchmark's method (a warm-up pair, interleaved measured pairs with alternating
order, medians of per-pair ratios) and one small run of it end to end, so it cannot rot."""
import json

import pytest

from superinfer.shard import throughput_bench as bench


def test_pairs_are_interleaved_after_a_warm_up_pair_with_the_order_alternating():
    calls = []

    def side(name):
        def run():
            calls.append(name)
            return f"{name}{len(calls)}"
        return run

    pairs = bench.interleave(side("A"), side("B"), pairs=4)
    assert calls == ["A", "B", "A", "B", "B", "A", "A", "B", "B", "A"]
    assert pairs == [("A3", "B4"), ("A6", "B5"), ("A7", "B8"), ("A10", "B9")]
    with pytest.raises(ValueError, match="--pairs"):
        bench.interleave(side("A"), side("B"), pairs=0)


def test_a_ratio_is_the_median_of_per_pair_ratios():
    figures = bench._decode_figures([
        ({"tokens_per_s": 10.0, "best_tokens_per_s": 12.0, "outside_forward_share": 0.1, "sampling_share": 0.01,
          "step_ms": 5.0}, {"tokens_per_s": 5.0, "best_tokens_per_s": 6.0}),
        ({"tokens_per_s": 9.0, "best_tokens_per_s": 11.0, "outside_forward_share": 0.2, "sampling_share": 0.02,
          "step_ms": 6.0}, {"tokens_per_s": 9.0, "best_tokens_per_s": 10.0}),
        ({"tokens_per_s": 8.0, "best_tokens_per_s": 9.0, "outside_forward_share": 0.3, "sampling_share": 0.03,
          "step_ms": 7.0}, {"tokens_per_s": 6.4, "best_tokens_per_s": 7.0}),
    ])
    # Per pair 2.0, 1.0, 1.25: the median pair, not the ratio of medians (9 / 6.4).
    assert figures["ratio"]["median"] == 1.25 and (figures["ratio"]["min"], figures["ratio"]["max"]) == (1.0, 2.0)
    assert figures["shard_tokens_per_s"]["median"] == 9.0
    assert figures["secondary_best_step"]["ratio"] == pytest.approx(12.0 / 10.0)


def test_the_benchmark_runs_on_a_small_model(tiny_llama_dir, capsys, tmp_path):
    code = bench.main(["--model", str(tiny_llama_dir), "--batches", "1", "2", "--decode-steps", "3",
                       "--pairs", "2", "--threads", "1", "--context-tokens", "48", "--cache-dir", str(tmp_path)])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert report["pairs"] == 2 and set(report["decode"]) == {"1", "2"}
    for figures in report["decode"].values():
        assert len(figures["ratio"]["values"]) == 2 and figures["ratio"]["median"] > 0
    assert len(report["prefill"]["ratio"]["values"]) == 2


@pytest.mark.parametrize("pipeline", [False, True])
def test_decode_as_one_step_in_flight_runs_it_gives_every_token(tiny_llama_dir, pipeline):
    """The driver the GPU's idle share is measured with (`decode_ahead`): steps naming the one
    before, launched ahead where the executor allows (forced here on the CPU)."""
    from conftest import make_executor

    executor = make_executor(tiny_llama_dir, device_blocks=32)
    executor.pipeline = pipeline
    driver = bench._ShardDriver(executor, context=20, decode_steps=5)
    live = driver.prefill([list(range(3, 23)), list(range(30, 50))], 20)
    figures = driver.decode_ahead(live, 5)
    assert figures["tokens_per_s"] > 0
    assert all(len(executor.requests[rid].token_ids) == 20 + 1 + 5 for rid, _, _ in live)
    assert all(token >= 0 for rid, _, _ in live for token in executor.requests[rid].token_ids)
    assert executor._pending == {}
