"""Loads a request trace in the Azure LLM inference format (`TIMESTAMP,ContextTokens,
GeneratedTokens`, rows in time order) and rescales its arrival times to a target mean rate,
keeping the trace's burst pattern. The default trace is the Azure conversation trace shipped in
the repository (data/azure-llm-2023/, CC BY 4.0, its README and licence beside it)."""
import csv
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np

DEFAULT_TRACE = Path(__file__).resolve().parents[3] / "data" / "azure-llm-2023" / "AzureLLMInferenceTrace_conv.csv"


@dataclass(frozen=True)
class Trace:
    # offsets_s: [n] seconds since the first request; prompt_tokens, output_tokens: [n]
    offsets_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray

    def __len__(self) -> int:
        return len(self.offsets_s)

    @property
    def mean_rate(self) -> float:
        """Requests per second over the trace (n-1 gaps over its span)."""
        span = float(self.offsets_s[-1] - self.offsets_s[0]) if len(self) > 1 else 0.0
        if span <= 0:
            raise ValueError("a trace needs two requests at different times to have a rate")
        return (len(self) - 1) / span

    def scaled_to(self, rate: float) -> "Trace":
        """The same requests with time compressed or stretched so the mean rate is `rate`."""
        if rate <= 0:
            raise ValueError(f"rate must be positive, got {rate}")
        factor = self.mean_rate / rate
        return Trace(self.offsets_s * factor, self.prompt_tokens, self.output_tokens)

    def window(self, start: int) -> "Trace":
        """The requests from row `start` on, their offsets counted from that row's arrival."""
        if not 0 <= start < len(self):
            raise ValueError(f"the trace has {len(self)} requests; no window starts at row {start}")
        return Trace(self.offsets_s[start:] - self.offsets_s[start], self.prompt_tokens[start:],
                     self.output_tokens[start:])

    def head(self, count: int | None, duration_s: float | None) -> "Trace":
        """The first `count` requests that arrive within `duration_s` seconds."""
        keep = np.ones(len(self), dtype=bool)
        if duration_s is not None:
            keep &= self.offsets_s < duration_s
        index = np.flatnonzero(keep)[: count if count is not None else None]
        return Trace(self.offsets_s[index], self.prompt_tokens[index], self.output_tokens[index])


def _parse_time(text: str) -> datetime:
    # The trace has 7 fractional digits; datetime takes at most 6.
    head, _, frac = text.strip().partition(".")
    return datetime.fromisoformat(f"{head}.{(frac + '000000')[:6]}" if frac else head)


def load_trace(path: str | Path) -> Trace:
    """Reads the CSV; offsets are relative to the first row."""
    path = Path(path)
    if not path.is_file():
        where = " (the default trace ships in a clone of the repository, not in the wheel)" if path == DEFAULT_TRACE else ""
        raise FileNotFoundError(f"trace file not found: {path}{where}")
    times, prompts, outputs = [], [], []
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        missing = {"TIMESTAMP", "ContextTokens", "GeneratedTokens"} - set(reader.fieldnames or [])
        if missing:
            raise ValueError(f"{path}: missing columns {sorted(missing)}")
        for row in reader:
            times.append(_parse_time(row["TIMESTAMP"]))
            prompts.append(int(row["ContextTokens"]))
            outputs.append(int(row["GeneratedTokens"]))
    if not times:
        raise ValueError(f"{path}: no requests")
    start = times[0]
    offsets = np.array([(t - start).total_seconds() for t in times])
    return Trace(offsets, np.array(prompts, dtype=np.int64), np.array(outputs, dtype=np.int64))
