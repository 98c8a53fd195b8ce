#!/usr/bin/env bash
# Everything that needs a GPU, in one run of about five minutes on an H200 (no network needed):
#   1. DuplexKV: builds the CUDA extension, its GPU tests and GPU benchmark
#      (superinfer_kv/gpu_check.sh: gpu_check.json, gpu_bench.json, gpu_tests.xml);
#   2. the shard's GPU tests (bf16, pinned host pool, swaps through the CUDA engine; the Triton
#      attention kernels compiled, against a dense reference);
#   3. decode attention alone, the Triton paged kernel against gather + SDPA at batch 1-128 and
#      512-4096-token contexts (attention_bench.json);
#   4. the shard benchmark in bf16 on the GPU against transformers, on a random-weight model with
#      Llama-3.2-1B's shapes (the embedded model's GGUF is not needed): shard_gpu_bench.json.
# Writes to $OUT (default: a new temporary directory); SKIP_SHARD_BENCH=1 stops before step 4. Python packages the GPU host lacks can be
# given as wheels in .whl/ (installed into /tmp/site first).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$(mktemp -d)}"
PYTHON="${PYTHON:-python3}"
export OUT PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" >/dev/null; then
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD/server:$PWD${PYTHONPATH:+:$PYTHONPATH}"
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
echo "== shard GPU benchmark"
start=$SECONDS
MODEL=/tmp/superinfer-random-llama-1b
timeout 240 "$PYTHON" - "$MODEL" >"$OUT/shard_gpu_bench.log" 2>&1 <<'PY' &&
import json, pathlib, sys
import torch, transformers
from tokenizers import Tokenizer, models, pre_tokenizers
target = pathlib.Path(sys.argv[1]); target.mkdir(parents=True, exist_ok=True)
config = transformers.LlamaConfig(  # Llama-3.2-1B's shapes
    vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
    num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=4096, rope_theta=500000.0,
    tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)
torch.manual_seed(0)
with torch.device("cuda"):
    model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
model.save_pretrained(target)
tokenizer = Tokenizer(models.WordLevel({f"t{i}": i for i in range(config.vocab_size)}, unk_token="t0"))
tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
tokenizer.save(str(target / "tokenizer.json"))
(target / "tokenizer_config.json").write_text(json.dumps({"bos_token": "t1", "eos_token": "t2"}))
print("random model written to", target)
PY
timeout 240 "$PYTHON" -m superinfer.shard.throughput_bench --device cuda --model "$MODEL" --decode-steps 32 \
  >"$OUT/shard_gpu_bench.json" 2>>"$OUT/shard_gpu_bench.log"
echo "shard bench rc=$? $((SECONDS - start))s"; tail -n 8 "$OUT/shard_gpu_bench.log"
cat "$OUT/shard_gpu_bench.json"
