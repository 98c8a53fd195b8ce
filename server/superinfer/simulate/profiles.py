"""Simulated machines. A profile is what the simulator needs to know about a (hardware, model)
pair: the true step time, the link, the KV geometry and pool sizes, and the cost model the
scheduler believes (as Warmup would measure it).

Derived profiles use a roofline: a step costs max(FLOPs / sustained FLOP/s, bytes read /
sustained bandwidth) plus a launch overhead, where the bytes are the weights (once per step)
and the KV of every attended position; the scheduler's linear cost model is fitted to that
roofline over warm-up-like step shapes with the warm-up's own fit. The roofline, the linear
formula and the fit are the scheduler crate's (`superinfer._router.step_time`,
`fit_step_cost`): this module only holds the machines' specifications."""
import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from superinfer import _router

GB = 1e9
# The scheduler's step limits, where a profile does not say (the router's defaults too).
_DEFAULTS = _router.scheduler_defaults()


@dataclass(frozen=True)
class Hardware:
    name: str
    hbm_bytes: float
    hbm_bytes_per_s: float
    flops_per_s: float  # dense bf16 peak
    link_out_bytes_per_s: float  # device → host
    link_in_bytes_per_s: float  # host → device
    duplex: bool
    host_bytes: float
    transfer_overhead_s: float = 20e-6
    # Sustained fractions of peak: achievable MFU for large GEMMs and streaming bandwidth.
    compute_efficiency: float = 0.6
    memory_efficiency: float = 0.8
    step_overhead_s: float = 1.5e-3


@dataclass(frozen=True)
class Model:
    name: str
    params: float  # total parameters (weights held in HBM)
    active_params: float  # parameters touched per token (experts: top-k only)
    layers: int
    hidden: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int = 2

    @property
    def kv_bytes_per_token(self) -> int:
        return self.layers * self.kv_heads * self.head_dim * 2 * self.dtype_bytes


HARDWARE = {
    # NVLink-C2C: 450 GB/s per direction, full duplex; HBM3 96 GB at ~4 TB/s; ~990 TFLOP/s bf16.
    "gh200": Hardware("GH200", 96 * GB, 4.0e12, 990e12, 450 * GB, 450 * GB, True, 480 * GB),
    # The HBM3e variant (144 GB at ~4.9 TB/s): the one that holds Mixtral-8x7B in bf16.
    "gh200-144g": Hardware("GH200 144GB", 144 * GB, 4.9e12, 990e12, 450 * GB, 450 * GB, True, 480 * GB),
    # PCIe Gen5 x16: ~55 GB/s per direction measured; HBM3e 141 GB at 4.8 TB/s.
    "h200-pcie": Hardware("H200 (PCIe Gen5)", 141 * GB, 4.8e12, 990e12, 55 * GB, 55 * GB, True, 480 * GB),
}

MODELS = {
    "llama-3-8b": Model("Llama-3-8B", 8.03e9, 8.03e9, 32, 4096, 8, 128),
    "qwen2.5-32b": Model("Qwen2.5-32B", 32.8e9, 32.8e9, 64, 5120, 8, 128),
    # 8 experts, top-2: ~12.9 B parameters active per token of 46.7 B.
    "mixtral-8x7b": Model("Mixtral-8x7B", 46.7e9, 12.9e9, 32, 4096, 8, 128),
}


@dataclass(frozen=True)
class Profile:
    name: str
    # {"kind": "linear", ...CostModel} or {"kind": "roofline", ...}: the machine's truth.
    step_time: dict
    link: dict
    # What the scheduler believes (Warmup's fit): the CostModel fields.
    cost_model: dict
    block_size: int
    block_bytes: int
    num_device_blocks: int
    num_host_blocks: int
    max_batch_tokens: int
    max_batch_requests: int
    # What a step costs beyond its forward (the simulator's `Charges`): "per_step_s" (the
    # router's turn, the gRPC hop, the shard's work around the model), "transfer_stall" (share
    # of a transfer's link time that delays its step: 0 for a GPU's copy engines, 1 for copy
    # threads on the forward's own cores), "planning" (charge the scheduler's planning as it
    # runs). Missing keys: 0 / false.
    charges: dict = field(default_factory=dict)

    def describe(self) -> dict:
        return asdict(self)


