"""The launcher's typed configuration: every flag also reads an environment variable of the
same name in upper case (TGI's convention), parsed once into a frozen `LaunchConfig`.

The router's own flags are not declared here: the launcher asks the router for them
(`router_flags`), offers them with the router's help, forwards those given on the command
line, and has the router's parser check them before anything starts. The router reads their
environment variables itself (it inherits the launcher's environment)."""
import argparse
import json
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


# Router flags the launcher declares itself, because it uses them too (the shard's pools, the
# address it probes, logging, the stop timeout) or sets them (the socket).
LAUNCHER_OWNED = frozenset({"--port", "--hostname", "--uds-path", "--device-kv-blocks", "--host-kv-blocks",
                            "--log-level", "--json-output", "--graceful-termination-timeout-s"})


def router_flags() -> list[dict]:
    """The router's own flags (the router declares them once, with clap): name, help, env,
    default, takes_value."""
    from superinfer import _router

    return [spec for spec in json.loads(_router.router_flags()) if spec["name"] not in LAUNCHER_OWNED]


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
    flag("--host-kv-blocks", int, "host KV pool size in blocks (default 256)")
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
    router = parser.add_argument_group("router", "the router's own flags, forwarded to it")
    for spec in router_flags():
        default = f" (default {spec['default']})" if spec["default"] is not None else ""
        env = f" [env: {spec['env']}]" if spec["env"] else ""
        help_text = f"{spec['help']}{default}{env}".replace("%", "%%")
        if spec["takes_value"]:
            router.add_argument(spec["name"], default=None, metavar="VALUE", help=help_text)
        else:
            router.add_argument(spec["name"], action="store_true", default=None, help=help_text)
    # Accepted for TGI's command lines; API_KEY in the environment keeps it out of `ps`.
    parser.add_argument("--api-key", dest="api_key_argv", default=None,
                        help="require 'Authorization: Bearer <key>'; prefer the environment variable, "
                        "a flag is visible to every local user [env: API_KEY]")
    parser.set_defaults(api_key_env=os.environ.get("API_KEY") or None)


def from_args(args: argparse.Namespace) -> LaunchConfig:
    router_args: list[str] = []
    for spec in router_flags():
        value = getattr(args, spec["name"].lstrip("-").replace("-", "_"))
        if value is None:
            continue
        router_args += [spec["name"], str(value)] if spec["takes_value"] else [spec["name"]]
    from superinfer import _router

    if (error := _router.check_router_args(router_args)) is not None:
        raise ValueError(f"router flags: {error.strip()}")
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
