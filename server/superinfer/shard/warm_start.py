"""Warm-up as every rank runs it: sizes the device KV pool from the memory a worst-case step
leaves, allocates both pools, captures the decode CUDA graphs, and measures the step-time cost
model and the transfer engine (`warmup`) — the figures rank 0 returns to the router, and
writes as a report with --warmup-report.

Under tensor parallelism every rank runs `warm_up` in lockstep (the executor tells the others
first): the pool size is the smallest any rank can hold (every rank holds the same block ids),
steps are timed across the group, and each rank times its own transfers, the slowest rank's
figures kept."""
import json
import logging
import pathlib
import time
from dataclasses import dataclass

import torch
from google.protobuf import json_format
from superinfer_kv import TransferEngine

from ..pb import shard_pb2
from .batch import Chunk
from .config import DEFAULT_CPU_KV_BLOCKS, ShardConfig
from .decode_graphs import DecodeGraphs, default_batch_sizes
from .kv_cache import KVCache, blocks_for_memory
from .model_runner import ModelRunner
from .rank_group import RankGroup
from .transfers import TransferTracker
from .warmup import StepCost, TransferCost, measure_step_cost, measure_transfer_cost

log = logging.getLogger(__name__)


@dataclass
class Warmed:
    """What warm-up left a rank: its pools, its decode graphs, its transfer tracker, and the
    measured costs."""

    cache: KVCache
    graphs: DecodeGraphs | None
    tracker: TransferTracker
    step: StepCost
    transfer: TransferCost
    # Allocating (and on a GPU pinning) both pools: what a large host pool costs at start.
    pool_allocation_s: float


