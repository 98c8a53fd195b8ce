//! Grammars through the whole in-process stack: TGI's `grammar` and OpenAI's `response_format`
//! are compiled at validation, each step carries the request's mask to the (scripted) shard,
//! which picks the lowest allowed token where its script is not allowed, and a complete grammar
//! ends the request with `eos_token`.
use axum::http::StatusCode;
use serde_json::{json, Value};

use super::{app, post, send, sse_data, with_fields};
use crate::grammar::UnlistedProperties;
use crate::http::HttpConfig;

#[tokio::test]
async fn tgi_grammars_shape_the_output_and_end_it() {
    let (app, log) = app(HttpConfig::default()).await;
    let regex = json!({"inputs": "x", "parameters": {"max_new_tokens": 20, "details": true,
        "grammar": {"type": "regex", "value": "[0-9]{3}"}}});
    let (status, _, text) = send(&app, post("/generate", &regex)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let body: Value = serde_json::from_str(&text).unwrap();
    let output = body["generated_text"].as_str().unwrap();
    assert!(output.len() == 3 && output.chars().all(|c| c.is_ascii_digit()), "{output}");
    assert_eq!(body["details"]["finish_reason"], "eos_token");
    // The shard saw a mask with every sampling step of the request.
    assert!(log.lock().unwrap().new_requests.len() == 1);

    let schema = json!({"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
        "additionalProperties": false});
    let json_body = json!({"inputs": "x", "parameters": {"max_new_tokens": 30,
        "grammar": {"type": "json", "value": schema}}});
    let (status, _, text) = send(&app, post("/generate_stream", &json_body)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let events = sse_data(&text);
    let last = events.last().unwrap();
    let generated = last["generated_text"].as_str().unwrap_or_else(|| panic!("{last}"));
    let parsed: Value = serde_json::from_str(generated).unwrap_or_else(|error| panic!("{generated}: {error}"));
    assert!(parsed["ok"].is_boolean(), "{parsed}");
    assert_eq!(last["details"]["finish_reason"], "eos_token");
}

#[tokio::test]
async fn a_schema_silent_on_other_properties_gets_only_those_it_lists() {
    // Without `additionalProperties`, the object is closed (vLLM's default reading): the scripted
    // shard, taking the lowest allowed token, cannot add keys until max_new_tokens.
    let (app, _) = app(HttpConfig::default()).await;
    let schema = json!({"type": "object", "properties": {"name": {"type": "string", "maxLength": 3},
        "age": {"type": "integer", "minimum": 0, "maximum": 99}}, "required": ["name", "age"]});
    let request = json!({"inputs": "x", "parameters": {"max_new_tokens": 60, "details": true,
        "grammar": {"type": "json", "value": schema}}});
    let (status, _, text) = send(&app, post("/generate", &request)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let body: Value = serde_json::from_str(&text).unwrap();
    let generated = body["generated_text"].as_str().unwrap();
    let parsed: Value = serde_json::from_str(generated).unwrap_or_else(|error| panic!("{generated}: {error}"));
    let mut keys: Vec<&String> = parsed.as_object().unwrap().keys().collect();
    keys.sort();
    assert_eq!(keys, ["age", "name"], "{generated}");
    assert_eq!(body["details"]["finish_reason"], "eos_token");

    // JSON Schema's letter, as the server may be told to read it: the same shard keeps adding keys.
    let allowing = HttpConfig { grammar_unlisted_properties: UnlistedProperties::Allow, ..HttpConfig::default() };
    let (permissive, _) = super::app(allowing).await;
    let (status, _, text) = send(&permissive, post("/generate", &request)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let body: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(body["details"]["finish_reason"], "length", "{body}");
}

#[tokio::test]
async fn what_llguidance_cannot_compile_is_422_with_its_message() {
    let (app, _) = app(HttpConfig::default()).await;
    for (grammar, expected) in [
        (json!({"type": "json", "value": {"type": "integer", "minimum": 3, "maximum": 1}}), "nsatisfiable"),
        (json!({"type": "json", "value": {"$ref": "#/$defs/absent"}}), "absent"),
        (json!({"type": "regex", "value": "(unclosed"}), "grammar is not valid"),
    ] {
        let body = json!({"inputs": "x", "parameters": {"grammar": grammar}});
        let (status, _, text) = send(&app, post("/generate", &body)).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{text}");
        let error: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(error["error_type"], "validation");
        let message = error["error"].as_str().unwrap();
        assert!(message.starts_with("Input validation error: grammar is not valid: "), "{message}");
        assert!(message.contains(expected), "{message}");
    }
}

#[tokio::test]
async fn openai_response_formats_constrain_chat_and_completions() {
    let (app, _) = app(HttpConfig::default()).await;
    let schema = json!({"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
        "required": ["n"], "additionalProperties": false});
    let chat = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 30,
        "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": schema, "strict": true}}});
    let (status, _, text) = send(&app, post("/v1/chat/completions", &chat)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let body: Value = serde_json::from_str(&text).unwrap();
    let content: Value = serde_json::from_str(body["choices"][0]["message"]["content"].as_str().unwrap()).unwrap();
    assert!(content["n"].as_u64().is_some_and(|n| n <= 9), "{content}");
    assert_eq!(body["choices"][0]["finish_reason"], "stop");

    let completion = json!({"prompt": "x", "max_tokens": 30, "response_format": {"type": "json_object"}});
    let (status, _, text) = send(&app, post("/v1/completions", &completion)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let body: Value = serde_json::from_str(&text).unwrap();
    let output = body["choices"][0]["text"].as_str().unwrap();
    assert!(output.starts_with('{'), "{output}");

    let bad = json!({"messages": [{"role": "user", "content": "Hi"}], "response_format": {"type": "xml"}});
    let (status, _, text) = send(&app, post("/v1/chat/completions", &bad)).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{text}");
    assert!(text.contains("grammar is not valid: unknown variant `xml`"), "{text}");
}

/// vLLM's structured outputs, both spellings, on both OpenAI routes: each constrains the
/// output as `response_format` does; two constraints at once, and vLLM's `grammar`, are refused.
#[tokio::test]
async fn vllm_structured_outputs_constrain_the_output() {
    let (app, _) = app(HttpConfig::default()).await;
    let schema = json!({"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
        "required": ["n"], "additionalProperties": false});
    let chat = |extra: Value| with_fields(json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 30}), &extra);
    let text_of = |text: &str| {
        let body: Value = serde_json::from_str(text).unwrap();
        body["choices"][0]["message"]["content"].as_str().or(body["choices"][0]["text"].as_str()).unwrap().to_string()
    };
    for extra in [json!({"guided_json": schema}), json!({"structured_outputs": {"json": schema.to_string()}})] {
        let (status, _, text) = send(&app, post("/v1/chat/completions", &chat(extra))).await;
        assert_eq!(status, StatusCode::OK, "{text}");
        let content: Value = serde_json::from_str(&text_of(&text)).unwrap();
        assert!(content["n"].as_u64().is_some_and(|n| n <= 9), "{content}");
    }
    let choices = ["yes.", "no|maybe"];
    for extra in [json!({"guided_choice": choices}), json!({"structured_outputs": {"choice": choices}})] {
        let (status, _, text) = send(&app, post("/v1/chat/completions", &chat(extra))).await;
        assert_eq!(status, StatusCode::OK, "{text}");
        assert!(choices.contains(&text_of(&text).as_str()), "{text}");
    }
    let regex = json!({"prompt": "x", "max_tokens": 30, "guided_regex": "[0-9]{4}"});
    let (status, _, text) = send(&app, post("/v1/completions", &regex)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let output = text_of(&text);
    assert!(output.len() == 4 && output.chars().all(|c| c.is_ascii_digit()), "{output}");
    for (extra, error) in [
        (json!({"guided_regex": "a", "guided_choice": ["b"]}), "give one of"),
        (json!({"guided_regex": "a", "response_format": {"type": "json_object"}}), "not both"),
        (json!({"structured_outputs": {"grammar": "root ::= \"a\""}}), "unknown field `grammar`"),
        (json!({"guided_choice": []}), "at least one"),
    ] {
        let (status, _, text) = send(&app, post("/v1/chat/completions", &chat(extra))).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{text}");
        assert!(text.contains(error), "{text}");
    }
}

#[tokio::test]
async fn each_best_of_candidate_follows_its_own_copy_of_the_grammar() {
    let (app, log) = app(HttpConfig::default()).await;
    let body = json!({"inputs": "x", "parameters": {"max_new_tokens": 20, "best_of": 2, "do_sample": true,
        "details": true, "grammar": {"type": "regex", "value": "[0-9]{2}"}}});
    let (status, _, text) = send(&app, post("/generate", &body)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let body: Value = serde_json::from_str(&text).unwrap();
    let output = body["generated_text"].as_str().unwrap();
    assert!(output.len() == 2 && output.chars().all(|c| c.is_ascii_digit()), "{output}");
    let other = &body["details"]["best_of_sequences"][0];
    assert_eq!(other["generated_text"].as_str().map(str::len), Some(2), "{other}");
    assert_eq!(other["finish_reason"], "eos_token");
    assert_eq!(log.lock().unwrap().new_requests.len(), 2);
}

#[tokio::test]
async fn disable_grammar_support_refuses_grammars_and_tools() {
    let (app, _) = app(HttpConfig { disable_grammar_support: true, ..HttpConfig::default() }).await;
    let tools = json!([{"type": "function", "function": {"name": "now"}}]);
    for (route, body) in [
        ("/generate", json!({"inputs": "x", "parameters": {"grammar": {"type": "regex", "value": "a"}}})),
        ("/v1/chat/completions", json!({"messages": [{"role": "user", "content": "Hi"}], "tools": tools})),
    ] {
        let (status, _, text) = send(&app, post(route, &body)).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{text}");
        assert!(text.contains("grammar is not supported: disabled by --disable-grammar-support"), "{text}");
    }
    let (status, _, _) = send(&app, post("/generate", &json!({"inputs": "x", "parameters": {"max_new_tokens": 2}}))).await;
    assert_eq!(status, StatusCode::OK);
}
