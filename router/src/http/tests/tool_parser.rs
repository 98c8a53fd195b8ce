//! Tool calls in the model's own format (`--tool-call-parser hermes`): with `tool_choice: auto`
//! and a template that writes the tools, the reply is generated freely (no grammar: the
//! scripted model writes its script) and every `<tool_call>` block in it is a call, whole and
//! streamed; the text around them is content. `required`, a named function, or a template that
//! does not write the tools keep TGI's grammar and its one call.
use axum::http::StatusCode;
use serde_json::{json, Value};

use super::scripted_shard::ScriptedShard;
use super::{app_on_shard, post, send, sse_data, with_fields};
use crate::http::tool_parser::ToolCallParser;
use crate::http::HttpConfig;
use crate::tokenizer::tests::smollm2;

/// Writes the tools' names, and an assistant's earlier calls, as a Hermes template does.
const TEMPLATE: &str = "{% if tools %}<tools>{% for t in tools %}{{ t.function.name }};{% endfor %}</tools>{% endif %}\
    {% for m in messages %}<{{ m.role }}>{{ m.content }}{% if m.tool_calls %}{% for c in m.tool_calls %}\
    <tool_call>{{ c.function.name }}</tool_call>{% endfor %}{% endif %}{% endfor %}<assistant>";

const TWO_CALLS: &str = "I will check both.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n\
    <tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Lyon\", \"unit\": \"c\"}}\n</tool_call>";

fn tools() -> Value {
    json!([{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
            "required": ["city"]}}}])
}

fn request() -> Value {
    json!({"messages": [{"role": "user", "content": "Weather in Paris and Lyon?"}], "max_tokens": 80, "tools": tools()})
}

type Log = std::sync::Arc<std::sync::Mutex<super::scripted_shard::ShardLog>>;

async fn scripted(script: &str, template: &str) -> (axum::Router, Log) {
    scripted_with(ToolCallParser::Hermes, script, template).await
}

async fn scripted_with(parser: ToolCallParser, script: &str, template: &str) -> (axum::Router, Log) {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");
    let tokenizer = std::fs::read_to_string(format!("{dir}/smollm2_tokenizer.json")).unwrap();
    let shard = ScriptedShard::spawn_with_script(tokenizer, template.to_string(), script, 49152);
    app_on_shard(HttpConfig { tool_call_parser: Some(parser), ..HttpConfig::default() }, shard, &[]).await
}

fn arguments(call: &Value) -> Value {
    serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap()
}

/// A stream's call pieces, joined by index into whole calls (`{id, type, function: {name,
/// arguments}}`): a call's first piece carries its id, type and name, the later ones neither.
fn streamed_calls(text: &str) -> (Vec<Value>, usize) {
    let pieces: Vec<Value> = sse_data(text).into_iter().filter_map(|chunk| chunk["choices"][0]["delta"]["tool_calls"].as_array().cloned()).flatten().collect();
    let mut calls: Vec<Value> = Vec::new();
    for piece in &pieces {
        let index = piece["index"].as_u64().unwrap() as usize;
        let fragment = piece["function"]["arguments"].as_str().unwrap_or_default();
        if index == calls.len() {
            assert!(piece["id"].is_string() && piece["type"] == "function" && piece["function"]["name"].is_string(), "{piece}");
            calls.push(json!({"id": piece["id"], "type": "function", "function": {"name": piece["function"]["name"], "arguments": fragment}}));
        } else {
            assert!(piece.get("id").is_none_or(Value::is_null) && piece["function"].get("name").is_none_or(Value::is_null), "{piece}");
            let joined = calls[index]["function"]["arguments"].as_str().unwrap().to_string() + fragment;
            calls[index]["function"]["arguments"] = json!(joined);
        }
    }
    (calls, pieces.len())
}

