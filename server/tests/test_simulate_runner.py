"""`superinfer simulate` through the real Rust simulator (the built `superinfer._router`):
closed form on a lone request, determinism, derived profiles, and the command's report."""
import json
from pathlib import Path
from dataclasses import asdict, replace

import pytest

from superinfer.bench.outcomes import Slo
from superinfer.bench.workload import WorkloadRequest, WorkloadConfig, requests_for
from superinfer.cli import main
from superinfer.simulate.profiles import MODELS, Profile, derived, resolve
from superinfer.simulate.runner import SimOptions, run_raw, simulate, unloaded_latency

COST = {
    "step_base_s": 0.01, "per_prefill_token_s": 0.001, "per_decode_request_s": 0.002, "per_context_token_s": 0.0,
    "swap_out_bytes_per_s": 1e9, "swap_in_bytes_per_s": 1e9, "transfer_overhead_s": 1e-4, "duplex": True,
}


def linear_profile(device_blocks: int = 256) -> Profile:
    link = {"out_bytes_per_s": 1e9, "in_bytes_per_s": 1e9, "overhead_s": 1e-4, "duplex": True}
    return Profile("linear test machine", {"kind": "linear", **COST}, link, COST, 16, 1 << 16, device_blocks, 4096, 512, 64)


def write_measured(tmp_path) -> str:
    path = tmp_path / "measured.json"
    path.write_text(json.dumps({"cost_model": COST, "block_size": 16, "block_bytes": 65536,
                                "num_device_blocks": 256, "num_host_blocks": 4096, "max_batch_tokens": 512}))
    return str(path)


@pytest.mark.parametrize("policy", ["fcfs", "recompute", "swap", "rotasched"])
def test_lone_request_matches_the_closed_form(policy):
    # TTFT = one prefill step of 100 tokens; end-to-end adds one decode step per further token.
    prefill, decode = 0.01 + 100 * 0.001, 0.01 + 0.002
    result = simulate(linear_profile(), [WorkloadRequest(0, 1.0, 100, 6, True)], SimOptions(policy, Slo(1000, 100)), policy, 1.0)
    (outcome,) = result.outcomes
    assert outcome.ok and outcome.output_tokens == 6
    assert outcome.ttft_s == pytest.approx(prefill, abs=1e-9)
    assert outcome.e2e_s == pytest.approx(prefill + 5 * decode, abs=1e-9)
    assert result.summary["tbt_s"]["p50"] == pytest.approx(decode, abs=1e-9)
    assert result.label == "simulated"


def test_same_seed_same_result():
    specs = requests_for(WorkloadConfig(arrival="gamma", burstiness=0.5, rate=30.0, num_requests=60, prompt_tokens=200,
                                output_tokens=30, seed=3))
    options = SimOptions("swap", Slo(500, 60))
    first, second = run_raw(linear_profile(64), specs, options), run_raw(linear_profile(64), specs, options)
    first.pop("wall_s"), second.pop("wall_s")
    assert first == second
    other = requests_for(WorkloadConfig(arrival="gamma", burstiness=0.5, rate=30.0, num_requests=60, prompt_tokens=200,
                                output_tokens=30, seed=4))
    assert run_raw(linear_profile(64), other, options)["requests"] != first["requests"]


def test_unloaded_latency_from_a_measured_profile(tmp_path):
    profile = resolve(f"measured:{write_measured(tmp_path)}")
    unloaded = unloaded_latency(profile, 100, 8, "fcfs")
    assert unloaded["ttft_s"] == pytest.approx(0.11) and unloaded["tbt_s"] == pytest.approx(0.012)


def test_derived_profiles_follow_the_hardware():
    gh200 = derived("gh200", "llama-3-8b")
    # Llama-3-8B KV: 32 layers × 8 heads × 128 × K,V × bf16 = 128 KiB per token, 2 MiB per block.
    assert MODELS["llama-3-8b"].kv_bytes_per_token == 131072 and gh200.block_bytes == 2 << 20
    # A lone decode is memory-bound: ~16 GB of weights at 80% of 4 TB/s ≈ 5 ms (+ overhead).
    base = gh200.cost_model["step_base_s"]
    assert 0.004 < base < 0.009
    assert gh200.link["out_bytes_per_s"] == 450e9 and gh200.link["duplex"]
    h200 = derived("h200-pcie", "llama-3-8b")
    assert h200.link["in_bytes_per_s"] == 55e9 and h200.num_device_blocks > gh200.num_device_blocks
    with pytest.raises(ValueError, match="does not fit"):
        derived("gh200", "mixtral-8x7b")
    assert derived("gh200-144g", "mixtral-8x7b").num_device_blocks > 0


