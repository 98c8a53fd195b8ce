"""`scripts/evidence_tables.py`: the per-repetition figures it prints for a measured comparison."""
import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "evidence_tables.py"


def _load():
    spec = importlib.util.spec_from_file_location("evidence_tables", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _summary(both: float, p99: float) -> dict:
    return {"attainment": {"ttft": both, "both": both}, "tbt_s": {"p99": p99, "max": p99 * 3},
            "throughput_tokens_per_s": 10.0}


def test_above_ratio_counts_requests_past_the_threshold_and_the_late_first_tokens_among_them():
    m = _load()
    requests = [
        {"max_gap_s": 0.9, "ttft_s": 2.0},   # late first token, long gap
        {"max_gap_s": 0.5, "ttft_s": 0.1},   # punctual, long gap
        {"max_gap_s": 0.2, "ttft_s": 3.0},   # late, short gaps
        {"max_gap_s": None, "ttft_s": None},  # refused or failed
    ]
    assert m._above_ratio(requests, 0.4, 1.0) == (1, 2)
    assert m._above_ratio([], 0.4, 1.0) == (0, 0)


def test_measured_prints_the_pairs_and_the_requests_past_the_ratio(capsys):
    m = _load()
    runs = []
    for repetition, (ours_p99, gaps) in enumerate([(0.9, [0.95, 0.1]), (0.2, [0.2, 0.1])]):
        runs.append({"series": "swap", "rate": 0.5, "repetition": repetition, "summary": _summary(0.5, 0.3),
                     "requests": []})
        requests = [{"max_gap_s": g, "ttft_s": 2.0 if i == 0 else 0.1} for i, g in enumerate(gaps)]
        runs.append({"series": "rotasched", "rate": 0.5, "repetition": repetition,
                     "summary": _summary(0.7, ours_p99), "requests": requests})
    document = {"slo": {"ttft_ms": 1000.0, "tbt_ms": 100.0, "tbt_percentile": 90.0},
                "unloaded": {"ttft_s": 0.2, "tbt_s": 0.02}, "policies": ["swap", "rotasched"], "runs": runs}
    m.measured(document)
    out = capsys.readouterr().out
    assert "per repetition: +20, +20; p99 gap ratio: 3.00, 0.67" in out
    # Threshold 1.5 × 0.3 s: one request past it in the first repetition (its first token late).
    assert "first token lost / all: 1/1, 0/0" in out
