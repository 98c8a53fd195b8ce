"""Metrics on synthetic timelines whose answers are known by hand."""
import math

import pytest

from superinfer.bench.client import RequestRecord
from superinfer.bench.outcomes import Outcome, Slo, outcome_from_times, stats, summarize
from superinfer.bench.runner import reduce


def test_outcome_from_a_known_timeline():
    # Sent at 1.0; tokens at 1.5, 1.6, 1.8, 1.9 → TTFT 0.5, gaps 0.1, 0.2, 0.1, end-to-end 0.9.
    outcome = outcome_from_times(7, 1.0, [1.5, 1.6, 1.8, 1.9], 1.9, True, tbt_percentile=50)
    assert outcome.ok and outcome.output_tokens == 4
    assert outcome.ttft_s == pytest.approx(0.5)
    assert outcome.e2e_s == pytest.approx(0.9)
    assert outcome.tbt_s == pytest.approx(0.1)  # median of 0.1, 0.2, 0.1
    assert outcome_from_times(7, 1.0, [1.5, 1.6, 1.8, 1.9], 1.9, True, 100).tbt_s == pytest.approx(0.2)


def test_single_token_request_has_no_gap_and_meets_tbt():
    outcome = outcome_from_times(0, 0.0, [0.3], 0.35, True, 90)
    assert outcome.tbt_s == 0.0 and outcome.e2e_s == pytest.approx(0.35)
    assert outcome.meets_tbt(Slo(100, 1))
    assert not outcome.meets_ttft(Slo(299, 1)) and outcome.meets_ttft(Slo(300, 1))


def test_failed_request_meets_nothing():
    outcome = outcome_from_times(0, 0.0, [0.1], 0.2, False, 90)
    assert not outcome.ok and not outcome.meets_ttft(Slo(1e9, 1e9)) and not outcome.meets_tbt(Slo(1e9, 1e9))


def test_stats_match_hand_computed_percentiles():
    result = stats([1, 2, 3, 4, 5, 6, 7, 8, 9, 10])
    assert result["count"] == 10 and result["mean"] == pytest.approx(5.5)
    assert result["p50"] == pytest.approx(5.5)
    assert result["p90"] == pytest.approx(9.1)
    assert result["p99"] == pytest.approx(9.91)
    assert stats([])["p99"] is None


def test_summary_attainment_goodput_throughput():
    slo = Slo(ttft_ms=200, tbt_ms=50, tbt_percentile=90)
    outcomes = [
        Outcome(0, True, 10, 0.1, 1.0, 0.04),   # meets both
        Outcome(1, True, 10, 0.3, 1.0, 0.04),   # late first token
        Outcome(2, True, 20, 0.1, 1.0, 0.08),   # slow decode
        Outcome(3, False, 0, None, None, None),  # failed
    ]
    summary = summarize(outcomes, slo, duration_s=2.0, gap_stats=stats([0.04]))
    assert summary["requests"] == 4 and summary["completed"] == 3 and summary["failed"] == 1
    assert summary["attainment"] == {"ttft": 0.5, "tbt": 0.5, "stall": 0.75, "both": 0.25}
    assert summary["goodput_rps"] == pytest.approx(0.5)
    assert summary["throughput_rps"] == pytest.approx(1.5)
    assert summary["throughput_tokens_per_s"] == pytest.approx(20.0)
    assert summary["ttft_s"]["mean"] == pytest.approx((0.1 + 0.3 + 0.1) / 3)


def test_reduce_uses_every_gap_and_the_run_span():
    slo = Slo(ttft_ms=100, tbt_ms=15, tbt_percentile=100)
    records = [
        RequestRecord(0, 8, 3, sent_at=0.0, token_times=[0.05, 0.06, 0.07], done_at=0.07),
        RequestRecord(1, 8, 3, sent_at=1.0, token_times=[1.2, 1.21, 1.23], done_at=2.0),
    ]
    result = reduce(records, slo, "s", 1.0)
    assert result.summary["duration_s"] == pytest.approx(2.0)
    assert result.summary["tbt_s"]["count"] == 4
    assert result.summary["tbt_s"]["mean"] == pytest.approx((0.01 + 0.01 + 0.01 + 0.02) / 4)
    # Request 0: TTFT 50 ms, worst gap 10 ms → both; request 1: TTFT 200 ms, worst gap 20 ms → neither.
    assert result.summary["attainment"] == {"ttft": 0.5, "tbt": 0.5, "stall": 1.0, "both": 0.5}
    assert sorted(result.gaps_s) == pytest.approx([0.01, 0.01, 0.01, 0.02])
    assert not math.isnan(result.summary["e2e_s"]["p99"])


def test_slo_rejects_nonsense():
    with pytest.raises(ValueError):
        Slo(0, 10)
    with pytest.raises(ValueError):
        Slo(10, 10, tbt_percentile=101)


def test_load_factor_from_two_scrapes_of_the_step_counters():
    from superinfer.bench.runner import load_factor

    before = {"superinfer_step_model_microseconds_total": 1000.0, "superinfer_step_shard_microseconds_total": 1500.0}
    after = {"superinfer_step_model_microseconds_total": 3000.0, "superinfer_step_shard_microseconds_total": 5500.0}
    assert load_factor(before, after) == 2.0
    assert load_factor(None, after) is None
    assert load_factor(before, before) is None  # no step between the scrapes