def test_a_derived_profiles_belief_is_the_warm_ups_token_curve():
    from superinfer import _router

    gh200 = derived("gh200", "llama-3-8b")
    assert gh200.cost_model["token_curve"]["tokens_s"], "the belief has a token curve, as a warm-up measures"
    shapes = [(0, batch, batch * context) for batch in (1, 3, 20, 100, 200) for context in (300, 1500)]
    shapes += [(prefill, 0, prefill) for prefill in (50, 700, 3000, 6000)] + [(600, 40, 600 + 40 * 900)]
    truth = _router.step_time(json.dumps(gh200.step_time), shapes)

    def worst(cost_model: dict) -> float:
        believed = _router.step_time(json.dumps({"kind": "linear", **cost_model}), shapes)
        return max(abs(b - t) / t for b, t in zip(believed, truth))

    curve, linear = worst(gh200.cost_model), worst({**gh200.cost_model, "token_curve": {}})
    assert curve < 0.08 and curve < linear, (curve, linear)


def test_simulate_command_writes_a_simulated_report(tmp_path):
    out = tmp_path / "sim"
    code = main(["simulate", "--profile", "gh200:llama-3-8b", "--policies", "fcfs,rotasched", "--rates", "20,40",
                 "--num-requests", "80", "--prompt-tokens", "300", "--output-tokens", "50",
                 "--device-kv-blocks", "400", "--out", str(out), "--no-progress"])
    assert code == 0
    document = json.loads((out / "simulate.json").read_text())
    assert document["label"] == "simulated" and document["profile"]["num_device_blocks"] == 400
    assert {(run["series"], run["rate"]) for run in document["runs"]} == {
        ("fcfs", 20.0), ("fcfs", 40.0), ("rotasched", 20.0), ("rotasched", 40.0)}
    assert all(run["label"] == "simulated" and run["summary"]["requests"] == 80 for run in document["runs"])
    for name in ("attainment_vs_rate", "p99_ttft_vs_rate", "cdf_ttft", "cdf_tbt"):
        assert (out / f"simulate_{name}.png").stat().st_size > 1000


def test_profile_overrides_and_bad_specs():
    assert replace(linear_profile(), num_device_blocks=7).num_device_blocks == 7
    with pytest.raises(ValueError):
        resolve("gh200")
    with pytest.raises(ValueError):
        resolve("tpu:llama-3-8b")


def test_charges_lengthen_the_steps_they_apply_to():
    from dataclasses import replace

    policy = "fcfs"
    spec = [WorkloadRequest(0, 1.0, 100, 6, True)]
    plain = simulate(linear_profile(), spec, SimOptions(policy, Slo(1000, 100)), policy, 1.0)
    charged = simulate(replace(linear_profile(), charges={"per_step_s": 0.004}), spec,
                       SimOptions(policy, Slo(1000, 100)), policy, 1.0)
    # The prefill step (the first token) pays the charge once; the whole request once per step.
    assert charged.outcomes[0].ttft_s == pytest.approx(plain.outcomes[0].ttft_s + 0.004, abs=1e-9)
    steps = charged.summary["simulator"]["steps"]
    assert charged.summary["simulator"]["charged"]["per_step_s"] == pytest.approx(0.004 * steps)
    with pytest.raises(ValueError, match="transfer stall"):
        simulate(replace(linear_profile(), charges={"transfer_stall": 2.0}), spec,
                 SimOptions(policy, Slo(1000, 100)), policy, 1.0)


def test_validation_counts_non_trivial_figures_within_fifteen_percent():
    from superinfer.simulate.validate import tally, trivial

    assert trivial("attainment.ttft", 1.0, 1.0) and not trivial("attainment.ttft", 0.9, 1.0)
    assert not trivial("ttft_s.p50", 1.0, 1.0)
    report = [
        {"profile": "warm-up", "figures": {"attainment.ttft": (1.0, 1.0, 0.0), "ttft_s.p50": (0.2, 0.22, 0.10),
                                          "ttft_s.p99": (0.5, 0.7, 0.40), "attainment.tbt": (0.5, 0.0, None)}},
        {"profile": "unloaded", "figures": {"ttft_s.p50": (0.2, 0.19, -0.05)}},
    ]
    assert tally(report) == {"warm-up": {"figures": 4, "trivial": 1, "within": 1, "missing": 1},
                             "unloaded": {"figures": 1, "trivial": 0, "within": 1, "missing": 0}}


