"""LoRA adapters served beside the base model, each request with its own: the rows of a step
that run with each adapter (`LoraBatch`, carried on the step's `AttentionMetadata`), and the
projections that add the adapters' deltas to those rows (`LoraLinear`, installed over a loaded
model's projections by `install_adapter`, at start-up or between steps, and taken out again by
`remove_adapter`). Owns the adapters' tensors, inside those modules. An adapter is known by its
slot, chosen when it is loaded (k + 1 for the k-th of --lora-adapters; the router's for one
loaded later) and never another adapter's while it is installed.

Per step, every adapter present in the batch costs each projection it targets one shrink
matmul (x_rows @ A^T: [n, R]) and one expand matmul (@ B^T: [n, out]) over that adapter's
rows, added to the same rows of the projection's output: a segmented matmul over rows grouped
by adapter, with no work per token. An adapter's rows that are contiguous in the flat batch are
sliced; otherwise gathered and scatter-added. A GPU runs the same code (no fused SGMV kernel).

Each adapter keeps its own tensors at its own rank (no padding to the largest rank): the loop
is over the adapters present in a step, and a small adapter costs what its rank costs.

A fused projection (qkv_proj, gate_up_proj) carries one A and one B per adapter over all the
parts it targets: A stacks the parts' A ([R, in], R the sum of their ranks) and B is
block-diagonal ([out, R], zero where a part is not targeted), so a LoRA on q only changes q's
slice of the output. Each part's scale (alpha/r, or alpha/sqrt(r) with rsLoRA) is folded into
its block of B at load time.

Under tensor parallelism (`shard.lora` slices the tensors): a column-parallel projection holds
A whole and this rank's rows of B; a row-parallel one holds this rank's input columns of A and
B whole, and adds its delta to the partial sum before the all-reduce — the delta is linear in
A's columns, so the sum over the ranks is the whole delta.

A step with no adapter rows (`AttentionMetadata.lora` None) passes no LoRA argument: the
projections compute exactly what they compute without adapters."""
from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..shard.staging import upload
from .decoder import Attention, MLP

# The projections of the shared decoder an adapter may target, by their path in a layer.
ATTENTION_PROJECTIONS = ("self_attn.qkv_proj", "self_attn.o_proj")
MLP_PROJECTIONS = ("mlp.gate_up_proj", "mlp.down_proj")
# One adapter's tensors: (layer index, projection path) -> (A [R, in], B [out, R]).
AdapterTensors = dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class LoraRows:
    """The rows of the flat batch one adapter runs on."""

    # The adapter's slot (chosen at load; 0, the base model, has no rows here).
    slot: int
    # The rows are [start, stop) when `index` is None; otherwise `index` ([n] int64, on the
    # model's device) lists them.
    start: int
    stop: int
    index: torch.Tensor | None = None


@dataclass(frozen=True)
class LoraBatch:
    """A step's rows grouped by adapter: one entry per adapter present."""

    groups: tuple[LoraRows, ...]


def lora_batch(spans: Iterable[tuple[int, int, int]], device: torch.device) -> LoraBatch | None:
    """`spans`: (first row, row count, adapter slot) of each chunk of the step. None when no
    row runs with an adapter (the base model's path, untouched)."""
    ranges: dict[int, list[tuple[int, int]]] = {}
    for first, count, slot in spans:
        if slot:
            ranges.setdefault(slot, []).append((first, first + count))
    groups = []
    for slot, spans_of_slot in sorted(ranges.items()):
        merged: list[list[int]] = []
        for start, stop in sorted(spans_of_slot):
            if merged and merged[-1][1] == start:
                merged[-1][1] = stop
            else:
                merged.append([start, stop])
        if len(merged) == 1:
            groups.append(LoraRows(slot, merged[0][0], merged[0][1]))
            continue
        index = torch.cat([torch.arange(start, stop) for start, stop in merged])
        groups.append(LoraRows(slot, merged[0][0], merged[-1][1], upload(index, device)))
    return LoraBatch(tuple(groups)) if groups else None


class LoraLinear(nn.Module):
    """A projection (the shared `Linear`, or a `RowParallelLinear` under tensor parallelism)
    plus the deltas of the adapters that target it. It takes over the projection's parameters
    (same names, so nothing that reads `weight` changes) and computes what it computed."""

    def __init__(self, base: nn.Module):
        super().__init__()
        self.weight = base.weight  # [out, in] (this rank's)
        self.bias = base.bias
        # A row-parallel projection's group: the delta joins the partial sum before its all-reduce.
        self.tp_group = getattr(base, "tp_group", None)
        # slot -> (A [R, in], B [out, R] with the scale folded in), on the weight's device and dtype.
        self.adapters: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def add_adapter(self, slot: int, lora_a: torch.Tensor, lora_b: torch.Tensor) -> None:
        out_features, in_features = self.weight.shape
        rank = lora_a.shape[0]
        if lora_a.shape != (rank, in_features) or lora_b.shape != (out_features, rank):
            raise ValueError(f"LoRA tensors of shapes {tuple(lora_a.shape)} and {tuple(lora_b.shape)} do not fit a "
                             f"projection of {in_features} inputs and {out_features} outputs")
        if slot in self.adapters:
            raise ValueError(f"adapter slot {slot} is installed twice on one projection")
        as_weight = dict(dtype=self.weight.dtype, device=self.weight.device)
        self.adapters[slot] = (lora_a.to(**as_weight).contiguous(), lora_b.to(**as_weight).contiguous())

    def forward(self, x: torch.Tensor, lora: LoraBatch | None = None) -> torch.Tensor:
        """x: [T, in] -> [T, out]."""
        if self.tp_group is None:
            out = F.linear(x, self.weight, self.bias)
            if lora is not None:
                self._add_deltas(out, x, lora)
            return out
        out = F.linear(x, self.weight)
        if lora is not None:
            self._add_deltas(out, x, lora)
        out = self.tp_group.all_reduce(out)
        return out if self.bias is None else out + self.bias

    def _add_deltas(self, out: torch.Tensor, x: torch.Tensor, lora: LoraBatch) -> None:
        for rows in lora.groups:
            weights = self.adapters.get(rows.slot)
            if weights is None:
                continue  # this adapter leaves this projection as it is
            lora_a, lora_b = weights
            if rows.index is None:
                # out[rows] += (x[rows] @ A^T) @ B^T, in place on the contiguous rows.
                out[rows.start : rows.stop].addmm_(F.linear(x[rows.start : rows.stop], lora_a), lora_b.t())
            else:
                shrunk = F.linear(x.index_select(0, rows.index), lora_a)  # [n, R]
                out.index_add_(0, rows.index, F.linear(shrunk, lora_b))


