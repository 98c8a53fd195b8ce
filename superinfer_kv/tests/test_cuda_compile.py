"""The CUDA sources compile with nvcc for sm_80 and sm_90 (and link and import against a CUDA torch),
checked on every machine, GPU or not, so the CUDA backend cannot rot unnoticed."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from superinfer_kv.cuda_toolchain import (
    PREBUILT_ENV,
    CudaToolchainError,
    compile_cuda_sources,
    nvcc_compile,
    prebuild_cuda_extension,
)

# Stable across runs so an unchanged tree is not recompiled (the result is keyed by a hash).
BUILD_DIR = Path.home() / ".cache" / "superinfer_kv" / "nvcc-check"


def test_cuda_sources_compile() -> None:
    out_dir = compile_cuda_sources(BUILD_DIR)
    assert (out_dir / "compiled.ok").exists() or (out_dir / "linked.ok").exists()


def test_compile_check_reports_errors(tmp_path: Path) -> None:
    broken = tmp_path / "broken.cu"
    broken.write_text("__global__ void kernel(int* out) { out[0] = undeclared_name; }\n")
    with pytest.raises(CudaToolchainError, match="undeclared_name"):
        nvcc_compile(broken, tmp_path / "broken.o")


@pytest.mark.skipif(torch.version.cuda is None, reason="linking needs a CUDA build of torch")
def test_a_prebuilt_extension_is_imported_without_a_compiler(tmp_path: Path) -> None:
    # What the image does: build once with nvcc, then import with SUPERINFER_KV_CUDA_EXTENSION
    # set and no compiler on PATH (PATH emptied, so neither nvcc nor c++ nor ninja is found).
    library = prebuild_cuda_extension(tmp_path / "lib", build_dir=BUILD_DIR)
    probe = (
        "import torch; from superinfer_kv.extension import load_cuda_extension; "
        "m = load_cuda_extension(); print(m.__file__)"
    )
    env = {**os.environ, PREBUILT_ENV: str(library), "PATH": ""}
    loaded = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.strip() == str(library)
    env[PREBUILT_ENV] = str(tmp_path / "missing.so")
    missing = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    assert missing.returncode != 0 and "the prebuilt CUDA extension" in missing.stderr
