"""The launcher's typed configuration: every flag also reads an environment variable of the
same name in upper case (TGI's convention), parsed once into a frozen `LaunchConfig`. TGI's
names are accepted: as aliases (`--model-id`, `--cuda-memory-fraction`), converted
(`--max-batch-total-tokens`), or ignored with a warning (`tgi_flags`).

The router's own flags are not declared here: the launcher asks the router for them
(`router_flags`), offers them with the router's help and aliases, forwards those given on the
command line, and has the router's parser check them before anything starts. The router reads
their environment variables itself (it inherits the launcher's environment)."""
import argparse
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from superinfer import tgi_flags
from superinfer.models.architectures import supported_architectures
from superinfer.shard.cli import ATTENTION_BACKENDS, DEVICE_PATTERN, DTYPES
from superinfer.shard.config import DEFAULT_BLOCK_SIZE, parse_cpu_list, parse_cuda_graphs, parse_lora_adapters
from superinfer.shard.host_memory import DEFAULT_HOST_KV_MEMORY_FRACTION


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
# address it probes, logging, the stop timeout) or sets them (the socket). Their names and
# variables are still the router's (aliases such as -p included).
LAUNCHER_OWNED = frozenset({"--port", "--hostname", "--uds-path", "--device-kv-blocks", "--host-kv-blocks",
                            "--log-level", "--json-output", "--graceful-termination-timeout-s"})


def _router_specs() -> list[dict]:
    """Every router flag, as the router declares it once (clap): name, aliases, help, env,
    env_aliases, default, takes_value."""
    from superinfer import _router

    return json.loads(_router.router_flags())


def router_flags() -> list[dict]:
    """The router's own flags, which the launcher offers and forwards."""
    return [spec for spec in _router_specs() if spec["name"] not in LAUNCHER_OWNED]


