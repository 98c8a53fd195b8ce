"""The pyo3 entry of the router: flags are parsed by the router's own clap definition."""
import subprocess
import sys

import pytest

from superinfer import router_main

_router = pytest.importorskip("superinfer._router", reason="the router extension is built by `make build`")


def test_help_lists_every_flag_with_its_environment_variable():
    result = subprocess.run([sys.executable, "-m", "superinfer.router_main", "--help"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0
    for flag, env in (("--max-batch-tokens", "MAX_BATCH_TOKENS"), ("--uds-path", "UDS_PATH"),
                      ("--otlp-endpoint", "OTLP_ENDPOINT"), ("--scheduler", "SCHEDULER")):
        assert flag in result.stdout and f"env: {env}" in result.stdout


def test_bad_flags_raise_value_error_with_the_reason():
    with pytest.raises(ValueError, match="lifo"):
        _router.serve(["--scheduler", "lifo"])
    assert router_main.main(["--port", "not-a-port"]) == 2


def test_an_unreachable_shard_is_a_runtime_error(tmp_path):
    argv = ["--uds-path", str(tmp_path / "none.sock"), "--shard-connect-timeout-s", "1", "--port", "0"]
    with pytest.raises(RuntimeError, match="cannot reach the shard"):
        _router.serve(argv)
