"""Just-in-time builds of the C++ and CUDA sources in csrc/ with torch's extension tooling.

torch caches each build under its extensions directory (~/.cache/torch_extensions/… unless
TORCH_EXTENSIONS_DIR says otherwise) keyed by a hash of the sources and flags, so only the
first use after a change compiles (about a minute); later loads take milliseconds.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

from torch.utils import cpp_extension

from .cuda_toolchain import PREBUILT_ENV, build_cuda_extension, import_extension
from .sources import CPU_SOURCES, CSRC, CUDA_ARCH_FLAGS, CUDA_SOURCES, CXX_FLAGS

log = logging.getLogger(__name__)


@contextmanager
def _logged_load(kind: str) -> Iterator[None]:
    # A first build takes about a minute with nothing else to show: say so before, and after.
    log.info("loading DuplexKV's %s extension (the first use after a change compiles it: about a minute)", kind)
    started = time.perf_counter()
    yield
    log.info("DuplexKV's %s extension ready in %.1f s", kind, time.perf_counter() - started)


def load_cpu_extension() -> ModuleType:
    """Builds (once) and imports the CPU gather/scatter extension."""
    with _logged_load("CPU"):
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
    compiler are driven directly, caching under ~/.cache/superinfer_kv/cuda. Where
    SUPERINFER_KV_CUDA_EXTENSION names a prebuilt library (an image's, built with
    `python -m superinfer_kv.prebuild`), that is imported and nothing is compiled.
    """
    if prebuilt := os.environ.get(PREBUILT_ENV):
        library = Path(prebuilt)
        log.info("loading DuplexKV's prebuilt CUDA extension %s (%s)", library, PREBUILT_ENV)
        return import_extension(library)
    with _logged_load("CUDA"):
        if not cpp_extension.is_ninja_available():
            return build_cuda_extension(Path.home() / ".cache" / "superinfer_kv" / "cuda")
        return cpp_extension.load(
            name="superinfer_kv_cuda",
            sources=[str(CSRC / name) for name in CUDA_SOURCES],
            extra_cflags=list(CXX_FLAGS),
            extra_cuda_cflags=["-O3", *CUDA_ARCH_FLAGS],
            verbose=False,
        )
