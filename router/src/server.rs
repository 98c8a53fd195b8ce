//! Start-up wiring: connect to the shard → Info → Warmup → start the engine → build the HTTP
//! app → serve until `stop` is cancelled, then drain. The caller owns the stop token, so tests
//! and the Python shim decide when the server stops.
//!
//! Stopping is graceful: new requests are refused with 503, those in flight get
//! `--graceful-termination-timeout-s` to finish, then the engine stops (failing, with an error
//! event, whatever is left) and the HTTP server closes its connections once those are written.
//! An engine that gives up on its shard ends `run` with an error (the process exits non-zero).
use std::sync::Arc;
use std::time::Duration;

use superinfer_scheduler::{CostModel, PolicyKind, RotaSchedSettings, SchedulerConfig, SchedulerError, Slo, TokenCurve};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::client::{ClientError, ShardClient};
use crate::config::{AdmissionKind, RouterConfig, SchedulerKind};
use crate::engine::{spawn_engine, AdapterRegistry, Admission, EngineConfig, EngineHandle, EngineTimeouts, ModelInfo};
use crate::http::{self, HttpConfig};
use crate::kv_events::{start_publisher, KvEventsError};
use crate::metrics::{install_recorder_with_limits, MetricLimits, MetricsError};
use crate::pb;

