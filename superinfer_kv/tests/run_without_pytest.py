"""Runs DuplexKV test modules where pytest is not installed (bare GPU images, no network).

Supports the subset these tests use: `pytest.mark.parametrize` (stacked), a module-level
`pytestmark = pytest.mark.skipif(...)`, `pytest.raises(..., match=...)`, `pytest.skip` and
the `tmp_path` fixture. Usage: python -m superinfer_kv.tests.run_without_pytest FILE... ;
prints one line per test and a JSON summary; exits non-zero when a test fails.
"""

from __future__ import annotations

import importlib.util
import inspect
import itertools
import json
import re
import sys
import tempfile
import traceback
import types
from pathlib import Path


class Skipped(Exception):
    """Raised by the stand-in `pytest.skip`."""


class _Raises:
    def __init__(self, expected: type[BaseException], match: str | None = None) -> None:
        self.expected, self.match = expected, match

    def __enter__(self) -> _Raises:
        return self

    def __exit__(self, kind, error, trace) -> bool:
        if kind is None:
            raise AssertionError(f"did not raise {self.expected.__name__}")
        if not issubclass(kind, self.expected):
            return False
        if self.match and not re.search(self.match, str(error)):
            raise AssertionError(f"{error!r} does not match {self.match!r}")
        return True


class _Mark:
    def parametrize(self, names, values):
        def decorate(function):
            function.__dict__.setdefault("parameters", []).insert(0, (names, values))
            return function

        return decorate

    def skipif(self, condition: bool, reason: str = ""):
        return types.SimpleNamespace(condition=condition, reason=reason)


def _pytest_stand_in() -> types.ModuleType:
    module = types.ModuleType("pytest")
    module.mark = _Mark()
    module.raises = _Raises
    module.skip = lambda reason="": (_ for _ in ()).throw(Skipped(reason))
    return module


def _cases(function):
    """(id, kwargs) for every combination of the stacked parametrize decorators."""
    axes = []
    for names, values in function.__dict__.get("parameters", []):
        names = [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names)
        rows = [dict(zip(names, v if len(names) > 1 else (v,))) for v in values]
        axes.append(rows)
    for combination in itertools.product(*axes):
        kwargs = {k: v for row in combination for k, v in row.items()}
        yield "-".join(str(v) for v in kwargs.values()), kwargs


def _run_case(function, kwargs) -> tuple[str, str]:
    try:
        with tempfile.TemporaryDirectory() as tmp:
            if "tmp_path" in inspect.signature(function).parameters:
                kwargs = {**kwargs, "tmp_path": Path(tmp)}
            function(**kwargs)
        return "passed", ""
    except Skipped as skip:
        return "skipped", str(skip)
    except Exception:
        return "failed", traceback.format_exc()


def _run_module(path: str, counts: dict[str, int]) -> None:
    spec = importlib.util.spec_from_file_location(Path(path).stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    mark = getattr(module, "pytestmark", None)
    tests = [(n, f) for n, f in vars(module).items() if n.startswith("test_") and callable(f)]
    for name, function in tests:
        for case_id, kwargs in _cases(function):
            if mark is not None and mark.condition:
                outcome, detail = "skipped", mark.reason
            else:
                outcome, detail = _run_case(function, kwargs)
            counts[outcome] += 1
            print(f"{path}::{name}[{case_id}] {outcome.upper()}", flush=True)
            if outcome == "failed":
                print(detail, flush=True)


def run(paths: list[str]) -> dict[str, int]:
    """Runs every test in `paths` with the stand-in `pytest` (the real one, if any, is put
    back afterwards); returns the counts of passed, failed and skipped cases."""
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    real = sys.modules.get("pytest")
    sys.modules["pytest"] = _pytest_stand_in()
    try:
        for path in paths:
            _run_module(path, counts)
    finally:
        if real is None:
            del sys.modules["pytest"]
        else:
            sys.modules["pytest"] = real
    return counts


def main(paths: list[str]) -> int:
    counts = run(paths)
    print(json.dumps(counts))
    return 1 if counts["failed"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
