#!/usr/bin/env bash
# Everything that needs a GPU, in one run of at most 8 minutes on one H200 with no network
# (docs/benchmarks.md, "Running on a GPU"). The packages the host lacks and the router extension
# come from the wheels `make gpu-bundle` put in .whl/ (carried there), installed with no index;
# the project's Python runs from this tree. Each step runs under its own timeout, inside one
# deadline for the whole run; a step that fails or runs out of time is recorded as failed and the
# next one runs. Steps, in order:
#   imports         every module the run imports is there (scripts/gpu_imports.py)
#   kv_build        DuplexKV's CUDA extension, compiled
#   kv_tests        DuplexKV's GPU tests
#   shard_tests     the shard's GPU tests (bf16 pools, rotation through the CUDA engine, decode
#                   graphs, the Triton kernels compiled against a dense reference)
#   attention_bench the paged-attention kernel against gather + SDPA
#   model           a random-weight model of Llama-3.2-1B's shapes, and prompts in its words
#   decode_graphs   the shard against transformers in bf16, decode CUDA graphs on
#   decode_eager    the same with the graphs off
#   compare         a short `superinfer bench compare` (one rate, one repetition)
# Writes $OUT/gpu_run.tar.gz (every log and result) and $OUT/summary.txt; exits 1 if a step failed.
#
#   bash scripts/gpu_run.sh              on the GPU host, .whl/ carried
#   bash scripts/gpu_run.sh --dry-run    on the CPU with .venv (`make gpu-dry-run`): the same
#                                        imports and steps, the GPU-only ones skipped, the others
#                                        at tiny sizes, to catch a broken import or flag here
# Larger runs, one at a time (docs/benchmarks.md): STEPS="model compare" runs only those steps;
# MODEL_SHAPE=8b gives the decode benches and the comparison Llama-3-8B's shapes; COMPARE_ARGS
# adds flags to the comparison (later flags win: "--policies fcfs,swap --num-requests 200");
# COMPARE_S is its timeout and DEADLINE_S the whole run's.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
MODE=gpu
if [ "${1:-}" = "--dry-run" ]; then MODE=dry; fi

if [ $MODE = gpu ]; then
  PYTHON=${PYTHON:-python3}
  OUT=${OUT:-$(mktemp -d)}
  DEADLINE=${DEADLINE_S:-465}
  SITE=/tmp/site
  export PYTHONPATH="$ROOT/server:$ROOT:$SITE"
else
  PYTHON=${PYTHON:-$ROOT/.venv/bin/python}
  OUT=${OUT:-$ROOT/target/gpu-dry-run}
  DEADLINE=${DEADLINE_S:-240}
  export PYTHONPATH="$ROOT/server:$ROOT"
fi
export PYTHONUNBUFFERED=1 MAX_JOBS=${MAX_JOBS:-$(nproc)}
# Logs and results gather in WORK and travel back as one archive ($OUT returns few files); the
# step table is written to $OUT as each step ends, so that it survives a run killed from outside.
# The model and prompts (gigabytes on the GPU) stay in INPUTS.
WORK=$(mktemp -d /tmp/gpu-run.XXXXXX)
INPUTS=$(mktemp -d /tmp/gpu-run-inputs.XXXXXX)
mkdir -p "$OUT"
STEP_RECORDS=$OUT/steps.tsv
: >"$STEP_RECORDS"
# Marks every process a step starts (and only those), so that what outlives a killed step (the
# comparison's servers run in sessions of their own) can be found and stopped.
STEP_TOKEN="gpu-run-$$-$RANDOM"
echo "gpu_run ($MODE): results in $OUT, work in $WORK, deadline ${DEADLINE}s"

record() {  # record NAME STATUS SECONDS DETAIL
  printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >>"$STEP_RECORDS"
  printf '%-16s %-8s %4ss  %s\n' "$1" "$2" "$3" "$4"
}

wanted() {
  [ -z "${STEPS:-}" ] || [[ " ${STEPS//,/ } " == *" $1 "* ]]
}

stop_leftovers() {  # the processes a step started that still run, found by the token in their environment
  local pids
  pids=$(grep -lsz "^GPU_RUN_STEP=$STEP_TOKEN\$" /proc/[0-9]*/environ | cut -d/ -f3 | tr '\n' ' ')
  [ -z "$pids" ] && return
  echo "stopping the processes the step left running: $pids"
  kill -TERM $pids 2>/dev/null
  sleep 5
  kill -KILL $pids 2>/dev/null
}

