"""Follow requests through a simulated run's step log (`superinfer simulate --step-log`):

    python -m superinfer.simulate.step_log OUT/step-log-rotasched-1.jsonl --request 8 [--request 7]

prints each time a followed request changes phase (waiting, running, rotating_out, rotated,
rotating_in, gone once finished) or becomes lost (can no longer meet its objectives), with how
long it spent in the phase it leaves and what every other request was doing at that step:
`7R*` is request 7 running and computed in that step, `6H` rotated out to host, `9W` waiting,
`o`/`i` rotating out/in, `L` lost. Without `--request`, prints every step that way. With
`--gaps-over S`, prints instead every gap longer than S seconds between two steps computing the
same request (longest first): whether it was lost when the gap began, and every request held
at the first step S seconds into the gap (who had the memory when a stall bound of S passed).

    python -m superinfer.simulate.step_log OUT/step-log-rotasched-0.7.jsonl --gaps-over 1.26

Each line of the log also carries `free_device_blocks` (free once the step was planned) and
`blocks`, per request in `requests`' order: [device blocks, blocks in its table]. With
`--occupancy`, prints where the device's blocks went, averaged over the steps with a request
waiting or on host: rows computed, blocks of requests computing, free, held idle on the device,
and held by a copy out of a request not computing in that step.

    python -m superinfer.simulate.step_log OUT/step-log-rotasched-0.7.jsonl --occupancy"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

_PHASE = {"waiting": "W", "running": "R", "rotating_out": "o", "rotated": "H", "rotating_in": "i"}


def load(path: Path) -> list[dict]:
    with path.open() as f:
        return [json.loads(line) for line in f if line.strip()]


def describe(step: dict) -> str:
    """One step on one line: its time, every request held, and what it moved."""
    computed = set(step["scheduled"])
    held = " ".join(f"{rid}{_PHASE[phase]}{'L' if lost else ''}{'*' if rid in computed else ''}"
                    for rid, phase, lost in step["requests"])
    moves = [f"{name} {step[key]}" for key, name in (("rotate_out", "out"), ("rotate_in", "in"),
                                                      ("recomputed", "recomputed")) if step[key]]
    return f"{step['time']:9.3f}  {held}" + (f"  | {', '.join(moves)}" if moves else "")


def state(step: dict, request: int) -> tuple[str, bool] | None:
    """(phase, lost) of `request` once `step` was planned; None when the scheduler does not hold it."""
    for rid, phase, lost in step["requests"]:
        if rid == request:
            return phase, lost
    return None


def follow(steps: list[dict], request: int) -> list[str]:
    """The lines for one request: a line at each change of its phase or of its lost flag."""
    lines, last, since = [], None, None
    for step in steps:
        now = state(step, request)
        if now == last:
            continue
        if now is None and last is None:
            continue
        phase = "gone" if now is None else now[0] + (" (lost)" if now[1] else "")
        held = "" if since is None else f" after {step['time'] - since:.3f} s"
        lines.append(f"request {request}: {phase}{held}\n    {describe(step)}")
        last, since = now, step["time"]
    return lines


def gaps_over(steps: list[dict], over_s: float) -> list[dict]:
    """Every gap longer than `over_s` between two steps that computed the same request, longest
    first: the request, the gap, when it began, whether the request was lost then, and the step
    `over_s` into the gap."""
    computed: dict[int, list[int]] = {}
    for i, step in enumerate(steps):
        for rid in step["scheduled"]:
            computed.setdefault(rid, []).append(i)
    found = []
    for rid, indices in computed.items():
        for a, b in zip(indices, indices[1:]):
            gap = steps[b]["time"] - steps[a]["time"]
            if gap <= over_s:
                continue
            at = steps[a]["time"] + over_s
            then = next(steps[k] for k in range(a, b + 1) if steps[k]["time"] >= at)
            lost = state(steps[a], rid)[1]
            found.append({"request": rid, "gap_s": gap, "from": steps[a]["time"], "lost": lost, "then": then})
    return sorted(found, key=lambda g: -g["gap_s"])


def occupancy(steps: list[dict]) -> dict:
    """Per step under pressure (a request waiting or on host), on average: rows computed, device
    blocks of requests computing (a copy out after the compute counts its table), free, held
    idle on the device, and held by a copy out of a request not computing; with the step count."""
    totals = {"rows": 0.0, "computing": 0.0, "free": 0.0, "idle": 0.0, "copied_out_idle": 0.0}
    counted = 0
    for step in steps:
        if not any(phase in ("waiting", "rotated") for _, phase, _ in step["requests"]):
            continue
        counted += 1
        computed = set(step["scheduled"])
        totals["rows"] += len(computed)
        totals["free"] += step["free_device_blocks"]
        for (rid, phase, _), (device, table) in zip(step["requests"], step["blocks"]):
            if phase == "rotating_out":
                totals["computing" if rid in computed else "copied_out_idle"] += table
            elif rid in computed:
                totals["computing"] += device
            else:
                totals["idle"] += device
    return {"steps": counted, **{k: v / max(counted, 1) for k, v in totals.items()}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("log", type=Path)
    parser.add_argument("--request", type=int, action="append", default=[], help="a request id (repeatable)")
    parser.add_argument("--gaps-over", type=float, default=None, metavar="S",
                        help="list the gaps longer than S seconds instead")
    parser.add_argument("--occupancy", action="store_true", help="where the device's blocks went, per step")
    args = parser.parse_args(argv)
    steps = load(args.log)
    if args.occupancy:
        print(" ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in occupancy(steps).items()))
        return 0
    if args.gaps_over is not None:
        found = gaps_over(steps, args.gaps_over)
        for g in found:
            print(f"request {g['request']}: {g['gap_s']:.2f} s from {g['from']:.3f}"
                  f"{' (lost)' if g['lost'] else ''}\n    {describe(g['then'])}")
        lost = sum(g["lost"] for g in found)
        print(f"{len(found)} gaps over {args.gaps_over:g} s, {lost} of them of requests already lost")
        return 0
    if not args.request:
        for step in steps:
            print(describe(step))
    for request in args.request:
        lines = follow(steps, request)
        print("\n".join(lines) if lines else f"request {request}: not in this log")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