def test_kv_demand_counts_the_requests_in_the_system_against_the_pool():
    from superinfer.simulate.demand import demand

    # 100 + 60 tokens = 10 blocks each. One request at t=0; three together at t=10 (each
    # lasting ~0.8 s): the peak holds 30 blocks, 3x a 10-block pool, and most of the window
    # holds nothing.
    specs = [WorkloadRequest(0, 0.0, 100, 60, True)] + [WorkloadRequest(i, 10.0, 100, 60, True) for i in (1, 2, 3)]
    found = demand(linear_profile(device_blocks=10), specs, device_blocks=10)
    assert found["peak"] == pytest.approx(3.0)
    assert found["p90"] == 0.0 and 0.0 < found["mean"] < 0.2
    assert found["window_s"] == pytest.approx(10.0)
    # The pool it is measured against, not the profile's own, is the unit.
    assert demand(linear_profile(device_blocks=10), specs, device_blocks=30)["peak"] == pytest.approx(1.0)


def test_validate_analyses_an_existing_bench_compare_directory(tmp_path, monkeypatch):
    """`--measured DIR` reads a `bench compare` output (workload, seeds, objectives and unloaded
    latencies from compare.json, each server's fit, pools and limits from warmup-<policy>.json,
    a trace workload's trace from --trace) and launches nothing. Its "measured" runs here are the
    simulator's own on the warm-up fit, so that profile must match them exactly."""
    from superinfer.bench import report
    from superinfer.bench.prompts import LengthLimits
    from superinfer.bench.trace import load_trace
    from superinfer.simulate import validate

    trace = tmp_path / "trace.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"2023-11-16 18:00:{i * 2:02d}.0000000,{40 + i},{30 + i}\n" for i in range(12)))
    measured = tmp_path / "compare"
    measured.mkdir()
    warmup = {"cost_model": COST, "block_size": 16, "block_bytes": 65536, "num_device_blocks": 6,
              "num_host_blocks": 64, "max_batch_tokens": 256, "max_batch_requests": 8}
    config = WorkloadConfig(arrival="trace", lengths="trace", num_requests=10, limits=LengthLimits(48, 160),
                            ignore_eos=True, seed=0)
    slo = Slo(300, 50)
    runs = []
    for policy in ("fcfs", "rotasched"):
        (measured / f"warmup-{policy}.json").write_text(json.dumps(warmup))
        fitted = resolve(f"measured:{measured / f'warmup-{policy}.json'}")
        for repetition, rate in ((0, 2.0), (1, 2.0), (0, 4.0)):
            specs = requests_for(replace(config, rate=rate, seed=repetition), load_trace(trace))
            run = simulate(fitted, specs, SimOptions(policy, slo), policy, rate)
            run.repetition, run.seed = repetition, repetition
            runs.append(run)
    # Unloaded: a 20 ms gap (8 ms above the fit's lone decode step) and 80 ms to the first token.
    header = {"workload": asdict(config), "rates": [2.0, 4.0], "repeats": 2,
              "slo": {"ttft_ms": 300, "tbt_ms": 50, "tbt_percentile": 90.0},
              "unloaded": {"requests": 3, "ttft_s": 0.08, "tbt_s": 0.02}}
    report.write_json(measured / "compare.json", header, runs)
    monkeypatch.setattr(validate, "superinfer_main", lambda argv: pytest.fail(f"launched {argv}"))

    out = tmp_path / "validation"
    assert validate.main(["--measured", str(measured), "--out", str(out), "--trace", str(trace),
                          "--step-overhead-from-unloaded"]) == 0
    document = json.loads((out / "validation.json").read_text())
    assert len(document["runs"]) == 2 * 6
    # Calibration prompts are the trace's first three (40, 41, 42 tokens): median context 41 + 31/2.
    assert document["charges"]["fcfs"]["warm-up"]["per_step_s"] == pytest.approx(0.02 - 0.012)
    assert "per_step_s" not in document["charges"]["fcfs"]["unloaded"]

    assert validate.main(["--measured", str(measured), "--out", str(out), "--trace", str(trace)]) == 0
    document = json.loads((out / "validation.json").read_text())
    for entry in document["runs"]:
        if entry["profile"] == "warm-up":
            assert all(error in (0.0, None) for _m, _s, error in entry["figures"].values()), entry
    assert document["tally"]["warm-up"]["figures"] == 6 * 5
    assert document["tally_by_policy"]["rotasched"]["warm-up"]["figures"] == 3 * 5

    # Another machine's profile as a third source (here the same fit with the server's pools,
    # so it matches too), and the suite's verdict per rate and repetition for every source.
    assert validate.main(["--measured", str(measured), "--out", str(out), "--trace", str(trace),
                          "--profile", f"measured:{measured / 'warmup-fcfs.json'}"]) == 0
    document = json.loads((out / "validation.json").read_text())
    assert document["tally"]["profile"] == document["tally"]["warm-up"]
    paired = {(e["rate"], e["source"]): e["differences"] for e in document["paired_joint"]}
    assert len(paired[(2.0, "measured")]) == 2 and len(paired[(4.0, "measured")]) == 1
    assert paired[(2.0, "measured")] == paired[(2.0, "warm-up")] == paired[(2.0, "profile")]

    # The unloaded model spreads the first token's cost over the calibration prompts, not over
    # the workload's unused fixed prompt_tokens (128), and takes the server's pools and limits.
    calibration = requests_for(replace(config, rate=2.0), load_trace(trace))[:3]
    profile = validate.unloaded_profile(measured / "compare.json", calibration, fitted)
    assert profile.cost_model["per_prefill_token_s"] == pytest.approx((0.08 - 0.02) / 41)
    assert (profile.num_device_blocks, profile.max_batch_tokens, profile.max_batch_requests) == (6, 256, 8)


