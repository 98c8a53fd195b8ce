"""The stand-in runner that gpu_check.sh uses where pytest is missing reports real outcomes."""

from pathlib import Path

from superinfer_kv.tests.run_without_pytest import run

SAMPLE = '''
import pytest

@pytest.mark.parametrize("value", [1, 2])
@pytest.mark.parametrize("name, scale", [("a", 10), ("b", 20)])
def test_product(value, name, scale):
    assert value * scale != 40, f"{name} failed"

def test_raises_and_skip():
    with pytest.raises(ValueError, match="bad"):
        raise ValueError("bad id")
    pytest.skip("skipped on purpose")

def test_tmp_path(tmp_path):
    assert tmp_path.is_dir()
'''


def test_runner_counts_passes_failures_and_skips(tmp_path: Path) -> None:
    sample = tmp_path / "test_sample.py"
    sample.write_text(SAMPLE)
    # 4 cases of test_product, one failing (2 * 20); one skip; one pass with tmp_path.
    assert run([str(sample)]) == {"passed": 4, "failed": 1, "skipped": 1}
