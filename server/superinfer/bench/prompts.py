"""Prompts of an exact token length, cut from real text (ShareGPT human turns), and
ShareGPT-like (prompt, output) length pairs. Cutting at a token's end offset keeps the prompt
close to the requested length when the server re-tokenizes it (BPE merges can move it by a
token at the cut)."""
from dataclasses import dataclass

import numpy as np

from superinfer.bench.sharegpt import Conversation
from superinfer.bench.tokenizer import Tokenizer


@dataclass(frozen=True)
class LengthLimits:
    """vLLM's ShareGPT filter by default: drop sequences shorter than `min_tokens` on either
    side, prompts longer than `max_prompt_tokens`, or totals longer than `max_total_tokens`."""

    min_tokens: int = 4
    max_prompt_tokens: int = 1024
    max_total_tokens: int = 2048

    def accepts(self, prompt_tokens: int, output_tokens: int) -> bool:
        return (
            prompt_tokens >= self.min_tokens
            and output_tokens >= self.min_tokens
            and prompt_tokens <= self.max_prompt_tokens
            and prompt_tokens + output_tokens <= self.max_total_tokens
        )


class PromptBuilder:
    """Builds prompt texts of a requested token count from a pool of real texts."""

    def __init__(self, conversations: list[Conversation], tokenizer: Tokenizer, rng: np.random.Generator):
        if not conversations:
            raise ValueError("PromptBuilder needs at least one conversation")
        self.texts = [c.prompt for c in conversations]
        self.tokenizer = tokenizer
        self.rng = rng

    def build(self, tokens: int) -> str:
        """A text of exactly `tokens` tokens by the tokenizer's count (texts from random
        conversations are joined until long enough, then cut at the last token's end)."""
        if tokens <= 0:
            raise ValueError(f"a prompt needs at least one token, got {tokens}")
        text = ""
        # Roughly 4 characters per token in English; asking for 6 makes a second round rare.
        while True:
            while len(text) < 6 * tokens:
                text += self.texts[int(self.rng.integers(len(self.texts)))] + "\n\n"
            spans = self.tokenizer.spans(text)
            if len(spans) >= tokens:
                return text[: spans[tokens - 1][1]]
            text += text


def sharegpt_lengths(
    conversations: list[Conversation],
    tokenizer: Tokenizer,
    count: int,
    limits: LengthLimits,
    rng: np.random.Generator,
) -> list[tuple[Conversation, int, int]]:
    """`count` conversations drawn at random (without replacement while possible) that pass
    `limits`, each with its prompt and completion token counts."""
    chosen: list[tuple[Conversation, int, int]] = []
    order = rng.permutation(len(conversations))
    for index in order:
        conversation = conversations[int(index)]
        prompt_tokens = len(tokenizer.spans(conversation.prompt))
        output_tokens = len(tokenizer.spans(conversation.completion))
        if limits.accepts(prompt_tokens, output_tokens):
            chosen.append((conversation, prompt_tokens, output_tokens))
            if len(chosen) == count:
                return chosen
    if not chosen:
        raise ValueError("no ShareGPT conversation passes the length limits")
    # Fewer usable conversations than requests: reuse them in the same random order.
    return [chosen[i % len(chosen)] for i in range(count)]
