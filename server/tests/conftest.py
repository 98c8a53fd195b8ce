"""Shared fixtures of the shard tests: small random models of each architecture saved as
Hugging Face directories (built with transformers' own classes), the embedded SmolLM2, and
helpers that drive our model runner directly."""
import importlib.util
import json
import pathlib

import pytest
import torch

TINY_VOCAB = 512


@pytest.fixture(scope="session", autouse=True)
def _one_torch_thread():
    # The test machine runs other builds at the same time; a multi-threaded OpenMP pool then
    # stalls at every barrier, while one thread runs at a steady speed.
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def _write_tokenizer(directory: pathlib.Path, vocab_size: int) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"t{i}": i for i in range(vocab_size)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {"bos_token": "t1", "eos_token": "t2", "chat_template": "{% for m in messages %}{{ m['content'] }}{% endfor %}"}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))


# model_type -> transformers' (config class, model class) of that name prefix.
_TRANSFORMERS_NAMES = {
    "llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2", "qwen3": "Qwen3", "qwen3_moe": "Qwen3Moe",
    "mixtral": "Mixtral", "gemma2": "Gemma2", "gemma3_text": "Gemma3Text", "phi3": "Phi3", "granite": "Granite",
}
_CONFIG_CLASSES = {model_type: f"{name}Config" for model_type, name in _TRANSFORMERS_NAMES.items()}
_MODEL_CLASSES = {model_type: f"{name}ForCausalLM" for model_type, name in _TRANSFORMERS_NAMES.items()}
_MODEL_CLASSES["gemma3_text"] = "Gemma3ForCausalLM"


def build_tiny_model(directory: pathlib.Path, architecture: str, seed: int = 0, **overrides):
    """Saves a random transformers model of `architecture` (safetensors + config + tokenizer)
    into `directory` and returns the transformers model (float32, eval)."""
    import transformers

    fields = dict(
        vocab_size=TINY_VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        # Wider than the default 0.02 so that logits are peaked and greedy choices are not
        # decided by float rounding.
        initializer_range=0.2, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
    )
    fields.update(overrides)
    config = getattr(transformers, _CONFIG_CLASSES[architecture])(**fields)
    torch.manual_seed(seed)
    model = getattr(transformers, _MODEL_CLASSES[architecture])(config).eval()
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    _write_tokenizer(directory, fields["vocab_size"])
    return model


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory) -> pathlib.Path:
    directory = tmp_path_factory.mktemp("tiny-llama")
    build_tiny_model(directory, "llama")
    return directory


@pytest.fixture(scope="session")
def smollm2_dir() -> pathlib.Path:
    """The embedded default model, converted once into the user's cache (shared with `serve`)."""
    from superinfer.shard.model_source import resolve_model

    return resolve_model("default", pathlib.Path.home() / ".cache" / "superinfer").directory


def make_runner(directory: pathlib.Path, device_blocks: int = 64, host_blocks: int = 0, block_size: int = 16,
                dtype: torch.dtype = torch.float32):
    from superinfer.shard.loader import load_model
    from superinfer.shard.model_runner import ModelRunner
    from superinfer.shard.model_source import ModelSource

    loaded = load_model(ModelSource(str(directory), directory), dtype, torch.device("cpu"))
    runner = ModelRunner(loaded, torch.device("cpu"), dtype, block_size)
    runner.allocate(device_blocks, host_blocks)
    return runner


def runner_logits(runner, token_ids: list[int], block_table: list[int], start: int = 0) -> torch.Tensor:
    """Logits [len(token_ids), vocab] of one chunk computed by our runner."""
    from superinfer.shard.batch import Chunk

    hidden, _ = runner.forward([Chunk(token_ids, start, block_table)])
    return runner.logits(hidden)


def runner_greedy(runner, prompt: list[int], steps: int, block_table: list[int]) -> list[int]:
    """Prefill then `steps` - 1 decodes through the paged cache; the greedy tokens."""
    tokens = [int(runner_logits(runner, prompt, block_table)[-1].argmax())]
    for index in range(steps - 1):
        logits = runner_logits(runner, [tokens[-1]], block_table, start=len(prompt) + index)
        tokens.append(int(logits[-1].argmax()))
    return tokens


@pytest.fixture
def failing_sampling(monkeypatch):
    """Makes sampling raise `message` for request 2 only (a per-request failure on the shard)."""
    from superinfer.shard import sampling

    original = sampling._choose

    def fail_for_request_2(message: str) -> None:
        def choose(logits, request):
            if request.request_id == 2:
                raise RuntimeError(message)
            return original(logits, request)

        monkeypatch.setattr(sampling, "_choose", choose)

    return fail_for_request_2


@pytest.fixture
def make_tiny_runner():
    return make_runner


def make_executor(directory: pathlib.Path, device_blocks: int = 64, host_blocks: int = 16, block_size: int = 16,
                  warm: bool = True, device: str = "cpu", cuda_graphs: tuple[int, ...] | None = None):
    """A ShardExecutor (no gRPC) over the model in `directory`, warmed up unless `warm` is False
    (float32 on the CPU, bfloat16 on a GPU)."""
    from superinfer.pb import shard_pb2
    from superinfer.shard.cli import build_executor
    from superinfer.shard.config import ShardConfig

    config = ShardConfig(
        model=str(directory), cache_dir=directory / "cache", device=torch.device(device),
        dtype=torch.float32 if device == "cpu" else torch.bfloat16,
        block_size=block_size, device_kv_blocks=device_blocks, host_kv_blocks=host_blocks, warmup_repeats=1,
        cuda_graphs=cuda_graphs,
    )
    executor = build_executor(config)
    if warm:
        executor.warmup(shard_pb2.WarmupRequest(max_batch_tokens=128, max_batch_requests=8))
    return executor


def load_script(name: str):
    """A script of the repository's `scripts/` folder (not a package), loaded as a module."""
    path = pathlib.Path(__file__).resolve().parents[2] / "scripts" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