def _fit_belief(roofline: dict, link: dict, max_batch_tokens: int, max_batch_requests: int) -> dict:
    """The scheduler's belief about a roofline machine, as a warm-up would measure it: the
    linear fit and the token curve over step shapes like a warm-up's (pure prefills and pure
    decode batches, and a prefill and a short-context decode batch at each of the curve's
    knots within the batch limits)."""
    shapes = [(prefill, 0, prefill) for prefill in (128, 512, 1024, 2048, 4096, 8192)]
    shapes += [(0, batch, batch * context) for batch in (1, 8, 32, 64, 128, 256) for context in (256, 1024, 2048)]
    knots = _router.token_curve_knots()
    shapes += [(n, 0, n) for n in knots if n <= max(max_batch_tokens, 8192)]
    shapes += [(0, d, d * 32) for d in knots if d <= max(max_batch_requests, 256)]
    shapes = list(dict.fromkeys(shapes))
    times = _router.step_time(json.dumps(roofline), shapes)
    c0, c1, c2, c3 = _router.fit_step_cost(shapes, times)
    tokens_s, decodes_s, per_context = _router.fit_step_curve(shapes, times)
    return {
        "step_base_s": c0, "per_prefill_token_s": c1, "per_decode_request_s": c2, "per_context_token_s": c3,
        "swap_out_bytes_per_s": link["out_bytes_per_s"], "swap_in_bytes_per_s": link["in_bytes_per_s"],
        "transfer_overhead_s": link["overhead_s"], "duplex": link["duplex"],
        "token_curve": {"tokens_s": tokens_s, "decodes_s": decodes_s, "per_context_token_s": per_context},
    }


