"""`superinfer launch`: starts the whole server — the shard on a unix socket in a private
temporary directory (with `--num-shard N`, N rank processes joined by torch.distributed, rank 0
on the socket), then the router in its own process — prints the URL once /health answers,
forwards SIGINT/SIGTERM, and tears everything down when any child dies."""
import argparse
import os
import shutil
import socket
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from superinfer import launch_config
from superinfer.launch_config import LaunchConfig
from superinfer.supervisor import Supervisor, install_signal_handlers, restore_signal_handlers

# How often readiness is probed while a child starts (a child's exit ends the wait at once).
PROBE_INTERVAL_S = 0.25
# How often the launcher says what it is still waiting for.
WAIT_REPORT_INTERVAL_S = 10.0
# What each child does before it answers its probe.
SHARD_STARTING = "loading the model: download, GGUF conversion, weights"
ROUTER_STARTING = "the shard's warm-up: DuplexKV's extension, timing forward passes and transfers"
# A child gets the graceful termination timeout plus this before SIGKILL: the router's drain
# takes up to the timeout itself, then closes its connections.
ROUTER_STOP_MARGIN_S = 10.0
SHARD_LOG_LEVELS = {"trace": "DEBUG", "debug": "DEBUG", "info": "INFO", "warn": "WARNING",
                    "warning": "WARNING", "error": "ERROR"}


