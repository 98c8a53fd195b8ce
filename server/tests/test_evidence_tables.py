"""`scripts/evidence_tables.py`: the per-repetition figures it prints for a measured comparison."""
from conftest import load_script
from superinfer.bench.outcomes import Slo


def _load():
    return load_script("evidence_tables")


def _summary(both: float, p99: float) -> dict:
    return {"attainment": {"ttft": both, "tbt": 1.0, "both": both}, "tbt_s": {"p99": p99, "max": p99 * 3},
            "throughput_tokens_per_s": 10.0, "ttft_s": {"p99": 2.0}, "goodput_rps": both}


def _request(index: int, max_gap_s: float, ttft_s: float) -> dict:
    """One request as a comparison records it (`Outcome`'s fields)."""
    return {"index": index, "ok": True, "output_tokens": 8, "ttft_s": ttft_s, "e2e_s": ttft_s + 1.0,
            "tbt_s": 0.05, "max_gap_s": max_gap_s, "priority": 0, "refused": False, "refusal_s": None}


def test_above_ratio_counts_requests_past_the_threshold_and_the_late_first_tokens_among_them():
    m = _load()
    requests = [
        _request(0, 0.9, 2.0),  # late first token, long gap
        _request(1, 0.5, 0.1),  # punctual, long gap
        _request(2, 0.2, 3.0),  # late, short gaps
        {**_request(3, 0.0, 0.0), "ok": False, "max_gap_s": None, "ttft_s": None, "tbt_s": None},  # failed
    ]
    slo = Slo(1000.0, 100.0)
    assert m._above_ratio(requests, 0.4, slo) == (1, 2)
    assert m._above_ratio([], 0.4, slo) == (0, 0)


def test_measured_prints_the_pairs_and_the_requests_past_the_ratio(capsys):
    m = _load()
    runs = []
    for repetition, (ours_p99, gaps) in enumerate([(0.9, [0.95, 0.1]), (0.2, [0.2, 0.1])]):
        runs.append({"series": "swap", "rate": 0.5, "repetition": repetition, "summary": _summary(0.5, 0.3),
                     "requests": []})
        requests = [_request(i, g, 2.0 if i == 0 else 0.1) for i, g in enumerate(gaps)]
        runs.append({"series": "rotasched", "rate": 0.5, "repetition": repetition,
                     "summary": _summary(0.7, ours_p99), "requests": requests})
    document = {"slo": {"ttft_ms": 1000.0, "tbt_ms": 100.0, "tbt_percentile": 90.0, "max_stall_ms": None},
                "unloaded": {"ttft_s": 0.2, "tbt_s": 0.02}, "policies": ["swap", "rotasched"], "runs": runs}
    m.measured(document)
    out = capsys.readouterr().out
    assert "TBT ok / p99 first token (s) / goodput (req/s): swap 100% / 2.0 / 0.50; rotasched 100% / 2.0 / 0.70" in out
    assert "per repetition: +20, +20; p99 gap ratio: 3.00, 0.67 (0.90 / 0.30 s, 0.20 / 0.30 s)" in out
    assert "output tokens/s against the faster baseline: +0%, +0%" in out
    # Threshold 1.5 × 0.3 s: one request past it in the first repetition (its first token late).
    assert "first token lost / all: 1/1, 0/0" in out
