"""Executes the shard's RPCs on its tensors: Info, Health, Warmup, Step, Reset, LoadAdapter and
UnloadAdapter. Owns the request table (token ids, sampling state), the model runner, the
transfer tracker and the table of LoRA adapters loaded (slot -> id). Not thread-safe: the gRPC
layer serialises calls onto it — except `prepare_adapter`, which reads an adapter's files beside
the steps and changes nothing.

LoRA adapters keep the slot they were loaded in for their life (k + 1 for the k-th of
`--lora-adapters`; the router's choice for one loaded later), and a slot holds one adapter at a
time. A LoadAdapter reads and checks the adapter first (`prepare_adapter`, off the model
thread), then installs it between steps (`install_prepared`); an UnloadAdapter takes it out
between steps (`unload_adapter`).

Step order, as the protocol fixes it: validate the whole plan (no change on failure) → forget
→ register new requests → one rank step (`rank_step`: transfers enqueued, one forward over
every scheduled chunk, the needed logits, completed transfers polled) → sample where the plan
says so (`step_sampling`). The enqueueing, the forward and the sampling each get a span under
the RPC's (`telemetry`). Warm-up (pool sizing, graphs, cost measurements) is `warm_start`'s.

Under tensor parallelism (`group`) this executor runs on every rank. Rank 0 answers the RPCs:
it tells the other ranks each one that touches the model (`rank_commands`), then runs its own
share — the same `run_rank_step` the other ranks run from `follower.follow`. Only rank 0 keeps
requests and samples; every rank transfers its own slice of the same KV blocks, and a transfer
is reported once it has completed on every rank."""
import concurrent.futures
import contextlib
import logging
import pathlib
import time
from dataclasses import dataclass, field

import torch
from opentelemetry import trace

from ..pb import shard_pb2
from ..models.lora import remove_adapter
from .config import LoraAdapterSpec, ShardConfig
from .device_sampling import plain_greedy
from .errors import AdapterRequestError, LoraError, NotWarmedUpError
from .lora import ReadAdapter, check_memory_for, install, read_adapter
from .model_runner import ModelRunner
from .plan import PlanLimits, ValidatedPlan, validate_plan
from .rank_commands import (AdapterReadCommand, DropAdapterReadCommand, HealthCommand, LoadAdapterCommand,
                            RankWork, ReadAdapterCommand, ResetCommand, StepCommand, StopCommand,
                            UnloadAdapterCommand, WarmupCommand)
from .rank_group import RankGroup
from .rank_step import rank_work, run_rank_step
from .requests import RequestState
from .step_sampling import (DevicePicks, finish_device_picks, logit_rows, sample_on_device, sample_on_host,
                            samples_plain_greedy)
from .telemetry import NO_TRACES
from .warm_start import Warmed, warm_up, warmup_reply, write_warmup_report

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
    # Transfers polled inside the step (every step but a pipelined one); None: at finish.
    completed: list | None = None
    # Plain greedy picks kept on the device (`step_sampling`).
    device: DevicePicks | None = None
    # CUDA events around the step's compute, for its device time (read once the end has completed).
    forward_events: tuple | None = None

    def ready(self) -> bool:
        """Whether finishing it would not wait for the device."""
        return self.device is None or self.device.sample.ready()


@dataclass(frozen=True)
class PreparedAdapter:
    """A LoadAdapter between `ShardExecutor.prepare_adapter` and `install_prepared`."""

    slot: int
    # As LoadAdapter gave it (a directory or a hub id).
    source: str
    adapter: ReadAdapter


