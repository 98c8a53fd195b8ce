"""`superinfer serve`: one shard on a unix socket. The only place that reads the environment
and installs signal handlers; everything below gets a typed ShardConfig."""
import argparse
import dataclasses
import logging
import os
import pathlib
import signal
import threading
import time

from ..models.architectures import supported_architectures
from .config import ATTENTION_BACKEND_NAMES, DEFAULT_BLOCK_SIZE
from .host_memory import DEFAULT_HOST_KV_MEMORY_FRACTION

DTYPES = ("auto", "float32", "bfloat16", "float16")
ATTENTION_BACKENDS = ("auto", *ATTENTION_BACKEND_NAMES)
# What --device accepts (whether the device exists is resolve_device's question, at start-up).
DEVICE_PATTERN = r"auto|cpu|cuda(:\d+)?"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--uds-path", type=pathlib.Path, default=None,
                        help="unix socket to listen on (rank 0; the other ranks of a tensor-parallel shard serve none)")
    parser.add_argument("--model", default="default",
                        help='"default" (embedded SmolLM2-135M-Instruct), a local HF directory, a .gguf file, '
                        "or a Hugging Face model id (from the hub cache, else downloaded). Architectures: "
                        f"{', '.join(supported_architectures())}")
    parser.add_argument("--revision", default=None,
                        help="branch, tag or commit of a Hugging Face model id (default: its main branch)")
    parser.add_argument("--huggingface-hub-cache", "--hf-cache-dir", type=pathlib.Path, default=None,
                        help="Hugging Face hub cache to find model ids in and download them to (default: "
                        "HF_HUB_CACHE, HUGGINGFACE_HUB_CACHE, HF_HOME/hub, then huggingface_hub's). HF_HUB_OFFLINE=1: "
                        "the cache only; HF_TOKEN: private and gated models; HF_ENDPOINT: a mirror")
    parser.add_argument("--dtype", choices=DTYPES, default="auto", help="auto: bfloat16 on a GPU, float32 on the CPU")
    parser.add_argument("--device", default="auto",
                        help='"auto" (the first GPU when one is visible, else the CPU; an error when '
                        'NVIDIA_VISIBLE_DEVICES or CUDA_VISIBLE_DEVICES assign GPUs that are missing), '
                        '"cpu", "cuda" or "cuda:N" (an error when missing)')
    parser.add_argument("--block-size", type=int, default=DEFAULT_BLOCK_SIZE, help="tokens per KV block")
    parser.add_argument("--attention-backend", choices=ATTENTION_BACKENDS, default="auto",
                        help="auto: the Triton paged kernels on a GPU, gather + SDPA on the CPU (triton on the "
                        "CPU needs TRITON_INTERPRET=1 and is slow); flashinfer: FlashInfer's kernels on a GPU "
                        "(pip install 'superinfer[gpu]')")
    parser.add_argument("--cuda-graphs", default=None,
                        help="GPU: batch sizes whose decode steps are captured as CUDA graphs, separated by "
                        "commas; 0: none (default: 1, 2, 4 and multiples of 8 up to the step's request limit)")
    parser.add_argument("--device-kv-blocks", type=int, default=None,
                        help="device KV pool size (CPU: default 512; GPU: an upper bound)")
    parser.add_argument("--host-kv-blocks", type=int, default=None,
                        help="host KV pool size in blocks, pinned on a GPU (default: CPU 256; GPU: "
                        "--host-kv-memory-fraction of the host memory available after loading the model)")
    parser.add_argument("--host-kv-memory-fraction", type=float, default=DEFAULT_HOST_KV_MEMORY_FRACTION,
                        help="GPU without --host-kv-blocks: share of the available host memory (MemAvailable, "
                        "bounded by the container's memory limit) the host KV pool takes, split between the "
                        "ranks")
    parser.add_argument("--kv-memory-fraction", type=float, default=0.9,
                        help="GPU: share of the memory free after loading the model and a worst-case forward "
                        "that the KV pool takes")
    parser.add_argument("--max-batch-tokens", type=int, default=2048,
                        help="token budget assumed at warm-up when the router sends none")
    parser.add_argument("--cache-dir", type=pathlib.Path, default=None,
                        help="converted models (default: $SUPERINFER_CACHE or ~/.cache/superinfer)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads (default: one per CPU the process may run on)")
    parser.add_argument("--cpus", default=None,
                        help="CPUs the shard runs on, as taskset writes them (e.g. 1 or 0-3,8): keeps its threads "
                        "off the cores the router or a client use (default: those it inherited)")
    parser.add_argument("--warmup-report", type=pathlib.Path, default=None,
                        help="write what warm-up measured (cost model, KV pools and geometry) to this JSON file, "
                        "the simulator's `measured:` profile")
    parser.add_argument("--lora-adapters", default=os.environ.get("LORA_ADAPTERS") or None,
                        help="LoRA adapters served beside the model, separated by commas: id=path or a bare path "
                        "or Hugging Face id (its own id), each a PEFT adapter (adapter_config.json, "
                        "adapter_model.safetensors) targeting q/k/v/o and gate/up/down projections; a request "
                        "names one by its id [env: LORA_ADAPTERS]")
    parser.add_argument("--log-level", default="INFO")
    parser.add_argument("--otlp-endpoint", default=os.environ.get("OTLP_ENDPOINT") or None,
                        help="OpenTelemetry collector (OTLP/gRPC) for the shard's spans, e.g. http://localhost:4317; "
                        "traces are off without it [env: OTLP_ENDPOINT]")
    parser.add_argument("--otlp-service-name", default="superinfer.shard", help="service name on the shard's spans")
    tensor_parallel = parser.add_argument_group(
        "tensor parallelism", "one process per rank, each on its own device (rank r on cuda:N+r for --device "
        "cuda:N), joined with torch.distributed: NCCL between GPUs, gloo on the CPU")
    tensor_parallel.add_argument("--world-size", type=int, default=1, help="ranks in all (1: no process group)")
    tensor_parallel.add_argument("--rank", type=int, default=0, help="this process's rank; rank 0 serves gRPC")
    tensor_parallel.add_argument("--local-rank", type=int, default=None,
                                 help="its place among this machine's ranks, which picks its GPU (default: --rank)")
    tensor_parallel.add_argument("--master-addr", default=os.environ.get("MASTER_ADDR") or "127.0.0.1",
                                 help="address of rank 0's rendezvous [env: MASTER_ADDR]")
    tensor_parallel.add_argument("--master-port", type=int, default=int(os.environ.get("MASTER_PORT") or 29500),
                                 help="port of rank 0's rendezvous [env: MASTER_PORT]")
    tensor_parallel.add_argument("--dist-timeout-s", type=float, default=600.0,
                                 help="longest wait for every rank to join, and in one collective of a step")


