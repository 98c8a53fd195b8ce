"""The grammar's allowed-token bitmasks of a Step (`ScheduledRequest.allowed_tokens`), as one
boolean tensor. The router computes each constrained request's mask; the shard only applies it:
token t is bit t % 8 of byte t / 8, and every id past a mask's end (the model's padded
vocabulary included) is disallowed."""
import torch

# Bit b of a byte, for b in 0..7 (the little-endian bit order the router packs).
_BIT_VALUES = torch.tensor([1 << bit for bit in range(8)], dtype=torch.uint8)


def unpack_allowed(masks: list[bytes], vocab_size: int, device: torch.device) -> torch.Tensor | None:
    """One packed mask per row (b"" for an unconstrained row) -> [R, vocab_size] bool, True
    where a row may sample the token; None when no row is constrained."""
    if not any(masks):
        return None
    width = -(-vocab_size // 8)
    packed = torch.full((len(masks), width), 0xFF, dtype=torch.uint8)  # [R, ceil(V / 8)]
    for row, mask in enumerate(masks):
        if mask:
            packed[row] = 0
            kept = mask[:width]
            packed[row, : len(kept)] = torch.frombuffer(bytearray(kept), dtype=torch.uint8)
    bits = (packed[:, :, None] & _BIT_VALUES) != 0  # [R, ceil(V / 8), 8]
    return bits.reshape(len(masks), width * 8)[:, :vocab_size].to(device)
