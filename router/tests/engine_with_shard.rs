//! The engine against the real Python shard on the embedded model: generation, determinism
//! under batching, cancellation, shard stalls and failure. They need the project's virtualenv
//! (`make venv`); without it they fail, saying so.
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use superinfer_router::config::RouterConfig;
use superinfer_router::engine::api::{
    EngineError, EngineEvent, FinishReason, GenerationRequest, SamplingParams, SpanContext,
};
use superinfer_router::engine::{EngineHandle, RequestStream};
use superinfer_router::server::start_engine;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

struct Shard {
    process: Child,
    log: PathBuf,
    _dir: TempDir,
    socket: PathBuf,
}

impl Drop for Shard {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("router/ has a parent").to_path_buf()
}

fn start_shard(name: &str) -> Shard {
    let root = repo_root();
    let python = root.join(".venv/bin/python");
    // A missing environment is a failure, not a silent pass: these are the engine's only
    // tests against the real shard.
    assert!(python.exists(), "{} is missing: run `make venv` (or `make test`) first", python.display());
    let dir = std::env::temp_dir().join(format!("superinfer-engine-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let socket = dir.join("shard.sock");
    let pythonpath = format!("{}:{}", root.join("server").display(), root.display());
    let process = Command::new(python)
        .args(["-m", "superinfer.cli", "serve", "--uds-path"])
        .arg(&socket)
        .args(["--device-kv-blocks", "48", "--host-kv-blocks", "32", "--log-level", "WARNING"])
        .env("PYTHONPATH", pythonpath)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("shard.log")).expect("shard log"))
        .spawn()
        .expect("start the shard");
    Shard { process, log: dir.join("shard.log"), _dir: TempDir(dir), socket }
}

async fn engine(shard: &Shard, policy: &str, tracker: &TaskTracker, shutdown: &CancellationToken) -> EngineHandle {
    engine_with(shard, &["--scheduler", policy], tracker, shutdown).await
}

async fn engine_with(shard: &Shard, flags: &[&str], tracker: &TaskTracker, shutdown: &CancellationToken) -> EngineHandle {
    let socket = shard.socket.to_str().expect("utf-8 path");
    // A first start on a fresh machine converts the model (tens of seconds on a loaded machine).
    let argv = ["router", "--uds-path", socket, "--max-batch-tokens", "64", "--shard-connect-timeout-s", "300"];
    let config = RouterConfig::parse_argv(argv.iter().chain(flags)).unwrap();
    match start_engine(&config, tracker, shutdown).await {
        Ok((engine, _)) => engine,
        Err(err) => {
            let log = std::fs::read_to_string(&shard.log).unwrap_or_default();
            panic!("engine did not start: {err}\n--- shard log ---\n{log}");
        }
    }
}

/// Sends `signal` (e.g. "STOP", "CONT") to the shard process.
fn signal(shard: &Shard, signal: &str) {
    let status = Command::new("kill").arg(format!("-{signal}")).arg(shard.process.id().to_string()).status();
    assert!(status.is_ok_and(|status| status.success()), "kill -{signal} failed");
}

/// The stream's first event that is not a token.
async fn last_event(stream: &mut RequestStream) -> Option<EngineEvent> {
    loop {
        match stream.recv().await {
            Some(EngineEvent::Token(_) | EngineEvent::Scheduled { .. }) => continue,
            other => return other,
        }
    }
}

/// The stream's next event but its scheduling's.
async fn next_event(stream: &mut RequestStream) -> Option<EngineEvent> {
    loop {
        match stream.recv().await {
            Some(EngineEvent::Scheduled { .. }) => continue,
            other => return other,
        }
    }
}

fn request(prompt_token_ids: Vec<u32>, max_new_tokens: u32) -> GenerationRequest {
    GenerationRequest {
        prompt_token_ids,
        sampling: SamplingParams::greedy(),
        max_new_tokens,
        ignore_eos: true,
        prompt_logprobs: false,
        prompt_top_n: None,
        top_n_tokens: 0,
        slo: None,
        priority: 0,
        arrival: Instant::now(),
        span_context: SpanContext::empty_context(),
        constraint: None,
        adapter: None,
    }
}

/// Reads a stream to its end: the generated token ids and how it ended.
async fn collect(mut stream: RequestStream) -> (Vec<u32>, EngineEvent) {
    let mut tokens = Vec::new();
    while let Some(event) = stream.recv().await {
        match event {
            EngineEvent::Token(token) => tokens.push(token.id),
            EngineEvent::PromptLogprobs(_) | EngineEvent::Scheduled { .. } => {}
            last => return (tokens, last),
        }
    }
    panic!("the stream ended without a final event");
}

