"""The launcher's configuration and child supervision, with real child processes."""
import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from superinfer import launch_config, launcher
from superinfer.supervisor import Supervisor


def parse(argv: list[str]) -> launch_config.LaunchConfig:
    parser = argparse.ArgumentParser()
    launcher.add_arguments(parser)
    return launch_config.from_args(parser.parse_args(argv))


def test_flags_fall_back_to_environment_variables(monkeypatch):
    monkeypatch.setenv("PORT", "8123")
    monkeypatch.setenv("DEVICE_KV_BLOCKS", "48")
    monkeypatch.setenv("SCHEDULER", "swap")
    config = parse(["--port", "9000"])
    assert config.port == 9000  # the flag wins over the environment
    assert config.device_kv_blocks == 48
    # The router reads its own variables (it inherits the environment): nothing to forward.
    assert config.router_args == ()


def test_router_flags_are_the_routers_own(monkeypatch):
    monkeypatch.delenv("SCHEDULER", raising=False)
    monkeypatch.setenv("COLUMNS", "1000")  # argparse wraps help to the terminal's width
    parser = argparse.ArgumentParser()
    launcher.add_arguments(parser)
    help_text = parser.format_help()
    # Declared once, in the router (clap), with its help, default and variable.
    for fragment in ("--tbt-slo-percentile", "--step-timeout-s", "[env: MAX_BATCH_TOKENS", "(default 2048)"):
        assert fragment in help_text, fragment
    config = parse(["--scheduler", "fcfs", "--max-batch-tokens", "512"])
    assert config.router_args == ("--scheduler", "fcfs", "--max-batch-tokens", "512")
    # The router's parser checks values before anything starts, environment included.
    with pytest.raises(ValueError, match="lifo"):
        parse(["--scheduler", "lifo"])
    with pytest.raises(ValueError, match="not-a-number"):
        parse(["--max-batch-tokens", "not-a-number"])
    monkeypatch.setenv("SCHEDULER", "lifo")
    with pytest.raises(ValueError, match="lifo"):
        parse([])


def test_router_gets_only_the_flags_given(monkeypatch):
    for name in ("SCHEDULER", "MAX_BATCH_TOKENS", "API_KEY", "PORT", "HOSTNAME"):
        monkeypatch.delenv(name, raising=False)
    config = parse(["--max-batch-tokens", "512", "--host-kv-blocks", "32"])
    argv = launcher.router_argv(config, Path("/tmp/s.sock"))
    assert argv[argv.index("--uds-path") + 1] == "/tmp/s.sock"
    assert argv[argv.index("--max-batch-tokens") + 1] == "512"
    assert argv[argv.index("--host-kv-blocks") + 1] == "32"
    assert "--api-key" not in argv and "--scheduler" not in argv
    shard = launcher.shard_argv(config, Path("/tmp/s.sock"))
    assert shard[1:4] == ["-m", "superinfer.cli", "serve"]
    assert "--model" not in shard  # the shard serves the embedded default
    assert shard[shard.index("--host-kv-blocks") + 1] == "32"


def test_the_api_key_reaches_the_router_in_its_environment_only(monkeypatch, capsys):
    monkeypatch.delenv("API_KEY", raising=False)
    config = parse(["--api-key", "k3y-from-argv", "--max-connections", "64"])
    argv = launcher.router_argv(config, Path("/tmp/s.sock"))
    assert not any("k3y" in arg for arg in argv)
    assert "--api-key" not in argv
    assert argv[argv.index("--max-connections") + 1] == "64"
    assert launcher.router_env(config)["API_KEY"] == "k3y-from-argv"
    assert config.api_key_in_argv
    monkeypatch.setenv("API_KEY", "k3y-from-env")
    from_env = parse([])
    assert from_env.api_key == "k3y-from-env" and not from_env.api_key_in_argv
    assert not any("k3y" in arg for arg in launcher.router_argv(from_env, Path("/tmp/s.sock")))
    assert parse(["--api-key", "flag-wins"]).api_key == "flag-wins"
    monkeypatch.delenv("API_KEY")
    assert launcher.router_env(parse([])) is None


def test_a_started_router_shows_no_key_to_ps(monkeypatch):
    # What another local user sees: the child's command line (ps -eo args) lacks the key, its
    # environment (readable by the same user only) has it.
    monkeypatch.delenv("API_KEY", raising=False)
    config = parse(["--api-key", "k3y-in-ps"])
    argv = [sys.executable, "-c", "import time; time.sleep(30)", *launcher.router_argv(config, Path("/tmp/s.sock"))]
    supervisor = Supervisor()
    child = supervisor.start("router", argv, env=launcher.router_env(config))
    try:
        listed = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True, check=True).stdout
        assert str(child.process.pid) in listed
        assert "k3y-in-ps" not in listed
        environ = Path(f"/proc/{child.process.pid}/environ").read_bytes()
        assert b"API_KEY=k3y-in-ps" in environ.split(b"\0")
    finally:
        supervisor.shutdown(timeout_s=5)


def test_bad_values_are_refused_with_a_message(monkeypatch):
    monkeypatch.delenv("PORT", raising=False)
    with pytest.raises(ValueError, match="--port"):
        parse(["--port", "0"])
    with pytest.raises(SystemExit):
        parse(["--device-kv-blocks", "many"])


def test_supervisor_wakes_when_a_child_exits():
    supervisor = Supervisor()
    sleeper = supervisor.start("sleeper", [sys.executable, "-c", "import time; time.sleep(60)"])
    quitter = supervisor.start("quitter", [sys.executable, "-c", "raise SystemExit(3)"])
    assert supervisor.wait(30)
    assert supervisor.first_exited() is quitter
    assert quitter.describe_exit() == "quitter exited with status 3"
    supervisor.shutdown(timeout_s=5)
    assert sleeper.describe_exit() == "sleeper was killed by SIGTERM"


def test_launch_fails_clearly_when_the_shard_dies(tmp_path, monkeypatch, capsys):
    # A shard that exits at once: the launcher must say so and exit non-zero, not hang.
    monkeypatch.setattr(launcher, "shard_argv", lambda config, path: [sys.executable, "-c", "raise SystemExit(7)"])
    monkeypatch.delenv("PORT", raising=False)
    parser = argparse.ArgumentParser()
    launcher.add_arguments(parser)
    assert launcher.run(parser.parse_args(["--shard-startup-timeout-s", "60"])) == 1
    assert "shard exited with status 7" in capsys.readouterr().err
