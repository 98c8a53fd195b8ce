"""The grammar's allowed-token bitmasks of a Step (`ScheduledRequest.allowed_tokens`), as one
boolean tensor. The router computes each constrained request's mask; the shard only applies it:
token t is bit t % 8 of byte t / 8, and every id past a mask's end (the model's padded
vocabulary included) is disallowed. Unpacking runs in numpy (`unpackbits`), far cheaper than
the same bit arithmetic in torch."""
import numpy as np
import torch


def unpack_allowed(masks: list[bytes], vocab_size: int, device: torch.device) -> torch.Tensor | None:
    """One packed mask per row (b"" for an unconstrained row) -> [R, vocab_size] bool, True
    where a row may sample the token; None when no row is constrained."""
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
    return torch.from_numpy(bits.view(np.bool_)).to(device)
