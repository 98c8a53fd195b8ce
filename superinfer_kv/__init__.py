"""DuplexKV: the KV-block transfer engine (CPU and CUDA backends)."""
