"""Re-judges simulated suite runs against the default stall bound (5x TBT), whatever bound they
were planned with, and prints RotaSched vs the best baseline per seed."""
import json, sys
from pathlib import Path
from superinfer.bench.outcomes import Outcome, Slo, attainment
from superinfer.bench.suite import verdicts, summary_table
root = Path(sys.argv[1])
summary = {}
for wl in sorted(p for p in root.iterdir() if p.is_dir()):
    runs = []
    for path in sorted(wl.glob("seed-*/simulate.json")):
        doc = json.loads(path.read_text())
        s = doc["slo"]
        slo = Slo(s["ttft_ms"], s["tbt_ms"], s["tbt_percentile"], None)  # the default bound
        for run in doc["runs"]:
            outs = [Outcome(r["index"], r["ok"], r["output_tokens"], r["ttft_s"], r["e2e_s"], r["tbt_s"], r.get("max_gap_s"), r.get("priority", 0)) for r in run["requests"]]
            run = dict(run); run["summary"] = dict(run["summary"]); run["summary"]["attainment"] = attainment(outs, slo)
            run["repetition"] = int(path.parent.name.split("-")[1])
            runs.append(run)
    summary[wl.name] = verdicts(runs)
order = ["chat-bursty", "chat-smooth", "code", "long-prompt", "azure"]
print(summary_table({k: summary[k] for k in order if k in summary}))
json.dump(summary, open(root / "suite-rejudged.json", "w"), indent=1)
