"""Generated Python stubs of the router ⇄ shard protocol (`proto/shard.proto`).

The stubs are committed so that wheels build without protoc; `make proto` regenerates them
(through `superinfer.pb.generate`) and a test fails when they no longer match the .proto."""
