"""Rotary position embeddings (default, linear, Llama-3, LongRoPE and YaRN frequency scaling; all or
a leading part of each head rotated), computed for the step's positions once per forward and
shared by every layer."""
import math

import torch

from .config import ModelConfig, RopeConfig


def rotary_dim(rope: RopeConfig, head_dim: int) -> int:
    """The leading dimensions of a head that are rotated: all of them unless partial."""
    return int(head_dim * rope.partial_rotary_factor)


def inverse_frequencies(rope: RopeConfig, head_dim: int, long_context: bool = False) -> torch.Tensor:
    """[rotary_dim / 2] float32 inverse frequencies on the CPU, as Hugging Face computes them;
    `long_context`: LongRoPE's set for sequences past its original context.

    The device is explicit so that building a model on the meta device still gets real
    frequencies (meta math would also import torch's decompositions: seconds at start-up)."""
    dim = rotary_dim(rope, head_dim)
    exponents = torch.arange(0, dim, 2, dtype=torch.int64, device="cpu").float() / dim
    if rope.kind == "longrope":
        # Each frequency slowed by its own factor, from the short or the long set.
        factors = rope.long_factor if long_context else rope.short_factor
        return 1.0 / (torch.tensor(factors, dtype=torch.float32, device="cpu") * rope.theta**exponents)
    inv_freq = 1.0 / (rope.theta**exponents)
    if rope.kind == "linear":
        return inv_freq / rope.factor
    if rope.kind == "yarn":
        return _yarn(rope, inv_freq, dim)
    if rope.kind != "llama3":
        return inv_freq
    # Llama 3.1: long wavelengths are slowed by `factor`, short ones kept, the band between
    # interpolated smoothly.
    low_freq_wavelen = rope.original_max_position_embeddings / rope.low_freq_factor
    high_freq_wavelen = rope.original_max_position_embeddings / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = (rope.original_max_position_embeddings / wavelen - rope.low_freq_factor) / (
        rope.high_freq_factor - rope.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def _yarn(rope: RopeConfig, inv_freq: torch.Tensor, dim: int) -> torch.Tensor:
    """YaRN: a frequency that turns fewer than `beta_slow` times over the original context is
    slowed by `factor` (interpolated), one that turns more than `beta_fast` times is kept
    (extrapolated), and the band between is blended linearly by its index."""

    def index_turning(turns: float) -> float:
        # The frequency index i (of dim / 2) whose wave turns `turns` times over the original context.
        return dim * math.log(rope.original_max_position_embeddings / (turns * 2 * math.pi)) / (2 * math.log(rope.theta))

    low, high = index_turning(rope.beta_fast), index_turning(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    interpolated = ((torch.arange(dim // 2, dtype=torch.float32, device="cpu") - low) / (high - low)).clamp(0, 1)
    return inv_freq / rope.factor * interpolated + inv_freq * (1 - interpolated)


class RotaryEmbedding(torch.nn.Module):
    """cos/sin of the step's tokens.

    LongRoPE (Phi-3) has two frequency sets: a step's chunk takes the long one when its
    sequence, once the chunk is computed, is longer than the original context — per request,
    as transformers picks one per forward by max(position) + 1. Keys already in the cache keep
    the rotation they were computed with. transformers' generate therefore recomputes a
    sequence from scratch at the step it first outgrows the original context, so that every key
    takes the long set; here that recompute is one chunk of the whole sequence from position 0
    over its own blocks, which the scheduler must ask for: a sequence decoded on past the
    crossing attends over earlier keys rotated with the short set (as does a prompt chunked
    across it), and drifts from transformers' output."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        rope = config.rope
        # A buffer, not a parameter: it follows .to(device) but is not loaded from checkpoints.
        self.register_buffer("inv_freq", inverse_frequencies(rope, config.head_dim), persistent=False)
        long_inv_freq = None
        if rope.kind == "longrope":
            long_inv_freq = inverse_frequencies(rope, config.head_dim, long_context=True)
        self.register_buffer("long_inv_freq", long_inv_freq, persistent=False)
        self.original_max_positions = rope.original_max_position_embeddings
        self.attention_factor = rope.attention_factor

    def forward(self, positions: torch.Tensor, dtype: torch.dtype,
                sequence_lengths: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """positions: [T] -> cos, sin: [T, 1, R] in `dtype` (float32 math, as Hugging Face), R the
        rotated dimensions. sequence_lengths: [T] each token's sequence length once the step is
        computed (None: positions + 1, as for decodes); it picks LongRoPE's frequency set."""
        inv_freq = self.inv_freq.float()[None, :]  # [1, R/2]
        if self.long_inv_freq is not None:
            lengths = positions + 1 if sequence_lengths is None else sequence_lengths
            is_long = (lengths > self.original_max_positions)[:, None]  # [T, 1]
            inv_freq = torch.where(is_long, self.long_inv_freq.float()[None, :], inv_freq)  # [T, R/2]
        freqs = positions.float()[:, None] * inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        if self.attention_factor != 1.0:
            cos, sin = cos * self.attention_factor, sin * self.attention_factor
        return cos.to(dtype)[:, None, :], sin.to(dtype)[:, None, :]


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [T, heads, D]; cos, sin: [T, 1, R], R <= D: the first R dimensions are rotated."""
    rotated_dims = cos.shape[-1]
    if rotated_dims < x.shape[-1]:
        return torch.cat((apply_rotary(x[..., :rotated_dims], cos, sin), x[..., rotated_dims:]), dim=-1)
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
