//! Tool calls through the in-process stack: the tools' grammar reaches the (scripted) shard as
//! masks, the output comes back as OpenAI's `tool_calls`, streamed and not, and the template
//! sees the tool prompt.
use axum::http::StatusCode;
use serde_json::{json, Value};

use super::{app, post, send, sse_data};
use crate::http::HttpConfig;
use crate::tokenizer::tests::smollm2;

fn tools() -> Value {
    json!([{"type": "function", "function": {"name": "now", "description": "The time", "parameters":
        {"type": "object", "properties": {}}}},
        {"type": "function", "function": {"name": "dice", "parameters": {"type": "object",
            "properties": {"sides": {"type": "integer", "minimum": 2, "maximum": 9}}, "required": ["sides"]}}}])
}

#[tokio::test]
async fn a_named_tool_is_called_with_arguments_as_a_json_string() {
    let (app, log) = app(HttpConfig::default()).await;
    let body = json!({"messages": [{"role": "user", "content": "Roll"}], "max_tokens": 40, "tools": tools(),
        "tool_choice": {"type": "function", "function": {"name": "dice"}}});
    let (status, _, text) = send(&app, post("/v1/chat/completions", &body)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let body: Value = serde_json::from_str(&text).unwrap();
    let choice = &body["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls");
    assert_eq!(choice["message"]["content"], Value::Null);
    let call = &choice["message"]["tool_calls"][0];
    assert_eq!(call["type"], "function");
    assert_eq!(call["function"]["name"], "dice");
    let arguments: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    assert!(arguments["sides"].as_u64().is_some_and(|sides| (2..=9).contains(&sides)), "{arguments}");
    // The last message carries the tool prompt and the tools.
    let prompt = smollm2().decode(&log.lock().unwrap().new_requests[0].prompt_token_ids, false).unwrap();
    assert!(prompt.contains("Roll\n---\nGiven the functions available") && prompt.contains("\"dice\""), "{prompt}");
}

#[tokio::test]
async fn a_streamed_tool_call_arrives_in_pieces() {
    let (app, _) = app(HttpConfig::default()).await;
    let body = json!({"messages": [{"role": "user", "content": "Time?"}], "max_tokens": 40, "tools": tools(),
        "tool_choice": {"type": "function", "function": {"name": "now"}}, "stream": true});
    let (status, _, text) = send(&app, post("/v1/chat/completions", &body)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let events = sse_data(&text);
    assert_eq!(events.last().unwrap(), "[DONE]");
    let chunks = &events[..events.len() - 1];
    assert!(chunks.iter().all(|chunk| chunk["choices"][0]["delta"]["content"].is_null()), "{chunks:?}");
    assert_eq!(chunks.last().unwrap()["choices"][0]["finish_reason"], "tool_calls");
    let pieces: Vec<&Value> = chunks.iter().filter_map(|chunk| chunk["choices"][0]["delta"]["tool_calls"].get(0)).collect();
    // The first piece names the call; the pieces' arguments add up to the call's.
    assert_eq!(pieces[0]["index"], 0);
    assert_eq!(pieces[0]["type"], "function");
    assert_eq!(pieces[0]["function"]["name"], "now");
    assert!(pieces[1..].iter().all(|piece| piece.get("id").is_none() && piece["function"].get("name").is_none()));
    let arguments: String = pieces.iter().map(|piece| piece["function"]["arguments"].as_str().unwrap()).collect();
    assert_eq!(arguments, "{}");
}

#[tokio::test]
async fn tool_choice_none_answers_in_text_and_bad_tools_are_422() {
    let (app, _) = app(HttpConfig::default()).await;
    let body = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 40, "tools": tools(),
        "tool_choice": "none"});
    let (status, _, text) = send(&app, post("/v1/chat/completions", &body)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let body: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(body["choices"][0]["message"]["content"], super::scripted_shard::SCRIPT);
    assert!(body["choices"][0]["message"].get("tool_calls").is_none());
    for (tools, choice) in [(tools(), json!({"type": "function", "function": {"name": "fly"}})), (json!([{"type": "function"}]), json!("auto"))] {
        let body = json!({"messages": [{"role": "user", "content": "Hi"}], "tools": tools, "tool_choice": choice});
        let (status, _, text) = send(&app, post("/v1/chat/completions", &body)).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{text}");
        assert!(text.contains("`tools` are not valid"), "{text}");
    }
}

/// OpenAI's tool loop: the assistant's call goes back with the tool's result. The embedded
/// model's template does not render `tool_calls`, so the call is written in the assistant's
/// turn, as TGI writes it, ahead of the result.
#[tokio::test]
async fn an_assistant_turn_that_called_a_tool_reaches_the_template() {
    let (app, log) = app(HttpConfig::default()).await;
    let call = json!({"id": "call_7", "type": "function", "function": {"name": "dice", "arguments": "{\"sides\": 6}"}});
    let body = json!({"messages": [{"role": "user", "content": "Roll"},
        {"role": "assistant", "content": null, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_7", "content": "4"}], "max_tokens": 4});
    let (status, _, text) = send(&app, post("/v1/chat/completions", &body)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let prompt = smollm2().decode(&log.lock().unwrap().new_requests[0].prompt_token_ids, false).unwrap();
    let turn = "<|im_start|>assistant\n[{\"id\":\"call_7\",\"type\":\"function\",\"function\":{\"name\":\"dice\",\"arguments\":\"{\\\"sides\\\": 6}\"}}]<|im_end|>";
    assert!(prompt.contains(turn), "{prompt}");
    assert!(prompt.contains("<|im_start|>tool\n4<|im_end|>"), "{prompt}");
}

#[tokio::test]
async fn a_message_without_content_is_refused_unless_it_calls_tools() {
    let (app, log) = app(HttpConfig::default()).await;
    let call = json!({"id": "1", "type": "function", "function": {"name": "now", "arguments": "{}"}});
    for (messages, message) in [
        (json!([{"role": "user", "content": null}]), "`messages[0]`: `content` is required"),
        (json!([{"role": "user", "content": "Hi"}, {"role": "assistant"}]), "`messages[1]`: `content` is required"),
        (json!([{"role": "user", "content": "Hi", "tool_calls": [call]}]), "`messages[0]`: only an assistant message"),
    ] {
        let (status, _, text) = send(&app, post("/v1/chat/completions", &json!({"messages": messages}))).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{text}");
        assert!(text.contains(message), "{text}");
    }
    assert!(log.lock().unwrap().new_requests.is_empty());
}

/// A reasoning parser leaves replies under a grammar alone: the grammar holds them from the
/// first token, so there is no reasoning to split out, and the call is still made (deepseek_r1
/// would otherwise take the whole reply for reasoning, whose block the template opened).
#[tokio::test]
async fn a_reasoning_parser_leaves_a_tool_call_alone() {
    let config = HttpConfig { reasoning_parser: Some(crate::http::reasoning::ReasoningParser::DeepseekR1), ..HttpConfig::default() };
    let (app, _) = app(config).await;
    for stream in [false, true] {
        let body = json!({"messages": [{"role": "user", "content": "Time?"}], "max_tokens": 40, "tools": tools(),
            "tool_choice": {"type": "function", "function": {"name": "now"}}, "stream": stream});
        let (status, _, text) = send(&app, post("/v1/chat/completions", &body)).await;
        assert_eq!(status, StatusCode::OK, "{text}");
        assert!(!text.contains("reasoning_content") && text.contains("\"tool_calls\""), "{text}");
        let format = json!({"messages": [{"role": "user", "content": "JSON"}], "max_tokens": 40, "stream": stream,
            "response_format": {"type": "json_object"}});
        let (_, _, text) = send(&app, post("/v1/chat/completions", &format)).await;
        assert!(!text.contains("reasoning_content"), "{text}");
    }
}
