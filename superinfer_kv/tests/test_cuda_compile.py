"""The CUDA sources compile with nvcc for sm_90 (and link and import against a CUDA torch),
checked on every machine, GPU or not, so the CUDA backend cannot rot unnoticed."""

from pathlib import Path

import pytest

from superinfer_kv.cuda_toolchain import CudaToolchainError, compile_cuda_sources, nvcc_compile

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