#[tokio::test]
async fn every_call_the_reply_writes_is_read_whole_and_streamed() {
    let (app, log) = scripted(TWO_CALLS, TEMPLATE).await;
    let (status, _, text) = send(&app, post("/v1/chat/completions", &request())).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let choice = &serde_json::from_str::<Value>(&text).unwrap()["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{choice}");
    let message = &choice["message"];
    assert_eq!(message["content"], "I will check both.");
    let calls = message["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 2, "{message}");
    assert_eq!(calls.iter().map(|call| &call["function"]["name"]).collect::<Vec<_>>(), [&json!("get_weather"); 2]);
    assert_eq!((arguments(&calls[0]), arguments(&calls[1])), (json!({"city": "Paris"}), json!({"city": "Lyon", "unit": "c"})));
    assert_ne!(calls[0]["id"], calls[1]["id"]);
    assert!(calls.iter().all(|call| call["type"] == "function" && call["id"].as_str().unwrap().starts_with("chatcmpl-tool-")));
    // The template wrote the tools; TGI's instruction is not added.
    let prompt = smollm2().decode(&log.lock().unwrap().new_requests[0].prompt_token_ids, false).unwrap();
    assert!(prompt.starts_with("<tools>get_weather;</tools>") && !prompt.contains("Given the functions available"), "{prompt}");

    let streamed = with_fields(request(), &json!({"stream": true}));
    let (status, _, text) = send(&app, post("/v1/chat/completions", &streamed)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let chunks: Vec<Value> = sse_data(&text).into_iter().filter(|event| event.is_object()).collect();
    let content: String = chunks.iter().filter_map(|chunk| chunk["choices"][0]["delta"]["content"].as_str()).collect();
    assert_eq!(content, "I will check both.");
    // The content went out as it came, ahead of the calls; each call is named once, and its
    // arguments go out in pieces as they are written, adding up to the whole reply's.
    let (pieces, count) = streamed_calls(&text);
    assert_eq!(pieces.len(), 2, "{text}");
    assert!(count > 4, "{text}");
    for (index, piece) in pieces.iter().enumerate() {
        assert_eq!(piece["function"]["name"], "get_weather");
        assert_eq!(piece["function"]["arguments"], calls[index]["function"]["arguments"]);
    }
    assert_ne!(pieces[0]["id"], pieces[1]["id"]);
    let first_call = chunks.iter().position(|chunk| chunk["choices"][0]["delta"]["tool_calls"].is_array()).unwrap();
    let content_chunks = chunks[..first_call].iter().filter(|chunk| chunk["choices"][0]["delta"]["content"].as_str().is_some_and(|c| !c.is_empty())).count();
    assert!(content_chunks > 3, "{text}");
    assert_eq!(chunks.iter().rev().find_map(|chunk| chunk["choices"][0]["finish_reason"].as_str()), Some("tool_calls"));
}

#[tokio::test]
async fn a_reply_that_calls_nothing_is_content_streamed_as_it_comes() {
    let answer = "It is sunny in Paris; <tool_call> is how I would call a tool.";
    let (app, _) = scripted(answer, TEMPLATE).await;
    let (_, _, text) = send(&app, post("/v1/chat/completions", &request())).await;
    let choice = &serde_json::from_str::<Value>(&text).unwrap()["choices"][0];
    // An unclosed block is text, as written.
    assert_eq!(choice["message"]["content"], answer, "{choice}");
    assert!(choice["message"].get("tool_calls").is_none_or(Value::is_null));
    assert_eq!(choice["finish_reason"], "stop");
    let (_, _, text) = send(&app, post("/v1/chat/completions", &with_fields(request(), &json!({"stream": true})))).await;
    let chunks: Vec<Value> = sse_data(&text).into_iter().filter(|event| event.is_object()).collect();
    let content: String = chunks.iter().filter_map(|chunk| chunk["choices"][0]["delta"]["content"].as_str()).collect();
    assert_eq!(content, answer);
    assert!(chunks.iter().all(|chunk| chunk["choices"][0]["delta"]["tool_calls"].is_null()));
}

#[tokio::test]
async fn required_a_named_tool_or_a_template_without_tools_keep_tgis_grammar() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");
    let plain_template = std::fs::read_to_string(format!("{dir}/smollm2_chat_template.jinja")).unwrap();
    let named = json!({"type": "function", "function": {"name": "get_weather"}});
    for (template, fields) in [
        (TEMPLATE.to_string(), json!({"tool_choice": "required"})),
        (TEMPLATE.to_string(), json!({"tool_choice": "required", "parallel_tool_calls": false})),
        (TEMPLATE.to_string(), json!({"tool_choice": named})),
        (plain_template, json!({"tool_choice": "auto"})),
    ] {
        let choice = &fields["tool_choice"];
        let (app, log) = scripted(TWO_CALLS, &template).await;
        let body = with_fields(request(), &fields);
        let (status, _, text) = send(&app, post("/v1/chat/completions", &body)).await;
        assert_eq!(status, StatusCode::OK, "{text}");
        let message = &serde_json::from_str::<Value>(&text).unwrap()["choices"][0]["message"];
        let prompt = smollm2().decode(&log.lock().unwrap().new_requests[0].prompt_token_ids, false).unwrap();
        assert!(prompt.contains("Given the functions available"), "{choice}: {prompt}");
        // The grammar held: whatever the model meant, the reply is TGI's call or `no_tool` answer.
        let calls = message["tool_calls"].as_array().map_or(0, Vec::len);
        assert!(calls == 1 || (calls == 0 && message["content"].is_string()), "{choice}: {message}");
        assert!(!message["content"].as_str().unwrap_or_default().contains("<tool_call>"), "{message}");
    }
}

const LIST: &str = r#"{"function":[{"_name":"get_weather","city":"Paris"},{"_name":"get_weather","city":"Lyon","unit":"c"}]}"#;

/// `required` with `parallel_tool_calls: true`: a list of one or more calls under TGI's grammar,
/// each with its own id, whole and streamed alike. A list the token limit cuts keeps the calls
/// it finished.
#[tokio::test]
async fn required_with_parallel_calls_gives_one_or_more_calls() {
    // The scripted shard writes the mask's lowest token where the script's is not allowed: past
    // TWO_CALLS's text, a comma, call after call, to the token limit.
    for (script, finish) in [(LIST, "tool_calls"), (TWO_CALLS, "length")] {
        required_calls_whole_and_streamed(script, finish).await;
    }
}

async fn required_calls_whole_and_streamed(script: &str, finish: &str) {
    let (app, _) = scripted(script, TEMPLATE).await;
    let body = with_fields(request(), &json!({"tool_choice": "required", "parallel_tool_calls": true}));
    let (status, _, text) = send(&app, post("/v1/chat/completions", &body)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let choice = &serde_json::from_str::<Value>(&text).unwrap()["choices"][0];
    let calls = choice["message"]["tool_calls"].as_array().unwrap();
    assert_eq!(choice["finish_reason"], finish, "{choice}");
    if script == LIST {
        let cities: Vec<Value> = calls.iter().map(|call| arguments(call)["city"].clone()).collect();
        assert_eq!(cities, [json!("Paris"), json!("Lyon")]);
    }
    assert!(calls.len() >= 2, "{choice}");
    let ids: Vec<&str> = calls.iter().map(|call| call["id"].as_str().unwrap()).collect();
    let expected: Vec<String> = (0..calls.len()).map(|index| index.to_string()).collect();
    assert_eq!(ids, expected);
    for call in calls {
        assert_eq!(call["function"]["name"], "get_weather");
        assert!(arguments(call)["city"].is_string(), "{call}");
    }
    // Streamed: the same calls, each named once, its arguments in pieces that add up.
    let (_, _, streamed) = send(&app, post("/v1/chat/completions", &with_fields(body, &json!({"stream": true})))).await;
    let chunks: Vec<Value> = sse_data(&streamed).into_iter().filter(|event| event.is_object()).collect();
    let mut rebuilt: Vec<(String, String, String)> = Vec::new();
    for piece in chunks.iter().filter_map(|chunk| chunk["choices"][0]["delta"]["tool_calls"].as_array()).flatten() {
        let index = piece["index"].as_u64().unwrap() as usize;
        let arguments = piece["function"]["arguments"].as_str().unwrap_or_default();
        match piece["function"]["name"].as_str() {
            Some(name) => {
                assert_eq!(index, rebuilt.len(), "{piece}");
                rebuilt.push((piece["id"].as_str().unwrap().to_string(), name.to_string(), arguments.to_string()));
            }
            None => rebuilt[index].2.push_str(arguments),
        }
    }
    let whole: Vec<(String, String, String)> = calls
        .iter()
        .map(|call| {
            let text = |key: &str| call["function"][key].as_str().unwrap().to_string();
            (call["id"].as_str().unwrap().to_string(), text("name"), text("arguments"))
        })
        .collect();
    // Cut short, the stream may also have sent the unfinished call's beginning.
    assert_eq!(rebuilt[..whole.len()], whole[..]);
    assert!(rebuilt.len() - whole.len() <= usize::from(finish == "length"), "{rebuilt:?}");
    assert_eq!(chunks.iter().rev().find_map(|chunk| chunk["choices"][0]["finish_reason"].as_str()), Some(finish));
}

#[tokio::test]
async fn the_responses_api_gives_each_call_its_item() {
    let (app, _) = scripted(TWO_CALLS, TEMPLATE).await;
    let tools = json!([{"type": "function", "name": "get_weather", "parameters": tools()[0]["function"]["parameters"]}]);
    let body = json!({"input": "Weather in Paris and Lyon?", "tools": tools, "max_output_tokens": 80});
    let (status, _, text) = send(&app, post("/v1/responses", &body)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let response: Value = serde_json::from_str(&text).unwrap();
    let output = response["output"].as_array().unwrap();
    let kinds: Vec<&str> = output.iter().map(|item| item["type"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["message", "function_call", "function_call"], "{response}");
    assert_eq!(output[0]["content"][0]["text"], "I will check both.");
    assert_eq!(serde_json::from_str::<Value>(output[2]["arguments"].as_str().unwrap()).unwrap(), json!({"city": "Lyon", "unit": "c"}));
    assert_ne!(output[1]["call_id"], output[2]["call_id"]);
}

/// A thinking model's reply reasons, then calls: the reasoning is `reasoning_content`, and the
/// calls are read from the answer after it (a `<tool_call>` written inside the reasoning is
/// reasoning), whole and streamed.
#[tokio::test]
async fn calls_are_read_after_the_reasoning() {
    use crate::http::reasoning::ReasoningParser;
    use crate::tokenizer::tests::thinking_json;
    let script = "<think>Paris; maybe <tool_call> later.</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
    let shard = ScriptedShard::spawn_with_script(thinking_json(), TEMPLATE.to_string(), script, 49154);
    let config = HttpConfig { tool_call_parser: Some(ToolCallParser::Hermes), reasoning_parser: Some(ReasoningParser::Qwen3), ..HttpConfig::default() };
    let (app, _) = app_on_shard(config, shard, &[]).await;
    let (status, _, text) = send(&app, post("/v1/chat/completions", &request())).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let choice = &serde_json::from_str::<Value>(&text).unwrap()["choices"][0];
    let message = &choice["message"];
    assert_eq!(message["reasoning_content"], "Paris; maybe <tool_call> later.", "{message}");
    assert!(message["content"].is_null(), "{message}");
    assert_eq!(message["tool_calls"].as_array().unwrap().len(), 1);
    assert_eq!(arguments(&message["tool_calls"][0]), json!({"city": "Paris"}));
    assert_eq!(choice["finish_reason"], "tool_calls");

    let (_, _, text) = send(&app, post("/v1/chat/completions", &with_fields(request(), &json!({"stream": true})))).await;
    let chunks: Vec<Value> = sse_data(&text).into_iter().filter(|event| event.is_object()).collect();
    let field = |name: &str| chunks.iter().filter_map(|chunk| chunk["choices"][0]["delta"][name].as_str()).collect::<String>();
    assert_eq!(field("reasoning_content"), "Paris; maybe <tool_call> later.");
    assert_eq!(field("content"), "");
    let (calls, _) = streamed_calls(&text);
    assert_eq!(calls.len(), 1, "{text}");
    assert_eq!(arguments(&calls[0]), json!({"city": "Paris"}));
}

/// `parallel_tool_calls: false`: the reply's first call alone, whole and streamed.
#[tokio::test]
async fn without_parallel_calls_the_first_is_kept() {
    let (app, _) = scripted(TWO_CALLS, TEMPLATE).await;
    let single = with_fields(request(), &json!({"parallel_tool_calls": false}));
    let (_, _, text) = send(&app, post("/v1/chat/completions", &single)).await;
    let message = &serde_json::from_str::<Value>(&text).unwrap()["choices"][0]["message"];
    let calls = message["tool_calls"].as_array().unwrap();
    assert_eq!((calls.len(), arguments(&calls[0])), (1, json!({"city": "Paris"})), "{message}");
    assert_eq!(message["content"], "I will check both.");
    let (_, _, text) = send(&app, post("/v1/chat/completions", &with_fields(single, &json!({"stream": true})))).await;
    let (calls, _) = streamed_calls(&text);
    assert_eq!(calls.len(), 1, "{text}");
    assert_eq!(arguments(&calls[0]), json!({"city": "Paris"}));
}

/// `llama3_json`: a reply of JSON calls, `;` between them, whole and streamed (each call's
/// parameters as they are written); a plain reply streams as content.
#[tokio::test]
async fn llama_json_calls_are_read_whole_and_streamed() {
    let script = "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}; {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Lyon\"}}";
    let (app, _) = scripted_with(ToolCallParser::Llama3Json, script, TEMPLATE).await;
    let (_, _, text) = send(&app, post("/v1/chat/completions", &request())).await;
    let choice = &serde_json::from_str::<Value>(&text).unwrap()["choices"][0];
    let calls = choice["message"]["tool_calls"].as_array().unwrap();
    assert_eq!(calls.iter().map(arguments).collect::<Vec<_>>(), [json!({"city": "Paris"}), json!({"city": "Lyon"})], "{choice}");
    assert!(choice["message"]["content"].is_null());
    assert_eq!(choice["finish_reason"], "tool_calls");
    let (_, _, text) = send(&app, post("/v1/chat/completions", &with_fields(request(), &json!({"stream": true})))).await;
    let (calls, pieces) = streamed_calls(&text);
    assert_eq!(calls.iter().map(arguments).collect::<Vec<_>>(), [json!({"city": "Paris"}), json!({"city": "Lyon"})], "{text}");
    // Each call's parameters go out as they are written, not at the reply's end.
    assert!(pieces > 4, "{text}");

    let (app, _) = scripted_with(ToolCallParser::Llama3Json, "Sunny in Paris.", TEMPLATE).await;
    let (_, _, text) = send(&app, post("/v1/chat/completions", &with_fields(request(), &json!({"stream": true})))).await;
    let contents: Vec<String> = sse_data(&text).into_iter().filter_map(|chunk| chunk["choices"][0]["delta"]["content"].as_str().map(String::from)).filter(|c| !c.is_empty()).collect();
    assert_eq!(contents.concat(), "Sunny in Paris.");
    assert!(contents.len() > 1, "{text}");
}

/// `mistral`: the calls follow `[TOOL_CALLS]`, a special token (here the fixture's `<gh_stars>`,
/// renamed), which the reply's text keeps under this parser though the request skips special
/// tokens; each call's id is the 9 letters and digits Mistral's templates take back. Both forms,
/// whole and streamed; the Responses API's call ids too.
#[tokio::test]
async fn mistral_calls_are_read_after_their_special_token() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");
    let tokenizer = std::fs::read_to_string(format!("{dir}/smollm2_tokenizer.json")).unwrap().replace("<gh_stars>", "[TOOL_CALLS]");
    let is_mistral_id = |id: &Value| id.as_str().is_some_and(|id| id.len() == 9 && id.chars().all(|c| c.is_ascii_alphanumeric()));
    for script in [
        "Checking.[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Lyon\"}}]",
        "Checking.[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Lyon\"}",
    ] {
        let shard = ScriptedShard::spawn_with_script(tokenizer.clone(), TEMPLATE.to_string(), script, 49152);
        let (app, _) = app_on_shard(HttpConfig { tool_call_parser: Some(ToolCallParser::Mistral), ..HttpConfig::default() }, shard, &[]).await;
        let (status, _, text) = send(&app, post("/v1/chat/completions", &request())).await;
        assert_eq!(status, StatusCode::OK, "{text}");
        let choice = &serde_json::from_str::<Value>(&text).unwrap()["choices"][0];
        let calls = choice["message"]["tool_calls"].as_array().unwrap_or_else(|| panic!("{script}: {choice}"));
        assert_eq!(calls.iter().map(arguments).collect::<Vec<_>>(), [json!({"city": "Paris"}), json!({"city": "Lyon"})], "{choice}");
        assert!(calls.iter().all(|call| is_mistral_id(&call["id"])), "{choice}");
        assert_eq!((&choice["message"]["content"], &choice["finish_reason"]), (&json!("Checking."), &json!("tool_calls")));

        let (_, _, text) = send(&app, post("/v1/chat/completions", &with_fields(request(), &json!({"stream": true})))).await;
        let (calls, pieces) = streamed_calls(&text);
        assert_eq!(calls.iter().map(arguments).collect::<Vec<_>>(), [json!({"city": "Paris"}), json!({"city": "Lyon"})], "{text}");
        assert!(calls.iter().all(|call| is_mistral_id(&call["id"])) && pieces > 4, "{text}");
        let content: String = sse_data(&text).iter().filter_map(|chunk| chunk["choices"][0]["delta"]["content"].as_str()).collect();
        assert_eq!(content, "Checking.");

        let responses = json!({"input": "Weather in Paris and Lyon?", "max_output_tokens": 80, "tools": [
            {"type": "function", "name": "get_weather", "parameters": tools()[0]["function"]["parameters"]}]});
        let (status, _, text) = send(&app, post("/v1/responses", &responses)).await;
        assert_eq!(status, StatusCode::OK, "{text}");
        let output = serde_json::from_str::<Value>(&text).unwrap()["output"].clone();
        let ids: Vec<&Value> = output.as_array().unwrap().iter().filter(|item| item["type"] == "function_call").map(|item| &item["call_id"]).collect();
        assert!(ids.len() == 2 && ids.iter().all(|id| is_mistral_id(id)), "{output}");
    }
    // Without the parser the marker is skipped, as any special token is.
    let shard = ScriptedShard::spawn_with_script(tokenizer, TEMPLATE.to_string(), "A[TOOL_CALLS]B", 49152);
    let (app, _) = app_on_shard(HttpConfig { tool_call_parser: Some(ToolCallParser::Hermes), ..HttpConfig::default() }, shard, &[]).await;
    let (_, _, text) = send(&app, post("/v1/chat/completions", &request())).await;
    assert_eq!(serde_json::from_str::<Value>(&text).unwrap()["choices"][0]["message"]["content"], "AB", "{text}");
}

/// `hermes` where `<tool_call>` and `</tool_call>` are special tokens (some Hermes models'; here
/// the fixture's `<gh_stars>` and `<filename>`, renamed): the reply's text keeps them under the
/// parser, so the calls are read, whole and streamed; where they are plain text nothing changes,
/// and the reply's other special tokens are skipped as the request asks.
#[tokio::test]
async fn hermes_calls_are_read_where_their_tags_are_special_tokens() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");
    let tokenizer = std::fs::read_to_string(format!("{dir}/smollm2_tokenizer.json")).unwrap()
        .replace("<gh_stars>", "<tool_call>").replace("<filename>", "</tool_call>");
    let script = "Checking.<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}</tool_call>\
        <tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Lyon\"}}</tool_call>";
    let shard = ScriptedShard::spawn_with_script(tokenizer.clone(), TEMPLATE.to_string(), script, 49152);
    let (app, _) = app_on_shard(HttpConfig { tool_call_parser: Some(ToolCallParser::Hermes), ..HttpConfig::default() }, shard, &[]).await;
    let (status, _, text) = send(&app, post("/v1/chat/completions", &request())).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let choice = &serde_json::from_str::<Value>(&text).unwrap()["choices"][0];
    let calls = choice["message"]["tool_calls"].as_array().unwrap_or_else(|| panic!("{choice}"));
    assert_eq!(calls.iter().map(arguments).collect::<Vec<_>>(), [json!({"city": "Paris"}), json!({"city": "Lyon"})], "{choice}");
    assert_eq!((&choice["message"]["content"], &choice["finish_reason"]), (&json!("Checking."), &json!("tool_calls")));
    let (_, _, text) = send(&app, post("/v1/chat/completions", &with_fields(request(), &json!({"stream": true})))).await;
    let (calls, _) = streamed_calls(&text);
    assert_eq!(calls.iter().map(arguments).collect::<Vec<_>>(), [json!({"city": "Paris"}), json!({"city": "Lyon"})], "{text}");
    // Without tools the reply is not read for calls: special tokens are skipped as asked.
    let plain = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 80});
    let (_, _, text) = send(&app, post("/v1/chat/completions", &plain)).await;
    let content = serde_json::from_str::<Value>(&text).unwrap()["choices"][0]["message"]["content"].as_str().unwrap().to_string();
    assert!(content.starts_with("Checking.{\"name\"") && !content.contains("tool_call"), "{content}");
    // A special token that is no tag of the format is still skipped under the parser.
    let shard = ScriptedShard::spawn_with_script(tokenizer, TEMPLATE.to_string(), "A<issue_start>B", 49152);
    let (app, _) = app_on_shard(HttpConfig { tool_call_parser: Some(ToolCallParser::Hermes), ..HttpConfig::default() }, shard, &[]).await;
    let (_, _, text) = send(&app, post("/v1/chat/completions", &request())).await;
    assert_eq!(serde_json::from_str::<Value>(&text).unwrap()["choices"][0]["message"]["content"], "AB", "{text}");
}
