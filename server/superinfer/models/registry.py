"""Architecture (the config's `model_type`) → model class, from the one table of what the
shard runs (`architectures.ARCHITECTURES`: a new architecture is one file and one line there).
Classes are imported when first asked for.

`check_config` is the shard's whole judgement of a checkpoint's `config.json`: the torch-free
one (architecture, RoPE scaling, activation — what the launcher checks before anything is
fetched), then the architecture's own (`DecoderForCausalLM.check_config`: shapes and options
it cannot run). Both read nothing but that file, so a model is refused before any weight is."""
import importlib
from collections.abc import Mapping
from typing import Any

from . import architectures
from .architectures import UnsupportedArchitectureError, supported_architectures
from .config import ModelConfig
from .decoder import DecoderForCausalLM

__all__ = ["UnsupportedArchitectureError", "check_config", "model_class", "supported_architectures"]


def model_class(architecture: str) -> type[DecoderForCausalLM]:
    spec = architectures.architecture(architecture)
    return getattr(importlib.import_module(f"{__package__}.{spec.module}"), spec.cls)


def check_config(raw: Mapping[str, Any]) -> ModelConfig:
    """The typed config of a checkpoint this server can run; ConfigError saying what is not
    supported (and what is) otherwise."""
    config = architectures.check_config(raw)
    model_class(config.architecture).check_config(config)
    return config