def attention_backend(value: str) -> str | None:
    """--attention-backend's value as `ShardConfig` takes it (None: the device's default)."""
    return None if value == "auto" else value


def cache_dir(arg: pathlib.Path | None) -> pathlib.Path:
    """--cache-dir, else $SUPERINFER_CACHE, else ~/.cache/superinfer."""
    if arg is not None:
        return arg
    env = os.environ.get("SUPERINFER_CACHE")
    return pathlib.Path(env) if env else pathlib.Path.home() / ".cache" / "superinfer"


def shard_config(args: argparse.Namespace):
    import torch

    from .config import ParallelConfig, ShardConfig, parse_cuda_graphs, parse_lora_adapters
    from .device import resolve_device
    from .hub import options_from_environment

    device = resolve_device(args.device, os.environ)
    parallel = ParallelConfig(args.rank, args.world_size, args.master_addr, args.master_port, args.dist_timeout_s)
    if not 0 <= parallel.rank < parallel.world_size:
        raise ValueError(f"--rank {parallel.rank} is not in 0..{parallel.world_size - 1} (--world-size)")
    if parallel.rank == 0 and args.uds_path is None:
        raise ValueError("--uds-path is required (rank 0 serves the router on it)")
    if device.type == "cuda" and parallel.enabled:  # one GPU per rank, counted from the one given
        local_rank = parallel.rank if args.local_rank is None else args.local_rank
        device = resolve_device(f"cuda:{(device.index or 0) + local_rank}", os.environ)
    dtype_name = args.dtype if args.dtype != "auto" else ("bfloat16" if device.type == "cuda" else "float32")
    return ShardConfig(
        model=args.model, cache_dir=cache_dir(args.cache_dir), device=device, dtype=getattr(torch, dtype_name),
        block_size=args.block_size, device_kv_blocks=args.device_kv_blocks, host_kv_blocks=args.host_kv_blocks,
        host_kv_memory_fraction=args.host_kv_memory_fraction, kv_memory_fraction=args.kv_memory_fraction, max_batch_tokens=args.max_batch_tokens,
        hub=options_from_environment(os.environ, args.revision, args.huggingface_hub_cache),
        warmup_report=args.warmup_report, parallel=parallel,
        attention_backend=attention_backend(args.attention_backend),
        cuda_graphs=parse_cuda_graphs(args.cuda_graphs),
        lora_adapters=parse_lora_adapters(args.lora_adapters),
    )


