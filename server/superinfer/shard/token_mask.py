"""The grammar's allowed-token bitmasks of a Step (`ScheduledRequest.allowed_tokens`), as one
boolean tensor. The router computes each constrained request's mask; the shard only applies it:
token t is bit t % 8 of byte t / 8, and every id past a mask's end (the model's padded
vocabulary included) is disallowed. The masks become an additive bias (0 where allowed, -inf
elsewhere) built in numpy: unpacking bits and one `logits + bias` cost a fraction of torch's
bit arithmetic or `torch.where` over a boolean mask on the CPU."""
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class AllowedTokens:
    # [R, V] float32: 0 where row r may sample the token, -inf elsewhere.
    bias: torch.Tensor
    # Rows whose mask allows nothing (their requests fail alone), found from the bytes.
    empty_rows: list[int]


def unpack_allowed(masks: list[bytes], vocab_size: int, device: torch.device) -> AllowedTokens | None:
    """One packed mask per row (b"" for an unconstrained row); None when no row is
    constrained."""
    if not any(masks):
        return None
    width = -(-vocab_size // 8)
    packed = np.full((len(masks), width), 0xFF, dtype=np.uint8)  # [R, ceil(V / 8)]
    for row, mask in enumerate(masks):
        if mask:
            kept = np.frombuffer(mask[:width], dtype=np.uint8)
            packed[row] = 0
            packed[row, : len(kept)] = kept
    bits = np.unpackbits(packed, axis=1, count=vocab_size, bitorder="little")  # [R, V] of 0/1
    with np.errstate(divide="ignore"):
        bias = np.log(bits.astype(np.float32))  # log 1 = 0, log 0 = -inf
    empty_rows = [row for row, mask in enumerate(masks) if mask and not mask.strip(b"\0")]
    return AllowedTokens(torch.from_numpy(bias).to(device), empty_rows)
