#!/usr/bin/env bash
# Everything that needs a GPU, in one run on an H200 (no network needed; in its current form not
# yet timed on a GPU: each step below has its own timeout):
#   1. DuplexKV: builds the CUDA extension, its GPU tests and GPU benchmark
#      (superinfer_kv/gpu_check.sh: gpu_check.json, gpu_bench.json, gpu_tests.xml);
#   2. the shard's GPU tests (bf16, pinned host pool, swaps through the CUDA engine; the Triton
#      attention kernels compiled, against a dense reference);
#   3. decode attention alone, the Triton paged kernel against gather + SDPA at batch 1-128 and
#      512-4096-token contexts (attention_bench.json);
#   4. the shard benchmark in bf16 on the GPU against transformers, on random-weight models (the
#      embedded model's GGUF is not needed): Llama-3.2-1B's shapes with the decode CUDA graphs
#      (shard_gpu_bench.json) and without (shard_gpu_bench_eager.json), a 2,048-token prefill
#      (shard_gpu_bench_prefill2048.json), and Llama-3-8B's shapes at batch 32 against the HBM
#      roofline (shard_gpu_bench_8b.json); each prints tokens/s, the ratio to transformers, the
#      step against the roofline and the GPU's idle share.
# Writes to $OUT (default: a new temporary directory); SKIP_SHARD_BENCH=1 stops before step 4,
# SKIP_8B=1 before the 8B model (about 16 GB written to /tmp, two copies on the GPU). Python packages the GPU host lacks can be
# given as wheels in .whl/ (installed into /tmp/site first).
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_env.sh  # OUT, PYTHON, wheels from .whl/, PYTHONPATH; write_model
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true

echo "== DuplexKV"
bash superinfer_kv/gpu_check.sh

echo "== shard GPU tests"
start=$SECONDS
timeout 210 "$PYTHON" -m pytest -q -p no:cacheprovider --junitxml="$OUT/shard_gpu_tests.xml" \
  server/tests/test_shard_gpu.py server/tests/test_triton_attention.py::test_compiled_kernels_on_gpu >"$OUT/shard_gpu_tests.log" 2>&1
echo "shard tests rc=$? $((SECONDS - start))s"; tail -n 5 "$OUT/shard_gpu_tests.log"

echo "== attention kernels benchmark"
start=$SECONDS
timeout 180 "$PYTHON" -m superinfer.shard.attention_bench --device cuda \
  >"$OUT/attention_bench.json" 2>"$OUT/attention_bench.log"
echo "attention bench rc=$? $((SECONDS - start))s"; tail -n 5 "$OUT/attention_bench.log"
"$PYTHON" -c 'import json, sys
for row in json.load(open(sys.argv[1]))["results"]:
    print("batch %(batch)4d ctx %(context)5d  sdpa %(sdpa_ms).3f ms  triton %(triton_ms).3f ms  sdpa/triton %(ratio_median).2f [%(ratio_min).2f-%(ratio_max).2f]" % row)' \
  "$OUT/attention_bench.json" || true

if [ -n "${SKIP_SHARD_BENCH:-}" ]; then exit 0; fi
# $1 name, $2 model directory, then the benchmark's own flags.
shard_bench() {
  local name=$1 model=$2; shift 2
  start=$SECONDS
  timeout 300 "$PYTHON" -m superinfer.shard.throughput_bench --device cuda --model "$model" "$@" \
    >"$OUT/$name.json" 2>"$OUT/$name.log"
  echo "$name rc=$? $((SECONDS - start))s"; tail -n 6 "$OUT/$name.log"
  "$PYTHON" -c 'import json, sys
r = json.load(open(sys.argv[1]))
print("graphs:", r.get("cuda_graphs"))
for b, f in r["decode"].items():
    roof, idle, ahead = r["roofline"][b], r["gpu_idle"][b], r["gpu_idle_ahead"][b]
    print("batch %s: %.1f tok/s, %.2fx transformers [%.2f-%.2f], step %.2f ms, roofline %.2f ms (%.0f%%), GPU idle %.0f%% (%.0f%% with the next step launched ahead)" % (
        b, f["shard_tokens_per_s"]["median"], f["ratio"]["median"], f["ratio"]["min"], f["ratio"]["max"],
        roof["measured_step_ms"], roof["roofline_step_ms"], 100 * roof["achieved"], 100 * idle["idle_share"],
        100 * ahead["idle_share"]))
p = r["prefill"]["ratio"]
print("prefill %d tokens: %.2fx transformers [%.2f-%.2f]" % (r["context_tokens"], p["median"], p["min"], p["max"]))' \
    "$OUT/$name.json" || true
}

echo "== shard GPU benchmark (Llama-3.2-1B shapes: decode graphs on, then off; 2,048-token prefill)"
write_model /tmp/superinfer-random-llama-1b 1b >"$OUT/write_models.log" 2>&1 || { echo "model 1b failed"; tail -n 5 "$OUT/write_models.log"; }
shard_bench shard_gpu_bench /tmp/superinfer-random-llama-1b --decode-steps 32
shard_bench shard_gpu_bench_eager /tmp/superinfer-random-llama-1b --decode-steps 32 --cuda-graphs 0 --batches 1 32 --pairs 3
shard_bench shard_gpu_bench_prefill2048 /tmp/superinfer-random-llama-1b --batches 1 --decode-steps 4 --context-tokens 2048 --pairs 5

if [ -n "${SKIP_8B:-}" ]; then exit 0; fi
echo "== shard GPU benchmark (Llama-3-8B shapes, bf16, batch 32: the HBM roofline)"
write_model /tmp/superinfer-random-llama-8b 8b >>"$OUT/write_models.log" 2>&1 || { echo "model 8b failed"; tail -n 5 "$OUT/write_models.log"; }
shard_bench shard_gpu_bench_8b /tmp/superinfer-random-llama-8b --batches 1 32 --decode-steps 32 --pairs 3
