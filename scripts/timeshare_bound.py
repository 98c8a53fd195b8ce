"""How much joint attainment time-sharing the device could buy on the suite's Azure workload, in
an idealised model — not the simulator: every step the device holds the requests whose next
token is due first (earliest deadline first over first-token, TBT and, for requests already
lost, stall-bound deadlines), a prompt is admitted only while the admitted requests' demand for
device memory (blocks held times the share of steps each must compute in) stays within
`--margin` of the pool, and prompts already past their first-token deadline wait until no
punctual prompt does. The workload, the machine (the pinned CPU profile) and the objectives are
those `superinfer suite --simulate` runs the Azure workload with (`superinfer.simulate.cli`); step
times come from the profile's cost model (a base plus a cost per decode and per prefill token), and
requests are judged as every run is (`superinfer.bench.outcomes`).

`--transfer-steps N` makes a rotation in cost what the Step protocol makes it cost: one that
comes back holds its blocks for N steps before it computes (its copy in). `--out-steps M`
(default N) does the same for the way out, counted from the step it is evicted in, which itself
does not hold its blocks: M = 1 is a request that leaves after computing in its last step, M = 2
one whose copy out takes a step of its own. With 0, rotation is free and instantaneous — the
model's upper reach.

    .venv/bin/python scripts/timeshare_bound.py [--transfer-steps N] [--out-steps M] [--margin M] [--rates 0.7,1.0]

Prints, per rate and seed, the joint attainment (first token, TBT at the 90th percentile, no gap
above the stall bound), the 99th-percentile gap and the longest gap.
"""
from __future__ import annotations

import argparse
import math
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "server"))

from superinfer import _router  # noqa: E402
from superinfer.bench.outcomes import Slo, attainment, outcome_from_times  # noqa: E402
from superinfer.bench.suite import CPU_PROFILE, SUITE  # noqa: E402
from superinfer.simulate import cli as simulate_cli  # noqa: E402

# The model's planning leads, in seconds or as a share: a lost request is served this long before
# its stall bound breaks; a prompt counts as lost once it is this close to its first-token
# deadline; a punctual decode must compute in this share of its TBT objective.
LOST_LEAD_S = 0.3
PROMPT_LEAD_S = 0.15
TBT_SHARE = 0.9


@dataclass
class Req:
    arrival: float
    prompt: int
    output: int
    token_times: list[float] = field(default_factory=list)
    lost: bool = False

    @property
    def generated(self) -> int:
        return len(self.token_times)

    @property
    def last(self) -> float | None:
        return self.token_times[-1] if self.token_times else None

    def blocks(self, block_size: int) -> int:
        return math.ceil((self.prompt + self.generated + 1) / block_size)

    def deadline(self, slo: Objectives) -> float:
        if self.lost:
            return math.inf if self.last is None else self.last + slo.stall_s - LOST_LEAD_S
        return self.arrival + slo.ttft_s if self.last is None else self.last + slo.tbt_s


@dataclass(frozen=True)
class Objectives:
    """The simulate CLI's objectives for the workload, in seconds."""
    slo: Slo

    @property
    def ttft_s(self) -> float:
        return self.slo.ttft_ms / 1e3

    @property
    def tbt_s(self) -> float:
        return self.slo.tbt_ms / 1e3

    @property
    def stall_s(self) -> float:
        return self.slo.stall_ms / 1e3


