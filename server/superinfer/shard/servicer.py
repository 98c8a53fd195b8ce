"""The gRPC face of the shard: maps RPCs onto the executor, one at a time, and each error
kind onto one status code (bad plan → INVALID_ARGUMENT, Step before Warmup →
FAILED_PRECONDITION, anything else → INTERNAL with the message). Each RPC runs in its span,
which continues the caller's trace (`telemetry`)."""
import logging
import threading

import grpc

from ..pb import shard_pb2_grpc
from .errors import NotWarmedUpError, PlanError
from .executor import ShardExecutor
from .telemetry import ShardTraces

log = logging.getLogger(__name__)


class StepAbandoned(Exception):
    """The router cancelled a Step still waiting for the step before it."""


class ShardServicer(shard_pb2_grpc.ShardServicer):
    def __init__(self, executor: ShardExecutor, traces: ShardTraces | None = None):
        self.executor = executor
        self.traces = traces or ShardTraces()
        # The model, the cache and the request table have one owner; gRPC worker threads
        # take turns on it.
        self._lock = threading.Lock()
        # With one step in flight the router sends step N+1 before N's reply; gRPC may hand
        # them to two threads in either order, so a Step naming a `previous_step_id` waits
        # until that step has run (whatever its outcome). Reset starts the count again.
        self._ran = threading.Condition(self._lock)
        self._last_step_id = 0

    def _run(self, name: str, call, context: grpc.ServicerContext, exclusive: bool = True, after_step: int = 0,
             step_id: int | None = None):
        with self.traces.rpc(name, context):
            try:
                if not exclusive:
                    return call()
                with self._ran:
                    while after_step and self._last_step_id != after_step:
                        if not context.is_active():  # the router gave up on it (a failure, a recovery)
                            raise StepAbandoned(f"step {step_id} abandoned while waiting for step {after_step}")
                        self._ran.wait(timeout=0.05)
                    try:
                        return call()
                    finally:
                        if step_id is not None:
                            self._last_step_id = step_id
                            self._ran.notify_all()
            except StepAbandoned as err:
                log.info("%s: %s", name, err)
                context.abort(grpc.StatusCode.CANCELLED, str(err))
            except PlanError as err:
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
        return self._run("Info", self.executor.info, context, exclusive=False)

    def Health(self, request, context):
        return self._run("Health", self.executor.health, context, exclusive=self.executor.world_size > 1)

    def Warmup(self, request, context):
        return self._run("Warmup", lambda: self.executor.warmup(request), context)

    def Step(self, request, context):
        return self._run("Step", lambda: self.executor.step(request, self.traces.tracer), context,
                         after_step=request.previous_step_id, step_id=request.step_id)

    def Reset(self, request, context):
        def reset():
            self._last_step_id = 0  # the router's next scheduler counts steps from 1 again
            return self.executor.reset()
        return self._run("Reset", reset, context)
