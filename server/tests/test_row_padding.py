"""Projections pad their rows on the CPU up to the cheapest row count the warm-up measured
(`models.row_padding`): a few rows run as matrix-vector products, each re-reading the weights."""
import torch

from superinfer.models.decoder import Linear
from superinfer.models.row_padding import MAX_ROWS, measure, padded_rows, plan


def test_rows_are_padded_to_the_cheapest_count_at_or_above_them_only_for_a_clear_gain():
    # As measured on the CPU machine's LM head (ms): 2 and 3 rows cost more than 4.
    times = [9.9, 21.7, 32.6, 16.6, 19.1, 18.6, 18.7, 18.8]
    assert plan(times) == (1, 4, 4, 4, 5, 6, 7, 8)
    # Within the noise margin nothing moves; more rows are never chosen when they cost more.
    assert plan([10.0, 19.0, 18.0, 17.0]) == (1, 2, 3, 4)
    assert plan([1.0, 2.0, 3.0, 4.0]) == (1, 2, 3, 4)
    table = plan(times)
    assert [padded_rows(table, rows) for rows in (1, 2, 3, 5, 9, 40)] == [1, 4, 4, 5, 9, 40]
    assert padded_rows((), 3) == 3


def test_a_padded_projection_computes_the_same_rows(monkeypatch):
    from superinfer.models import decoder

    computed_rows = []
    linear_product = decoder.F.linear
    monkeypatch.setattr(decoder.F, "linear", lambda x, *rest: computed_rows.append(x.shape[0]) or linear_product(x, *rest))
    torch.manual_seed(0)
    linear = Linear(64, 96, bias=True)
    linear.weight.copy_(torch.randn(96, 64))
    linear.bias.copy_(torch.randn(96))
    x = torch.randn(3, 64)
    expected = linear(x)
    linear.row_padding = (1, 4, 4, 4)
    padded = linear(x)
    assert padded.shape == (3, 96) and padded.is_contiguous()
    torch.testing.assert_close(padded, expected)
    assert computed_rows == [3, 4], "the padded call computes 4 rows"
    # A row count the table keeps runs as it comes.
    assert torch.equal(linear(x[:1]), torch.nn.functional.linear(x[:1], linear.weight, linear.bias))


def test_warm_up_measures_a_table_on_the_cpu_and_none_elsewhere():
    head = Linear(32, 1024, bias=False)
    head.weight.copy_(torch.randn(1024, 32))
    table = measure(head, 32, torch.float32, torch.device("cpu"), repeats=1)
    assert len(table) == MAX_ROWS and all(rows <= padded <= MAX_ROWS for rows, padded in enumerate(table, 1))
    assert measure(head, 32, torch.float32, torch.device("meta")) == ()


def test_warm_up_sets_every_projections_table(tiny_llama_dir):
    from conftest import make_executor

    from superinfer.models.decoder import Linear

    runner = make_executor(tiny_llama_dir).runner
    projections = [m for m in runner.model.modules() if type(m) is Linear]
    assert len(runner.row_padding) == MAX_ROWS and projections
    assert all(m.row_padding == runner.row_padding for m in projections)
    runner.set_row_padding(())
    assert all(m.row_padding == () for m in projections)
