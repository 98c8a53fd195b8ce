"""Ahead-of-time compile (and, with a CUDA build of torch, link and import) of the CUDA sources.

This is the check that keeps the CUDA backend from rotting on machines without a GPU: nvcc
(the pinned PyPI `nvidia-cuda-nvcc`, or one on PATH) compiles every CUDA-side source with
torch's include directories for sm_80 and sm_90; with a CUDA build of torch the objects are also linked
into an extension and imported, which catches missing symbols. Results are cached by a hash
of the sources, flags and tools, so an unchanged tree costs nothing.
"""

from __future__ import annotations

import hashlib
import importlib.util
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import torch
from torch.utils import cpp_extension

from .sources import CSRC, CUDA_ARCH_FLAGS, CUDA_SOURCES

EXTENSION_NAME = "superinfer_kv_cuda"
# Names a prebuilt extension (prebuild_cuda_extension's output) to import instead of building.
PREBUILT_ENV = "SUPERINFER_KV_CUDA_EXTENSION"


class CudaToolchainError(RuntimeError):
    """nvcc is missing, or compiling or linking the CUDA sources failed."""


@dataclass(frozen=True)
class Toolchain:
    nvcc: Path
    # The toolkit root nvcc belongs to: include/ and lib/ (or lib64/) live under it.
    root: Path


def _pip_nvcc() -> Path | None:
    for base in {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}:
        for candidate in sorted(Path(base, "nvidia").glob("cu*/bin/nvcc")):
            return candidate
    return None


def find_toolchain() -> Toolchain:
    """The pinned PyPI nvcc if installed, else nvcc on PATH, else torch's CUDA_HOME."""
    found = _pip_nvcc() or (Path(p) if (p := shutil.which("nvcc")) else None)
    if found is None and cpp_extension.CUDA_HOME:
        candidate = Path(cpp_extension.CUDA_HOME, "bin", "nvcc")
        found = candidate if candidate.exists() else None
    if found is None:
        raise CudaToolchainError(
            "nvcc not found: install requirements-dev.txt (nvidia-cuda-nvcc) or a CUDA toolkit"
        )
    return Toolchain(nvcc=found, root=found.resolve().parent.parent)


def _compile_flags() -> list[str]:
    includes = [*cpp_extension.include_paths(), sysconfig.get_paths()["include"]]
    return [
        "-c", "-std=c++20", "-O3", "-Xcompiler", "-fPIC", *CUDA_ARCH_FLAGS,
        f"-DTORCH_EXTENSION_NAME={EXTENSION_NAME}", "-DTORCH_API_INCLUDE_EXTENSION_H",
        f"-D_GLIBCXX_USE_CXX11_ABI={int(torch.compiled_with_cxx11_abi())}",
        *(f"-I{path}" for path in includes),
    ]  # fmt: skip


def nvcc_compile(source: Path, output: Path, toolchain: Toolchain | None = None) -> None:
    """Compiles one source (.cu or CUDA-side .cpp) to an object; raises on any error."""
    toolchain = toolchain or find_toolchain()
    _run([str(toolchain.nvcc), *_compile_flags(), str(source), "-o", str(output)],
         f"nvcc {source.name}")


def _fingerprint(toolchain: Toolchain, flags: list[str]) -> str:
    digest = hashlib.sha256()
    # The CUDA sources and every header (the CPU-only sources do not affect this build).
    for path in sorted(CSRC.iterdir()):
        if path.name in CUDA_SOURCES or path.suffix == ".h":
            digest.update(path.name.encode() + path.read_bytes())
    digest.update(" ".join(flags).encode())
    digest.update(str(toolchain.nvcc.resolve()).encode() + torch.__version__.encode())
    return digest.hexdigest()[:16]


def _run(command: list[str], what: str) -> None:
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise CudaToolchainError(f"{what} failed:\n{result.stdout}\n{result.stderr}")


def _cudart(toolchain: Toolchain) -> Path:
    for pattern in ("lib/libcudart.so*", "lib64/libcudart.so*", "targets/*/lib/libcudart.so*"):
        for candidate in sorted(toolchain.root.glob(pattern)):
            return candidate
    raise CudaToolchainError(f"libcudart not found under {toolchain.root}")


