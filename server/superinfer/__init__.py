"""SuperInfer: an SLO-aware LLM inference server (Python side: launcher, shard, tools)."""
