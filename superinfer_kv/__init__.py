"""DuplexKV: the KV-block transfer engine (CPU and CUDA backends).

    engine = TransferEngine(device_kv, host_kv)
    handle = engine.submit(swap_out=(device_ids, host_ids), swap_in=(host_ids, device_ids))
    handle.order_compute_after_in(); ...; handle.wait()

Modules: `engine` (entry point), `config` (tuning), `validation` (entry checks), `handle`
(completion), `cpu_backend` and `cuda_backend` (the copies), `extension` and `cuda_toolchain`
(building csrc/), `bench` and `bench_gpu` (figures).
"""

from .config import TransferConfig
from .engine import TransferEngine
from .handle import TransferHandle

__all__ = ["TransferConfig", "TransferEngine", "TransferHandle"]
