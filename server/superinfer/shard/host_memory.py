"""How much host memory the host KV pool may take, when no size is given.

On a GPU the host pool is the rotation's capacity — every request rotated out lives there — so
by default it takes a share (`--host-kv-memory-fraction`) of the host memory available once the
model is loaded, split between the ranks of the process group, rather than a fixed count. What
is available is the kernel's estimate (`MemAvailable`: free memory plus what the page cache
can give back) bounded by the container's limit (cgroup v2 `memory.max`, or v1
`memory.limit_in_bytes`, minus what the group already uses): in Docker or Kubernetes the
machine's figure is not the process's. The pool is pinned, which takes time (the kernel faults
in and locks every page); the warm-up log reports it."""
import os
import pathlib

# Without a size given and on the CPU, where "host" and "device" are the same memory.
DEFAULT_CPU_HOST_KV_BLOCKS = 256
DEFAULT_HOST_KV_MEMORY_FRACTION = 0.5


def _read_int(path: pathlib.Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # cgroup v2 writes "max" when unlimited


def mem_available(meminfo: pathlib.Path = pathlib.Path("/proc/meminfo")) -> int | None:
    """The kernel's MemAvailable, in bytes (None where there is no /proc/meminfo)."""
    try:
        lines = meminfo.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return None


def cgroup_headroom(cgroup: pathlib.Path = pathlib.Path("/sys/fs/cgroup")) -> int | None:
    """Bytes the process's memory cgroup may still take (None: no limit found)."""
    for limit_name, usage_name in (("memory.max", "memory.current"),
                                   ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes")):
        limit, usage = _read_int(cgroup / limit_name), _read_int(cgroup / usage_name)
        # cgroup v1 reports "no limit" as a huge number (the page counter's maximum).
        if limit is not None and usage is not None and limit < 1 << 60:
            return max(0, limit - usage)
    return None


def available_host_bytes() -> int:
    """What the host can spare now: MemAvailable bounded by the cgroup's headroom."""
    figures = [f for f in (mem_available(), cgroup_headroom()) if f is not None]
    if not figures:
        pages, page_size = os.sysconf("SC_AVPHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        figures.append(pages * page_size)
    return min(figures)


def host_blocks_for_memory(available_bytes: int, fraction: float, block_bytes: int, ranks: int = 1) -> int:
    """Host blocks in `fraction` of `available_bytes`, shared by `ranks` processes (each rank
    holds its slice of every block, `block_bytes` each)."""
    if not 0 < fraction <= 1:
        raise ValueError(f"the host KV memory fraction must be in (0, 1], got {fraction}")
    if block_bytes <= 0 or ranks < 1:
        raise ValueError(f"block_bytes and ranks must be positive, got {block_bytes} and {ranks}")
    return max(0, int(available_bytes * fraction / ranks) // block_bytes)
