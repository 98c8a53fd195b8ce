"""Runs the shard's gRPC server on a unix socket until a shutdown event is set.

The caller owns the event (the CLI sets it from SIGTERM/SIGINT; tests set it directly), so
shutdown needs no polling: the serving thread blocks on the event."""
import logging
import os
import pathlib
import threading
from concurrent import futures

import grpc

from ..pb import shard_pb2_grpc
from .executor import ShardExecutor
from .servicer import ShardServicer
from .telemetry import ShardTraces

log = logging.getLogger(__name__)

_MAX_MESSAGE_BYTES = 256 * 1024 * 1024  # Info carries the whole tokenizer.json


class ShardServer:
    """`traces`: where the RPCs' spans go (None: traces are off); the server closes it on stop."""

    def __init__(self, executor: ShardExecutor, uds_path: pathlib.Path, traces: ShardTraces | None = None,
                 model_thread=None):
        self.executor = executor
        self.uds_path = uds_path
        self.traces = traces or ShardTraces()
        options = [
            ("grpc.max_send_message_length", _MAX_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES),
        ]
        # Few threads: model work is serialised by the servicer; extra threads only let
        # Health and Info answer while a Step runs.
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), options=options)
        self.servicer = ShardServicer(executor, self.traces, model_thread)
        shard_pb2_grpc.add_ShardServicer_to_server(self.servicer, self._server)
        if uds_path.exists():
            os.unlink(uds_path)  # a stale socket from a killed run would block the bind
        uds_path.parent.mkdir(parents=True, exist_ok=True)
        self._server.add_insecure_port(f"unix://{uds_path}")

    def start(self) -> None:
        self._server.start()
        log.info("shard serving on unix://%s", self.uds_path)

    def stop(self, grace_s: float = 5.0) -> None:
        self._server.stop(grace_s).wait()
        self.executor.close()
        self.traces.close()
        if self.uds_path.exists():
            os.unlink(self.uds_path)
        log.info("shard stopped")

    def serve_until(self, shutdown: threading.Event, grace_s: float = 5.0) -> None:
        self.start()
        try:
            shutdown.wait()
        finally:
            self.stop(grace_s)
