"""Model ids through the Hugging Face Hub: the local hub cache (laid out as huggingface_hub lays
it out, and read back by its own scanner), offline errors, an unreachable Hub, and a download
from a local stand-in for the Hub's HTTP API (this machine has no network)."""
import hashlib
import json
import logging
import pathlib
import shutil
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlparse

import pytest

from superinfer.shard.errors import LoaderError
from superinfer.shard.hub import HubOptions, cached_revisions, options_from_environment
from superinfer.shard.progress import ProgressLog
from superinfer.shard.model_source import resolve_model

COMMIT = "0123456789abcdef0123456789abcdef01234567"
OLD_COMMIT = "89abcdef0123456789abcdef0123456789abcdef"


def fill_cache(hub: pathlib.Path, model_id: str, files: pathlib.Path, commit: str = COMMIT,
               refs: tuple[str, ...] = ("main",)) -> pathlib.Path:
    """Lays `files` out as huggingface_hub caches a snapshot: blobs named by hash, the
    snapshot's files linking to them, and refs naming the commit."""
    repo = hub / f"models--{model_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir(exist_ok=True)
    for path in files.iterdir():
        blob = repo / "blobs" / hashlib.sha256(path.read_bytes()).hexdigest()
        shutil.copyfile(path, blob)
        (snapshot / path.name).symlink_to(pathlib.Path("../..") / "blobs" / blob.name)
    for ref in refs:
        (repo / "refs" / ref).parent.mkdir(parents=True, exist_ok=True)
        (repo / "refs" / ref).write_text(commit)
    return snapshot


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


OFFLINE = dict(offline=True)


def test_a_cached_model_id_is_found_offline(tiny_llama_dir, tmp_path):
    snapshot = fill_cache(tmp_path / "hub", "acme/tiny-llama", tiny_llama_dir)
    assert cached_revisions("acme/tiny-llama", tmp_path / "hub") == ["main (0123456789ab)"]
    source = resolve_model("acme/tiny-llama", tmp_path / "cache", HubOptions(cache=tmp_path / "hub", **OFFLINE))
    assert source.directory == snapshot and source.model_id == "acme/tiny-llama"
    assert (source.directory / "config.json").is_file()


def test_a_cached_tag_or_commit_is_found_offline(tiny_llama_dir, tmp_path):
    fill_cache(tmp_path / "hub", "acme/tiny-llama", tiny_llama_dir)
    old = fill_cache(tmp_path / "hub", "acme/tiny-llama", tiny_llama_dir, OLD_COMMIT, refs=("v1",))
    hub = tmp_path / "hub"
    assert resolve_model("acme/tiny-llama", tmp_path, HubOptions("v1", hub, **OFFLINE)).directory == old
    assert resolve_model("acme/tiny-llama", tmp_path, HubOptions(OLD_COMMIT, hub, **OFFLINE)).directory == old


def test_a_model_id_not_cached_offline_names_the_id_and_hf_hub_offline(tmp_path):
    with pytest.raises(LoaderError) as error:
        resolve_model("acme/absent-model", tmp_path / "cache", HubOptions(cache=tmp_path / "hub", **OFFLINE))
    message = str(error.value)
    assert "'acme/absent-model' is not a local directory and is not in the Hugging Face cache" in message
    assert str(tmp_path / "hub") in message and "HF_HUB_OFFLINE=1 forbids downloading it" in message


def test_a_revision_not_cached_is_reported_with_those_that_are(tiny_llama_dir, tmp_path):
    fill_cache(tmp_path / "hub", "acme/tiny-llama", tiny_llama_dir)
    with pytest.raises(LoaderError) as error:
        resolve_model("acme/tiny-llama", tmp_path, HubOptions("v2", tmp_path / "hub", **OFFLINE))
    assert "revision 'v2' of model 'acme/tiny-llama' is not in the Hugging Face cache" in str(error.value)
    assert "which has main (0123456789ab)" in str(error.value)


