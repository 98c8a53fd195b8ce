"""Child processes of the launcher and the wait for the first of them to exit.

Each child runs in its own session, so a Ctrl-C in the terminal reaches only the launcher,
which decides the shutdown order. A watcher thread per child blocks in `wait()` and sets one
event, so the launcher sleeps until a child exits or a signal arrives — it never polls."""
import signal
import subprocess
import threading
from dataclasses import dataclass, field


@dataclass
class Child:
    name: str
    process: subprocess.Popen

    @property
    def exited(self) -> bool:
        return self.process.poll() is not None

    def describe_exit(self) -> str:
        code = self.process.returncode
        if code is None:
            return f"{self.name} is running"
        if code < 0:
            return f"{self.name} was killed by {signal.Signals(-code).name}"
        return f"{self.name} exited with status {code}"

    def terminate(self, timeout_s: float) -> None:
        """SIGTERM, then SIGKILL if it has not exited within `timeout_s`. SIGCONT follows the
        SIGTERM so that a stopped (hung) child handles it instead of keeping it pending."""
        if self.exited:
            return
        self.process.send_signal(signal.SIGTERM)
        self.process.send_signal(signal.SIGCONT)
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@dataclass
class Supervisor:
    """Owns the children; `event` is set when any child exits or `stop()` is called."""

    event: threading.Event = field(default_factory=threading.Event)
    children: list[Child] = field(default_factory=list)
    stop_reason: str | None = None

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Child:
        """Starts a child; `env` replaces the inherited environment (secrets go there, not in
        `argv`, which every local user can read)."""
        process = subprocess.Popen(argv, start_new_session=True, env=env)
        child = Child(name, process)
        self.children.append(child)
        threading.Thread(target=self._watch, args=(child,), name=f"watch-{name}", daemon=True).start()
        return child

    def _watch(self, child: Child) -> None:
        child.process.wait()
        self.event.set()

    def stop(self, reason: str) -> None:
        """Asks the launcher's wait to end (called from signal handlers)."""
        self.stop_reason = reason
        self.event.set()

    def first_exited(self) -> Child | None:
        return next((child for child in self.children if child.exited), None)

    def wait(self, timeout_s: float | None = None) -> bool:
        """Sleeps until a child exits or `stop()`; False on timeout."""
        return self.event.wait(timeout_s)

    def shutdown(self, timeout_s: float) -> None:
        """Stops the children in reverse start order (the router before the shard it uses)."""
        for child in reversed(self.children):
            child.terminate(timeout_s)


def install_signal_handlers(supervisor: Supervisor) -> dict:
    """Routes SIGINT/SIGTERM to `supervisor.stop`; returns the previous handlers."""

    def handler(signum: int, _frame) -> None:
        supervisor.stop(signal.Signals(signum).name)

    return {signum: signal.signal(signum, handler) for signum in (signal.SIGINT, signal.SIGTERM)}


def restore_signal_handlers(previous: dict) -> None:
    for signum, handler in previous.items():
        signal.signal(signum, handler)

