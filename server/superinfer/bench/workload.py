"""A workload: when each request arrives, how long its prompt is, how many tokens it asks for.
Built in two stages so the simulator can share it: `requests_for` fixes arrivals and lengths (pure,
seeded), `attach_prompts` adds prompt text for a real server."""
from dataclasses import dataclass, field, replace
from typing import Literal

import numpy as np

from superinfer.bench.arrivals import bounded, gamma_arrivals
from superinfer.bench.prompts import LengthLimits, PromptBuilder, sharegpt_lengths
from superinfer.bench.sharegpt import Conversation
from superinfer.bench.tokenizer import Tokenizer
from superinfer.bench.trace import Trace

ArrivalKind = Literal["poisson", "gamma", "trace"]
LengthKind = Literal["fixed", "trace", "sharegpt"]


@dataclass(frozen=True)
class WorkloadConfig:
    arrival: ArrivalKind = "poisson"
    rate: float = 1.0
    # Gamma shape: 1 is Poisson, below 1 burstier.
    burstiness: float = 1.0
    num_requests: int | None = 100
    duration_s: float | None = None
    lengths: LengthKind = "fixed"
    prompt_tokens: int = 128
    output_tokens: int = 64
    limits: LengthLimits = field(default_factory=LengthLimits)
    # Generate exactly max_new_tokens (the recorded output length) whatever the model says.
    ignore_eos: bool = False
    seed: int = 0
    # Share of requests sent in priority class 0; the others go in class 1. 0: every request
    # in class 0 (no classes).
    high_priority_share: float = 0.0

    def __post_init__(self):
        if self.num_requests is None and self.duration_s is None:
            raise ValueError("a workload needs a bound: num_requests, duration_s or both")
        if not 0.0 <= self.high_priority_share <= 1.0:
            raise ValueError(f"high_priority_share must lie in [0, 1], got {self.high_priority_share}")


@dataclass(frozen=True)
class WorkloadRequest:
    index: int
    arrival_s: float
    prompt_tokens: int
    max_new_tokens: int
    ignore_eos: bool
    prompt: str | None = None
    # Priority class (lower first).
    priority: int = 0


def trace_start(config: WorkloadConfig, trace: Trace) -> int:
    """The trace row a trace-driven workload starts at: its head for seed 0 (every earlier
    measurement's), else a row the seed draws, leaving `num_requests` rows after it — so the
    repetitions of `bench compare --repeats` replay different stretches of the trace, not the
    same requests with other prompt text."""
    if config.seed == 0:
        return 0
    room = len(trace) - (config.num_requests or 1)
    return int(np.random.default_rng([config.seed, 0x7ACE]).integers(0, room + 1)) if room > 0 else 0


def _arrivals(config: WorkloadConfig, trace: Trace | None, rng: np.random.Generator) -> np.ndarray:
    if config.arrival == "trace":
        if trace is None:
            raise ValueError("trace arrivals need a trace file")
        # Scaled as a whole, then cut: `--rates` compresses time by the same factor for every window.
        window = trace.scaled_to(config.rate).window(trace_start(config, trace))
        return window.head(config.num_requests, config.duration_s).offsets_s
    shape = 1.0 if config.arrival == "poisson" else config.burstiness
    count = config.num_requests
    if count is None:
        # Enough arrivals to outlast the duration with overwhelming probability.
        count = int(config.rate * config.duration_s * 1.5) + 16
    return bounded(gamma_arrivals(config.rate, count, shape, rng), config.duration_s)


def _clip(prompt: int, output: int, limits: LengthLimits) -> tuple[int, int]:
    # Trace lengths are clipped rather than dropped so the trace keeps its arrival pattern.
    prompt = max(1, min(prompt, limits.max_prompt_tokens))
    return prompt, max(1, min(output, limits.max_total_tokens - prompt))


def requests_for(
    config: WorkloadConfig,
    trace: Trace | None = None,
    conversations: list[Conversation] | None = None,
    tokenizer: Tokenizer | None = None,
) -> list[WorkloadRequest]:
    """Arrivals and lengths. Same config and inputs, same workload. ShareGPT lengths need the
    conversations and a tokenizer; their prompts are the conversations' own text."""
    rng = np.random.default_rng(config.seed)
    arrivals = _arrivals(config, trace, rng)
    count = len(arrivals)
    texts: list[str | None] = [None] * count
    if config.lengths == "fixed":
        pairs = [(config.prompt_tokens, config.output_tokens)] * count
    elif config.lengths == "trace":
        if trace is None:
            raise ValueError("trace lengths need a trace file")
        # Trace arrivals keep their own rows; other arrivals draw rows at random.
        rows = (trace_start(config, trace) + np.arange(count) if config.arrival == "trace"
                else rng.integers(len(trace), size=count))
        pairs = [_clip(int(trace.prompt_tokens[r]), int(trace.output_tokens[r]), config.limits) for r in rows]
    elif config.lengths == "sharegpt":
        if conversations is None or tokenizer is None:
            raise ValueError("ShareGPT lengths need the conversations and a tokenizer")
        chosen = sharegpt_lengths(conversations, tokenizer, count, config.limits, rng)
        pairs = [(p, o) for _c, p, o in chosen]
        texts = [c.prompt for c, _p, _o in chosen]
    else:
        raise ValueError(f"unknown length source {config.lengths!r}")
    priorities = [0] * count
    if config.high_priority_share > 0:
        # Drawn from a generator of their own, so the arrivals and lengths stay those of the
        # same workload without classes.
        draws = np.random.default_rng([config.seed, 0x9A1]).random(count)
        priorities = [0 if d < config.high_priority_share else 1 for d in draws]
    return [
        WorkloadRequest(i, float(arrivals[i]), p, o, config.ignore_eos, texts[i], priorities[i])
        for i, (p, o) in enumerate(pairs)
    ]


def attach_prompts(specs: list[WorkloadRequest], builder: PromptBuilder) -> list[WorkloadRequest]:
    """Gives every spec without text a real prompt of its token length."""
    return [s if s.prompt is not None else replace(s, prompt=builder.build(s.prompt_tokens)) for s in specs]