def test_an_unreachable_hub_falls_back_to_the_cache(tiny_llama_dir, tmp_path, online):
    snapshot = fill_cache(tmp_path / "hub", "acme/tiny-llama", tiny_llama_dir)
    nowhere = f"http://127.0.0.1:{closed_port()}"
    online = HubOptions(cache=tmp_path / "hub", endpoint=nowhere)
    assert resolve_model("acme/tiny-llama", tmp_path, online).directory == snapshot
    with pytest.raises(LoaderError) as error:
        resolve_model("acme/absent-model", tmp_path, online)
    message = str(error.value)
    assert "'acme/absent-model' is not a local directory and is not in the Hugging Face cache" in message
    assert "could not be reached" in message and "check the network" in message


def test_a_malformed_id_is_not_looked_up(tmp_path):
    with pytest.raises(LoaderError, match="not a local directory, a .gguf file or a Hugging Face model id"):
        resolve_model("acme/bad id!", tmp_path, HubOptions(cache=tmp_path / "hub", **OFFLINE))


def test_options_read_huggingface_hubs_variables(tmp_path):
    assert options_from_environment({}) == HubOptions()
    home = {"HF_HOME": str(tmp_path / "home")}
    assert options_from_environment(home).cache == tmp_path / "home" / "hub"
    tgi = {**home, "HUGGINGFACE_HUB_CACHE": str(tmp_path / "tgi")}
    assert options_from_environment(tgi).cache == tmp_path / "tgi"
    assert options_from_environment({**tgi, "HF_HUB_CACHE": str(tmp_path / "hf")}).cache == tmp_path / "hf"
    assert options_from_environment(tgi, cache=tmp_path / "flag").cache == tmp_path / "flag"
    for value, offline in (("1", True), ("true", True), ("ON", True), ("0", False), ("", False)):
        assert options_from_environment({"HF_HUB_OFFLINE": value}).offline is offline
    assert options_from_environment({"TRANSFORMERS_OFFLINE": "1"}).offline
    secret = options_from_environment({"HF_TOKEN": "hf_s3cret", "HUGGING_FACE_HUB_TOKEN": "old"}, revision="v1")
    assert secret.token == "hf_s3cret" and secret.revision == "v1"
    assert "s3cret" not in repr(secret)  # the config is logged
    assert options_from_environment({"HUGGING_FACE_HUB_TOKEN": "old"}).token == "old"


def test_progress_is_logged_as_lines(caplog):
    with caplog.at_level(logging.INFO, logger="superinfer.shard.progress"):
        with ProgressLog(total=2048, desc="Downloading bytes", unit="B", name="a group") as bar:
            bar.update(1024)
            bar.update(1024)
    lines = [record.getMessage() for record in caplog.records]
    assert lines and all("\r" not in line for line in lines)
    assert len(lines) <= 3, "a line every few seconds, not one per update"
    assert "Downloading bytes" in lines[-1] and "100%" in lines[-1]