def _link(objects: list[Path], output: Path, toolchain: Toolchain, strict: bool) -> None:
    torch_lib = Path(torch.__file__).parent / "lib"
    libraries = ["c10", "c10_cuda", "torch_cpu", "torch_cuda", "torch", "torch_python"]
    command = [
        "c++", "-shared", "-o", str(output), *map(str, objects), f"-L{torch_lib}",
        *(f"-l{name}" for name in libraries), str(_cudart(toolchain)), f"-Wl,-rpath,{torch_lib}",
    ]  # fmt: skip
    if strict:
        # Every symbol must resolve now (Python's included), not at import on a GPU host.
        python_lib = f"-L{sysconfig.get_config_var('LIBDIR')}"
        command += ["-Wl,--no-undefined", python_lib, f"-lpython{sysconfig.get_python_version()}"]
    _run(command, "linking the CUDA extension")


def compile_cuda_sources(build_dir: Path, link: bool | None = None, strict: bool = True) -> Path:
    """Compiles every CUDA-side source with nvcc; links and imports when `link` (default: when
    torch is a CUDA build). `strict` also resolves every symbol at link time. Returns the
    build directory (holding superinfer_kv_cuda.so when linked); raises CudaToolchainError.
    """
    toolchain = find_toolchain()
    flags = _compile_flags()
    link = torch.version.cuda is not None if link is None else link
    out_dir = build_dir / _fingerprint(toolchain, flags)
    stamp = out_dir / ("linked.ok" if link else "compiled.ok")
    if not strict:
        stamp = out_dir / "linked-runtime.ok"
    if stamp.exists():
        return out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    objects = [out_dir / f"{name}.o" for name in CUDA_SOURCES]
    with ThreadPoolExecutor(max_workers=len(objects)) as pool:
        compiles = [
            pool.submit(nvcc_compile, CSRC / name, obj, toolchain)
            for name, obj in zip(CUDA_SOURCES, objects)
        ]
        for compiled in compiles:
            compiled.result()
    if link:
        library = out_dir / f"{EXTENSION_NAME}.so"
        _link(objects, library, toolchain, strict)
        # A fresh interpreter imports it, so this process never holds a second copy.
        probe = f"import sys, torch; sys.path.insert(0, {str(out_dir)!r}); import {EXTENSION_NAME}"
        _run([sys.executable, "-c", probe], "importing the linked CUDA extension")
    stamp.touch()
    return out_dir


def build_cuda_extension(build_dir: Path) -> ModuleType:
    """Builds the CUDA extension without ninja (nvcc and c++ directly) and imports it."""
    out_dir = compile_cuda_sources(build_dir, link=True, strict=False)
    return import_extension(out_dir / f"{EXTENSION_NAME}.so")


def prebuild_cuda_extension(destination: Path, build_dir: Path | None = None) -> Path:
    """Compiles and links the CUDA extension ahead of time (an image's build: nvcc is needed now,
    not where it runs), every symbol resolved, and copies it to `destination`;
    `load_cuda_extension` imports it from there when PREBUILT_ENV names it. `build_dir` caches
    the build (default: a temporary directory). Returns the library's path."""
    with tempfile.TemporaryDirectory() as scratch:
        out_dir = compile_cuda_sources(build_dir or Path(scratch), link=True, strict=True)
        destination.mkdir(parents=True, exist_ok=True)
        library = destination / f"{EXTENSION_NAME}.so"
        shutil.copy2(out_dir / f"{EXTENSION_NAME}.so", library)
    return library


def import_extension(library: Path) -> ModuleType:
    """Imports a linked CUDA extension from its file (torch must be imported first: it loads the
    CUDA runtime the extension links against)."""
    if not library.is_file():
        raise CudaToolchainError(f"the prebuilt CUDA extension {library} does not exist")
    spec = importlib.util.spec_from_file_location(EXTENSION_NAME, library)
    if spec is None or spec.loader is None:
        raise CudaToolchainError(f"cannot import {library}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