def build_executor(config, group=None):
    """Loads the model named by `config` (with `group`, a RankGroup: this rank's slice of it)
    and returns the executor that serves it."""
    from .executor import ShardExecutor
    from .loader import load_model
    from .model_runner import ModelRunner
    from .model_source import resolve_model

    source = resolve_model(config.model, config.cache_dir, config.hub)
    loaded = load_model(source, config.dtype, config.device, None if group is None else group.tensor_parallel)
    if config.lora_adapters:
        from .lora import load_adapters

        loaded = load_adapters(loaded, config.lora_adapters, config.hub)
    runner = ModelRunner(loaded, config.device, config.dtype, config.block_size, config.attention_backend)
    return ShardExecutor(runner, with_host_pool_size(config, runner.geometry.block_bytes, group), group)


def with_host_pool_size(config, block_bytes: int, group=None):
    """`config` with its host pool's size decided (see `host_memory`): as given; 256 blocks on
    the CPU; on a GPU, the fraction of the available host memory, the same on every rank."""
    from .host_memory import DEFAULT_CPU_HOST_KV_BLOCKS, available_host_bytes, host_blocks_for_memory

    if config.host_kv_blocks is not None:
        return config
    if config.device.type != "cuda":
        return dataclasses.replace(config, host_kv_blocks=DEFAULT_CPU_HOST_KV_BLOCKS)
    available = available_host_bytes()
    ranks = 1 if group is None else group.world_size
    blocks = host_blocks_for_memory(available, config.host_kv_memory_fraction, block_bytes, ranks)
    if group is not None:  # every rank holds the same block ids
        blocks = int(group.minimum([blocks])[0])
    logging.getLogger("superinfer.shard").info(
        "host KV pool: %d blocks of %.1f MiB (%.1f GiB) = %.0f%% of the %.1f GiB of host memory available, "
        "over %d rank(s)", blocks, block_bytes / 2**20, blocks * block_bytes / 2**30,
        100 * config.host_kv_memory_fraction, available / 2**30, ranks)
    return dataclasses.replace(config, host_kv_blocks=blocks)


def _stop_on_signals(shutdown: threading.Event) -> None:
    """Sets `shutdown` on SIGTERM or SIGINT. The signals are blocked in this thread, so in every
    thread started later (torch's, gRPC's), and taken by one thread waiting for them: a Python
    handler runs only once the main thread wakes, and a process stopped (SIGSTOP) and then
    continued gets its pending SIGTERM on whichever thread the kernel picks."""
    signals = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, signals)

    def wait() -> None:
        signal.sigwait(signals)
        shutdown.set()

    threading.Thread(target=wait, name="shard-signals", daemon=True).start()


