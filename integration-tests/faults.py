"""Helpers of the fault-injection tests: the launcher's child processes, their memory, signals,
and server-sent-event streams read on threads with their timings."""
import json
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import requests

# Soak variants (`make soak`) scale the fast ones up; see each test.
SOAK = os.environ.get("SUPERINFER_SOAK", "") not in ("", "0")


def children(pid: int) -> dict[str, int]:
    """The launcher's children by role ("shard", "router"), from /proc."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        # The command name may hold spaces; the parent pid follows the closing parenthesis.
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        if parent != pid:
            continue
        if "superinfer.cli serve" in cmdline:
            found["shard"] = int(entry.name)
        elif "superinfer.router_main" in cmdline:
            found["router"] = int(entry.name)
    return found


def rss_bytes(pid: int) -> int:
    """Resident memory of a process (0 once it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def send(pid: int, signum: signal.Signals) -> None:
    os.kill(pid, signum)


def wait_for(condition, timeout_s: float = 30.0, interval_s: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval_s)
    return False


def health(url: str, timeout_s: float = 15.0) -> int:
    try:
        return requests.get(f"{url}/health", timeout=timeout_s).status_code
    except requests.RequestException:
        return 0


@dataclass
class Stream:
    """One `/generate_stream` read on its own thread: its tokens, how it ended and when."""

    url: str
    body: dict
    timeout_s: float = 300.0
    tokens: int = 0
    first_token: threading.Event = field(default_factory=threading.Event)
    final: dict | None = None
    error: dict | None = None
    ended_at: float | None = None
    failure: str | None = None
    thread: threading.Thread | None = None

    def start(self) -> "Stream":
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()
        return self

    def _read(self) -> None:
        try:
            with requests.post(f"{self.url}/generate_stream", json=self.body, stream=True,
                               timeout=self.timeout_s) as response:
                for line in response.iter_lines():
                    if not line.startswith(b"data:"):
                        continue
                    event = json.loads(line[5:])
                    if "error" in event:
                        self.error = event
                        break
                    self.tokens += 1
                    self.first_token.set()
                    if event.get("generated_text") is not None:
                        self.final = event
                        break
        except requests.RequestException as error:
            self.failure = f"{type(error).__name__}: {error}"
        finally:
            self.ended_at = time.monotonic()
            self.first_token.set()

    def join(self, timeout_s: float) -> bool:
        self.thread.join(timeout_s)
        return not self.thread.is_alive()
