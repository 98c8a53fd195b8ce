"""How much KV a workload asks to hold, against a device pool: the workload is replayed on the
simulated machine with unlimited device memory (so nothing waits for memory), and at every
moment of its arrival window the footprint of the requests in the system — each one's prompt
plus `max_new_tokens`, in whole blocks, from arrival until its last token — is summed. The
mean, 90th percentile and peak of that sum over the pool's size say how many times the pool
the workload needs.

`python -m superinfer.simulate.demand --profile measured:WARMUP_JSON --device-kv-blocks 32 <bench
workload options>`"""
import argparse
import json
from dataclasses import replace

import numpy as np

from superinfer.bench.cli import add_workload_arguments
from superinfer.bench.outcomes import Slo
from superinfer.bench.workload import WorkloadRequest
from superinfer.simulate.cli import planned_workloads
from superinfer.simulate.profiles import Profile, resolve
from superinfer.simulate.runner import SimOptions, simulate

UNLIMITED_BLOCKS = 1 << 22
SAMPLES = 5000


def demand(profile: Profile, specs: list[WorkloadRequest], device_blocks: int) -> dict:
    """Mean, p90 and peak footprint of the requests in the system over the arrival window, as
    multiples of `device_blocks`."""
    if not specs:
        raise ValueError("an empty workload needs no memory")
    unlimited = replace(profile, num_device_blocks=UNLIMITED_BLOCKS, num_host_blocks=0)
    # No objectives: every policy serves an unlimited pool the same way.
    result = simulate(unlimited, specs, SimOptions("fcfs", Slo(1e9, 1e9), send_slo=False), "unlimited", 0.0)
    arrival = np.array([s.arrival_s for s in specs])
    end = arrival + np.array([o.e2e_s if o.e2e_s is not None else np.inf for o in result.outcomes])
    block = profile.block_size
    footprint = np.array([-(-(s.prompt_tokens + s.max_new_tokens) // block) for s in specs], dtype=float)
    moments = np.linspace(arrival.min(), arrival.max(), SAMPLES)
    present = (arrival[None, :] <= moments[:, None]) & (end[None, :] > moments[:, None])
    held = (present * footprint[None, :]).sum(axis=1) / device_blocks
    return {
        "device_blocks": device_blocks,
        "mean": float(held.mean()),
        "p90": float(np.percentile(held, 90)),
        "peak": float(held.max()),
        "window_s": float(arrival.max() - arrival.min()),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m superinfer.simulate.demand", description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", required=True, help="as `superinfer simulate --profile`")
    parser.add_argument("--device-kv-blocks", type=int, required=True, help="the pool to compare against")
    parser.add_argument("--tokenizer", default="default", help="for ShareGPT lengths")
    add_workload_arguments(parser)
    args = parser.parse_args(argv)
    _config, workloads = planned_workloads(args)
    profile = resolve(args.profile)
    for rate, specs in workloads.items():
        print(json.dumps({"rate": rate, **demand(profile, specs, args.device_kv_blocks)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