step() {  # step NAME SECONDS COMMAND...: COMMAND under a timeout (cut to the run's deadline), logged to NAME.log
  local name=$1 limit=$2; shift 2
  wanted "$name" || return 0
  local left=$((DEADLINE - SECONDS))
  if [ "$left" -lt 10 ]; then
    record "$name" failed 0 "not run: the run's ${DEADLINE}s were spent"
    return 0
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  local start=$SECONDS rc
  GPU_RUN_STEP=$STEP_TOKEN timeout -k 10 "$limit" "$@" >"$WORK/$name.log" 2>&1
  rc=$?
  case $rc in
    0) record "$name" passed $((SECONDS - start)) "" ;;
    124 | 137) record "$name" failed $((SECONDS - start)) "timed out after ${limit}s" ;;
    *) record "$name" failed $((SECONDS - start)) "exit $rc: $(grep -v '^\s*$' "$WORK/$name.log" | tail -n 1 | cut -c1-160)" ;;
  esac
  stop_leftovers >>"$WORK/$name.log" 2>&1
}

skip() {  # skip NAME REASON
  wanted "$1" && record "$1" skipped 0 "$2"
  return 0
}

finish() {  # the summary and the archive, in $OUT; the run's status: 1 if a step failed
  local failed
  failed=$(grep -c $'\tfailed\t' "$STEP_RECORDS")
  cp "$STEP_RECORDS" "$WORK/steps.tsv"
  "$PYTHON" scripts/gpu_summary.py "$WORK" "$MODE" >"$OUT/summary.txt" 2>&1 || echo "(the summary failed)" >>"$OUT/summary.txt"
  cp "$OUT/summary.txt" "$WORK/summary.txt"
  tar -czf "$OUT/gpu_run.tar.gz" -C "$WORK" .
  cat "$OUT/summary.txt"
  echo "archive: $OUT/gpu_run.tar.gz ($(du -h "$OUT/gpu_run.tar.gz" | cut -f1)), ${SECONDS}s in all, $failed steps failed"
  rm -rf "$WORK" "$INPUTS"
  [ "$failed" = 0 ]
}
trap 'finish; exit 1' TERM INT

# Tiny sizes on the CPU exercise the same code and flags; only the GPU's figures mean anything.
if [ $MODE = gpu ]; then
  DEVICE=cuda
  MODEL_SHAPE=${MODEL_SHAPE:-1b}
  ATTENTION_SIZES=(--batch-sizes 1 32 128 --context-lens 512 4096 --pairs 5)
  DECODE_SIZES=(--batches 1 32 --decode-steps 32 --pairs 3)
  COMPARE_SIZES=(--rates 12 --num-requests 60 --max-prompt-tokens 512 --max-total-tokens 768
                 --device-kv-blocks 256 --host-kv-blocks 2048 --startup-timeout 120)
else
  DEVICE=cpu
  MODEL_SHAPE=tiny
  ATTENTION_SIZES=(--batch-sizes 1 --context-lens 12 --pairs 1 --iters 1 --num-layers 2 --num-heads 4
                   --num-kv-heads 2 --head-dim 16 --block-size 4)
  DECODE_SIZES=(--batches 1 2 --decode-steps 2 --context-tokens 16 --pairs 1)
  COMPARE_SIZES=(--rates 20 --num-requests 4 --max-prompt-tokens 24 --max-total-tokens 40 --device-kv-blocks 16
                 --host-kv-blocks 64 --startup-timeout 60)
fi
MODEL=$INPUTS/random-llama-$MODEL_SHAPE
PROMPTS=$INPUTS/prompts.json

