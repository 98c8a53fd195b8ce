"""The `superinfer` command line. Each subcommand lives in its own module, which exposes
`add_arguments(parser)` and `run(args) -> int`; modules are imported only when their command
runs, so `superinfer bench` never pays for importing torch."""
import argparse
import importlib
import sys

from superinfer.extras import install_hint

# command -> (module, help)
COMMANDS = {
    "launch": ("superinfer.launcher", "start the whole server: shard(s) and router"),
    "serve": ("superinfer.shard.cli", "run one shard (model runner) on a unix socket"),
    "bench": ("superinfer.bench.cli", "replay a workload against a running server"),
    "simulate": ("superinfer.simulate.cli", "drive the scheduler with a simulated clock"),
    "suite": ("superinfer.bench.suite", "every policy on every workload of the suite, measured or simulated"),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="superinfer", description="SLO-aware LLM inference server")
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_module, help_text) in COMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    known, _rest = parser.parse_known_args(argv[:1] if argv and not argv[0].startswith("-") else argv)
    if known.version:
        from superinfer import _router

        print(_router.__version__)
        return 0
    if known.command is None:
        parser.print_help()
        return 2
    try:
        module = importlib.import_module(COMMANDS[known.command][0])
        # No abbreviations: `--device` must never be taken for `--device-kv-blocks`.
        command_parser = argparse.ArgumentParser(prog=f"superinfer {known.command}", allow_abbrev=False)
        module.add_arguments(command_parser)
        return int(module.run(command_parser.parse_args(argv[1:])) or 0)
    except ModuleNotFoundError as error:
        # bench and simulate import their extra's modules when they load, plots and ShareGPT
        # when they run: either way the user is told which extra to install.
        hint = install_hint(error)
        if hint is None:
            raise
        print(f"superinfer {known.command}: {hint}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
