"""Architecture (the config's `model_type`) → model class. A new architecture is one file
and one line here."""
from .config import ConfigError
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


def model_class(architecture: str) -> type[DecoderForCausalLM]:
    try:
        return ARCHITECTURES[architecture]
    except KeyError:
        supported = ", ".join(sorted(ARCHITECTURES))
        raise UnsupportedArchitectureError(
            f"unsupported architecture {architecture!r}; supported: {supported}"
        ) from None
