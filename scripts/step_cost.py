"""Per repetition of a measured `bench compare`: each policy's shard forward time per output
token (`step_time.forward_s / output_tokens`), its KV copies (rotations in + out) and its output
throughput, with RotaSched's throughput over the faster baseline's. Whether a policy's steps cost
more per token, and whether the copies explain it, read pair by pair.

    .venv/bin/python scripts/step_cost.py docs/results/evidence/2026-12-05/azure-1.0-cadence/compare.json
"""
import json
import sys


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    runs = json.load(open(argv[0]))["runs"]
    by_repetition: dict[int, dict[str, dict]] = {}
    for run in runs:
        by_repetition.setdefault(run["repetition"], {})[run["series"]] = run["summary"]
    for repetition, summaries in sorted(by_repetition.items()):
        cells = []
        for policy, s in summaries.items():
            moves = s.get("kv_moves") or {}
            copies = moves.get("rotations_in", 0) + moves.get("rotations_out", 0)
            per_token_ms = 1000 * s["step_time"]["forward_s"] / max(1, s["output_tokens"])
            cells.append(f"{policy} {per_token_ms:.1f} ms/token, {copies} copies, {s['throughput_tokens_per_s']:.1f} tok/s")
        line = f"repetition {repetition}: " + "; ".join(cells)
        baselines = [s["throughput_tokens_per_s"] for p, s in summaries.items() if p != "rotasched"]
        if "rotasched" in summaries and baselines:
            line += f"; rotasched / faster baseline {summaries['rotasched']['throughput_tokens_per_s'] / max(baselines) - 1:+.0%}"
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
