//! `/kv_event_sources`: where a router subscribes to this server's KV-cache events, in the
//! fields vllm-router's discovery reads; 404 while they are off (the default).
use axum::body::Body;
use axum::http::{Request, StatusCode};
use serde_json::{json, Value};

use super::{app, send};
use crate::http::HttpConfig;
use crate::kv_events::KvEventsConfig;

fn get(path: &str) -> Request<Body> {
    Request::get(path).body(Body::empty()).unwrap()
}

#[tokio::test]
async fn off_by_default() {
    let (app, _) = app(HttpConfig::default()).await;
    let (status, _, text) = send(&app, get("/kv_event_sources")).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{text}");
}

#[tokio::test]
async fn sources_name_the_publisher_and_its_wire_format() {
    let events = KvEventsConfig::parse(
        r#"{"enable_kv_cache_events":true,"endpoint":"tcp://*:5557","replay_endpoint":"tcp://*:5558","topic":"kv"}"#,
    )
    .unwrap();
    let (app, _) = app(HttpConfig { kv_event_sources: events.sources(), ..HttpConfig::default() }).await;
    let (status, _, text) = send(&app, get("/kv_event_sources")).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let body: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        body,
        json!({"0": {"endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558", "topic": "kv",
            "hwm": 100000, "buffer_steps": 10000, "publisher": "zmq", "encoding": "msgpack",
            "schema_version": 1, "enable_kv_cache_events": true}})
    );
}
