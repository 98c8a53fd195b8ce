"""The image from outside, as a user runs it (`make docker-test`, after `make docker`): the
container serves the embedded model on TGI's port through a published port, answers TGI's client
on /generate_stream, stops cleanly on `docker stop`; MODEL_ID names a model in the /data volume's
hub cache (HF_HOME=/data); DuplexKV's CUDA extension is prebuilt and imports with no compiler in
the image; a GPU asked for but missing stops the container with the reason."""
import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest
from text_generation import Client

IMAGE = os.environ.get("SUPERINFER_IMAGE", "superinfer")
STARTUP_TIMEOUT_S = 300
# The embedded model as converted on this machine (`make build` leaves it in the cache): copied
# into a hub-cache layout under the test's /data volume.
CONVERTED = Path(os.environ.get("SUPERINFER_CACHE", Path.home() / ".cache" / "superinfer")) / "converted"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def docker(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise AssertionError(f"docker {' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
    return done


@pytest.fixture(scope="module", autouse=True)
def image_exists():
    if docker("image", "inspect", IMAGE, check=False).returncode != 0:
        pytest.fail(f"no image {IMAGE!r}: run `make docker` first (make docker-test does)")


class Container:
    def __init__(self, *run_args: str, env: dict[str, str] | None = None, volume: Path | None = None):
        self.name = f"superinfer-test-{uuid.uuid4().hex[:8]}"
        options = ["-d", "--name", self.name, "-p", "127.0.0.1::80"]
        for key, value in (env or {}).items():
            options += ["-e", f"{key}={value}"]
        if volume is not None:
            options += ["-v", f"{volume}:/data"]
        docker("run", *options, IMAGE, *run_args)
        port = docker("port", self.name, "80/tcp").stdout.strip().splitlines()[0].rsplit(":", 1)[1]
        self.url = f"http://127.0.0.1:{port}"

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=30) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode()

    def logs(self) -> str:
        done = docker("logs", self.name, check=False)
        return done.stdout + done.stderr

    def running(self) -> bool:
        return docker("inspect", "-f", "{{.State.Running}}", self.name).stdout.strip() == "true"

    def wait_healthy(self) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if not self.running():
                raise AssertionError(f"the container exited during start-up:\n{self.logs()[-4000:]}")
            try:
                if self.get("/health")[0] == 200:
                    return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(1)
        raise AssertionError(f"not healthy after {STARTUP_TIMEOUT_S} s:\n{self.logs()[-4000:]}")

    def stop(self) -> int:
        """`docker stop` (SIGTERM, then SIGKILL after 30 s); the exit code."""
        docker("stop", "-t", "30", self.name, timeout=90)
        return int(docker("inspect", "-f", "{{.State.ExitCode}}", self.name).stdout.strip())

    def remove(self) -> None:
        docker("rm", "-f", self.name, check=False)


def test_docker_run_serves_the_embedded_model_on_tgis_port():
    container = Container()
    try:
        container.wait_healthy()
        status, info = container.get("/info")
        assert status == 200 and json.loads(info)["model_id"] == "default"
        client = Client(container.url, timeout=120)
        tokens = [r.token.text for r in client.generate_stream("The capital of France is", max_new_tokens=8)
                  if not r.token.special]
        assert len(tokens) == 8 and "".join(tokens).strip()
        status, metrics = container.get("/metrics")
        assert status == 200 and "tgi_request_count" in metrics and "superinfer_time_to_first_token_seconds_bucket" in metrics
        assert container.stop() == 0, container.logs()[-4000:]
    finally:
        container.remove()


def test_model_id_is_found_in_the_data_volumes_hub_cache(tmp_path):
    # HF_HOME=/data: a hub id resolves in /data/hub; HF_HUB_OFFLINE=1 keeps it off the network.
    converted = sorted(CONVERTED.glob("SmolLM2-135M-Instruct*"))
    assert converted, f"no converted embedded model under {CONVERTED}: run `make build` and start it once"
    repo = tmp_path / "data" / "hub" / "models--acme--smollm2"
    snapshot = repo / "snapshots" / COMMIT
    shutil.copytree(converted[0], snapshot, ignore=shutil.ignore_patterns(".complete"))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    os.chmod(tmp_path / "data", 0o777)
    container = Container(env={"MODEL_ID": "acme/smollm2", "HF_HUB_OFFLINE": "1"}, volume=tmp_path / "data")
    try:
        container.wait_healthy()
        assert json.loads(container.get("/info")[1])["model_id"] == "acme/smollm2"
        generated = Client(container.url, timeout=120).generate("Hello", max_new_tokens=4)
        assert generated.details.generated_tokens == 4
        assert container.stop() == 0
    finally:
        container.remove()


def test_a_model_id_missing_offline_stops_the_container_with_the_reason(tmp_path):
    (tmp_path / "data").mkdir()
    done = docker("run", "--rm", "-e", "MODEL_ID=acme/absent", "-e", "HF_HUB_OFFLINE=1",
                  "-v", f"{tmp_path / 'data'}:/data", IMAGE, timeout=300, check=False)
    assert done.returncode != 0
    assert "acme/absent" in done.stderr + done.stdout and "HF_HUB_OFFLINE" in done.stderr + done.stdout


def test_the_cuda_extension_is_prebuilt_and_no_compiler_is_shipped():
    probe = ("import shutil, torch; from superinfer_kv.cuda_toolchain import _pip_nvcc; "
             "from superinfer_kv.extension import load_cuda_extension; m = load_cuda_extension(); "
             "print(m.__file__, shutil.which('nvcc'), _pip_nvcc())")
    done = docker("run", "--rm", "--entrypoint", "python", IMAGE, "-c", probe, timeout=300)
    assert done.stdout.split() == ["/opt/superinfer/lib/superinfer_kv_cuda.so", "None", "None"], done.stderr


@pytest.mark.parametrize(
    ("args", "env", "reason"),
    [(["--device", "cuda"], {}, "--device cuda: torch sees no CUDA device"),
     ([], {"NVIDIA_VISIBLE_DEVICES": "all"}, "NVIDIA_VISIBLE_DEVICES=all assigns GPUs to this process")],
)
def test_a_gpu_asked_for_but_missing_stops_the_container(args, env, reason):
    if shutil.which("nvidia-smi"):
        pytest.skip("this machine has a GPU")
    options = [part for key, value in env.items() for part in ("-e", f"{key}={value}")]
    done = docker("run", "--rm", *options, IMAGE, *args, timeout=300, check=False)
    assert done.returncode == 1, done.stdout + done.stderr
    assert reason in done.stderr + done.stdout
