"""The launcher with a real server: when the shard dies, requests fail with an error (never
hang), and the launcher says which child died and exits non-zero; TGI's configuration (model,
flags and variables) is honoured."""
import json
import os
import signal
import subprocess
from pathlib import Path

import requests

from conftest import SERVER_ARGS, SUPERINFER, Server, _wait_healthy, free_port, launch


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


def _embedded_model_dir() -> Path:
    """The embedded model as a plain Hugging Face directory (converted once, in the server's
    environment, into the cache the shard uses)."""
    code = ("import os, pathlib; from superinfer.shard.model_source import resolve_model; "
            "cache = os.environ.get('SUPERINFER_CACHE') or pathlib.Path.home() / '.cache' / 'superinfer'; "
            "print(resolve_model(None, pathlib.Path(cache)).directory)")
    python = SUPERINFER.parent / "python"
    done = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True, timeout=600)
    return Path(done.stdout.strip())


def test_tgi_configuration_is_honoured(tmp_path):
    """A TGI-style start: MODEL_ID names a local directory, MAX_BATCH_TOTAL_TOKENS sizes the
    device pool, TGI's router flag names work, and TGI flags that do not apply are accepted
    with a warning naming them."""
    model_dir = _embedded_model_dir()
    env = {"MODEL_ID": str(model_dir), "MAX_BATCH_TOTAL_TOKENS": "1000", "MAX_WAITING_TOKENS": "20"}
    args = ["--max-batch-prefill-tokens", "512", "--max-batch-size", "8", "--host-kv-blocks", "32",
            "--quantize", "awq", "--trust-remote-code"]
    with launch(tmp_path, args, env=env) as server:
        status, body = server.get("/info")
        assert status == 200
        info = json.loads(body)
        assert info["model_id"] == str(model_dir)  # not the embedded default
        assert info["max_total_tokens"] == 63 * 16  # ceil(1000 / 16) device blocks
        answer = requests.post(f"{server.url}/generate", json={"inputs": "Hello", "parameters": {"max_new_tokens": 3}},
                               timeout=120)
        assert answer.status_code == 200 and answer.json()["generated_text"]
        log = server.log_path.read_text()
    assert "warning: TGI's --quantize awq is ignored: quantizing at load is not supported" in log
    assert "warning: TGI's --trust-remote-code is ignored" in log
    assert "warning: TGI's MAX_WAITING_TOKENS (in the environment) is ignored" in log
