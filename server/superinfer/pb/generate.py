"""Regenerates the gRPC stubs from `proto/shard.proto` with grpcio-tools.

grpcio-tools writes `import shard_pb2` into the service module, which only works with the
output directory on sys.path; the import is rewritten to a package-relative one so the stubs
live inside `superinfer.pb`."""
import argparse
import pathlib
import re
import sys

STUB_NAMES = ("shard_pb2.py", "shard_pb2.pyi", "shard_pb2_grpc.py")
_ABSOLUTE_IMPORT = re.compile(r"^import shard_pb2 as (\w+)$", re.MULTILINE)


class StubGenerationError(RuntimeError):
    """protoc failed to compile the protocol."""


def generate(proto_path: pathlib.Path, out_dir: pathlib.Path) -> list[pathlib.Path]:
    """Writes the three stub files for `proto_path` into `out_dir` and returns their paths."""
    from grpc_tools import protoc  # build-time dependency only

    proto_path = proto_path.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    include = pathlib.Path(protoc.__file__).parent / "_proto"
    args = [
        "grpc_tools.protoc",
        f"-I{proto_path.parent}",
        f"-I{include}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        str(proto_path),
    ]
    if protoc.main(args) != 0:
        raise StubGenerationError(f"protoc failed on {proto_path}")
    grpc_module = out_dir / "shard_pb2_grpc.py"
    text = grpc_module.read_text()
    grpc_module.write_text(_ABSOLUTE_IMPORT.sub(r"from . import shard_pb2 as \1", text))
    return [out_dir / name for name in STUB_NAMES]


def main(argv: list[str] | None = None) -> int:
    here = pathlib.Path(__file__).resolve().parent
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--proto", type=pathlib.Path, default=here.parents[2] / "proto" / "shard.proto")
    parser.add_argument("--out", type=pathlib.Path, default=here)
    args = parser.parse_args(argv)
    for path in generate(args.proto, args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
