"""Model loading: local directories, the local Hugging Face cache (offline), the converted
default model, and clear LoaderErrors for every kind of bad input."""
import json
import logging
import shutil

import pytest
import torch
from conftest import build_tiny_model, make_runner, runner_logits
from safetensors.torch import load_file, save_file

from superinfer.models.architectures import supported_architectures
from superinfer.shard.errors import LoaderError
from superinfer.shard.hub import HubOptions
from superinfer.shard.loader import load_model
from superinfer.shard.model_source import DEFAULT_MODEL, ModelSource, resolve_model


def _load(directory):
    return load_model(ModelSource(str(directory), directory), torch.float32, torch.device("cpu"))


@pytest.fixture
def model_dir(tiny_llama_dir, tmp_path):
    target = tmp_path / "model"
    shutil.copytree(tiny_llama_dir, target)
    return target


def _edit_config(directory, **changes):
    config = json.loads((directory / "config.json").read_text())
    config.update(changes)
    (directory / "config.json").write_text(json.dumps(config))


def test_unsupported_architecture(model_dir):
    _edit_config(model_dir, model_type="mamba")
    supported = ", ".join(supported_architectures())
    with pytest.raises(LoaderError, match=f"unsupported architecture 'mamba'; supported: {supported}$"):
        _load(model_dir)


def test_unsupported_rope_scaling(model_dir):
    _edit_config(model_dir, rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0})
    with pytest.raises(LoaderError, match="unsupported rope scaling 'dynamic'"):
        _load(model_dir)


@pytest.mark.parametrize("name, message", [
    ("config.json", "has no config.json"),
    ("model.safetensors", r"has no \*.safetensors"),
    ("tokenizer.json", "has no tokenizer.json"),
])
def test_missing_files(model_dir, name, message):
    (model_dir / name).unlink()
    with pytest.raises(LoaderError, match=message):
        _load(model_dir)


def test_corrupt_safetensors(model_dir):
    weights = model_dir / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(LoaderError, match="cannot read weights from .*model.safetensors"):
        _load(model_dir)


def test_garbage_safetensors_header(model_dir):
    (model_dir / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all")
    with pytest.raises(LoaderError, match="cannot read weights"):
        _load(model_dir)


@pytest.mark.parametrize("tensor, message", [
    ("model.layers.1.mlp.down_proj.weight", "missing .*model.layers.1.mlp.down_proj.weight"),
    # A missing part of a fused projection.
    ("model.layers.0.self_attn.k_proj.weight", "lacks parts of fused weights.*qkv_proj"),
])
def test_missing_tensor(model_dir, tensor, message):
    state = load_file(model_dir / "model.safetensors")
    del state[tensor]
    save_file(state, model_dir / "model.safetensors")
    with pytest.raises(LoaderError, match=message):
        _load(model_dir)


def test_invalid_config_json(model_dir):
    (model_dir / "config.json").write_text("{")
    with pytest.raises(LoaderError, match="not valid JSON"):
        _load(model_dir)


def test_config_missing_a_field(model_dir):
    config = json.loads((model_dir / "config.json").read_text())
    del config["hidden_size"]
    (model_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(LoaderError, match="lacks the field 'hidden_size'"):
        _load(model_dir)


def test_model_id_from_the_local_hub_cache(tiny_llama_dir, tmp_path):
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--acme--tiny-llama"
    shutil.copytree(tiny_llama_dir, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    source = resolve_model("acme/tiny-llama", tmp_path / "cache", HubOptions(cache=tmp_path / "hub", offline=True))
    assert source.directory == repo / "snapshots" / commit and source.model_id == "acme/tiny-llama"
    runner = make_runner(source.directory)
    reference = make_runner(tiny_llama_dir)
    assert torch.equal(runner_logits(runner, [4, 5, 6], [0]), runner_logits(reference, [4, 5, 6], [0]))


def test_model_id_not_in_the_cache(tmp_path):
    # More cases (revisions, an unreachable Hub, a download) in test_hub.py.
    with pytest.raises(LoaderError, match="'acme/absent-model' is not a local directory and is not in the Hugging"):
        resolve_model("acme/absent-model", tmp_path / "cache", HubOptions(cache=tmp_path / "hub", offline=True))


def test_path_that_is_not_a_model(tmp_path):
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(LoaderError, match="not a directory or a .gguf file"):
        resolve_model(str(tmp_path / "weights.bin"), tmp_path / "cache")


def test_corrupt_gguf(tmp_path, caplog):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 64)
    with caplog.at_level(logging.INFO, logger="superinfer.shard"), pytest.raises(LoaderError, match="cannot read GGUF file"):
        resolve_model(str(bad), tmp_path / "cache")
    assert not any((tmp_path / "cache" / "converted").glob("broken*/.complete"))
    logged = [record.getMessage() for record in caplog.records]
    assert logged[0].startswith(f"converting {bad} (0.00 GB) once into ") and not any(m.startswith("converted ") for m in logged)


def test_loading_logs_its_start_and_end(model_dir, caplog):
    with caplog.at_level(logging.INFO, logger="superinfer.shard"):
        _load(model_dir)
    logged = [record.getMessage() for record in caplog.records]
    assert logged[0].startswith("loading weights: ") and " tensors, " in logged[0] and logged[0].endswith("in 1 file(s)")
    # A small model takes less than a progress interval: no progress lines between.
    assert len(logged) == 2 and logged[1].startswith(f"loaded {model_dir} (llama, ") and logged[1].endswith(" s"), logged


def test_default_model_is_converted_once(smollm2_dir, tmp_path):
    from superinfer.shard.model_source import default_gguf_path

    assert (smollm2_dir / ".complete").is_file() and (smollm2_dir / "model.safetensors").is_file()
    cache_root = smollm2_dir.parents[1]
    again = resolve_model(DEFAULT_MODEL, cache_root)
    assert again.directory == smollm2_dir and again.model_id == "default"
    assert default_gguf_path().name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    loaded = _load(smollm2_dir)
    assert loaded.config.architecture == "llama" and loaded.config.num_layers == 30
    assert loaded.tokenizer.chat_template and loaded.tokenizer.eos_token == "<|im_end|>"
    assert loaded.tokenizer.eos_token_ids[0] == 2


def test_gguf_conversion_is_shared_and_happens_once_under_concurrency(tmp_path, monkeypatch):
    """Shards starting together convert a GGUF file once and never replace the directory
    another is reading; copies of the same file (another clone, another venv) share it."""
    import threading
    import time

    from superinfer.shard import model_source

    calls = []

    def slow_convert(gguf, target):  # the real conversion is covered above; this times the race
        calls.append(gguf)
        time.sleep(0.3)
        target.mkdir(parents=True)
        (target / ".complete").write_text(str(gguf))

    monkeypatch.setattr(model_source, "convert_gguf", slow_convert)
    first, second = tmp_path / "a" / "m.gguf", tmp_path / "b" / "m.gguf"
    for path in (first, second):
        path.parent.mkdir()
        path.write_bytes(b"GGUF same bytes")
    results = []
    threads = [
        threading.Thread(target=lambda p=p: results.append(resolve_model(str(p), tmp_path / "cache")))
        for p in (first, second, first, second)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(calls) == 1
    assert len({result.directory for result in results}) == 1
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "m.gguf").write_bytes(b"GGUF other bytes")
    assert resolve_model(str(tmp_path / "c" / "m.gguf"), tmp_path / "cache").directory != results[0].directory
    assert len(calls) == 2


def test_generation_config_eos_ids_are_reported(model_dir):
    (model_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 7]}))
    assert _load(model_dir).tokenizer.eos_token_ids == (2, 7)


