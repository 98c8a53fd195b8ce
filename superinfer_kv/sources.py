"""The C++ and CUDA sources of DuplexKV's extensions and the flags they are built with: one
list that both builders (torch's, `extension.py`, and the direct nvcc driver,
`cuda_toolchain.py`) read."""

from pathlib import Path

CSRC = Path(__file__).resolve().parent / "csrc"

CPU_SOURCES = ("cpu_extension.cpp", "copy_pool.cpp")
CUDA_SOURCES = ("cuda_extension.cpp", "cuda_transfer.cpp", "gather_scatter.cu", "dma_copy.cu")
# Machine code for Ampere (A100, sm_80) and Hopper (H100/H200, sm_90), plus sm_90's PTX, which
# the driver compiles for GPUs newer than both.
CUDA_ARCH_FLAGS = (
    "-gencode=arch=compute_80,code=sm_80",
    "-gencode=arch=compute_90,code=sm_90",
    "-gencode=arch=compute_90,code=compute_90",
)
CXX_FLAGS = ("-O3",)
