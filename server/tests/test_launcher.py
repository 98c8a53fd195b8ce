"""The launcher's configuration and child supervision, with real child processes."""
import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from superinfer import launch_config, launcher, tgi_flags
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


def test_a_switch_on_by_default_is_turned_off_by_value_and_on_bare(monkeypatch):
    """`--time-share` is on by default (the router's default); `--time-share false` turns it off
    and `--time-share` alone, as older command lines give it, keeps it on. The router's parser
    checks the value."""
    monkeypatch.delenv("TIME_SHARE", raising=False)
    assert parse([]).router_args == ()
    assert parse(["--time-share", "false"]).router_args == ("--time-share", "false")
    assert parse(["--time-share"]).router_args == ("--time-share", "true")
    assert parse(["--time-share", "--port", "9000"]).port == 9000
    with pytest.raises(ValueError, match="maybe"):
        parse(["--time-share", "maybe"])


def test_a_lora_resolver_dir_that_cannot_be_read_stops_the_launch_before_a_shard(monkeypatch, tmp_path):
    """The router's checks that need no model run before a shard starts: `--lora-resolver-dir`
    (or vLLM's `VLLM_LORA_RESOLVER_CACHE_DIR`) must be a readable directory."""
    monkeypatch.delenv("LORA_RESOLVER_DIR", raising=False)
    monkeypatch.delenv("VLLM_LORA_RESOLVER_CACHE_DIR", raising=False)
    assert parse(["--lora-resolver-dir", str(tmp_path)]).router_args == ("--lora-resolver-dir", str(tmp_path))
    missing = tmp_path / "missing"
    with pytest.raises(ValueError, match=f"--lora-resolver-dir {missing}: not a directory this server can read"):
        parse(["--lora-resolver-dir", str(missing)])
    monkeypatch.setenv("VLLM_LORA_RESOLVER_CACHE_DIR", str(missing))
    with pytest.raises(ValueError, match="not a directory this server can read"):
        parse([])


def test_a_cors_origin_that_is_no_header_value_stops_the_launch_before_a_shard(monkeypatch):
    monkeypatch.delenv("CORS_ALLOW_ORIGIN", raising=False)
    assert parse(["--cors-allow-origin", "https://app.example"]).router_args == (
        "--cors-allow-origin", "https://app.example")
    with pytest.raises(ValueError, match="invalid CORS origin"):
        parse(["--cors-allow-origin", "https://app.example\nx-injected: 1"])


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


# TGI's launcher flags (launcher/src/main.rs, `struct Args`) with a value each accepts here, or
# None for a switch. Every one must start the launcher: applied, converted, or ignored aloud.
TGI_FLAGS = {
    "--model-id": "/models/llama", "--revision": "refs/pr/2", "--validation-workers": "2", "--sharded": "false",
    "--num-shard": "1", "--quantize": "awq", "--speculate": "2", "--dtype": "bfloat16", "--kv-cache-dtype": "fp8_e5m2",
    "--trust-remote-code": None, "--max-concurrent-requests": "128", "--max-best-of": "2",
    "--max-stop-sequences": "4", "--max-top-n-tokens": "5", "--max-input-tokens": "1024", "--max-total-tokens": "2048",
    "--waiting-served-ratio": "0.3", "--max-batch-prefill-tokens": "4096", "--max-batch-total-tokens": "16000",
    "--max-waiting-tokens": "20", "--max-batch-size": "32", "--cuda-graphs": "1,2,4", "--hostname": "127.0.0.1",
    "--port": "8080", "--prometheus-port": "9000", "--shard-uds-path": "/tmp/tgi", "--master-addr": "localhost",
    "--master-port": "29500", "--huggingface-hub-cache": "/data", "--weights-cache-override": "/weights",
    "--disable-custom-kernels": None, "--cuda-memory-fraction": "0.8", "--rope-scaling": "dynamic",
    "--rope-factor": "2.0", "--json-output": None, "--otlp-endpoint": "http://localhost:4317",
    "--otlp-service-name": "tgi", "--cors-allow-origin": "http://example.com", "--api-key": "k3y",
    "--watermark-gamma": "0.5", "--watermark-delta": "2.0", "--ngrok": None, "--ngrok-authtoken": "t",
    "--ngrok-edge": "e", "--tokenizer-config-path": "/t.json", "--disable-grammar-support": None, "--env": None,
    "--max-client-batch-size": "4", "--lora-adapters": "a,b", "--usage-stats": "off", "--payload-limit": "2000000",
    "--enable-prefill-logprobs": None, "--graceful-termination-timeout": "90",
}