def test_tied_embeddings_share_the_weight(tmp_path):
    build_tiny_model(tmp_path, "llama", tie_word_embeddings=True)
    model = _load(tmp_path).model
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _fp8_checkpoint(source, target, method: str, block: tuple[int, int] | None = None):
    """`source`'s checkpoint with its layers' projections in FP8 (e4m3) in `target`, as `method`
    writes them: transformers' `fp8` (block scales, `weight_scale_inv`, in a second file), or
    `compressed-tensors` (`weight_scale` per block, or per output channel without `block`, with
    activation scales beside); and the float32 weights those FP8 values and scales stand for,
    worked out block by block."""
    shutil.copytree(source, target)
    state = load_file(str(target / "model.safetensors"))
    weights, scales, expected = {}, {}, {}
    for name, tensor in state.items():
        if not name.endswith(tuple(f"{proj}.weight" for proj in _LINEAR)):
            weights[name] = expected[name] = tensor
            continue
        rows, cols = block or (1, tensor.shape[1])
        grid = (-(-tensor.shape[0] // rows), -(-tensor.shape[1] // cols))
        scale = torch.empty(grid)
        quantized = torch.empty(tensor.shape, dtype=torch.float8_e4m3fn)
        dequantized = torch.empty(tensor.shape)
        for i in range(grid[0]):
            for j in range(grid[1]):
                part = tensor[i * rows:(i + 1) * rows, j * cols:(j + 1) * cols]
                scale[i, j] = part.abs().max() / 448.0
                quantized[i * rows:(i + 1) * rows, j * cols:(j + 1) * cols] = (part / scale[i, j]).to(torch.float8_e4m3fn)
                dequantized[i * rows:(i + 1) * rows, j * cols:(j + 1) * cols] = (
                    quantized[i * rows:(i + 1) * rows, j * cols:(j + 1) * cols].float() * scale[i, j])
        weights[name], expected[name] = quantized, dequantized
        stem = name.removesuffix(".weight")
        if method == "fp8":
            scales[f"{stem}.weight_scale_inv"] = scale
        else:
            weights[f"{stem}.weight_scale"] = scale  # [rows, 1] per channel, or one per block
            weights[f"{stem}.input_scale"] = torch.tensor(1.0)
    (target / "model.safetensors").unlink()
    if method == "fp8":
        save_file(weights, str(target / "model-00001-of-00002.safetensors"))
        save_file(scales, str(target / "model-00002-of-00002.safetensors"))
        (target / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
            **{name: "model-00001-of-00002.safetensors" for name in weights},
            **{name: "model-00002-of-00002.safetensors" for name in scales}}}))
        quantization = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                        "weight_block_size": list(block)}
    else:
        save_file(weights, str(target / "model.safetensors"))
        quantization = {"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {
            "group_0": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float", **(
                {"strategy": "block", "block_structure": list(block)} if block else {"strategy": "channel"})},
                        "input_activations": {"num_bits": 8, "type": "float", "strategy": "tensor"}}}}
    _edit_config(target, quantization_config=quantization)
    return expected


