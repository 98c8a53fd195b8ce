//! The HTTP app end to end in-process, over the real router stack (shard client, engine,
//! scheduler) and a scripted shard on a unix socket that answers every request with the
//! tokens of a fixed text. Stop sequences, cancellation, SSE shapes and concurrency limits are
//! thereby checked deterministically; the integration tests run the same against the model.
mod adapters;
mod grammar;
mod invocations;
mod kv_event_sources;
mod tools;
mod listener;
mod openai;
mod reasoning;
mod request_log;
mod responses;
mod scripted_shard;
mod tokenize;
mod tool_parser;
mod vertex;
mod worker_api;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::Router;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt;

use super::{router, HttpConfig};
use crate::config::RouterConfig;
use scripted_shard::{ScriptedShard, ShardLog, SCRIPT};

/// A prompt with this marker is generated for long (see the tests that use it).
const HOLD: &str = "please hold";

async fn app(config: HttpConfig) -> (Router, Arc<Mutex<ShardLog>>) {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");
    let chat_template =
        std::fs::read_to_string(format!("{dir}/smollm2_chat_template.jinja")).unwrap();
    app_with_template(config, chat_template).await
}

async fn app_with_template(
    config: HttpConfig,
    chat_template: String,
) -> (Router, Arc<Mutex<ShardLog>>) {
    app_with_args(config, chat_template, &[]).await
}

/// The app with more router flags.
async fn app_with_args(
    config: HttpConfig,
    chat_template: String,
    args: &[&str],
) -> (Router, Arc<Mutex<ShardLog>>) {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");
    let tokenizer_json = std::fs::read_to_string(format!("{dir}/smollm2_tokenizer.json")).unwrap();
    let shard = ScriptedShard::spawn(tokenizer_json, chat_template);
    app_on_shard(config, shard, args).await
}

/// The app over a scripted shard already serving (`ScriptedShard::spawn_with_script`).
async fn app_on_shard(
    config: HttpConfig,
    shard: (std::path::PathBuf, Arc<Mutex<ShardLog>>),
    args: &[&str],
) -> (Router, Arc<Mutex<ShardLog>>) {
    let (app, log) = try_app_on_shard(config, shard, args).await;
    (app.unwrap(), log)
}

/// The app over a scripted shard, or the configuration error that stops its start.
async fn try_app_on_shard(
    config: HttpConfig,
    (socket, log): (std::path::PathBuf, Arc<Mutex<ShardLog>>),
    args: &[&str],
) -> (Result<Router, crate::http::ConfigError>, Arc<Mutex<ShardLog>>) {
    let socket = socket.to_string_lossy().to_string();
    let mut argv = vec!["router", "--uds-path", socket.as_str(), "--shard-connect-timeout-s", "10"];
    argv.extend_from_slice(args);
    let router_config = RouterConfig::parse_argv(argv).unwrap();
    let (engine, model) = crate::server::start_engine(
        &router_config,
        &TaskTracker::new(),
        &CancellationToken::new(),
    )
    .await
    .unwrap();
    (router(config, engine, &model).map(|app| app.routes), log)
}

