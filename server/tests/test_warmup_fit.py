"""The warm-up's step shapes fit the pool and the budget, and its fit is the scheduler
crate's."""
import pytest

from superinfer import _router
from superinfer.shard.warmup import _shapes

SHAPES = _shapes(512, 32, 512, 16)


def test_the_warm_up_fit_is_the_scheduler_crates():
    # The fit itself is tested in Rust (superinfer_scheduler::cost_fit); this checks the
    # binding the warm-up calls: a linear machine comes back exactly, terms in order.
    truth = (0.05, 0.002, 0.01, 0.0001)
    shapes = [(p, d, p + d * c) for p, d, c in SHAPES]
    times = [truth[0] + truth[1] * p + truth[2] * d + truth[3] * c for p, d, c in shapes]
    assert _router.fit_step_cost(shapes, times) == pytest.approx(truth, rel=1e-6)
    with pytest.raises(ValueError):
        _router.fit_step_cost(shapes, times[:-1])


@pytest.mark.parametrize("max_tokens, max_requests, blocks", [(64, 8, 48), (2048, 256, 64), (512, 32, 512)])
def test_shapes_fit_the_pool_and_the_budget(max_tokens, max_requests, blocks):
    shapes = _shapes(max_tokens, max_requests, blocks, 16)
    assert len(shapes) >= 5 and len(set(shapes)) == len(shapes)
    for prefill, decodes, context in shapes:
        assert prefill <= max_tokens and decodes <= max_requests
        assert -(-prefill // 16) * 16 + decodes * (-(-max(context, 1) // 16) * 16) <= blocks * 16


def test_a_timed_step_computes_the_logits_of_every_row_a_step_samples(make_tiny_runner, tiny_llama_dir, monkeypatch):
    # A decode step of n requests runs the LM head over n rows, which costs more than one
    # row; the warm-up times what the executor computes.
    from superinfer.shard.warmup import _chunks, time_step

    runner = make_tiny_runner(tiny_llama_dir)
    rows = []
    original = runner.logits
    monkeypatch.setattr(runner, "logits", lambda hidden: rows.append(hidden.shape[0]) or original(hidden))
    time_step(runner, _chunks(20, 3, 40, runner.block_size))  # a prefill chunk and three decodes
    assert rows == [4]


def test_cost_check_reports_each_batch_against_the_fit(tiny_llama_dir, tmp_path, capsys):
    import json

    from superinfer.shard import cost_check
    from superinfer.shard.warmup import _chunks

    assert cost_check.main(["--model", str(tiny_llama_dir), "--cache-dir", str(tmp_path), "--batches", "1", "3",
                            "--context-tokens", "40", "--device-kv-blocks", "16", "--max-batch-tokens", "64",
                            "--max-batch-requests", "8", "--rounds", "2", "--threads", "1",
                            "--prefills", "4", "16", "--mixed", "8:24:2"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [row["size"] for row in result["decode"]] == [1, 3]
    with pytest.raises(SystemExit):
        cost_check.main(["--mixed", "8:x:2"])
    assert [row["size"] for row in result["prefill"]] == [4, 16]
    # A chunk of 8 after 24 computed beside 2 decodes over 40: 8 + 2 rows, 32 + 2 * 40 positions.
    assert [row["size"] for row in result["mixed"]] == [[8, 24, 2]]
    assert result["cost_model"]["token_curve"]["tokens_s"], "the warm-up measured a token curve"
    assert cost_check._shape("mixed", (8, 24, 2), _chunks(8, 2, 40, 16, computed=24)) == (8, 2, 112)
    for row in result["decode"] + result["prefill"] + result["mixed"]:
        assert row["predicted_ms"] > 0 and row["linear_predicted_ms"] > 0
        assert row["measured_ms"]["min"] <= row["measured_ms"]["median"]
        # One prediction per step: the median ratio is the median time over the prediction.
        for predicted, ratio in (("predicted_ms", "measured_over_predicted"), ("linear_predicted_ms", "measured_over_linear")):
            assert row[ratio]["median"] == pytest.approx(row["measured_ms"]["median"] / row[predicted], rel=1e-9)


def test_row_padding_bench_times_each_batch_with_and_without(tiny_llama_dir, tmp_path, capsys):
    import json

    from superinfer.shard import row_padding_bench

    assert row_padding_bench.main(["--model", str(tiny_llama_dir), "--cache-dir", str(tmp_path), "--batches", "1", "3",
                                   "--context-tokens", "40", "--device-kv-blocks", "16", "--max-batch-tokens", "64",
                                   "--max-batch-requests", "8", "--rounds", "2", "--threads", "1"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert len(result["table"]) == 8 and [row["requests"] for row in result["decode"]] == [1, 3]
    assert all(row["padded_to"] >= row["requests"] and row["padded_over_unpadded"] > 0 for row in result["decode"])


def test_rotation_bench_runs_the_time_share_pattern_and_prices_a_rotation(tiny_llama_dir, tmp_path, capsys):
    """Every step brings a request in, computes it and sends it out after the compute (the whole
    table, or the written block only as with host mirrors); the bench checks each copy out is
    acknowledged in its own step's reply (else it raises)."""
    import json

    from superinfer.shard import rotation_bench

    assert rotation_bench.main(["--model", str(tiny_llama_dir), "--cache-dir", str(tmp_path), "--requests", "3",
                                "--rotating", "1", "2", "--steps", "5", "--context-tokens", "40",
                                "--device-kv-blocks", "16", "--max-batch-tokens", "64", "--max-batch-requests", "8",
                                "--rounds", "1", "--threads", "1"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [row["rotating"] for row in result["rows"]] == [1, 2]
    assert all(row["plain_ms"] > 0 and row["rotating_ms"] > 0 and row["mirrored_ms"] > 0 for row in result["rows"])
    with pytest.raises(SystemExit):
        rotation_bench.main(["--requests", "2", "--rotating", "3"])
