//! A thinking model under a grammar (`--reasoning-parser`, a response format or tools): the
//! reply reasons first and the grammar holds from the token after `</think>`, so the message has
//! both its reasoning and an answer the grammar accepts, whole and streamed. The scripted model
//! writes `SCRIPT`; where a mask does not allow its token, the lowest allowed one.
use axum::http::StatusCode;
use serde_json::{json, Value};

use super::scripted_shard::ScriptedShard;
use super::{app, app_on_shard, post, send, sse_data, with_fields};
use crate::http::reasoning::ReasoningParser;
use crate::http::HttpConfig;
use crate::tokenizer::tests::thinking_json;

const SCRIPT: &str = "<think>Hello world.</think>Goodbye!";

/// A template that closes an empty block in the prompt when asked not to think (Qwen 3's way).
const TEMPLATE: &str = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}<assistant>\
    {% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}";

async fn thinking_app(parser: ReasoningParser) -> axum::Router {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");
    let template = std::fs::read_to_string(format!("{dir}/smollm2_chat_template.jinja")).unwrap();
    scripted_app(parser, SCRIPT, template).await
}

async fn scripted_app(parser: ReasoningParser, script: &str, template: String) -> axum::Router {
    let shard = ScriptedShard::spawn_with_script(thinking_json(), template, script, 49154);
    app_on_shard(HttpConfig { reasoning_parser: Some(parser), ..HttpConfig::default() }, shard, &[]).await.0
}

fn format_request() -> Value {
    let schema = json!({"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
        "additionalProperties": false});
    json!({"messages": [{"role": "user", "content": "Well?"}], "max_tokens": 60,
        "response_format": {"type": "json_schema", "json_schema": {"name": "verdict", "schema": schema}}})
}

fn is_verdict(content: &str) -> bool {
    serde_json::from_str::<Value>(content).is_ok_and(|answer| answer["ok"].is_boolean() && answer.as_object().unwrap().len() == 1)
}

/// The deltas of a streamed reply, joined field by field.
fn joined(text: &str, field: &str) -> String {
    sse_data(text).iter().filter_map(|event| event["choices"][0]["delta"][field].as_str().map(String::from)).collect()
}

#[tokio::test]
async fn a_thinking_model_reasons_before_its_format_holds() {
    for parser in [ReasoningParser::Qwen3, ReasoningParser::DeepseekR1] {
        let app = thinking_app(parser).await;
        let (status, _, text) = send(&app, post("/v1/chat/completions", &format_request())).await;
        assert_eq!(status, StatusCode::OK, "{text}");
        let choice = &serde_json::from_str::<Value>(&text).unwrap()["choices"][0];
        assert_eq!(choice["message"]["reasoning_content"], "Hello world.", "{parser:?}: {choice}");
        let content = choice["message"]["content"].as_str().unwrap();
        assert!(is_verdict(content), "{parser:?}: {content}");
        assert_eq!(choice["finish_reason"], "stop");

        let mut streamed = format_request();
        streamed["stream"] = json!(true);
        let (status, _, text) = send(&app, post("/v1/chat/completions", &streamed)).await;
        assert_eq!(status, StatusCode::OK, "{text}");
        assert_eq!(joined(&text, "reasoning_content"), "Hello world.", "{parser:?}");
        assert_eq!(joined(&text, "content"), content, "{parser:?}");
    }
}

/// Without tags of its own in the tokenizer, the grammar holds from the first token: the whole
/// reply is the answer, and there is no reasoning to split out.
#[tokio::test]
async fn without_tag_tokens_the_format_holds_from_the_first_token() {
    let (app, _) = app(HttpConfig { reasoning_parser: Some(ReasoningParser::DeepseekR1), ..HttpConfig::default() }).await;
    let (status, _, text) = send(&app, post("/v1/chat/completions", &format_request())).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let message = &serde_json::from_str::<Value>(&text).unwrap()["choices"][0]["message"];
    assert!(is_verdict(message["content"].as_str().unwrap()), "{message}");
    assert!(message.get("reasoning_content").is_none_or(Value::is_null), "{message}");
}

