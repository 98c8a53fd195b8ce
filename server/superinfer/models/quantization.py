"""Quantized checkpoints, known without torch: which `quantization_config`s the shard can load,
and how. FP8 weights (`float8_e4m3fn`, with their scales) are de-quantized once, at load, into
the compute dtype — the model the checkpoint describes, at the memory of that dtype (vLLM runs
FP8 matmuls on GPUs that have them; this server does not yet). Three layouts:

- `fp8` (transformers' fine-grained FP8, Qwen3-*-FP8, DeepSeek): `<name>.weight_scale_inv`, one
  scale per `weight_block_size` block of the weight, which the block is multiplied by;
- `compressed-tensors` with 8-bit float weights (llm-compressor's FP8, FP8-dynamic, FP8-block):
  a `<name>.weight_scale` per tensor, per output channel or per block;
- `fbgemm_fp8`: a `<name>.weight_scale` per output channel.

Activation and KV-cache scales (`input_scale`, `k_scale`, `v_scale`) are not needed once the
weights are de-quantized, and are skipped. Any other method (AWQ, GPTQ, bitsandbytes, integer
compressed-tensors, …) is refused from config.json alone, before a weight is fetched."""
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .config import ConfigError

SUPPORTED = ("fp8", "compressed-tensors (float 8-bit weights)", "fbgemm_fp8")


@dataclass(frozen=True)
class Fp8Layout:
    """How a checkpoint's FP8 weights are scaled: the scale tensor's suffix (beside `weight`), and
    for block scales the block's (rows, columns); None: per tensor or per output channel."""

    scale_suffix: str
    block: tuple[int, int] | None = None


# Checkpoint tensors that de-quantized weights no longer need.
SKIPPED_SUFFIXES = (".input_scale", ".k_scale", ".v_scale", ".weight_scale", ".weight_scale_inv")


def fp8_layout(raw: Mapping[str, Any]) -> Fp8Layout | None:
    """The FP8 layout of a checkpoint's config.json; None when its weights are not quantized.
    ConfigError for a quantization the shard cannot load, naming what it can."""
    quantization = raw.get("quantization_config")
    if quantization is None:
        return None
    if not isinstance(quantization, Mapping):
        raise ConfigError("config.json's quantization_config is not an object")
    method = str(quantization.get("quant_method", "")).lower()

    def refused(why: str) -> ConfigError:
        return ConfigError(f"{why}; quantized checkpoints load when their weights are FP8 ({', '.join(SUPPORTED)}, "
                           "de-quantized at load): use the model's unquantized or FP8 release")

    if method == "fp8":
        block = quantization.get("weight_block_size")
        return Fp8Layout(".weight_scale_inv", None if block is None else _block(block, "weight_block_size"))
    if method == "fbgemm_fp8":
        return Fp8Layout(".weight_scale")
    if method == "compressed-tensors":
        blocks = set()
        for name, group in (quantization.get("config_groups") or {}).items():
            weights = (group or {}).get("weights") or {}
            if weights.get("num_bits") != 8 or weights.get("type") != "float":
                raise refused(f"compressed-tensors group {name!r} quantizes weights to {weights.get('num_bits')}-bit "
                              f"{weights.get('type')}")
            strategy = weights.get("strategy")
            if strategy == "block":
                blocks.add(_block(weights.get("block_structure"), "compressed-tensors' block_structure"))
            elif strategy not in (None, "tensor", "channel"):
                raise refused(f"compressed-tensors group {name!r} scales weights by {strategy!r}")
        if len(blocks) > 1:
            raise refused(f"compressed-tensors groups scale by blocks of different shapes {sorted(blocks)}")
        return Fp8Layout(".weight_scale", blocks.pop() if blocks else None)
    raise refused(f"quant_method {method or 'unnamed'!r} is not supported")


def _block(block: Any, field: str) -> tuple[int, int]:
    if not (isinstance(block, list) and len(block) == 2 and all(isinstance(n, int) and n > 0 for n in block)):
        raise ConfigError(f"quantization_config's {field} {block!r} is not two positive integers")
    return block[0], block[1]
