"""The C++ and CUDA sources of DuplexKV's extensions and the flags they are built with: one
list that both builders (torch's, `extension.py`, and the direct nvcc driver,
`cuda_toolchain.py`) read."""

from pathlib import Path

CSRC = Path(__file__).resolve().parent / "csrc"

CPU_SOURCES = ("cpu_extension.cpp", "copy_pool.cpp")
CUDA_SOURCES = ("cuda_extension.cpp", "cuda_transfer.cpp", "gather_scatter.cu", "dma_copy.cu")
# Hopper is the target; the PTX of the newest listed arch lets later GPUs JIT it.
CUDA_ARCH_FLAGS = ("-gencode=arch=compute_90,code=sm_90",)
CXX_FLAGS = ("-O3",)
