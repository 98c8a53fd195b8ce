//! The routes a router in front reads, against the engine's and the shard's real state: the
//! load follows the requests held, server info reports the shard's KV pools, render gives the
//! ids the generation routes send the shard, and `/generate` takes vllm-router's `text`.
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use serde_json::{json, Value};
use tower::ServiceExt;

use super::{app, post, send, wait_for, HOLD};
use crate::http::HttpConfig;

fn get(path: &str) -> Request<Body> {
    Request::get(path).body(Body::empty()).unwrap()
}

async fn get_json(app: &axum::Router, path: &str) -> Value {
    let (status, _, text) = send(app, get(path)).await;
    assert_eq!(status, StatusCode::OK, "{path}: {text}");
    serde_json::from_str(&text).unwrap()
}

/// Polls `/get_load` until its `field` reads `expected` (the engine publishes after its turn; a
/// closed stream is noticed asynchronously), for up to 10 s.
async fn wait_for_load(app: &axum::Router, field: &str, expected: u64) -> Value {
    let mut last = Value::Null;
    for _ in 0..2000 {
        last = get_json(app, "/get_load").await;
        if last[field] == expected {
            return last;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("{field} never reached {expected}: {last}");
}

#[tokio::test]
async fn load_follows_the_requests_the_engine_holds() {
    let (app, log) = app(HttpConfig::default()).await;
    assert_eq!(get_json(&app, "/get_load").await, json!({"load": 0, "running": 0, "waiting": 0, "rotated": 0}));
    let long = json!({"inputs": HOLD, "parameters": {"max_new_tokens": 1000, "ignore_eos": true}});
    let held: Vec<_> = futures::future::join_all((0..2).map(|_| app.clone().oneshot(post("/generate_stream", &long))))
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    wait_for(&log, |log| log.new_requests.len() == 2).await;
    wait_for_load(&app, "load", 2).await;
    // The second may wait a step before it joins the batch.
    let load = wait_for_load(&app, "running", 2).await;
    assert_eq!((load["load"].clone(), load["waiting"].clone()), (json!(2), json!(0)), "{load}");
    // Closed streams cancel their requests: the load falls back to nothing.
    drop(held);
    wait_for_load(&app, "load", 0).await;
}

#[tokio::test]
async fn server_info_reports_the_shards_model_and_kv_pools() {
    let (app, _) = app(HttpConfig { model_id: "served".into(), ..HttpConfig::default() }).await;
    let info = get_json(&app, "/get_server_info").await;
    // The scripted shard's Info and Warmup answers.
    assert_eq!(info["model_id"], "served");
    assert_eq!(info["model_path"], "smollm2-test");
    assert_eq!(info["kv_block_size"], 16);
    assert_eq!((info["num_device_blocks"].clone(), info["num_host_blocks"].clone()), (json!(256), json!(256)));
    assert_eq!(info["worker_type"], "regular");
    let instance = info["instance_id"].as_str().unwrap();
    assert_eq!(instance.len(), 32);
    // Fixed for the process, different in another one.
    assert_eq!(get_json(&app, "/get_server_info").await["instance_id"], instance);
    let (other, _) = super::app(HttpConfig::default()).await;
    assert_ne!(get_json(&other, "/get_server_info").await["instance_id"], instance);
    assert_eq!(get_json(&app, "/get_model_info").await["model_path"], "smollm2-test");
}

#[tokio::test]
async fn health_generate_runs_one_token_through_the_shard() {
    let (app, log) = app(HttpConfig::default()).await;
    let (status, _, text) = send(&app, get("/health_generate")).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let log = log.lock().unwrap();
    assert_eq!(log.new_requests.len(), 1);
    assert!(!log.new_requests[0].prompt_token_ids.is_empty());
}

#[tokio::test]
async fn render_gives_the_ids_the_generation_routes_send() {
    let (app, log) = app(HttpConfig::default()).await;
    let chat = json!({"messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 2});
    let (status, _, text) = send(&app, post("/v1/chat/completions/render", &chat)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let rendered: Value = serde_json::from_str(&text).unwrap();
    let (status, _, text) = send(&app, post("/v1/chat/completions", &chat)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let sent = log.lock().unwrap().new_requests.last().unwrap().prompt_token_ids.clone();
    assert_eq!(rendered["token_ids"], json!(sent));

    // One entry per prompt, whatever `n`; the ids of each prompt as `/v1/completions` sends it.
    let completion = json!({"prompt": ["one two", "three"], "max_tokens": 2, "n": 2});
    let (status, _, text) = send(&app, post("/v1/completions/render", &completion)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let rendered: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(rendered.as_array().unwrap().len(), 2);
    let (status, _, text) = send(&app, post("/v1/completions", &completion)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let log = log.lock().unwrap();
    let sent: Vec<_> = log.new_requests.iter().rev().take(4).map(|request| request.prompt_token_ids.clone()).collect();
    let rendered: Vec<Vec<u32>> = serde_json::from_value(rendered.as_array().unwrap().iter().map(|p| p["token_ids"].clone()).collect()).unwrap();
    for prompt in &rendered {
        assert_eq!(sent.iter().filter(|ids| *ids == prompt).count(), 2, "{prompt:?} not sent twice: {sent:?}");
    }

    // A request the route would refuse is refused here the same way.
    let empty = json!({"messages": [], "max_tokens": 2});
    assert_eq!(send(&app, post("/v1/chat/completions/render", &empty)).await.0, StatusCode::UNPROCESSABLE_ENTITY);
}

#[tokio::test]
async fn generate_takes_the_prompt_as_text_the_way_vllm_router_forwards_it() {
    let (app, _) = app(HttpConfig::default()).await;
    // vllm-router's `/generate` re-serializes its own request type: `text`, the parameters it
    // knows, and its own flags.
    let forwarded = json!({"text": "Say hi", "parameters": {"max_new_tokens": 2}, "stream": false,
                           "return_logprob": false, "return_hidden_states": false});
    let (status, _, text) = send(&app, post("/generate", &forwarded)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let response: Value = serde_json::from_str(&text).unwrap();
    assert!(response["generated_text"].as_str().is_some_and(|text| !text.is_empty()));
    // Both names at once are ambiguous.
    let both = json!({"inputs": "a", "text": "b"});
    assert_eq!(send(&app, post("/generate", &both)).await.0, StatusCode::UNPROCESSABLE_ENTITY);
}