/// A prompt that closed the block (`enable_thinking: false`): a model that writes no tag is held
/// to the grammar from its first token under either parser, and its answer is content. With
/// the block left open (DeepSeek-R1's reading of a prompt without tags) nothing holds it until
/// `</think>`, and a reply that never closes it is all reasoning.
#[tokio::test]
async fn a_prompt_that_closed_the_block_holds_the_reply_from_its_first_token() {
    for parser in [ReasoningParser::Qwen3, ReasoningParser::DeepseekR1] {
        let app = scripted_app(parser, "Goodbye!", TEMPLATE.into()).await;
        let closed = with_fields(format_request(), &json!({"chat_template_kwargs": {"enable_thinking": false}}));
        let (status, _, text) = send(&app, post("/v1/chat/completions", &closed)).await;
        assert_eq!(status, StatusCode::OK, "{text}");
        let message = &serde_json::from_str::<Value>(&text).unwrap()["choices"][0]["message"];
        assert!(is_verdict(message["content"].as_str().unwrap()), "{parser:?}: {message}");
        assert!(message.get("reasoning_content").is_none_or(Value::is_null), "{parser:?}: {message}");
        let mut streamed = closed.clone();
        streamed["stream"] = json!(true);
        let (_, _, text) = send(&app, post("/v1/chat/completions", &streamed)).await;
        assert_eq!(joined(&text, "content"), message["content"].as_str().unwrap(), "{parser:?}");
        assert_eq!(joined(&text, "reasoning_content"), "", "{parser:?}");

        let (_, _, text) = send(&app, post("/v1/chat/completions", &format_request())).await;
        let message = &serde_json::from_str::<Value>(&text).unwrap()["choices"][0]["message"];
        match parser {
            ReasoningParser::DeepseekR1 => assert_eq!(message["reasoning_content"], "Goodbye!", "{message}"),
            ReasoningParser::Qwen3 => assert!(is_verdict(message["content"].as_str().unwrap()), "{message}"),
        }
    }
}

/// Tools: the reasoning first, then the call, read from what follows `</think>`.
#[tokio::test]
async fn a_thinking_model_reasons_before_it_calls_a_tool() {
    let app = thinking_app(ReasoningParser::Qwen3).await;
    let tools = json!([{"type": "function", "function": {"name": "dice", "parameters": {"type": "object",
        "properties": {"sides": {"type": "integer", "minimum": 2, "maximum": 9}}, "required": ["sides"]}}}]);
    let body = json!({"messages": [{"role": "user", "content": "Roll"}], "max_tokens": 60, "tools": tools,
        "tool_choice": {"type": "function", "function": {"name": "dice"}}});
    let (status, _, text) = send(&app, post("/v1/chat/completions", &body)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let choice = &serde_json::from_str::<Value>(&text).unwrap()["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{choice}");
    assert_eq!(choice["message"]["reasoning_content"], "Hello world.");
    assert_eq!(choice["message"]["content"], Value::Null);
    let call = &choice["message"]["tool_calls"][0]["function"];
    assert_eq!(call["name"], "dice");
    let arguments = call["arguments"].as_str().unwrap().to_string();
    assert!(serde_json::from_str::<Value>(&arguments).unwrap()["sides"].is_u64(), "{arguments}");

    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let (status, _, text) = send(&app, post("/v1/chat/completions", &streamed)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert_eq!(joined(&text, "reasoning_content"), "Hello world.");
    assert_eq!(joined(&text, "content"), "");
    let events = sse_data(&text);
    let pieces: Vec<&Value> = events.iter().filter_map(|event| event["choices"][0]["delta"]["tool_calls"].get(0)).collect();
    assert_eq!(pieces[0]["function"]["name"], "dice", "{pieces:?}");
    let streamed_arguments: String = pieces.iter().filter_map(|piece| piece["function"]["arguments"].as_str()).collect();
    assert_eq!(streamed_arguments, arguments);
    assert_eq!(events[events.len() - 2]["choices"][0]["finish_reason"], "tool_calls");
}

/// Where `<think>` and `</think>` are special tokens, the reply's text keeps them under the
/// parser (and skips the other special tokens, as the request asks), so the reasoning is split
/// from the answer, whole and streamed.
#[tokio::test]
async fn reasoning_tags_that_are_special_tokens_are_read() {
    let mut tokenizer: Value = serde_json::from_str(&thinking_json()).unwrap();
    for token in tokenizer["added_tokens"].as_array_mut().unwrap() {
        if token["content"] == "<think>" || token["content"] == "</think>" {
            token["special"] = json!(true);
        }
    }
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");
    let template = std::fs::read_to_string(format!("{dir}/smollm2_chat_template.jinja")).unwrap();
    let script = "<think>Hello world.</think>Good<issue_start>bye!";
    let shard = ScriptedShard::spawn_with_script(tokenizer.to_string(), template, script, 49154);
    let config = HttpConfig { reasoning_parser: Some(ReasoningParser::Qwen3), ..HttpConfig::default() };
    let app = app_on_shard(config, shard, &[]).await.0;
    let request = json!({"messages": [{"role": "user", "content": "Well?"}], "max_tokens": 60});
    let (status, _, text) = send(&app, post("/v1/chat/completions", &request)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let message = &serde_json::from_str::<Value>(&text).unwrap()["choices"][0]["message"];
    assert_eq!((&message["reasoning_content"], &message["content"]), (&json!("Hello world."), &json!("Goodbye!")), "{message}");
    let (_, _, text) = send(&app, post("/v1/chat/completions", &with_fields(request, &json!({"stream": true})))).await;
    assert_eq!((joined(&text, "reasoning_content"), joined(&text, "content")), ("Hello world.".to_string(), "Goodbye!".to_string()), "{text}");
}
