"""Executes the shard's RPCs on its tensors: Info, Health, Warmup, Step and Reset. Owns the request
table (token ids, sampling state), the model runner and the transfer tracker. Not
thread-safe: the gRPC layer serialises calls onto it.

Step order, as the protocol fixes it: validate the whole plan (no change on failure) → forget
→ register new requests → enqueue transfers → one forward over every scheduled chunk →
sample where the plan says so (a chunk that reaches the end of the request's known tokens) → report completed transfers.
The enqueueing, the forward and the sampling each get a span under the RPC's (`telemetry`).

Under tensor parallelism (`group`) this executor runs on every rank. Rank 0 answers the RPCs:
it tells the other ranks each one that touches the model (`rank_commands`), then runs its own
share; the other ranks run theirs from `follower.follow`. Only rank 0 keeps requests and
samples; every rank transfers its own slice of the same KV blocks, and a transfer is reported
once it has completed on every rank."""
import contextlib
import json
import logging
import time
from dataclasses import dataclass, field

import torch
from google.protobuf import json_format
from opentelemetry import trace
from superinfer_kv import TransferEngine

from ..pb import shard_pb2
from .batch import Chunk
from .decode_graphs import default_batch_sizes
from .device_sampling import PENDING_TOKEN, DeviceSample, plain_greedy
from .config import DEFAULT_CPU_KV_BLOCKS, ShardConfig
from .errors import NotWarmedUpError
from .kv_cache import blocks_for_memory
from .model_runner import ModelRunner
from .plan import PlanLimits, ScheduledWork, ValidatedPlan, validate_plan
from .rank_commands import HealthCommand, RankWork, ResetCommand, StepCommand, StopCommand, TransferOrder, WarmupCommand
from .rank_group import RankGroup
from .requests import RequestState
from .sampling import SamplingFailure, prompt_logprobs, sample
from .telemetry import NO_TRACES
from .token_mask import unpack_allowed
from .transfers import TransferTracker
from .warmup import TransferCost, measure_step_cost, measure_transfer_cost

log = logging.getLogger(__name__)


@dataclass
class LaunchedStep:
    """A Step between `ShardExecutor.launch` and `finish`."""

    request: shard_pb2.StepRequest
    plan: ValidatedPlan
    started_ns: int
    # When `launch` returned.
    launched_ns: int = 0
    outputs: list = field(default_factory=list)
    transfer_ns: int = 0
    forward_ns: int = 0
    sampling_ns: int = 0
    # Transfers polled inside the step's rank command (tensor parallelism); None: at finish.
    completed: list | None = None
    # Plain greedy picks kept on the device, and per pick (output index, request state,
    # position in its token list, row).
    device: DeviceSample | None = None
    device_rows: list = field(default_factory=list)
    # CUDA events around the step's compute, for its device time.
    forward_events: tuple | None = None

    def ready(self) -> bool:
        """Whether finishing it would not wait for the device."""
        return self.device is None or self.device.ready()


