"""The sparse mixture-of-experts MLP of Qwen3-MoE and Mixtral: a replicated router picks each
token's top-k of E SwiGLU experts, whose outputs are summed weighted by the router.

Tokens are routed as a grouped computation: the (token, expert) assignments are sorted by
expert, each expert that received tokens runs one gate/up and one down matmul over its
contiguous slice, and the weighted outputs are scatter-added back to their tokens. The expert
weights are stacked ([E, 2I, H] gate/up, [E, H, I] down; the loader stacks the checkpoint's
per-expert tensors).

Tensor parallelism splits every expert by its inner dimension: each rank holds all E experts
and 1/N of each one's columns (gate/up column-parallel, down row-parallel), so each rank runs
the same routing on its own slices and the block ends in ONE all-reduce of the partial sums.
Splitting by experts instead (expert parallelism) would need an all-to-all of the tokens and
leave ranks idle when routing is uneven; the price of this split is smaller per-rank GEMMs.
The router is replicated: every rank computes the same routing from the same input."""
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .config import ConfigError, ModelConfig
from .decoder import Linear


@dataclass(frozen=True)
class MoeConfig:
    num_experts: int
    # Experts each token is routed to.
    top_k: int
    # Each expert's inner dimension.
    intermediate_size: int
    # Whether the top-k router weights are renormalised to sum to one.
    normalize_top_k: bool


def moe_config(config: ModelConfig) -> MoeConfig | None:
    """The sparse MLP's shape from config.json (Qwen3-MoE's `num_experts`, Mixtral's
    `num_local_experts`); None for a model without experts. `norm_topk_prob` defaults to
    Qwen3-MoE's False; Mixtral always renormalises (its class says so)."""
    raw = config.raw
    num_experts = int(raw.get("num_experts") or raw.get("num_local_experts") or 0)
    if num_experts == 0:
        return None
    if "num_experts_per_tok" not in raw:
        raise ConfigError(f"{config.architecture} config has {num_experts} experts but no num_experts_per_tok")
    top_k = int(raw["num_experts_per_tok"])
    if not 0 < top_k <= num_experts:
        raise ConfigError(f"num_experts_per_tok {top_k} must be between 1 and the {num_experts} experts")
    return MoeConfig(num_experts, top_k, int(raw.get("moe_intermediate_size") or config.intermediate_size),
                     bool(raw.get("norm_topk_prob", False)))


def route(logits: torch.Tensor, top_k: int, normalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """logits: [T, E] -> weights [T, k] (in the logits' dtype), experts [T, k] int64: softmax
    over all experts in float32, then the top k, renormalised when `normalize`."""
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    weights, experts = probs.topk(top_k, dim=-1)
    if normalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.to(logits.dtype), experts


def _swiglu(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    # x: [R, H]; gate_up: [2I, H]; down: [H, I] -> [R, H]
    gate, up = F.linear(x, gate_up).chunk(2, dim=-1)
    return F.linear(F.silu(gate) * up, down)


def grouped_experts(x: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor, gate_up: torch.Tensor,
                    down: torch.Tensor) -> torch.Tensor:
    """x: [T, H]; weights, experts: [T, k]; gate_up: [E, 2I, H]; down: [E, H, I] -> [T, H].

    One matmul pair per expert that has tokens, over its contiguous slice of the assignments
    sorted by expert. Reads the per-expert counts on the host (one sync per layer)."""
    top_k = experts.shape[1]
    flat = experts.flatten()  # [T·k] expert of each assignment, token-major
    order = flat.argsort(stable=True)  # [T·k] assignments grouped by expert
    token_rows = order // top_k  # [T·k] token of each sorted assignment
    counts = torch.bincount(flat, minlength=gate_up.shape[0]).tolist()
    inputs = x[token_rows]  # [T·k, H]
    outputs = torch.empty_like(inputs)
    start = 0
    for expert, count in enumerate(counts):
        if count:
            rows = slice(start, start + count)
            outputs[rows] = _swiglu(inputs[rows], gate_up[expert], down[expert])
            start += count
    outputs *= weights.flatten()[order, None]
    return torch.zeros_like(x).index_add_(0, token_rows, outputs)


def dense_experts(x: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor, gate_up: torch.Tensor,
                  down: torch.Tensor) -> torch.Tensor:
    """As `grouped_experts`, with every expert over every token weighted by a dense routing
    matrix (zero off the top k): fixed shapes and no host sync, which a CUDA graph can capture.
    E/k times the arithmetic, so only used for the small batches of captured decode steps."""
    routing = torch.zeros(x.shape[0], gate_up.shape[0], dtype=x.dtype, device=x.device)
    routing.scatter_(1, experts, weights)  # [T, E]
    gate, up = torch.matmul(x, gate_up.transpose(1, 2)).chunk(2, dim=-1)  # [E, T, I] each
    out = torch.matmul(F.silu(gate) * up, down.transpose(1, 2))  # [E, T, H]
    return (out * routing.T[:, :, None]).sum(dim=0)


class Experts(nn.Module):
    """E SwiGLU experts' weights, stacked (uninitialised, as decoder.Linear)."""

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int):
        super().__init__()
        # Per expert: gate rows [0, I), up rows [I, 2I).
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * intermediate_size, hidden_size),
                                         requires_grad=False)
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden_size, intermediate_size), requires_grad=False)


class SparseMoeBlock(nn.Module):
    """Router (`gate`) + experts, in place of a layer's dense MLP."""

    def __init__(self, hidden_size: int, moe: MoeConfig):
        super().__init__()
        self.moe = moe
        self.gate = Linear(hidden_size, moe.num_experts, bias=False)
        self.experts = Experts(moe.num_experts, hidden_size, moe.intermediate_size)
        # Set under tensor parallelism: sums the ranks' partial outputs (`parallelize`).
        self.tp_group = None

    def parallelize(self, intermediate_size: int, group) -> None:
        """Keeps this rank's `intermediate_size` columns of every expert (empty, to be loaded);
        `group.all_reduce` then sums the ranks' partial outputs once per block."""
        hidden_size = self.experts.down_proj.shape[1]
        self.experts = Experts(self.moe.num_experts, hidden_size, intermediate_size)
        self.tp_group = group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [T, hidden] -> [T, hidden]
        weights, experts = route(self.gate(x), self.moe.top_k, self.moe.normalize_top_k)
        capturing = x.is_cuda and torch.cuda.is_current_stream_capturing()
        compute = dense_experts if capturing else grouped_experts
        out = compute(x, weights, experts, self.experts.gate_up_proj, self.experts.down_proj)
        return out if self.tp_group is None else self.tp_group.all_reduce(out)
