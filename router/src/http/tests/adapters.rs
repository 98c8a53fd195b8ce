//! LoRA adapters through the HTTP routes: TGI's `adapter_id` and OpenAI's `model` name one of
//! the adapters the shard loaded, which reaches the shard with the request; an adapter the
//! server did not load is a 422; `/v1/models` lists them; prefix-cache blocks are never shared
//! between adapters.
use axum::body::Body;
use axum::http::{Request, StatusCode};
use serde_json::{json, Value};

use super::scripted_shard::ADAPTERS;
use super::{app, post, send, sse_data};
use crate::http::HttpConfig;

#[tokio::test]
async fn a_request_runs_with_the_adapter_it_names() {
    let (app, log) = app(HttpConfig::default()).await;
    for (adapter, expected) in [(Some("sql-lora"), "sql-lora"), (None, ""), (Some("smollm2-test"), ""), (Some(""), "")] {
        let body = json!({"inputs": "x", "parameters": {"max_new_tokens": 2, "adapter_id": adapter}});
        let (status, _, text) = send(&app, post("/generate", &body)).await;
        assert_eq!(status, StatusCode::OK, "{text}");
        assert_eq!(log.lock().unwrap().new_requests.last().unwrap().adapter_id, expected, "{adapter:?}");
    }
    let chat = json!({"model": "chat-lora", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2});
    let (status, _, text) = send(&app, post("/v1/chat/completions", &chat)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert_eq!(log.lock().unwrap().new_requests.last().unwrap().adapter_id, "chat-lora");
    // Whatever else a client library sends as `model` is the base model.
    let completion = json!({"model": "gpt-4o", "prompt": "x", "max_tokens": 2});
    let (status, _, text) = send(&app, post("/v1/completions", &completion)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert_eq!(log.lock().unwrap().new_requests.last().unwrap().adapter_id, "");
}

#[tokio::test]
async fn an_adapter_the_server_did_not_load_is_422_naming_those_it_did() {
    let (app, log) = app(HttpConfig::default()).await;
    let body = json!({"inputs": "x", "parameters": {"adapter_id": "absent-lora"}});
    let (status, _, text) = send(&app, post("/generate", &body)).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{text}");
    let error: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(error["error_type"], "validation");
    let message = "Input validation error: adapter `absent-lora` is not loaded; loaded adapters: sql-lora, chat-lora";
    assert_eq!(error["error"], message);
    // On the streaming route, as every validation error there (TGI's way): one error event.
    let (_, _, text) = send(&app, post("/generate_stream", &body)).await;
    let events = sse_data(&text);
    assert_eq!(events.len(), 1, "{text}");
    assert_eq!(events[0]["error"], message);
    assert!(log.lock().unwrap().new_requests.is_empty());
}

#[tokio::test]
async fn v1_models_lists_the_base_model_and_its_adapters() {
    let (app, _) = app(HttpConfig::default()).await;
    let (status, _, text) = send(&app, Request::get("/v1/models").body(Body::empty()).unwrap()).await;
    assert_eq!(status, StatusCode::OK);
    let models: Value = serde_json::from_str(&text).unwrap();
    let ids: Vec<&str> = models["data"].as_array().unwrap().iter().map(|card| card["id"].as_str().unwrap()).collect();
    assert_eq!(ids, [["smollm2-test"].as_slice(), ADAPTERS.as_slice()].concat());
    // Each one by its id (`client.models.retrieve`); any other id is a 404.
    for id in ["smollm2-test", ADAPTERS[0]] {
        let (status, _, text) = send(&app, Request::get(format!("/v1/models/{id}")).body(Body::empty()).unwrap()).await;
        assert_eq!(status, StatusCode::OK, "{text}");
        assert_eq!(serde_json::from_str::<Value>(&text).unwrap()["id"], id);
    }
    let (status, _, text) = send(&app, Request::get("/v1/models/gpt-4").body(Body::empty()).unwrap()).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(serde_json::from_str::<Value>(&text).unwrap(), json!({"error": "The model `gpt-4` does not exist", "error_type": "not_found"}));
}
