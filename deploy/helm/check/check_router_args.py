"""Parses the vllm-router command line of every rendered router Deployment with the pinned
vllm-router's own parser and configuration checks, so a misspelt flag, a policy it lacks or a
wrong value type fails here rather than in a crash-looping pod.

    python check_router_args.py rendered.yaml...
"""
import contextlib
import io
import sys
from pathlib import Path

import yaml
from vllm_router.launch_router import parse_router_args
from vllm_router.router import Router


def router_commands(path: Path) -> list[tuple[str, list[str]]]:
    """(Deployment name, args) of each container whose command is vllm-router."""
    commands = []
    for obj in yaml.safe_load_all(path.read_text()):
        if not obj or obj.get("kind") != "Deployment":
            continue
        for container in obj["spec"]["template"]["spec"]["containers"]:
            if container.get("command") == ["vllm-router"]:
                commands.append((obj["metadata"]["name"], container.get("args", [])))
    return commands


def check(args: list[str]) -> str | None:
    """None if vllm-router would start with these flags, else the reason."""
    usage = io.StringIO()
    try:
        with contextlib.redirect_stderr(usage):
            parsed = parse_router_args(args)
        parsed._validate_router_args()
        Router.from_args(parsed)
    except SystemExit:
        # argparse printed its usage, then the reason on the last line.
        return usage.getvalue().strip().splitlines()[-1]
    except (ValueError, TypeError) as error:
        return str(error)
    if not parsed.service_discovery or not parsed.selector or not parsed.service_discovery_namespace:
        return "service discovery is not on, or has no selector or namespace"
    return None


def main() -> int:
    failures = checked = 0
    for path in map(Path, sys.argv[1:]):
        for name, args in router_commands(path):
            checked += 1
            reason = check(args)
            if reason is not None:
                failures += 1
                print(f"INVALID {path}: {name}: {reason}")
    if not checked:
        print("no vllm-router container in the manifests")
        return 1
    print(f"{checked - failures} router command lines accepted, {failures} rejected by vllm-router")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
