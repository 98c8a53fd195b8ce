"""The warm-up's step shapes fit the pool and the budget, and its fit is the scheduler
crate's."""
import pytest

from superinfer import _router
from superinfer.shard.warmup import _shapes

SHAPES = _shapes(512, 32, 512, 16)


def test_the_warm_up_fit_is_the_scheduler_crates():
    # The fit itself is tested in Rust (superinfer_scheduler::cost_fit); this checks the
    # binding the warm-up calls: a linear machine comes back exactly, terms in order.
    truth = (0.05, 0.002, 0.01, 0.0001)
    shapes = [(p, d, p + d * c) for p, d, c in SHAPES]
    times = [truth[0] + truth[1] * p + truth[2] * d + truth[3] * c for p, d, c in shapes]
    assert _router.fit_step_cost(shapes, times) == pytest.approx(truth, rel=1e-6)
    with pytest.raises(ValueError):
        _router.fit_step_cost(shapes, times[:-1])


@pytest.mark.parametrize("max_tokens, max_requests, blocks", [(64, 8, 48), (2048, 256, 64), (512, 32, 512)])
def test_shapes_fit_the_pool_and_the_budget(max_tokens, max_requests, blocks):
    shapes = _shapes(max_tokens, max_requests, blocks, 16)
    assert len(shapes) >= 5 and len(set(shapes)) == len(shapes)
    for prefill, decodes, context in shapes:
        assert prefill <= max_tokens and decodes <= max_requests
        assert -(-prefill // 16) * 16 + decodes * (-(-max(context, 1) // 16) * 16) <= blocks * 16