def _clear(monkeypatch, *names):
    for name in names:
        monkeypatch.delenv(name, raising=False)


TGI_VARIABLES = ("MODEL_ID", "MODEL", "REVISION", "PORT", "HOSTNAME", "API_KEY", "MAX_BATCH_TOKENS",
                 "MAX_BATCH_PREFILL_TOKENS", "MAX_BATCH_TOTAL_TOKENS", "DEVICE_KV_BLOCKS", "MAX_BATCH_SIZE",
                 "NUM_SHARD", "CUDA_MEMORY_FRACTION", "KV_MEMORY_FRACTION", "QUANTIZE", "DTYPE", "CUDA_GRAPHS")


def test_every_tgi_launcher_flag_is_accepted(monkeypatch):
    _clear(monkeypatch, *TGI_VARIABLES)
    argv = [part for name, value in TGI_FLAGS.items() for part in (name, value) if part is not None]
    config = parse(argv)
    assert config.model == "/models/llama" and config.revision == "refs/pr/2" and config.port == 8080
    assert config.device_kv_blocks == 1000  # 16,000 tokens in blocks of 16
    assert config.kv_memory_fraction == 0.8 and config.hub_cache == "/data" and config.dtype == "bfloat16"
    assert config.cuda_graphs == "1,2,4"
    for ignored in ("--quantize awq", "--sharded false", "--max-waiting-tokens 20", "--trust-remote-code",
                    "--waiting-served-ratio 0.3", "--env", "--prometheus-port 9000"):
        assert any(warning.startswith(f"TGI's {ignored} is ignored: ") for warning in config.ignored_tgi_flags), ignored
    assert len(config.ignored_tgi_flags) == len(tgi_flags.IGNORED)
    # TGI's older name of --max-input-tokens (the same flag: one of the two at a time).
    assert parse(["--max-input-length", "1024"]).router_args == ("--max-input-tokens", "1024")


def test_tgi_names_reach_the_router_and_the_shard(monkeypatch):
    _clear(monkeypatch, *TGI_VARIABLES)
    config = parse(["--model-id", "/m", "--revision", "v1", "-p", "8080", "--max-batch-prefill-tokens", "512",
                    "--max-batch-size", "8", "--max-batch-total-tokens", "1000", "--cuda-memory-fraction", "0.5",
                    "--huggingface-hub-cache", "/hub", "--max-input-length", "100",
                    "--graceful-termination-timeout", "5", "--num-shard", "1"])
    # The router gets its own names (clap would take the aliases too).
    assert config.router_args == ("--max-batch-tokens", "512", "--max-batch-requests", "8",
                                  "--max-input-tokens", "100")
    router = launcher.router_argv(config, Path("/tmp/s.sock"))
    assert router[router.index("--port") + 1] == "8080"
    assert router[router.index("--device-kv-blocks") + 1] == "63"  # ceil(1000 / 16)
    assert router[router.index("--graceful-termination-timeout-s") + 1] == "5.0"
    shard = launcher.shard_argv(config, Path("/tmp/s.sock"))
    for name, value in (("--model", "/m"), ("--revision", "v1"), ("--huggingface-hub-cache", "/hub"),
                        ("--kv-memory-fraction", "0.5"), ("--device-kv-blocks", "63")):
        assert shard[shard.index(name) + 1] == value, name
    assert "--host-kv-blocks" not in shard and "--host-kv-memory-fraction" not in shard  # the shard's defaults
    sized = launcher.shard_argv(parse(["--host-kv-memory-fraction", "0.25"]), Path("/tmp/s.sock"))
    assert sized[sized.index("--host-kv-memory-fraction") + 1] == "0.25"
    with pytest.raises(ValueError, match="--host-kv-memory-fraction"):
        parse(["--host-kv-memory-fraction", "1.5"])
    assert parse(["--model", "/old-name"]).model == "/old-name"