class FakeHub(BaseHTTPRequestHandler):
    """The Hub's HTTP API as huggingface_hub uses it for a snapshot: the revision's commit, the
    file tree at that commit, and each file's metadata (HEAD) and bytes (GET), by commit or by
    branch (one file alone: config.json, fetched first)."""

    repos: dict[str, dict[str, bytes]] = {}
    authorizations: list[str] = []
    served: list[str] = []

    def log_message(self, *args):
        pass

    def _send(self, status: int, body: bytes = b"", headers: dict | None = None, content_type="application/json"):
        self.send_response(status)
        for name, value in {"Content-Type": content_type, "Content-Length": str(len(body)), **(headers or {})}.items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _route(self):
        self.authorizations.append(self.headers.get("Authorization", ""))
        path = unquote(urlparse(self.path).path)
        if path.startswith("/api/models/"):
            repo_id, _, rest = path.removeprefix("/api/models/").partition("/revision/")
            if not rest:
                repo_id, _, rest = path.removeprefix("/api/models/").partition("/tree/")
            files = self.repos.get(repo_id)
            if files is None:
                return self._send(404, b'{"error": "Repository not found"}', {"X-Error-Code": "RepoNotFound"})
            if rest.split("/")[0] not in ("main", COMMIT):
                return self._send(404, b'{"error": "Invalid rev id"}', {"X-Error-Code": "RevisionNotFound"})
            if "/revision/" in path:
                return self._send(200, json.dumps({"id": repo_id, "sha": COMMIT}).encode())
            tree = [{"type": "file", "path": name, "size": len(data), "oid": hashlib.sha1(data).hexdigest()}
                    for name, data in files.items()]
            return self._send(200, json.dumps(tree).encode())
        repo_id, _, rest = path.lstrip("/").partition("/resolve/")
        if repo_id not in self.repos:
            return self._send(404, b'{"error": "Repository not found"}', {"X-Error-Code": "RepoNotFound"})
        revision, _, name = rest.partition("/")
        if revision not in ("main", COMMIT):
            return self._send(404, b'{"error": "Invalid rev id"}', {"X-Error-Code": "RevisionNotFound"})
        data = self.repos[repo_id].get(name)
        if data is None:
            return self._send(404, b"{}", {"X-Error-Code": "EntryNotFound"})
        self.served.append(name)
        headers = {"X-Repo-Commit": COMMIT, "ETag": f'"{hashlib.sha256(data).hexdigest()}"'}
        return self._send(200, data, headers, "application/octet-stream")

    do_GET = do_HEAD = _route