@pytest.mark.parametrize("layout", ["fp8 blocks", "compressed-tensors channels", "compressed-tensors blocks"])
def test_fp8_weights_are_dequantized_at_load_into_the_weights_they_stand_for(model_dir, tmp_path, layout):
    # 24 x 40 blocks: the projections' 32, 64 and 128 rows and columns end in partial blocks.
    method, scaled_by = layout.split()
    expected = _fp8_checkpoint(model_dir, tmp_path / "fp8", method, (24, 40) if scaled_by == "blocks" else None)
    reference = tmp_path / "dequantized"
    shutil.copytree(model_dir, reference)
    save_file(expected, str(reference / "model.safetensors"))
    loaded = _load(tmp_path / "fp8").model.state_dict()
    want = _load(reference).model.state_dict()
    assert loaded.keys() == want.keys()
    for name, tensor in want.items():
        assert torch.equal(loaded[name], tensor), name
    # FP8 is coarse: the weights moved, and the model still computes nearly what it did.
    original = _load(model_dir).model.state_dict()
    name = "model.layers.0.self_attn.qkv_proj.weight"
    assert not torch.equal(loaded[name], original[name])
    assert torch.allclose(loaded[name], original[name], rtol=0.07, atol=1e-3)
    prompt = [5, 9, 13, 21, 34, 55]
    fp8_logits = runner_logits(make_runner(tmp_path / "fp8"), prompt, [0])
    logits = runner_logits(make_runner(model_dir), prompt, [0])
    assert (fp8_logits.argmax(-1) == logits.argmax(-1)).float().mean() >= 0.8


@pytest.mark.parametrize("quantization, message", [
    ({"quant_method": "awq", "bits": 4}, "quant_method 'awq' is not supported"),
    ({"quant_method": "gptq", "bits": 4}, "quant_method 'gptq' is not supported"),
    ({"quant_method": "compressed-tensors", "config_groups": {"group_0": {"weights": {"num_bits": 4, "type": "int"}}}},
     "compressed-tensors group 'group_0' quantizes weights to 4-bit int"),
    ({"quant_method": "fp8", "weight_block_size": [128]}, "weight_block_size \\[128\\] is not two positive integers"),
])
def test_quantizations_that_cannot_be_loaded_are_refused_from_the_config_alone(model_dir, quantization, message):
    from superinfer.models.architectures import check_config
    from superinfer.models.config import ConfigError

    _edit_config(model_dir, quantization_config=quantization)
    with pytest.raises(ConfigError, match=message):
        check_config(json.loads((model_dir / "config.json").read_text()))
    (model_dir / "model.safetensors").unlink()  # refused before any weight is read
    with pytest.raises(LoaderError, match=message):
        _load(model_dir)


def test_fp8_weights_without_a_quantization_config_are_refused(model_dir):
    state = load_file(str(model_dir / "model.safetensors"))
    state["model.layers.0.mlp.up_proj.weight"] = state["model.layers.0.mlp.up_proj.weight"].to(torch.float8_e4m3fn)
    save_file(state, str(model_dir / "model.safetensors"))
    with pytest.raises(LoaderError, match="weight model.layers.0.mlp.up_proj.weight is FP8 but config.json has no "
                                          "quantization_config"):
        _load(model_dir)


def test_gloo_ranks_cut_their_slices_from_dequantized_fp8_weights(model_dir, tmp_path):
    import torch.multiprocessing as mp
    from test_tensor_parallel import _free_port, _rank, _whole

    _fp8_checkpoint(model_dir, tmp_path / "fp8", "fp8", (24, 40))
    expected, _, _ = _whole(tmp_path / "fp8")
    results = str(tmp_path / "rank")
    mp.spawn(_rank, args=(2, str(tmp_path / "fp8"), _free_port(), results), nprocs=2, join=True)
    got = torch.load(f"{results}.0", weights_only=False)["logits"]
    for logits, want in zip(got, expected, strict=True):
        torch.testing.assert_close(logits, want, rtol=1e-4, atol=1e-4)