class LaunchError(RuntimeError):
    """Start-up failed; the message says which part and why."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    launch_config.add_arguments(parser)


def run(args: argparse.Namespace) -> int:
    try:
        config = launch_config.from_args(args)
    except ValueError as error:
        print(f"superinfer launch: {error}", file=sys.stderr)
        return 2
    for warning in config.ignored_tgi_flags:
        print(f"superinfer launch: warning: {warning}", file=sys.stderr)
    if config.api_key_in_argv:
        print("superinfer launch: warning: --api-key on the command line is visible to every local user "
              "(ps); set API_KEY in the environment instead", file=sys.stderr)
    supervisor = Supervisor()
    previous_handlers = install_signal_handlers(supervisor)
    socket_dir = Path(tempfile.mkdtemp(prefix="superinfer-"))
    try:
        return _serve(config, supervisor, socket_dir)
    except LaunchError as error:
        print(f"superinfer launch: {error}", file=sys.stderr)
        return 1
    finally:
        supervisor.shutdown(config.graceful_termination_timeout_s + ROUTER_STOP_MARGIN_S)
        shutil.rmtree(socket_dir, ignore_errors=True)
        restore_signal_handlers(previous_handlers)


def check_model(config: LaunchConfig) -> None:
    """The model's config.json judged before any shard starts (and before torch is imported):
    an architecture the shard cannot run is refused in seconds, with the supported list, and
    none of its weights is fetched."""
    from superinfer.shard.errors import LoaderError
    from superinfer.shard.hub import options_from_environment
    from superinfer.shard.model_source import check_model as check

    cache = Path(config.hub_cache) if config.hub_cache else None
    try:
        check(config.model, options_from_environment(os.environ, config.revision, cache))
    except LoaderError as error:
        raise LaunchError(str(error)) from None


def _serve(config: LaunchConfig, supervisor: Supervisor, socket_dir: Path) -> int:
    socket_path = socket_dir / "shard.sock"
    check_model(config)
    # Children inherit the environment; the router reads its unset flags from it.
    start_shards(config, supervisor, socket_path)
    if config.node_rank > 0:
        return _serve_ranks(config, supervisor)
    _wait_ready(supervisor, "shard", SHARD_STARTING, config.shard_startup_timeout_s, lambda: shard_healthy(socket_path))
    supervisor.start("router", router_argv(config, socket_path), env=router_env(config))
    probe_host = "127.0.0.1" if config.hostname in ("0.0.0.0", "::", "") else config.hostname
    url = f"http://{probe_host}:{config.port}"
    _wait_ready(supervisor, "router", ROUTER_STARTING, config.router_startup_timeout_s, lambda: http_healthy(url))
    print(f"SuperInfer is ready: {url}", flush=True)
    supervisor.wait()
    exited = supervisor.first_exited()
    if exited is not None and supervisor.stop_reason is None:
        print(f"superinfer launch: {exited.describe_exit()}; shutting down", file=sys.stderr)
        return 1
    print(f"superinfer launch: {supervisor.stop_reason}, shutting down", file=sys.stderr, flush=True)
    return 0


def _serve_ranks(config: LaunchConfig, supervisor: Supervisor) -> int:
    """A node other than 0: its ranks only, serving node 0's router, until one of them exits
    (0 when rank 0 told it to stop) or a signal arrives."""
    ranks = config.local_ranks
    print(f"superinfer launch: node {config.node_rank} of {config.nnodes}: shard ranks {ranks.start}..{ranks.stop - 1} "
          f"of {config.num_shard}, meeting rank 0 at {config.master_addr}:{config.master_port}", flush=True)
    supervisor.wait()
    exited = supervisor.first_exited()
    if exited is not None and supervisor.stop_reason is None:
        print(f"superinfer launch: {exited.describe_exit()}; shutting down", file=sys.stderr, flush=True)
        return 0 if exited.process.returncode == 0 else 1
    print(f"superinfer launch: {supervisor.stop_reason}, shutting down", file=sys.stderr, flush=True)
    return 0


def _wait_ready(supervisor: Supervisor, name: str, doing: str, timeout_s: float, probe,
                report_every_s: float = WAIT_REPORT_INTERVAL_S) -> None:
    """Returns once `probe()` holds; says every `report_every_s` what the child is doing."""
    started = time.monotonic()
    next_report = started + report_every_s
    while not probe():
        if supervisor.stop_reason is not None:
            raise LaunchError(f"{supervisor.stop_reason} while waiting for the {name}")
        exited = supervisor.first_exited()
        if exited is not None:
            raise LaunchError(f"{exited.describe_exit()} during start-up (see its log above)")
        now = time.monotonic()
        if now - started > timeout_s:
            raise LaunchError(f"the {name} did not become healthy within {timeout_s:.0f} s")
        if now >= next_report:
            print(f"superinfer launch: still waiting for the {name} ({doing}): {now - started:.0f} s of "
                  f"{timeout_s:.0f} s", file=sys.stderr, flush=True)
            next_report = now + report_every_s
        supervisor.wait(PROBE_INTERVAL_S)


def start_shards(config: LaunchConfig, supervisor: Supervisor, socket_path: Path) -> None:
    """One shard process, or `num_shard` ranks: the others first and rank 0 (the router's) last,
    so that the shutdown, in reverse order, stops rank 0 first, which tells the others to stop."""
    if config.num_shard == 1:
        supervisor.start("shard", shard_argv(config, socket_path))
        return
    master_port = config.master_port or free_port(config.master_addr)
    for rank in sorted(config.local_ranks, key=lambda rank: rank == 0):
        supervisor.start(f"shard rank {rank}", shard_argv(config, socket_path, rank, master_port))


def free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def shard_argv(config: LaunchConfig, socket_path: Path, rank: int = 0, master_port: int | None = None) -> list[str]:
    argv = [sys.executable, "-m", "superinfer.cli", "serve"]
    if rank == 0:
        argv += ["--uds-path", str(socket_path)]
    local = len(config.local_ranks)
    local_rank = rank - config.local_ranks.start
    if config.shard_cpus is not None:
        # Each of this machine's ranks gets its own slice of the CPUs given (its threads follow).
        share = len(config.shard_cpus) // local
        argv += ["--cpus", ",".join(map(str, config.shard_cpus[local_rank * share : (local_rank + 1) * share]))]
    if config.num_shard > 1:
        argv += ["--world-size", str(config.num_shard), "--rank", str(rank), "--local-rank", str(local_rank),
                 "--master-addr", config.master_addr, "--master-port", str(master_port)]
        if config.shard_cpus is None:
            # On the CPU the ranks share the cores: each gets its share, not all of them.
            argv += ["--threads", str(max(1, len(os.sched_getaffinity(0)) // local))]
    optional = {
        "--model": config.model,
        "--revision": config.revision,
        "--huggingface-hub-cache": config.hub_cache,
        "--device-kv-blocks": config.device_kv_blocks,
        "--host-kv-blocks": config.host_kv_blocks,
        "--kv-memory-fraction": config.kv_memory_fraction,
        "--host-kv-memory-fraction": config.host_kv_memory_fraction,
        "--dtype": config.dtype,
        "--device": config.device,
        "--attention-backend": config.attention_backend,
        "--cuda-graphs": config.cuda_graphs,
        "--warmup-report": config.warmup_report,
        "--lora-adapters": config.lora_adapters,
    }
    for name, value in optional.items():
        if value is not None:
            argv += [name, str(value)]
    # The router takes a tracing filter; the shard only a plain level, when one was given.
    level = SHARD_LOG_LEVELS.get(config.log_level.strip().lower())
    if level is not None:
        argv += ["--log-level", level]
    # The shard's spans go to the router's collector; OTLP_ENDPOINT, when that is how it was
    # given, reaches the shard through the environment it inherits.
    router_args = list(config.router_args)
    if "--otlp-endpoint" in router_args:
        argv += ["--otlp-endpoint", router_args[router_args.index("--otlp-endpoint") + 1]]
    return argv


def router_argv(config: LaunchConfig, socket_path: Path) -> list[str]:
    argv = [
        sys.executable, "-m", "superinfer.router_main",
        "--uds-path", str(socket_path),
        "--port", str(config.port),
        "--hostname", config.hostname,
        "--log-level", config.log_level,
        # The router drains for this long on SIGTERM; the launcher waits a little longer
        # (ROUTER_STOP_MARGIN_S) before it kills it.
        "--graceful-termination-timeout-s", str(config.graceful_termination_timeout_s),
    ]
    if config.device_kv_blocks is not None:
        argv += ["--device-kv-blocks", str(config.device_kv_blocks)]
    if config.host_kv_blocks is not None:
        argv += ["--host-kv-blocks", str(config.host_kv_blocks)]
    if config.json_output:
        argv.append("--json-output")
    return argv + list(config.router_args)


def router_env(config: LaunchConfig) -> dict[str, str] | None:
    """The router's environment: the launcher's (None: inherited as it is), with the API key
    when one was given; never on the router's command line, which every local user can read."""
    if config.api_key is None:
        return None
    return {**os.environ, "API_KEY": config.api_key}


def shard_healthy(socket_path: Path) -> bool:
    """The shard's gRPC Health answers (it runs a tiny operation on its device)."""
    if not socket_path.exists():
        return False
    import grpc

    from superinfer.pb import shard_pb2, shard_pb2_grpc

    with grpc.insecure_channel(f"unix://{socket_path}") as channel:
        try:
            shard_pb2_grpc.ShardStub(channel).Health(shard_pb2.HealthRequest(), timeout=5)
        except grpc.RpcError:
            return False
    return True


def http_healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
            return response.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False
