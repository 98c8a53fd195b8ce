"""One-time conversion of a GGUF checkpoint into a Hugging Face directory (float32
safetensors, config.json, tokenizer files), so later starts skip de-quantisation.

transformers reads GGUF (de-quantising with a progress bar) but refuses to save such a model,
so the state dict and config are written here directly. The result is built in a temporary
sibling directory and renamed into place, so an interrupted conversion never looks complete."""
import json
import logging
import pathlib
import shutil
import tempfile
import time

from .errors import LoaderError

log = logging.getLogger(__name__)


def convert_gguf(gguf: pathlib.Path, target: pathlib.Path) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target.parent.mkdir(parents=True, exist_ok=True)
    staging = pathlib.Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    started = time.perf_counter()
    log.info("converting %s (%.2f GB) once into %s: de-quantizing with transformers", gguf, gguf.stat().st_size / 1e9,
             target)
    try:
        try:
            tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
            model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        except Exception as err:  # transformers raises many kinds for a bad file
            raise LoaderError(f"cannot read GGUF file {gguf}: {err}") from err
        log.info("de-quantized in %.1f s; writing float32 safetensors", time.perf_counter() - started)
        tied = bool(model.config.tie_word_embeddings)
        state = {
            name: tensor.contiguous()
            for name, tensor in model.state_dict().items()
            if not (tied and name == "lm_head.weight")
        }
        save_file(state, str(staging / "model.safetensors"), metadata={"format": "pt"})
        config = model.config.to_dict()
        config.pop("quantization_config", None)
        config["architectures"] = [type(model).__name__]
        (staging / "config.json").write_text(json.dumps(config, indent=2))
        model.generation_config.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        (staging / ".complete").write_text(str(gguf))
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
        log.info("converted %s in %.1f s", gguf.name, time.perf_counter() - started)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
