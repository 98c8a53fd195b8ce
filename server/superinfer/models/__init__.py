"""Model definitions: one file per architecture (`llama`, `mistral`, `qwen2`) over the shared
`decoder`, with paged `attention`, `rotary` embeddings, the typed `config` and the `registry`.
Model files hold modules only; checkpoint renames live in `superinfer.shard.loader`."""
