//! SageMaker's `/invocations` routes each body shape to its own route's handler, and `GET /` is
//! a health probe, as in TGI.
use axum::body::Body;
use axum::http::{Request, StatusCode};
use serde_json::{json, Value};

use super::scripted_shard::SCRIPT;
use super::{app, post, send, sse_data};
use crate::http::HttpConfig;

#[tokio::test]
async fn invocations_serves_tgi_chat_and_completion_bodies() {
    let (app, _) = app(HttpConfig::default()).await;
    let (status, _, text) = send(
        &app,
        post(
            "/invocations",
            &json!({"inputs": "Hi", "parameters": {"max_new_tokens": 100}}),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let generated: Value = serde_json::from_str(&text).unwrap();
    // As `POST /`: a one-element array.
    assert_eq!(generated[0]["generated_text"], SCRIPT);

    let chat = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 100});
    let (status, _, text) = send(&app, post("/invocations", &chat)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let completion: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(completion["object"], "chat.completion");
    assert_eq!(completion["choices"][0]["message"]["content"], SCRIPT);

    let (status, _, text) = send(
        &app,
        post("/invocations", &json!({"prompt": "Hi", "max_tokens": 100})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let completion: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(completion["object"], "text_completion");
    assert_eq!(completion["choices"][0]["text"], SCRIPT);

    let (status, _, text) = send(
        &app,
        post(
            "/invocations",
            &json!({"inputs": "Hi", "stream": true,
        "parameters": {"max_new_tokens": 100}}),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let events = sse_data(&text);
    assert_eq!(events.last().unwrap()["generated_text"], SCRIPT);
}

#[tokio::test]
async fn invocations_refuses_a_malformed_body_with_the_routes_422() {
    let (app, _) = app(HttpConfig::default()).await;
    for body in [
        json!({"messages": "not a list"}),
        json!({"prompt": "x", "max_tokens": "many"}),
        json!({"parameters": {}}),
        json!([1, 2]),
    ] {
        let (status, _, text) = send(&app, post("/invocations", &body)).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}: {text}");
        let error: Value = serde_json::from_str(&text).unwrap();
        assert!(
            error["error"].as_str().unwrap().contains("deserialize"),
            "{text}"
        );
    }
}

#[tokio::test]
async fn get_root_is_a_health_probe_and_the_key_guards_invocations() {
    let config = HttpConfig {
        api_key: Some("k3y".into()),
        ..HttpConfig::default()
    };
    let (app, _) = app(config).await;
    let (status, _, _) = send(&app, Request::get("/").body(Body::empty()).unwrap()).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _, _) = send(&app, post("/invocations", &json!({"inputs": "Hi"}))).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _, text) = send(
        &app,
        Request::get("/api-doc/openapi.json")
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let spec: Value = serde_json::from_str(&text).unwrap();
    assert!(spec["paths"]["/invocations"]["post"].is_object());
    assert!(spec["paths"]["/"]["get"].is_object() && spec["paths"]["/"]["post"].is_object());
}
