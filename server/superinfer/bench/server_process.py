"""A server started for a comparison: `superinfer launch` as a subprocess on a free loopback
port, ready once `/health` answers 200, terminated (then killed) when the context closes."""
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class LaunchOptions:
    """The limits every policy gets, so that only the scheduler differs."""

    device_kv_blocks: int | None = None
    host_kv_blocks: int | None = None
    model: str | None = None
    extra_args: tuple[str, ...] = field(default_factory=tuple)
    startup_timeout_s: float = 600.0
    log_dir: Path = Path(".")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def launch_command(policy: str, port: int, options: LaunchOptions) -> list[str]:
    # Loopback only: a bench server is never reachable from elsewhere.
    command = [sys.executable, "-m", "superinfer.cli", "launch", "--port", str(port), "--hostname", "127.0.0.1",
               "--scheduler", policy]
    if options.device_kv_blocks is not None:
        command += ["--device-kv-blocks", str(options.device_kv_blocks)]
    if options.host_kv_blocks is not None:
        command += ["--host-kv-blocks", str(options.host_kv_blocks)]
    if options.model is not None:
        command += ["--model", options.model]
    return command + list(options.extra_args)


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


class LaunchedServer:
    """Context manager; `url` is valid inside it."""

    def __init__(self, policy: str, options: LaunchOptions):
        self.policy = policy
        self.options = options
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None
        self.log_path = options.log_dir / f"server-{policy}.log"
        # What the shard measured at warm-up (the simulator's `measured:` profile).
        self.warmup_report = options.log_dir / f"warmup-{policy}.json"

    def __enter__(self) -> "LaunchedServer":
        self.options.log_dir.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("wb")
        # Own process group: terminating it reaches the shards the launcher started too.
        self.process = subprocess.Popen(
            [*launch_command(self.policy, self.port, self.options), "--warmup-report", str(self.warmup_report)],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + self.options.startup_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self._stop()
                raise RuntimeError(f"superinfer launch --scheduler {self.policy} exited with {self.process.returncode}; see {self.log_path}")
            if _healthy(self.url):
                return self
            time.sleep(0.5)
        self._stop()
        raise TimeoutError(f"server for {self.policy} not healthy after {self.options.startup_timeout_s:.0f} s; see {self.log_path}")

    def __exit__(self, *_exc) -> None:
        self._stop()

    def _stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        group = os.getpgid(self.process.pid)
        os.killpg(group, signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(group, signal.SIGKILL)
            self.process.wait(timeout=10)
