//! TGI's `/vertex` runs each instance as its own route would and answers the texts in order;
//! `/chat_tokenize` gives the template's text and the ids the chat route sends.
use axum::http::StatusCode;
use serde_json::{json, Value};

use super::scripted_shard::SCRIPT;
use super::{app, post, send};
use crate::http::HttpConfig;

#[tokio::test]
async fn vertex_answers_generate_and_chat_instances_in_order() {
    let (app, log) = app(HttpConfig::default()).await;
    let body = json!({"instances": [
        {"inputs": "Hi", "parameters": {"max_new_tokens": 100, "return_full_text": true}},
        {"messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 100},
        {"inputs": "Bye"},
    ]});
    let (status, headers, text) = send(&app, post("/vertex", &body)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let response: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(response, json!({"predictions": [format!("Hi{SCRIPT}"), SCRIPT, SCRIPT]}));
    assert!(headers.contains_key("x-generated-tokens"));
    // The chat instance went through the template, the generate ones did not.
    let (_, _, rendered) = send(
        &app,
        post("/v1/chat/completions/render", &body["instances"][1]),
    )
    .await;
    let rendered: Value = serde_json::from_str(&rendered).unwrap();
    let sent: Vec<Value> = log.lock().unwrap().new_requests.iter().map(|r| json!(r.prompt_token_ids)).collect();
    assert_eq!(sent.len(), 3);
    assert!(sent.contains(&rendered["token_ids"]), "{sent:?}");
}

#[tokio::test]
async fn vertex_refuses_what_an_instance_route_would_and_empty_or_oversized_batches() {
    let (app, log) = app(HttpConfig::default()).await;
    let cases = [
        (json!({"instances": []}), "`instances` must hold between 1 and"),
        (json!({"instances": vec![json!({"inputs": "x"}); 5]}), "`instances` must hold between 1 and 4"),
        (json!({"instances": [{"inputs": 5}]}), "instances: invalid type: integer `5`"),
        (json!({"instances": [{"parameters": {}}]}), "missing field `inputs`"),
        (json!({"instances": [{"messages": [], "max_tokens": 2}]}), "`messages` must hold"),
        (json!({"instances": [{"messages": [{"role": "user", "content": "x"}], "stream": true}]}), "`stream` is not supported"),
        (json!({"instances": [{"messages": [{"role": "user", "content": "x"}], "n": 2}]}), "`n` is not supported"),
        // One bad instance fails the request, before any instance reaches the engine.
        (json!({"instances": [{"inputs": "x"}, {"inputs": "x", "parameters": {"max_new_tokens": 0}}]}), "`max_new_tokens` must be strictly positive"),
        (json!({"inputs": "x"}), "missing field `instances`"),
    ];
    for (body, expected) in cases {
        let (status, _, text) = send(&app, post("/vertex", &body)).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}: {text}");
        let error: Value = serde_json::from_str(&text).unwrap();
        assert!(error["error"].as_str().unwrap().contains(expected), "{body}: {text}");
        assert_eq!(error["error_type"], "validation", "{text}");
    }
    assert!(log.lock().unwrap().new_requests.is_empty());
}

#[tokio::test]
async fn chat_tokenize_gives_the_templated_text_and_the_ids_the_chat_route_sends() {
    let (app, _) = app(HttpConfig::default()).await;
    let chat = json!({"messages": [{"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hello there"}], "max_tokens": 2});
    let (status, _, text) = send(&app, post("/chat_tokenize", &chat)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let tokenized: Value = serde_json::from_str(&text).unwrap();
    let templated = tokenized["templated_text"].as_str().unwrap();
    assert!(templated.contains("Be brief.") && templated.contains("Hello there"), "{templated}");
    let tokens = tokenized["tokenize_response"].as_array().unwrap();
    // Each token's text is its span of the templated text.
    for token in tokens {
        let (start, stop) = (token["start"].as_u64().unwrap() as usize, token["stop"].as_u64().unwrap() as usize);
        assert_eq!(token["text"], templated[start..stop], "{token}");
    }
    let (_, _, rendered) = send(&app, post("/v1/chat/completions/render", &chat)).await;
    let rendered: Value = serde_json::from_str(&rendered).unwrap();
    let ids: Vec<Value> = tokens.iter().map(|token| token["id"].clone()).collect();
    assert_eq!(json!(ids), rendered["token_ids"]);

    let (status, _, text) = send(&app, post("/chat_tokenize", &json!({"messages": []}))).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{text}");
}
