"""Greedy picks that stay on the device: the sampled token ids of a step as a device tensor
(the next step's inputs, fed by a device gather), their logprobs and top tokens copied to
pinned host memory without waiting, and a marker for the host-side token list until the
copy has landed.

This is what lets the shard start step N+1 before step N's tokens are on the host
(`ShardExecutor.launch` / `finish`, `servicer`): only plain greedy rows qualify — no
sampling, no penalty (both read the request's host-side history), no grammar mask, no prompt
logprobs — so nothing on the host needs N's tokens before N+1 runs. The figures are those
`sampling.sample` reports for the same rows: the argmax (first index on ties), the logprob
from a log-softmax of the unmodified logits, the top tokens by logprob."""
import torch

# Where a token sampled on the device sits in a request's host-side token list until the step
# that sampled it is finished (never a real id: ids are non-negative).
PENDING_TOKEN = -1


def plain_greedy(do_sample: bool, needs_host: bool, allowed_tokens: bytes) -> bool:
    """A row whose next token needs nothing from the host: greedy, no penalty or logit bias
    (`needs_host`), no grammar."""
    return not do_sample and not needs_host and not allowed_tokens


class DeviceSample:
    """One step's greedy picks: `tokens` [S] on the device at once; `result()` the host copy."""

    def __init__(self, logits: torch.Tensor, top_n: int):
        """logits: [S, V] float32, one row per sampled request; top_n: the most top tokens
        any row asked for."""
        log_probs = logits.log_softmax(-1)  # [S, V]
        self.tokens = logits.max(-1).indices  # [S], argmax with its first-index ties
        picked = log_probs.gather(1, self.tokens[:, None])[:, 0]
        top = torch.topk(log_probs, min(top_n, log_probs.shape[-1]), dim=-1) if top_n else None
        on_gpu = logits.is_cuda
        self._host = [self._copy(t, on_gpu) for t in (self.tokens, picked, *(top or ()))]
        self._top_n = top_n
        self._event = None
        if on_gpu:
            self._event = torch.cuda.Event()
            self._event.record()

    @staticmethod
    def _copy(tensor: torch.Tensor, on_gpu: bool) -> torch.Tensor:
        if not on_gpu:
            return tensor
        host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
        host.copy_(tensor, non_blocking=True)
        return host

    def ready(self) -> bool:
        """Whether the host copy has landed (always on the CPU)."""
        return self._event is None or self._event.query()

    def result(self) -> tuple[list[int], list[float], list[list[float]], list[list[int]]]:
        """Waits for the host copy: token ids, their logprobs, and each row's top logprobs and ids."""
        if self._event is not None:
            self._event.synchronize()
        tokens, logprobs = self._host[0].tolist(), self._host[1].tolist()
        if self._top_n:
            return tokens, logprobs, self._host[2].tolist(), self._host[3].tolist()
        return tokens, logprobs, [[] for _ in tokens], [[] for _ in tokens]
