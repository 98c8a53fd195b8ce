"""The gRPC face of the shard: maps RPCs onto the executor, one at a time, and each error
kind onto one status code (bad plan or a LoadAdapter / UnloadAdapter refused →
INVALID_ARGUMENT, Step before Warmup → FAILED_PRECONDITION, anything else → INTERNAL with the
message). Each RPC runs in its span, which continues the caller's trace (`telemetry`)."""
import contextlib
import contextvars
import logging
import threading

import grpc
import torch

from ..pb import shard_pb2, shard_pb2_grpc
from .errors import AdapterRequestError, NotWarmedUpError, PlanError
from .executor import ShardExecutor
from .model_thread import ModelThread
from .telemetry import ShardTraces

log = logging.getLogger(__name__)


class StepAbandoned(Exception):
    """The router cancelled a Step still waiting for the step before it."""


class ShardServicer(shard_pb2_grpc.ShardServicer):
    def __init__(self, executor: ShardExecutor, traces: ShardTraces | None = None, model_thread=None):
        self.executor = executor
        self.traces = traces or ShardTraces()
        # The model, the cache and the request table have one owner; gRPC worker threads
        # take turns on it.
        self._lock = threading.Lock()
        # With one step in flight the router sends step N+1 before N's reply; gRPC may hand
        # them to two threads in either order, so a Step naming a `previous_step_id` waits
        # until that step has run (with `pipeline`) or has been queued on the model thread
        # (without), whatever its outcome. Reset starts the counts again.
        self._ran = threading.Condition(self._lock)
        self._last_step_id = 0
        # Without `pipeline`: the last step whose launch is queued on the model thread.
        self._queued_step_id = 0
        # Steps waiting for the one they name (by that one's id), and steps launched ahead
        # by the thread of the step before them (by their own id; a failure to launch kept
        # as the exception, raised on their own thread).
        self._waiting: dict[int, object] = {}
        self._launched_ahead: dict[int, object] = {}
        # Whether the router sends steps ahead (a Step has named a previous one): only then is
        # a successor worth waiting for while a step computes.
        self._steps_ahead = False
        # Every call into the model runs on the model thread (the one that loaded it, when
        # given), whichever gRPC thread took the RPC: see model_thread.py.
        self._model = model_thread or ModelThread()

    def _submit(self, call, *args):
        """Queues `call(*args)` on the model thread, in the caller's context (its current span);
        a Future of its result (or error)."""
        return self._model.submit(contextvars.copy_context().run, call, *args)

    def _on_model(self, call, *args):
        """Runs `call(*args)` on the model thread (`_submit`) and returns its result (or raises
        its error)."""
        return self._submit(call, *args).result()

    def _run(self, name: str, call, context: grpc.ServicerContext, exclusive: bool = True):
        with self.traces.rpc(name, context):
            try:
                if not exclusive:
                    return call()
                with self._lock:
                    return call()
            except StepAbandoned as err:
                log.info("%s: %s", name, err)
                context.abort(grpc.StatusCode.CANCELLED, str(err))
            except (PlanError, AdapterRequestError) as err:
                log.warning("%s rejected: %s", name, err)
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
            except NotWarmedUpError as err:
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(err))
            except Exception as err:  # the shard keeps serving; the router decides what to do
                log.exception("%s failed", name)
                context.abort(grpc.StatusCode.INTERNAL, f"{type(err).__name__}: {err}")

    # Info reads immutable facts and Health a scratch tensor: neither waits behind a Step —
    # except that under tensor parallelism Health is a command to every rank and an
    # all-reduce, which must not interleave with a Step's.
    def Info(self, request, context):
        return self._run("Info", self.executor.info, context, exclusive=False)  # no model work

    def Health(self, request, context):
        if self.executor.world_size == 1:
            # Answered at once, even while a Step or Warmup holds the model thread: a one-element
            # probe starts no parallel region, so it adds no thread pool (model_thread.py).
            return self._run("Health", self.executor.health, context, exclusive=False)
        return self._run("Health", lambda: self._on_model(self.executor.health), context)

    def Warmup(self, request, context):
        return self._run("Warmup", lambda: self._on_model(self.executor.warmup, request), context)

    def Step(self, request, context):
        return self._run("Step", lambda: self._step(request, context), context, exclusive=False)

    def _step(self, request, context):
        if self.executor.pipeline:
            return self._step_pipelined(request, context)
        return self._step_queued(request, context)

    def _step_queued(self, request, context):
        """Where a step's compute is done when its launch returns (the CPU, tensor
        parallelism): the launch is queued on the model thread as soon as the step it names
        has been queued there (the thread runs its calls in order, so that one runs first),
        and the reply is built on this thread. With one step in flight the model thread then
        goes from one step's sampling straight to the next step's plan, with no wake-up or
        reply in between; the previous step's reply is built and sent while this one computes.
        A step whose predecessor failed still runs after it, as the router's recovery
        expects."""
        after, step_id = request.previous_step_id, request.step_id
        with self._ran:
            while after and self._queued_step_id != after:
                if not context.is_active():  # the router gave up on it (a failure, a recovery)
                    raise StepAbandoned(f"step {step_id} abandoned while waiting for step {after}")
                self._ran.wait(timeout=0.05)
            launched = self._submit(self.executor.launch, request, self.traces.tracer)
            self._queued_step_id = step_id
            self._ran.notify_all()
        # The launch's error, if any, is this step's (mapped to its status by `_run`).
        return self.executor.finish(launched.result())

    def _step_pipelined(self, request, context):
        """Runs a Step after the one it names (a GPU with one rank). While a step's compute
        runs on the device, the step planned after it (one step in flight) is launched on this
        thread as soon as it arrives, if the executor allows (`ShardExecutor.can_run_ahead`),
        so the device goes from one step to the next without waiting for the host; then this
        step is finished and answered."""
        after, step_id = request.previous_step_id, request.step_id
        with self._ran:
            if after:
                self._steps_ahead = True
                self._waiting[after] = request
                self._ran.notify_all()
            try:
                while after and self._last_step_id != after:
                    if not context.is_active():  # the router gave up on it (a failure, a recovery)
                        raise StepAbandoned(f"step {step_id} abandoned while waiting for step {after}")
                    self._ran.wait(timeout=0.05)
            finally:
                if self._waiting.get(after) is request:
                    del self._waiting[after]
            try:
                launched = self._launched_ahead.pop(step_id, None)
                if isinstance(launched, Exception):
                    raise launched
                if launched is None:
                    launched = self._on_model(self.executor.launch, request, self.traces.tracer)
                while self._steps_ahead and not launched.ready():
                    successor = self._waiting.get(step_id)
                    if successor is not None:
                        del self._waiting[step_id]
                        if self.executor.can_run_ahead(launched, successor):
                            try:
                                self._launched_ahead[successor.step_id] = self._on_model(
                                    self.executor.launch, successor, self.traces.tracer)
                            except Exception as err:  # the successor's own failure, reported on its RPC
                                self._launched_ahead[successor.step_id] = err
                        else:
                            self._waiting[step_id] = successor
                        break
                    self._ran.wait(timeout=0.0002)
                return self._on_model(self.executor.finish, launched)
            finally:
                self._last_step_id = step_id
                self._ran.notify_all()

    def Reset(self, request, context):
        def reset():
            self._last_step_id = 0  # the router's next scheduler counts steps from 1 again
            self._queued_step_id = 0
            self._launched_ahead.clear()
            self._steps_ahead = False
            return self._on_model(self.executor.reset)
        return self._run("Reset", reset, context)

    # An adapter is read and checked on the RPC's own thread, beside the steps; only its
    # install (or removal) waits for the model thread, between two steps.
    def LoadAdapter(self, request, context):
        def load():
            # Read and checked on this thread, beside the steps; under tensor parallelism the
            # other ranks read theirs beside their steps too; installed between two steps.
            with _serial_torch():
                self.executor.load_adapter(request.adapter_id, request.source, request.slot, self._on_model)
            return shard_pb2.LoadAdapterResponse()
        return self._run("LoadAdapter", load, context, exclusive=False)

    def UnloadAdapter(self, request, context):
        def unload():
            self._on_model(self.executor.unload_adapter, request.slot)
            return shard_pb2.UnloadAdapterResponse()
        return self._run("UnloadAdapter", unload, context, exclusive=False)


@contextlib.contextmanager
def _serial_torch():
    """torch's operations on this thread run without its intra-op thread pool: a pool started
    on a thread other than the model's stays for good and slows every step (model_thread.py).
    Each thread has its own setting; this one's is restored after."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
