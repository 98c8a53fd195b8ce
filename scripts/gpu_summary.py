"""The short account of a scripts/gpu_run.sh run, printed from its work folder: one line per
step (status, seconds, why it failed or was skipped), the test counts, and the headline figures
of each benchmark that wrote its JSON. The full results stay in the run's archive.

    python scripts/gpu_summary.py WORK_DIR {gpu,dry}"""
import json
import pathlib
import sys
import xml.etree.ElementTree as tree


def steps(work: pathlib.Path) -> list[str]:
    lines = []
    for row in (work / "steps.tsv").read_text().splitlines():
        name, status, seconds, detail = (row.split("\t") + [""] * 4)[:4]
        lines.append(f"{name:<16} {status:<8} {seconds:>4}s  {detail}".rstrip())
    return lines


def tests(work: pathlib.Path, name: str) -> str | None:
    path = work / f"{name}.xml"
    if not path.exists():
        return None
    suite = tree.parse(path).getroot()
    suite = suite if suite.tag == "testsuite" else suite[0]
    counts = {key: int(suite.get(key, 0)) for key in ("tests", "failures", "errors", "skipped")}
    passed = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    return (f"{name}: {passed} passed, {counts['failures']} failed, {counts['errors']} errors, "
            f"{counts['skipped']} skipped")


def load(path: pathlib.Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def attention(report: dict) -> list[str]:
    lines = [f"attention ({report['device']}, {report['dtype']}): sdpa / triton, median [range]"]
    for row in report["results"]:
        lines.append(f"  batch {row['batch']:4d} context {row['context']:5d}: triton {row['triton_ms']:.3f} ms, "
                     f"sdpa {row['sdpa_ms']:.3f} ms, {row['ratio_median']:.2f} [{row['ratio_min']:.2f}-"
                     f"{row['ratio_max']:.2f}], {row['triton_kv_gb_per_s']:.0f} GB/s")
    return lines


def decode(name: str, report: dict) -> list[str]:
    graphs = report.get("cuda_graphs")
    lines = [f"{name} ({report['device']}, {report['dtype']}, {report['context_tokens']}-token contexts, "
             f"graphs {graphs['batch_sizes'] if graphs else 'off'}): shard vs transformers, median [range]"]
    for batch, figures in report["decode"].items():
        ratio = figures["ratio"]
        line = (f"  batch {batch}: {figures['shard_tokens_per_s']['median']:.1f} tok/s vs "
                f"{figures['transformers_tokens_per_s']['median']:.1f}, {ratio['median']:.2f}x "
                f"[{ratio['min']:.2f}-{ratio['max']:.2f}]")
        if "roofline" in report:
            roof, idle = report["roofline"][batch], report["gpu_idle"][batch]
            line += (f", step {roof['measured_step_ms']:.2f} ms vs roofline {roof['roofline_step_ms']:.2f} ms, "
                     f"GPU idle {100 * idle['idle_share']:.0f}%")
        lines.append(line)
    prefill = report["prefill"]["ratio"]
    lines.append(f"  prefill {report['context_tokens']} tokens: {prefill['median']:.2f}x "
                 f"[{prefill['min']:.2f}-{prefill['max']:.2f}]")
    return lines


def compare(report: dict) -> list[str]:
    lines = [f"compare ({'complete' if report.get('complete') else 'incomplete'}, "
             f"{len(report.get('runs', []))} of {report.get('runs_planned')} runs): policy, rate, attainment"]
    for run in report.get("runs", []):
        summary = run["summary"]
        attainment = summary.get("attainment", {})
        lines.append(f"  {run['series']:<10} rate {run.get('rate')}: TTFT {attainment.get('ttft')}, TBT "
                     f"{attainment.get('tbt')}, both {attainment.get('both')}; {summary.get('completed')} completed, "
                     f"{summary.get('failed')} failed, moves {summary.get('kv_moves')}")
    return lines


def main(argv: list[str]) -> int:
    work, mode = pathlib.Path(argv[1]), argv[2]
    lines = [f"gpu_run ({mode})", *steps(work)]
    lines += [line for line in (tests(work, "kv_tests"), tests(work, "shard_tests")) if line]
    # Each figure only where its step wrote a complete JSON; on the CPU (dry) they mean nothing.
    if (report := load(work / "attention_bench.json")) is not None:
        lines += attention(report)
    for name in ("decode_graphs", "decode_eager"):
        if (report := load(work / f"{name}.json")) is not None:
            lines += decode(name, report)
    if (report := load(work / "compare" / "compare.json")) is not None:
        lines += compare(report)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
