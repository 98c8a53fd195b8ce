"""The warm-up step-cost fit: exact on a linear machine, non-negative, and accurate on small
steps when large ones misbehave."""
import pytest

from superinfer.shard.warmup import _shapes, fit_step_cost


def _rows(shapes):
    # [1, prefill, decodes, context] as measure_step_cost builds them.
    return [[1.0, p, d, p + d * c] for p, d, c in shapes]


SHAPES = _shapes(512, 32, 512, 16)


def test_recovers_a_linear_machine_exactly():
    truth = (0.05, 0.002, 0.01, 0.0001)
    rows = _rows(SHAPES)
    times = [sum(t * x for t, x in zip(truth, row)) for row in rows]
    assert fit_step_cost(rows, times) == pytest.approx(truth, rel=1e-6)


def test_terms_are_never_negative():
    rows = _rows(SHAPES)
    # A machine where more context is (noisily) cheaper: plain least squares goes negative.
    times = [0.05 + 0.002 * r[1] + 0.01 * r[2] - 0.00001 * r[3] for r in rows]
    fitted = fit_step_cost(rows, times)
    assert all(v >= 0 for v in fitted)


def test_small_steps_stay_accurate_when_large_ones_are_superlinear():
    rows = _rows(SHAPES)
    # Attention that grows faster than linearly in context: only the largest shapes feel it.
    times = [0.05 + 0.002 * r[1] + 0.01 * r[2] + 0.0001 * r[3] + 2e-8 * r[3] ** 2 for r in rows]
    fitted = fit_step_cost(rows, times)
    small = [0.0, 0.0, 4.0, 4.0 * 128]  # four decodes over 128 tokens each
    small[0] = 1.0
    predicted = sum(f * x for f, x in zip(fitted, small))
    actual = 0.05 + 0.01 * 4 + 0.0001 * 512 + 2e-8 * 512**2
    assert predicted == pytest.approx(actual, rel=0.15)


@pytest.mark.parametrize("max_tokens, max_requests, blocks", [(64, 8, 48), (2048, 256, 64), (512, 32, 512)])
def test_shapes_fit_the_pool_and_the_budget(max_tokens, max_requests, blocks):
    shapes = _shapes(max_tokens, max_requests, blocks, 16)
    assert len(shapes) >= 5 and len(set(shapes)) == len(shapes)
    for prefill, decodes, context in shapes:
        assert prefill <= max_tokens and decodes <= max_requests
        assert -(-prefill // 16) * 16 + decodes * (-(-max(context, 1) // 16) * 16) <= blocks * 16
