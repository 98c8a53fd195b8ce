"""What the shard can run, known without torch: each supported `model_type` with the module
and class that implement it and the MLP activations it takes, and the one judgement of a
checkpoint's `config.json` against them (architecture, RoPE scaling, activation, quantization), each refusal
naming what is supported. The launcher calls it on config.json alone, before any weight is
fetched and before torch is imported; the registry (`models.registry`) imports the classes."""
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .config import ConfigError, ModelConfig, model_config_from_hf
from .quantization import fp8_layout


@dataclass(frozen=True)
class Architecture:
    # Module under superinfer.models and the class in it.
    module: str
    cls: str
    # config.json's names of the MLP activations it implements.
    activations: tuple[str, ...] = ("silu",)


ARCHITECTURES: dict[str, Architecture] = {
    "gemma2": Architecture("gemma", "Gemma2ForCausalLM", ("gelu_pytorch_tanh",)),
    "gemma3_text": Architecture("gemma", "Gemma3TextForCausalLM", ("gelu_pytorch_tanh",)),
    "granite": Architecture("granite", "GraniteForCausalLM"),
    "llama": Architecture("llama", "LlamaForCausalLM"),
    "mistral": Architecture("mistral", "MistralForCausalLM"),
    "mixtral": Architecture("mixtral", "MixtralForCausalLM"),
    "phi3": Architecture("phi3", "Phi3ForCausalLM"),
    "qwen2": Architecture("qwen2", "Qwen2ForCausalLM"),
    "qwen3": Architecture("qwen3", "Qwen3ForCausalLM"),
    "qwen3_moe": Architecture("qwen3_moe", "Qwen3MoeForCausalLM"),
}


class UnsupportedArchitectureError(ConfigError):
    """The model's architecture has no implementation here."""


def supported_architectures() -> list[str]:
    return sorted(ARCHITECTURES)


def architecture(model_type: str) -> Architecture:
    try:
        return ARCHITECTURES[model_type]
    except KeyError:
        raise UnsupportedArchitectureError(
            f"unsupported architecture {model_type!r}; supported: {', '.join(supported_architectures())}"
        ) from None


def check_config(raw: Any) -> ModelConfig:
    """The typed config of a checkpoint whose architecture, RoPE scaling and activation are
    supported; ConfigError saying what is not (and what is) otherwise."""
    if not isinstance(raw, Mapping):
        raise ConfigError("config.json is not a JSON object")
    model_type = raw.get("model_type")
    if not model_type:
        raise ConfigError(f"config.json names no model_type; supported: {', '.join(supported_architectures())}")
    spec = architecture(str(model_type))
    config = model_config_from_hf(dict(raw))
    fp8_layout(raw)  # a quantization the shard cannot load is refused here
    if config.activation not in spec.activations:
        raise ConfigError(f"unsupported activation {config.activation!r} for {model_type}; supported: "
                          f"{', '.join(spec.activations)}")
    return config
