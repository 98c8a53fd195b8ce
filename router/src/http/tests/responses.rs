//! OpenAI's Responses API (`/v1/responses`) over the in-process stack: the same reply as the
//! chat route's, as output items, whole and as typed events; a call, a cut reply, reasoning, a
//! tool loop sent back as items, responses kept and continued, and the refusals.
use axum::http::StatusCode;
use serde_json::{json, Value};

use super::scripted_shard::{ScriptedShard, SCRIPT};
use super::{app, app_on_shard, post, send, send_once_admitted, sse_data, wait_for, with_fields, HOLD};
use crate::http::reasoning::ReasoningParser;
use crate::http::HttpConfig;
use crate::tokenizer::tests::{smollm2, thinking_json};

fn dice() -> Value {
    json!([{"type": "function", "name": "dice", "description": "Roll a die", "parameters": {"type": "object",
        "properties": {"sides": {"type": "integer", "minimum": 2, "maximum": 9}}, "required": ["sides"]}}])
}

/// The events of a streamed response, checked for what every stream must hold: consecutive
/// sequence numbers from 0, `response.created` first, and each item's events between its added
/// and done events.
fn events(text: &str) -> Vec<Value> {
    let events = sse_data(text);
    for (number, event) in events.iter().enumerate() {
        assert_eq!(event["sequence_number"], number, "{event}");
    }
    assert_eq!(events[0]["type"], "response.created");
    assert_eq!(events[1]["type"], "response.in_progress");
    assert_eq!(events[0]["response"]["status"], "in_progress");
    events
}

fn of_type<'a>(events: &'a [Value], kind: &str) -> Vec<&'a Value> {
    events.iter().filter(|event| event["type"] == kind).collect()
}