# Setup: the carried wheels, then the router extension out of its wheel into the tree.
if [ $MODE = gpu ]; then
  start=$SECONDS
  {
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    carried=()
    for wheel in .whl/*.whl; do [[ $wheel == .whl/superinfer-* ]] || carried+=("$wheel"); done
    timeout 60 "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$SITE" "${carried[@]}" &&
      "$PYTHON" -c 'import glob, os, sys, zipfile
wheels = glob.glob(".whl/superinfer-*.whl")
if len(wheels) != 1:
    sys.exit(f"need one superinfer wheel in .whl/ (make gpu-bundle), found {wheels}")
with zipfile.ZipFile(wheels[0]) as wheel:
    (name,) = [n for n in wheel.namelist() if n.endswith("/_router.abi3.so")]
    with open("server/superinfer/_router.abi3.so.new", "wb") as out:
        out.write(wheel.read(name))
# Renamed into place: a process that has the old library loaded keeps its own copy.
os.replace("server/superinfer/_router.abi3.so.new", "server/superinfer/_router.abi3.so")
print("router extension from", wheels[0])'
  } >"$WORK/setup.log" 2>&1
  rc=$?
  record setup "$([ $rc = 0 ] && echo passed || echo failed)" $((SECONDS - start)) "$(tail -n 1 "$WORK/setup.log" | cut -c1-160)"
  step imports 25 "$PYTHON" scripts/gpu_imports.py --bundle .whl --site "$SITE"
else
  step imports 60 "$PYTHON" scripts/gpu_imports.py
fi

if [ $MODE = gpu ]; then
  step kv_build 60 "$PYTHON" -c 'import torch
from superinfer_kv.extension import load_cuda_extension
print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name())
print(load_cuda_extension())'
else
  skip kv_build "needs nvcc and a GPU (make test compiles the sources: test_cuda_compile.py)"
fi
# On the CPU these collect, then skip: a test renamed or moved fails here.
step kv_tests 35 "$PYTHON" -m pytest -q -p no:cacheprovider --junitxml="$WORK/kv_tests.xml" \
  superinfer_kv/tests/test_cuda_transfer.py superinfer_kv/tests/test_calibrate.py::test_engine_measures_its_threshold_once
# Each of the 36 kernel cases compiles its own Triton kernels: spread over 4 workers where
# pytest-xdist is installed (the GPU host has it).
PARALLEL=()
if "$PYTHON" -c "import xdist" 2>/dev/null; then PARALLEL=(-n 4); fi
step shard_tests 80 "$PYTHON" -m pytest -q -p no:cacheprovider "${PARALLEL[@]}" --junitxml="$WORK/shard_tests.xml" \
  server/tests/test_shard_gpu.py server/tests/test_triton_attention.py::test_compiled_kernels_on_gpu

if [ $MODE = gpu ]; then
  step attention_bench 25 bash -c '"$@" >"$0"' "$WORK/attention_bench.json" \
    "$PYTHON" -m superinfer.shard.attention_bench --device cuda "${ATTENTION_SIZES[@]}"
else  # the kernel in Triton's interpreter: the code and flags, not a timing
  step attention_bench 40 env TRITON_INTERPRET=1 bash -c '"$@" >"$0"' "$WORK/attention_bench.json" \
    "$PYTHON" -m superinfer.shard.attention_bench --device cpu "${ATTENTION_SIZES[@]}"
fi

# 8B's 16 GB take a while to write.
step model "$([ "$MODEL_SHAPE" = 8b ] && echo 150 || echo 30)" "$PYTHON" scripts/gpu_inputs.py "$MODEL" "$MODEL_SHAPE" "$PROMPTS"

decode_bench() {  # decode_bench NAME SECONDS FLAGS...: the shard against transformers on the model
  local name=$1 limit=$2; shift 2
  step "$name" "$limit" bash -c '"$@" >"$0"' "$WORK/$name.json" "$PYTHON" -m superinfer.shard.throughput_bench \
    --device $DEVICE --model "$MODEL" "${DECODE_SIZES[@]}" "$@"
}
decode_bench decode_graphs 55
decode_bench decode_eager 40 --cuda-graphs 0

# The servers judge attainment against 5x the unloaded latency measured on the first one. On the
# GPU the device pool (256 blocks, 4,096 tokens) is smaller than what the trace's requests in
# flight need at times, so the policies differ in what they rotate, recompute or make wait.
read -r -a COMPARE_EXTRA <<<"${COMPARE_ARGS:-}"
step compare "${COMPARE_S:-100}" "$PYTHON" -m superinfer.cli bench compare --model "$MODEL" \
  --policies fcfs,rotasched --repeats 1 --arrival trace --lengths trace "${COMPARE_SIZES[@]}" \
  --ignore-eos --sharegpt "$PROMPTS" --ttft-slo-scale 5 --tbt-slo-scale 5 --launch-args=--async-scheduling \
  --out "$WORK/compare" --no-progress "${COMPARE_EXTRA[@]}"

finish
