"""Tuning knobs of DuplexKV, fixed when the engine is built (the defaults suit most hosts)."""

from __future__ import annotations

from dataclasses import dataclass

CUDA_METHODS = ("auto", "kernel", "batch_memcpy", "memcpy_loop")


@dataclass(frozen=True)
class TransferConfig:
    """How the backends move blocks.

    cpu_threads: copy threads of the CPU backend; 0 = one per usable core, at most 8.
    cuda_method: "auto" picks per submit by the mean run size (below); "kernel" (SM
        gather/scatter over mapped pinned memory), "batch_memcpy" (cudaMemcpyBatchAsync) and
        "memcpy_loop" (one cudaMemcpyAsync per merged run) force one path.
    kernel_ctas: CTAs the gather/scatter kernel may occupy, bounding the SMs taken from compute.
        On an H200, 2-4 CTAs already reach the kernel's full PCIe throughput (as 16 or 32 do),
        while 16 made a concurrent bf16 matmul 2.2× slower (docs/benchmarks.md).
    dma_min_run_bytes: in "auto", merged runs averaging at least this many bytes go to the copy
        engines, smaller ones to the kernel. Copy-engine throughput collapses for small copies
        (vLLM measured ~5-7 GB/s below 28 KiB and ~52 GB/s at 64 KiB host→device on H100), and
        the copy engines leave the SMs to the model, so they win once runs are large enough.
        None (the default): measured on the GPU when the first engine is built (calibrate.py).
    kernel_launch_bytes: the kernel path splits a transfer into launches of about this many
        bytes, releasing its SMs between them (0: one launch per transfer). On an H200, one
        launch per 256 MiB transfer slowed a concurrent bf16 matmul by 19% (4 CTAs); 1 MiB
        launches by nothing measurable, for 10-14% less copy throughput when compute is idle.
    """

    cpu_threads: int = 0
    cuda_method: str = "auto"
    kernel_ctas: int = 4
    dma_min_run_bytes: int | None = None
    kernel_launch_bytes: int = 1024 * 1024

    def __post_init__(self) -> None:
        if self.cuda_method not in CUDA_METHODS:
            raise ValueError(f"cuda_method must be one of {CUDA_METHODS}, got {self.cuda_method!r}")
        if self.cpu_threads < 0:
            raise ValueError(f"cpu_threads must be >= 0, got {self.cpu_threads}")
        if self.kernel_ctas < 1:
            raise ValueError(f"kernel_ctas must be >= 1, got {self.kernel_ctas}")
        if self.kernel_launch_bytes < 0:
            raise ValueError(f"kernel_launch_bytes must be >= 0, got {self.kernel_launch_bytes}")
        if self.dma_min_run_bytes is not None and self.dma_min_run_bytes < 0:
            raise ValueError(f"dma_min_run_bytes must be >= 0, got {self.dma_min_run_bytes}")