def test_kv_moves_between_two_scrapes():
    from superinfer.bench.runner import kv_moves

    before = {"superinfer_rotations_out_total": 3.0, "superinfer_rotations_in_total": 2.0, "superinfer_recomputes_total": 0.0,
              "superinfer_rotations_in_computed_total": 1.0}
    after = {"superinfer_rotations_out_total": 7.0, "superinfer_rotations_in_total": 6.0, "superinfer_recomputes_total": 1.0,
             "superinfer_rotations_in_computed_total": 4.0, "superinfer_rotations_out_after_compute_total": 2.0,
             "superinfer_kv_blocks_out_mirrored_total": 9.0}
    assert kv_moves(before, after) == {"rotations_out": 4, "rotations_in": 4, "rotations_in_computed": 3,
                                       "rotations_out_after_compute": 2, "blocks_out_mirrored": 9, "recomputes": 1}
    assert kv_moves(before, None) is None


def test_one_gap_above_the_stall_bound_misses_tbt_and_classes_are_reported_apart():
    # p90 of the gaps within 50 ms, but one gap of 400 ms: above the default bound (5 x 50 ms)
    # and above an explicit 300 ms one, within an explicit 500 ms one.
    times = [0.1 + 0.04 * k for k in range(20)] + [0.1 + 0.04 * 19 + 0.4]
    stalled = outcome_from_times(0, 0.0, times, times[-1], True, tbt_percentile=90, priority=1)
    assert stalled.tbt_s <= 0.05 and abs(stalled.max_gap_s - 0.4) < 1e-9
    assert not stalled.meets_tbt(Slo(200, 50)) and not stalled.meets_stall(Slo(200, 50))
    assert not stalled.meets_tbt(Slo(200, 50, max_stall_ms=300))
    assert stalled.meets_tbt(Slo(200, 50, max_stall_ms=500))
    smooth = outcome_from_times(1, 0.0, times[:-1], times[-2], True, tbt_percentile=90, priority=0)
    summary = summarize([stalled, smooth], Slo(200, 50), duration_s=1.0, gap_stats=stats([0.04, 0.4]))
    assert summary["attainment"]["stall"] == 0.5 and summary["tbt_s"]["max"] == 0.4
    assert summary["by_priority"]["0"]["attainment"]["both"] == 1.0
    assert summary["by_priority"]["1"]["attainment"]["both"] == 0.0
    # Each class's longest gap: the stall is class 1's.
    assert summary["by_priority"]["1"]["request_max_gap_s"]["max"] == pytest.approx(stalled.max_gap_s)
    assert summary["by_priority"]["0"]["request_max_gap_s"]["max"] == pytest.approx(smooth.max_gap_s)
    assert smooth.max_gap_s < stalled.max_gap_s
    with pytest.raises(ValueError):
        Slo(200, 50, max_stall_ms=20)


def test_refusals_are_counted_apart_with_their_latency():
    records = [
        RequestRecord(0, 8, 3, sent_at=0.0, token_times=[0.05, 0.06, 0.07], done_at=0.07),
        RequestRecord(1, 8, 3, sent_at=1.0, done_at=1.004, error="HTTP 429: overloaded", refused=True),
    ]
    summary = reduce(records, Slo(ttft_ms=100, tbt_ms=15), "s", 1.0).summary
    assert summary["refused"] == 1 and summary["failed"] == 1
    assert summary["refusal_s"]["max"] == pytest.approx(0.004)
    assert summary["admitted_attainment"]["ttft"] == 1.0 and summary["attainment"]["ttft"] == 0.5


def test_the_scheduler_defaults_are_the_routers_flag_defaults():
    # Defined once in the scheduler crate; the router's flags and the Python side read them.
    import json

    from superinfer import _router
    from superinfer.bench.outcomes import SCHEDULER_DEFAULTS, Slo
    from superinfer.bench.suite import BASELINES

    flags = {flag["name"]: flag["default"] for flag in json.loads(_router.router_flags())}
    assert float(flags["--ttft-slo-ms"]) == SCHEDULER_DEFAULTS["ttft_slo_ms"]
    assert float(flags["--tbt-slo-ms"]) == SCHEDULER_DEFAULTS["tbt_slo_ms"]
    assert float(flags["--tbt-slo-percentile"]) == SCHEDULER_DEFAULTS["tbt_percentile"] == Slo(1, 1).tbt_percentile
    assert int(flags["--max-batch-tokens"]) == SCHEDULER_DEFAULTS["max_batch_tokens"]
    assert int(flags["--max-batch-requests"]) == SCHEDULER_DEFAULTS["max_batch_requests"]
    assert flags["--scheduler"] == SCHEDULER_DEFAULTS["default_policy"] == SCHEDULER_DEFAULTS["policies"][-1]
    assert BASELINES == tuple(SCHEDULER_DEFAULTS["policies"][:-1])
    assert SCHEDULER_DEFAULTS["stall_factor"] == _router.default_stall_factor()
