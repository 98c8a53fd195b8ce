//! The OpenAI-compatible routes over the same in-process stack as the TGI route tests.
use axum::http::StatusCode;
use serde_json::{json, Value};

use super::scripted_shard::SCRIPT;
use super::{app, app_with_template, post, send, sse_data};
use crate::http::HttpConfig;
use crate::tokenizer::tests::smollm2;

#[tokio::test]
async fn chat_stream_sends_chunks_usage_and_done() {
    let (app, log) = app(HttpConfig::default()).await;
    let body = json!({"model": "tgi", "messages": [{"role": "user", "content": "Hi"}], "stream": true,
                      "stream_options": {"include_usage": true}, "max_tokens": 100});
    let (status, _, text) = send(&app, post("/v1/chat/completions", &body)).await;
    assert_eq!(status, StatusCode::OK);
    let events = sse_data(&text);
    assert_eq!(events.last().unwrap(), "[DONE]");
    let usage = &events[events.len() - 2];
    assert_eq!(usage["choices"], json!([]));
    let chunks = &events[..events.len() - 2];
    let content: String = chunks
        .iter()
        .map(|c| c["choices"][0]["delta"]["content"].as_str().unwrap())
        .collect();
    assert_eq!(content, SCRIPT);
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        "stop"
    );
    assert_eq!(chunks[0]["object"], "chat.completion.chunk");
    assert_eq!(usage["usage"]["completion_tokens"], chunks.len());
    let prompt = smollm2()
        .decode(&log.lock().unwrap().new_requests[0].prompt_token_ids, false)
        .unwrap();
    assert!(
        prompt.ends_with("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"),
        "{prompt}"
    );
}

#[tokio::test]
async fn completions_answer_each_prompt() {
    let (app, _) = app(HttpConfig::default()).await;
    let body = json!({"model": "m", "prompt": ["a", "b"], "max_tokens": 2, "temperature": 0});
    let (status, _, text) = send(&app, post("/v1/completions", &body)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let response: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(response["object"], "text_completion");
    assert_eq!(response["choices"].as_array().unwrap().len(), 2);
    assert_eq!(response["choices"][1]["index"], 1);
    assert_eq!(response["choices"][0]["finish_reason"], "length");
    assert_eq!(response["usage"]["completion_tokens"], 4);
    let too_many = json!({"prompt": ["a", "b", "c", "d", "e"]});
    let (status, _, text) = send(&app, post("/v1/completions", &too_many)).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(
        text.contains("`prompt` supports up to 4 prompts. Given: 5"),
        "{text}"
    );
}

#[tokio::test]
async fn completions_stream_interleaves_choices_and_ends_once() {
    let (app, _) = app(HttpConfig::default()).await;
    let body = json!({"prompt": ["a", "b"], "max_tokens": 3, "stream": true, "stream_options": {"include_usage": true}});
    let (status, _, text) = send(&app, post("/v1/completions", &body)).await;
    assert_eq!(status, StatusCode::OK);
    let events = sse_data(&text);
    assert_eq!(events.iter().filter(|event| *event == "[DONE]").count(), 1);
    assert_eq!(events.last().unwrap(), "[DONE]");
    let chunks: Vec<&Value> = events
        .iter()
        .filter(|event| event["choices"].as_array().is_some_and(|c| !c.is_empty()))
        .collect();
    for index in 0..2 {
        let choice: Vec<&Value> = chunks
            .iter()
            .map(|chunk| &chunk["choices"][0])
            .filter(|c| c["index"] == index)
            .collect();
        assert_eq!(choice.len(), 3, "choice {index}");
        assert_eq!(choice[2]["finish_reason"], "length");
        let text: String = choice.iter().map(|c| c["text"].as_str().unwrap()).collect();
        assert_eq!(text, "Hello world.");
    }
    assert_eq!(events[events.len() - 2]["usage"]["completion_tokens"], 6);
}

#[tokio::test]
async fn a_template_that_does_not_compile_disables_chat_only() {
    let (app, _) = app_with_template(HttpConfig::default(), "{% for %}".into()).await;
    let chat = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2});
    let (status, _, text) = send(&app, post("/v1/chat/completions", &chat)).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    let error: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(error["error_type"], "template_error");
    assert!(error["error"]
        .as_str()
        .unwrap()
        .starts_with("Template error: the chat template does not compile"));
    let generate = json!({"inputs": "x", "parameters": {"max_new_tokens": 1}});
    assert_eq!(
        send(&app, post("/generate", &generate)).await.0,
        StatusCode::OK
    );
    let (model, _) = app_with_template(HttpConfig::default(), String::new()).await;
    let (status, _, text) = send(&model, post("/v1/chat/completions", &chat)).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(text.contains("the model has no chat template"), "{text}");
}
