"""A short bench against the real server: `superinfer bench compare` launches `superinfer
launch` (embedded model, small pools, loopback) for one policy, replays a few requests through
`/generate_stream`, and reports them. Skips when the launcher or the router is not built."""
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
def test_bench_compare_against_the_launched_server(tmp_path):
    out = tmp_path / "compare"
    code = main([
        "bench", "compare", "--policies", "fcfs", "--rates", "4", "--num-requests", "4",
        "--prompt-tokens", "12", "--output-tokens", "6", "--ignore-eos",
        "--ttft-slo-ms", "60000", "--tbt-slo-ms", "60000",
        "--device-kv-blocks", "64", "--host-kv-blocks", "64", "--launch-args", "--max-batch-tokens 256",
        "--out", str(out), "--no-progress", "--startup-timeout", "300",
    ])
    assert code == 0
    document = json.loads((out / "compare.json").read_text())
    (run,) = document["runs"]
    summary = run["summary"]
    assert run["series"] == "fcfs" and summary["failed"] == 0 and summary["completed"] == 4
    # ignore_eos: every request streams exactly max_new_tokens tokens.
    assert [r["output_tokens"] for r in run["requests"]] == [6, 6, 6, 6]
    assert summary["attainment"]["both"] == 1.0
    assert 0 < summary["ttft_s"]["p50"] < summary["e2e_s"]["p50"]
    # The router counted predicted and measured step time over the run.
    assert summary["step_load_factor"] is not None and summary["step_load_factor"] > 0
    assert (out / "compare_attainment_vs_rate.png").is_file()