def run(specs, cost: dict, blocks: int, block_size: int, obj: Objectives, margin: float,
        transfer_steps: int, out_steps: int | None = None) -> tuple[float, float, float]:
    out_steps = transfer_steps if out_steps is None else out_steps
    base, per_decode, per_prefill = cost["step_base_s"], cost["per_decode_request_s"], cost["per_prefill_token_s"]
    reqs = [Req(s.arrival_s, s.prompt_tokens, s.max_new_tokens) for s in specs]
    waiting = list(range(len(reqs)))
    active: list[int] = []
    # Where each admitted request's KV is: "dev" (computable), "host", or on its way ("in",
    # "out"), with the steps its copy still holds the blocks.
    where: dict[int, str] = {}
    left: dict[int, int] = {}
    now = 0.0
    while waiting or active:
        step_s = base + per_decode * max(1, len(active))
        duty = lambda r: min(1.0, step_s / ((obj.stall_s - LOST_LEAD_S) if r.lost else TBT_SHARE * obj.tbt_s))  # noqa: E731
        arrived = [i for i in waiting if reqs[i].arrival <= now]
        for i in arrived:
            r = reqs[i]
            if now > r.arrival + obj.ttft_s - PROMPT_LEAD_S:
                r.lost = True
        punctual_waits = any(not reqs[i].lost for i in arrived)
        for i in arrived:
            r = reqs[i]
            if r.lost and punctual_waits:
                continue
            load = sum(reqs[j].blocks(block_size) * duty(reqs[j]) for j in active)
            if active and load + math.ceil((r.prompt + 1) / block_size) * duty(r) > blocks * margin:
                continue
            active.append(i)
            waiting.remove(i)
            where[i] = "dev"
        if not active:
            now = max(now, min(reqs[i].arrival for i in waiting))
            continue
        # Copies in flight hold their blocks; then the earliest deadlines get the rest.
        used = sum(reqs[j].blocks(block_size) for j in active if where[j] in ("in", "out"))
        computing = []
        for j in sorted((j for j in active if where[j] in ("dev", "host")), key=lambda j: reqs[j].deadline(obj)):
            need = reqs[j].blocks(block_size)
            if used + need <= blocks:
                used += need
                if where[j] == "dev" or transfer_steps == 0:
                    where[j] = "dev"
                    computing.append(j)
                else:
                    where[j], left[j] = "in", transfer_steps
            elif where[j] == "dev":
                where[j], left[j] = ("out", out_steps) if out_steps else ("host", 0)
        prefill = sum(reqs[j].prompt for j in computing if reqs[j].last is None)
        decodes = sum(1 for j in computing if reqs[j].last is not None)
        now += base + per_decode * decodes + per_prefill * prefill
        for j in active:
            if where[j] in ("in", "out"):
                left[j] -= 1
                if left[j] == 0:
                    where[j] = "dev" if where[j] == "in" else "host"
        for j in computing:
            reqs[j].token_times.append(now)
            if reqs[j].generated >= reqs[j].output:
                active.remove(j)
    # Judged as every run of the project is (`superinfer.bench.outcomes`).
    outcomes = [outcome_from_times(i, r.arrival, r.token_times, r.token_times[-1], True, obj.slo.tbt_percentile)
                for i, r in enumerate(reqs)]
    gaps = [b - a for r in reqs for a, b in zip(r.token_times, r.token_times[1:])]
    return attainment(outcomes, obj.slo)["both"], _router.percentile(gaps, 99.0), max(gaps)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--transfer-steps", type=int, default=0)
    parser.add_argument("--out-steps", type=int, default=None)
    parser.add_argument("--margin", type=float, default=1.0)
    parser.add_argument("--rates", default="0.7,1.0")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    azure = next(w for w in SUITE if w.name == "azure")
    print(f"transfer steps {args.transfer_steps}, margin {args.margin}: joint attainment / p99 gap (s) / longest gap (s)")
    # The workload, machine and objectives as `superinfer suite --simulate` runs them; only the
    # seed changes from one repetition to the next.
    sim_parser = argparse.ArgumentParser(allow_abbrev=False)
    simulate_cli.add_arguments(sim_parser)
    suite_args = [*shlex.split(azure.args), "--rates", args.rates, "--profile", CPU_PROFILE, "--out", "unused"]
    profile = simulate_cli._profile(sim_parser.parse_args(suite_args))
    for seed in range(args.repeats):
        sim_args = sim_parser.parse_args([*suite_args, "--seed", str(seed)])
        _config, workloads = simulate_cli.planned_workloads(sim_args)
        slo, _unloaded = simulate_cli.objectives(sim_args, profile, workloads, "rotasched")
        for rate, specs in sorted(workloads.items()):
            joint, p99, longest = run(specs, profile.cost_model, profile.num_device_blocks, profile.block_size,
                                      Objectives(slo), args.margin, args.transfer_steps, args.out_steps)
            print(f"  rate {rate:g} seed {seed}: {joint * 100:3.0f}%  {p99:5.2f}  {longest:5.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
