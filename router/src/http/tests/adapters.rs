//! LoRA adapters through the HTTP routes: TGI's `adapter_id` and OpenAI's `model` name one of
//! the adapters the shard loaded, which reaches the shard with the request; an adapter the
//! server did not load is a 422; `/v1/models` lists them; prefix-cache blocks are never shared
//! between adapters. vLLM's run-time routes load and unload adapters while the server serves.
use axum::body::Body;
use axum::http::{Request, StatusCode};
use serde_json::{json, Value};

use super::scripted_shard::{ADAPTERS, UNSERVABLE_ADAPTER};
use super::{app, post, send, sse_data, wait_for, HOLD};
use crate::http::HttpConfig;

#[tokio::test]
async fn a_request_runs_with_the_adapter_it_names() {
    let (app, log) = app(HttpConfig::default()).await;
    for (adapter, expected) in [(Some("sql-lora"), "sql-lora"), (None, ""), (Some("smollm2-test"), ""), (Some(""), "")] {
        let body = json!({"inputs": "x", "parameters": {"max_new_tokens": 2, "adapter_id": adapter}});
        let (status, _, text) = send(&app, post("/generate", &body)).await;
        assert_eq!(status, StatusCode::OK, "{text}");
        assert_eq!(log.lock().unwrap().new_requests.last().unwrap().adapter_id, expected, "{adapter:?}");
    }
    let chat = json!({"model": "chat-lora", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2});
    let (status, _, text) = send(&app, post("/v1/chat/completions", &chat)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert_eq!(log.lock().unwrap().new_requests.last().unwrap().adapter_id, "chat-lora");
    // Whatever else a client library sends as `model` is the base model.
    let completion = json!({"model": "gpt-4o", "prompt": "x", "max_tokens": 2});
    let (status, _, text) = send(&app, post("/v1/completions", &completion)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert_eq!(log.lock().unwrap().new_requests.last().unwrap().adapter_id, "");
}

#[tokio::test]
async fn an_adapter_the_server_did_not_load_is_422_naming_those_it_did() {
    let (app, log) = app(HttpConfig::default()).await;
    let body = json!({"inputs": "x", "parameters": {"adapter_id": "absent-lora"}});
    let (status, _, text) = send(&app, post("/generate", &body)).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{text}");
    let error: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(error["error_type"], "validation");
    let message = "Input validation error: adapter `absent-lora` is not loaded; loaded adapters: sql-lora, chat-lora";
    assert_eq!(error["error"], message);
    // On the streaming route, as every validation error there (TGI's way): one error event.
    let (_, _, text) = send(&app, post("/generate_stream", &body)).await;
    let events = sse_data(&text);
    assert_eq!(events.len(), 1, "{text}");
    assert_eq!(events[0]["error"], message);
    assert!(log.lock().unwrap().new_requests.is_empty());
}

#[tokio::test]
async fn v1_models_lists_the_base_model_and_its_adapters() {
    let (app, _) = app(HttpConfig::default()).await;
    let (status, _, text) = send(&app, Request::get("/v1/models").body(Body::empty()).unwrap()).await;
    assert_eq!(status, StatusCode::OK);
    let models: Value = serde_json::from_str(&text).unwrap();
    let ids: Vec<&str> = models["data"].as_array().unwrap().iter().map(|card| card["id"].as_str().unwrap()).collect();
    assert_eq!(ids, [["smollm2-test"].as_slice(), ADAPTERS.as_slice()].concat());
    // vLLM's fields: an adapter's parent is the served model; the context every request gets.
    let parents: Vec<&Value> = models["data"].as_array().unwrap().iter().map(|card| &card["parent"]).collect();
    assert_eq!(parents, [&Value::Null, &json!("smollm2-test"), &json!("smollm2-test")]);
    let max_total_tokens = HttpConfig::default().max_total_tokens;
    assert!(models["data"].as_array().unwrap().iter().all(|card| card["max_model_len"] == max_total_tokens), "{models}");
    // Each one by its id (`client.models.retrieve`); any other id is a 404.
    for id in ["smollm2-test", ADAPTERS[0]] {
        let (status, _, text) = send(&app, Request::get(format!("/v1/models/{id}")).body(Body::empty()).unwrap()).await;
        assert_eq!(status, StatusCode::OK, "{text}");
        assert_eq!(serde_json::from_str::<Value>(&text).unwrap()["id"], id);
    }
    let (status, _, text) = send(&app, Request::get("/v1/models/gpt-4").body(Body::empty()).unwrap()).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(serde_json::from_str::<Value>(&text).unwrap(), json!({"error": "The model `gpt-4` does not exist", "error_type": "not_found"}));
}

fn runtime_lora() -> HttpConfig {
    HttpConfig { allow_runtime_lora_updating: true, ..HttpConfig::default() }
}

/// A fresh directory of adapters: `with` hold an `adapter_config.json`, `without` do not.
fn adapters_dir(with: &[&str], without: &[&str]) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("superinfer-loras-{:x}", rand::random::<u64>()));
    for name in with.iter().chain(without) {
        std::fs::create_dir_all(dir.join(name)).unwrap();
    }
    for name in with {
        std::fs::write(dir.join(name).join("adapter_config.json"), r#"{"peft_type": "LORA"}"#).unwrap();
    }
    dir
}

/// `--lora-resolver-dir`: a request naming an adapter not loaded loads it from the directory
/// first (once, however many ask at once) and is served with it; TGI's `adapter_id` and
/// OpenAI's `model` alike. A name the directory does not hold is what it was without it, and no
/// name reaches outside the directory.
#[tokio::test]
async fn an_adapter_a_request_names_is_loaded_from_the_resolver_dir() {
    let root = adapters_dir(&["math-lora", "code-lora", "outside"], &["empty"]);
    let dir = root.join("adapters");
    std::fs::create_dir_all(&dir).unwrap();
    for name in ["math-lora", "code-lora", "empty"] {
        std::fs::rename(root.join(name), dir.join(name)).unwrap();
    }
    let (app, log) = app(HttpConfig { lora_resolver_dir: Some(dir.clone()), ..HttpConfig::default() }).await;
    assert_eq!(model_ids(&app).await, ["smollm2-test", "sql-lora", "chat-lora"]);

    let generate = json!({"inputs": "x", "parameters": {"max_new_tokens": 2, "adapter_id": "math-lora"}});
    let (status, _, text) = send(&app, post("/generate", &generate)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let math = dir.canonicalize().unwrap().join("math-lora").to_string_lossy().into_owned();
    assert_eq!(log.lock().unwrap().loaded_adapters, [("math-lora".to_string(), math.clone(), 3)]);
    assert_eq!(log.lock().unwrap().new_requests.last().unwrap().adapter_slot, 3);
    // Loaded once: the chat route's `model` finds it served.
    let chat = json!({"model": "math-lora", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2});
    assert_eq!(send(&app, post("/v1/chat/completions", &chat)).await.0, StatusCode::OK);
    assert_eq!(log.lock().unwrap().new_requests.last().unwrap().adapter_slot, 3);
    assert_eq!(model_ids(&app).await, ["smollm2-test", "sql-lora", "chat-lora", "math-lora"]);

    // Four requests naming a new adapter at once: one load, all served with it.
    let completion = json!({"model": "code-lora", "prompt": "x", "max_tokens": 2});
    let answers = futures::future::join_all((0..4).map(|_| send(&app, post("/v1/completions", &completion)))).await;
    assert!(answers.iter().all(|(status, _, _)| *status == StatusCode::OK), "{answers:?}");
    let loads: Vec<String> = log.lock().unwrap().loaded_adapters.iter().map(|(name, _, _)| name.clone()).collect();
    assert_eq!(loads, ["math-lora", "code-lora"]);
    let slots: Vec<u64> = log.lock().unwrap().new_requests.iter().rev().take(4).map(|request| request.adapter_slot).collect();
    assert_eq!(slots, [4, 4, 4, 4]);

    // Not in the directory (no adapter_config.json, none of that name, or a path out of it):
    // TGI's 422, OpenAI's base model; nothing is loaded.
    for name in ["empty", "nowhere", "../outside", "..", "/etc"] {
        let body = json!({"inputs": "x", "parameters": {"max_new_tokens": 2, "adapter_id": name}});
        let (status, _, text) = send(&app, post("/generate", &body)).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{name}: {text}");
        let chat = json!({"model": name, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2});
        assert_eq!(send(&app, post("/v1/chat/completions", &chat)).await.0, StatusCode::OK, "{name}");
        assert_eq!(log.lock().unwrap().new_requests.last().unwrap().adapter_id, "", "{name}");
    }
    assert_eq!(log.lock().unwrap().loaded_adapters.len(), 2);
    std::fs::remove_dir_all(root).unwrap();
}

/// `--max-loras`: past it, an adapter the resolver must load takes the place of the least
/// recently named one the resolver loaded that no request holds, and waits while requests hold
/// each; adapters loaded at start or by route are never evicted.
#[tokio::test]
async fn past_max_loras_the_resolver_evicts_the_least_recently_named_idle_adapter() {
    use futures::StreamExt;
    use tower::ServiceExt;
    let dir = adapters_dir(&["math-lora", "code-lora", "text-lora"], &[]);
    let config = HttpConfig { lora_resolver_dir: Some(dir.clone()), ..runtime_lora() };
    let chat_template = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/smollm2_chat_template.jinja")).unwrap();
    // The shard's two (sql-lora, chat-lora) and two more.
    let (app, log) = super::app_with_args(config, chat_template, &["--max-loras", "4"]).await;
    let generate = |adapter: &str| json!({"inputs": "x", "parameters": {"max_new_tokens": 2, "adapter_id": adapter}});
    let slot_sent = |log: &std::sync::Mutex<super::scripted_shard::ShardLog>| log.lock().unwrap().new_requests.last().unwrap().adapter_slot;
    for adapter in ["math-lora", "code-lora", "math-lora"] {
        assert_eq!(send(&app, post("/generate", &generate(adapter))).await.0, StatusCode::OK, "{adapter}");
    }
    assert_eq!(model_ids(&app).await, ["smollm2-test", "sql-lora", "chat-lora", "math-lora", "code-lora"]);
    // code-lora was named less recently than math-lora: it makes room for text-lora.
    let text = json!({"model": "text-lora", "prompt": "x", "max_tokens": 2});
    assert_eq!(send(&app, post("/v1/completions", &text)).await.0, StatusCode::OK);
    assert_eq!(slot_sent(&log), 5);
    wait_for(&log, |log| log.unloaded_slots == [4]).await;
    assert_eq!(model_ids(&app).await, ["smollm2-test", "sql-lora", "chat-lora", "math-lora", "text-lora"]);

    // Requests hold both: code-lora waits for one of them to end, then takes its place.
    let hold = |adapter: &str| json!({"inputs": HOLD, "parameters": {"max_new_tokens": 1000, "ignore_eos": true, "adapter_id": adapter}});
    let mut streams = Vec::new();
    for adapter in ["text-lora", "math-lora"] {
        let response = app.clone().oneshot(post("/generate_stream", &hold(adapter))).await.unwrap();
        let mut events = response.into_body().into_data_stream();
        events.next().await.unwrap().unwrap();
        streams.push(events);
    }
    let waiting = tokio::spawn({
        let app = app.clone();
        let body = generate("code-lora");
        async move { send(&app, post("/generate", &body)).await }
    });
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert!(!waiting.is_finished());
    assert_eq!(log.lock().unwrap().loaded_adapters.len(), 3);
    // The client of the math-lora stream leaves: its request ends, math-lora goes.
    drop(streams.pop());
    let (status, _, body) = waiting.await.unwrap();
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(slot_sent(&log), 6);
    wait_for(&log, |log| log.unloaded_slots == [4, 3]).await;
    assert_eq!(model_ids(&app).await, ["smollm2-test", "sql-lora", "chat-lora", "text-lora", "code-lora"]);

    // A load by route evicts likewise (code-lora, idle), but waits for no one: while a request
    // holds text-lora it is a 503, and passes once that request ends.
    let load = |name: &str| json!({"lora_name": name, "lora_path": format!("/adapters/{name}")});
    assert_eq!(send(&app, post("/v1/load_lora_adapter", &load("pinned-lora"))).await.0, StatusCode::OK);
    let (status, _, text) = send(&app, post("/v1/load_lora_adapter", &load("more-lora"))).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{text}");
    assert_eq!(serde_json::from_str::<Value>(&text).unwrap()["error"],
        "The server serves its most lora adapters at once (--max-loras 4), and requests hold each it could evict.");
    drop(streams);
    let mut status = StatusCode::SERVICE_UNAVAILABLE;
    for _ in 0..500 {
        status = send(&app, post("/v1/load_lora_adapter", &load("more-lora"))).await.0;
        if status != StatusCode::SERVICE_UNAVAILABLE {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(status, StatusCode::OK);
    // Loads by route are never evicted: with nothing else, a resolver load is refused (400), and
    // so is a load by route.
    let (status, _, text) = send(&app, post("/generate", &generate("math-lora"))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{text}");
    let full = "The server serves its most lora adapters at once (--max-loras 4), none of which it can evict; unload one first.";
    assert_eq!(serde_json::from_str::<Value>(&text).unwrap()["error"], full);
    let (status, _, text) = send(&app, post("/v1/load_lora_adapter", &load("x"))).await;
    assert_eq!((status, serde_json::from_str::<Value>(&text).unwrap()["error"].clone()), (StatusCode::BAD_REQUEST, json!(full)));
    assert_eq!(model_ids(&app).await, ["smollm2-test", "sql-lora", "chat-lora", "pinned-lora", "more-lora"]);
    assert_eq!(log.lock().unwrap().unloaded_slots.len(), 4);

    // The process's recorder is shared by the tests running beside this one: the counter has
    // counted at least these four.
    let evictions = send(&app, Request::get("/metrics").body(Body::empty()).unwrap()).await.2;
    let evictions = evictions.lines().find_map(|line| line.strip_prefix("superinfer_lora_adapter_evictions_total "));
    assert!(evictions.and_then(|count| count.parse::<f64>().ok()).is_some_and(|count| count >= 4.0), "{evictions:?}");
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test]
async fn more_startup_adapters_than_max_loras_stop_the_start() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");
    let tokenizer_json = std::fs::read_to_string(format!("{dir}/smollm2_tokenizer.json")).unwrap();
    let template = std::fs::read_to_string(format!("{dir}/smollm2_chat_template.jinja")).unwrap();
    let shard = super::scripted_shard::ScriptedShard::spawn(tokenizer_json, template);
    let socket = shard.0.to_string_lossy().to_string();
    let argv = ["router", "--uds-path", socket.as_str(), "--shard-connect-timeout-s", "10", "--max-loras", "1"];
    let config = crate::config::RouterConfig::parse_argv(argv).unwrap();
    let started = crate::server::start_engine(&config, &tokio_util::task::TaskTracker::new(), &tokio_util::sync::CancellationToken::new()).await;
    let error = started.err().expect("two start-up adapters exceed one");
    assert_eq!(error.to_string(), "the shard serves 2 LoRA adapters from its start (--lora-adapters), more than --max-loras 1");
}

#[tokio::test]
async fn a_resolver_dir_that_cannot_be_read_stops_the_start() {
    let missing = std::env::temp_dir().join(format!("superinfer-no-loras-{:x}", rand::random::<u64>()));
    let config = HttpConfig { lora_resolver_dir: Some(missing.clone()), ..HttpConfig::default() };
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");
    let tokenizer_json = std::fs::read_to_string(format!("{dir}/smollm2_tokenizer.json")).unwrap();
    let template = std::fs::read_to_string(format!("{dir}/smollm2_chat_template.jinja")).unwrap();
    let shard = super::scripted_shard::ScriptedShard::spawn(tokenizer_json, template);
    let error = super::try_app_on_shard(config, shard, &[]).await.0.err().expect("a missing directory is refused");
    assert_eq!(error.to_string(), format!("--lora-resolver-dir {}: not a directory this server can read", missing.display()));
}

async fn model_ids(app: &axum::Router) -> Vec<String> {
    let (_, _, text) = send(app, Request::get("/v1/models").body(Body::empty()).unwrap()).await;
    let models: Value = serde_json::from_str(&text).unwrap();
    models["data"].as_array().unwrap().iter().map(|card| card["id"].as_str().unwrap().to_string()).collect()
}

#[tokio::test]
async fn an_adapter_loaded_at_run_time_is_served_in_a_new_slot_until_it_is_unloaded() {
    let (app, log) = app(runtime_lora()).await;
    let load = json!({"lora_name": "math-lora", "lora_path": "/adapters/math"});
    let (status, _, text) = send(&app, post("/v1/load_lora_adapter", &load)).await;
    assert_eq!((status, text.as_str()), (StatusCode::OK, "Success: LoRA adapter 'math-lora' added successfully."));
    // The slot after the shard's own (1 and 2).
    assert_eq!(log.lock().unwrap().loaded_adapters, [("math-lora".to_string(), "/adapters/math".to_string(), 3)]);
    assert_eq!(model_ids(&app).await, ["smollm2-test", "sql-lora", "chat-lora", "math-lora"]);
    let generate = json!({"inputs": "x", "parameters": {"max_new_tokens": 2, "adapter_id": "math-lora"}});
    let (status, _, text) = send(&app, post("/generate", &generate)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let sent = log.lock().unwrap().new_requests.last().unwrap().clone();
    assert_eq!((sent.adapter_id.as_str(), sent.adapter_slot), ("math-lora", 3));
    let chat = json!({"model": "math-lora", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2});
    let (status, _, text) = send(&app, post("/v1/chat/completions", &chat)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert_eq!(log.lock().unwrap().new_requests.last().unwrap().adapter_slot, 3);
    // The startup adapters keep their slots.
    let sql = json!({"inputs": "x", "parameters": {"max_new_tokens": 2, "adapter_id": "sql-lora"}});
    assert_eq!(send(&app, post("/generate", &sql)).await.0, StatusCode::OK);
    assert_eq!(log.lock().unwrap().new_requests.last().unwrap().adapter_slot, 1);

    // A name in use is refused (vLLM's message); nothing reaches the shard.
    let (status, _, text) = send(&app, post("/v1/load_lora_adapter", &load)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{text}");
    assert_eq!(serde_json::from_str::<Value>(&text).unwrap()["error"], "The lora adapter 'math-lora' has already been loaded.");
    assert_eq!(log.lock().unwrap().loaded_adapters.len(), 1);

    let unload = json!({"lora_name": "math-lora"});
    let (status, _, text) = send(&app, post("/v1/unload_lora_adapter", &unload)).await;
    assert_eq!((status, text.as_str()), (StatusCode::OK, "Success: LoRA adapter 'math-lora' removed successfully."));
    // Nothing runs with it: the shard frees it at once.
    wait_for(&log, |log| log.unloaded_slots == [3]).await;
    let (status, _, text) = send(&app, post("/generate", &generate)).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{text}");
    assert_eq!(serde_json::from_str::<Value>(&text).unwrap()["error"],
        "Input validation error: adapter `math-lora` is not loaded; loaded adapters: sql-lora, chat-lora");
    assert_eq!(model_ids(&app).await, ["smollm2-test", "sql-lora", "chat-lora"]);
    let (status, _, text) = send(&app, post("/v1/unload_lora_adapter", &unload)).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{text}");
    assert_eq!(serde_json::from_str::<Value>(&text).unwrap(),
        json!({"error": "The lora adapter 'math-lora' cannot be found.", "error_type": "not_found"}));

    // Loaded again: a slot of its own, never the old one (its cached blocks are another adapter's).
    assert_eq!(send(&app, post("/v1/load_lora_adapter", &load)).await.0, StatusCode::OK);
    assert_eq!(log.lock().unwrap().loaded_adapters.last().unwrap().2, 4);
    assert_eq!(send(&app, post("/generate", &generate)).await.0, StatusCode::OK);
    assert_eq!(log.lock().unwrap().new_requests.last().unwrap().adapter_slot, 4);
}

#[tokio::test]
async fn an_adapter_the_shard_cannot_serve_is_400_with_its_reason_and_changes_nothing() {
    let (app, log) = app(runtime_lora()).await;
    let load = json!({"lora_name": "math-lora", "lora_path": UNSERVABLE_ADAPTER});
    let (status, _, text) = send(&app, post("/v1/load_lora_adapter", &load)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{text}");
    let error: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(error["error"], format!("the lora adapter 'math-lora' cannot be loaded: {UNSERVABLE_ADAPTER} has no adapter_config.json"));
    assert_eq!(error["error_type"], "lora_adapter");
    assert_eq!(model_ids(&app).await, ["smollm2-test", "sql-lora", "chat-lora"]);
    // The name is free again.
    let good = json!({"lora_name": "math-lora", "lora_path": "/adapters/math"});
    assert_eq!(send(&app, post("/v1/load_lora_adapter", &good)).await.0, StatusCode::OK);
    assert!(log.lock().unwrap().unloaded_slots.is_empty());
    // Malformed: what to load is missing, or the name is the served model's.
    for (body, message) in [
        (json!({"lora_name": "", "lora_path": "/adapters/x"}), "both 'lora_name' and 'lora_path' must be given"),
        (json!({"lora_name": "x", "lora_path": " "}), "both 'lora_name' and 'lora_path' must be given"),
        (json!({"lora_name": "smollm2-test", "lora_path": "/adapters/x"}), "'smollm2-test' is the served model's name; an adapter needs its own"),
    ] {
        let (status, _, text) = send(&app, post("/v1/load_lora_adapter", &body)).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{text}");
        assert_eq!(serde_json::from_str::<Value>(&text).unwrap()["error"], format!("Input validation error: {message}"));
    }
    let (status, _, _) = send(&app, post("/v1/load_lora_adapter", &json!({"lora_path": "/adapters/x"}))).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
}

#[tokio::test]
async fn a_replaced_or_unloaded_adapter_leaves_the_shard_only_after_the_requests_running_with_it() {
    let (app, log) = app(runtime_lora()).await;
    let long = json!({"inputs": HOLD, "parameters": {"max_new_tokens": 1000, "ignore_eos": true, "adapter_id": "sql-lora"}});
    let running = tokio::spawn({
        let app = app.clone();
        async move { send(&app, post("/generate", &long)).await }
    });
    wait_for(&log, |log| log.new_requests.iter().any(|request| request.adapter_slot == 1)).await;
    // vLLM's series of the adapters running, as LoRA-aware routers read it (recorded by the
    // engine's next turn).
    let mut metrics = String::new();
    for _ in 0..500 {
        metrics = send(&app, Request::get("/metrics").body(Body::empty()).unwrap()).await.2;
        if metrics.lines().any(|line| line.starts_with("vllm:lora_requests_info{")
            && line.contains("running_lora_adapters=\"sql-lora\"") && line.contains("max_lora=\"2\""))
        {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(metrics.contains("running_lora_adapters=\"sql-lora\""), "{metrics}");
    // Replaced in place (vLLM's load_inplace): new requests get the new slot at once.
    let replace = json!({"lora_name": "sql-lora", "lora_path": "/adapters/sql-v2", "load_inplace": true});
    let (status, _, text) = send(&app, post("/v1/load_lora_adapter", &replace)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let short = json!({"inputs": "x", "parameters": {"max_new_tokens": 2, "adapter_id": "sql-lora"}});
    assert_eq!(send(&app, post("/generate", &short)).await.0, StatusCode::OK);
    assert_eq!(log.lock().unwrap().new_requests.last().unwrap().adapter_slot, 3);
    assert_eq!(model_ids(&app).await, ["smollm2-test", "sql-lora", "chat-lora"]);
    // And the new one unloaded while nothing runs with it; the old slot still serves the long request.
    assert_eq!(send(&app, post("/v1/unload_lora_adapter", &json!({"lora_name": "sql-lora"}))).await.0, StatusCode::OK);
    wait_for(&log, |log| log.unloaded_slots == [3]).await;
    assert!(!running.is_finished());
    let (status, _, text) = running.await.unwrap();
    assert_eq!(status, StatusCode::OK, "{text}");
    assert!(serde_json::from_str::<Value>(&text).unwrap()["generated_text"].is_string(), "{text}");
    wait_for(&log, |log| log.unloaded_slots == [3, 1]).await;
}

#[tokio::test]
async fn the_run_time_routes_are_off_unless_asked_for() {
    let (app, log) = app(HttpConfig::default()).await;
    for (path, body) in [
        ("/v1/load_lora_adapter", json!({"lora_name": "math-lora", "lora_path": "/adapters/math"})),
        ("/v1/unload_lora_adapter", json!({"lora_name": "sql-lora"})),
    ] {
        let (status, _, text) = send(&app, post(path, &body)).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{text}");
        assert!(text.contains("--allow-runtime-lora-updating"), "{text}");
    }
    assert!(log.lock().unwrap().loaded_adapters.is_empty());
    assert_eq!(model_ids(&app).await, ["smollm2-test", "sql-lora", "chat-lora"]);
}

/// Every event a KV-aware router would have received so far, replayed from the publisher's
/// buffer (vLLM's replay protocol: ask from sequence 0, answers until the -1 marker).
async fn kv_events_replayed(replay_port: u16) -> Vec<Value> {
    use zeromq::{DealerSocket, Socket, SocketRecv, SocketSend, ZmqMessage};
    let mut dealer = DealerSocket::new();
    dealer.connect(&format!("tcp://127.0.0.1:{replay_port}")).await.unwrap();
    let ask = ZmqMessage::try_from(vec![bytes::Bytes::new(), bytes::Bytes::copy_from_slice(&0i64.to_be_bytes())]).unwrap();
    dealer.send(ask).await.unwrap();
    let mut events = Vec::new();
    loop {
        let answer = tokio::time::timeout(std::time::Duration::from_secs(10), dealer.recv()).await.unwrap().unwrap().into_vec();
        if i64::from_be_bytes(answer[2].as_ref().try_into().unwrap()) == -1 {
            return events;
        }
        let (_, batch, _): (f64, Vec<Value>, u32) = rmp_serde::from_slice(&answer[3]).unwrap();
        events.extend(batch);
    }
}

/// The block hashes of the `BlockStored` events of LoRA slot `lora_id`, and of every `BlockRemoved`.
fn stored_and_removed(events: &[Value], lora_id: u64) -> (Vec<u64>, std::collections::HashSet<u64>) {
    let hashes = |event: &Value| event["block_hashes"].as_array().unwrap().iter().map(|h| h.as_u64().unwrap()).collect::<Vec<_>>();
    let stored = events.iter().filter(|e| e["type"] == "BlockStored" && e["lora_id"] == lora_id).flat_map(hashes).collect();
    let removed = events.iter().filter(|e| e["type"] == "BlockRemoved").flat_map(hashes).collect();
    (stored, removed)
}

/// Blocks cached under an adapter's weights can never be hit again once it is unloaded or
/// replaced (its slot is never given out again): the engine forgets them at once, so a KV-aware
/// router is told they are gone instead of sending that adapter's prompts here for them, and
/// their memory is the first the pool reuses.
#[tokio::test]
async fn a_retired_adapters_cached_blocks_are_announced_removed() {
    let replay_port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let events = format!(
        r#"{{"enable_kv_cache_events":true,"endpoint":"tcp://127.0.0.1:0","replay_endpoint":"tcp://127.0.0.1:{replay_port}","topic":"kv"}}"#
    );
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");
    let template = std::fs::read_to_string(format!("{dir}/smollm2_chat_template.jinja")).unwrap();
    let (app, log) = super::app_with_args(runtime_lora(), template, &["--kv-events-config", &events]).await;
    let load = json!({"lora_name": "math-lora", "lora_path": "/adapters/math"});
    assert_eq!(send(&app, post("/v1/load_lora_adapter", &load)).await.0, StatusCode::OK);
    // Three full blocks of prompt, cached under slot 3.
    let generate = json!({"inputs": "one two three four five six seven eight nine ten ".repeat(5),
        "parameters": {"max_new_tokens": 2, "adapter_id": "math-lora"}});
    assert_eq!(send(&app, post("/generate", &generate)).await.0, StatusCode::OK);
    // Replaced in place: slot 3 is retired (nothing runs with it), slot 4 serves the name.
    let replace = json!({"lora_name": "math-lora", "lora_path": "/adapters/math-v2", "load_inplace": true});
    assert_eq!(send(&app, post("/v1/load_lora_adapter", &replace)).await.0, StatusCode::OK);
    wait_for(&log, |log| log.unloaded_slots == [3]).await;
    assert_eq!(send(&app, post("/generate", &generate)).await.0, StatusCode::OK);
    assert_eq!(log.lock().unwrap().new_requests.last().unwrap().adapter_slot, 4);
    // Events are published on the engine's turns.
    let mut replayed = Vec::new();
    for _ in 0..200 {
        replayed = kv_events_replayed(replay_port).await;
        if !stored_and_removed(&replayed, 4).0.is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let (old, removed) = stored_and_removed(&replayed, 3);
    let (new, _) = stored_and_removed(&replayed, 4);
    assert!(old.len() >= 3 && new.len() >= 3, "{replayed:?}");
    assert!(old.iter().all(|hash| removed.contains(hash)), "slot 3's blocks are all removed: {replayed:?}");
    assert!(new.iter().all(|hash| !removed.contains(hash)), "slot 4's blocks stay: {replayed:?}");
    // Unloaded: the new slot's go the same way.
    assert_eq!(send(&app, post("/v1/unload_lora_adapter", &json!({"lora_name": "math-lora"}))).await.0, StatusCode::OK);
    wait_for(&log, |log| log.unloaded_slots == [3, 4]).await;
    for _ in 0..200 {
        replayed = kv_events_replayed(replay_port).await;
        let (new, removed) = stored_and_removed(&replayed, 4);
        if new.iter().all(|hash| removed.contains(hash)) {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("slot 4's blocks were never removed: {replayed:?}");
}