def test_tgi_variables_are_read(monkeypatch):
    _clear(monkeypatch, *TGI_VARIABLES)
    monkeypatch.setenv("MODEL", "/from-model")
    assert parse([]).model == "/from-model"
    monkeypatch.setenv("MODEL_ID", "/from-model-id")
    monkeypatch.setenv("REVISION", "v2")
    monkeypatch.setenv("MAX_BATCH_TOTAL_TOKENS", "32")
    monkeypatch.setenv("CUDA_MEMORY_FRACTION", "0.7")
    config = parse([])
    assert (config.model, config.revision, config.device_kv_blocks, config.kv_memory_fraction) == (
        "/from-model-id", "v2", 2, 0.7)
    assert parse(["--model-id", "/flag"]).model == "/flag"  # the flag wins
    # The router reads its own variables, TGI's names included; the launcher checks them first.
    monkeypatch.setenv("MAX_BATCH_SIZE", "many")
    with pytest.raises(ValueError, match="many"):
        parse([])
    monkeypatch.delenv("MAX_BATCH_SIZE")
    monkeypatch.setenv("QUANTIZE", "gptq")
    assert parse([]).ignored_tgi_flags == ("TGI's QUANTIZE (in the environment) is ignored: quantizing at load is "
                                           "not supported; the weights load in --dtype (an FP8 checkpoint is "
                                           "de-quantized into it)",)


def test_shard_values_tgi_would_take_are_refused_with_a_reason(monkeypatch):
    _clear(monkeypatch, *TGI_VARIABLES)
    with pytest.raises(ValueError, match="--num-shard must be >= 1"):
        parse(["--num-shard", "0"])
    with pytest.raises(ValueError, match="disagree; give one"):
        parse(["--device-kv-blocks", "10", "--max-batch-total-tokens", "1000"])
    assert parse(["--device-kv-blocks", "63", "--max-batch-total-tokens", "1000"]).device_kv_blocks == 63
    with pytest.raises(ValueError, match="--dtype must be one of auto, float32, bfloat16, float16"):
        parse(["--dtype", "float8"])
    with pytest.raises(ValueError, match=r"must be in \(0, 1\]"):
        parse(["--cuda-memory-fraction", "1.5"])


