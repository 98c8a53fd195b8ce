"""`bench compare`'s plan and summaries, without servers: the interleaved order, medians and
ranges over repetitions, pairwise differences, the printed table."""
import pytest

from superinfer.bench import compare, report
from superinfer.bench.runner import RunResult


def test_every_repetition_runs_every_policy_at_every_rate_in_a_rotated_order():
    slots = list(compare.interleaved(["a", "b", "c"], [2.0, 1.0], repeats=3, seed=10))
    assert [(s.repetition, s.seed, s.rate, s.policy) for s in slots[:6]] == [
        (0, 10, 1.0, "a"), (0, 10, 1.0, "b"), (0, 10, 1.0, "c"),
        (0, 10, 2.0, "a"), (0, 10, 2.0, "b"), (0, 10, 2.0, "c")]
    assert [s.policy for s in slots if s.repetition == 1 and s.rate == 1.0] == ["b", "c", "a"]
    assert [s.policy for s in slots if s.repetition == 2 and s.rate == 2.0] == ["c", "a", "b"]
    assert len(slots) == 18 and {s.seed for s in slots} == {10, 11, 12}
    # Each policy takes each place in the order once over three repetitions.
    for policy in "abc":
        places = [[s.policy for s in slots if s.repetition == k and s.rate == 1.0].index(policy) for k in range(3)]
        assert sorted(places) == [0, 1, 2]
    with pytest.raises(ValueError, match="--repeats"):
        list(compare.interleaved(["a"], [1.0], repeats=0, seed=0))


def run(series: str, repetition: int, ttft: float, both: float, p99: float | None = 1.0) -> RunResult:
    summary = {"attainment": {"ttft": ttft, "tbt": 1.0, "both": both},
               "ttft_s": {"p50": 0.5, "p99": p99}, "tbt_s": {"p50": 0.05, "p99": 0.1},
               "goodput_rps": both * 2, "throughput_tokens_per_s": 100.0 + repetition}
    return RunResult(series, 1.0, "measured", summary, [0.1 * (repetition + 1)], [0.05], repetition=repetition)


RESULTS = [run("fcfs", 0, 0.90, 0.80), run("rota", 0, 1.00, 0.90),
           run("fcfs", 1, 0.70, 0.70, None), run("rota", 1, 0.95, 0.95),
           run("fcfs", 2, 0.80, 0.60), run("rota", 2, 0.75, 0.60)]


def test_figures_are_medians_with_their_range():
    points = {p["series"]: p for p in compare.aggregate(RESULTS)}
    fcfs = points["fcfs"]["figures"]
    assert points["fcfs"]["repetitions"] == 3
    assert fcfs["ttft_attainment"] == {"median": 0.8, "min": 0.7, "max": 0.9, "n": 3, "values": [0.9, 0.7, 0.8]}
    # A figure a repetition could not measure (no request finished) is left out, not zero.
    assert fcfs["ttft_p99_s"]["n"] == 2 and fcfs["ttft_p99_s"]["median"] == 1.0


def test_policies_are_compared_pair_by_pair():
    pairs = compare.paired_differences(RESULTS)
    ttft = next(p for p in pairs if (p["a"], p["b"], p["figure"]) == ("rota", "fcfs", "ttft_attainment"))
    assert ttft["values"] == pytest.approx([0.10, 0.25, -0.05])
    assert ttft["median"] == pytest.approx(0.10) and ttft["min"] == pytest.approx(-0.05)
    text = report.paired_table(pairs, "ttft_attainment")
    # Each unordered pair once.
    assert text.count("fcfs − rota") + text.count("rota − fcfs") == 1
    assert "rate 1: fcfs − rota: -10 [-25–+5], n=3" in text


def test_the_table_shows_medians_and_ranges():
    text = report.spread_table(compare.aggregate(RESULTS))
    assert "3 interleaved repetitions" in text
    row = text.splitlines()[2]
    assert row.split()[0] == "1" and "80% [70–90]" in row and "95% [75–100]" in row


def test_classes_and_refusals_are_reported_when_the_runs_have_them():
    assert report.breakdowns(RESULTS) == "", "one class and no refusal: nothing more to print"
    with_classes = []
    for repetition, (high, low) in enumerate([(0.9, 0.3), (1.0, 0.2), (0.8, 0.4)]):
        r = run("rota", repetition, 0.5, 0.5)
        r.summary["by_priority"] = {"0": {"requests": 6, "attainment": {"ttft": high, "both": high},
                                          "request_max_gap_s": {"max": 0.2}},
                                    "1": {"requests": 14, "attainment": {"ttft": low, "both": low},
                                          "request_max_gap_s": {"max": 1.0 + repetition}}}
        with_classes.append(r)
    table = report.class_table(with_classes).splitlines()
    assert table[2].split()[:3] == ["1", "0", "6"] and "90% [80–100]" in table[2]
    assert table[2].split()[-1] == "0.20"
    assert table[3].split()[:3] == ["1", "1", "14"] and "30% [20–40]" in table[3]
    assert table[3].endswith("2.00 [1.00–3.00]")
    # Results written before the summary kept each class's longest gap: a dash.
    for r in with_classes:
        for cls in r.summary["by_priority"].values():
            del cls["request_max_gap_s"]
    assert report.class_table(with_classes).splitlines()[3].split()[-1] == "-"
    refused = run("rota", 0, 0.5, 0.5)
    refused.summary.update(requests=60, refused=23, refusal_s={"p99": 0.0021},
                           admitted_attainment={"ttft": 0.97, "both": 0.9})
    text = report.breakdowns([refused])
    assert "refused 23 of 60, refusal p99 2 ms; admitted meeting TTFT 97%, both 90%" in text


def test_plots_get_one_run_per_point_with_pooled_samples():
    merged = {r.series: r for r in compare.median_runs(RESULTS)}
    assert merged["fcfs"].summary["attainment"]["ttft"] == 0.8
    assert merged["fcfs"].ttft_s == pytest.approx([0.1, 0.2, 0.3])


def test_a_comparison_keeps_every_finished_run_when_a_later_one_fails(tmp_path, monkeypatch):
    # `bench compare` writes compare.json after every run: a server that dies, or a user's ^C,
    # an hour into a comparison loses only the run in progress.
    import json

    from superinfer.bench.outcomes import Slo
    from superinfer.cli import main

    def two_runs_then_a_failure(*args, on_run, **kwargs):
        slo = Slo(ttft_ms=1000.0, tbt_ms=100.0)
        on_run(RESULTS[:1], slo, None)
        on_run(RESULTS[:2], slo, None)
        raise RuntimeError("the fcfs server exited")

    monkeypatch.setattr(compare, "run_comparison", two_runs_then_a_failure)
    out = tmp_path / "compare"
    with pytest.raises(RuntimeError, match="server exited"):
        main(["bench", "compare", "--policies", "fcfs,rota", "--repeats", "3", "--rates", "1",
              "--num-requests", "4", "--out", str(out), "--no-progress"])
    document = json.loads((out / "compare.json").read_text())
    assert document["complete"] is False and document["runs_planned"] == 6
    assert [(r["series"], r["repetition"]) for r in document["runs"]] == [("fcfs", 0), ("rota", 0)]
    assert {p["series"] for p in document["aggregate"]} == {"fcfs", "rota"}
    assert report.read_json(out / "compare.json")[1].summary["attainment"]["ttft"] == 1.0
    assert not list(out.glob("*.tmp"))