def unsupported_projection(layer: nn.Module, index: int, projection: str) -> str | None:
    """Why `projection` (a path in ATTENTION_PROJECTIONS or MLP_PROJECTIONS) of decoder layer
    `index` cannot take a LoRA; None when it can. The LoRA rows reach a projection through the
    shared decoder's own forwards (Attention's, MLP's, and the layer's where it says
    `MLP_TAKES_LORA`); a module with a forward of its own, or a sparse MLP, does not receive them."""
    if projection in ATTENTION_PROJECTIONS:
        attention = layer.self_attn
        if not isinstance(attention, Attention) or type(attention).forward is not Attention.forward:
            return f"layer {index}'s attention ({type(attention).__name__}) runs a forward of its own"
        return None
    if projection not in MLP_PROJECTIONS:
        return f"{projection} is not a projection of the shared decoder"
    mlp = layer.mlp
    if not isinstance(mlp, MLP):
        return f"layer {index}'s MLP is a {type(mlp).__name__} (LoRA on a sparse MLP's experts is not supported)"
    if type(mlp).forward is not MLP.forward or not type(layer).MLP_TAKES_LORA:
        return f"layer {index}'s MLP ({type(mlp).__name__} in {type(layer).__name__}) runs a forward of its own"
    return None


def check_adapter(model: nn.Module, tensors: AdapterTensors, slot: int | None = None) -> None:
    """ValueError when `install_adapter(model, slot, tensors)` would refuse them: a layer the
    model lacks, a projection that cannot take a LoRA, tensors of shapes that do not fit it, or
    (`slot` given) a slot installed already. Reads the model only (safe beside its forward)."""
    layers = model.model.layers
    for (index, projection), (lora_a, lora_b) in sorted(tensors.items()):
        if not 0 <= index < len(layers):
            raise ValueError(f"the model has no layer {index} (it has {len(layers)})")
        reason = unsupported_projection(layers[index], index, projection)
        if reason is not None:
            raise ValueError(reason)
        owner_path, name = projection.split(".")
        out_features, in_features = getattr(getattr(layers[index], owner_path), name).weight.shape
        rank = lora_a.shape[0]
        if lora_a.shape != (rank, in_features) or lora_b.shape != (out_features, rank):
            raise ValueError(f"layer {index}'s {projection}: LoRA tensors of shapes {tuple(lora_a.shape)} and "
                             f"{tuple(lora_b.shape)} do not fit a projection of {in_features} inputs and "
                             f"{out_features} outputs")
    wrapped = (module for module in model.modules() if isinstance(module, LoraLinear))
    if slot is not None and any(slot in module.adapters for module in wrapped):
        raise ValueError(f"adapter slot {slot} is installed already")


def install_adapter(model: nn.Module, slot: int, tensors: AdapterTensors) -> None:
    """Adds adapter `slot`'s tensors to `model`: (layer index, projection path) -> (A [R, in],
    B [out, R], scale folded in), already this rank's slices. At start-up or between steps (the
    projections are wrapped once, the first time). ValueError (`check_adapter`) before anything
    changes."""
    check_adapter(model, tensors, slot)
    _wrap_projections(model)
    layers = model.model.layers
    for (index, projection), (lora_a, lora_b) in sorted(tensors.items()):
        owner_path, name = projection.split(".")
        getattr(getattr(layers[index], owner_path), name).add_adapter(slot, lora_a, lora_b)


def remove_adapter(model: nn.Module, slot: int) -> int:
    """Takes adapter `slot` out of every projection of `model` (the `LoraLinear` wrappers stay);
    the number of projections that held it."""
    removed = 0
    for module in model.modules():
        if isinstance(module, LoraLinear) and module.adapters.pop(slot, None) is not None:
            removed += 1
    return removed


def _wrap_projections(model: nn.Module) -> None:
    """Every projection that can take a LoRA becomes a `LoraLinear` (once): a step with adapter
    rows passes them to all of them, targeted by an adapter of the step or not."""
    for index, layer in enumerate(model.model.layers):
        for projection in ATTENTION_PROJECTIONS + MLP_PROJECTIONS:
            if unsupported_projection(layer, index, projection) is not None:
                continue
            owner_path, name = projection.split(".")
            owner = getattr(layer, owner_path)
            if not isinstance(getattr(owner, name), LoraLinear):
                setattr(owner, name, LoraLinear(getattr(owner, name)))
