"""The launcher's supervision of a real server: when the shard dies, requests fail with an
error (never hang), and the launcher says which child died and exits non-zero."""
import os
import signal
import subprocess
from pathlib import Path

import requests

from conftest import SERVER_ARGS, SUPERINFER, Server, _wait_healthy, free_port


def children(pid: int) -> list[int]:
    pids = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        pids += [int(child) for child in (task / "children").read_text().split()]
    return pids


def command_line(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")


def test_a_dead_shard_stops_the_launcher_with_an_error(tmp_path):
    port = free_port()
    log_path = tmp_path / "server.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [str(SUPERINFER), "launch", "--port", str(port), "--hostname", "127.0.0.1", *SERVER_ARGS],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
    server = Server(f"http://127.0.0.1:{port}", process, log_path)
    try:
        _wait_healthy(server)
        shard = next(pid for pid in children(process.pid) if " serve " in command_line(pid))
        body = {"inputs": "Count from 1 to 500: 1, 2,", "parameters": {"max_new_tokens": 400}}
        with requests.post(f"{server.url}/generate_stream", json=body, stream=True, timeout=120) as response:
            lines = response.iter_lines()
            next(line for line in lines if line.startswith(b"data:"))
            os.kill(shard, signal.SIGKILL)
            rest = b"\n".join(lines)  # must end, with an error event, not hang
        assert b"error" in rest
        assert process.wait(timeout=120) == 1
        assert "shard was killed by SIGKILL" in server.log_tail()
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