/// Waits until `condition` holds on the shard's log (the engine works asynchronously).
async fn wait_for(log: &Mutex<ShardLog>, condition: impl Fn(&ShardLog) -> bool) {
    for _ in 0..1000 {
        if condition(&log.lock().unwrap()) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("the shard never saw the expected state");
}

fn post(path: &str, body: &Value) -> Request<Body> {
    Request::post(path)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap()
}

async fn send(app: &Router, request: Request<Body>) -> (StatusCode, axum::http::HeaderMap, String) {
    let response = app.clone().oneshot(request).await.unwrap();
    let (parts, body) = response.into_parts();
    let bytes = axum::body::to_bytes(body, usize::MAX).await.unwrap();
    (
        parts.status,
        parts.headers,
        String::from_utf8(bytes.to_vec()).unwrap(),
    )
}

/// Sends `body` until it is not refused at the concurrency limit (a permit released by a closed
/// stream is noticed asynchronously), up to a second; its last status.
async fn send_once_admitted(app: &Router, path: &str, body: &Value) -> StatusCode {
    let mut status = StatusCode::TOO_MANY_REQUESTS;
    for _ in 0..200 {
        status = send(app, post(path, body)).await.0;
        if status != StatusCode::TOO_MANY_REQUESTS {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    status
}

/// The JSON payloads of an SSE body (`data:` lines), `[DONE]` as a string.
/// `body` with the fields of `extra` added (or replaced).
fn with_fields(mut body: Value, extra: &Value) -> Value {
    body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    body
}

fn sse_data(body: &str) -> Vec<Value> {
    body.lines()
        .filter_map(|line| line.strip_prefix("data:"))
        .map(|data| serde_json::from_str(data.trim()).unwrap_or(Value::String(data.trim().into())))
        .collect()
}

#[tokio::test]
async fn generate_returns_text_details_and_tgi_headers() {
    let (app, _) = app(HttpConfig::default()).await;
    let body = json!({"inputs": "Say hi", "parameters": {"max_new_tokens": 50, "details": true, "decoder_input_details": true}});
    let (status, headers, body) = send(&app, post("/generate", &body)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let response: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(response["generated_text"], SCRIPT);
    let details = &response["details"];
    assert_eq!(details["finish_reason"], "eos_token");
    assert_eq!(
        details["seed"],
        Value::Null,
        "greedy requests report no seed"
    );
    assert_eq!(details["prefill"][0]["logprob"], Value::Null);
    assert_eq!(details["prefill"][1]["logprob"], -1.0);
    let tokens = details["tokens"].as_array().unwrap();
    assert_eq!(details["generated_tokens"], tokens.len());
    assert_eq!(tokens.last().unwrap()["special"], true);
    assert_eq!(tokens.last().unwrap()["text"], "<|im_end|>");
    for name in [
        "x-compute-type",
        "x-compute-time",
        "x-compute-characters",
        "x-total-time",
        "x-validation-time",
        "x-queue-time",
        "x-inference-time",
        "x-time-per-token",
        "x-prompt-tokens",
        "x-generated-tokens",
    ] {
        assert!(headers.contains_key(name), "{name} missing");
    }
    assert_eq!(
        headers["x-generated-tokens"],
        tokens.len().to_string().as_str()
    );
    assert_eq!(headers["x-compute-characters"], "6");
}

#[tokio::test]
async fn compat_route_answers_an_array_and_samples_by_default() {
    let (app, log) = app(HttpConfig::default()).await;
    let (status, _, body) = send(&app, post("/", &json!({"inputs": "Say hi"}))).await;
    assert_eq!(status, StatusCode::OK);
    let response: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(response[0]["generated_text"], SCRIPT);
    let log = log.lock().unwrap();
    assert!(
        log.new_requests[0].parameters.as_ref().unwrap().do_sample,
        "omitted parameters sample (TGI)"
    );
}

#[tokio::test]
async fn stop_sequence_cuts_text_and_cancels_the_engine_request() {
    let (app, log) = app(HttpConfig::default()).await;
    let parameters = json!({"stop": ["world"], "details": true, "return_full_text": true,
                            "ignore_eos": true, "max_new_tokens": 500});
    let body = json!({"inputs": "Say hi", "parameters": parameters});
    let (status, _, body) = send(&app, post("/generate", &body)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let response: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(response["generated_text"], "Say hiHello world");
    assert_eq!(response["details"]["finish_reason"], "stop_sequence");
    assert_eq!(response["details"]["generated_tokens"], 2);
    // The dropped stream cancels the request: the shard forgets it (with the next step, which
    // the next request brings) long before 500 tokens.
    send(
        &app,
        post(
            "/generate",
            &json!({"inputs": "x", "parameters": {"max_new_tokens": 1}}),
        ),
    )
    .await;
    wait_for(&log, |log| !log.forgotten.is_empty()).await;
    let (_, sampled) = log.lock().unwrap().forgotten[0];
    assert!(
        sampled < 100,
        "{sampled} tokens were generated after the stop sequence"
    );
}

#[tokio::test]
async fn generate_stream_events_have_tgi_shape() {
    let (app, _) = app(HttpConfig::default()).await;
    let body = json!({"inputs": "Say hi", "parameters": {"max_new_tokens": 4, "top_n_tokens": 2}});
    let (status, headers, body) = send(&app, post("/generate_stream", &body)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["x-accel-buffering"], "no");
    let events = sse_data(&body);
    assert_eq!(events.len(), 4);
    for (position, event) in events.iter().enumerate() {
        assert_eq!(event["index"], position + 1);
        assert_eq!(event["top_tokens"].as_array().unwrap().len(), 2);
    }
    assert!(events[..3]
        .iter()
        .all(|event| event["generated_text"].is_null() && event["details"].is_null()));
    let last = &events[3];
    let streamed: String = events
        .iter()
        .map(|event| event["token"]["text"].as_str().unwrap())
        .collect();
    assert_eq!(last["generated_text"], streamed);
    assert_eq!(last["details"]["finish_reason"], "length");
    assert_eq!(last["details"]["generated_tokens"], 4);
    assert!(last["details"]["input_length"].as_u64().unwrap() > 0);
    assert!(!body.contains("[DONE]"));
}

/// TGI's streams send invalid input as an event of a 200 stream, as TGI does; OpenAI's answer it
/// with its status before the stream starts, as OpenAI and vLLM do (so the client library raises
/// the error for that status when the request is made).
#[tokio::test]
async fn stream_errors_are_tgi_events_and_openai_statuses() {
    let (app, _) = app(HttpConfig::default()).await;
    let body = json!({"inputs": "x", "parameters": {"temperature": 0.0}});
    let (status, _, body) = send(&app, post("/generate_stream", &body)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        sse_data(&body),
        vec![
            json!({"error": "Input validation error: `temperature` must be strictly positive", "error_type": "validation"})
        ]
    );
    let chat =
        json!({"messages": [{"role": "user", "content": "x"}], "stream": true, "top_p": 2.0});
    let (status, _, body) = send(&app, post("/v1/chat/completions", &chat)).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    let error: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(error, json!({"error": "Input validation error: `top_p` must be > 0.0 and < 1.0", "error_type": "validation"}));
}

#[tokio::test]
async fn validation_errors_have_tgi_status_and_body() {
    let (app, _) = app(HttpConfig {
        max_input_tokens: 8,
        max_total_tokens: 16,
        ..HttpConfig::default()
    })
    .await;
    let cases = [
        (json!({"inputs": "", "parameters": {}}), "`inputs` cannot be empty"),
        (json!({"inputs": "a b c d e f g h i j k", "parameters": {"max_new_tokens": 2}}), "`inputs` must have less than 8 tokens. Given: 11"),
        (json!({"inputs": "a b c", "parameters": {"max_new_tokens": 15}}), "`inputs` tokens + `max_new_tokens` must be <= 16. Given: 3 `inputs` tokens and 15 `max_new_tokens`"),
        (json!({"inputs": "x", "parameters": {"grammar": {"type": "regex", "value": "a("}}}), "grammar is not valid: "),
    ];
    for (body, message) in cases {
        let (status, _, text) = send(&app, post("/generate", &body)).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
        let error: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(error["error_type"], "validation");
        let shown = error["error"].as_str().unwrap();
        // The grammar's message continues with llguidance's own words.
        if message.ends_with(": ") {
            assert!(shown.starts_with(&format!("Input validation error: {message}")), "{shown}");
        } else {
            assert_eq!(shown, format!("Input validation error: {message}"));
        }
    }
    let (status, _, text) = send(&app, post("/generate", &json!({"parameters": {}}))).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(text.contains("missing field `inputs`"), "{text}");
}

#[tokio::test]
async fn values_the_engine_cannot_represent_are_422() {
    let (app, log) = app(HttpConfig {
        max_input_tokens: 8,
        max_total_tokens: 16,
        ..HttpConfig::default()
    })
    .await;
    let longest = crate::tokenizer::tests::smollm2()
        .max_bytes_per_token()
        .unwrap();
    let too_long = "x".repeat(8 * longest + 1);
    let generate_cases = [
        (
            json!({"slo": {"ttft_ms": 1e30, "tbt_ms": 100}}),
            "`slo.ttft_ms` must be at most 3600000 milliseconds. Given: 1000000000000000000000000000000".to_string(),
        ),
        (
            json!({"slo": {"ttft_ms": 500, "tbt_ms": 100, "max_stall_ms": 50}}),
            "`slo.max_stall_ms` must be at least `slo.tbt_ms` (100). Given: 50".to_string(),
        ),
        (
            json!({"priority": 2_000_000_000}),
            "`priority` must be an integer between -1000000 and 1000000. Given: 2000000000".to_string(),
        ),
        (
            json!({"temperature": 1e308}),
            "`temperature` must be a finite number".to_string(),
        ),
        (
            json!({"repetition_penalty": 1e308}),
            "`repetition_penalty` must be a finite number".to_string(),
        ),
        (
            json!({"stop": ["x".repeat(1025)]}),
            "each stop sequence must be at most 1024 bytes long. Given: 1025".to_string(),
        ),
    ];
    let expect_422 = |text: &str, message: &str| {
        assert_eq!(
            serde_json::from_str::<Value>(text).unwrap(),
            json!({"error": format!("Input validation error: {message}"), "error_type": "validation"})
        );
    };
    for (parameters, message) in generate_cases {
        let body = json!({"inputs": "x", "parameters": parameters});
        let (status, _, text) = send(&app, post("/generate", &body)).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{text}");
        expect_422(&text, &message);
    }
    // Refused from its byte length alone; with `truncate` it is tokenized and cut instead.
    let body = json!({"inputs": too_long, "parameters": {"max_new_tokens": 1}});
    let (status, _, text) = send(&app, post("/generate", &body)).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    expect_422(
        &text,
        &format!(
            "`inputs` must have less than 8 tokens. Given: {} bytes, more than 8 tokens of at most {longest} bytes each can hold",
            too_long.len()
        ),
    );
    let body = json!({"inputs": too_long, "parameters": {"max_new_tokens": 1, "truncate": 4}});
    assert_eq!(send(&app, post("/generate", &body)).await.0, StatusCode::OK);
    let (status, _, text) = send(
        &app,
        post("/v1/completions", &json!({"prompt": [], "max_tokens": 5})),
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    expect_422(&text, "`prompt` must hold at least one prompt");
    let stream = json!({"prompt": [], "max_tokens": 5, "stream": true});
    let (status, _, text) = send(&app, post("/v1/completions", &stream)).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    expect_422(&text, "`prompt` must hold at least one prompt");
    let (status, _, text) = send(
        &app,
        post("/v1/chat/completions", &json!({"messages": []})),
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    expect_422(&text, "`messages` must hold at least one message");
    // Only the truncated request reached the engine.
    assert_eq!(log.lock().unwrap().new_requests.len(), 1);
}

#[tokio::test]
async fn api_key_guards_generation_routes_only() {
    let (app, _) = app(HttpConfig {
        api_key: Some("s3cret".into()),
        ..HttpConfig::default()
    })
    .await;
    let body = json!({"inputs": "Say hi", "parameters": {"max_new_tokens": 2}});
    let (status, _, text) = send(&app, post("/generate", &body)).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(
        serde_json::from_str::<Value>(&text).unwrap()["error_type"],
        "unauthorized"
    );
    let with_authorization = |value: &str| {
        let mut request = post("/generate", &body);
        request
            .headers_mut()
            .insert("authorization", value.parse().unwrap());
        request
    };
    // The scheme is case-insensitive (RFC 7235), the key is not.
    assert_eq!(
        send(&app, with_authorization("bEARER s3cret")).await.0,
        StatusCode::OK
    );
    assert_eq!(
        send(&app, with_authorization("Bearer S3CRET")).await.0,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        send(&app, with_authorization("Bearer s3cret2")).await.0,
        StatusCode::UNAUTHORIZED
    );
    let health = Request::get("/health").body(Body::empty()).unwrap();
    assert_eq!(send(&app, health).await.0, StatusCode::OK);
}

#[tokio::test]
async fn payload_over_the_limit_is_413() {
    let (app, _) = app(HttpConfig {
        payload_limit: 1000,
        ..HttpConfig::default()
    })
    .await;
    let body = json!({"inputs": "x".repeat(2000)});
    let (status, _, text) = send(&app, post("/generate", &body)).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(
        serde_json::from_str::<Value>(&text).unwrap()["error_type"],
        "payload_too_large"
    );
}

#[tokio::test]
async fn requests_over_the_concurrency_limit_get_429_at_once() {
    let (app, log) = app(HttpConfig {
        max_concurrent_requests: 1,
        ..HttpConfig::default()
    })
    .await;
    let long = json!({"inputs": HOLD, "parameters": {"max_new_tokens": 1000, "ignore_eos": true}});
    let held = app
        .clone()
        .oneshot(post("/generate_stream", &long))
        .await
        .unwrap();
    wait_for(&log, |log| !log.new_requests.is_empty()).await;
    let (status, _, text) = send(&app, post("/generate", &json!({"inputs": "x"}))).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        serde_json::from_str::<Value>(&text).unwrap(),
        json!({"error": "Model is overloaded", "error_type": "overloaded"})
    );
    // Tokenizing and template rendering cost CPU time too: they wait for no one either.
    let (status, _, _) = send(&app, post("/tokenize", &json!({"inputs": "x"}))).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    let chat = json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 1});
    let (status, _, _) = send(&app, post("/v1/chat/completions", &chat)).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    // A stream refused before it starts answers with the status too, not 200 and an error
    // event, so a client or a router in front can retry it elsewhere.
    let (status, headers, text) = send(&app, post("/generate_stream", &json!({"inputs": "x"}))).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(headers["content-type"], "application/json");
    assert_eq!(
        serde_json::from_str::<Value>(&text).unwrap(),
        json!({"error": "Model is overloaded", "error_type": "overloaded"})
    );
    let chat_stream = json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 1, "stream": true});
    assert_eq!(send(&app, post("/v1/chat/completions", &chat_stream)).await.0, StatusCode::TOO_MANY_REQUESTS);
    let compat = json!({"inputs": "x", "stream": true});
    assert_eq!(send(&app, post("/", &compat)).await.0, StatusCode::TOO_MANY_REQUESTS);
    drop(held);
    // The closed stream releases its permit (noticed asynchronously) and cancels its request,
    // which the shard forgets with the next step.
    let short = json!({"inputs": "x", "parameters": {"max_new_tokens": 1}});
    let status = send_once_admitted(&app, "/generate", &short).await;
    assert_eq!(status, StatusCode::OK);
    wait_for(&log, |log| !log.forgotten.is_empty()).await;
    assert!(log.lock().unwrap().forgotten[0].1 < 1000);
}

#[tokio::test]
async fn best_of_keeps_the_highest_mean_logprob() {
    let (app, log) = app(HttpConfig::default()).await;
    let body = json!({"inputs": "Say hi", "parameters": {"best_of": 2, "do_sample": true, "details": true, "max_new_tokens": 3}});
    let (status, _, text) = send(&app, post("/generate", &body)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let response: Value = serde_json::from_str(&text).unwrap();
    let others = response["details"]["best_of_sequences"].as_array().unwrap();
    assert_eq!(others.len(), 1);
    let best_logprob = response["details"]["tokens"][0]["logprob"]
        .as_f64()
        .unwrap();
    // Strictly: the candidates' logprobs differ, so a wrong choice cannot pass on a tie.
    assert!(best_logprob > others[0]["tokens"][0]["logprob"].as_f64().unwrap());
    let seeds: Vec<u64> = log
        .lock()
        .unwrap()
        .new_requests
        .iter()
        .map(|r| r.parameters.as_ref().unwrap().seed)
        .collect();
    assert_eq!(seeds.len(), 2);
    assert!(seeds.contains(&response["details"]["seed"].as_u64().unwrap()));
}

#[tokio::test]
async fn read_only_routes() {
    let (app, _) = app(HttpConfig::default()).await;
    let get = |path: &str| Request::get(path).body(Body::empty()).unwrap();
    let (status, _, text) = send(&app, get("/info")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        serde_json::from_str::<Value>(&text).unwrap()["model_id"],
        "smollm2-test"
    );
    let (_, _, text) = send(&app, get("/v1/models")).await;
    assert_eq!(
        serde_json::from_str::<Value>(&text).unwrap()["data"][0]["id"],
        "smollm2-test"
    );
    send(
        &app,
        post(
            "/generate",
            &json!({"inputs": "x", "parameters": {"max_new_tokens": 1}}),
        ),
    )
    .await;
    let (status, _, text) = send(&app, get("/metrics")).await;
    assert_eq!(status, StatusCode::OK);
    assert!(text.contains("superinfer_request_count"), "{text}");
    let (status, _, text) = send(&app, get("/api-doc/openapi.json")).await;
    assert_eq!(status, StatusCode::OK);
    assert!(serde_json::from_str::<Value>(&text).unwrap()["paths"]["/generate"].is_object());
    let (status, _, text) = send(&app, get("/docs")).await;
    assert_eq!(status, StatusCode::OK);
    assert!(text.contains("/api-doc/openapi.json"));
    let (status, _, text) = send(&app, post("/tokenize", &json!({"inputs": "Hello world"}))).await;
    assert_eq!(status, StatusCode::OK);
    let tokens: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        tokens[1],
        json!({"id": tokens[1]["id"], "text": " world", "start": 5, "stop": 11})
    );
}

#[tokio::test]
async fn cors_allows_configured_origins() {
    let config = HttpConfig {
        cors_allow_origin: vec!["https://app.example".into()],
        ..HttpConfig::default()
    };
    let (app, _) = app(config).await;
    let preflight = Request::options("/generate")
        .header("origin", "https://app.example")
        .header("access-control-request-method", "POST")
        .body(Body::empty())
        .unwrap();
    let (status, headers, _) = send(&app, preflight).await;
    assert!(status.is_success(), "{status}");
    assert_eq!(
        headers["access-control-allow-origin"],
        "https://app.example"
    );
    let other = Request::get("/info")
        .header("origin", "https://evil.example")
        .body(Body::empty())
        .unwrap();
    let (_, headers, _) = send(&app, other).await;
    assert!(!headers.contains_key("access-control-allow-origin"));
}

/// `--admission slo`: a request whose first token is predicted past its objective is refused at
/// once with 429, TGI's error shape and Retry-After, on every route; one whose objective can be
/// met is served, with its priority and stall bound.
#[tokio::test]
async fn slo_admission_refuses_what_cannot_meet_its_first_token_objective() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");
    let template = std::fs::read_to_string(format!("{dir}/smollm2_chat_template.jinja")).unwrap();
    let (app, _log) = app_with_args(HttpConfig::default(), template, &["--admission", "slo"]).await;
    // No objective of 1 ms can be met: the prefill alone is predicted longer.
    let hopeless = json!({"inputs": "Hello", "parameters": {"max_new_tokens": 2, "slo": {"ttft_ms": 1, "tbt_ms": 100}}});
    let response = app.clone().oneshot(post("/generate", &hopeless)).await.unwrap();
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    let retry_after: u64 = response.headers()["retry-after"].to_str().unwrap().parse().unwrap();
    assert!(retry_after >= 1);
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap();
    let body: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(body["error_type"], "overloaded");
    assert!(body["error"].as_str().unwrap().contains("over the 1 ms objective"), "{body}");
    let chat = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2,
        "slo": {"ttft_ms": 1, "tbt_ms": 100}});
    assert_eq!(send(&app, post("/v1/chat/completions", &chat)).await.0, StatusCode::TOO_MANY_REQUESTS);
    // Streams are refused the same way, before their head, so that a router can retry them.
    for (path, body) in [
        ("/generate_stream", hopeless.clone()),
        ("/v1/chat/completions", json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2,
            "stream": true, "slo": {"ttft_ms": 1, "tbt_ms": 100}})),
        ("/v1/completions", json!({"prompt": ["Hi", "Hello"], "max_tokens": 2, "stream": true,
            "slo": {"ttft_ms": 1, "tbt_ms": 100}})),
    ] {
        let (status, headers, text) = send(&app, post(path, &body)).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{path}: {text}");
        assert!(headers["retry-after"].to_str().unwrap().parse::<u64>().unwrap() >= 1, "{path}");
        assert_eq!(serde_json::from_str::<Value>(&text).unwrap()["error_type"], "overloaded", "{path}");
    }
    // A reachable objective is admitted and served.
    let fine = json!({"inputs": "Hello", "parameters": {"max_new_tokens": 2, "priority": -1,
        "slo": {"ttft_ms": 60000, "tbt_ms": 1000, "max_stall_ms": 5000}}});
    let (status, _, text) = send(&app, post("/generate", &fine)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let (status, _, text) = send(&app, post("/generate_stream", &fine)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert!(sse_data(&text).last().unwrap()["generated_text"].is_string(), "{text}");
}
