"""Runs the Rust router in this process: `python -m superinfer.router_main [router flags]`.

The launcher starts it as its own process so that a router crash never takes the shard's
Python interpreter with it (and the reverse). Flags are the router's (`--help` lists them)."""
import sys


def main(argv: list[str] | None = None) -> int:
    from superinfer import _router

    argv = sys.argv[1:] if argv is None else argv
    try:
        _router.serve(argv)
    except ValueError as error:  # bad flags: clap's message says which
        print(error, file=sys.stderr)
        return 2
    except RuntimeError as error:  # start-up or serving failed; the router logged the details
        print(f"router: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # the router already stopped on the same SIGINT
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
