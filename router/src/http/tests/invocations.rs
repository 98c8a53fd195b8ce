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

/// A body that is not the route's request is worded as axum's `Json` rejection words it (as TGI
/// answers), once: the field's path and serde's reason, or the parse error, after one prefix.
#[tokio::test]
async fn a_malformed_body_is_named_once_with_the_field_at_fault() {
    let (app, _) = app(HttpConfig::default()).await;
    let prefix = "Failed to deserialize the JSON body into the target type: ";
    for (path, body, detail) in [
        ("/generate", json!({"inputs": "x", "parameters": {"max_new_tokens": -1}}), "parameters.max_new_tokens: invalid value: integer `-1`, expected u32"),
        ("/v1/completions", json!({"prompt": "x", "max_tokens": -1}), "invalid value: integer `-1`, expected u32"),
        ("/v1/chat/completions", json!({"messages": "hi"}), "messages: invalid type: string \"hi\", expected a sequence"),
        ("/invocations", json!({"prompt": "x", "max_tokens": "many"}), "invalid type: string \"many\", expected u32"),
        ("/tokenize", json!(["x"]), "the body must be a JSON object"),
    ] {
        let (status, _, text) = send(&app, post(path, &body)).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{path}: {text}");
        let error = serde_json::from_str::<Value>(&text).unwrap()["error"].as_str().unwrap().to_string();
        assert!(error.starts_with(&format!("{prefix}{detail}")), "{path}: {error}");
        assert_eq!(error.matches(prefix).count(), 1, "{path}: {error}");
    }
    let request = Request::post("/generate").header("content-type", "application/json").body(Body::from("{\"inputs\": ")).unwrap();
    let (status, _, text) = send(&app, request).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{text}");
    let error = serde_json::from_str::<Value>(&text).unwrap()["error"].as_str().unwrap().to_string();
    assert!(error.starts_with("Failed to parse the request body as JSON: inputs: EOF while parsing"), "{error}");
}

/// A path no route serves is a 404 in TGI's error shape that names it (an empty body told an
/// OpenAI client asking for embeddings nothing); a served path asked with another method is
/// still axum's 405.
#[tokio::test]
async fn a_path_no_route_serves_is_a_404_that_names_it() {
    let (app, _) = app(HttpConfig::default()).await;
    let (status, _, text) = send(&app, post("/v1/embeddings", &json!({"input": "x", "model": "m"}))).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{text}");
    assert_eq!(serde_json::from_str::<Value>(&text).unwrap(), json!({
        "error": "POST /v1/embeddings: no such route on this server, which generates text; /docs lists its routes",
        "error_type": "not_found"}));
    let (status, _, text) = send(&app, Request::get("/nowhere?x=1").body(Body::empty()).unwrap()).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(text.starts_with(r#"{"error":"GET /nowhere: no such route"#), "{text}");
    let (status, _, _) = send(&app, Request::get("/generate").body(Body::empty()).unwrap()).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
}
