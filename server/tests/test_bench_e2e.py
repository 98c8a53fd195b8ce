"""A short bench against the real server: `superinfer bench compare` launches `superinfer
launch` (embedded model, small pools, loopback) for two policies, replays a few requests through
`/generate_stream` twice, interleaved, and reports them. Skips when the launcher or the router is not built."""
import importlib.util
import json

import pytest

from superinfer.cli import main


def _launch_unavailable() -> str | None:
    if importlib.util.find_spec("superinfer.launcher") is None:
        return "superinfer launch is not available (no superinfer.launcher)"
    try:
        from superinfer import _router
    except ImportError as error:
        return f"the router extension is not built: {error}"
    if not hasattr(_router, "serve"):
        return "the router extension has no serve(): rebuild with `make build`"
    return None


@pytest.mark.skipif(_launch_unavailable() is not None, reason=str(_launch_unavailable()))
def test_bench_compare_against_the_launched_servers(tmp_path, capsys):
    # Two policies, two repetitions: both servers up at once, the order rotated per repetition.
    out = tmp_path / "compare"
    code = main([
        "bench", "compare", "--policies", "fcfs,swap", "--repeats", "2", "--rates", "4", "--num-requests", "4",
        "--prompt-tokens", "12", "--output-tokens", "6", "--ignore-eos",
        "--ttft-slo-ms", "60000", "--tbt-slo-ms", "60000",
        "--device-kv-blocks", "64", "--host-kv-blocks", "64", "--launch-args", "--max-batch-tokens 256",
        "--out", str(out), "--no-progress", "--startup-timeout", "300",
    ])
    assert code == 0
    document = json.loads((out / "compare.json").read_text())
    runs = document["runs"]
    assert [(r["repetition"], r["seed"], r["series"]) for r in runs] == [
        (0, 0, "fcfs"), (0, 0, "swap"), (1, 1, "swap"), (1, 1, "fcfs")]
    assert document["interleaved"] and document["repeats"] == 2 and document["seeds"] == [0, 1]
    assert document["complete"] is True and document["runs_planned"] == 4
    for run in runs:
        summary = run["summary"]
        assert summary["failed"] == 0 and summary["completed"] == 4
        # ignore_eos: every request streams exactly max_new_tokens tokens.
        assert [r["output_tokens"] for r in run["requests"]] == [6, 6, 6, 6]
        assert summary["attainment"]["both"] == 1.0
        assert 0 < summary["ttft_s"]["p50"] < summary["e2e_s"]["p50"]
        # The router counted predicted and measured step time over the run.
        assert summary["step_load_factor"] is not None and summary["step_load_factor"] > 0
        # 64 device blocks hold 4 short requests: nothing was moved or dropped.
        assert set(summary["kv_moves"].values()) == {0}
        # Where the run's time went: at least the 4 × 6 tokens' steps, each forward within its round trip.
        steps = summary["step_time"]
        assert steps["steps"] >= 6 and 0 < steps["forward_s"] < steps["round_trip_s"], steps
    point = next(p for p in document["aggregate"] if p["series"] == "swap")
    assert point["repetitions"] == 2 and point["figures"]["both_attainment"]["median"] == 1.0
    pair = next(p for p in document["paired"] if (p["a"], p["b"], p["figure"]) == ("fcfs", "swap", "both_attainment"))
    assert pair["values"] == [0.0, 0.0]
    printed = capsys.readouterr().out
    assert "2 interleaved repetitions" in printed and "fcfs − swap: +0, n=2" in printed
    assert (out / "compare_attainment_vs_rate.png").is_file()
