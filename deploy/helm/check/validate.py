"""Validates rendered Kubernetes manifests against the API schema of one Kubernetes release.

Built-in kinds go through kubernetes-validate (the release's OpenAPI schema as JSON Schema,
strict: an unknown field is an error). Custom resources, whose schemas Kubernetes does not ship,
go through the CRD schemas of @kubernetes-models (validate_crds.mjs, run with node). A kind
neither knows fails the check: nothing is skipped in silence.

    python validate.py --kube-version 1.35 --node-modules DIR rendered.yaml...
"""
import argparse
import json
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import yaml

# apiVersion/kind pairs validate_crds.mjs holds a schema for.
CUSTOM_RESOURCES = frozenset({
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("keda.sh/v1alpha1", "ScaledObject"),
})


class ManifestError(Exception):
    pass


def load_objects(paths: list[Path]) -> list[tuple[str, dict]]:
    """(source file, object) for every non-empty document of every file."""
    objects = []
    for path in paths:
        for document in yaml.safe_load_all(path.read_text()):
            if document is None:
                continue
            if not isinstance(document, dict) or "kind" not in document or "apiVersion" not in document:
                raise ManifestError(f"{path}: a document that is not a Kubernetes object: {document!r:.120}")
            objects.append((str(path), document))
    return objects


def name_of(obj: dict) -> str:
    return f"{obj['apiVersion']} {obj['kind']}/{obj.get('metadata', {}).get('name', '?')}"


def validate_builtin(obj: dict, kube_version: str) -> str | None:
    """None if valid, else the reason."""
    try:
        kubernetes_validate.validate(obj, kube_version, strict=True)
    except kubernetes_validate.ValidationError as error:
        path = ".".join(str(part) for part in error.path)
        return f"{path}: {error.message}"
    except kubernetes_validate.SchemaNotFoundError as error:
        return error.message
    return None


def validate_custom(objects: list[dict], node_modules: Path) -> list[str | None]:
    """One verdict per object, from validate_crds.mjs."""
    if not objects:
        return []
    script = Path(__file__).with_name("validate_crds.mjs")
    completed = subprocess.run(["node", str(script), str(node_modules)], input=json.dumps(objects),
                               capture_output=True, text=True, timeout=120)
    if completed.returncode != 0:
        raise ManifestError(f"validate_crds.mjs failed ({completed.returncode}): {completed.stderr.strip()}")
    verdicts = json.loads(completed.stdout)
    if len(verdicts) != len(objects):
        raise ManifestError(f"validate_crds.mjs answered {len(verdicts)} verdicts for {len(objects)} objects")
    return verdicts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kube-version", required=True, help="Kubernetes release, e.g. 1.35")
    parser.add_argument("--node-modules", type=Path, required=True,
                        help="node_modules holding @kubernetes-models/prometheus-operator and keda")
    parser.add_argument("manifests", type=Path, nargs="+")
    args = parser.parse_args()

    objects = load_objects(args.manifests)
    if not objects:
        raise ManifestError("no objects to validate")
    custom = [(source, obj) for source, obj in objects if (obj["apiVersion"], obj["kind"]) in CUSTOM_RESOURCES]
    verdicts = {id(obj): validate_builtin(obj, args.kube_version)
                for _, obj in objects if (obj["apiVersion"], obj["kind"]) not in CUSTOM_RESOURCES}
    for (_, obj), verdict in zip(custom, validate_custom([obj for _, obj in custom], args.node_modules)):
        verdicts[id(obj)] = verdict

    failures = 0
    for source, obj in objects:
        verdict = verdicts[id(obj)]
        if verdict is None:
            print(f"ok      {source}: {name_of(obj)}")
        else:
            failures += 1
            print(f"INVALID {source}: {name_of(obj)}: {verdict}")
    print(f"{len(objects) - failures} valid, {failures} invalid against Kubernetes {args.kube_version}")
    return 1 if failures else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except ManifestError as error:
        sys.exit(f"validate.py: {error}")
