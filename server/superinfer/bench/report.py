"""Reports: the JSON file of a bench, compare or simulate run, and the text table printed at
the end, one row per rate and one column group per series (policy), side by side."""
import json
import statistics
from pathlib import Path

from superinfer.bench.runner import RunResult


def write_json(path: Path, header: dict, results: list[RunResult]) -> None:
    """Writes the report whole or not at all (a temporary file renamed over `path`), so a
    reader, or a run interrupted while writing, never sees half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    document = dict(header)
    document["runs"] = [r.to_json() for r in results]
    partial = path.with_name(path.name + ".tmp")
    partial.write_text(json.dumps(document, indent=1, allow_nan=False))
    partial.replace(path)


def read_json(path: Path) -> list[RunResult]:
    """The runs of a report written by `write_json` (per-request outcomes are not restored)."""
    document = json.loads(Path(path).read_text())
    return [
        RunResult(run["series"], run["rate"], run["label"], run["summary"], run["ttft_s"], run["gaps_s"],
                  repetition=run.get("repetition", 0), seed=run.get("seed"), position=run.get("position"))
        for run in document["runs"]
    ]


def _ms(value) -> str:
    return "-" if value is None else f"{value * 1e3:.0f}"


def _cells(summary: dict) -> list[str]:
    attainment = summary["attainment"]
    return [
        f"{attainment['ttft'] * 100:.0f}%",
        f"{attainment['tbt'] * 100:.0f}%",
        f"{attainment['both'] * 100:.0f}%",
        _ms(summary["ttft_s"]["p50"]),
        _ms(summary["ttft_s"]["p99"]),
        _ms(summary["tbt_s"]["p99"]),
        _ms(summary["tbt_s"].get("max")),
        f"{summary['goodput_rps']:.2f}",
        f"{summary['throughput_tokens_per_s']:.0f}",
    ]


COLUMNS = ["TTFT ok", "TBT ok", "both", "TTFT p50", "TTFT p99", "gap p99", "gap max", "goodput", "tok/s"]


def table(results: list[RunResult]) -> str:
    """Rows: rates. Column groups: series in first-seen order. Times in ms, goodput in req/s."""
    series = list(dict.fromkeys(r.series for r in results))
    rates = sorted({r.rate for r in results})
    by_key = {(r.series, r.rate): r for r in results}
    label = results[0].label if results else "measured"
    head = ["rate"] + [f"{s}:{c}" for s in series for c in COLUMNS]
    rows = [head]
    for rate in rates:
        row = [f"{rate:g}"]
        for name in series:
            found = by_key.get((name, rate))
            row += _cells(found.summary) if found else ["-"] * len(COLUMNS)
        rows.append(row)
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = [f"[{label}] attainment = share of requests meeting the objective (TBT: its percentile and the "
             "stall bound); gaps between tokens over every request; times in ms"]
    lines += ["  ".join(cell.rjust(width) for cell, width in zip(row, widths)) for row in rows]
    return "\n".join(lines)


def markdown_table(results: list[RunResult], columns: tuple[str, ...] = ("TTFT ok", "both", "TTFT p99", "goodput")) -> str:
    """The same figures as `table`, as a Markdown table (for write-ups)."""
    series = list(dict.fromkeys(r.series for r in results))
    rates = sorted({r.rate for r in results})
    by_key = {(r.series, r.rate): r for r in results}
    picks = [COLUMNS.index(c) for c in columns]
    head = "| rate (req/s) | " + " | ".join(f"{s} {c}" for s in series for c in columns) + " |"
    lines = [head, "|" + "---|" * (1 + len(series) * len(columns))]
    for rate in rates:
        cells = []
        for name in series:
            found = by_key.get((name, rate))
            values = _cells(found.summary) if found else ["-"] * len(COLUMNS)
            cells += [values[i] for i in picks]
        lines.append(f"| {rate:g} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _share(value) -> str:
    return "-" if value is None else f"{value * 100:.0f}"


def _spread_cell(spread: dict, unit=_share, suffix: str = "%") -> str:
    """"median [min–max]" (the range only when the repetitions differ)."""
    if spread["median"] is None:
        return "-"
    median, low, high = unit(spread["median"]), unit(spread["min"]), unit(spread["max"])
    return f"{median}{suffix}" if low == high else f"{median}{suffix} [{low}–{high}]"


SPREAD_COLUMNS = (("TTFT ok", "ttft_attainment", _share, "%"), ("TBT ok", "tbt_attainment", _share, "%"),
                  ("both", "both_attainment", _share, "%"), ("TTFT p99 ms", "ttft_p99_s", _ms, ""),
                  ("gap p99 ms", "tbt_p99_s", _ms, ""), ("gap max ms", "gap_max_s", _ms, ""),
                  ("goodput", "goodput_rps", lambda v: f"{v:.2f}", ""))


def spread_table(points: list[dict], source: str | None = None) -> str:
    """`compare.aggregate`'s points: rows are rates, column groups policies; each cell the median
    over the repetitions with its range. `source`: what the repetitions are (default: measured,
    interleaved)."""
    series = list(dict.fromkeys(p["series"] for p in points))
    rates = sorted({p["rate"] for p in points})
    by_key = {(p["series"], p["rate"]): p for p in points}
    repetitions = max((p["repetitions"] for p in points), default=0)
    head = ["rate"] + [f"{s}:{c[0]}" for s in series for c in SPREAD_COLUMNS]
    rows = [head]
    for rate in rates:
        row = [f"{rate:g}"]
        for name in series:
            point = by_key.get((name, rate))
            row += ([_spread_cell(point["figures"][key], unit, suffix) for _, key, unit, suffix in SPREAD_COLUMNS]
                    if point else ["-"] * len(SPREAD_COLUMNS))
        rows.append(row)
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    source = source or f"measured, {repetitions} interleaved repetitions"
    lines = [f"[{source}] median [min–max] over repetitions; times in ms"]
    lines += ["  ".join(cell.rjust(width) for cell, width in zip(row, widths)) for row in rows]
    return "\n".join(lines)


def _over_repetitions(values: list[float], unit=_share, suffix: str = "%") -> str:
    return _spread_cell({"median": statistics.median(values), "min": min(values), "max": max(values)}, unit, suffix)


def class_table(results: list[RunResult]) -> str:
    """Per priority class, when the runs mix classes: each policy's first-token and joint
    attainment within the class and the longest gap of any of its requests (s), median
    [min–max] over the repetitions. Empty otherwise."""
    classes = sorted({int(c) for r in results for c in r.summary.get("by_priority", {})})
    if len(classes) < 2:
        return ""
    series = list(dict.fromkeys(r.series for r in results))
    rates = sorted({r.rate for r in results})
    head = ["rate", "class", "requests"] + [f"{s}:{c}" for s in series for c in ("TTFT ok", "both", "longest gap s")]
    rows = [head]
    for rate in rates:
        for cls in classes:
            requests = next((r.summary["by_priority"][str(cls)]["requests"] for r in results
                             if r.rate == rate and str(cls) in r.summary.get("by_priority", {})), 0)
            row = [f"{rate:g}", str(cls), str(requests)]
            for name in series:
                classes_of = [r.summary["by_priority"][str(cls)] for r in results
                              if r.series == name and r.rate == rate and str(cls) in r.summary.get("by_priority", {})]
                runs = [c["attainment"] for c in classes_of]
                row += ([_over_repetitions([a[key] for a in runs]) for key in ("ttft", "both")] if runs
                        else ["-", "-"])
                # Absent from results written before the summary kept it.
                longest = [c["request_max_gap_s"]["max"] for c in classes_of
                           if c.get("request_max_gap_s", {}).get("max") is not None]
                row.append(_over_repetitions(longest, lambda v: f"{v:.2f}", "") if longest else "-")
            rows.append(row)
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = ["by priority class (lower is served first): attainment within the class and its longest gap, "
             "median [min–max] over repetitions"]
    lines += ["  ".join(cell.rjust(width) for cell, width in zip(row, widths)) for row in rows]
    return "\n".join(lines)


def admission_lines(results: list[RunResult]) -> str:
    """For runs where the server refused requests (`--admission slo`): how many, how fast, and
    what the admitted ones got. Empty when nothing was refused."""
    lines = []
    for r in sorted((r for r in results if r.summary.get("refused")), key=lambda r: (r.series, r.rate, r.repetition)):
        admitted = r.summary["admitted_attainment"]
        refusal = r.summary.get("refusal_s", {})
        lines.append(f"{r.series} @ {r.rate:g} req/s (repetition {r.repetition}): refused {r.summary['refused']} of "
                     f"{r.summary['requests']}, refusal p99 {_ms(refusal.get('p99'))} ms; admitted meeting TTFT "
                     f"{admitted['ttft'] * 100:.0f}%, both {admitted['both'] * 100:.0f}%; refusal p50 "
                     f"{_ms(refusal.get('p50'))} ms; goodput {r.summary['goodput_rps']:.2f} req/s")
    return "\n".join(["admission (refused requests answered at once; attainment of the admitted)", *lines] if lines else [])


def breakdowns(results: list[RunResult]) -> str:
    """The per-class and admission figures, where the runs have them (printed after the table)."""
    return "\n".join(part for part in (class_table(results), admission_lines(results)) if part)


def paired_table(pairs: list[dict], figure: str = "ttft_attainment") -> str:
    """`compare.paired_differences` for one figure: a − b per repetition pair (shares in
    percentage points, rates in req/s)."""
    share = figure.endswith("attainment")
    unit = "percentage points" if share else "req/s"
    lines = [f"paired differences of {figure} (a − b, same seed and rate), {unit}: median [min–max], n"]
    seen = set()
    for pair in pairs:
        key = (pair["rate"], frozenset((pair["a"], pair["b"])))
        if pair["figure"] != figure or key in seen or pair["median"] is None:
            continue
        seen.add(key)
        cell = _spread_cell(pair, (lambda v: f"{v * 100:+.0f}") if share else (lambda v: f"{v:+.3f}"), "")
        lines.append(f"  rate {pair['rate']:g}: {pair['a']} − {pair['b']}: {cell}, n={pair['n']}")
    return "\n".join(lines)
