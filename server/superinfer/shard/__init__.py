"""The shard: owns the tensors. `loader` (with `model_source`, `hub`, `gguf_convert`,
`tokenizer_info`) builds the model, `kv_cache` holds the paged device and host pools,
`model_runner` runs one forward per step, `sampling` picks tokens, `plan` validates a Step,
`service` executes Steps behind gRPC, `server` and `cli` run it on a unix socket."""
