//! KV-cache events in vLLM's format, so a KV-aware router in front of several servers
//! (vllm-router's `kv_aware` policy) sends a request where its prefix is cached.
//!
//! The block manager records every change to the prefix cache's findable set
//! (`superinfer_scheduler::KvCacheEvent`); the engine hands each turn's changes to a
//! `KvEventSink`; the publisher task encodes them as vLLM's `KVEventBatch` (`wire`) and
//! publishes them on a ZeroMQ PUB socket, buffering them for replay on a ROUTER socket
//! (`publisher`). `--kv-events-config` takes vLLM's `KVEventsConfig` JSON (`config`);
//! `/kv_event_sources` tells a router where to subscribe.
mod config;
mod publisher;
mod wire;

pub use config::{KvEventSource, KvEventsConfig};
pub use publisher::{start_publisher, KvEventSink, KvEventsError};

#[cfg(test)]
mod tests;
