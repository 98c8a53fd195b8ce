//! The OpenAI-compatible routes over the same in-process stack as the TGI route tests.
use axum::http::StatusCode;
use serde_json::{json, Value};

use super::scripted_shard::{EOS, SCRIPT};
use super::{app, app_with_template, post, send, sse_data, with_fields};
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

/// One choice failing does not cut the others short, and the stream still ends with `[DONE]`
/// (clients that time a request by it, and OpenAI's own, expect it), without a usage chunk that
/// would count only part of the request.
#[tokio::test]
async fn a_failed_choice_reports_its_error_and_the_stream_still_ends_with_done() {
    let (app, _) = app(HttpConfig { max_input_tokens: 8, max_total_tokens: 16, ..HttpConfig::default() }).await;
    let body = json!({"prompt": ["a", "a b c d e f g h i j k"], "max_tokens": 3, "stream": true,
        "stream_options": {"include_usage": true}});
    let (status, _, text) = send(&app, post("/v1/completions", &body)).await;
    assert_eq!(status, StatusCode::OK);
    let events = sse_data(&text);
    assert_eq!(events.last().unwrap(), "[DONE]", "{text}");
    assert_eq!(events.iter().filter(|event| *event == "[DONE]").count(), 1);
    let errors: Vec<&Value> = events.iter().filter(|event| event.get("error").is_some()).collect();
    assert_eq!(errors.len(), 1, "{text}");
    assert_eq!(errors[0]["error"]["http_status_code"], 422);
    let first: Vec<&Value> = events
        .iter()
        .filter_map(|event| event["choices"].as_array())
        .flatten()
        .filter(|choice| choice["index"] == 0)
        .collect();
    assert_eq!(first.len(), 3, "{text}");
    assert_eq!(first[2]["finish_reason"], "length");
    assert!(events.iter().all(|event| event.get("usage").map_or(true, Value::is_null)), "{text}");
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

#[tokio::test]
async fn completions_return_the_legacy_logprobs_streamed_and_not() {
    let (app, _) = app(HttpConfig::default()).await;
    let body = json!({"prompt": "Hi", "max_tokens": 100, "logprobs": 2});
    let (status, _, text) = send(&app, post("/v1/completions", &body)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let completion: Value = serde_json::from_str(&text).unwrap();
    let logprobs = &completion["choices"][0]["logprobs"];
    let tokens = logprobs["tokens"].as_array().unwrap();
    assert_eq!(tokens.len(), completion["usage"]["completion_tokens"].as_u64().unwrap() as usize);
    // The tokens spell the text, the end-of-answer token after it (its offset the text's end).
    let joined: String = tokens.iter().map(|t| t.as_str().unwrap()).collect();
    assert_eq!(joined.strip_suffix("<|im_end|>"), Some(SCRIPT));
    let offsets: Vec<u64> = logprobs["text_offset"].as_array().unwrap().iter().map(|o| o.as_u64().unwrap()).collect();
    assert_eq!(offsets[0], 0);
    assert!(offsets.windows(2).all(|w| w[0] <= w[1]));
    for (position, token) in tokens.iter().enumerate() {
        let chosen = logprobs["token_logprobs"][position].as_f64().unwrap();
        assert!(chosen <= 0.0);
        let alternatives = logprobs["top_logprobs"][position].as_object().unwrap();
        // Two alternatives, and the sampled token among them (added when not one of the two).
        assert!((2..=3).contains(&alternatives.len()), "{alternatives:?}");
        assert_eq!(alternatives[token.as_str().unwrap()].as_f64().unwrap(), chosen);
    }
    // Without `logprobs`: none.
    let (_, _, text) = send(&app, post("/v1/completions", &json!({"prompt": "Hi", "max_tokens": 5}))).await;
    assert!(serde_json::from_str::<Value>(&text).unwrap()["choices"][0]["logprobs"].is_null());

    let streamed = json!({"prompt": "Hi", "max_tokens": 100, "logprobs": 0, "stream": true});
    let (status, _, text) = send(&app, post("/v1/completions", &streamed)).await;
    assert_eq!(status, StatusCode::OK);
    let events = sse_data(&text);
    let chunks: Vec<&Value> = events.iter().filter(|e| e["choices"].as_array().is_some_and(|c| !c.is_empty())).collect();
    assert!(!chunks.is_empty());
    for chunk in chunks {
        let logprobs = &chunk["choices"][0]["logprobs"];
        assert_eq!(logprobs["tokens"].as_array().unwrap().len(), 1, "{chunk}");
        // logprobs 0: the sampled token's own log-probability only.
        assert_eq!(logprobs["top_logprobs"][0].as_object().unwrap().len(), 1);
    }
}

#[tokio::test]
async fn completions_echo_the_prompt_and_score_its_tokens_first() {
    let (app, log) = app(HttpConfig::default()).await;
    let prompt = "The sky is";
    let body = json!({"prompt": prompt, "max_tokens": 1, "logprobs": 1, "echo": true, "temperature": 0});
    let (status, _, text) = send(&app, post("/v1/completions", &body)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let completion: Value = serde_json::from_str(&text).unwrap();
    let choice = &completion["choices"][0];
    let text = choice["text"].as_str().unwrap();
    assert!(text.starts_with(prompt) && text.len() > prompt.len(), "{text}");
    // The engine was asked for the prompt's logprobs.
    assert!(log.lock().unwrap().new_requests.last().unwrap().prompt_logprobs);
    let logprobs = &choice["logprobs"];
    let prompt_ids = smollm2().encode(prompt, true).unwrap().ids;
    let tokens = logprobs["tokens"].as_array().unwrap();
    assert_eq!(tokens.len(), prompt_ids.len() + 1, "{logprobs}");
    let joined: String = tokens.iter().map(|t| t.as_str().unwrap()).collect();
    assert_eq!(joined, text);
    // The first prompt token: no logprob and no alternatives; the others: their logprob, their
    // position's most likely token and themselves.
    assert!(logprobs["token_logprobs"][0].is_null() && logprobs["top_logprobs"][0].is_null(), "{logprobs}");
    // The scripted shard's most likely token at every prompt position is id 100: it came back
    // with the prompt's logprobs.
    let shard_top = smollm2().token_text(100);
    for position in 1..tokens.len() {
        let chosen = logprobs["token_logprobs"][position].as_f64().unwrap();
        let alternatives = logprobs["top_logprobs"][position].as_object().unwrap();
        assert!((1..=2).contains(&alternatives.len()), "{alternatives:?}");
        assert_eq!(alternatives[tokens[position].as_str().unwrap()].as_f64().unwrap(), chosen);
        if position < prompt_ids.len() {
            assert!(alternatives.contains_key(&shard_top), "{position}: {alternatives:?}");
        }
    }
    let offsets: Vec<usize> = logprobs["text_offset"].as_array().unwrap().iter().map(|o| o.as_u64().unwrap() as usize).collect();
    assert_eq!(offsets[0], 0);
    assert_eq!(offsets[prompt_ids.len()], prompt.chars().count());

    // Without logprobs: the text only, and the prompt's logprobs are not computed.
    let (_, _, text) = send(&app, post("/v1/completions", &json!({"prompt": prompt, "max_tokens": 2, "echo": true}))).await;
    let completion: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(completion["choices"][0]["text"], format!("{prompt}{}", &SCRIPT[..completion["choices"][0]["text"].as_str().unwrap().len() - prompt.len()]));
    assert!(!log.lock().unwrap().new_requests.last().unwrap().prompt_logprobs);

    // Streamed: each choice's first chunk is its prompt, with the prompt's logprobs as the
    // whole completion gives them (without offsets, as every chunk); the text adds up the same.
    let whole = json!({"prompt": prompt, "max_tokens": 2, "echo": true, "logprobs": 1, "temperature": 0});
    let (_, _, text) = send(&app, post("/v1/completions", &whole)).await;
    let whole: Value = serde_json::from_str(&text).unwrap();
    let streamed = json!({"prompt": prompt, "max_tokens": 2, "echo": true, "logprobs": 1, "temperature": 0, "stream": true, "n": 2});
    let (status, _, text) = send(&app, post("/v1/completions", &streamed)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let events = sse_data(&text);
    for index in 0..2 {
        let chunks: Vec<&Value> = events.iter().filter(|e| e["choices"][0]["index"] == index).collect();
        assert_eq!(chunks[0]["choices"][0]["text"], prompt);
        let echoed = &chunks[0]["choices"][0]["logprobs"];
        for field in ["tokens", "token_logprobs", "top_logprobs"] {
            assert_eq!(echoed[field].as_array().unwrap()[..], whole["choices"][0]["logprobs"][field].as_array().unwrap()[..prompt_ids.len()], "{field}");
        }
        let text: String = chunks.iter().map(|c| c["choices"][0]["text"].as_str().unwrap()).collect();
        assert_eq!(text, whole["choices"][0]["text"].as_str().unwrap());
    }
}

#[tokio::test]
async fn completions_take_prompts_as_token_ids_and_send_them_as_given() {
    let (app, log) = app(HttpConfig::default()).await;
    let ids = smollm2().encode("The sky is", false).unwrap().ids;
    let body = json!({"prompt": ids, "max_tokens": 2, "echo": true});
    let (status, _, text) = send(&app, post("/v1/completions", &body)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert_eq!(log.lock().unwrap().new_requests.last().unwrap().prompt_token_ids, ids);
    let completion: Value = serde_json::from_str(&text).unwrap();
    // Echoed as their text.
    assert!(completion["choices"][0]["text"].as_str().unwrap().starts_with("The sky is"), "{text}");
    assert_eq!(completion["usage"]["prompt_tokens"], ids.len());

    // A batch of them, streamed too: each prompt sent as given.
    let batch = json!({"prompt": [[5, 6, 7], [8, 9]], "max_tokens": 2});
    let (status, _, text) = send(&app, post("/v1/completions", &batch)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert_eq!(serde_json::from_str::<Value>(&text).unwrap()["choices"].as_array().unwrap().len(), 2);
    let streamed = json!({"prompt": [11, 12], "max_tokens": 2, "stream": true});
    let (status, _, text) = send(&app, post("/v1/completions", &streamed)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(sse_data(&text).last().unwrap(), "[DONE]");
    let sent: Vec<Vec<u32>> = log.lock().unwrap().new_requests.iter().rev().take(3).map(|r| r.prompt_token_ids.clone()).collect();
    assert!(sent.contains(&vec![5, 6, 7]) && sent.contains(&vec![8, 9]) && sent.contains(&vec![11, 12]), "{sent:?}");

    // Ids outside the vocabulary, and an empty prompt, are refused before the engine sees them.
    let before = log.lock().unwrap().new_requests.len();
    for (prompt, expected) in [
        (json!([5, 49152]), "token id 49152 is not in the model's vocabulary of 49152 tokens"),
        (json!([[]]), "`inputs` cannot be empty"),
        (json!([5, -1]), "did not match any variant"),
    ] {
        let (status, _, text) = send(&app, post("/v1/completions", &json!({"prompt": prompt, "max_tokens": 2}))).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{prompt}: {text}");
        assert!(text.contains(expected), "{prompt}: {text}");
    }
    assert_eq!(log.lock().unwrap().new_requests.len(), before);
}

#[tokio::test]
async fn completions_best_of_generates_candidates_and_answers_one() {
    let (app, log) = app(HttpConfig::default()).await;
    let body = json!({"prompt": "Hi", "max_tokens": 3, "best_of": 2, "temperature": 0.8});
    let (status, _, text) = send(&app, post("/v1/completions", &body)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert_eq!(serde_json::from_str::<Value>(&text).unwrap()["choices"].as_array().unwrap().len(), 1);
    assert_eq!(log.lock().unwrap().new_requests.len(), 2);
    for (body, expected) in [
        (json!({"prompt": "Hi", "max_tokens": 3, "best_of": 2, "n": 2}), "`best_of` greater than 1 is supported with `n` = 1 only"),
        (json!({"prompt": "Hi", "max_tokens": 3, "best_of": 3, "temperature": 0.8}), "`best_of` must be > 0 and <= 2"),
        (json!({"prompt": "Hi", "max_tokens": 3, "best_of": 2, "temperature": 0}), "sampling"),
    ] {
        let (status, _, text) = send(&app, post("/v1/completions", &body)).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}: {text}");
        assert!(text.contains(expected), "{body}: {text}");
    }
}

#[tokio::test]
async fn logit_bias_reaches_the_shard_checked_on_both_routes() {
    let (app, log) = app(HttpConfig::default()).await;
    let chat = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "logit_bias": {"42": -100, "7": 2.5}});
    let (status, _, text) = send(&app, post("/v1/chat/completions", &chat)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let sent = log.lock().unwrap().new_requests.last().unwrap().parameters.clone().unwrap().logit_bias;
    assert_eq!(sent, [(42, -100.0), (7, 2.5)].into_iter().collect());
    let completion = json!({"prompt": "Hi", "max_tokens": 2, "logit_bias": {"5": 1}, "stream": true});
    let (status, _, _) = send(&app, post("/v1/completions", &completion)).await;
    assert_eq!(status, StatusCode::OK);
    let sent = log.lock().unwrap().new_requests.last().unwrap().parameters.clone().unwrap().logit_bias;
    assert_eq!(sent, [(5, 1.0)].into_iter().collect());

    let before = log.lock().unwrap().new_requests.len();
    for (bias, expected) in [
        (json!({"42": -101}), "`logit_bias` must be between -100 and 100. Given: -101 for token 42"),
        (json!({"forty": 1}), "`logit_bias` keys must be token ids"),
        (json!({"49152": 1}), "token id 49152 is not in the model's vocabulary of 49152 tokens"),
    ] {
        let body = json!({"prompt": "Hi", "max_tokens": 2, "logit_bias": bias});
        let (status, _, text) = send(&app, post("/v1/completions", &body)).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{bias}: {text}");
        assert!(text.contains(expected), "{bias}: {text}");
    }
    assert_eq!(log.lock().unwrap().new_requests.len(), before);
}

#[tokio::test]
async fn chat_streams_logprobs_when_asked_with_no_alternatives() {
    let (app, _) = app(HttpConfig::default()).await;
    let body = json!({"messages": [{"role": "user", "content": "Hi"}], "stream": true, "max_tokens": 100,
                      "logprobs": true});
    let (status, _, text) = send(&app, post("/v1/chat/completions", &body)).await;
    assert_eq!(status, StatusCode::OK);
    let events = sse_data(&text);
    let chunks: Vec<&Value> = events.iter().filter(|e| e["object"] == "chat.completion.chunk").collect();
    assert!(!chunks.is_empty());
    for chunk in chunks {
        let content = &chunk["choices"][0]["logprobs"]["content"];
        assert_eq!(content.as_array().map(Vec::len), Some(1), "{chunk}");
        assert!(content[0]["logprob"].as_f64().unwrap() <= 0.0);
        assert_eq!(content[0]["top_logprobs"], json!([]));
    }
}

#[tokio::test]
async fn n_choices_share_the_prompt_and_count_it_once() {
    let (app, log) = app(HttpConfig::default()).await;
    let chat = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 100, "n": 3, "seed": 7,
                      "temperature": 0.8});
    let (status, _, text) = send(&app, post("/v1/chat/completions", &chat)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let reply: Value = serde_json::from_str(&text).unwrap();
    let choices = reply["choices"].as_array().unwrap();
    assert_eq!(choices.iter().map(|c| c["index"].as_u64().unwrap()).collect::<Vec<_>>(), vec![0, 1, 2]);
    assert!(choices.iter().all(|c| c["message"]["content"] == SCRIPT));
    let single_prompt = reply["usage"]["prompt_tokens"].as_u64().unwrap();
    let (_, _, one) = send(&app, post("/v1/chat/completions", &json!({"messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 100}))).await;
    let one: Value = serde_json::from_str(&one).unwrap();
    assert_eq!(single_prompt, one["usage"]["prompt_tokens"].as_u64().unwrap(), "the prompt counts once");
    assert_eq!(reply["usage"]["completion_tokens"].as_u64().unwrap(), 3 * one["usage"]["completion_tokens"].as_u64().unwrap());
    // Three engine requests, seeds 7, 8, 9: the choices sample differently yet reproducibly.
    let seeds: Vec<u64> = log.lock().unwrap().new_requests.iter().take(3)
        .map(|r| r.parameters.as_ref().unwrap().seed).collect();
    assert_eq!({ let mut s = seeds.clone(); s.sort(); s }, vec![7, 8, 9]);

    let streamed = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 100, "n": 2,
                          "stream": true, "stream_options": {"include_usage": true}});
    let (status, _, text) = send(&app, post("/v1/chat/completions", &streamed)).await;
    assert_eq!(status, StatusCode::OK);
    let events = sse_data(&text);
    for index in 0..2u64 {
        let content: String = events.iter()
            .filter(|e| e["choices"].as_array().is_some_and(|c| !c.is_empty()) && e["choices"][0]["index"] == index)
            .map(|e| e["choices"][0]["delta"]["content"].as_str().unwrap_or("").to_string()).collect();
        assert_eq!(content, SCRIPT, "choice {index}");
    }
    assert_eq!(events[events.len() - 2]["usage"]["prompt_tokens"].as_u64().unwrap(), single_prompt);

    // Completions: prompt by prompt, each prompt's choices together.
    let body = json!({"prompt": ["a", "b"], "max_tokens": 100, "n": 2});
    let (status, _, text) = send(&app, post("/v1/completions", &body)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let reply: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(reply["choices"].as_array().unwrap().len(), 4);
}

#[tokio::test]
async fn n_beyond_the_limits_is_422() {
    let (app, _) = app(HttpConfig::default()).await;
    let chat = |n: u64| json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5, "n": n});
    for n in [0, 5] {
        let (status, _, text) = send(&app, post("/v1/chat/completions", &chat(n))).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "n={n}: {text}");
        assert!(text.contains("`n` must be between 1 and 4"), "{text}");
    }
    // Three prompts of two choices are six sequences, over the limit of four.
    let (status, _, _) = send(&app, post("/v1/completions", &json!({"prompt": ["a", "b", "c"], "n": 2}))).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
}

/// `n` choices with tools: each choice's call is its own, whole and streamed (each streamed
/// choice's pieces add up to its call).
#[tokio::test]
async fn each_of_n_choices_calls_on_its_own() {
    let (app, _) = app(HttpConfig::default()).await;
    let tools = json!({"messages": [{"role": "user", "content": "Hi"}], "n": 2, "max_tokens": 30, "tools": [{"type": "function",
        "function": {"name": "f", "parameters": {"type": "object", "properties": {"x": {"enum": ["a", "b"]}}, "required": ["x"]}}}],
        "tool_choice": "required"});
    let (status, _, text) = send(&app, post("/v1/chat/completions", &tools)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let whole: Value = serde_json::from_str(&text).unwrap();
    let calls: Vec<&Value> = whole["choices"].as_array().unwrap().iter().map(|choice| &choice["message"]["tool_calls"][0]["function"]).collect();
    assert_eq!(calls.len(), 2, "{text}");
    assert!(calls.iter().all(|call| call["name"] == "f"), "{text}");
    let (status, _, text) = send(&app, post("/v1/chat/completions", &with_fields(tools, &json!({"stream": true})))).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let events = sse_data(&text);
    for index in 0..2 {
        let pieces: Vec<&Value> = events
            .iter()
            .filter(|event| event["choices"][0]["index"] == index)
            .filter_map(|event| event["choices"][0]["delta"]["tool_calls"].get(0))
            .collect();
        assert_eq!(pieces[0]["function"]["name"], "f", "choice {index}: {text}");
        let arguments: String = pieces.iter().map(|piece| piece["function"]["arguments"].as_str().unwrap()).collect();
        let arguments: Value = serde_json::from_str(&arguments).unwrap_or_else(|_| panic!("choice {index}: {arguments}"));
        assert_eq!(arguments, calls[index as usize]["arguments"].as_str().map(|a| serde_json::from_str::<Value>(a).unwrap()).unwrap());
    }
}

/// vLLM's rendering options on the chat route: `continue_final_message` ends the prompt inside
/// the last message, `chat_template_kwargs` are template variables, `add_generation_prompt:
/// false` leaves out the assistant's header.
#[tokio::test]
async fn chat_rendering_options_reach_the_template() {
    let template = "{% if enable_thinking is defined and not enable_thinking %}/no_think {% endif %}\
        {% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}\
        {% if add_generation_prompt %}<assistant>{% endif %}";
    let (app, log) = app_with_template(HttpConfig::default(), template.into()).await;
    let messages = json!([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello,"}]);
    let cases = [
        (json!({"continue_final_message": true}), "<user>Hi</user><assistant>Hello,"),
        (json!({"add_generation_prompt": false}), "<user>Hi</user><assistant>Hello,</assistant>"),
        (json!({"chat_template_kwargs": {"enable_thinking": false}}), "/no_think <user>Hi</user><assistant>Hello,</assistant><assistant>"),
    ];
    for (index, (options, prompt)) in cases.into_iter().enumerate() {
        let body = with_fields(json!({"messages": messages, "max_tokens": 2}), &options);
        let (status, _, text) = send(&app, post("/v1/chat/completions", &body)).await;
        assert_eq!(status, StatusCode::OK, "{text}");
        let sent = smollm2().decode(&log.lock().unwrap().new_requests[index].prompt_token_ids, false).unwrap();
        assert_eq!(sent, prompt);
    }
    for (options, error) in [
        (json!({"continue_final_message": true, "add_generation_prompt": true}), "cannot both be true"),
        (json!({"chat_template_kwargs": {"messages": []}}), "`chat_template_kwargs` cannot set `messages`"),
    ] {
        let body = with_fields(json!({"messages": messages}), &options);
        let (status, _, text) = send(&app, post("/v1/chat/completions", &body)).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{text}");
        assert!(text.contains(error), "{text}");
    }
    assert_eq!(log.lock().unwrap().new_requests.len(), 3);
}

/// vLLM's chat `echo`: a continued assistant message starts the reply, whole and in each
/// streamed choice's first chunk; a user message under a generation prompt is not echoed; with
/// tools it is a 422.
#[tokio::test]
async fn chat_echo_starts_the_reply_with_the_continued_message() {
    let (app, _) = app(HttpConfig::default()).await;
    let continued = json!({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Well, "}],
        "continue_final_message": true, "echo": true, "max_tokens": 50});
    let (status, _, text) = send(&app, post("/v1/chat/completions", &continued)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert_eq!(serde_json::from_str::<Value>(&text).unwrap()["choices"][0]["message"]["content"], format!("Well, {SCRIPT}"));
    let streamed = with_fields(continued.clone(), &json!({"stream": true, "n": 2}));
    let (_, _, text) = send(&app, post("/v1/chat/completions", &streamed)).await;
    for index in 0..2 {
        let chunks: Vec<Value> = sse_data(&text).into_iter().filter(|event| event["choices"][0]["index"] == index).collect();
        assert_eq!(chunks[0]["choices"][0]["delta"]["content"].as_str().map(|content| content.starts_with("Well, ")), Some(true));
        let content: String = chunks.iter().filter_map(|chunk| chunk["choices"][0]["delta"]["content"].as_str()).collect();
        assert_eq!(content, format!("Well, {SCRIPT}"), "choice {index}");
    }
    let asked = json!({"messages": [{"role": "user", "content": "Hi"}], "echo": true, "max_tokens": 50});
    let (_, _, text) = send(&app, post("/v1/chat/completions", &asked)).await;
    assert_eq!(serde_json::from_str::<Value>(&text).unwrap()["choices"][0]["message"]["content"], SCRIPT);
    let tools = json!([{"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}]);
    let (status, _, text) = send(&app, post("/v1/chat/completions", &with_fields(asked, &json!({"tools": tools})))).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{text}");
    assert!(text.contains("`echo` with `tools`"), "{text}");
}

/// OpenAI's routes leave a matched stop sequence out (OpenAI and vLLM do; TGI's `/generate`
/// keeps it), streamed too: no chunk carries a piece of it, though " world" arrives a token
/// before "." completes " world." (the text it may start is held back until it cannot).
#[tokio::test]
async fn openai_routes_leave_the_stop_sequence_out_streamed_and_not() {
    let (app, _) = app(HttpConfig::default()).await;
    let completion = |extra: Value| with_fields(json!({"prompt": "x", "max_tokens": 20, "stop": [" world.", "Bye"]}), &extra);
    let (status, _, text) = send(&app, post("/v1/completions", &completion(json!({})))).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let body: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(body["choices"][0]["text"], "Hello");
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
    let (_, _, text) = send(&app, post("/v1/completions", &completion(json!({"include_stop_str_in_output": true})))).await;
    assert_eq!(serde_json::from_str::<Value>(&text).unwrap()["choices"][0]["text"], "Hello world.");
    let (status, _, text) = send(&app, post("/v1/completions", &completion(json!({"stream": true})))).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let events = sse_data(&text);
    let pieces: Vec<&str> = events[..events.len() - 1].iter().map(|event| event["choices"][0]["text"].as_str().unwrap()).collect();
    assert_eq!(pieces.concat(), "Hello", "{pieces:?}");
    // Chat, streamed: the same.
    let chat = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 20, "stop": "Goodbye", "stream": true});
    let (_, _, text) = send(&app, post("/v1/chat/completions", &chat)).await;
    let events = sse_data(&text);
    let content: String = events[..events.len() - 1].iter().filter_map(|event| event["choices"][0]["delta"]["content"].as_str()).collect();
    assert_eq!(content, "Hello world. ");
}

/// vLLM's `stop_token_ids`: the generation ends on the first of them, its text kept; an id
/// outside the vocabulary is a 422.
#[tokio::test]
async fn stop_token_ids_end_the_generation_on_the_token() {
    let (app, _) = app(HttpConfig::default()).await;
    let world = smollm2().encode(" world", false).unwrap().ids;
    assert_eq!(world.len(), 1);
    let body = json!({"prompt": "x", "max_tokens": 20, "stop_token_ids": world});
    let (status, _, text) = send(&app, post("/v1/completions", &body)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let body: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(body["choices"][0]["text"], "Hello world");
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
    let chat = json!({"messages": [{"role": "user", "content": "Hi"}], "stop_token_ids": [u32::MAX]});
    let (status, _, text) = send(&app, post("/v1/chat/completions", &chat)).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{text}");
    assert!(text.contains("is not in the model's vocabulary"), "{text}");
}

/// vLLM's `min_tokens`: neither a stop token nor a stop sequence ends the generation before it
/// (the shard holds EOS and the stop tokens back, told which); more than `max_tokens` is a 422.
#[tokio::test]
async fn min_tokens_keep_the_generation_going_until_reached() {
    let (app, log) = app(HttpConfig::default()).await;
    let world = smollm2().encode(" world", false).unwrap().ids;
    let body = json!({"prompt": "x", "max_tokens": 20, "stop_token_ids": world, "stop": "Hello", "min_tokens": 3});
    let (status, _, text) = send(&app, post("/v1/completions", &body)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let body: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(body["choices"][0]["text"], SCRIPT, "{body}");
    let parameters = log.lock().unwrap().new_requests[0].parameters.clone().unwrap();
    assert_eq!((parameters.min_tokens, parameters.end_token_ids), (3, vec![EOS, world[0]]));
    // Without min_tokens nothing is held back; with ignore_eos, EOS is not an end token.
    let plain = json!({"prompt": "x", "max_tokens": 20, "stop_token_ids": world});
    let held = json!({"prompt": "x", "max_tokens": 20, "min_tokens": 2, "ignore_eos": true});
    for body in [plain, held] {
        let (status, _, text) = send(&app, post("/v1/completions", &body)).await;
        assert_eq!(status, StatusCode::OK, "{text}");
    }
    let sent: Vec<Vec<u32>> = log.lock().unwrap().new_requests[1..].iter().map(|r| r.parameters.clone().unwrap().end_token_ids).collect();
    assert_eq!(sent, [Vec::<u32>::new(), Vec::new()]);
    let chat = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "min_tokens": 5});
    let (status, _, text) = send(&app, post("/v1/chat/completions", &chat)).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{text}");
    assert!(text.contains("`min_tokens` must be less than or equal to `max_tokens`=4"), "{text}");
}

/// vLLM's `min_p` and OpenAI's `presence_penalty` reach the shard with the sampling
/// parameters; `min_p` outside 0..=1 is a 422, whatever the temperature.
#[tokio::test]
async fn min_p_is_sent_to_the_shard_and_checked() {
    let (app, log) = app(HttpConfig::default()).await;
    let body = json!({"prompt": "x", "max_tokens": 2, "temperature": 0.7, "min_p": 0.05, "presence_penalty": 0.0});
    let (status, _, text) = send(&app, post("/v1/completions", &body)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let parameters = log.lock().unwrap().new_requests[0].parameters.clone().unwrap();
    assert!(parameters.do_sample && (parameters.min_p - 0.05).abs() < 1e-6, "{parameters:?}");
    // OpenAI's presence_penalty is its own (0, OpenAI's default, is none), not a repetition penalty.
    assert_eq!((parameters.presence_penalty, parameters.repetition_penalty), (0.0, 1.0));
    let body = json!({"prompt": "x", "max_tokens": 2, "presence_penalty": -1.5});
    let (status, _, text) = send(&app, post("/v1/completions", &body)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let parameters = log.lock().unwrap().new_requests[1].parameters.clone().unwrap();
    assert_eq!((parameters.presence_penalty, parameters.repetition_penalty), (-1.5, 1.0));
    for min_p in [1.5, -0.1] {
        let chat = json!({"messages": [{"role": "user", "content": "Hi"}], "temperature": 0, "min_p": min_p});
        let (status, _, text) = send(&app, post("/v1/chat/completions", &chat)).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{text}");
        assert!(text.contains("`min_p` must be between 0.0 and 1.0"), "{text}");
    }
}

/// vLLM's `truncate_prompt_tokens`: the prompt's last k tokens are kept (TGI's `truncate`); -1
/// keeps what the input limit allows, where the whole prompt would be refused.
#[tokio::test]
async fn truncate_prompt_tokens_keeps_the_prompts_end() {
    let (app, log) = app(HttpConfig { max_input_tokens: 8, max_total_tokens: 16, ..HttpConfig::default() }).await;
    let prompt = "a b c d e f g h i j k";
    let ids = smollm2().encode(prompt, true).unwrap().ids;
    assert!(ids.len() > 8);
    let (status, _, text) = send(&app, post("/v1/completions", &json!({"prompt": prompt, "max_tokens": 2}))).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{text}");
    for (keep, kept) in [(json!(3), 3), (json!(-1), 8)] {
        let body = json!({"prompt": prompt, "max_tokens": 2, "truncate_prompt_tokens": keep});
        let (status, _, text) = send(&app, post("/v1/completions", &body)).await;
        assert_eq!(status, StatusCode::OK, "{text}");
        let usage = serde_json::from_str::<Value>(&text).unwrap()["usage"]["prompt_tokens"].clone();
        assert_eq!(usage, kept);
        assert_eq!(log.lock().unwrap().new_requests.last().unwrap().prompt_token_ids, ids[ids.len() - kept..]);
    }
    let chat = json!({"messages": [{"role": "user", "content": "Hi"}], "truncate_prompt_tokens": 0});
    let (status, _, text) = send(&app, post("/v1/chat/completions", &chat)).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{text}");
    assert!(text.contains("`truncate_prompt_tokens` must be -1"), "{text}");
}

/// vLLM's `allowed_token_ids` reach the shard sorted, each once; an empty list or an id outside
/// the vocabulary is a 422.
#[tokio::test]
async fn allowed_token_ids_are_sent_to_the_shard_and_checked() {
    let (app, log) = app(HttpConfig::default()).await;
    let body = json!({"prompt": "x", "max_tokens": 2, "allowed_token_ids": [30, 7, 30]});
    let (status, _, text) = send(&app, post("/v1/completions", &body)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let parameters = log.lock().unwrap().new_requests[0].parameters.clone().unwrap();
    assert_eq!(parameters.allowed_token_ids, vec![7, 30]);
    for (ids, message) in [(json!([]), "`allowed_token_ids` must not be empty"), (json!([7, 10_000_000]), "token id 10000000")] {
        let chat = json!({"messages": [{"role": "user", "content": "Hi"}], "allowed_token_ids": ids});
        let (status, _, text) = send(&app, post("/v1/chat/completions", &chat)).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{text}");
        assert!(text.contains(message), "{text}");
    }
}

/// vLLM's `bad_words` reach the shard tokenized as the reply would hold them: at the start and
/// after a space; a blank word is a 422.
#[tokio::test]
async fn bad_words_are_tokenized_for_the_shard() {
    let (app, log) = app(HttpConfig::default()).await;
    let tokenizer = smollm2();
    let ids = |text: &str| tokenizer.encode(text, false).unwrap().ids;
    let body = json!({"prompt": "x", "max_tokens": 2, "bad_words": ["hello", " hello", "New York"]});
    let (status, _, text) = send(&app, post("/v1/completions", &body)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let sent: Vec<Vec<u32>> = log.lock().unwrap().new_requests[0].parameters.clone().unwrap()
        .bad_words.into_iter().map(|word| word.ids).collect();
    assert_eq!(sent, vec![ids("hello"), ids(" hello"), ids("New York"), ids(" New York")]);
    assert!(ids(" New York").len() > 1, "a word of several tokens is sent whole");
    let blank = json!({"messages": [{"role": "user", "content": "Hi"}], "bad_words": ["ok", " "]});
    let (status, _, text) = send(&app, post("/v1/chat/completions", &blank)).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{text}");
    assert!(text.contains("`bad_words` entries must not be empty"), "{text}");
}

/// vLLM's `continuous_usage_stats`: with `include_usage`, every chunk carries its choice's usage
/// so far (its prompt, its tokens generated up to and with this chunk); without it, chunks carry
/// none.
#[tokio::test]
async fn continuous_usage_stats_put_each_choices_usage_on_every_chunk() {
    let (app, _) = app(HttpConfig::default()).await;
    let options = json!({"include_usage": true, "continuous_usage_stats": true});
    let body = json!({"prompt": ["a", "b c"], "max_tokens": 3, "stream": true, "stream_options": options});
    let (status, _, text) = send(&app, post("/v1/completions", &body)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let events = sse_data(&text);
    // The choices run at once: the shard may see them in either order.
    let prompt_tokens: Vec<usize> = ["a", "b c"].iter().map(|prompt| smollm2().encode(prompt, true).unwrap().ids.len()).collect();
    assert_ne!(prompt_tokens[0], prompt_tokens[1]);
    for index in 0..2 {
        let usages: Vec<(usize, usize, usize)> = events
            .iter()
            .filter(|event| event["choices"].as_array().is_some_and(|c| !c.is_empty()) && event["choices"][0]["index"] == index)
            .map(|event| {
                let usage = &event["usage"];
                let count = |name: &str| usage[name].as_u64().unwrap_or_else(|| panic!("{event}")) as usize;
                (count("prompt_tokens"), count("completion_tokens"), count("total_tokens"))
            })
            .collect();
        let prompt = prompt_tokens[index as usize];
        assert_eq!(usages, (1..=3).map(|n| (prompt, n, prompt + n)).collect::<Vec<_>>(), "choice {index}");
    }
    let total = &events[events.len() - 2]["usage"];
    assert_eq!(total["completion_tokens"], 6);
    // Without include_usage the option asks for nothing.
    let body = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "stream": true,
                      "stream_options": {"continuous_usage_stats": true}});
    let (_, _, text) = send(&app, post("/v1/chat/completions", &body)).await;
    assert!(sse_data(&text).iter().all(|event| event.get("usage").is_none_or(Value::is_null)), "{text}");
}

/// vLLM's `skip_special_tokens: false` keeps special tokens' text in the output, streamed or
/// not; the end-of-sequence token that ends the generation stays out, as it does by default.
#[tokio::test]
async fn special_tokens_text_is_kept_when_not_skipped() {
    let (app, _) = app(HttpConfig::default()).await;
    let script_tokens = smollm2().encode(SCRIPT, false).unwrap().ids.len();
    // With ignore_eos the scripted shard's EOS (<|im_end|>) is generated twice and ends nothing.
    let past_eos = json!({"prompt": "x", "max_tokens": script_tokens + 2, "ignore_eos": true});
    let ended = json!({"prompt": "x", "max_tokens": 50});
    for (body, skip, expected) in [
        (&past_eos, false, format!("{SCRIPT}<|im_end|><|im_end|>")),
        (&past_eos, true, SCRIPT.to_string()),
        (&ended, false, SCRIPT.to_string()),
    ] {
        let mut body = body.clone();
        body["skip_special_tokens"] = json!(skip);
        let (status, _, text) = send(&app, post("/v1/completions", &body)).await;
        assert_eq!(status, StatusCode::OK, "{text}");
        let reply: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(reply["choices"][0]["text"], expected, "skip_special_tokens {skip}");
        body["stream"] = json!(true);
        let (_, _, text) = send(&app, post("/v1/completions", &body)).await;
        let streamed: String = sse_data(&text).iter().filter_map(|event| event["choices"][0]["text"].as_str().map(String::from)).collect();
        assert_eq!(streamed, expected, "streamed, skip_special_tokens {skip}");
    }
}

/// `--reasoning-parser`: the reply's reasoning goes to `reasoning_content`, whole or streamed.
/// The scripted reply has no tags: under deepseek_r1 (the prompt opened the block) it is all
/// reasoning, cut short before `</think>`; under qwen3 (the reply would open it) all content.
#[tokio::test]
async fn reasoning_parser_splits_the_reply() {
    use crate::http::reasoning::ReasoningParser;
    for (parser, reasoning, content) in [(ReasoningParser::DeepseekR1, Some(SCRIPT), ""), (ReasoningParser::Qwen3, None, SCRIPT)] {
        let (app, _) = app(HttpConfig { reasoning_parser: Some(parser), ..HttpConfig::default() }).await;
        let body = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 50});
        let (status, _, text) = send(&app, post("/v1/chat/completions", &body)).await;
        assert_eq!(status, StatusCode::OK, "{text}");
        let message = &serde_json::from_str::<Value>(&text).unwrap()["choices"][0]["message"];
        assert_eq!(message["reasoning_content"].as_str(), reasoning, "{parser:?}: {message}");
        assert_eq!(message["content"], content, "{parser:?}: {message}");
        let mut streamed = body.clone();
        (streamed["stream"], streamed["n"]) = (json!(true), json!(2));
        let (_, _, text) = send(&app, post("/v1/chat/completions", &streamed)).await;
        for index in 0..2 {
            let deltas: Vec<Value> = sse_data(&text)
                .into_iter()
                .filter(|event| event["choices"][0]["index"] == index)
                .map(|event| event["choices"][0]["delta"].clone())
                .collect();
            let joined = |field: &str| deltas.iter().filter_map(|delta| delta[field].as_str()).collect::<String>();
            assert_eq!(joined("reasoning_content"), reasoning.unwrap_or(""), "{parser:?} choice {index}");
            assert_eq!(joined("content"), content, "{parser:?} choice {index}");
        }
    }
}

/// vLLM's `prompt_logprobs`: every prompt token's logprob and rank, with k alternatives (ranks
/// 1..k), `null` first; per choice on completions, once on chat; an echo's own alternatives keep
/// their count; refused streamed, above the limit, and vLLM's -1.
#[tokio::test]
async fn prompt_logprobs_answer_vllms_shape() {
    let (app, log) = app(HttpConfig::default()).await;
    let prompt = "The sky is";
    let prompt_ids = smollm2().encode(prompt, true).unwrap().ids;
    let body = json!({"prompt": prompt, "max_tokens": 1, "prompt_logprobs": 2, "temperature": 0});
    let (status, _, text) = send(&app, post("/v1/completions", &body)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let sent = log.lock().unwrap().new_requests.last().unwrap().clone();
    assert!(sent.prompt_logprobs);
    assert_eq!(sent.prompt_top_n, Some(2));
    let completion: Value = serde_json::from_str(&text).unwrap();
    let positions = completion["choices"][0]["prompt_logprobs"].as_array().unwrap();
    assert_eq!(positions.len(), prompt_ids.len(), "{completion}");
    assert!(positions[0].is_null());
    // No generated logprobs were asked for.
    assert!(completion["choices"][0]["logprobs"].is_null());
    for (position, entry) in positions.iter().enumerate().skip(1) {
        let entry = entry.as_object().unwrap();
        // The scripted shard: logprob -1 and rank 1 + position % 3 for the prompt's token;
        // alternatives 100, 101 with -0.0, -0.2.
        let own = &entry[&prompt_ids[position].to_string()];
        assert_eq!(own["logprob"], json!(-1.0));
        assert_eq!(own["rank"], json!(1 + position as u64 % 3));
        assert_eq!(own["decoded_token"], json!(smollm2().token_text(prompt_ids[position])));
        assert_eq!(entry["100"]["rank"], json!(1));
        assert_eq!(entry["101"]["rank"], json!(2));
        assert!((entry["101"]["logprob"].as_f64().unwrap() + 0.2).abs() < 1e-6);
        assert_eq!(entry.len(), 3, "{entry:?}");
    }

    // With an echo's logprobs (1 alternative) and 3 prompt alternatives: the shard computes 3,
    // the echo lists its own count.
    let body = json!({"prompt": prompt, "max_tokens": 1, "prompt_logprobs": 3, "echo": true, "logprobs": 1});
    let (status, _, text) = send(&app, post("/v1/completions", &body)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert_eq!(log.lock().unwrap().new_requests.last().unwrap().prompt_top_n, Some(3));
    let completion: Value = serde_json::from_str(&text).unwrap();
    let choice = &completion["choices"][0];
    assert_eq!(choice["prompt_logprobs"][1].as_object().unwrap().len(), 4, "{choice}");
    let echoed = choice["logprobs"]["top_logprobs"][1].as_object().unwrap();
    assert!(echoed.len() <= 2 && !echoed.contains_key(&smollm2().token_text(101)), "{echoed:?}");

    // Chat: once, at the top level.
    let body = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "prompt_logprobs": 0, "n": 2});
    let (status, _, text) = send(&app, post("/v1/chat/completions", &body)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let chat: Value = serde_json::from_str(&text).unwrap();
    let positions = chat["prompt_logprobs"].as_array().unwrap();
    assert_eq!(positions.len() as u64, chat["usage"]["prompt_tokens"].as_u64().unwrap());
    assert_eq!(positions[1].as_object().unwrap().len(), 1, "{chat}");
    assert!(chat["choices"][0].get("prompt_logprobs").is_none());
    // Not asked: not there.
    let (_, _, text) = send(&app, post("/v1/completions", &json!({"prompt": prompt, "max_tokens": 1}))).await;
    assert!(serde_json::from_str::<Value>(&text).unwrap()["choices"][0].get("prompt_logprobs").is_none());

    for (route, body, message) in [
        ("/v1/completions", json!({"prompt": prompt, "prompt_logprobs": 1, "stream": true}), "stream"),
        ("/v1/chat/completions", json!({"messages": [{"role": "user", "content": "hi"}], "prompt_logprobs": 2, "stream": true}), "stream"),
        ("/v1/completions", json!({"prompt": prompt, "prompt_logprobs": 100}), "max-top-n-tokens"),
        ("/v1/completions", json!({"prompt": prompt, "prompt_logprobs": -1}), "max-top-n-tokens"),
    ] {
        let (status, _, text) = send(&app, post(route, &body)).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}: {text}");
        assert!(text.contains("prompt_logprobs") && text.contains(message), "{text}");
    }
    // Streamed, 0 asks for nothing and is let through (vLLM).
    let body = json!({"prompt": prompt, "max_tokens": 1, "prompt_logprobs": 0, "stream": true});
    let (status, _, text) = send(&app, post("/v1/completions", &body)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
}

/// An assistant turn's `reasoning_content` sent back reaches the template (Qwen 3's writes it
/// back for the turns after the last user message); another role's is a 422.
#[tokio::test]
async fn reasoning_content_in_the_history_reaches_the_template() {
    let template = "{% for m in messages %}<{{ m.role }}>{% if m.reasoning_content %}[think:{{ m.reasoning_content }}]{% endif %}{{ m.content }}{% endfor %}";
    let (app, _) = app_with_template(HttpConfig::default(), template.into()).await;
    let chat = json!({"messages": [{"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "Checking.", "reasoning_content": "I need the tool."},
        {"role": "user", "content": "Well?"}]});
    let (status, _, text) = send(&app, post("/chat_tokenize", &chat)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let templated = serde_json::from_str::<Value>(&text).unwrap()["templated_text"].as_str().unwrap().to_string();
    assert_eq!(templated, "<user>Weather?<assistant>[think:I need the tool.]Checking.<user>Well?");
    let wrong = json!({"messages": [{"role": "user", "content": "Hi", "reasoning_content": "no"}]});
    let (status, _, text) = send(&app, post("/v1/chat/completions", &wrong)).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{text}");
    assert!(text.contains("reasoning_content"), "{text}");
}

#[tokio::test]
async fn usage_counts_the_prompt_tokens_the_prefix_cache_served() {
    let (app, _) = app(HttpConfig::default()).await;
    let prompt = "The same long instructions, word for word, in every request of this test. ".repeat(6);
    let chat = json!({"messages": [{"role": "user", "content": prompt}], "max_tokens": 3});
    let cached = |usage: &Value| usage["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
    let (_, _, text) = send(&app, post("/v1/chat/completions", &chat)).await;
    let first: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(cached(&first["usage"]), 0, "{text}");
    let (_, _, text) = send(&app, post("/v1/chat/completions", &chat)).await;
    let again: Value = serde_json::from_str(&text).unwrap();
    let hit = cached(&again["usage"]);
    assert!(hit > 0 && hit < again["usage"]["prompt_tokens"].as_u64().unwrap(), "{text}");
    // Streamed: on the usage chunk.
    let streamed = with_fields(chat.clone(), &json!({"stream": true, "stream_options": {"include_usage": true}}));
    let (_, _, text) = send(&app, post("/v1/chat/completions", &streamed)).await;
    let events = sse_data(&text);
    assert_eq!(cached(&events[events.len() - 2]["usage"]), hit, "{text}");
    // With vLLM's continuous usage, on every chunk: known from the request's scheduling, before
    // its first token.
    let continuous = with_fields(chat.clone(), &json!({"stream": true,
        "stream_options": {"include_usage": true, "continuous_usage_stats": true}}));
    let (_, _, text) = send(&app, post("/v1/chat/completions", &continuous)).await;
    let chunks: Vec<Value> = sse_data(&text).into_iter().filter(|event| event.get("usage").is_some_and(|u| !u.is_null())).collect();
    assert!(chunks.len() >= 3, "{text}");
    assert!(chunks.iter().all(|chunk| cached(&chunk["usage"]) == hit), "{text}");
    // Two prompts of n = 2 choices, each prompt (and its cached part) counted once: the text
    // was not seen before (no template), so at most one of its copies computes it and the
    // others may take its full blocks (which ones, depends on when each is admitted).
    let body = json!({"prompt": [prompt, prompt], "n": 2, "max_tokens": 2});
    let (_, _, text) = send(&app, post("/v1/completions", &body)).await;
    let completion: Value = serde_json::from_str(&text).unwrap();
    let usage = &completion["usage"];
    let per_prompt = usage["prompt_tokens"].as_u64().unwrap() / 2;
    // The scripted shard's blocks hold 16 tokens; a prompt's last, partial block is computed.
    let full_blocks = per_prompt / 16 * 16;
    assert!(cached(usage) <= 2 * full_blocks, "{text}");
    let (_, _, text) = send(&app, post("/v1/completions", &body)).await;
    let completion: Value = serde_json::from_str(&text).unwrap();
    // Sent again, both prompts take their full blocks from the cache, each counted once.
    assert_eq!(cached(&completion["usage"]), 2 * full_blocks, "{text}");
}