#[tokio::test]
async fn a_response_is_the_chat_reply_as_an_output_message() {
    let (app, log) = app(HttpConfig::default()).await;
    let body = json!({"model": "m", "input": "Hi", "instructions": "Be kind.", "max_output_tokens": 100,
        "metadata": {"k": "v"}});
    let (status, headers, text) = send(&app, post("/v1/responses", &body)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert!(headers.contains_key("x-generated-tokens"));
    let response: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(response["object"], "response");
    assert!(response["id"].as_str().unwrap().starts_with("resp_"));
    assert_eq!(response["status"], "completed");
    assert_eq!(response["incomplete_details"], Value::Null);
    assert_eq!(response["metadata"], json!({"k": "v"}));
    assert_eq!(response["store"], true);
    let output = response["output"].as_array().unwrap();
    assert_eq!(output.len(), 1, "{response}");
    assert_eq!(output[0]["type"], "message");
    assert_eq!(output[0]["role"], "assistant");
    assert_eq!(output[0]["status"], "completed");
    assert_eq!(output[0]["content"], json!([{"type": "output_text", "text": SCRIPT, "annotations": [], "logprobs": []}]));
    let usage = &response["usage"];
    let generated = usage["output_tokens"].as_u64().unwrap();
    assert!(generated > 0);
    assert_eq!(usage["total_tokens"].as_u64().unwrap(), usage["input_tokens"].as_u64().unwrap() + generated);
    // The instructions are the system message, the input the user's.
    let prompt = smollm2().decode(&log.lock().unwrap().new_requests[0].prompt_token_ids, false).unwrap();
    assert!(prompt.starts_with("<|im_start|>system\nBe kind.<|im_end|>\n<|im_start|>user\nHi<|im_end|>"), "{prompt}");
}

#[tokio::test]
async fn a_streamed_response_adds_up_to_the_whole_one() {
    let (app, _) = app(HttpConfig::default()).await;
    let body = json!({"input": [{"role": "user", "content": [{"type": "input_text", "text": "Hi"}]}], "stream": true});
    let (status, _, text) = send(&app, post("/v1/responses", &body)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let events = events(&text);
    assert!(!text.contains("[DONE]"));
    let deltas: String = of_type(&events, "response.output_text.delta").iter().map(|event| event["delta"].as_str().unwrap()).collect();
    assert_eq!(deltas, SCRIPT);
    let added = of_type(&events, "response.output_item.added");
    let done = of_type(&events, "response.output_item.done");
    assert_eq!((added.len(), done.len()), (1, 1));
    assert_eq!(added[0]["item"]["id"], done[0]["item"]["id"]);
    assert_eq!(of_type(&events, "response.output_text.done")[0]["text"], SCRIPT);
    let last = events.last().unwrap();
    assert_eq!(last["type"], "response.completed");
    assert_eq!(last["response"]["id"], events[0]["response"]["id"]);
    assert_eq!(last["response"]["output"], json!([done[0]["item"]]));
    // Every token wrote a delta but the EOS.
    assert_eq!(last["response"]["usage"]["output_tokens"], of_type(&events, "response.output_text.delta").len() + 1);
}

#[tokio::test]
async fn a_reply_cut_by_max_output_tokens_is_incomplete() {
    let (app, _) = app(HttpConfig::default()).await;
    let body = json!({"input": "Hi", "max_output_tokens": 2});
    let (status, _, text) = send(&app, post("/v1/responses", &body)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let response: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(response["status"], "incomplete");
    assert_eq!(response["incomplete_details"], json!({"reason": "max_output_tokens"}));
    assert_eq!(response["output"][0]["status"], "incomplete");
    assert_eq!(response["usage"]["output_tokens"], 2);
    let (_, _, text) = send(&app, post("/v1/responses", &with_fields(body, &json!({"stream": true})))).await;
    let events = events(&text);
    let last = events.last().unwrap();
    assert_eq!(last["type"], "response.incomplete");
    assert_eq!(last["response"]["output"], response["output"].as_array().unwrap().iter().map(|item| {
        let mut item = item.clone();
        item["id"] = of_type(&events, "response.output_item.done")[0]["item"]["id"].clone();
        item
    }).collect::<Value>());
}

#[tokio::test]
async fn a_function_call_is_an_output_item_whole_and_streamed() {
    let (app, log) = app(HttpConfig::default()).await;
    let body = json!({"input": "Roll", "tools": dice(), "tool_choice": {"type": "function", "name": "dice"}, "max_output_tokens": 40});
    let (status, _, text) = send(&app, post("/v1/responses", &body)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let response: Value = serde_json::from_str(&text).unwrap();
    let output = response["output"].as_array().unwrap();
    assert_eq!(output.len(), 1, "{response}");
    let call = &output[0];
    assert_eq!(call["type"], "function_call");
    assert_eq!(call["name"], "dice");
    assert_eq!(call["status"], "completed");
    assert!(call["call_id"].as_str().unwrap().starts_with("call_") && call["id"].as_str().unwrap().starts_with("fc_"));
    let arguments: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
    assert!(arguments["sides"].as_u64().is_some_and(|sides| (2..=9).contains(&sides)), "{arguments}");
    // The tools are the response's as sent, and reach the template as the chat route's.
    assert_eq!(response["tools"], dice());
    let prompt = smollm2().decode(&log.lock().unwrap().new_requests[0].prompt_token_ids, false).unwrap();
    assert!(prompt.contains("\"dice\""), "{prompt}");

    let (status, _, text) = send(&app, post("/v1/responses", &with_fields(body, &json!({"stream": true})))).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let events = events(&text);
    assert!(of_type(&events, "response.output_text.delta").is_empty());
    let added = of_type(&events, "response.output_item.added");
    assert_eq!(added.len(), 1);
    assert_eq!(added[0]["item"]["name"], "dice");
    let pieces: String =
        of_type(&events, "response.function_call_arguments.delta").iter().map(|event| event["delta"].as_str().unwrap()).collect();
    let done = of_type(&events, "response.function_call_arguments.done");
    assert_eq!(done[0]["arguments"], pieces);
    assert_eq!(of_type(&events, "response.output_item.done")[0]["item"]["arguments"], pieces);
    assert_eq!(events.last().unwrap()["type"], "response.completed");
}

#[tokio::test]
async fn a_tool_loop_sent_back_as_items_reaches_the_template() {
    let (app, log) = app(HttpConfig::default()).await;
    let body = json!({"input": [
        {"role": "user", "content": "Roll"},
        {"type": "function_call", "call_id": "call_7", "name": "dice", "arguments": "{\"sides\": 6}"},
        {"type": "function_call_output", "call_id": "call_7", "output": "4"},
    ], "tools": dice(), "max_output_tokens": 5});
    let (status, _, text) = send(&app, post("/v1/responses", &body)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let prompt = smollm2().decode(&log.lock().unwrap().new_requests[0].prompt_token_ids, false).unwrap();
    // SmolLM2's template does not render calls: the call is written in the assistant's turn as
    // JSON, its output is the tool's turn (the last message: the tools' prompt follows it).
    assert!(prompt.contains("<|im_start|>assistant\n[{\"id\":\"call_7\""), "{prompt}");
    assert!(prompt.contains("<|im_start|>tool\n4\n---\n"), "{prompt}");
}

#[tokio::test]
async fn reasoning_is_an_output_item_before_the_message() {
    let shard = ScriptedShard::spawn_with_script(thinking_json(), "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}<assistant>".into(),
        "<think>Hello world.</think>Goodbye!", 49154);
    let config = HttpConfig { reasoning_parser: Some(ReasoningParser::DeepseekR1), ..HttpConfig::default() };
    let (app, _) = app_on_shard(config, shard, &[]).await;
    let body = json!({"input": "Well?", "max_output_tokens": 60, "include": ["message.output_text.logprobs"]});
    let (status, _, text) = send(&app, post("/v1/responses", &body)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let response: Value = serde_json::from_str(&text).unwrap();
    let output = response["output"].as_array().unwrap();
    assert_eq!(output.len(), 2, "{response}");
    assert_eq!(output[0]["type"], "reasoning");
    assert_eq!(output[0]["content"], json!([{"type": "reasoning_text", "text": "Hello world."}]));
    assert_eq!(output[1]["content"][0]["text"], "Goodbye!");
    // The message's logprobs are its own tokens' (and the end's), not the reasoning's.
    let tokens: String = output[1]["content"][0]["logprobs"].as_array().unwrap().iter().map(|logprob| logprob["token"].as_str().unwrap()).collect();
    assert!(tokens.starts_with("Goodbye!") && !tokens.contains("Hello"), "{tokens}");
    // The reasoning's tokens: up to the answer's first (the tags included), fewer than all.
    let usage = &response["usage"];
    let reasoning_tokens = usage["output_tokens_details"]["reasoning_tokens"].as_u64().unwrap();
    assert!(reasoning_tokens >= 4 && reasoning_tokens < usage["output_tokens"].as_u64().unwrap(), "{usage}");

    let (_, _, text) = send(&app, post("/v1/responses", &with_fields(body, &json!({"stream": true})))).await;
    let events = events(&text);
    let reasoning: String =
        of_type(&events, "response.reasoning_text.delta").iter().map(|event| event["delta"].as_str().unwrap()).collect();
    let answer: String = of_type(&events, "response.output_text.delta").iter().map(|event| event["delta"].as_str().unwrap()).collect();
    assert_eq!((reasoning.as_str(), answer.as_str()), ("Hello world.", "Goodbye!"));
    let done: Vec<&Value> = of_type(&events, "response.output_item.done").into_iter().map(|event| &event["item"]).collect();
    assert_eq!((done[0]["type"].as_str(), done[1]["type"].as_str()), (Some("reasoning"), Some("message")));
    let last = &events.last().unwrap()["response"];
    assert_eq!(last["output"].as_array().unwrap().len(), 2);
    assert_eq!(last["usage"]["output_tokens_details"]["reasoning_tokens"], reasoning_tokens);
    let names = |logprobs: &Value| logprobs.as_array().unwrap().iter().map(|logprob| logprob["token"].clone()).collect::<Vec<_>>();
    assert_eq!(names(&last["output"][1]["content"][0]["logprobs"]), names(&output[1]["content"][0]["logprobs"]));
}

#[tokio::test]
async fn refusals_have_their_status_whole_and_streamed() {
    let (app, log) = app(HttpConfig::default()).await;
    for body in [
        json!({"input": "Hi", "conversation": "conv_1"}),
        json!({"input": [{"type": "item_reference", "id": "msg_1"}]}),
        json!({"input": "Hi", "text": {"format": {"type": "json_schema", "name": "x"}}}),
        json!({"input": "Hi", "priority": "high"}),
        json!({"input": "Hi", "max_output_tokens": 0}),
    ] {
        for stream in [false, true] {
            let body = with_fields(body.clone(), &json!({"stream": stream}));
            let (status, _, text) = send(&app, post("/v1/responses", &body)).await;
            assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}: {text}");
            let error: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(error["error_type"], "validation", "{text}");
        }
    }
    // An id not kept is OpenAI's 404, whole or streamed.
    for stream in [false, true] {
        let body = json!({"input": "Hi", "previous_response_id": "resp_1", "stream": stream});
        let (status, _, text) = send(&app, post("/v1/responses", &body)).await;
        assert_eq!((status, serde_json::from_str::<Value>(&text).unwrap()["error_type"].clone()), (StatusCode::NOT_FOUND, json!("not_found")), "{text}");
    }
    assert!(log.lock().unwrap().new_requests.is_empty());
    let (status, _, _) = send(&app, post("/v1/responses", &json!([1, 2]))).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
}

#[tokio::test]
async fn a_refused_stream_has_its_status_and_a_client_that_leaves_cancels_its_request() {
    let (app, log) = app(HttpConfig { max_concurrent_requests: 1, ..HttpConfig::default() }).await;
    let long = json!({"input": HOLD, "max_output_tokens": 1000, "ignore_eos": true, "stream": true});
    let held = tower::ServiceExt::oneshot(app.clone(), post("/v1/responses", &long)).await.unwrap();
    assert_eq!(held.status(), StatusCode::OK);
    wait_for(&log, |log| !log.new_requests.is_empty()).await;
    // At the concurrency limit a response is refused at once, streamed or not, with its status.
    for stream in [false, true] {
        let (status, headers, text) = send(&app, post("/v1/responses", &json!({"input": "x", "stream": stream}))).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{text}");
        assert_eq!(headers["retry-after"], "1");
    }
    // The client leaves: its permit is released (noticed asynchronously) and its request
    // cancelled, which the shard forgets with the next step, before the request's end.
    drop(held);
    let status = send_once_admitted(&app, "/v1/responses", &json!({"input": "x", "max_output_tokens": 1})).await;
    assert_eq!(status, StatusCode::OK);
    wait_for(&log, |log| !log.forgotten.is_empty()).await;
    assert!(log.lock().unwrap().forgotten[0].1 < 1000);
}

#[tokio::test]
async fn a_prompt_served_from_the_prefix_cache_counts_its_cached_tokens() {
    let (app, _) = app(HttpConfig::default()).await;
    let input = "The same long instructions, word for word, in every request of this test. ".repeat(6);
    let body = json!({"input": input, "max_output_tokens": 3});
    let mut cached = Vec::new();
    for stream in [false, false, true] {
        let (status, _, text) = send(&app, post("/v1/responses", &with_fields(body.clone(), &json!({"stream": stream})))).await;
        assert_eq!(status, StatusCode::OK, "{text}");
        let response = match stream {
            false => serde_json::from_str::<Value>(&text).unwrap(),
            true => events(&text).last().unwrap()["response"].clone(),
        };
        let usage = &response["usage"];
        cached.push((usage["input_tokens_details"]["cached_tokens"].as_u64().unwrap(), usage["input_tokens"].as_u64().unwrap()));
    }
    // The first computes the prompt; the next ones take its full blocks.
    assert_eq!(cached[0].0, 0, "{cached:?}");
    for (hit, prompt) in &cached[1..] {
        assert!(*hit > 0 && hit < prompt, "{cached:?}");
    }
}

#[tokio::test]
async fn logprobs_asked_are_the_messages_whole_and_streamed() {
    let (app, _) = app(HttpConfig::default()).await;
    let body = json!({"input": "Hi", "top_logprobs": 2, "max_output_tokens": 100});
    let (status, _, text) = send(&app, post("/v1/responses", &body)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let response: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(response["top_logprobs"], 2);
    assert_eq!(response["usage"]["output_tokens_details"]["reasoning_tokens"], 0);
    let part = &response["output"][0]["content"][0];
    let logprobs = part["logprobs"].as_array().unwrap();
    // One per generated token (the end-of-sequence token's too), each with 2 alternatives.
    assert_eq!(logprobs.len() as u64, response["usage"]["output_tokens"].as_u64().unwrap());
    assert!(logprobs.iter().all(|logprob| logprob["logprob"].as_f64().unwrap() <= 0.0 && logprob["top_logprobs"].as_array().unwrap().len() == 2), "{part}");
    let tokens: String = logprobs.iter().map(|logprob| logprob["token"].as_str().unwrap()).collect();
    assert!(tokens.starts_with(SCRIPT), "{tokens}");
    // Streamed: each delta carries its tokens' logprobs; together they are the message's.
    let (_, _, text) = send(&app, post("/v1/responses", &with_fields(body.clone(), &json!({"stream": true})))).await;
    let events = events(&text);
    let streamed: Vec<Value> = of_type(&events, "response.output_text.delta").iter().flat_map(|event| event["logprobs"].as_array().unwrap().clone()).collect();
    // (The scripted model's logprobs differ from request to request: the tokens are compared.)
    let names = |logprobs: &[Value]| logprobs.iter().map(|logprob| logprob["token"].as_str().unwrap().to_string()).collect::<Vec<_>>();
    assert_eq!(names(&streamed), names(&logprobs[..logprobs.len() - 1]));
    let last = &events.last().unwrap()["response"]["output"][0]["content"][0]["logprobs"];
    assert_eq!(&last.as_array().unwrap()[..streamed.len()], &streamed[..]);
    assert_eq!(names(last.as_array().unwrap()), names(logprobs));
    // Not asked: none.
    let (_, _, text) = send(&app, post("/v1/responses", &json!({"input": "Hi"}))).await;
    let response: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(response["output"][0]["content"][0]["logprobs"], json!([]));
}

fn get(path: &str) -> axum::http::Request<axum::body::Body> {
    axum::http::Request::get(path).body(axum::body::Body::empty()).unwrap()
}

/// Kept responses (`store`, the default): one is read back as it was returned, continued by
/// `previous_response_id` (its conversation then the new input; its instructions are not carried
/// over), whole or streamed, and a continuation continued in turn; deleted, it is a 404 to read
/// or to continue. `store: false` keeps nothing.
#[tokio::test]
async fn a_kept_response_is_read_continued_and_deleted() {
    let (app, log) = app(HttpConfig::default()).await;
    let prompt = |log: &std::sync::Mutex<super::scripted_shard::ShardLog>| {
        smollm2().decode(&log.lock().unwrap().new_requests.last().unwrap().prompt_token_ids, false).unwrap()
    };
    let first = json!({"input": "Name a colour.", "instructions": "Be kind.", "max_output_tokens": 100});
    let (status, _, text) = send(&app, post("/v1/responses", &first)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let first: Value = serde_json::from_str(&text).unwrap();
    let first_id = first["id"].as_str().unwrap().to_string();
    let (status, _, text) = send(&app, get(&format!("/v1/responses/{first_id}"))).await;
    assert_eq!((status, serde_json::from_str::<Value>(&text).unwrap()), (StatusCode::OK, first.clone()));

    let next = json!({"input": "Another one?", "previous_response_id": first_id, "max_output_tokens": 100});
    let (status, _, text) = send(&app, post("/v1/responses", &next)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let second: Value = serde_json::from_str(&text).unwrap();
    assert_eq!((&second["previous_response_id"], &second["store"]), (&json!(first_id), &json!(true)));
    let conversation = prompt(&log);
    let (asked, answered, again) = (conversation.find("Name a colour."), conversation.find(SCRIPT), conversation.find("Another one?"));
    assert!(asked < answered && answered < again && asked.is_some(), "{conversation}");
    assert!(!conversation.contains("Be kind."), "the previous instructions are not carried over: {conversation}");

    // Streamed, a continuation of the continuation: kept as its last event's response.
    let third = json!({"input": "And a third?", "previous_response_id": second["id"], "max_output_tokens": 100, "stream": true});
    let (_, _, text) = send(&app, post("/v1/responses", &third)).await;
    let streamed = events(&text).last().unwrap()["response"].clone();
    assert_eq!(streamed["status"], "completed");
    let conversation = prompt(&log);
    assert_eq!(conversation.matches(SCRIPT).count(), 2, "{conversation}");
    assert!(conversation.find("Another one?") < conversation.find("And a third?"), "{conversation}");
    let (status, _, text) = send(&app, get(&format!("/v1/responses/{}", streamed["id"].as_str().unwrap()))).await;
    assert_eq!((status, serde_json::from_str::<Value>(&text).unwrap()), (StatusCode::OK, streamed));

    let delete = axum::http::Request::delete(format!("/v1/responses/{first_id}")).body(axum::body::Body::empty()).unwrap();
    let (status, _, text) = send(&app, delete).await;
    assert_eq!((status, serde_json::from_str::<Value>(&text).unwrap()),
        (StatusCode::OK, json!({"id": first_id, "object": "response", "deleted": true})));
    let gone = json!({"error": format!("Response with id '{first_id}' not found."), "error_type": "not_found"});
    let (status, _, text) = send(&app, get(&format!("/v1/responses/{first_id}"))).await;
    assert_eq!((status, serde_json::from_str::<Value>(&text).unwrap()), (StatusCode::NOT_FOUND, gone.clone()));
    let (status, _, text) = send(&app, post("/v1/responses", &next)).await;
    assert_eq!((status, serde_json::from_str::<Value>(&text).unwrap()), (StatusCode::NOT_FOUND, gone));
    // The continuation kept its own conversation.
    assert_eq!(send(&app, get(&format!("/v1/responses/{}", second["id"].as_str().unwrap()))).await.0, StatusCode::OK);

    let unkept = json!({"input": "Hi", "store": false});
    let (_, _, text) = send(&app, post("/v1/responses", &unkept)).await;
    let unkept: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(unkept["store"], false);
    assert_eq!(send(&app, get(&format!("/v1/responses/{}", unkept["id"].as_str().unwrap()))).await.0, StatusCode::NOT_FOUND);
    let (status, _, text) = send(&app, post("/v1/responses", &json!({"input": "Hi", "store": "yes"}))).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{text}");
}

/// With `--responses-store-bytes 0` nothing is kept: every response says `store: false`, and a
/// continuation is refused with the reason.
#[tokio::test]
async fn without_a_store_a_continuation_is_refused() {
    let (app, _) = app(HttpConfig { responses_store_bytes: 0, ..HttpConfig::default() }).await;
    let (_, _, text) = send(&app, post("/v1/responses", &json!({"input": "Hi"}))).await;
    let response: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(response["store"], false);
    assert_eq!(send(&app, get(&format!("/v1/responses/{}", response["id"].as_str().unwrap()))).await.0, StatusCode::NOT_FOUND);
    let (status, _, text) = send(&app, post("/v1/responses", &json!({"input": "Hi", "previous_response_id": response["id"]}))).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{text}");
    assert!(text.contains("--responses-store-bytes 0"), "{text}");
}
