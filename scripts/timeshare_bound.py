"""How much joint attainment time-sharing the device could buy on the suite's Azure workload, in
an idealised model — not the simulator: every step the device holds the requests whose next
token is due first (earliest deadline first over first-token, TBT and, for requests already
lost, stall-bound deadlines), a prompt is admitted only while the admitted requests' demand for
device memory (blocks held times the share of steps each must compute in) stays within
`--margin` of the pool, and prompts already past their first-token deadline wait until no
punctual prompt does. Step times come from the pinned CPU profile's cost model (a base plus a
cost per decode and per prefill token).

`--transfer-steps N` makes a rotation cost what the Step protocol makes it cost: a request
that leaves the device holds its blocks for N steps more without computing (its copy out), and
one that comes back holds them for N steps before it computes (its copy in). With 0, rotation
is free and instantaneous — the model's upper reach.

    .venv/bin/python scripts/timeshare_bound.py [--transfer-steps N] [--margin M] [--rates 0.7,1.0]

Prints, per rate and seed, the joint attainment (first token, TBT at the 90th percentile, no gap
above the stall bound), the 99th-percentile gap and the longest gap.
"""
from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "server"))

from superinfer.bench.prompts import LengthLimits  # noqa: E402
from superinfer.bench.suite import CPU_PROFILE, SUITE  # noqa: E402
from superinfer.bench.trace import load_trace  # noqa: E402
from superinfer.bench.workload import WorkloadConfig, requests_for  # noqa: E402

TRACE = ROOT / "data/azure-llm-2023/AzureLLMInferenceTrace_conv.csv"
# The objectives the simulated suite's Azure runs judge by (5x the profile's unloaded latency).
TTFT_S, TBT_S, STALL_S = 0.702, 0.2516, 1.258


@dataclass
class Req:
    arrival: float
    prompt: int
    output: int
    generated: int = 0
    last: float | None = None
    first: float | None = None
    gaps: list[float] = field(default_factory=list)
    lost: bool = False

    def blocks(self, block_size: int) -> int:
        return math.ceil((self.prompt + self.generated + 1) / block_size)

    def deadline(self) -> float:
        if self.lost:
            return math.inf if self.last is None else self.last + STALL_S - 0.3
        return self.arrival + TTFT_S if self.last is None else self.last + TBT_S

    def meets(self) -> bool:
        gaps = sorted(self.gaps)
        p90 = gaps[math.ceil(0.9 * len(gaps)) - 1] if gaps else 0.0
        return self.first is not None and self.first <= TTFT_S and p90 <= TBT_S and max(gaps, default=0.0) <= STALL_S


def run(specs, cost: dict, blocks: int, block_size: int, margin: float, transfer_steps: int) -> tuple[float, float, float]:
    base, per_decode, per_prefill = cost["step_base_s"], cost["per_decode_request_s"], cost["per_prefill_token_s"]
    reqs = [Req(s.arrival_s, s.prompt_tokens, s.max_new_tokens) for s in specs]
    waiting = list(range(len(reqs)))
    active: list[int] = []
    # Where each admitted request's KV is: "dev" (computable), "host", or on its way ("in",
    # "out"), with the steps its copy still holds the blocks.
    where: dict[int, str] = {}
    left: dict[int, int] = {}
    now, done = 0.0, 0
    while done < len(reqs):
        step_s = base + per_decode * max(1, len(active))
        duty = lambda r: min(1.0, step_s / ((STALL_S - 0.3) if r.lost else 0.9 * TBT_S))  # noqa: E731
        arrived = [i for i in waiting if reqs[i].arrival <= now]
        for i in arrived:
            r = reqs[i]
            if now > r.arrival + TTFT_S - 0.15:
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
            if not waiting:
                break
            now = max(now, min(reqs[i].arrival for i in waiting))
            continue
        # Copies in flight hold their blocks; then the earliest deadlines get the rest.
        used = sum(reqs[j].blocks(block_size) for j in active if where[j] in ("in", "out"))
        computing, started = [], []
        for j in sorted((j for j in active if where[j] in ("dev", "host")), key=lambda j: reqs[j].deadline()):
            need = reqs[j].blocks(block_size)
            if used + need <= blocks:
                used += need
                if where[j] == "dev" or transfer_steps == 0:
                    where[j] = "dev"
                    computing.append(j)
                else:
                    where[j], left[j] = "in", transfer_steps
                    started.append(j)
            elif where[j] == "dev":
                where[j], left[j] = ("out", transfer_steps) if transfer_steps else ("host", 0)
                started.append(j)
        prefill = sum(reqs[j].prompt for j in computing if reqs[j].last is None)
        decodes = sum(1 for j in computing if reqs[j].last is not None)
        now += base + per_decode * decodes + per_prefill * prefill
        for j in active:
            if where[j] in ("in", "out"):
                left[j] -= 1
                if left[j] == 0:
                    where[j] = "dev" if where[j] == "in" else "host"
        for j in computing:
            r = reqs[j]
            if r.last is None:
                r.first = now - r.arrival
            else:
                r.gaps.append(now - r.last)
            r.last = now
            r.generated += 1
            if r.generated >= r.output:
                active.remove(j)
                done += 1
    gaps = sorted(g for r in reqs for g in r.gaps)
    return sum(r.meets() for r in reqs) / len(reqs), gaps[int(0.99 * len(gaps))], gaps[-1]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--transfer-steps", type=int, default=0)
    parser.add_argument("--margin", type=float, default=1.0)
    parser.add_argument("--rates", default="0.7,1.0")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    profile = json.loads((ROOT / CPU_PROFILE.split(":", 1)[1]).read_text())
    azure = next(w for w in SUITE if w.name == "azure")
    flags = dict(zip(*[iter(shlex.split(azure.args.replace("--ignore-eos", "")))] * 2))
    limits = LengthLimits(max_prompt_tokens=int(flags["--max-prompt-tokens"]),
                          max_total_tokens=int(flags["--max-total-tokens"]))
    trace = load_trace(TRACE)
    print(f"transfer steps {args.transfer_steps}, margin {args.margin}: joint attainment / p99 gap (s) / longest gap (s)")
    for rate in (float(r) for r in args.rates.split(",")):
        for seed in range(args.repeats):
            config = WorkloadConfig(arrival="trace", rate=rate, num_requests=int(flags["--num-requests"]),
                                    lengths="trace", limits=limits, ignore_eos=True, seed=seed)
            joint, p99, longest = run(requests_for(config, trace), profile["cost_model"],
                                      int(flags["--device-kv-blocks"]), profile["block_size"], args.margin,
                                      args.transfer_steps)
            print(f"  rate {rate:g} seed {seed}: {joint * 100:3.0f}%  {p99:5.2f}  {longest:5.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
