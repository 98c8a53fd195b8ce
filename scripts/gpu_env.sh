# Sourced by the GPU scripts (gpu_check.sh, gpu_compare.sh) from the repository root: $OUT
# (default: a new temporary directory), $PYTHON, Python packages the GPU host lacks installed
# from .whl/ into /tmp/site, the repository on PYTHONPATH, and write_model.
OUT="${OUT:-$(mktemp -d)}"
PYTHON="${PYTHON:-python3}"
export OUT PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" >/dev/null; then
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD/server:$PWD${PYTHONPATH:+:$PYTHONPATH}"

# A random-weight Llama-shaped model written once per shape (no download): $1 directory, $2 shape.
write_model() {
  timeout 300 "$PYTHON" - "$1" "$2" <<'PY'
import json, pathlib, sys
import torch, transformers
from tokenizers import Tokenizer, models, pre_tokenizers
target, shape = pathlib.Path(sys.argv[1]), sys.argv[2]
if (target / "config.json").exists():
    sys.exit(0)
target.mkdir(parents=True, exist_ok=True)
shapes = {  # Llama-3.2-1B's and Llama-3-8B's shapes
    "1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
               tie_word_embeddings=True),
    "8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
               tie_word_embeddings=False),
}
config = transformers.LlamaConfig(vocab_size=128256, num_key_value_heads=8, max_position_embeddings=4096,
                                  rope_theta=500000.0, bos_token_id=1, eos_token_id=2, **shapes[shape])
torch.manual_seed(0)
with torch.device("cuda"):
    model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
model.save_pretrained(target)
tokenizer = Tokenizer(models.WordLevel({f"t{i}": i for i in range(config.vocab_size)}, unk_token="t0"))
tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
tokenizer.save(str(target / "tokenizer.json"))
(target / "tokenizer_config.json").write_text(json.dumps({"bos_token": "t1", "eos_token": "t2"}))
print("random", shape, "model written to", target)
PY
}

