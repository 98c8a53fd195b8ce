#!/usr/bin/env bash
# DuplexKV on a GPU host (about 5 minutes on an H200): builds the CUDA extension, runs the GPU
# tests and the GPU benchmark, and writes JSON to $OUT:
#   gpu_check.json   summary: versions, build time, test counts, pass/fail per step
#   gpu_bench.json   the benchmark figures (python -m superinfer_kv.bench --skip-cpu)
#   gpu_tests.xml    pytest's junit report; *.log the raw output of each step
# Needs torch with CUDA, nvcc (on PATH or the pinned PyPI package) and pytest; ninja is used
# when present (without it the extension is built with nvcc directly). No network access is
# needed. scripts/gpu_run.sh runs the build and the tests (not the benchmark) with the rest of
# the project's GPU checks.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$(mktemp -d)}"
PYTHON="${PYTHON:-python3}"
mkdir -p "$OUT"
STEPS="$(mktemp -d)"  # per-step status, kept out of $OUT (a few files come back from there)
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export MAX_JOBS="${MAX_JOBS:-$(nproc)}"
echo "writing to $OUT"

step() {  # step NAME COMMAND...: runs COMMAND, logs to $OUT/NAME.log, records rc and seconds
  local name="$1"; shift
  local start=$SECONDS
  "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc $((SECONDS - start))s"
  echo "{\"rc\": $rc, \"seconds\": $((SECONDS - start))}" >"$STEPS/$name.json"
  tail -n 5 "$OUT/$name.log"
}

step build "$PYTHON" -c "
import torch
from superinfer_kv.extension import load_cuda_extension
print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name())
print(load_cuda_extension())"

if ! "$PYTHON" -c "import pytest" 2>/dev/null; then
  echo "pytest is missing on this host: install it (a wheel, where there is no network)" >&2
fi
step tests "$PYTHON" -m pytest -q -p no:cacheprovider --junitxml="$OUT/gpu_tests.xml" \
  superinfer_kv/tests/test_cuda_transfer.py

step bench timeout 400 "$PYTHON" -m superinfer_kv.bench --skip-cpu --out "$OUT/gpu_bench.json"

"$PYTHON" - "$OUT" "$STEPS" <<'PY'
import json, pathlib, sys, xml.etree.ElementTree as tree
import torch
out, steps = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
summary = {"torch": torch.__version__, "cuda": torch.version.cuda,
           "device": torch.cuda.get_device_name() if torch.cuda.is_available() else None}
for name in ("build", "tests", "bench"):
    path = steps / f"{name}.json"
    summary[name] = json.loads(path.read_text()) if path.exists() else None
junit = out / "gpu_tests.xml"
if junit.exists():
    suite = tree.parse(junit).getroot()
    suite = suite if suite.tag == "testsuite" else suite[0]
    keys = ("tests", "failures", "errors", "skipped")
    summary["test_counts"] = {k: int(suite.get(k, 0)) for k in keys}
(out / "gpu_check.json").write_text(json.dumps(summary, indent=2) + "\n")
print(json.dumps(summary, indent=2))
PY
