"""Rotary position embeddings (default, linear and Llama-3 frequency scaling), computed for
the step's positions once per forward and shared by every layer."""
import math

import torch

from .config import ModelConfig, RopeConfig


def inverse_frequencies(rope: RopeConfig, head_dim: int) -> torch.Tensor:
    """[head_dim / 2] float32 inverse frequencies on the CPU, as Hugging Face computes them.

    The device is explicit so that building a model on the meta device still gets real
    frequencies (meta math would also import torch's decompositions: seconds at start-up)."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").float() / head_dim
    inv_freq = 1.0 / (rope.theta**exponents)
    if rope.kind == "linear":
        return inv_freq / rope.factor
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


class RotaryEmbedding(torch.nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        # A buffer, not a parameter: it follows .to(device) but is not loaded from checkpoints.
        self.register_buffer("inv_freq", inverse_frequencies(config.rope, config.head_dim), persistent=False)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """positions: [T] -> cos, sin: [T, 1, D] in `dtype` (float32 math, as Hugging Face)."""
        freqs = positions.float()[:, None] * self.inv_freq.float()[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype)[:, None, :], emb.sin().to(dtype)[:, None, :]


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [T, heads, D]; cos, sin: [T, 1, D]."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
