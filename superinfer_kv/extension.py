"""Just-in-time builds of the C++ and CUDA sources in csrc/ with torch's extension tooling.

torch caches each build under its extensions directory (~/.cache/torch_extensions/… unless
TORCH_EXTENSIONS_DIR says otherwise) keyed by a hash of the sources and flags, so only the
first use after a change compiles (about a minute); later loads take milliseconds.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from torch.utils import cpp_extension

from .cuda_toolchain import build_cuda_extension
from .sources import CPU_SOURCES, CSRC, CUDA_ARCH_FLAGS, CUDA_SOURCES, CXX_FLAGS

def load_cpu_extension() -> ModuleType:
    """Builds (once) and imports the CPU gather/scatter extension."""
    return cpp_extension.load(
        name="superinfer_kv_cpu",
        sources=[str(CSRC / name) for name in CPU_SOURCES],
        extra_cflags=list(CXX_FLAGS),
        extra_ldflags=["-lpthread"],
        verbose=False,
    )


def load_cuda_extension() -> ModuleType:
    """Builds (once) and imports the CUDA transfer extension; needs nvcc and a CUDA torch.

    torch's builder needs ninja; where it is missing (a bare GPU image) nvcc and the host
    compiler are driven directly, caching under ~/.cache/superinfer_kv/cuda.
    """
    if not cpp_extension.is_ninja_available():
        return build_cuda_extension(Path.home() / ".cache" / "superinfer_kv" / "cuda")
    return cpp_extension.load(
        name="superinfer_kv_cuda",
        sources=[str(CSRC / name) for name in CUDA_SOURCES],
        extra_cflags=list(CXX_FLAGS),
        extra_cuda_cflags=["-O3", *CUDA_ARCH_FLAGS],
        verbose=False,
    )
