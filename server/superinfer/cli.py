"""The `superinfer` command line: one entry point, one subcommand per tool."""
import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="superinfer")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("version", help="print the version")
    args = parser.parse_args(argv)
    if args.command == "version":
        from superinfer import _router

        print(_router.__version__)
    return 0


if __name__ == "__main__":
    sys.exit(main())