class ShardExecutor:
    def __init__(self, runner: ModelRunner, config: ShardConfig, group: RankGroup | None = None):
        self.runner = runner
        self.config = config
        # None: one shard, no process group.
        self.group = group
        self.requests: dict[int, RequestState] = {}
        self.warmed: Warmed | None = None
        self.limits: PlanLimits | None = None
        self._warmup_reply: shard_pb2.WarmupResponse | None = None
        # Launch step N+1 before finishing N when the servicer has it (one step in flight):
        # on a GPU with one rank, where N's compute runs while N+1 is prepared. Plain greedy
        # steps then keep their picks on the device (`device_sampling`).
        self.pipeline = runner.device.type == "cuda" and group is None
        # Requests whose last token is still on the device: (the step's picks, its row).
        self._pending: dict = {}
        self._last_finish_ns = 0
        # The LoRA adapters installed, slot -> id: the start-up ones (slot k + 1 for the k-th
        # of --lora-adapters), then LoadAdapter's and UnloadAdapter's changes. The plans'
        # limits hold this same dict. Changed on the model thread only.
        self.adapters: dict[int, str] = dict(enumerate(runner.loaded.adapters, start=1))
        # Ranks > 0: adapters being read beside the steps (`ReadAdapterCommand`), by slot.
        self._reads: dict[int, concurrent.futures.Future] = {}
        self._reader: concurrent.futures.ThreadPoolExecutor | None = None

    def info(self) -> shard_pb2.InfoResponse:
        model_config, tokenizer = self.runner.config, self.runner.loaded.tokenizer
        adapters = sorted(self.adapters.copy().items())  # a copy: the model thread may change it
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
            adapters=[adapter for _, adapter in adapters],
            adapter_slots=[slot for slot, _ in adapters],
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

    @property
    def tracker(self):
        return None if self.warmed is None else self.warmed.tracker

    @property
    def graphs(self):
        return None if self.warmed is None else self.warmed.graphs

    def warmup(self, request: shard_pb2.WarmupRequest) -> shard_pb2.WarmupResponse:
        if self._warmup_reply is not None:
            return self._warmup_reply  # pools exist already; a second Warmup changes nothing
        max_tokens = request.max_batch_tokens or self.config.max_batch_tokens
        max_requests = request.max_batch_requests or 32
        with self._on_every_rank(WarmupCommand(max_tokens, max_requests)):
            self.warm_up(max_tokens, max_requests)
        model_config = self.runner.config
        self.limits = PlanLimits(self.warmed.cache.num_device_blocks, self.warmed.cache.num_host_blocks,
                                 self.runner.block_size, model_config.vocab_size,
                                 model_config.max_position_embeddings, adapters=self.adapters)
        self._warmup_reply = warmup_reply(self.warmed)
        if self.config.warmup_report is not None:
            write_warmup_report(self.config.warmup_report, self._warmup_reply, self.warmed, self.runner,
                                max_tokens, max_requests)
        return self._warmup_reply

    def warm_up(self, max_tokens: int, max_requests: int) -> None:
        """Every rank (`warm_start.warm_up`)."""
        self.warmed = warm_up(self.runner, self.config, self.group, max_tokens, max_requests)

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
        work, feed = rank_work(request, plan.scheduled, self.requests, self._pending)
        launched = LaunchedStep(request, plan, started)
        with self._on_every_rank(StepCommand(work)):
            self._compute(launched, work, feed, tracer)
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
            finish_device_picks(launched.device, outputs, self._pending)
            if launched.forward_events is not None:
                begin, end = launched.forward_events
                end.synchronize()  # recorded after the picks: read only once completed
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
        device, and when nothing of `request` reads a host-side token that is not there yet."""
        return self.pipeline and launched.device is not None and samples_plain_greedy(request, self.requests)

    def _compute(self, launched: "LaunchedStep", work: RankWork, feed, tracer: trace.Tracer) -> None:
        """Rank 0's share of the step (`run_rank_step`, every rank's) and the sampling, into
        `launched`: outputs, times, completed transfers (at finish when pipelined), and with
        device picks `device` and the events around the compute."""
        scheduled = launched.plan.scheduled
        launched.outputs = [shard_pb2.RequestOutput(request_id=item.request_id) for item in scheduled]
        sample_rows, prompt_rows = logit_rows(scheduled, work, self.requests)
        states = [self.requests[scheduled[i].request_id] for i, _ in sample_rows]
        on_device = self.pipeline and bool(sample_rows) and not prompt_rows and all(
            plain_greedy(state.params.do_sample, state.needs_host, scheduled[i].allowed_tokens)
            for (i, _), state in zip(sample_rows, states))
        events = None
        if on_device and self.runner.device.type == "cuda":
            events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            events[0].record()
        # Under tensor parallelism the completion poll is a collective of the step on every rank.
        done = run_rank_step(self.runner, self.tracker, work, feed, wait=not on_device, poll=not self.pipeline,
                             tracer=tracer)
        launched.transfer_ns, launched.forward_ns, launched.completed = done.transfer_ns, done.forward_ns, done.completed
        if not scheduled:
            return
        sampling_start = time.perf_counter_ns()
        with tracer.start_as_current_span("sampling", attributes={"sampled": len(sample_rows)}):
            step_id = launched.request.step_id
            if on_device:
                launched.device = sample_on_device(states, done.logits, sample_rows, step_id, self._pending)
                if events is not None:
                    events[1].record()
                    launched.forward_events = events
            else:
                sample_on_host(scheduled, self.requests, done.logits, sample_rows, prompt_rows, step_id,
                               launched.outputs)
        launched.sampling_ns = time.perf_counter_ns() - sampling_start

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

    def prepare_adapter(self, adapter_id: str, source: str, slot: int) -> PreparedAdapter:
        """LoadAdapter's first half, on any thread (the gRPC one's, beside the steps): refuses
        what cannot be loaded and reads and checks the adapter (this rank's slices), changing
        nothing. AdapterRequestError saying why: slot 0, a slot in use, an empty id, an empty
        source, an adapter that cannot be served, or one too large for the memory free beside the
        steps (`lora.check_memory_for`)."""
        self._check_load(adapter_id, slot)
        if not source:
            raise AdapterRequestError(f"LoRA adapter {adapter_id!r}: no source (a directory or a hub id) given")
        try:
            adapter = read_adapter(LoraAdapterSpec(adapter_id, source), self.runner.loaded, self.config.hub)
            check_memory_for(self.runner.loaded, adapter)
        except LoraError as err:
            raise AdapterRequestError(str(err)) from None
        return PreparedAdapter(slot, source, adapter)

    def read_on_ranks(self, prepared: PreparedAdapter) -> None:
        """Under tensor parallelism, between steps (the model thread): the other ranks start
        reading their slices of `prepared` beside their steps (`ReadAdapterCommand`). Nothing
        to do for one shard."""
        if self.group is None:
            return
        adapter = prepared.adapter
        with self._on_every_rank(ReadAdapterCommand(adapter.adapter_id, prepared.source, prepared.slot,
                                                    str(adapter.directory))):
            pass

    def ranks_read(self, slot: int) -> int:
        """Between steps (the model thread): 1 once every rank read its slices for `slot`, 0
        while one still reads, -1 when one could not (its log says why). 1 for one shard."""
        if self.group is None:
            return 1
        with self._on_every_rank(AdapterReadCommand(slot)):
            return int(self.group.minimum([1.0])[0])

    def drop_ranks_read(self, slot: int) -> None:
        """Between steps (the model thread): the other ranks forget what they read for `slot`."""
        if self.group is None:
            return
        with self._on_every_rank(DropAdapterReadCommand(slot)):
            pass

    def install_prepared(self, prepared: PreparedAdapter) -> None:
        """LoadAdapter's last part, between steps (the model thread), once every rank read it
        (`read_on_ranks`, `ranks_read`): checks again that the slot is free (another load may
        have taken it since), then installs it on every rank."""
        adapter = prepared.adapter
        self._check_load(adapter.adapter_id, prepared.slot)
        with self._on_every_rank(LoadAdapterCommand(adapter.adapter_id, prepared.slot)):
            self._install(prepared.slot, adapter)

    def load_adapter(self, adapter_id: str, source: str, slot: int,
                     run_between_steps=lambda call, *args: call(*args), poll_s: float = 0.005) -> None:
        """Reads `source`'s adapter and installs it in `slot`, requests name it by `adapter_id`
        from the next step on: `prepare_adapter` on this thread; then, each through
        `run_between_steps` (the model thread's queue; by default this thread), the other
        ranks' reads beside their steps, a poll every `poll_s` until they are done, and
        `install_prepared`. A rank that cannot read it is this load's AdapterRequestError, and
        nothing changes."""
        prepared = self.prepare_adapter(adapter_id, source, slot)
        run_between_steps(self.read_on_ranks, prepared)
        while (state := run_between_steps(self.ranks_read, slot)) == 0:
            time.sleep(poll_s)
        if state < 0:
            run_between_steps(self.drop_ranks_read, slot)
            raise AdapterRequestError(f"LoRA adapter {adapter_id!r}: a tensor-parallel rank could not read its "
                                      f"share of {source} (that rank's log says why)")
        run_between_steps(self.install_prepared, prepared)

    def unload_adapter(self, slot: int) -> None:
        """Takes the adapter in `slot` out, between steps, on every rank; AdapterRequestError
        when the slot holds none. Requests that still name it are refused from then on."""
        if slot not in self.adapters:
            raise AdapterRequestError(f"LoRA adapter slot {slot} holds no adapter (loaded: {self._loaded()})")
        with self._on_every_rank(UnloadAdapterCommand(slot)):
            self.unload_rank_adapter(slot)

    def read_rank_adapter(self, adapter_id: str, source: str, slot: int, directory: str = "") -> None:
        """A rank > 0's `ReadAdapterCommand`: starts reading its slices of the adapter for `slot`
        on a thread of its own, beside the steps."""
        if self._reader is None:
            # torch on that thread runs without an intra-op pool: one started on a thread other
            # than the model's stays for good and slows every step.
            self._reader = concurrent.futures.ThreadPoolExecutor(
                1, thread_name_prefix="adapter-read", initializer=torch.set_num_threads, initargs=(1,))
        self._reads[slot] = self._reader.submit(self._read_slices, adapter_id, source, directory)

    def rank_read_state(self, slot: int) -> float:
        """A rank > 0's answer to `AdapterReadCommand`: 1 read, 0 still reading, -1 failed or
        never asked."""
        read = self._reads.get(slot)
        if read is None:
            return -1.0
        if not read.done():
            return 0.0
        if read.exception() is not None:
            log.error("LoRA adapter for slot %d: this rank could not read its share: %s", slot, read.exception())
            return -1.0
        return 1.0

    def drop_rank_read(self, slot: int) -> None:
        """A rank > 0's `DropAdapterReadCommand`."""
        self._reads.pop(slot, None)

    def load_rank_adapter(self, adapter_id: str, slot: int) -> None:
        """A rank > 0's share of a LoadAdapter (`LoadAdapterCommand`): its slices of the adapter
        rank 0 checked, as `read_rank_adapter` read them, installed."""
        read = self._reads.pop(slot, None)
        if read is None:
            raise RuntimeError(f"LoRA adapter {adapter_id!r}: this rank read nothing for slot {slot}")
        self._install(slot, read.result())

    def _read_slices(self, adapter_id: str, source: str, directory: str) -> ReadAdapter:
        """This rank's slices of an adapter: from `directory` (rank 0's) when this rank sees
        it, else from `source` (a hub id on another node)."""
        if directory and pathlib.Path(directory).is_dir():
            source = directory
        return read_adapter(LoraAdapterSpec(adapter_id, source), self.runner.loaded, self.config.hub)

    def unload_rank_adapter(self, slot: int) -> None:
        """Every rank's share of an UnloadAdapter."""
        remove_adapter(self.runner.model, slot)
        adapter_id = self.adapters.pop(slot, None)
        log.info("LoRA adapter %r unloaded from slot %d", adapter_id, slot)

    def _install(self, slot: int, adapter: ReadAdapter) -> None:
        install(self.runner.loaded, slot, adapter)
        self.adapters[slot] = adapter.adapter_id

    def _check_load(self, adapter_id: str, slot: int) -> None:
        adapters = self.adapters.copy()
        if slot == 0:
            raise AdapterRequestError(f"LoRA adapter {adapter_id!r}: slot 0 is the base model's")
        if slot in adapters:
            raise AdapterRequestError(f"LoRA adapter {adapter_id!r}: slot {slot} holds {adapters[slot]!r} already")
        if not adapter_id:
            raise AdapterRequestError(f"a LoRA adapter for slot {slot} needs an id")
        # An id may be in two slots for a while: the router replaces an adapter in place by
        # loading the new weights in a new slot and unloading the old one after the requests
        # still running with it. The router owns which id is served.

    def _loaded(self) -> str:
        loaded = sorted(self.adapters.copy().items())
        return ", ".join(f"{adapter!r} in slot {slot}" for slot, adapter in loaded) or "none"

    def close(self) -> None:
        if self._reader is not None:
            self._reader.shutdown(wait=False, cancel_futures=True)
        if self.group is not None and self.group.failure is None and self.group.rank == 0:
            with contextlib.suppress(Exception):  # a rank that is gone already needs no stop
                self.group.send(StopCommand())
        if self.tracker is not None:
            self.tracker.close()
