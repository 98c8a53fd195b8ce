//! `/tokenize` in TGI's shape and vLLM's, and vLLM's `/detokenize` and `/version`: a
//! conversation's tokens are the ids the chat route serves it with, a text's those of a
//! completion, and detokenizing gives the text back.
use axum::body::Body;
use axum::http::{Request, StatusCode};
use serde_json::{json, Value};

use super::{app, post, send};
use crate::http::HttpConfig;

async fn answer(app: &axum::Router, path: &str, body: &Value) -> Value {
    let (status, _, text) = send(app, post(path, body)).await;
    assert_eq!(status, StatusCode::OK, "{path} {body}: {text}");
    serde_json::from_str(&text).unwrap()
}

async fn refusal(app: &axum::Router, path: &str, body: &Value) -> String {
    let (status, _, text) = send(app, post(path, body)).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{path} {body}: {text}");
    let error: Value = serde_json::from_str(&text).unwrap();
    assert!(error["error_type"].is_string(), "{text}");
    error["error"].as_str().unwrap().to_string()
}

#[tokio::test]
async fn a_text_tokenizes_as_a_completion_prompt_and_detokenizes_back() {
    let (app, _) = app(HttpConfig::default()).await;
    let text = "Hello world, café ☕";
    let vllm = answer(&app, "/tokenize", &json!({"model": "smollm2-test", "prompt": text})).await;
    let rendered = answer(&app, "/v1/completions/render", &json!({"prompt": text, "max_tokens": 1})).await;
    assert_eq!(vllm["tokens"], rendered[0]["token_ids"]);
    let tokens = vllm["tokens"].as_array().unwrap();
    assert_eq!(vllm["count"], tokens.len());
    // --max-total-tokens, as /info says it.
    let info = {
        let (_, _, text) = send(&app, Request::get("/info").body(Body::empty()).unwrap()).await;
        serde_json::from_str::<Value>(&text).unwrap()
    };
    assert_eq!(vllm["max_model_len"], info["max_total_tokens"]);
    assert_eq!(vllm["token_strs"], Value::Null);
    // TGI's form, on the same path, gives the same ids with their spans.
    let tgi = answer(&app, "/tokenize", &json!({"inputs": text})).await;
    let ids: Vec<Value> = tgi.as_array().unwrap().iter().map(|token| token["id"].clone()).collect();
    assert_eq!(&ids, tokens);

    let back = answer(&app, "/detokenize", &json!({"model": "smollm2-test", "tokens": tokens})).await;
    assert_eq!(back, json!({"prompt": text}));

    // The vocabulary's entries, byte-level: a space is `Ġ`.
    let with_strs = answer(&app, "/tokenize", &json!({"prompt": "Hello world", "return_token_strs": true})).await;
    assert_eq!(with_strs["token_strs"], json!(["Hello", "Ġworld"]));
}

#[tokio::test]
async fn special_tokens_are_added_to_a_text_unless_asked_not_to_and_kept_by_detokenize() {
    let (app, _) = app(HttpConfig::default()).await;
    // SmolLM2's tokenizer adds none; `<|im_start|>` written in the text is one special token.
    let text = "<|im_start|>user";
    let with = answer(&app, "/tokenize", &json!({"prompt": text})).await;
    let without = answer(&app, "/tokenize", &json!({"prompt": text, "add_special_tokens": false})).await;
    assert_eq!(with["tokens"], without["tokens"]);
    assert_eq!(with["tokens"][0], 1, "{with}");
    let back = answer(&app, "/detokenize", &json!({"tokens": with["tokens"]})).await;
    assert_eq!(back["prompt"], text);
}

#[tokio::test]
async fn a_conversation_tokenizes_as_the_chat_route_serves_it() {
    let (app, _) = app(HttpConfig::default()).await;
    let tools = json!([{"type": "function", "function": {"name": "weather", "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]);
    let chats = [
        json!({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]}),
        json!({"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": tools}),
        json!({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hel"}],
               "continue_final_message": true, "add_generation_prompt": false}),
    ];
    for chat in chats {
        let tokenized = answer(&app, "/tokenize", &chat).await;
        let rendered = answer(&app, "/v1/chat/completions/render", &chat).await;
        assert_eq!(tokenized["tokens"], rendered["token_ids"], "{chat}");
        assert_eq!(tokenized["count"], rendered["token_ids"].as_array().unwrap().len());
        // Without the generation prompt the conversation is shorter.
        if chat.get("continue_final_message").is_none() {
            let mut bare = chat.clone();
            bare["add_generation_prompt"] = json!(false);
            let shorter = answer(&app, "/tokenize", &bare).await;
            assert!(shorter["count"].as_u64() < tokenized["count"].as_u64(), "{shorter} {tokenized}");
        }
    }
    // The chat route's rules hold: both ways of ending the prompt at once is a 422.
    let error = refusal(&app, "/tokenize", &json!({"messages": [{"role": "user", "content": "Hi"}],
        "continue_final_message": true, "add_generation_prompt": true})).await;
    assert!(error.contains("continue_final_message"), "{error}");
}

#[tokio::test]
async fn bad_bodies_are_422_naming_what_is_wrong() {
    let (app, _) = app(HttpConfig::default()).await;
    let cases = [
        (json!({"model": "m"}), "`prompt` or `messages`"),
        (json!(["Hello"]), "JSON object"),
        (json!({"prompt": 5}), "invalid type: integer `5`"),
        (json!({"messages": []}), "`messages` must hold"),
        (json!({"inputs": "x", "parameters": 3}), "invalid type"),
        (json!({"prompt": "x", "add_special_tokens": "yes"}), "invalid type"),
    ];
    for (body, expected) in cases {
        let error = refusal(&app, "/tokenize", &body).await;
        assert!(error.contains(expected), "{body}: {error}");
    }
    let error = refusal(&app, "/detokenize", &json!({"tokens": [1, 49152]})).await;
    assert!(error.contains("49152"), "{error}");
    let error = refusal(&app, "/detokenize", &json!({"tokens": [-1]})).await;
    assert!(error.contains("invalid value"), "{error}");
}

#[tokio::test]
async fn version_is_the_servers() {
    let (app, _) = app(HttpConfig::default()).await;
    let (status, _, text) = send(&app, Request::get("/version").body(Body::empty()).unwrap()).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(serde_json::from_str::<Value>(&text).unwrap(), json!({"version": env!("CARGO_PKG_VERSION")}));
}