def derived(hardware_key: str, model_key: str, block_size: int = 16, max_batch_tokens: int = 8192,
            max_batch_requests: int = 256, kv_memory_fraction: float = 0.9) -> Profile:
    """A (hardware, model) profile from specifications alone. The device KV pool is what is
    left of `kv_memory_fraction` of HBM after the weights; the host pool is half of host memory."""
    if hardware_key not in HARDWARE:
        raise ValueError(f"unknown hardware {hardware_key!r} (known: {', '.join(HARDWARE)})")
    if model_key not in MODELS:
        raise ValueError(f"unknown model {model_key!r} (known: {', '.join(MODELS)})")
    hw, model = HARDWARE[hardware_key], MODELS[model_key]
    roofline = {
        "kind": "roofline",
        "overhead_s": hw.step_overhead_s,
        "flops_per_token": 2 * model.active_params,
        # QK^T and PV: 2 matmuls × 2 FLOPs × layers × hidden per attended position.
        "flops_per_context_token": 4 * model.layers * model.hidden,
        "flops_per_s": hw.flops_per_s * hw.compute_efficiency,
        "weight_bytes": model.params * model.dtype_bytes,
        "kv_bytes_per_context_token": model.kv_bytes_per_token,
        "memory_bytes_per_s": hw.hbm_bytes_per_s * hw.memory_efficiency,
    }

    link = {"out_bytes_per_s": hw.link_out_bytes_per_s, "in_bytes_per_s": hw.link_in_bytes_per_s,
            "overhead_s": hw.transfer_overhead_s, "duplex": hw.duplex}
    block_bytes = model.kv_bytes_per_token * block_size
    kv_bytes = hw.hbm_bytes * kv_memory_fraction - model.params * model.dtype_bytes
    if kv_bytes <= block_bytes:
        raise ValueError(f"{model.name} does not fit in {hw.name}'s memory")
    return Profile(
        f"{hw.name} / {model.name} (derived)", roofline, link,
        _fit_belief(roofline, link, max_batch_tokens, max_batch_requests), block_size,
        block_bytes, int(kv_bytes // block_bytes), int(hw.host_bytes / 2 // block_bytes),
        max_batch_tokens, max_batch_requests,
    )


def measured(path: str | Path) -> Profile:
    """A profile measured on a real machine: the JSON a shard writes at warm-up
    (`superinfer launch --warmup-report PATH`), with the Warmup cost model (the `CostModel`
    fields, its token curve included when the warm-up measured one) and the KV geometry, `{"cost_model": {...}, "block_size",
    "block_bytes", "num_device_blocks", "num_host_blocks", "max_batch_tokens",
    "max_batch_requests"}`; the measured model is both the truth and the belief."""
    document = json.loads(Path(path).read_text())
    try:
        cost = {k: document["cost_model"][k] for k in (
            "step_base_s", "per_prefill_token_s", "per_decode_request_s", "per_context_token_s",
            "swap_out_bytes_per_s", "swap_in_bytes_per_s", "transfer_overhead_s", "duplex")}
        if document["cost_model"].get("token_curve"):  # measured at warm-up since 2026-12-02
            cost["token_curve"] = document["cost_model"]["token_curve"]
        link = {"out_bytes_per_s": cost["swap_out_bytes_per_s"], "in_bytes_per_s": cost["swap_in_bytes_per_s"],
                "overhead_s": cost["transfer_overhead_s"], "duplex": cost["duplex"]}
        return Profile(
            document.get("name", f"measured ({Path(path).name})"), {"kind": "linear", **cost}, link, cost,
            int(document["block_size"]), int(document["block_bytes"]), int(document["num_device_blocks"]),
            int(document["num_host_blocks"]), int(document.get("max_batch_tokens", _DEFAULTS["max_batch_tokens"])),
            int(document.get("max_batch_requests", _DEFAULTS["max_batch_requests"])), dict(document.get("charges", {})),
        )
    except KeyError as missing:
        raise ValueError(f"{path}: measured profile lacks {missing}") from None


# The embedded default model on this machine's CPU: SmolLM2-135M in float32 (30 layers, 3 KV
# heads of 64) — the geometry a bench of the default server has, unless told otherwise.
CPU_DEFAULT_BLOCK_BYTES = 30 * 3 * 64 * 2 * 4 * 16


def from_bench(path: str | Path, num_device_blocks: int = 256, num_host_blocks: int = 1024,
               block_size: int = 16, block_bytes: int = CPU_DEFAULT_BLOCK_BYTES,
               memcpy_bytes_per_s: float = 5e9) -> Profile:
    """A linear profile from a bench report's unloaded latencies: a lone decode step is the
    unloaded gap between tokens, and prefill costs the rest of the unloaded TTFT spread over
    the prompt. Coarse (no batch or context terms): prefer `measured:` when a Warmup cost model
    is at hand."""
    document = json.loads(Path(path).read_text())
    unloaded, workload = document.get("unloaded"), document.get("workload", {})
    if not unloaded:
        raise ValueError(f"{path}: the bench ran with absolute objectives and measured no unloaded latency")
    prompt = max(int(workload.get("prompt_tokens", 1)), 1)
    decode = float(unloaded["tbt_s"])
    cost = {
        "step_base_s": decode, "per_prefill_token_s": max(float(unloaded["ttft_s"]) - decode, 0.0) / prompt,
        "per_decode_request_s": 0.0, "per_context_token_s": 0.0,
        "swap_out_bytes_per_s": memcpy_bytes_per_s, "swap_in_bytes_per_s": memcpy_bytes_per_s,
        "transfer_overhead_s": 50e-6, "duplex": False,
    }
    link = {"out_bytes_per_s": memcpy_bytes_per_s, "in_bytes_per_s": memcpy_bytes_per_s,
            "overhead_s": 50e-6, "duplex": False}
    return Profile(f"bench-derived ({Path(path).name})", {"kind": "linear", **cost}, link, cost, block_size,
                   block_bytes, num_device_blocks, num_host_blocks, _DEFAULTS["max_batch_tokens"],
                   _DEFAULTS["max_batch_requests"])


def resolve(spec: str) -> Profile:
    """`HARDWARE:MODEL` (e.g. gh200:llama-3-8b), `measured:PATH` (the JSON a shard writes with
    `--warmup-report`) or `bench:PATH` (a bench report)."""
    kind, _, rest = spec.partition(":")
    if kind == "measured":
        return measured(rest)
    if kind == "bench":
        return from_bench(rest)
    if not rest:
        raise ValueError(f"profile {spec!r}: expected HARDWARE:MODEL or measured:PATH")
    return derived(kind, rest)