@pytest.fixture
def online(monkeypatch):
    """huggingface_hub online whatever this process's HF_HUB_OFFLINE says (it reads the variable
    once, at import): these tests choose offline or not through HubOptions."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)


@pytest.fixture
def fake_hub(tiny_llama_dir, online):
    files = {path.name: path.read_bytes() for path in tiny_llama_dir.iterdir()}
    FakeHub.repos = {"acme/tiny-llama": {**files, "pytorch_model.bin": b"not wanted"}}
    FakeHub.authorizations, FakeHub.served = [], []
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeHub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    thread.join()


def test_a_model_id_is_downloaded_into_the_hub_cache(fake_hub, tiny_llama_dir, tmp_path, caplog):
    options = HubOptions(cache=tmp_path / "hub", token="hf_t0ken", endpoint=fake_hub)
    with caplog.at_level(logging.INFO, logger="superinfer.shard"):  # hub and progress
        source = resolve_model("acme/tiny-llama", tmp_path, options)
    assert source.directory == tmp_path / "hub" / "models--acme--tiny-llama" / "snapshots" / COMMIT
    for path in tiny_llama_dir.iterdir():
        assert (source.directory / path.name).read_bytes() == path.read_bytes()
    assert not (source.directory / "pytorch_model.bin").exists()  # only what the loader reads
    assert "pytorch_model.bin" not in FakeHub.served
    assert set(FakeHub.authorizations) == {"Bearer hf_t0ken"}  # HF_TOKEN reaches the Hub
    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert "fetching model 'acme/tiny-llama' from the Hugging Face Hub" in logged
    assert "Downloading bytes" in logged and "ready in" in logged
    # Now cached: offline finds it, and so does huggingface_hub's own scanner.
    assert resolve_model("acme/tiny-llama", tmp_path, HubOptions(cache=tmp_path / "hub", **OFFLINE)) == source
    assert cached_revisions("acme/tiny-llama", tmp_path / "hub") == ["main (0123456789ab)"]


def test_the_hubs_refusals_are_explained(fake_hub, tmp_path):
    options = HubOptions(cache=tmp_path / "hub", endpoint=fake_hub)
    with pytest.raises(LoaderError, match="the Hugging Face Hub has no such model or it is private .*HF_TOKEN"):
        resolve_model("acme/absent", tmp_path, options)
    with pytest.raises(LoaderError, match="the Hugging Face Hub has no revision 'v9' of model 'acme/tiny-llama'"):
        resolve_model("acme/tiny-llama", tmp_path, HubOptions("v9", tmp_path / "hub", endpoint=fake_hub))


def _unsupported_repo(tiny_llama_dir) -> dict[str, bytes]:
    files = {path.name: path.read_bytes() for path in tiny_llama_dir.iterdir()}
    config = json.loads(files["config.json"])
    files["config.json"] = json.dumps({**config, "model_type": "mamba", "architectures": ["MambaForCausalLM"]}).encode()
    return files


def test_an_unsupported_architecture_is_refused_before_any_weight_is_fetched(fake_hub, tiny_llama_dir, tmp_path):
    FakeHub.repos["acme/tiny-mamba"] = _unsupported_repo(tiny_llama_dir)
    options = HubOptions(cache=tmp_path / "hub", endpoint=fake_hub)
    with pytest.raises(LoaderError) as error:
        resolve_model("acme/tiny-mamba", tmp_path, options)
    assert "model 'acme/tiny-mamba' cannot be served: unsupported architecture 'mamba'; supported: " in str(error.value)
    assert "llama" in str(error.value) and "qwen2" in str(error.value)
    assert set(FakeHub.served) == {"config.json"}
    # Cached, the refusal needs no Hub.
    with pytest.raises(LoaderError, match="unsupported architecture 'mamba'"):
        resolve_model("acme/tiny-mamba", tmp_path, HubOptions(cache=tmp_path / "hub", **OFFLINE))


def test_a_quantization_that_cannot_be_loaded_is_refused_before_any_weight_is_fetched(fake_hub, tiny_llama_dir,
                                                                                      tmp_path):
    files = {path.name: path.read_bytes() for path in tiny_llama_dir.iterdir()}
    config = json.loads(files["config.json"])
    files["config.json"] = json.dumps({**config, "quantization_config": {"quant_method": "awq", "bits": 4}}).encode()
    FakeHub.repos["acme/tiny-llama-awq"] = files
    with pytest.raises(LoaderError) as error:
        resolve_model("acme/tiny-llama-awq", tmp_path, HubOptions(cache=tmp_path / "hub", endpoint=fake_hub))
    assert "cannot be served: quant_method 'awq' is not supported; quantized checkpoints load when their weights " \
           "are FP8" in str(error.value)
    assert set(FakeHub.served) == {"config.json"}


def test_unsupported_activations_and_rope_scalings_are_named_with_what_is_supported(tiny_llama_dir, tmp_path):
    config = json.loads((tiny_llama_dir / "config.json").read_text())
    for change, message in (({"hidden_act": "relu2"}, "unsupported activation 'relu2' for llama; supported: silu"),
                            ({"rope_parameters": {"rope_type": "dynamic", "rope_theta": 1e4, "factor": 4.0}},
                             "unsupported rope scaling 'dynamic'; supported: ")):
        directory = tmp_path / "-".join(change)
        directory.mkdir()
        (directory / "config.json").write_text(json.dumps({**config, **change}))
        with pytest.raises(LoaderError, match=message):
            resolve_model(str(directory), tmp_path, HubOptions(cache=tmp_path / "hub", **OFFLINE))


def test_launch_refuses_an_unsupported_model_id_in_seconds(fake_hub, tiny_llama_dir, tmp_path):
    # The whole command, as a user runs it, against the stand-in Hub: refused before any shard
    # starts, with the supported list, and no weight fetched.
    import os
    import subprocess
    import sys
    import time

    FakeHub.repos["acme/tiny-mamba"] = _unsupported_repo(tiny_llama_dir)
    superinfer = pathlib.Path(sys.executable).parent / "superinfer"
    env = {**os.environ, "HF_ENDPOINT": fake_hub, "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "0"}
    started = time.monotonic()
    done = subprocess.run([str(superinfer), "launch", "--model-id", "acme/tiny-mamba"], env=env,
                          capture_output=True, text=True, timeout=60)
    elapsed = time.monotonic() - started
    assert done.returncode == 1, done.stderr
    assert "unsupported architecture 'mamba'; supported: " in done.stderr and "llama" in done.stderr
    assert set(FakeHub.served) == {"config.json"}
    assert elapsed < 5, f"refused after {elapsed:.1f} s"
