"""The committed gRPC stubs must match what grpcio-tools generates from proto/shard.proto."""
import pathlib

from superinfer.pb import generate

PB_DIR = pathlib.Path(generate.__file__).resolve().parent
PROTO = PB_DIR.parents[2] / "proto" / "shard.proto"


def test_committed_stubs_match_the_proto(tmp_path):
    fresh = generate.generate(PROTO, tmp_path)
    stale = [path.name for path in fresh if path.read_text() != (PB_DIR / path.name).read_text()]
    assert not stale, f"stale stubs {stale}: run `make proto` and commit server/superinfer/pb/"


def test_service_module_imports_relative():
    text = (PB_DIR / "shard_pb2_grpc.py").read_text()
    assert "from . import shard_pb2" in text
    assert "\nimport shard_pb2" not in text
