"""What the shard keeps per request between steps: its token ids (prompt and every sampled
token), its sampling parameters and its own random generator."""
from dataclasses import dataclass, field
from functools import cached_property

import torch


@dataclass(frozen=True)
class SamplingParams:
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    typical_p: float = 1.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    # Subtracted from each token generated at least once (OpenAI's presence_penalty).
    presence_penalty: float = 0.0
    seed: int = 0
    top_n_tokens: int = 0
    # Token id -> bias added to its logit (OpenAI's logit_bias).
    logit_bias: dict[int, float] = field(default_factory=dict)
    # vLLM's min_tokens: until this many tokens are generated, `end_token_ids` (the router's
    # choice: the model's EOS, the request's stop tokens) get no probability.
    min_tokens: int = 0
    end_token_ids: tuple[int, ...] = ()
    # 0.0: none; else tokens below min_p × the most likely one's probability are left out.
    min_p: float = 0.0
    # Empty: every token; else only these may be chosen (vLLM's allowed_token_ids).
    allowed_token_ids: tuple[int, ...] = ()
    # Token sequences that may not be generated (vLLM's bad_words): the last token of each is
    # left out where the generated tokens end with the rest of it.
    bad_words: tuple[tuple[int, ...], ...] = ()

    @property
    def has_penalty(self) -> bool:
        return self.repetition_penalty != 1.0 or self.frequency_penalty != 0.0 or self.presence_penalty != 0.0

    @property
    def needs_host(self) -> bool:
        """Whether its next token is chosen on the host (a penalty, a logit bias, a restricted
        vocabulary), not by the device's greedy pick."""
        return self.has_penalty or bool(self.logit_bias) or bool(self.allowed_token_ids) or bool(self.bad_words)

    @cached_property
    def bad_word_endings(self) -> dict[int, dict[tuple[int, ...], tuple[int, ...]]]:
        """`bad_words` indexed once for every step: by the length of a word's leading tokens, then
        by those tokens, the last tokens that would complete a word. A step looks up the generated
        tokens' tail once per length instead of comparing every word (a request may name
        thousands)."""
        index: dict[int, dict[tuple[int, ...], list[int]]] = {}
        for word in self.bad_words:
            index.setdefault(len(word) - 1, {}).setdefault(word[:-1], []).append(word[-1])
        return {length: {lead: tuple(ends) for lead, ends in by_lead.items()}
                for length, by_lead in sorted(index.items())}

    @cached_property
    def allowed_ids(self) -> torch.Tensor:
        """`allowed_token_ids` as a host tensor, built once (up to the vocabulary's size)."""
        return torch.tensor(self.allowed_token_ids, dtype=torch.int64)

    def holds_back_end(self, num_generated: int) -> bool:
        """Whether the next token after `num_generated` may not end the generation."""
        return bool(self.end_token_ids) and num_generated < self.min_tokens

    def needs_host_after(self, num_generated: int) -> bool:
        """Whether the next token after `num_generated` is chosen on the host."""
        return self.needs_host or self.holds_back_end(num_generated)


@dataclass
class RequestState:
    request_id: int
    token_ids: list[int]
    prompt_len: int
    params: SamplingParams
    prompt_logprobs: bool = False
    # With prompt_logprobs: how many most likely tokens each prompt position lists.
    prompt_top_n: int = 0
    # The step that sampled the last of `token_ids` (0: none did): with one step in flight the
    # next step may feed that token before the router has seen it (`input_from_shard`).
    sampled_in_step: int = 0
    # Why sampling failed for it (the router fails it on reading the reply); a later step the
    # router planned before that reply gets the same error instead of computing.
    failure: str = ""
    # The LoRA adapter it runs with, as a slot (Info's `adapter_slots`, chosen at load; 0: the
    # base model), checked or resolved from its `adapter_id` when it was registered.
    adapter: int = 0
    _generator: torch.Generator | None = field(default=None, repr=False)

    @property
    def num_generated(self) -> int:
        return len(self.token_ids) - self.prompt_len

    @property
    def holds_back_end(self) -> bool:
        """Whether its next token may not end the generation (`min_tokens` not reached)."""
        return self.params.holds_back_end(self.num_generated)

    @property
    def needs_host(self) -> bool:
        """Whether its next token is chosen on the host, not by the device's greedy pick."""
        return self.params.needs_host_after(self.num_generated)

    def generator_for(self, device: torch.device) -> torch.Generator:
        """The request's generator, created (seeded) on first use on the device that samples."""
        if self._generator is None:
            self._generator = torch.Generator(device=device)
            self._generator.manual_seed(self.params.seed)
        return self._generator
