"""The launcher's typed configuration: every flag also reads an environment variable of the
same name in upper case (TGI's convention), parsed once into a frozen `LaunchConfig`.

Router flags are declared here too (the `superinfer` CLI parses strictly) and forwarded to the
router only when given; the router reads the same environment variables itself."""
import argparse
import os
from dataclasses import dataclass


def _env_name(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_").upper()


def _bool(text: str) -> bool:
    lowered = str(text).strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise argparse.ArgumentTypeError(f"expected a boolean, got {text!r}")


# (flag, type, help) of router flags the launcher forwards verbatim when set.
ROUTER_FLAGS: tuple[tuple[str, type, str], ...] = (
    ("--scheduler", str, "scheduling policy: fcfs, recompute, swap or rotasched (default rotasched)"),
    ("--ttft-slo-ms", float, "default time-to-first-token objective, ms (default 2000)"),
    ("--tbt-slo-ms", float, "default time-between-tokens objective, ms (default 200)"),
    ("--tbt-slo-percentile", float, "percentile of each request's gaps the TBT objective is for (default 90)"),
    ("--max-batch-tokens", int, "most tokens (prefill chunks + decodes) per step (default 2048)"),
    ("--max-batch-requests", int, "most requests per step (default 256)"),
    ("--max-concurrent-requests", int, "requests in flight before 429 (default 512)"),
    ("--max-input-tokens", int, "longest prompt in tokens (default: what the model and pool allow)"),
    ("--max-total-tokens", int, "longest prompt + generation (default: what the model and pool allow)"),
    ("--max-stop-sequences", int, "stop sequences per request (default 4)"),
    ("--max-best-of", int, "largest best_of (default 2)"),
    ("--max-top-n-tokens", int, "largest top_n_tokens (default 5)"),
    ("--max-client-batch-size", int, "prompts per request (default 4)"),
    ("--payload-limit", int, "largest request body in bytes (default 2000000)"),
    ("--max-connections", int, "open HTTP connections at most; more are closed at once (default 8192)"),
    ("--http-header-timeout-s", int, "seconds a client has to send a request head, and the longest pause "
     "within a request body (default 10)"),
    ("--http-idle-timeout-s", int, "seconds a connection may stay open without a request (default 60)"),
    ("--cors-allow-origin", str, "comma-separated origins allowed by CORS"),
    ("--otlp-endpoint", str, "OpenTelemetry collector (OTLP/gRPC) for traces"),
    ("--otlp-service-name", str, "service name of the router's traces (default superinfer.router)"),
    ("--step-timeout-s", float, "deadline of a model step in seconds (default: 20x the predicted step time, "
     "at least 30 s); a late step fails the requests in flight and starts recovery"),
    ("--shard-recovery-timeout-s", float, "seconds a failed shard may take to answer again before the "
     "server exits non-zero (default 60)"),
)


@dataclass(frozen=True)
class LaunchConfig:
    model: str | None
    port: int
    hostname: str
    device_kv_blocks: int | None
    host_kv_blocks: int | None
    dtype: str | None
    warmup_report: str | None
    json_output: bool
    log_level: str
    shard_startup_timeout_s: float
    router_startup_timeout_s: float
    graceful_termination_timeout_s: float
    # Router flags as given, already rendered as argv.
    router_args: tuple[str, ...]
    # Passed to the router in its environment only: a command line is visible to every local
    # user (ps). `api_key_in_argv`: it was given as --api-key (the launcher warns).
    api_key: str | None = None
    api_key_in_argv: bool = False


def add_arguments(parser: argparse.ArgumentParser) -> None:
    def flag(name: str, kind, help_text: str, default=None) -> None:
        env = _env_name(name)
        value = os.environ.get(env, default)
        parser.add_argument(name, type=kind, default=value, help=f"{help_text} [env: {env}]")

    flag("--model", str, "model: a local directory, a Hugging Face id in the local cache, or a "
         "GGUF file (default: the embedded SmolLM2-135M-Instruct)")
    flag("--port", int, "HTTP port (default 3000)", "3000")
    flag("--hostname", str, "address the HTTP API binds to (default 0.0.0.0)", "0.0.0.0")
    flag("--device-kv-blocks", int, "device KV pool size in blocks (default: what memory allows)")
    flag("--host-kv-blocks", int, "host KV pool size in blocks (default: what memory allows)")
    flag("--dtype", str, "compute dtype (default: bfloat16 on GPU, float32 on CPU)")
    flag("--warmup-report", str, "write what the shard measured at warm-up (cost model, KV pools) to this "
         "JSON file: the simulator's measured: profile")
    parser.add_argument("--json-output", action="store_true",
                        default=_bool(os.environ.get("JSON_OUTPUT", "false")),
                        help="log as JSON lines [env: JSON_OUTPUT]")
    flag("--log-level", str, "log level of the router and shard (default info)", "info")
    flag("--shard-startup-timeout-s", float, "seconds to wait for the shard to load (default 600)", "600")
    flag("--router-startup-timeout-s", float, "seconds to wait for the router's /health (default 120)", "120")
    flag("--graceful-termination-timeout-s", float, "on SIGTERM, seconds requests in flight get to finish "
         "(new ones get 503) before the server stops (default 30)", "30")
    for name, kind, help_text in ROUTER_FLAGS:
        flag(name, kind, help_text)
    # Accepted for TGI's command lines; API_KEY in the environment keeps it out of `ps`.
    parser.add_argument("--api-key", dest="api_key_argv", default=None,
                        help="require 'Authorization: Bearer <key>'; prefer the environment variable, "
                        "a flag is visible to every local user [env: API_KEY]")
    parser.set_defaults(api_key_env=os.environ.get("API_KEY") or None)


def from_args(args: argparse.Namespace) -> LaunchConfig:
    router_args: list[str] = []
    for name, _kind, _help in ROUTER_FLAGS:
        value = getattr(args, name.lstrip("-").replace("-", "_"))
        if value is not None:
            router_args += [name, str(value)]
    if not 0 < args.port < 65536:
        raise ValueError(f"--port must be in 1..65535, got {args.port}")
    for name in ("device_kv_blocks", "host_kv_blocks"):
        value = getattr(args, name)
        if value is not None and value < 0:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 0, got {value}")
    return LaunchConfig(
        model=args.model,
        port=args.port,
        hostname=args.hostname,
        device_kv_blocks=args.device_kv_blocks,
        host_kv_blocks=args.host_kv_blocks,
        dtype=args.dtype,
        warmup_report=args.warmup_report,
        json_output=args.json_output,
        log_level=args.log_level,
        shard_startup_timeout_s=args.shard_startup_timeout_s,
        router_startup_timeout_s=args.router_startup_timeout_s,
        graceful_termination_timeout_s=args.graceful_termination_timeout_s,
        router_args=tuple(router_args),
        api_key=args.api_key_argv if args.api_key_argv is not None else args.api_key_env,
        api_key_in_argv=args.api_key_argv is not None,
    )
