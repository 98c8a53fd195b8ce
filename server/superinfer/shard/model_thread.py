"""The one thread every torch operation of a shard runs on: loading, warm-up and every step.

torch's intra-op thread pool (OpenMP) belongs to the thread that calls into it. Model work
spread over several threads (the loader on the main thread, Steps on gRPC's worker threads)
starts one pool per thread; with more pool threads than cores their workers stop spinning
between parallel regions, and each of a step's ~1,200 regions then waits for a worker to wake.
Measured on 2 cores with the embedded model: a batch-1 decode step took 31 ms from one
thread and 48 ms once a second thread had run model work — in that process, for good.

A daemon thread, unlike `ThreadPoolExecutor`'s: a call stuck in the device or in a collective
must not keep the process from exiting when the shard stops."""
import queue
import threading
from concurrent.futures import Future


class ModelThread:
    def __init__(self, name: str = "shard-model"):
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def submit(self, call, *args) -> Future:
        future: Future = Future()
        self._calls.put((future, call, args))
        return future

    def run(self, call, *args):
        """`call(*args)` on the model thread; its result, or its exception raised here."""
        return self.submit(call, *args).result()

    def _serve(self) -> None:
        while True:
            future, call, args = self._calls.get()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(call(*args))
            except BaseException as err:  # the caller's to handle
                future.set_exception(err)