def test_paired_joint_is_rotasched_against_the_best_baseline_of_each_repetition():
    from superinfer.simulate.validate import paired_joint

    def entry(policy: str, repetition: int, measured: float, simulated: float) -> dict:
        return {"policy": policy, "rate": 1.0, "repetition": repetition, "profile": "warm-up",
                "figures": {"attainment.both": (measured, simulated, None)}}

    report = [entry("swap", 0, 0.3, 0.6), entry("recompute", 0, 0.4, 0.2), entry("rotasched", 0, 0.5, 0.5),
              entry("swap", 1, 0.2, 0.2), entry("rotasched", 1, 0.1, 0.3)]
    rows = {e["source"]: e["differences"] for e in paired_joint(report)}
    assert rows["measured"] == pytest.approx([0.1, -0.1])
    assert rows["warm-up"] == pytest.approx([-0.1, 0.1])


def test_a_shared_machine_is_the_median_of_the_servers_warm_ups():
    from superinfer import _router
    from superinfer.simulate.validate import shared_machine

    def warm_up(scale: float, tokens_s: list[float]) -> dict:
        return {"kind": "linear", **COST, "step_base_s": COST["step_base_s"] * scale,
                "token_curve": {"tokens_s": tokens_s, "decodes_s": [0.001 * scale], "per_context_token_s": 1e-6 * scale}}

    machine = shared_machine([warm_up(1.0, [0.010, 0.020, 0.030]), warm_up(1.5, [0.012, 0.018]),
                              warm_up(0.5, [0.011, 0.025, 0.040])])
    assert machine["step_base_s"] == pytest.approx(COST["step_base_s"])
    # Each knot the median over the servers, as far as every curve reaches.
    assert machine["token_curve"] == {"tokens_s": [0.011, 0.020], "decodes_s": [0.001], "per_context_token_s": 1e-6}
    assert machine["swap_out_bytes_per_s"] == COST["swap_out_bytes_per_s"]
    assert _router.step_time(json.dumps(machine), [(2, 0, 2)])[0] == pytest.approx(0.020 + 2e-6)
    # A server without a curve leaves the machine linear.
    assert "token_curve" not in shared_machine([warm_up(1.0, [0.01, 0.02]), {"kind": "linear", **COST}])