fn prompt(seed: u32, length: u32) -> Vec<u32> {
    (0..length).map(|i| 100 + (seed * 37 + i * 11) % 5000).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generates_batches_and_cancels_on_the_real_shard() {
    let shard = start_shard("generate");
    let (tracker, shutdown) = (TaskTracker::new(), CancellationToken::new());
    // fcfs reserves worst-case blocks and never preempts: the cancellation check below can
    // only pass if the cancelled request really returned its reservation.
    let engine = engine(&shard, "fcfs", &tracker, &shutdown).await;
    engine.health().await.expect("healthy");

    // Alone, then eight at once (prompts up to 150 tokens: prefill in 64-token chunks).
    let prompts: Vec<Vec<u32>> = (0..8).map(|i| prompt(i, 20 + i * 18)).collect();
    let mut alone = Vec::new();
    for ids in &prompts {
        let (tokens, last) = collect(engine.submit(request(ids.clone(), 6)).unwrap()).await;
        assert!(matches!(last, EngineEvent::Finished { reason: FinishReason::Length, .. }), "{last:?}");
        assert_eq!(tokens.len(), 6);
        alone.push(tokens);
    }
    let streams: Vec<_> = prompts.iter().map(|ids| engine.submit(request(ids.clone(), 6)).unwrap()).collect();
    let together: Vec<_> = futures::future::join_all(streams.into_iter().map(collect)).await;
    for (index, (tokens, _)) in together.iter().enumerate() {
        assert_eq!(tokens, &alone[index], "prompt {index} differs when batched");
    }

    // A dropped stream is cancelled and its reservation (500 tokens: 32 of the 48 blocks) comes
    // back, so a request needing 17 blocks can run.
    let mut long = engine.submit(request(prompt(99, 100), 400)).unwrap();
    for _ in 0..3 {
        assert!(matches!(next_event(&mut long).await, Some(EngineEvent::Token(_))));
    }
    drop(long);
    let finished = tokio::time::timeout(Duration::from_secs(120), collect(engine.submit(request(prompt(5, 200), 70)).unwrap()));
    let (tokens, last) = finished.await.expect("the cancelled request's blocks were not returned");
    assert!(matches!(last, EngineEvent::Finished { .. }), "{last:?}");
    assert_eq!(tokens.len(), 70);

    shutdown.cancel();
    tracker.close();
    tracker.wait().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_shard_fails_running_requests_then_the_engine_gives_up() {
    let mut shard = start_shard("failure");
    let (tracker, shutdown) = (TaskTracker::new(), CancellationToken::new());
    let flags = ["--scheduler", "rotasched", "--shard-recovery-timeout-s", "3"];
    let engine = engine_with(&shard, &flags, &tracker, &shutdown).await;
    let mut stream = engine.submit(request(prompt(1, 30), 500)).unwrap();
    assert!(matches!(next_event(&mut stream).await, Some(EngineEvent::Token(_))));
    shard.process.kill().expect("kill the shard");
    let last = tokio::time::timeout(Duration::from_secs(60), last_event(&mut stream)).await;
    let last = last.expect("the failure reaches the stream");
    assert!(matches!(last, Some(EngineEvent::Failed(EngineError::Shard(_)))), "{last:?}");
    // Recovering: refused, but not for good yet.
    assert!(matches!(engine.health().await, Err(EngineError::Unavailable(_))));
    assert!(matches!(engine.submit(request(vec![1, 2], 1)), Err(EngineError::Unavailable(_))));
    // The shard does not come back: the engine gives up (the router then exits non-zero).
    let reason = tokio::time::timeout(Duration::from_secs(60), engine.stopped()).await.expect("the engine gives up");
    assert!(reason.contains("did not recover"), "{reason}");
    assert!(matches!(engine.health().await, Err(EngineError::Shard(_))));
    shutdown.cancel();
    tracker.close();
    tracker.wait().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_shard_fails_the_step_in_time_and_the_engine_recovers() {
    stalled_shard_recovers("stall", &[]).await;
}

/// With one step in flight two steps are outstanding when the shard stops: the failure of the
/// first abandons the second, and recovery is the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_shard_with_one_step_in_flight_recovers_the_same_way() {
    stalled_shard_recovers("stall-async", &["--async-scheduling"]).await;
}

async fn stalled_shard_recovers(name: &str, extra_flags: &[&str]) {
    let shard = start_shard(name);
    let (tracker, shutdown) = (TaskTracker::new(), CancellationToken::new());
    // The deadline must stay above a real step's time on a loaded machine (this file's five
    // shards share the CI machine's cores; a 40-token prefill there has taken over 2 s), and
    // far below the time the test waits for the failure.
    let mut flags = vec!["--scheduler", "rotasched", "--step-timeout-s", "8", "--shard-recovery-timeout-s", "120"];
    flags.extend_from_slice(extra_flags);
    let engine = engine_with(&shard, &flags, &tracker, &shutdown).await;
    let expected = collect(engine.submit(request(prompt(3, 40), 8)).unwrap()).await.0;

    let mut stream = engine.submit(request(prompt(1, 30), 500)).unwrap();
    assert!(matches!(next_event(&mut stream).await, Some(EngineEvent::Token(_))));
    signal(&shard, "STOP");
    let stopped_at = Instant::now();
    let last = tokio::time::timeout(Duration::from_secs(90), last_event(&mut stream)).await.expect("no hang");
    assert!(matches!(last, Some(EngineEvent::Failed(EngineError::Shard(_)))), "{last:?}");
    // The deadline (8 s) plus a step already under way: well under the 90 s above.
    assert!(stopped_at.elapsed() < Duration::from_secs(40), "{:?}", stopped_at.elapsed());
    assert!(matches!(engine.health().await, Err(EngineError::Unavailable(_))));
    assert!(matches!(engine.submit(request(vec![1, 2], 1)), Err(EngineError::Unavailable(_))));

    signal(&shard, "CONT");
    let recovered = tokio::time::timeout(Duration::from_secs(60), async {
        while engine.health().await.is_err() {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    recovered.await.expect("the engine serves again once the shard answers");
    // The same prompt gives the same tokens: nothing of the failed step survived.
    let (tokens, last) = collect(engine.submit(request(prompt(3, 40), 8)).unwrap()).await;
    assert!(matches!(last, EngineEvent::Finished { .. }), "{last:?}");
    assert_eq!(tokens, expected);
    shutdown.cancel();
    tracker.close();
    tracker.wait().await;
}

/// A workload of concurrent greedy requests: prompts of 5 to 150 tokens, limits of 1 to 40
/// tokens, half of them stopping at EOS; every fifth is cancelled after its second token.
async fn mixed_workload(engine: &EngineHandle) -> Vec<(Vec<u32>, String)> {
    let streams: Vec<_> = (0..24u32)
        .map(|i| {
            let mut r = request(prompt(i, 5 + (i * 29) % 146), 1 + (i * 13) % 40);
            r.ignore_eos = i % 2 == 0;
            engine.submit(r).unwrap()
        })
        .collect();
    let runs = streams.into_iter().enumerate().map(|(i, mut stream)| async move {
        if i % 5 == 4 {
            let mut tokens = Vec::new();
            while tokens.len() < 2 {
                match stream.recv().await {
                    Some(EngineEvent::Token(token)) => tokens.push(token.id),
                    Some(EngineEvent::PromptLogprobs(_) | EngineEvent::Scheduled { .. }) => {}
                    other => return (tokens, format!("{other:?}")),
                }
            }
            drop(stream); // cancelled
            return (tokens, "cancelled".to_string());
        }
        let (tokens, last) = collect(stream).await;
        let end = match last {
            EngineEvent::Finished { reason, .. } => format!("{reason:?}"),
            other => panic!("request {i} ended with {other:?}"),
        };
        (tokens, end)
    });
    futures::future::join_all(runs).await
}

/// One step in flight (`--async-scheduling`) changes no greedy token: the same workload with
/// and without it, under memory pressure (48 blocks of 16 for 24 requests: rotasched rotates
/// and recomputes), EOS stops applied one step late, cancellations, max_new_tokens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_step_in_flight_gives_the_same_greedy_tokens() {
    let (sync_shard, async_shard) = (start_shard("sync"), start_shard("async"));
    let mut outputs = Vec::new();
    for (shard, extra) in [(&sync_shard, None), (&async_shard, Some("--async-scheduling"))] {
        let (tracker, shutdown) = (TaskTracker::new(), CancellationToken::new());
        let mut flags = vec!["--scheduler", "rotasched"];
        flags.extend(extra);
        let engine = engine_with(shard, &flags, &tracker, &shutdown).await;
        let first = tokio::time::timeout(Duration::from_secs(300), mixed_workload(&engine)).await.expect("no hang");
        // Every block came back: a request needing the whole pool runs.
        let whole = request(prompt(77, 300), 300);
        let (tokens, _) = tokio::time::timeout(Duration::from_secs(300), collect(engine.submit(whole).unwrap())).await.expect("blocks returned");
        assert_eq!(tokens.len(), 300);
        outputs.push(first);
        shutdown.cancel();
        tracker.close();
        tracker.wait().await;
    }
    let (sync, ahead) = (&outputs[0], &outputs[1]);
    for (i, (one, other)) in sync.iter().zip(ahead).enumerate() {
        assert_eq!(one, other, "request {i} differs with one step in flight");
    }
    assert!(sync.iter().filter(|(_, end)| end == "Length").count() >= 10, "{sync:?}");
}
