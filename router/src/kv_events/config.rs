//! `--kv-events-config`: vLLM's `KVEventsConfig` JSON, parsed once by the CLI, and the source
//! description `/kv_event_sources` serves from it.
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// vLLM's defaults for its ZMQ publisher.
const DEFAULT_ENDPOINT: &str = "tcp://*:5557";
const DEFAULT_BUFFER_STEPS: usize = 10_000;
const DEFAULT_HWM: usize = 100_000;

/// The one wire format published: what `/kv_event_sources` declares for a subscriber to check.
const ENCODING: &str = "msgpack";
const SCHEMA_VERSION: u32 = 1;

/// vLLM's `--kv-events-config`, field for field. Events are published only when
/// `enable_kv_cache_events` is true and the publisher is `zmq` (the default once enabled).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KvEventsConfig {
    #[serde(default)]
    pub enable_kv_cache_events: bool,
    /// "zmq" or "null"; unset: "zmq" when enabled.
    #[serde(default)]
    pub publisher: Option<String>,
    /// Where the PUB socket binds, `tcp://host:port` (`*` for every interface).
    #[serde(default = "default_endpoint")]
    pub endpoint: String,
    /// Where the ROUTER socket that replays missed batches binds; none: no replay.
    #[serde(default)]
    pub replay_endpoint: Option<String>,
    /// Batches kept for replay.
    #[serde(default = "default_buffer_steps")]
    pub buffer_steps: usize,
    /// Batches queued per subscriber before the PUB socket drops for it (reported to
    /// subscribers; a dropped batch is a sequence gap they replay).
    #[serde(default = "default_hwm")]
    pub hwm: usize,
    /// Accepted for vLLM's configs; the engine never drops an event, so it bounds nothing.
    #[serde(default)]
    pub max_queue_size: Option<usize>,
    /// The first frame of every message; subscribers filter on it.
    #[serde(default)]
    pub topic: String,
}

fn default_endpoint() -> String {
    DEFAULT_ENDPOINT.to_string()
}

fn default_buffer_steps() -> usize {
    DEFAULT_BUFFER_STEPS
}

fn default_hwm() -> usize {
    DEFAULT_HWM
}

/// One data-parallel rank's publisher, as `/kv_event_sources` describes it (vllm-router's
/// discovery reads these fields).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct KvEventSource {
    pub endpoint: String,
    pub replay_endpoint: Option<String>,
    pub topic: String,
    pub hwm: usize,
    pub buffer_steps: usize,
    pub publisher: String,
    pub encoding: String,
    pub schema_version: u32,
    pub enable_kv_cache_events: bool,
}

impl KvEventsConfig {
    /// The clap value parser: the JSON, checked whole.
    pub fn parse(json: &str) -> Result<Self, String> {
        let config: KvEventsConfig =
            serde_json::from_str(json).map_err(|error| format!("--kv-events-config: {error}"))?;
        match config.publisher.as_deref() {
            None | Some("zmq") | Some("null") => {}
            Some(other) => return Err(format!("--kv-events-config: unknown publisher {other:?} (zmq or null)")),
        }
        for endpoint in std::iter::once(&config.endpoint).chain(&config.replay_endpoint) {
            check_endpoint(endpoint)?;
        }
        if config.replay_endpoint.as_ref() == Some(&config.endpoint) {
            return Err("--kv-events-config: endpoint and replay_endpoint must differ".into());
        }
        Ok(config)
    }

    /// Whether events are published at all.
    pub fn publishes(&self) -> bool {
        self.enable_kv_cache_events && self.publisher.as_deref().unwrap_or("zmq") == "zmq"
    }

    /// `/kv_event_sources`: one publisher, data-parallel rank 0 (the router schedules every
    /// shard of its model as one); empty when nothing is published.
    pub fn sources(&self) -> BTreeMap<String, KvEventSource> {
        if !self.publishes() {
            return BTreeMap::new();
        }
        let source = KvEventSource {
            endpoint: self.endpoint.clone(),
            replay_endpoint: self.replay_endpoint.clone(),
            topic: self.topic.clone(),
            hwm: self.hwm,
            buffer_steps: self.buffer_steps,
            publisher: "zmq".to_string(),
            encoding: ENCODING.to_string(),
            schema_version: SCHEMA_VERSION,
            enable_kv_cache_events: true,
        };
        BTreeMap::from([("0".to_string(), source)])
    }
}

/// Only TCP is built in (`tcp://host:port`, host `*` for every interface).
fn check_endpoint(endpoint: &str) -> Result<(), String> {
    let valid = endpoint
        .strip_prefix("tcp://")
        .and_then(|address| address.rsplit_once(':'))
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
    if valid {
        Ok(())
    } else {
        Err(format!("--kv-events-config: endpoint {endpoint:?} is not tcp://host:port"))
    }
}

/// What `zeromq` binds: it takes `0.0.0.0` where ZeroMQ's configs write `*`.
pub(super) fn bind_address(endpoint: &str) -> String {
    match endpoint.strip_prefix("tcp://*:") {
        Some(port) => format!("tcp://0.0.0.0:{port}"),
        None => endpoint.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vllm_configs_parse_and_defaults_match_vllm() {
        let config = KvEventsConfig::parse(
            r#"{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:5557",
                "replay_endpoint":"tcp://*:5558","topic":"kv-events"}"#,
        )
        .unwrap();
        assert!(config.publishes());
        assert_eq!((config.buffer_steps, config.hwm), (10_000, 100_000));
        let sources = config.sources();
        let rank0 = &sources["0"];
        assert_eq!((rank0.endpoint.as_str(), rank0.replay_endpoint.as_deref()), ("tcp://*:5557", Some("tcp://*:5558")));
        assert_eq!((rank0.encoding.as_str(), rank0.schema_version, rank0.topic.as_str()), ("msgpack", 1, "kv-events"));
        assert_eq!(bind_address(&rank0.endpoint), "tcp://0.0.0.0:5557");
        let enabled_only = KvEventsConfig::parse(r#"{"enable_kv_cache_events":true}"#).unwrap();
        assert!(enabled_only.publishes(), "zmq is the publisher once enabled");
        assert_eq!(enabled_only.endpoint, "tcp://*:5557");
    }

    #[test]
    fn off_unless_enabled_with_zmq() {
        for json in [r#"{}"#, r#"{"publisher":"zmq"}"#, r#"{"enable_kv_cache_events":true,"publisher":"null"}"#] {
            let config = KvEventsConfig::parse(json).unwrap();
            assert!(!config.publishes(), "{json}");
            assert!(config.sources().is_empty());
        }
    }

    #[test]
    fn bad_configs_are_refused() {
        for json in [
            r#"{"enable_kv_cache_events":true,"publisher":"kafka"}"#,
            r#"{"enable_kv_cache_events":true,"endpoint":"ipc:///tmp/kv"}"#,
            r#"{"enable_kv_cache_events":true,"endpoint":"tcp://*:port"}"#,
            r#"{"enable_kv_cache_events":true,"replay_endpoint":"tcp://*:5557"}"#,
            r#"{"enable_kv_cache_events":true,"enpoint":"tcp://*:5557"}"#,
            "not json",
        ] {
            assert!(KvEventsConfig::parse(json).is_err(), "{json}");
        }
    }
}