def test_the_headline_over_several_seeds_reports_each_figure_with_its_range(tmp_path):
    from superinfer.simulate import headline

    assert headline.main(["--out", str(tmp_path), "--rates", "40", "--duration", "4", "--policies", "fcfs,rotasched",
                          "--seeds", "1,2", "--no-charge-planning"]) == 0
    for seed in (1, 2):
        assert (tmp_path / f"seed-{seed}" / "simulate.json").exists()
    text = (tmp_path / "headline.md").read_text()
    assert "simulated, 2 seeds (1,2)" in text and "fcfs − rotasched: " in text
    # The two seeds are different workloads: their runs differ.
    first, second = (json.loads((tmp_path / f"seed-{s}" / "simulate.json").read_text()) for s in (1, 2))
    assert first["runs"][0]["ttft_s"] != second["runs"][0]["ttft_s"]


def test_a_returned_request_is_not_rotated_out_before_its_next_token():
    """A workload where a parked decode's stall bound made it return while the overload fallback
    evicted it again at once: 1.5 million round trips in 3,000 simulated seconds and 4 of 30
    requests done. A returned request now keeps the device until it has computed a token."""
    from dataclasses import replace

    from superinfer.bench.workload import WorkloadConfig, requests_for
    from superinfer.simulate.runner import SimOptions, run_raw

    warmup = Path(__file__).resolve().parents[2] / "docs/results/suite/warmup-cpu.json"
    profile = resolve(f"measured:{warmup}")
    profile = replace(profile, num_device_blocks=96, num_host_blocks=512,
                      charges={**profile.charges, "transfer_stall": 1.0})
    config = WorkloadConfig(arrival="gamma", rate=0.6, burstiness=0.3, num_requests=30, lengths="fixed",
                            prompt_tokens=512, output_tokens=16, ignore_eos=True, seed=3)
    unloaded = unloaded_latency(profile, 512, 16, "fcfs")
    slo = Slo(unloaded["ttft_s"] * 5e3, unloaded["tbt_s"] * 5e3)
    raw = run_raw(profile, requests_for(config), SimOptions("rotasched", slo, max_sim_time_s=3000))
    assert sum(raw["requests"]["finished"]) == 30
    assert raw["scheduler"]["rotations_out"] < 60


def test_the_step_log_follows_a_request_rotated_out_and_back(tmp_path, capsys):
    from superinfer.simulate import step_log

    out = tmp_path / "sim"
    code = main(["simulate", "--profile", f"measured:{write_measured(tmp_path)}", "--policies", "swap",
                 "--rates", "50", "--num-requests", "40", "--prompt-tokens", "200", "--output-tokens", "40",
                 "--device-kv-blocks", "48", "--ignore-eos", "--out", str(out), "--no-progress", "--step-log"])
    assert code == 0
    (run,) = json.loads((out / "simulate.json").read_text())["runs"]
    steps = step_log.load(out / "step-log-swap-50.jsonl")
    # Every computing step is a line (plans that only move KV are lines too).
    assert sum(1 for s in steps if s["scheduled"]) == run["summary"]["simulator"]["steps"]
    assert all(set(s) == {"time", "scheduled", "rotate_out", "rotate_in", "recomputed", "free_device_blocks",
                          "requests", "blocks"} for s in steps)
    # Blocks per request, in the requests' order: one on host holds no device block, one running
    # holds its whole table on the device; the free ones are within the pool.
    for s in steps:
        assert len(s["blocks"]) == len(s["requests"]) and 0 <= s["free_device_blocks"] <= 48
        for (_, phase, _), (device, table) in zip(s["requests"], s["blocks"]):
            assert (phase != "rotated" or device == 0) and (phase != "running" or device == table > 0)
    seen = step_log.occupancy(steps)
    assert seen["steps"] > 0 and seen["rows"] >= 1 and 0 < seen["computing"] <= 48 and seen["free"] <= 48
    rotated = next(rid for s in steps for rid in s["rotate_out"])
    phases = [line.split("\n")[0] for line in step_log.follow(steps, rotated)]
    order = [p.split(": ")[1].split(" ")[0] for p in phases]
    # A record is the state once its step was planned: one admitted at once is never seen waiting.
    assert order[0] in ("waiting", "running")
    # Out, then back in (one plan may rotate it in as soon as its copy out is acknowledged, so
    # it need not be seen resting on host), then running again until it finishes.
    out_at = order.index("rotating_out")
    assert "rotating_in" in order[out_at:] and order[-2:] == ["running", "gone"]
    assert step_log.main([str(out / "step-log-swap-50.jsonl"), "--request", str(rotated)]) == 0
    assert f"request {rotated}: rotating_out" in capsys.readouterr().out
    assert step_log.follow(steps, 10_000) == []


