"""How many rows the model's projections compute on the CPU. A BLAS runs a product of a few
rows as matrix-vector products, one row at a time — each reading the whole weight matrix from
memory again — and a blocked matrix product, which reads it once, from some row count on. A
decode step's projections have one row per request, so a step of a few decodes can cost more
than a step of a few more. Measured on this project's CPU machine (one thread, the default
model, weights streamed from memory): the [49,152 x 576] LM head took 9.9 ms for 1 row, 24.2 ms
for 2, 35.1 ms for 3 and 21.6 ms for 4; decode steps took 54.9 ms for one request, 90.9 ms for
2, 113.0 ms for 3 and 80.9 ms for 4 (`docs/results/row-padding/`, `row_padding_bench`).

Warm-up times the LM head — the largest projection, never held in a cache, so it reads its
weights as every projection of a step does — at each row count up to `MAX_ROWS` (`measure`),
and every projection (`decoder.Linear`) pads its input up to the cheapest row count at or
above its own (`padded_rows`), with zero rows whose outputs it drops; a row's output does not
depend on the other rows. Each rank measures its own machine, so under tensor parallelism
(whose ranks must compute the same shapes) and on a GPU nothing is padded."""
import statistics
import time

import torch

MAX_ROWS = 8
# Pad only for a clear gain: timing noise must not move a step onto more rows.
MIN_GAIN = 0.85


def plan(times_s: list[float]) -> tuple[int, ...]:
    """`times_s[r - 1]`: a projection's time for r rows. Returns, for r = 1..len(times_s), the
    row count to compute r rows with: the cheapest count at or above r when it beats r's own
    time by MIN_GAIN, else r."""
    padded = []
    for rows in range(1, len(times_s) + 1):
        best = min(range(rows, len(times_s) + 1), key=lambda r: times_s[r - 1])
        padded.append(best if times_s[best - 1] < MIN_GAIN * times_s[rows - 1] else rows)
    return tuple(padded)


def padded_rows(table: tuple[int, ...], rows: int) -> int:
    """The row count `table` (from `plan`) computes `rows` rows with."""
    return table[rows - 1] if 0 < rows <= len(table) else rows


def measure(head, hidden_size: int, dtype: torch.dtype, device: torch.device, repeats: int = 5) -> tuple[int, ...]:
    """Times `head` ([rows, hidden] -> [rows, vocab]) at 1..MAX_ROWS rows on the CPU and returns
    the padding table (`plan`); () on any other device."""
    if device.type != "cpu":
        return ()
    return plan(head_times(head, hidden_size, dtype, device, repeats))


def head_times(head, hidden_size: int, dtype: torch.dtype, device: torch.device, repeats: int = 5) -> list[float]:
    """`head`'s median time (s) at 1..MAX_ROWS rows."""
    hidden = torch.zeros(MAX_ROWS, hidden_size, dtype=dtype, device=device)
    times = []
    with torch.inference_mode():
        for rows in range(1, MAX_ROWS + 1):
            head(hidden[:rows])  # first call: allocations, the BLAS's own set-up
            samples = []
            for _ in range(repeats):
                start = time.perf_counter()
                head(hidden[:rows])
                samples.append(time.perf_counter() - start)
            times.append(statistics.median(samples))
    return times