def run(args: argparse.Namespace) -> int:
    rank = f" rank {args.rank}" if args.world_size > 1 else ""
    logging.basicConfig(level=args.log_level.upper(),
                        format=f"%(asctime)s %(levelname)s{rank} %(name)s: %(message)s")
    log = logging.getLogger("superinfer.shard")
    started = time.perf_counter()
    # First, before any thread starts: a signal during the (long) model load must still stop
    # the shard cleanly.
    shutdown = threading.Event()
    _stop_on_signals(shutdown)
    from .config import parse_cpu_list

    try:
        cpus = parse_cpu_list(args.cpus)
        if cpus is not None:
            os.sched_setaffinity(0, cpus)  # before torch starts its threads: they inherit it
    except (ValueError, OSError) as err:
        log.error("--cpus %s: %s", args.cpus, err)
        return 1
    import torch

    # One intra-op pool over the CPUs this process may run on (its affinity: --cpus, taskset or
    # the container's cpuset); inter-op parallelism only oversubscribes.
    torch.set_num_threads(args.threads or len(os.sched_getaffinity(0)) or 1)
    torch.set_num_interop_threads(1)
    from .device import DeviceError
    from .errors import LoaderError, LoraError
    from .server import ShardServer

    try:
        config = shard_config(args)
    except DeviceError as err:
        log.error("cannot serve on the requested device: %s", err)
        return 1
    except ValueError as err:
        log.error("%s", err)
        return 1
    group = None
    # Every torch operation of the shard runs on one thread, loading included (model_thread.py).
    from .model_thread import ModelThread

    model_thread = ModelThread()
    try:
        if config.parallel.enabled:
            from .rank_group import RankGroup

            group = RankGroup(config.parallel, config.device)
        if config.device.type == "cuda":
            # Streams, events and graphs made without a device argument go to this one.
            model_thread.run(torch.cuda.set_device, config.device)
        executor = model_thread.run(build_executor, config, group)
        if group is not None:
            model_thread.run(group.wait_for_all)  # rank 0 answers Health only once every rank has its weights
    except LoraError as err:
        log.error("cannot serve the LoRA adapters: %s", err)
        return 1
    except LoaderError as err:
        log.error("cannot load the model: %s", err)
        return 1
    except RuntimeError as err:  # torch.distributed: a rank that never joined, or died loading
        if not config.parallel.enabled:
            raise
        log.error("the tensor-parallel group failed at start-up: %s", err)
        return 1
    if shutdown.is_set():
        return 0
    if group is not None and group.rank > 0:
        status, followed = _follow_until(executor, group, shutdown, model_thread)
        executor.close()
        if not followed:  # a signal: the model thread still waits in a collective for rank 0
            logging.shutdown()
            os._exit(status)
        return _leave_group(group, model_thread, status)
    from .telemetry import ShardTraces

    if group is not None:
        group.on_failure = lambda reason: shutdown.set()
    server = ShardServer(executor, args.uds_path, ShardTraces.from_endpoint(args.otlp_endpoint, args.otlp_service_name),
                         model_thread)
    log.info("ready in %.2fs", time.perf_counter() - started)
    server.serve_until(shutdown)
    if group is None:
        return 0
    return _leave_group(group, model_thread, 1 if group.failure is not None else 0)


# How long a rank waits for the model thread to leave the group at exit.
_LEAVE_TIMEOUT_S = 10.0


def _leave_group(group, model_thread, status: int) -> int:
    """Destroys this rank's process groups before the interpreter ends: gloo's worker threads
    outliving it abort the process (SIGABRT, "terminate called without an active exception")
    at random, so a clean stop would read as a crash. On the model thread, where every
    collective ran; if that thread is stuck in a collective (a peer died mid-step) the process
    ends at once with `status`, without the interpreter's teardown."""
    left = model_thread.submit(group.close)
    try:
        left.result(timeout=_LEAVE_TIMEOUT_S)
    except Exception as err:  # noqa: BLE001 - stuck or failed: either way this process ends now
        logging.getLogger("superinfer.shard").warning("rank %d: leaving the group failed (%s); exiting",
                                                      group.rank, err or type(err).__name__)
        logging.shutdown()
        os._exit(status)
    return status


def _follow_until(executor, group, shutdown: threading.Event, model_thread) -> tuple[int, bool]:
    """Ranks > 0: rank 0's commands run on the model thread (they block in torch.distributed,
    where a signal cannot reach them) until rank 0 stops, a command fails, or a signal arrives.
    The exit status, and whether the commands ended (False: a signal came first)."""
    from .follower import follow

    status = []

    def run_commands() -> None:
        status.append(follow(executor, group))
        shutdown.set()

    model_thread.submit(run_commands)
    logging.getLogger("superinfer.shard").info("rank %d of %d: following rank 0", group.rank, group.world_size)
    shutdown.wait()
    return (status[0], True) if status else (0, False)
