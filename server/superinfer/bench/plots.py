"""PNG plots of a set of runs: SLO attainment and p99 TTFT against the request rate (one line
per series), and CDFs of TTFT and of the gaps between tokens at each series' highest rate.
Every title carries the runs' label, so simulated figures are never mistaken for measured."""
from pathlib import Path

import numpy as np

from superinfer.bench.runner import RunResult


def _pyplot():
    import matplotlib

    # Files only: no display is needed (or present) where benches run.
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _by_series(results: list[RunResult]) -> dict[str, list[RunResult]]:
    grouped: dict[str, list[RunResult]] = {}
    for result in results:
        grouped.setdefault(result.series, []).append(result)
    return {name: sorted(runs, key=lambda r: r.rate) for name, runs in grouped.items()}


def _attainment(plt, results: list[RunResult], label: str, path: Path) -> None:
    figure, axes = plt.subplots(1, 3, figsize=(13, 4), sharey=True)
    for name, runs in _by_series(results).items():
        rates = [r.rate for r in runs]
        for axis, key in zip(axes, ("ttft", "tbt", "both")):
            axis.plot(rates, [r.summary["attainment"][key] * 100 for r in runs], marker="o", label=name)
    for axis, title in zip(axes, ("TTFT", "TBT", "TTFT and TBT")):
        axis.set_title(f"{title} SLO attainment ({label})")
        axis.set_xlabel("request rate (req/s)")
        axis.grid(alpha=0.3)
    axes[0].set_ylabel("requests meeting the objective (%)")
    axes[0].legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _p99_ttft(plt, results: list[RunResult], label: str, path: Path) -> None:
    figure, axis = plt.subplots(figsize=(6, 4))
    for name, runs in _by_series(results).items():
        points = [(r.rate, r.summary["ttft_s"]["p99"]) for r in runs if r.summary["ttft_s"]["p99"] is not None]
        if points:
            axis.plot(*zip(*points), marker="o", label=name)
    axis.set_title(f"p99 TTFT ({label})")
    axis.set_xlabel("request rate (req/s)")
    axis.set_ylabel("seconds")
    axis.set_yscale("log")
    axis.grid(alpha=0.3)
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _cdf(plt, results: list[RunResult], field: str, title: str, label: str, path: Path) -> None:
    figure, axis = plt.subplots(figsize=(6, 4))
    for name, runs in _by_series(results).items():
        top = runs[-1]
        values = np.sort(np.asarray(getattr(top, field), dtype=float)) * 1e3
        if values.size:
            axis.plot(values, np.arange(1, values.size + 1) / values.size, label=f"{name} @ {top.rate:g} req/s")
    axis.set_title(f"CDF of {title} ({label})")
    axis.set_xlabel("milliseconds")
    axis.set_xscale("log")
    axis.set_ylabel("fraction")
    axis.grid(alpha=0.3)
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def write_plots(results: list[RunResult], directory: Path, prefix: str = "") -> list[Path]:
    """Writes the four PNGs into `directory`; returns their paths."""
    if not results:
        return []
    plt = _pyplot()
    directory.mkdir(parents=True, exist_ok=True)
    label = results[0].label
    paths = {
        "attainment": directory / f"{prefix}attainment_vs_rate.png",
        "p99": directory / f"{prefix}p99_ttft_vs_rate.png",
        "ttft": directory / f"{prefix}cdf_ttft.png",
        "tbt": directory / f"{prefix}cdf_tbt.png",
    }
    _attainment(plt, results, label, paths["attainment"])
    _p99_ttft(plt, results, label, paths["p99"])
    _cdf(plt, results, "ttft_s", "TTFT", label, paths["ttft"])
    _cdf(plt, results, "gaps_s", "time between tokens", label, paths["tbt"])
    return list(paths.values())
