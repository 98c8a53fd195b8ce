"""Architecture (the config's `model_type`) → model class. A new architecture is one file
and one line here.

`check_config` is the one place a checkpoint's `config.json` is judged: architecture, RoPE
scaling and activation, each refused with what is supported. It reads nothing but that file,
so a model is refused before any of its weights are fetched (`shard.model_source`)."""
from collections.abc import Mapping
from typing import Any

from .config import ConfigError, ModelConfig, model_config_from_hf
from .decoder import DecoderForCausalLM
from .llama import LlamaForCausalLM
from .mistral import MistralForCausalLM
from .qwen2 import Qwen2ForCausalLM

ARCHITECTURES: dict[str, type[DecoderForCausalLM]] = {
    "llama": LlamaForCausalLM,
    "mistral": MistralForCausalLM,
    "qwen2": Qwen2ForCausalLM,
}


class UnsupportedArchitectureError(ConfigError):
    """The model's architecture has no implementation here."""


def supported_architectures() -> list[str]:
    return sorted(ARCHITECTURES)


def model_class(architecture: str) -> type[DecoderForCausalLM]:
    try:
        return ARCHITECTURES[architecture]
    except KeyError:
        supported = ", ".join(supported_architectures())
        raise UnsupportedArchitectureError(
            f"unsupported architecture {architecture!r}; supported: {supported}"
        ) from None


def check_config(raw: Mapping[str, Any]) -> ModelConfig:
    """The typed config of a checkpoint this server can run; ConfigError saying what is not
    supported (and what is) otherwise."""
    if not isinstance(raw, Mapping):
        raise ConfigError("config.json is not a JSON object")
    architecture = raw.get("model_type")
    if not architecture:
        raise ConfigError(f"config.json names no model_type; supported: {', '.join(supported_architectures())}")
    cls = model_class(str(architecture))
    config = model_config_from_hf(dict(raw))
    if config.activation not in cls.ACTIVATIONS:
        raise ConfigError(f"unsupported activation {config.activation!r} for {architecture}; supported: "
                          f"{', '.join(cls.ACTIVATIONS)}")
    cls.check_config(config)
    return config
