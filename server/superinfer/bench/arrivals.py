"""Synthetic arrival processes: Poisson, or gamma-distributed inter-arrival times whose
burstiness (the gamma shape) is below 1 for bursty traffic and above 1 for smooth traffic."""
import numpy as np


def gamma_arrivals(rate: float, count: int, burstiness: float, rng: np.random.Generator) -> np.ndarray:
    """Arrival offsets in seconds (the first at 0) with mean rate `rate`. `burstiness` 1 is a
    Poisson process; the mean gap stays 1/rate whatever the shape, so the rate is preserved."""
    if rate <= 0:
        raise ValueError(f"rate must be positive, got {rate}")
    if burstiness <= 0:
        raise ValueError(f"burstiness must be positive, got {burstiness}")
    if count <= 0:
        return np.zeros(0)
    # gaps: [count-1]; shape k and scale 1/(rate·k) keep the mean at 1/rate.
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=count - 1)
    return np.concatenate([[0.0], np.cumsum(gaps)])


def bounded(offsets: np.ndarray, duration_s: float | None) -> np.ndarray:
    """The arrivals that fall inside the first `duration_s` seconds (all when None)."""
    if duration_s is None:
        return offsets
    return offsets[offsets < duration_s]