def device_blocks(runner: ModelRunner, config: ShardConfig, group: RankGroup | None, max_tokens: int) -> int:
    """The device pool's blocks: as configured on the CPU; on a GPU, the configured fraction of
    the memory a worst-case forward leaves free (at most --device-kv-blocks)."""
    if runner.device.type != "cuda":
        return config.device_kv_blocks or DEFAULT_CPU_KV_BLOCKS
    # Run the worst-case forward on a scratch pool first so activation memory is
    # accounted for, then give a fraction of what is left to the cache.
    scratch_blocks = -(-max_tokens // runner.block_size)
    runner.allocate(scratch_blocks, 0)
    runner.forward([Chunk([0] * max_tokens, 0, list(range(scratch_blocks)))])
    runner.cache = None
    torch.cuda.synchronize(runner.device)
    torch.cuda.empty_cache()
    free, _total = torch.cuda.mem_get_info(runner.device)
    blocks = blocks_for_memory(free, config.kv_memory_fraction, runner.geometry.block_bytes)
    if config.device_kv_blocks:
        blocks = min(blocks, config.device_kv_blocks)
    if group is not None:  # every rank holds the same block ids
        blocks = int(group.minimum([blocks])[0])
    return blocks


def graph_batch_sizes(runner: ModelRunner, config: ShardConfig, group: RankGroup | None,
                      max_requests: int) -> tuple[int, ...]:
    """The decode graphs' batch sizes: on a GPU, one shard, a backend whose metadata graphs can
    replay — those given (--cuda-graphs) or 1, 2, 4 and multiples of 8 up to the step's request
    limit; otherwise none (every step eager)."""
    wanted = config.cuda_graphs
    if wanted == () or runner.device.type != "cuda":
        return ()
    if group is not None:
        log.info("warm-up: decode CUDA graphs are not captured under tensor parallelism; steps run eagerly")
        return ()
    if not runner.attention.graphs:
        log.info("warm-up: decode CUDA graphs are not captured on the %s attention backend; steps run eagerly",
                 runner.attention.name)
        return ()
    return default_batch_sizes(max_requests) if wanted is None else wanted


def warm_up(runner: ModelRunner, config: ShardConfig, group: RankGroup | None, max_tokens: int,
            max_requests: int) -> Warmed:
    """Every rank: allocates the pools and measures steps (all ranks in lockstep) and
    transfers (each rank its own, the slowest rank's figures kept)."""
    num_device = device_blocks(runner, config, group, max_tokens)
    graph_sizes = graph_batch_sizes(runner, config, group, max_requests)
    log.info("warm-up: allocating %d device and %d host KV blocks", num_device, config.host_kv_blocks)
    allocation_started = time.perf_counter()
    cache = runner.allocate(num_device, config.host_kv_blocks, padding_block=bool(graph_sizes))
    pool_allocation_s = time.perf_counter() - allocation_started
    # Before the step timings, so the cost model measures decode steps as they will run.
    graphs = runner.capture_decode_graphs(graph_sizes) if graph_sizes else None
    log.info("warm-up: KV pools allocated in %.2fs (host pool %.1f GiB%s)", pool_allocation_s,
             cache.host.numel() * cache.host.element_size() / 2**30, ", pinned" if cache.host.is_pinned() else "")
    engine = TransferEngine(cache.device, cache.host)
    # Before the step timings too: the cost model prices steps as they will run.
    padding = runner.pad_rows()
    if any(padded != rows for rows, padded in enumerate(padding, 1)):
        log.info("warm-up: projections compute 1..%d rows as %s rows (the cheapest count at or above each)",
                 len(padding), list(padding))
    started = time.perf_counter()
    collective_ns = 0 if group is None else group.tensor_parallel.collective_ns
    step = measure_step_cost(runner, max_tokens, max_requests, config.warmup_repeats)
    if group is not None:
        share = (group.tensor_parallel.collective_ns - collective_ns) / 1e9 / (time.perf_counter() - started)
        log.info("warm-up: %.0f%% of the timed forward passes was spent in the %d ranks' collectives "
                 "(all-reduces and the logits' gather, waiting for the slowest rank included)",
                 100 * share, group.world_size)
    transfer = measure_transfer_cost(engine, cache.num_device_blocks, cache.num_host_blocks, runner.geometry.block_bytes)
    if group is not None:
        transfer = slowest_rank(group, transfer)
    cache.device.zero_()  # warm-up wrote synthetic K/V; start from the documented state
    cache.host.zero_()
    log.info("warm-up: %d device / %d host KV blocks, measured in %.2fs: %s %s (%s transfers%s)",
             cache.num_device_blocks, cache.num_host_blocks, time.perf_counter() - started, step, transfer,
             engine.backend, "" if engine.dma_min_run_bytes is None
             else f", copy engines from {engine.dma_min_run_bytes // 1024} KiB runs")
    tracker = TransferTracker(engine, runner.device, None if group is None else group.all_true)
    return Warmed(cache, graphs, tracker, step, transfer, pool_allocation_s)


def slowest_rank(group: RankGroup, transfer: TransferCost) -> TransferCost:
    # Every rank copies its slice at once: a transfer is done when the slowest one is.
    out_bw, in_bw, neg_overhead, duplex = group.minimum(
        [transfer.swap_out_bytes_per_s, transfer.swap_in_bytes_per_s, -transfer.transfer_overhead_s,
         float(transfer.duplex)])
    return TransferCost(out_bw, in_bw, -neg_overhead, bool(duplex))


def warmup_reply(warmed: Warmed) -> shard_pb2.WarmupResponse:
    step, transfer = warmed.step, warmed.transfer
    return shard_pb2.WarmupResponse(
        num_device_blocks=warmed.cache.num_device_blocks,
        num_host_blocks=warmed.cache.num_host_blocks,
        cost_model=shard_pb2.CostModel(
            step_base_s=step.step_base_s, per_prefill_token_s=step.per_prefill_token_s,
            per_decode_request_s=step.per_decode_request_s, per_context_token_s=step.per_context_token_s,
            swap_out_bytes_per_s=transfer.swap_out_bytes_per_s, swap_in_bytes_per_s=transfer.swap_in_bytes_per_s,
            transfer_overhead_s=transfer.transfer_overhead_s, duplex=transfer.duplex,
            token_curve=shard_pb2.TokenCurve(tokens_s=step.tokens_s, decodes_s=step.decodes_s,
                                             per_context_token_s=step.curve_per_context_token_s),
        ),
    )


def write_warmup_report(path: pathlib.Path, reply: shard_pb2.WarmupResponse, warmed: Warmed, runner: ModelRunner,
                        max_tokens: int, max_requests: int) -> None:
    """What warm-up measured, as the simulator's `measured:` profile reads it."""
    cost_model = json_format.MessageToDict(reply.cost_model, preserving_proto_field_name=True,
                                           always_print_fields_with_no_presence=True)
    report = {
        "name": f"warm-up of {runner.loaded.model_id} on {runner.device}",
        "cost_model": cost_model,
        "block_size": runner.block_size,
        "block_bytes": runner.geometry.block_bytes,
        "num_device_blocks": reply.num_device_blocks,
        "num_host_blocks": reply.num_host_blocks,
        "pool_allocation_s": warmed.pool_allocation_s,
        "max_batch_tokens": max_tokens,
        "max_batch_requests": max_requests,
    }
    if warmed.graphs is not None:
        # What the decode graphs cost at start: capture time and the device memory they hold.
        report["cuda_graphs"] = {"batch_sizes": list(warmed.graphs.batch_sizes),
                                 "capture_s": warmed.graphs.capture_s, "memory_bytes": warmed.graphs.memory_bytes}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1) + "\n")
