//! One log line per finished request, on every generation route, streams included.
use std::collections::BTreeMap;

use futures::StreamExt;
use serde_json::{json, Value};
use tower::ServiceExt;

use super::{app, post, send, HOLD};
use crate::http::request_log::tests::CapturedLogs;
use crate::http::HttpConfig;

#[tokio::test]
async fn every_route_logs_one_line_per_finished_request() {
    let logs = CapturedLogs::install();
    let (app, _) = app(HttpConfig::default()).await;
    let tgi = json!({"inputs": "Say hi", "parameters": {"max_new_tokens": 3}});
    let chat = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3});
    let batch = json!({"prompt": ["a", "b"], "max_tokens": 2});
    let with = |body: &Value, key: &str, value: Value| {
        let mut body = body.clone();
        body[key] = value;
        body
    };
    let invalid = json!({"inputs": "x", "parameters": {"temperature": -1}});
    let requests = [
        ("/generate", tgi.clone()),
        ("/generate_stream", tgi.clone()),
        ("/", tgi.clone()),
        ("/", with(&tgi, "stream", json!(true))),
        ("/v1/chat/completions", chat.clone()),
        ("/v1/chat/completions", with(&chat, "stream", json!(true))),
        ("/v1/completions", batch.clone()), // one request, one line
        ("/v1/completions", with(&batch, "stream", json!(true))), // a line per choice
        ("/generate", invalid.clone()),
        ("/generate_stream", invalid),
    ];
    for (path, body) in &requests {
        send(&app, post(path, body)).await;
    }
    // A client that leaves a stream: its request is dropped, and logged once as such.
    let long = json!({"inputs": HOLD, "parameters": {"max_new_tokens": 1000, "ignore_eos": true}});
    let response = app
        .clone()
        .oneshot(post("/generate_stream", &long))
        .await
        .unwrap();
    let mut events = response.into_body().into_data_stream();
    events.next().await.unwrap().unwrap();
    drop(events);
    let mut lines = Vec::new();
    for _ in 0..1000 {
        lines = logs.request_lines();
        if lines.len() == 13 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let mut counts: BTreeMap<(String, String), usize> = BTreeMap::new();
    for line in &lines {
        let key = (
            line["route"].as_str().unwrap().to_string(),
            line["message"].as_str().unwrap().to_string(),
        );
        *counts.entry(key).or_default() += 1;
    }
    let expected: BTreeMap<(String, String), usize> = [
        ("/generate", "Success", 1),
        ("/generate", "Failure", 1),
        ("/generate_stream", "Success", 1),
        ("/generate_stream", "Failure", 1),
        ("/generate_stream", "Dropped", 1),
        ("/", "Success", 2),
        ("/v1/chat/completions", "Success", 2),
        ("/v1/completions", "Success", 3),
    ]
    .into_iter()
    .map(|(route, message, count)| ((route.to_string(), message.to_string()), count))
    .collect();
    assert_eq!(counts, expected, "{lines:#?}");
    for line in &lines {
        match line["message"].as_str().unwrap() {
            "Success" => {
                let ids = line["request_id"].as_str().unwrap();
                assert!(ids.split(',').all(|id| id.parse::<u64>().is_ok()), "{line}");
                for timing in [
                    "total_time",
                    "validation_time",
                    "queue_time",
                    "inference_time",
                    "time_per_token",
                ] {
                    assert!(line[timing].is_string(), "{timing} missing: {line}");
                }
                assert!(line["input_length"].as_u64().unwrap() > 0, "{line}");
                assert!(line["generated_tokens"].as_u64().unwrap() > 0, "{line}");
            }
            "Failure" => {
                assert_eq!(line["error_type"], "validation", "{line}");
                assert_eq!(line["request_id"], "-", "never submitted: {line}");
            }
            _ => {
                assert_eq!(line["error_type"], "dropped", "{line}");
                assert!(
                    line["request_id"].as_str().unwrap().parse::<u64>().is_ok(),
                    "{line}"
                );
            }
        }
    }
    // The batch's line names both of its engine requests.
    let batch_line = lines.iter().find(|line| {
        line["route"] == "/v1/completions" && line["request_id"].as_str().unwrap().contains(',')
    });
    assert!(batch_line.is_some(), "{lines:#?}");
}