/// How long the HTTP server may take to close its connections once told to stop.
const HTTP_CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error(transparent)]
    Shard(#[from] ClientError),
    #[error(transparent)]
    Scheduler(#[from] SchedulerError),
    #[error("the shard reported no KV blocks (device {device}); it cannot serve")]
    NoKvBlocks { device: u32 },
    #[error("cannot listen on {address}: {source}")]
    Bind { address: String, source: std::io::Error },
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error(transparent)]
    HttpConfig(#[from] http::ConfigError),
    #[error(transparent)]
    Metrics(#[from] MetricsError),
    #[error("the HTTP server failed: {0}")]
    Http(std::io::Error),
    #[error("the engine stopped: {0}")]
    EngineStopped(String),
    #[error(transparent)]
    KvEvents(#[from] KvEventsError),
}

/// Runs the router until `stop` is cancelled (then drains), the HTTP server fails, or the
/// engine gives up on its shard.
pub async fn run(config: RouterConfig, stop: CancellationToken) -> Result<(), ServerError> {
    let tracker = TaskTracker::new();
    let engine_stop = CancellationToken::new();
    let result = serve(&config, &tracker, &engine_stop, &stop).await;
    // Whatever ended the server, the engine stops with it and fails what is in flight.
    engine_stop.cancel();
    tracker.close();
    tracker.wait().await;
    result
}

async fn serve(
    config: &RouterConfig,
    tracker: &TaskTracker,
    engine_stop: &CancellationToken,
    stop: &CancellationToken,
) -> Result<(), ServerError> {
    let (engine, model) = tokio::select! {
        started = start_engine(config, tracker, engine_stop) => started?,
        // Stopped while the shard was still loading: nothing to drain.
        _ = stop.cancelled() => return Ok(()),
    };
    let app = http::router(http_config(config, &model), engine.clone(), &model)?;
    let address = format!("{}:{}", config.hostname, config.port);
    let listener = TcpListener::bind(&address)
        .await
        .map_err(|source| ServerError::Bind { address: address.clone(), source })?;
    tracing::info!(%address, model = %model.model_id, "router listening");
    let http_stop = CancellationToken::new();
    let http = http::serve(listener, app, http_stop.clone());
    tokio::pin!(http);
    let outcome = tokio::select! {
        result = &mut http => return result.map_err(ServerError::Http),
        reason = engine.stopped() => Err(ServerError::EngineStopped(reason)),
        _ = stop.cancelled() => Ok(()),
    };
    if outcome.is_ok() {
        // Validated by `timeouts` at start-up.
        let grace = Duration::try_from_secs_f64(config.graceful_termination_timeout_s).unwrap_or_default();
        // The server keeps accepting while it drains: new requests get their 503.
        tokio::select! {
            () = drain(&engine, grace) => {}
            result = &mut http => return result.map_err(ServerError::Http),
        }
    }
    // The engine first: what is still in flight after the grace fails with an error event its
    // client reads (a response cut by closing its connection would read as a network fault).
    engine_stop.cancel();
    http_stop.cancel();
    if tokio::time::timeout(HTTP_CLOSE_TIMEOUT, &mut http).await.is_err() {
        tracing::warn!("connections still open after {HTTP_CLOSE_TIMEOUT:?}; closing them");
    }
    outcome
}

/// Refuses new requests and waits up to `grace` for those in flight.
async fn drain(engine: &EngineHandle, grace: Duration) {
    tracing::info!(grace_s = grace.as_secs_f64(), "stopping: finishing the requests in flight");
    match tokio::time::timeout(grace, engine.drain()).await {
        Ok(()) => tracing::info!("every request finished"),
        Err(_) => tracing::warn!("requests still in flight after {grace:?} fail now"),
    }
}

/// The HTTP layer's limits: the flags where given, else what the model and the KV pool allow.
pub fn http_config(config: &RouterConfig, model: &ModelInfo) -> HttpConfig {
    let max_total_tokens = max_total_tokens(config, model) as usize;
    let max_input_tokens =
        config.max_input_tokens.map_or_else(|| max_total_tokens.saturating_sub(1), |tokens| tokens as usize);
    HttpConfig {
        max_concurrent_requests: config.max_concurrent_requests,
        max_best_of: config.max_best_of,
        max_stop_sequences: config.max_stop_sequences,
        max_top_n_tokens: config.max_top_n_tokens,
        max_input_tokens,
        max_total_tokens,
        max_client_batch_size: config.max_client_batch_size,
        disable_grammar_support: config.disable_grammar_support,
        grammar_unlisted_properties: config.grammar_unlisted_properties,
        reasoning_parser: config.reasoning_parser,
        tool_call_parser: config.tool_call_parser,
        allow_runtime_lora_updating: config.runtime_lora_updating(),
        lora_resolver_dir: config.lora_resolver_dir(),
        responses_store_bytes: config.responses_store_bytes,
        payload_limit: config.payload_limit,
        api_key: config.api_key.clone(),
        model_id: String::new(),
        cors_allow_origin: config.cors_allow_origin.clone(),
        compute_type: model.device_type.clone(),
        max_connections: config.max_connections,
        http_header_timeout: Duration::from_secs(config.http_header_timeout_s),
        http_idle_timeout: Duration::from_secs(config.http_idle_timeout_s),
        kv_event_sources: config.kv_events_config.as_ref().map(|events| events.sources()).unwrap_or_default(),
    }
}

/// Longest prompt + generation: the flag where given, else what the model and KV pool allow.
fn max_total_tokens(config: &RouterConfig, model: &ModelInfo) -> u32 {
    config.max_total_tokens.unwrap_or_else(|| model.max_sequence_tokens())
}

/// What the histogram buckets are derived from.
pub fn metric_limits(config: &RouterConfig, model: &ModelInfo, timeouts: &EngineTimeouts) -> MetricLimits {
    MetricLimits {
        ttft_objective_s: config.ttft_slo_ms / 1e3,
        tbt_objective_s: config.tbt_slo_ms / 1e3,
        // No prediction is longer than infinity: the longest deadline any step can get.
        step_deadline_s: timeouts.step_deadline(f64::INFINITY).as_secs_f64(),
        max_total_tokens: max_total_tokens(config, model),
        max_batch_tokens: config.max_batch_tokens,
        max_batch_requests: config.max_batch_requests,
    }
}

/// Connects to the shard, learns the model, warms it up, installs the metrics recorder (its
/// buckets need the limits the shard decides) and starts the engine task.
pub async fn start_engine(
    config: &RouterConfig,
    tracker: &TaskTracker,
    shutdown: &CancellationToken,
) -> Result<(EngineHandle, ModelInfo), ServerError> {
    let timeout = Duration::from_secs(config.shard_connect_timeout_s);
    tracing::info!(socket = %config.uds_path.display(), "connecting to the shard");
    let mut client = ShardClient::connect_uds(&config.uds_path, timeout).await?;
    let info = client.info().await?;
    tracing::info!(model = %info.model_id, architecture = %info.architecture, dtype = %info.dtype,
        device = %info.device_type, "shard info");
    let warmup = client.warmup(config.max_batch_tokens, config.max_batch_requests).await?;
    let scheduler = scheduler_config(config, &info, &warmup)?;
    tracing::info!(device_blocks = scheduler.num_device_blocks, host_blocks = scheduler.num_host_blocks,
        block_size = scheduler.block_size, policy = %scheduler.policy, "warm-up done");
    let mut model = ModelInfo::from_shard(&info, &warmup);
    model.num_device_blocks = scheduler.num_device_blocks;
    model.num_host_blocks = scheduler.num_host_blocks;
    let engine_timeouts = timeouts(config)?;
    // Before the engine starts, so that its series are described and none is recorded into the
    // no-op recorder `metrics` has until one is installed.
    install_recorder_with_limits(&metric_limits(config, &model, &engine_timeouts))?;
    let (admission, queue_timeout) = admission(config)?;
    let max_loras = config.max_loras.map(|max| max as usize);
    if let Some(max) = max_loras.filter(|&max| model.adapters.len() > max) {
        return Err(http::ConfigError::MaxLoras(model.adapters.len(), max).into());
    }
    let adapters = Arc::new(AdapterRegistry::bounded(model.adapters.clone(), max_loras));
    let kv_events = match config.kv_events_config.as_ref().filter(|events| events.publishes()) {
        Some(events) => Some(
            start_publisher(events, scheduler.block_size, adapters.clone(), tracker, shutdown.child_token()).await?,
        ),
        None => None,
    };
    let engine_config =
        EngineConfig { scheduler, eos_token_ids: info.eos_token_ids.clone(), timeouts: engine_timeouts,
            async_scheduling: config.async_scheduling, admission, queue_timeout, kv_events, adapters };
    let engine = spawn_engine(engine_config, client, tracker, shutdown.child_token())?;
    Ok((engine, model))
}

/// The scheduler's view: pool sizes from Warmup (capped by the flags), costs as measured.
pub fn scheduler_config(
    config: &RouterConfig,
    info: &pb::InfoResponse,
    warmup: &pb::WarmupResponse,
) -> Result<SchedulerConfig, ServerError> {
    let cap = |measured: u32, flag: Option<u32>| flag.map_or(measured, |flag| flag.min(measured));
    let num_device_blocks = cap(warmup.num_device_blocks, config.device_kv_blocks);
    if num_device_blocks == 0 {
        return Err(ServerError::NoKvBlocks { device: num_device_blocks });
    }
    // The default objectives obey the rule a request's own do (validation::MAX_SLO_MS).
    let in_range = |ms: f64| ms > 0.0 && ms <= crate::validation::MAX_SLO_MS;
    if !(in_range(config.ttft_slo_ms) && in_range(config.tbt_slo_ms)) {
        return Err(ServerError::Config(format!(
            "--ttft-slo-ms and --tbt-slo-ms must be > 0 and at most {} ms", crate::validation::MAX_SLO_MS
        )));
    }
    if !(config.tbt_slo_percentile > 0.0 && config.tbt_slo_percentile <= 100.0) {
        return Err(ServerError::Config("--tbt-slo-percentile must lie in (0, 100]".into()));
    }
    let cost_model = match warmup.cost_model.as_ref() {
        Some(measured) => cost_model(measured).map_err(|err| ServerError::Config(format!("the shard's warm-up cost model: {err}")))?,
        None => CostModel::default(),
    };
    Ok(SchedulerConfig {
        block_size: info.block_size,
        num_device_blocks,
        num_host_blocks: cap(warmup.num_host_blocks, config.host_kv_blocks),
        block_bytes: info.block_bytes,
        max_batch_tokens: config.max_batch_tokens,
        max_batch_requests: config.max_batch_requests,
        policy: policy(config.scheduler),
        default_slo: default_slo(config)?,
        cost_model,
        tbt_percentile: config.tbt_slo_percentile,
        rotasched: RotaSchedSettings { time_share: config.time_share, ..RotaSchedSettings::default() },
        ..SchedulerConfig::default()
    })
}

/// The server's default objectives: --ttft-slo-ms, --tbt-slo-ms and the stall bound
/// (--max-stall-ms, else `DEFAULT_STALL_FACTOR` times --tbt-slo-ms).
pub fn default_slo(config: &RouterConfig) -> Result<Slo, ServerError> {
    let slo = Slo::new(config.ttft_slo_ms / 1e3, config.tbt_slo_ms / 1e3);
    let Some(stall_ms) = config.max_stall_ms else { return Ok(slo) };
    if !(stall_ms.is_finite() && stall_ms >= config.tbt_slo_ms && stall_ms <= crate::validation::MAX_SLO_MS) {
        return Err(ServerError::Config(format!(
            "--max-stall-ms must be at least --tbt-slo-ms ({} ms) and at most {} ms, got {stall_ms}",
            config.tbt_slo_ms,
            crate::validation::MAX_SLO_MS
        )));
    }
    Ok(slo.with_max_stall(Some(stall_ms / 1e3)))
}

/// Admission and the queue time-out from the flags.
pub fn admission(config: &RouterConfig) -> Result<(Admission, Option<Duration>), ServerError> {
    let milliseconds = |name: &str, value: f64| {
        Duration::try_from_secs_f64(value / 1e3)
            .map_err(|_| ServerError::Config(format!("--{name} must be a number of milliseconds >= 0, got {value}")))
    };
    let slack = milliseconds("admission-slack-ms", config.admission_slack_ms)?;
    let admission = match config.admission {
        AdmissionKind::All => Admission::All,
        AdmissionKind::Slo => Admission::Slo { slack_s: slack.as_secs_f64() },
    };
    let queue_timeout = config.queue_timeout_ms.map(|ms| milliseconds("queue-timeout-ms", ms)).transpose()?;
    Ok((admission, queue_timeout))
}

/// The engine's deadlines from the flags.
pub fn timeouts(config: &RouterConfig) -> Result<EngineTimeouts, ServerError> {
    let seconds = |name: &str, value: f64| {
        Duration::try_from_secs_f64(value)
            .ok()
            .filter(|duration| !duration.is_zero())
            .ok_or_else(|| ServerError::Config(format!("--{name} must be a positive number of seconds, got {value}")))
    };
    let grace = config.graceful_termination_timeout_s;
    if Duration::try_from_secs_f64(grace).is_err() {
        return Err(ServerError::Config(format!("--graceful-termination-timeout-s must be >= 0 seconds, got {grace}")));
    }
    Ok(EngineTimeouts {
        step: config.step_timeout_s.map(|value| seconds("step-timeout-s", value)).transpose()?,
        recovery: seconds("shard-recovery-timeout-s", config.shard_recovery_timeout_s)?,
    })
}

fn policy(kind: SchedulerKind) -> PolicyKind {
    match kind {
        SchedulerKind::Fcfs => PolicyKind::Fcfs,
        SchedulerKind::Recompute => PolicyKind::Recompute,
        SchedulerKind::Swap => PolicyKind::Swap,
        SchedulerKind::Rotasched => PolicyKind::RotaSched,
    }
}

fn cost_model(measured: &pb::CostModel) -> Result<CostModel, SchedulerError> {
    Ok(CostModel {
        step_base_s: measured.step_base_s,
        per_prefill_token_s: measured.per_prefill_token_s,
        per_decode_request_s: measured.per_decode_request_s,
        per_context_token_s: measured.per_context_token_s,
        swap_out_bytes_per_s: measured.swap_out_bytes_per_s,
        swap_in_bytes_per_s: measured.swap_in_bytes_per_s,
        transfer_overhead_s: measured.transfer_overhead_s,
        duplex: measured.duplex,
        token_curve: measured.token_curve.as_ref().map_or(Ok(TokenCurve::NONE), |curve| {
            TokenCurve::new(&curve.tokens_s, &curve.decodes_s, curve.per_context_token_s)
        })?,
        correction: 1.0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(args: &[&str]) -> RouterConfig {
        let argv = std::iter::once("router").chain(args.iter().copied());
        RouterConfig::parse_argv(argv).unwrap()
    }

    #[test]
    fn pools_come_from_warmup_capped_by_flags() {
        let info = pb::InfoResponse { block_size: 16, block_bytes: 4096, ..Default::default() };
        let warmup = pb::WarmupResponse { num_device_blocks: 100, num_host_blocks: 50, cost_model: None };
        let scheduler = scheduler_config(&config(&["--device-kv-blocks", "40"]), &info, &warmup).unwrap();
        assert_eq!((scheduler.num_device_blocks, scheduler.num_host_blocks), (40, 50));
        assert_eq!(scheduler.policy, PolicyKind::RotaSched);
        let uncapped = scheduler_config(&config(&["--device-kv-blocks", "400", "--scheduler", "fcfs"]), &info, &warmup).unwrap();
        assert_eq!(uncapped.num_device_blocks, 100);
        assert_eq!(uncapped.policy, PolicyKind::Fcfs);
    }

    #[test]
    fn the_shards_token_curve_prices_steps_and_a_bad_one_is_refused() {
        let info = pb::InfoResponse { block_size: 16, block_bytes: 4096, ..Default::default() };
        let measured = |tokens_s: Vec<f64>| pb::WarmupResponse {
            num_device_blocks: 100,
            num_host_blocks: 50,
            cost_model: Some(pb::CostModel {
                step_base_s: 0.05,
                swap_out_bytes_per_s: 1e9,
                swap_in_bytes_per_s: 1e9,
                token_curve: Some(pb::TokenCurve { tokens_s, decodes_s: vec![0.001], per_context_token_s: 0.0 }),
                ..Default::default()
            }),
        };
        let scheduler = scheduler_config(&config(&[]), &info, &measured(vec![0.01, 0.03, 0.02])).unwrap();
        let three = superinfer_scheduler::StepShape { prefill_tokens: 3, decode_requests: 0, context_tokens: 3 };
        assert!((scheduler.cost_model.predict_step(three) - 0.02).abs() < 1e-12);
        for bad in [vec![0.01], vec![0.01, f64::NAN], vec![0.01, -0.02]] {
            let refused = scheduler_config(&config(&[]), &info, &measured(bad.clone()));
            assert!(matches!(refused, Err(ServerError::Config(_))), "{bad:?}");
        }
    }

    #[test]
    fn timeouts_come_from_the_flags_and_must_be_positive() {
        let defaults = timeouts(&config(&[])).unwrap();
        assert_eq!(defaults, EngineTimeouts::default());
        let set = timeouts(&config(&["--step-timeout-s", "2.5", "--shard-recovery-timeout-s", "9"])).unwrap();
        assert_eq!(set.step, Some(Duration::from_millis(2500)));
        assert_eq!(set.recovery, Duration::from_secs(9));
        for bad in [["--step-timeout-s=0"], ["--step-timeout-s=-1"], ["--shard-recovery-timeout-s=inf"],
            ["--graceful-termination-timeout-s=-5"]] {
            assert!(matches!(timeouts(&config(&bad)), Err(ServerError::Config(_))), "{bad:?}");
        }
    }

    #[test]
    fn metric_limits_come_from_the_flags_the_model_and_the_step_deadline() {
        let info = pb::InfoResponse { block_size: 16, max_position_embeddings: 8192, ..Default::default() };
        let warmup = pb::WarmupResponse { num_device_blocks: 1000, ..Default::default() };
        let model = ModelInfo::from_shard(&info, &warmup);
        let flags = config(&["--ttft-slo-ms", "500", "--tbt-slo-ms", "50", "--max-batch-requests", "32"]);
        let limits = metric_limits(&flags, &model, &timeouts(&flags).unwrap());
        assert_eq!((limits.ttft_objective_s, limits.tbt_objective_s), (0.5, 0.05));
        // The model and pool allow 8,192 tokens; the default deadline is at most 600 s.
        assert_eq!((limits.max_total_tokens, limits.max_batch_requests), (8192, 32));
        assert_eq!(limits.step_deadline_s, 600.0);
        let fixed = config(&["--step-timeout-s", "45", "--max-total-tokens", "4096"]);
        let limits = metric_limits(&fixed, &model, &timeouts(&fixed).unwrap());
        assert_eq!((limits.step_deadline_s, limits.max_total_tokens), (45.0, 4096));
    }

    #[test]
    fn default_objectives_obey_the_request_rule() {
        let info = pb::InfoResponse { block_size: 16, block_bytes: 4096, ..Default::default() };
        let warmup = pb::WarmupResponse { num_device_blocks: 100, num_host_blocks: 50, cost_model: None };
        for bad in [["--ttft-slo-ms", "1e30"], ["--tbt-slo-ms", "0"], ["--ttft-slo-ms", "inf"], ["--tbt-slo-ms", "NaN"]] {
            assert!(matches!(scheduler_config(&config(&bad), &info, &warmup), Err(ServerError::Config(_))), "{bad:?}");
        }
        assert!(scheduler_config(&config(&["--ttft-slo-ms", "3600000"]), &info, &warmup).is_ok());
    }

    #[test]
    fn an_empty_device_pool_is_an_error() {
        let info = pb::InfoResponse { block_size: 16, ..Default::default() };
        let warmup = pb::WarmupResponse::default();
        assert!(matches!(scheduler_config(&config(&[]), &info, &warmup), Err(ServerError::NoKvBlocks { .. })));
    }
}