def test_help_shows_tgi_names(monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")  # argparse wraps help to the terminal's width
    parser = argparse.ArgumentParser()
    launcher.add_arguments(parser)
    help_text = parser.format_help()
    for fragment in ("--model-id MODEL_ID, --model MODEL_ID", "[env: MODEL_ID, MODEL]", "--max-batch-prefill-tokens",
                     "[env: MAX_BATCH_TOKENS, MAX_BATCH_PREFILL_TOKENS]", "--port PORT, -p PORT",
                     "--cuda-memory-fraction", "TGI flags that do not apply here", "--quantize VALUE"):
        assert fragment in help_text, fragment


def test_ignored_tgi_flags_are_named_when_launching(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(launcher, "shard_argv", lambda config, path: [sys.executable, "-c", "raise SystemExit(7)"])
    _clear(monkeypatch, *TGI_VARIABLES)
    parser = argparse.ArgumentParser()
    launcher.add_arguments(parser)
    assert launcher.run(parser.parse_args(["--quantize", "bitsandbytes", "--max-waiting-tokens", "20"])) == 1
    err = capsys.readouterr().err
    assert "warning: TGI's --quantize bitsandbytes is ignored: quantizing at load is not supported" in err
    assert "warning: TGI's --max-waiting-tokens 20 is ignored: the scheduler (--scheduler) decides" in err


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


def test_the_shard_exports_its_spans_where_the_router_does(monkeypatch):
    monkeypatch.delenv("OTLP_ENDPOINT", raising=False)
    config = parse(["--otlp-endpoint", "http://127.0.0.1:4317"])
    router = launcher.router_argv(config, Path("/tmp/s.sock"))
    shard = launcher.shard_argv(config, Path("/tmp/s.sock"))
    assert router[router.index("--otlp-endpoint") + 1] == "http://127.0.0.1:4317"
    assert shard[shard.index("--otlp-endpoint") + 1] == "http://127.0.0.1:4317"
    assert "--otlp-endpoint" not in launcher.shard_argv(parse([]), Path("/tmp/s.sock"))


def test_a_slow_start_says_what_it_waits_for(capsys):
    probes = iter([False] * 6 + [True])
    launcher._wait_ready(Supervisor(), "shard", "loading the model", 60, lambda: next(probes), report_every_s=0.5)
    lines = capsys.readouterr().err.splitlines()
    assert 1 <= len(lines) <= 3, lines  # six probes, 0.25 s apart
    assert all(line.startswith("superinfer launch: still waiting for the shard (loading the model): ")
               and line.endswith(" s of 60 s") for line in lines), lines


def test_a_start_past_its_deadline_fails_clearly():
    with pytest.raises(launcher.LaunchError, match="the router did not become healthy within 0 s"):
        launcher._wait_ready(Supervisor(), "router", "warm-up", 0.3, lambda: False, report_every_s=0.1)


def test_the_device_reaches_the_shard_and_is_never_abbreviated(monkeypatch):
    monkeypatch.delenv("DEVICE", raising=False)
    config = parse(["--device", "cuda:1"])
    shard = launcher.shard_argv(config, Path("/tmp/s.sock"))
    assert shard[shard.index("--device") + 1] == "cuda:1"
    assert "--device" not in launcher.shard_argv(parse([]), Path("/tmp/s.sock"))
    monkeypatch.setenv("DEVICE", "cpu")
    assert parse([]).device == "cpu"
    with pytest.raises(ValueError, match='--device must be "auto", "cpu", "cuda" or "cuda:N"'):
        parse(["--device", "gpu0"])
    # `superinfer launch --device-kv` is not --device-kv-blocks (nor --device for it).
    refused = subprocess.run([sys.executable, "-m", "superinfer.cli", "launch", "--device-kv", "8"],
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "unrecognized arguments: --device-kv" in refused.stderr


def test_num_shard_starts_one_process_per_rank_with_its_rendezvous(monkeypatch):
    _clear(monkeypatch, *TGI_VARIABLES, "MASTER_ADDR", "MASTER_PORT")
    config = parse(["--num-shard", "3", "--master-port", "29601"])
    assert (config.num_shard, config.master_addr, config.master_port) == (3, "127.0.0.1", 29601)
    assert not any("--master-port" in warning for warning in config.ignored_tgi_flags)
    ranks = [launcher.shard_argv(config, Path("/tmp/s.sock"), rank, 29601) for rank in range(3)]
    for rank, argv in enumerate(ranks):
        assert argv[argv.index("--rank") + 1] == str(rank)
        assert argv[argv.index("--world-size") + 1] == "3"
        assert argv[argv.index("--master-port") + 1] == "29601"
        assert ("--uds-path" in argv) == (rank == 0)  # only rank 0 serves the router
    # One shard: no process group, the command line of before.
    single = launcher.shard_argv(parse([]), Path("/tmp/s.sock"))
    assert "--world-size" not in single and "--rank" not in single
    monkeypatch.setenv("NUM_SHARD", "2")
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.5")
    assert (parse([]).num_shard, parse([]).master_addr) == (2, "10.0.0.5")


def test_nnodes_spread_the_ranks_over_machines_that_meet_at_one_port(monkeypatch):
    _clear(monkeypatch, *TGI_VARIABLES, "MASTER_ADDR", "MASTER_PORT")
    config = parse(["--num-shard", "4", "--nnodes", "2", "--node-rank", "1", "--master-addr", "10.0.0.5",
                    "--master-port", "29601"])
    assert config.local_ranks == range(2, 4)
    for rank in config.local_ranks:
        argv = launcher.shard_argv(config, Path("/tmp/s.sock"), rank, 29601)
        # Global rank for the group, local rank for the device (cuda:0 and cuda:1 on node 1).
        assert argv[argv.index("--rank") + 1] == str(rank)
        assert argv[argv.index("--local-rank") + 1] == str(rank - 2)
        assert argv[argv.index("--master-addr") + 1] == "10.0.0.5" and "--uds-path" not in argv
    with pytest.raises(ValueError, match="--nnodes needs --master-port"):
        parse(["--num-shard", "4", "--nnodes", "2"])
    with pytest.raises(ValueError, match="--nnodes 3 must divide --num-shard 4"):
        parse(["--num-shard", "4", "--nnodes", "3", "--master-port", "29601"])
    with pytest.raises(ValueError, match="--node-rank must be in 0..1"):
        parse(["--num-shard", "4", "--nnodes", "2", "--node-rank", "2", "--master-port", "29601"])


def test_the_attention_backend_reaches_the_shard(monkeypatch):
    monkeypatch.delenv("ATTENTION_BACKEND", raising=False)
    shard = launcher.shard_argv(parse(["--attention-backend", "sdpa"]), Path("/tmp/s.sock"))
    assert shard[shard.index("--attention-backend") + 1] == "sdpa"
    assert "--attention-backend" not in launcher.shard_argv(parse([]), Path("/tmp/s.sock"))
    with pytest.raises(ValueError, match="--attention-backend must be one of auto, sdpa, triton, flashinfer"):
        parse(["--attention-backend", "flash"])


def test_tgi_cuda_graphs_reach_the_shard_checked_by_the_shards_parser(monkeypatch):
    monkeypatch.delenv("CUDA_GRAPHS", raising=False)
    shard = launcher.shard_argv(parse(["--cuda-graphs", "1,2,4"]), Path("/tmp/s.sock"))
    assert shard[shard.index("--cuda-graphs") + 1] == "1,2,4"
    assert "--cuda-graphs" not in launcher.shard_argv(parse([]), Path("/tmp/s.sock"))
    monkeypatch.setenv("CUDA_GRAPHS", "0")  # TGI's variable: no graphs
    assert parse([]).cuda_graphs == "0"
    monkeypatch.delenv("CUDA_GRAPHS")
    for bad in ("1,two", "-4", "0,8"):
        with pytest.raises(ValueError, match="--cuda-graphs"):
            parse(["--cuda-graphs", bad])
    from superinfer.shard.config import parse_cuda_graphs

    assert parse_cuda_graphs("8,1,2,8") == (1, 2, 8)
    assert parse_cuda_graphs("0") == () and parse_cuda_graphs(None) is None and parse_cuda_graphs("auto") is None


def test_shard_cpus_are_split_between_the_ranks_and_checked(monkeypatch):
    monkeypatch.delenv("SHARD_CPUS", raising=False)
    shard = launcher.shard_argv(parse(["--shard-cpus", "1"]), Path("/tmp/s.sock"))
    assert shard[shard.index("--cpus") + 1] == "1" and "--threads" not in shard
    assert "--cpus" not in launcher.shard_argv(parse([]), Path("/tmp/s.sock"))
    config = parse(["--shard-cpus", "0-3", "--num-shard", "2"])
    ranks = [launcher.shard_argv(config, Path("/tmp/s.sock"), rank, 29601) for rank in range(2)]
    assert [argv[argv.index("--cpus") + 1] for argv in ranks] == ["0,1", "2,3"]
    assert all("--threads" not in argv for argv in ranks)
    with pytest.raises(ValueError, match="gives 1 CPUs to 2 ranks"):
        parse(["--shard-cpus", "3", "--num-shard", "2"])
    for bad in ("a", "3-1", "-2"):
        with pytest.raises(ValueError, match="CPU list"):
            parse(["--shard-cpus", bad])
    from superinfer.shard.config import parse_cpu_list

    assert parse_cpu_list("0-2,8,1") == (0, 1, 2, 8) and parse_cpu_list(None) is None