@dataclass(frozen=True)
class LaunchConfig:
    # A local directory, a .gguf file or a Hugging Face model id; None: the embedded model.
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
    revision: str | None = None
    # Given as a flag; otherwise the shard reads huggingface_hub's variables itself.
    hub_cache: str | None = None
    kv_memory_fraction: float | None = None
    host_kv_memory_fraction: float | None = None
    # --device for the shard; None: its default, auto.
    device: str | None = None
    # --attention-backend for the shard; None: its default, auto.
    attention_backend: str | None = None
    # --cuda-graphs for the shard, as given (checked by the shard's parser); None: its default.
    cuda_graphs: str | None = None
    # CPUs the shard processes run on (split between this node's ranks); None: inherited.
    shard_cpus: tuple[int, ...] | None = None
    # --lora-adapters for the shard, as given (its syntax checked here, the adapters by the
    # shard); None: none.
    lora_adapters: str | None = None
    # TGI flags given that do not apply here, one warning each.
    ignored_tgi_flags: tuple[str, ...] = ()
    # Shard processes (tensor-parallel ranks, one device each) and their rendezvous; the port
    # None: a free one, chosen at launch.
    num_shard: int = 1
    master_addr: str = "127.0.0.1"
    master_port: int | None = None
    # Machines the ranks are spread over, and this one's place: node r runs ranks
    # r·N/nnodes .. (r+1)·N/nnodes - 1; node 0 also runs the router.
    nnodes: int = 1
    node_rank: int = 0

    @property
    def local_ranks(self) -> range:
        per_node = self.num_shard // self.nnodes
        return range(self.node_rank * per_node, (self.node_rank + 1) * per_node)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    owned = {spec["name"]: spec for spec in _router_specs() if spec["name"] in LAUNCHER_OWNED}

    def flag(names: tuple[str, ...], kind, help_text: str, default=None, envs: tuple[str, ...] = (), **options):
        spec = owned.get(names[0])
        if spec is not None:
            names, envs = (*names, *spec["aliases"]), (spec["env"], *spec["env_aliases"])
        envs = envs or (_env_name(names[0]),)
        value = next((os.environ[env] for env in envs if os.environ.get(env)), default)
        parser.add_argument(*names, type=kind, default=value, help=f"{help_text} [env: {', '.join(envs)}]", **options)

    flag(("--model-id", "--model"), str, "model: a local directory, a .gguf file, or a Hugging Face model id (from "
         "the hub cache, else downloaded; HF_HUB_OFFLINE=1: the cache only; HF_TOKEN for private and gated "
         "models) (default: the embedded SmolLM2-135M-Instruct). Architectures (config.json's model_type): "
         f"{', '.join(supported_architectures())}", envs=("MODEL_ID", "MODEL"), dest="model", metavar="MODEL_ID")
    flag(("--revision",), str, "branch, tag or commit of a Hugging Face model id (default: its main branch)")
    parser.add_argument("--huggingface-hub-cache", default=None,
                        help="Hugging Face hub cache searched and downloaded into (default: the shard reads "
                        "HF_HUB_CACHE, HUGGINGFACE_HUB_CACHE, then HF_HOME/hub, else huggingface_hub's "
                        "~/.cache/huggingface/hub)")
    flag(("--port",), int, "HTTP port (default 3000)", "3000")
    flag(("--hostname",), str, "address the HTTP API binds to (default 0.0.0.0)", "0.0.0.0")
    flag(("--device-kv-blocks",), int, "device KV pool size in blocks (default: what memory allows)")
    flag(("--max-batch-total-tokens",), int, "device KV capacity in tokens (TGI's name): sets --device-kv-blocks "
         f"to ceil(tokens / {DEFAULT_BLOCK_SIZE}), the block size")
    flag(("--host-kv-blocks",), int, "host KV pool size in blocks (default: CPU 256; GPU: --host-kv-memory-fraction "
         "of the host memory available after loading the model)")
    flag(("--host-kv-memory-fraction",), float, "GPU without --host-kv-blocks: share of the available host memory "
         "(bounded by the container's memory limit) the host KV pool takes, pinned, split between the shards "
         f"(default {DEFAULT_HOST_KV_MEMORY_FRACTION})")
    flag(("--kv-memory-fraction", "--cuda-memory-fraction"), float, "GPU: share of the memory free after loading the "
         "model and a worst-case forward that the KV pool takes (default 0.9). Unlike TGI's "
         "--cuda-memory-fraction, a cap on the process's share of the whole GPU, it leaves the rest free",
         envs=("KV_MEMORY_FRACTION", "CUDA_MEMORY_FRACTION"))
    flag(("--num-shard",), int, "shard processes the model is split over (tensor parallelism), one device each: "
         "GPUs cuda:0..N-1 on a GPU host, N processes sharing the cores on the CPU (default 1: one process, no "
         "process group)", "1")
    flag(("--master-addr",), str, "address of the shards' torch.distributed rendezvous, served by rank 0 "
         "(default 127.0.0.1)", "127.0.0.1", envs=("MASTER_ADDR",))
    flag(("--master-port",), int, "port of the shards' rendezvous (default: a free port; required with --nnodes)",
         envs=("MASTER_PORT",))
    flag(("--nnodes",), int, "machines the --num-shard ranks are spread over, the same launcher on each "
         "(default 1)", "1")
    flag(("--node-rank",), int, "this machine's place among --nnodes: node r runs ranks r*N/nnodes.. on its "
         "devices; node 0 also runs the router and rank 0's rendezvous at --master-addr (default 0)", "0")
    flag(("--dtype",), str, f"compute dtype, one of {', '.join(DTYPES)} (default auto: bfloat16 on GPU, float32 "
         "on CPU)")
    flag(("--device",), str, '"auto" (the first GPU when one is visible, else the CPU with a warning; an error '
         "when NVIDIA_VISIBLE_DEVICES or CUDA_VISIBLE_DEVICES assign GPUs that are missing), \"cpu\", \"cuda\" "
         'or "cuda:N" (an error when missing) (default auto)')
    flag(("--attention-backend",), str, '"auto" (Triton paged-attention kernels on a GPU, gather + SDPA on the '
         'CPU), "triton", "sdpa" or "flashinfer" (FlashInfer\'s kernels on a GPU, the gpu extra) (default auto)')
    flag(("--cuda-graphs",), str, "GPU: batch sizes whose decode steps are captured as CUDA graphs at warm-up, "
         "separated by commas; 0: none (default: 1, 2, 4 and multiples of 8 up to the step's request limit)")
    flag(("--shard-cpus",), str, "CPUs the shard runs on, as taskset writes them (e.g. 1 or 0-3,8), split evenly "
         "between this machine's ranks; torch's threads follow. Keeps the model's threads off the cores the "
         "router or clients use (default: every CPU the launcher may use)")
    flag(("--warmup-report",), str, "write what the shard measured at warm-up (cost model, KV pools) to this "
         "JSON file: the simulator's measured: profile")
    flag(("--lora-adapters",), str, "LoRA adapters served beside the model, separated by commas: id=path, or a "
         "bare local directory or Hugging Face id (then also its id); each a PEFT LoRA adapter "
         "(adapter_config.json, adapter_model.safetensors) on the q/k/v/o and gate/up/down projections. A request "
         "names its adapter by its id (parameters.adapter_id on TGI's routes)")
    parser.add_argument("--json-output", action="store_true",
                        default=_bool(os.environ.get("JSON_OUTPUT", "false")),
                        help="log as JSON lines [env: JSON_OUTPUT]")
    flag(("--log-level",), str, "log level of the router and shard (default info)", "info")
    flag(("--shard-startup-timeout-s",), float, "seconds to wait for the shard to load, downloads included "
         "(default 600)", "600")
    flag(("--router-startup-timeout-s",), float, "seconds to wait for the router's /health (default 120)", "120")
    flag(("--graceful-termination-timeout-s",), float, "on SIGTERM, seconds requests in flight get to finish "
         "(new ones get 503) before the server stops (default 30)", "30")
    _add_router_flags(parser)
    # Accepted for TGI's command lines; API_KEY in the environment keeps it out of `ps`.
    parser.add_argument("--api-key", dest="api_key_argv", default=None,
                        help="require 'Authorization: Bearer <key>'; prefer the environment variable, "
                        "a flag is visible to every local user [env: API_KEY]")
    parser.set_defaults(api_key_env=os.environ.get("API_KEY") or None)
    tgi_flags.add_arguments(parser)