def test_the_step_log_lists_the_gaps_past_a_bound_with_who_held_the_memory():
    from superinfer.simulate import step_log

    def step(time, scheduled, requests):
        return {"time": time, "scheduled": scheduled, "rotate_out": [], "rotate_in": [], "recomputed": [],
                "requests": requests}

    # Request 1 computes at 0 and 0.1, is rotated out while 2 (lost) runs, and computes again at
    # 2.0: one gap of 1.9 s. Request 2's own gaps are 0.1 s.
    steps = [step(0.0, [1], [(1, "running", False)]),
             step(0.1, [1, 2], [(1, "running", False), (2, "running", True)])]
    steps += [step(0.1 * k, [2], [(1, "rotated", False), (2, "running", True)]) for k in range(2, 20)]
    steps.append(step(2.0, [1, 2], [(1, "running", False), (2, "running", True)]))
    (gap,) = step_log.gaps_over(steps, 1.0)
    assert gap["request"] == 1 and abs(gap["gap_s"] - 1.9) < 1e-9 and not gap["lost"]
    # The step one bound into the gap shows who had the memory then.
    assert abs(gap["then"]["time"] - 1.1) < 1e-9
    assert (2, "running", True) in gap["then"]["requests"]
    assert step_log.gaps_over(steps, 2.0) == []


def test_time_share_reaches_the_scheduler_and_rotates_within_steps(tmp_path):
    """`superinfer simulate --time-share [BOOL]` (the router's --time-share, on by default): under
    overload RotaSched brings requests back computing in the step that copies them in and sends
    them off after computing in their last step — both visible in the step log — and keeps every
    gap within the stall bound plus a step, where `--time-share false` (overload served as swap
    serves it) on the same workload does not. The default is the scheduler's own."""
    from superinfer.simulate import step_log

    profile = Path(__file__).resolve().parents[2] / "docs/results/suite/warmup-cpu-pinned.json"

    def run(*extra: str):
        out = tmp_path / "-".join(("run", *extra))
        code = main(["simulate", "--profile", f"measured:{profile}", "--arrival", "trace",
                     "--lengths", "trace", "--max-prompt-tokens", "48", "--max-total-tokens", "160", "--ignore-eos",
                     "--device-kv-blocks", "32", "--host-kv-blocks", "512", "--num-requests", "30", "--rates", "0.7",
                     "--policies", "rotasched", "--seed", "2", "--out", str(out), "--no-progress", "--step-log", *extra])
        assert code == 0
        doc = json.loads((out / "simulate.json").read_text())
        return doc, step_log.load(out / "step-log-rotasched-0.7.jsonl")

    (swap_way, swap_way_steps), (shared, steps) = run("--time-share", "false"), run()
    bare = run("--time-share")[0]["runs"][0]
    assert (bare["requests"], bare["gaps_s"]) == (shared["runs"][0]["requests"], shared["runs"][0]["gaps_s"])
    bound = (shared["slo"]["max_stall_ms"] or 5 * shared["slo"]["tbt_ms"]) / 1e3
    longest_step = max(b["time"] - a["time"] for a, b in zip(steps, steps[1:]))
    longest = shared["runs"][0]["summary"]["tbt_s"]["max"]
    assert longest <= bound + longest_step, (longest, bound)
    assert swap_way["runs"][0]["summary"]["tbt_s"]["max"] > bound + longest_step
    assert any(set(s["rotate_out"]) & set(s["scheduled"]) for s in steps), "nobody left after computing"
    assert any(set(s["rotate_in"]) & set(s["scheduled"]) for s in steps), "no return computed in its step"
    assert not any(set(s["rotate_out"]) & set(s["scheduled"]) for s in swap_way_steps)
    # The scheduler's counters (the router's superinfer_rotations_*_total) count the same.
    counters = shared["runs"][0]["summary"]["simulator"]["scheduler"]
    assert counters["rotations_out_after_compute"] == sum(len(set(s["rotate_out"]) & set(s["scheduled"])) for s in steps)
    assert counters["rotations_in_computed"] == sum(len(set(s["rotate_in"]) & set(s["scheduled"])) for s in steps)
    assert swap_way["runs"][0]["summary"]["simulator"]["scheduler"]["rotations_out_after_compute"] == 0