class ShardExecutor:
    def __init__(self, runner: ModelRunner, config: ShardConfig, group: RankGroup | None = None):
        self.runner = runner
        self.config = config
        # None: one shard, no process group.
        self.group = group
        self.requests: dict[int, RequestState] = {}
        self.tracker: TransferTracker | None = None
        self.limits: PlanLimits | None = None
        self._warmup_reply: shard_pb2.WarmupResponse | None = None
        self.graphs = None
        # Launch step N+1 before finishing N when the servicer has it (one step in flight):
        # on a GPU with one rank, where N's compute runs while N+1 is prepared. Plain greedy
        # steps then keep their picks on the device (`device_sampling`).
        self.pipeline = runner.device.type == "cuda" and group is None
        # Requests whose last token is still on the device: (the step's picks, its row).
        self._pending: dict[int, tuple[DeviceSample, int]] = {}
        self._last_finish_ns = 0

    def info(self) -> shard_pb2.InfoResponse:
        model_config, tokenizer = self.runner.config, self.runner.loaded.tokenizer
        return shard_pb2.InfoResponse(
            model_id=self.runner.loaded.model_id,
            architecture=model_config.architecture,
            dtype=str(self.runner.dtype).removeprefix("torch."),
            device_type=self.runner.device.type,
            block_size=self.runner.block_size,
            num_layers=model_config.num_layers,
            num_kv_heads=model_config.num_kv_heads,
            head_dim=model_config.head_dim,
            block_bytes=self.runner.geometry.block_bytes,
            max_position_embeddings=model_config.max_position_embeddings,
            vocab_size=model_config.vocab_size,
            tokenizer_json=tokenizer.tokenizer_json,
            chat_template=tokenizer.chat_template,
            eos_token_ids=list(tokenizer.eos_token_ids),
            bos_token=tokenizer.bos_token,
            eos_token=tokenizer.eos_token,
            world_size=self.world_size,
            adapters=list(self.runner.loaded.adapters),
        )

    @property
    def world_size(self) -> int:
        return 1 if self.group is None else self.group.world_size

    @contextlib.contextmanager
    def _on_every_rank(self, command):
        """Runs the block on every rank: tells the others `command` first. A failure past that
        point leaves the ranks out of step, which nothing repairs: the group fails (and the
        shard ends) with it."""
        if self.group is None:
            yield
            return
        if self.group.failure is not None:
            raise RuntimeError(f"the tensor-parallel group failed: {self.group.failure}")
        try:
            self.group.send(command)
            yield
        except Exception as err:
            self.group.fail(f"{type(err).__name__}: {err}")
            raise

    def health(self) -> shard_pb2.HealthResponse:
        with self._on_every_rank(HealthCommand()):
            self.check_device()
        return shard_pb2.HealthResponse()

    def check_device(self) -> None:
        """A tiny operation on the device; under tensor parallelism also an all-reduce."""
        probe = torch.ones(1, device=self.runner.device).add_(1)
        if self.group is not None:
            self.group.tensor_parallel.all_reduce(probe)
        if float(probe.cpu()) != 2.0 * self.world_size:
            raise RuntimeError(f"the device {self.runner.device} computed a wrong result")

    def _device_blocks(self, max_tokens: int) -> int:
        if self.runner.device.type != "cuda":
            return self.config.device_kv_blocks or DEFAULT_CPU_KV_BLOCKS
        # Run the worst-case forward on a scratch pool first so activation memory is
        # accounted for, then give a fraction of what is left to the cache.
        scratch_blocks = -(-max_tokens // self.runner.block_size)
        self.runner.allocate(scratch_blocks, 0)
        self.runner.forward([Chunk([0] * max_tokens, 0, list(range(scratch_blocks)))])
        self.runner.cache = None
        torch.cuda.synchronize(self.runner.device)
        torch.cuda.empty_cache()
        free, _total = torch.cuda.mem_get_info(self.runner.device)
        blocks = blocks_for_memory(free, self.config.kv_memory_fraction, self.runner.geometry.block_bytes)
        if self.config.device_kv_blocks:
            blocks = min(blocks, self.config.device_kv_blocks)
        if self.group is not None:  # every rank holds the same block ids
            blocks = int(self.group.minimum([blocks])[0])
        return blocks

    def warmup(self, request: shard_pb2.WarmupRequest) -> shard_pb2.WarmupResponse:
        if self._warmup_reply is not None:
            return self._warmup_reply  # pools exist already; a second Warmup changes nothing
        max_tokens = request.max_batch_tokens or self.config.max_batch_tokens
        max_requests = request.max_batch_requests or 32
        with self._on_every_rank(WarmupCommand(max_tokens, max_requests)):
            cache, step, transfer = self.warm_up(max_tokens, max_requests)
        model_config = self.runner.config
        self.limits = PlanLimits(cache.num_device_blocks, cache.num_host_blocks, self.runner.block_size,
                                 model_config.vocab_size, model_config.max_position_embeddings,
                                 adapters=self.runner.loaded.adapters)
        self._warmup_reply = shard_pb2.WarmupResponse(
            num_device_blocks=cache.num_device_blocks,
            num_host_blocks=cache.num_host_blocks,
            cost_model=shard_pb2.CostModel(
                step_base_s=step.step_base_s, per_prefill_token_s=step.per_prefill_token_s,
                per_decode_request_s=step.per_decode_request_s, per_context_token_s=step.per_context_token_s,
                swap_out_bytes_per_s=transfer.swap_out_bytes_per_s, swap_in_bytes_per_s=transfer.swap_in_bytes_per_s,
                transfer_overhead_s=transfer.transfer_overhead_s, duplex=transfer.duplex,
                token_curve=shard_pb2.TokenCurve(tokens_s=step.tokens_s, decodes_s=step.decodes_s,
                                                 per_context_token_s=step.curve_per_context_token_s),
            ),
        )
        if self.config.warmup_report is not None:
            self._write_warmup_report(self._warmup_reply, max_tokens, max_requests)
        return self._warmup_reply

    def warm_up(self, max_tokens: int, max_requests: int):
        """Every rank: allocates the pools and measures steps (all ranks in lockstep) and
        transfers (each rank its own, the slowest rank's figures kept)."""
        num_device = self._device_blocks(max_tokens)
        graph_sizes = self._graph_batch_sizes(max_requests)
        log.info("warm-up: allocating %d device and %d host KV blocks", num_device, self.config.host_kv_blocks)
        allocation_started = time.perf_counter()
        cache = self.runner.allocate(num_device, self.config.host_kv_blocks, padding_block=bool(graph_sizes))
        self.pool_allocation_s = time.perf_counter() - allocation_started
        # Before the step timings, so the cost model measures decode steps as they will run.
        self.graphs = self.runner.capture_decode_graphs(graph_sizes) if graph_sizes else None
        log.info("warm-up: KV pools allocated in %.2fs (host pool %.1f GiB%s)", self.pool_allocation_s,
                 cache.host.numel() * cache.host.element_size() / 2**30, ", pinned" if cache.host.is_pinned() else "")
        engine = TransferEngine(cache.device, cache.host)
        started = time.perf_counter()
        collective_ns = 0 if self.group is None else self.group.tensor_parallel.collective_ns
        step = measure_step_cost(self.runner, max_tokens, max_requests, self.config.warmup_repeats)
        if self.group is not None:
            share = (self.group.tensor_parallel.collective_ns - collective_ns) / 1e9 / (time.perf_counter() - started)
            log.info("warm-up: %.0f%% of the timed forward passes was spent in the %d ranks' collectives "
                     "(all-reduces and the logits' gather, waiting for the slowest rank included)",
                     100 * share, self.group.world_size)
        transfer = measure_transfer_cost(engine, cache.num_device_blocks, cache.num_host_blocks, self.runner.geometry.block_bytes)
        if self.group is not None:
            transfer = self._slowest_rank(transfer)
        cache.device.zero_()  # warm-up wrote synthetic K/V; start from the documented state
        cache.host.zero_()
        log.info("warm-up: %d device / %d host KV blocks, measured in %.2fs: %s %s (%s transfers%s)",
                 cache.num_device_blocks, cache.num_host_blocks, time.perf_counter() - started, step, transfer,
                 engine.backend, "" if engine.dma_min_run_bytes is None
                 else f", copy engines from {engine.dma_min_run_bytes // 1024} KiB runs")
        self.tracker = TransferTracker(engine, self.runner.device, None if self.group is None else self.group.all_true)
        return cache, step, transfer

    def _graph_batch_sizes(self, max_requests: int) -> tuple[int, ...]:
        """The decode graphs' batch sizes: on a GPU, one shard, Triton attention — those
        given (--cuda-graphs) or 1, 2, 4 and multiples of 8 up to the step's request limit;
        otherwise none (every step eager)."""
        wanted = self.config.cuda_graphs
        if wanted == () or self.runner.device.type != "cuda":
            return ()
        if self.group is not None:
            log.info("warm-up: decode CUDA graphs are not captured under tensor parallelism; steps run eagerly")
            return ()
        if self.runner.layout.attention_backend != "triton":
            log.info("warm-up: decode CUDA graphs need --attention-backend triton; steps run eagerly")
            return ()
        return default_batch_sizes(max_requests) if wanted is None else wanted

    def _slowest_rank(self, transfer: TransferCost) -> TransferCost:
        # Every rank copies its slice at once: a transfer is done when the slowest one is.
        out_bw, in_bw, neg_overhead, duplex = self.group.minimum(
            [transfer.swap_out_bytes_per_s, transfer.swap_in_bytes_per_s, -transfer.transfer_overhead_s,
             float(transfer.duplex)])
        return TransferCost(out_bw, in_bw, -neg_overhead, bool(duplex))

    def _write_warmup_report(self, reply: shard_pb2.WarmupResponse, max_tokens: int, max_requests: int) -> None:
        """What warm-up measured, as the simulator's `measured:` profile reads it."""
        cost_model = json_format.MessageToDict(reply.cost_model, preserving_proto_field_name=True,
                                               always_print_fields_with_no_presence=True)
        report = {
            "name": f"warm-up of {self.runner.loaded.model_id} on {self.runner.device}",
            "cost_model": cost_model,
            "block_size": self.runner.block_size,
            "block_bytes": self.runner.geometry.block_bytes,
            "num_device_blocks": reply.num_device_blocks,
            "num_host_blocks": reply.num_host_blocks,
            # Allocating (and on a GPU pinning) both pools: what a large host pool costs at start.
            "pool_allocation_s": self.pool_allocation_s,
            "max_batch_tokens": max_tokens,
            "max_batch_requests": max_requests,
        }
        if self.graphs is not None:
            # What the decode graphs cost at start: capture time and the device memory they hold.
            report["cuda_graphs"] = {"batch_sizes": list(self.graphs.batch_sizes),
                                     "capture_s": self.graphs.capture_s, "memory_bytes": self.graphs.memory_bytes}
        self.config.warmup_report.parent.mkdir(parents=True, exist_ok=True)
        self.config.warmup_report.write_text(json.dumps(report, indent=1) + "\n")

    def step(self, request: shard_pb2.StepRequest, tracer: trace.Tracer = NO_TRACES) -> shard_pb2.StepResponse:
        """`tracer`: makes the spans of the step's phases, under the current span."""
        return self.finish(self.launch(request, tracer))

    def launch(self, request: shard_pb2.StepRequest, tracer: trace.Tracer = NO_TRACES) -> "LaunchedStep":
        """Everything of a Step up to its sampled tokens: the plan applied, transfers enqueued,
        the forward and the sampling run (on a GPU with `pipeline`, a plain greedy step's
        picks stay on the device, see `device_sampling`, and nothing waits for them)."""
        started = time.perf_counter_ns()
        if self.tracker is None or self.limits is None:
            raise NotWarmedUpError("Step before Warmup: the KV pools are not allocated")
        plan = validate_plan(request, self.requests, self.limits, self.tracker.in_flight())
        for request_id in plan.forget:
            self.requests.pop(request_id, None)
            self._pending.pop(request_id, None)
        for new in plan.new_requests:
            self.requests[new.request_id] = new
        work, feed = self._rank_work(request, plan.scheduled)
        launched = LaunchedStep(request, plan, started)
        with self._on_every_rank(StepCommand(work)):
            transfer_start = time.perf_counter_ns()
            with tracer.start_as_current_span("transfers") as span:
                if span.is_recording():
                    span.set_attributes({"swap_out": len(request.rotate_out), "swap_in": len(request.rotate_in),
                                         "blocks_out": sum(len(t.src_blocks) for t in request.rotate_out),
                                         "blocks_in": sum(len(t.src_blocks) for t in request.rotate_in)})
                self.tracker.submit(work.rotate_out, work.rotate_in)
            launched.transfer_ns = time.perf_counter_ns() - transfer_start
            self._compute(launched, work, feed, tracer)
            if not self.pipeline:
                # Under tensor parallelism the completion poll is a collective in the command.
                launched.completed = self.tracker.poll()
        launched.launched_ns = time.perf_counter_ns()
        return launched

    def finish(self, launched: "LaunchedStep") -> shard_pb2.StepResponse:
        """The Step's reply: waits for tokens still on their way from the device, writes them
        into the requests' token lists, and reports the transfers completed since the last step.
        Without `pipeline` (tokens sampled and transfers polled at launch) it reads only
        `launched`, so it may run on another thread beside the next step's launch."""
        finish_started = time.perf_counter_ns()
        outputs = launched.outputs
        if launched.device is not None:
            tokens, logprobs, top_values, top_ids = launched.device.result()
            for index, state, position, row in launched.device_rows:
                if state.token_ids[position] == PENDING_TOKEN:
                    state.token_ids[position] = tokens[row]
                if self._pending.get(state.request_id, (None,))[0] is launched.device:
                    del self._pending[state.request_id]
                top_n = state.params.top_n_tokens
                outputs[index].token.CopyFrom(shard_pb2.SampledToken(
                    id=tokens[row], logprob=logprobs[row],
                    top_tokens=[shard_pb2.TokenLogprob(id=i, logprob=lp)
                                for i, lp in zip(top_ids[row][:top_n], top_values[row][:top_n])],
                ))
            if launched.forward_events is not None:
                begin, end = launched.forward_events
                launched.forward_ns = int(begin.elapsed_time(end) * 1e6)  # the device's time
        completed = launched.completed if launched.completed is not None else self.tracker.poll()
        request, plan = launched.request, launched.plan
        outputs.extend(shard_pb2.RequestOutput(request_id=rid, error=error) for rid, error in plan.failed)
        step_span = trace.get_current_span()
        if step_span.is_recording():
            step_span.set_attributes({"step_id": request.step_id, "scheduled": len(plan.scheduled),
                                      "new_requests": len(plan.new_requests), "forget": len(plan.forget),
                                      "completed_transfers": len(completed)})
        # A step launched while the one before it still ran counts from that one's finish: its
        # time is what it adds to the sequence of steps, as the cost model's correction needs.
        finished = time.perf_counter_ns()
        if self.pipeline:
            total_ns = finished - max(launched.started_ns, self._last_finish_ns)
            self._last_finish_ns = finished
        else:  # steps run one after the other: each its own work, launch and reply (not the hand-off between)
            total_ns = (launched.launched_ns - launched.started_ns) + (finished - finish_started)
        return shard_pb2.StepResponse(
            step_id=request.step_id,
            outputs=outputs,
            completed_transfers=completed,
            timings=shard_pb2.StepTimings(
                forward_ns=launched.forward_ns, sampling_ns=launched.sampling_ns, transfer_ns=launched.transfer_ns,
                total_ns=total_ns,
            ),
        )

    def can_run_ahead(self, launched: "LaunchedStep", request: shard_pb2.StepRequest) -> bool:
        """Whether `request`, the step planned while `launched` runs, may be launched before
        `launched` is finished: only with `pipeline`, after a step whose picks stayed on the
        device, and when every row `request` samples is plain greedy without prompt logprobs
        (nothing of it reads a host-side token that is not there yet)."""
        if not self.pipeline or launched.device is None:
            return False
        new = {n.id: n for n in request.new_requests}
        for item in request.scheduled:
            if item.id in new:
                params, prompt_logprobs = new[item.id].parameters, new[item.id].prompt_logprobs
                do_sample, penalty = params.do_sample, params.repetition_penalty not in (0.0, 1.0) or bool(
                    params.frequency_penalty)
            elif item.id in self.requests:
                state = self.requests[item.id]
                do_sample, penalty, prompt_logprobs = state.params.do_sample, state.params.has_penalty, state.prompt_logprobs
            else:
                return False  # the plan is refused; let it be refused in order
            if prompt_logprobs or (item.sample and not plain_greedy(do_sample, penalty, item.allowed_tokens)):
                return False
        return True

    def run_work(self, work: RankWork) -> None:
        """Ranks > 0: their share of a step (rank 0 runs the same in `step`)."""
        self.tracker.submit(work.rotate_out, work.rotate_in)
        if work.chunks:
            self.forward_work(work)
        self.tracker.poll()

    def _rank_work(self, request: shard_pb2.StepRequest, scheduled: list[ScheduledWork]):
        """The step as every rank runs it: transfers, chunks and the positions needing logits
        (the last of each request the plan samples, plus prompt positions whose next prompt
        token's logprob was asked for); and the feed of inputs still on the device (chunk
        indices, the step's picks, their rows), None when every input is on the host."""
        chunks, offsets = [], []
        fed_chunks, source, source_rows = [], None, []
        for index, work in enumerate(scheduled):
            state = self.requests[work.request_id]
            end = work.start + work.num_new
            tokens = state.token_ids[work.start : end]
            if tokens[-1] == PENDING_TOKEN:
                # The token the step still running sampled for it: fed from the device.
                pick, row = self._pending[work.request_id]
                if source is not None and pick is not source:
                    raise RuntimeError("inputs fed from two steps' device picks")
                source = pick
                fed_chunks.append(index)
                source_rows.append(row)
                tokens = [*tokens[:-1], 0]
            if PENDING_TOKEN in tokens:
                raise RuntimeError(f"request {work.request_id}: a token still on the device is not the chunk's last input")
            chunks.append(Chunk(tokens, work.start, list(work.block_table), adapter=state.adapter))
            needed = []
            if state.prompt_logprobs and work.start + 1 < state.prompt_len:
                needed.extend(range(min(end + 1, state.prompt_len) - work.start - 1))
            if work.sample:
                needed.append(work.num_new - 1)
            offsets.append(needed)
        work = RankWork([TransferOrder.of(t) for t in request.rotate_out], [TransferOrder.of(t) for t in request.rotate_in],
                        chunks, offsets)
        return work, None if source is None else (fed_chunks, source.tokens, source_rows)

    def forward_work(self, work: RankWork, feed=None, wait: bool = True) -> torch.Tensor | None:
        """One forward over the step's chunks; the logits [R, vocab] of the needed rows, in
        `work.logit_offsets` order (None when none are needed, and on ranks > 0). `feed`: inputs
        taken from a device tensor (`_rank_work`); `wait`: on a GPU, wait for the step's compute."""
        read_blocks, written_blocks = set(), set()
        for chunk in work.chunks:
            read_blocks.update(chunk.block_table)
            written_blocks.update(chunk.block_table[chunk.start // self.runner.block_size :])
        self.tracker.order_before_compute(read_blocks, written_blocks)
        hidden, batch = self.runner.forward(work.chunks, feed=feed)
        rows = [batch.first_rows[index] + offset
                for index, offsets in enumerate(work.logit_offsets) for offset in offsets]
        logits = self.runner.logits(hidden[torch.tensor(rows, dtype=torch.int64, device=hidden.device)]) if rows else None
        if wait and self.runner.device.type == "cuda":
            # The step's own compute only (the forward time is measured up to here): DuplexKV's
            # copies run on their own non-blocking streams, and a transfer may outlast the step
            # that started it — it is acknowledged in a later reply.
            torch.cuda.current_stream(self.runner.device).synchronize()
        return logits

    def _compute(self, launched: "LaunchedStep", work: RankWork, feed, tracer: trace.Tracer) -> None:
        """Runs the scheduled work: the forward and the sampling, into `launched` (outputs,
        forward and sampling time; with device picks, `device` and `device_rows`)."""
        scheduled = launched.plan.scheduled
        launched.outputs = [shard_pb2.RequestOutput(request_id=item.request_id) for item in scheduled]
        if not scheduled:
            return
        sample_rows, prompt_rows = self._logit_rows(scheduled, work)
        on_device = self.pipeline and bool(sample_rows) and not prompt_rows and all(
            plain_greedy(self.requests[scheduled[i].request_id].params.do_sample,
                         self.requests[scheduled[i].request_id].params.has_penalty, scheduled[i].allowed_tokens)
            for i, _ in sample_rows)
        forward_start = time.perf_counter_ns()
        events = None
        if on_device and self.runner.device.type == "cuda":
            events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            events[0].record()
        tokens = sum(item.num_new for item in scheduled)
        with tracer.start_as_current_span("forward", attributes={"requests": len(scheduled), "tokens": tokens}):
            logits = self.forward_work(work, feed, wait=not on_device)
        sampling_start = time.perf_counter_ns()
        launched.forward_ns = sampling_start - forward_start
        with tracer.start_as_current_span("sampling", attributes={"sampled": len(sample_rows)}):
            if on_device:
                self._sample_on_device(launched, logits, sample_rows)
                if events is not None:
                    events[1].record()
                    launched.forward_events = events
            else:
                self._sample(scheduled, logits, sample_rows, prompt_rows, launched.request.step_id, launched.outputs)
        launched.sampling_ns = time.perf_counter_ns() - sampling_start

    def _sample_on_device(self, launched: "LaunchedStep", logits, sample_rows: list[tuple[int, int]]) -> None:
        """Plain greedy picks kept on the device; each request's token list gets a placeholder
        at the picked token's position until `finish` writes it."""
        scheduled = launched.plan.scheduled
        rows = [row for _, row in sample_rows]
        picked = logits if rows == list(range(logits.shape[0])) else logits[rows]
        states = [self.requests[scheduled[i].request_id] for i, _ in sample_rows]
        launched.device = DeviceSample(picked, max(state.params.top_n_tokens for state in states))
        for k, ((index, _), state) in enumerate(zip(sample_rows, states)):
            launched.device_rows.append((index, state, len(state.token_ids), k))
            state.token_ids.append(PENDING_TOKEN)
            state.sampled_in_step = launched.request.step_id
            self._pending[state.request_id] = (launched.device, k)

    def _logit_rows(self, scheduled: list[ScheduledWork], work: RankWork):
        """Where each request's logits are: the sampled rows as (index in `scheduled`, row) and
        the prompt rows as index -> (first row, next prompt tokens)."""
        sample_rows: list[tuple[int, int]] = []
        prompt_rows: dict[int, tuple[int, list[int]]] = {}
        row = 0
        for index, (item, offsets) in enumerate(zip(scheduled, work.logit_offsets)):
            prompt_count = len(offsets) - (1 if item.sample else 0)
            if prompt_count:
                state = self.requests[item.request_id]
                prompt_rows[index] = (row, state.token_ids[item.start + 1 : item.start + 1 + prompt_count])
            if item.sample:
                sample_rows.append((index, row + prompt_count))
            row += len(offsets)
        return sample_rows, prompt_rows

    def _sample(self, scheduled: list[ScheduledWork], logits, sample_rows: list[tuple[int, int]],
                prompt_rows: dict[int, tuple[int, list[int]]], step_id: int,
                outputs: list[shard_pb2.RequestOutput]) -> None:
        """Samples where the plan says so, into `outputs`; each sampled token is kept in the
        request's state (the next step's input, whether or not the router has seen it yet)."""
        if sample_rows:
            sampled_states = [self.requests[scheduled[i].request_id] for i, _ in sample_rows]
            rows = [row for _, row in sample_rows]
            # [S, V]; the common step (every row sampled, in order) needs no copy.
            sampled_logits = logits if rows == list(range(logits.shape[0])) else logits[rows]
            allowed = unpack_allowed([scheduled[i].allowed_tokens for i, _ in sample_rows],
                                     sampled_logits.shape[-1], sampled_logits.device)
            tokens = sample(sampled_logits, sampled_states, allowed)
            for (index, _), state, token in zip(sample_rows, sampled_states, tokens):
                if isinstance(token, SamplingFailure):
                    outputs[index].error = token.message
                    state.failure = token.message
                    continue
                state.token_ids.append(token.token_id)
                state.sampled_in_step = step_id
                outputs[index].token.CopyFrom(shard_pb2.SampledToken(
                    id=token.token_id, logprob=token.logprob,
                    top_tokens=[shard_pb2.TokenLogprob(id=i, logprob=lp) for i, lp in token.top_tokens],
                ))
        for index, (first, targets) in prompt_rows.items():
            outputs[index].prompt_logprobs.extend(prompt_logprobs(logits[first : first + len(targets)], targets))

    def reset(self) -> shard_pb2.ResetResponse:
        """Drops every request and waits for in-flight transfers (the router's recovery after
        a failed step); pools and warm-up stay."""
        if self.tracker is None:
            raise NotWarmedUpError("Reset before Warmup: there is nothing to reset")
        dropped = len(self.requests)
        self.requests.clear()
        self._pending.clear()
        with self._on_every_rank(ResetCommand()):
            self.tracker.drain()
        log.warning("reset: dropped %d requests", dropped)
        return shard_pb2.ResetResponse(dropped_requests=dropped)

    def close(self) -> None:
        if self.group is not None and self.group.failure is None and self.group.rank == 0:
            with contextlib.suppress(Exception):  # a rank that is gone already needs no stop
                self.group.send(StopCommand())
        if self.tracker is not None:
            self.tracker.close()