def _add_router_flags(parser: argparse.ArgumentParser) -> None:
    router = parser.add_argument_group("router", "the router's own flags, forwarded to it")
    for spec in router_flags():
        default = f" (default {spec['default']})" if spec["default"] is not None else ""
        envs = ", ".join(filter(None, [spec["env"], *spec["env_aliases"]]))
        env = f" [env: {envs}]" if envs else ""
        help_text = f"{spec['help']}{default}{env}".replace("%", "%%")
        names = (spec["name"], *spec["aliases"])
        if spec["takes_value"] and spec.get("value_if_bare") is not None:
            router.add_argument(*names, default=None, metavar="VALUE", nargs="?", const=spec["value_if_bare"],
                                help=help_text)
        elif spec["takes_value"]:
            router.add_argument(*names, default=None, metavar="VALUE", help=help_text)
        else:
            router.add_argument(*names, action="store_true", default=None, help=help_text)


def _device_kv_blocks(args: argparse.Namespace) -> int | None:
    """--device-kv-blocks, or TGI's --max-batch-total-tokens in blocks; both only if they agree."""
    blocks, tokens = args.device_kv_blocks, args.max_batch_total_tokens
    if tokens is None:
        return blocks
    if tokens < 1:
        raise ValueError(f"--max-batch-total-tokens must be >= 1, got {tokens}")
    from_tokens = -(-tokens // DEFAULT_BLOCK_SIZE)
    if blocks is not None and blocks != from_tokens:
        raise ValueError(f"--device-kv-blocks {blocks} and --max-batch-total-tokens {tokens} "
                         f"({from_tokens} blocks of {DEFAULT_BLOCK_SIZE} tokens) disagree; give one")
    return from_tokens


def _check_shard_values(args: argparse.Namespace) -> None:
    if args.num_shard < 1:
        raise ValueError(f"--num-shard must be >= 1, got {args.num_shard}")
    if args.master_port is not None and not 0 < args.master_port < 65536:
        raise ValueError(f"--master-port must be in 1..65535, got {args.master_port}")
    if args.nnodes < 1 or args.num_shard % args.nnodes:
        raise ValueError(f"--nnodes {args.nnodes} must divide --num-shard {args.num_shard}")
    if not 0 <= args.node_rank < args.nnodes:
        raise ValueError(f"--node-rank must be in 0..{args.nnodes - 1}, got {args.node_rank}")
    if args.nnodes > 1 and args.master_port is None:
        raise ValueError("--nnodes needs --master-port (MASTER_PORT): every machine must meet at the same one")
    if args.device is not None and not re.fullmatch(DEVICE_PATTERN, args.device):
        raise ValueError(f'--device must be "auto", "cpu", "cuda" or "cuda:N", got {args.device!r}')
    if args.attention_backend is not None and args.attention_backend not in ATTENTION_BACKENDS:
        raise ValueError(f"--attention-backend must be one of {', '.join(ATTENTION_BACKENDS)}, "
                         f"got {args.attention_backend!r}")
    parse_cuda_graphs(args.cuda_graphs)
    parse_lora_adapters(args.lora_adapters)
    cpus = parse_cpu_list(args.shard_cpus)
    if cpus is not None and len(cpus) < args.num_shard // args.nnodes:
        raise ValueError(f"--shard-cpus {args.shard_cpus} gives {len(cpus)} CPUs to {args.num_shard // args.nnodes} ranks")
    if args.dtype is not None and args.dtype not in DTYPES:
        raise ValueError(f"--dtype must be one of {', '.join(DTYPES)}, got {args.dtype!r}")
    fraction = args.kv_memory_fraction
    if fraction is not None and not 0 < fraction <= 1:
        raise ValueError(f"--kv-memory-fraction (--cuda-memory-fraction) must be in (0, 1], got {fraction}")
    host_fraction = args.host_kv_memory_fraction
    if host_fraction is not None and not 0 < host_fraction <= 1:
        raise ValueError(f"--host-kv-memory-fraction must be in (0, 1], got {host_fraction}")


def from_args(args: argparse.Namespace, environ: Mapping[str, str] = os.environ) -> LaunchConfig:
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
    _check_shard_values(args)
    return LaunchConfig(
        model=args.model,
        port=args.port,
        hostname=args.hostname,
        device_kv_blocks=_device_kv_blocks(args),
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
        revision=args.revision,
        hub_cache=args.huggingface_hub_cache,
        kv_memory_fraction=args.kv_memory_fraction,
        host_kv_memory_fraction=args.host_kv_memory_fraction,
        device=args.device,
        attention_backend=args.attention_backend,
        cuda_graphs=args.cuda_graphs,
        shard_cpus=parse_cpu_list(args.shard_cpus),
        lora_adapters=args.lora_adapters,
        ignored_tgi_flags=tgi_flags.warnings(args, environ),
        num_shard=args.num_shard,
        master_addr=args.master_addr,
        master_port=args.master_port,
        nnodes=args.nnodes,
        node_rank=args.node_rank,
    )
