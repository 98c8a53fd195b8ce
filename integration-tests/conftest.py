"""Launches the real server (`superinfer launch` on the embedded model) once per test session
and hands the tests its URL. Everything goes through the public HTTP API."""
import contextlib
import os
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# The server runs from the project's environment; the tests from the clients' environment.
SUPERINFER = Path(os.environ.get("SUPERINFER_BIN", REPO / ".venv" / "bin" / "superinfer"))
STARTUP_TIMEOUT_S = 600
# Small pools keep the KV memory small; 32 concurrent short requests fit comfortably.
SERVER_ARGS = ["--device-kv-blocks", "256", "--host-kv-blocks", "256", "--max-batch-tokens", "1024"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Server:
    url: str
    process: subprocess.Popen
    log_path: Path

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=30) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode()

    def metric(self, name: str) -> float:
        """The value of an unlabelled series on /metrics (0 when not exported yet)."""
        status, text = self.get("/metrics")
        if status != 200:
            raise RuntimeError(f"/metrics answered {status}: {text[:200]}")
        match = re.search(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.MULTILINE)
        return float(match.group(1)) if match else 0.0

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


def _wait_healthy(server: Server) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"the server exited with {server.process.returncode}:\n{server.log_tail()}")
        try:
            if server.get("/health")[0] == 200:
                return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.5)
    raise RuntimeError(f"the server was not healthy after {STARTUP_TIMEOUT_S} s:\n{server.log_tail()}")


@contextlib.contextmanager
def launch(log_dir: Path, args: list[str], env: dict[str, str] | None = None):
    """Runs `superinfer launch` with `args` (on a free port) and `env` added to this process's
    environment until the block exits; yields the healthy server. Tests that need their own
    server configuration use this directly."""
    port = free_port()
    log_path = log_dir / "server.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [str(SUPERINFER), "launch", "--port", str(port), "--hostname", "127.0.0.1", *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, **(env or {})},
        )
    instance = Server(f"http://127.0.0.1:{port}", process, log_path)
    try:
        _wait_healthy(instance)
        yield instance
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    with launch(tmp_path_factory.mktemp("server"), SERVER_ARGS) as instance:
        yield instance


@pytest.fixture(scope="session")
def url(server) -> str:
    return server.url
