//! Prometheus metrics: the process-wide recorder (installed once, at start-up, with buckets
//! derived from the server's limits; the engine's series go to the same one) and the
//! per-request metrics. Request series are exported twice, as `superinfer_*` and under TGI's
//! `tgi_*` names, so that TGI's Grafana dashboard reads this server unchanged. Every series is
//! listed in docs/metrics.md.
//! - `buckets`: the buckets of every histogram, from `MetricLimits`.
mod buckets;

use std::sync::OnceLock;
use std::time::Duration;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

pub use buckets::MetricLimits;

#[derive(Debug, Clone, thiserror::Error)]
pub enum MetricsError {
    #[error("the Prometheus recorder cannot be built: {0}")]
    Build(String),
    #[error("another metrics recorder is already installed in this process")]
    AlreadyInstalled,
}

/// Prefixes of the request series: ours, and TGI's for its dashboard.
pub const PREFIXES: [&str; 2] = ["superinfer", "tgi"];

/// Time from a request's arrival to its first token, as the engine saw it produced (seconds).
pub const TTFT_HISTOGRAM: &str = "superinfer_time_to_first_token_seconds";
/// Time between consecutive tokens of one request (seconds).
pub const ITL_HISTOGRAM: &str = "superinfer_inter_token_latency_seconds";
/// vLLM's names of the request latencies (`engine::vllm_metrics`), read by routers and
/// autoscalers written for vLLM: time to first token, between tokens (and vLLM's older name of
/// it), arrival to last token, arrival to first step (seconds).
pub const VLLM_TTFT_HISTOGRAM: &str = "vllm:time_to_first_token_seconds";
pub const VLLM_ITL_HISTOGRAM: &str = "vllm:inter_token_latency_seconds";
pub const VLLM_TPOT_HISTOGRAM: &str = "vllm:time_per_output_token_seconds";
pub const VLLM_E2E_HISTOGRAM: &str = "vllm:e2e_request_latency_seconds";
pub const VLLM_QUEUE_HISTOGRAM: &str = "vllm:request_queue_time_seconds";
/// Name of the engine's histogram of token lags (production time minus deadline, seconds).
pub const LAG_HISTOGRAM: &str = "superinfer_token_lag_seconds";
/// Requests per step.
pub const BATCH_SIZE_HISTOGRAM: &str = "superinfer_batch_size";
/// Tokens per step.
pub const BATCH_TOKENS_HISTOGRAM: &str = "superinfer_batch_tokens";
/// Time to compute one constrained request's allowed-token mask for one step (seconds).
pub const GRAMMAR_MASK_HISTOGRAM: &str = "superinfer_grammar_mask_seconds";
/// Time a step's engine turn spent computing every constrained request's mask (seconds).
pub const GRAMMAR_STEP_MASK_HISTOGRAM: &str = "superinfer_grammar_step_mask_seconds";
/// TGI's size of each new batch: here the requests a step admits for the first time.
pub const TGI_BATCH_NEXT_SIZE_HISTOGRAM: &str = "tgi_batch_next_size";
/// Lag buckets in seconds: negative is early, positive late, finer near the deadline.
pub const LAG_BUCKETS: [f64; 19] =
    [-5.0, -2.0, -1.0, -0.5, -0.2, -0.1, -0.05, -0.02, -0.01, 0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0];

/// The `metrics` crate allows one global recorder per process, so its handle is process-wide
/// too; kept here so that every HTTP app built in this process renders the same recorder.
static RECORDER: OnceLock<PrometheusHandle> = OnceLock::new();

/// A Prometheus builder with every histogram's buckets (tests build local recorders from it).
pub fn prometheus_builder(limits: &MetricLimits) -> Result<PrometheusBuilder, MetricsError> {
    buckets::histogram_buckets(limits).into_iter().try_fold(PrometheusBuilder::new(), |builder, (matcher, buckets)| {
        builder.set_buckets_for_metric(matcher, &buckets).map_err(|error| MetricsError::Build(error.to_string()))
    })
}

/// Installs the process's recorder with buckets for `limits` and returns the handle that
/// renders it. Start-up calls this before the engine starts; the first installation holds for
/// the process, later calls return its handle.
pub fn install_recorder_with_limits(limits: &MetricLimits) -> Result<PrometheusHandle, MetricsError> {
    if let Some(handle) = RECORDER.get() {
        return Ok(handle.clone());
    }
    let recorder = prometheus_builder(limits)?.build_recorder();
    let handle = recorder.handle();
    // Two apps racing here: the loser's recorder is dropped and both use the winner's handle.
    match RECORDER.set(handle.clone()) {
        Ok(()) => {
            metrics::set_global_recorder(recorder).map_err(|_| MetricsError::AlreadyInstalled)?;
            describe();
            Ok(handle)
        }
        Err(_) => RECORDER
            .get()
            .cloned()
            .ok_or(MetricsError::AlreadyInstalled),
    }
}

/// The process's recorder: the one start-up installed, else one with default limits (apps
/// built without `server::run`, i.e. tests).
pub fn install_recorder() -> Result<PrometheusHandle, MetricsError> {
    install_recorder_with_limits(&MetricLimits::default())
}

/// Describes the request series and starts their counters at 0 (a counter that appears only
/// when it first moves has no rate until then; TGI's dashboard counts replicas by
/// `tgi_request_count`).
fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_gauge!("superinfer_http_connections", Unit::Count, "Open HTTP connections");
    describe_counter!("superinfer_http_connections_refused", Unit::Count,
        "Connections closed at once because --max-connections were open");
    for prefix in PREFIXES {
        for counter in ["request_count", "request_success"] {
            metrics::counter!(format!("{prefix}_{counter}")).increment(0);
        }
        describe_counter!(format!("{prefix}_request_count"), "Requests received on a generation route");
        describe_counter!(format!("{prefix}_request_success"), "Requests that finished generating");
        describe_counter!(format!("{prefix}_request_failure"), "Requests that failed, by error type (err)");
        describe_histogram!(format!("{prefix}_request_duration"), Unit::Seconds,
            "Time from arrival to the end of the request");
        describe_histogram!(format!("{prefix}_request_validation_duration"), Unit::Seconds,
            "Time spent validating and tokenizing the request");
        describe_histogram!(format!("{prefix}_request_queue_duration"), Unit::Seconds,
            "Time from validation to the request's first step");
        describe_histogram!(format!("{prefix}_request_inference_duration"), Unit::Seconds,
            "Time from the request's first step to its last token");
        describe_histogram!(format!("{prefix}_request_mean_time_per_token_duration"), Unit::Seconds,
            "Inference time divided by generated tokens, per request");
        describe_histogram!(format!("{prefix}_request_input_length"), Unit::Count, "Prompt tokens per request");
        describe_histogram!(format!("{prefix}_request_generated_tokens"), Unit::Count,
            "Generated tokens per request");
        describe_histogram!(format!("{prefix}_request_max_new_tokens"), Unit::Count,
            "Token limit (max_new_tokens) per request");
    }
}

/// The Prometheus text exposition of every metric recorded so far.
pub fn render(handle: &PrometheusHandle) -> String {
    handle.run_upkeep();
    handle.render()
}

/// A request entered a generation route.
pub fn request_received() {
    for prefix in PREFIXES {
        metrics::counter!(format!("{prefix}_request_count")).increment(1);
    }
}

/// A request failed; `error_type` is `HttpError::error_type` (TGI's `err` label).
pub fn request_failed(error_type: &'static str) {
    for prefix in PREFIXES {
        metrics::counter!(format!("{prefix}_request_failure"), "err" => error_type).increment(1);
    }
}

/// An HTTP connection was accepted (gauge of open connections).
pub fn connection_opened() {
    metrics::gauge!("superinfer_http_connections").increment(1.0);
}

/// An accepted HTTP connection was closed.
pub fn connection_closed() {
    metrics::gauge!("superinfer_http_connections").decrement(1.0);
}

/// A connection was closed at once because `--max-connections` were open.
pub fn connection_refused() {
    metrics::counter!("superinfer_http_connections_refused").increment(1);
}

/// Figures of one successful generation, for the success metrics.
#[derive(Debug, Clone, Copy)]
pub struct RequestFigures {
    pub total: Duration,
    pub validation: Duration,
    pub queue: Duration,
    pub inference: Duration,
    pub input_length: u32,
    pub generated_tokens: u32,
    pub max_new_tokens: u32,
}

impl RequestFigures {
    pub fn time_per_token(&self) -> Duration {
        self.inference / self.generated_tokens.max(1)
    }
}

pub fn request_succeeded(figures: &RequestFigures) {
    for prefix in PREFIXES {
        metrics::counter!(format!("{prefix}_request_success")).increment(1);
        let seconds = [
            ("request_duration", figures.total),
            ("request_validation_duration", figures.validation),
            ("request_queue_duration", figures.queue),
            ("request_inference_duration", figures.inference),
            ("request_mean_time_per_token_duration", figures.time_per_token()),
        ];
        for (name, duration) in seconds {
            metrics::histogram!(format!("{prefix}_{name}")).record(duration.as_secs_f64());
        }
        let counts = [
            ("request_generated_tokens", figures.generated_tokens),
            ("request_input_length", figures.input_length),
            ("request_max_new_tokens", figures.max_new_tokens),
        ];
        for (name, count) in counts {
            metrics::histogram!(format!("{prefix}_{name}")).record(f64::from(count));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recorded_request_metrics_are_rendered_with_the_prefix() {
        let handle = install_recorder().unwrap();
        // A second install in the same process returns the same recorder.
        assert!(install_recorder().is_ok());
        request_received();
        request_failed("validation");
        request_succeeded(&RequestFigures {
            total: Duration::from_millis(30),
            validation: Duration::from_millis(1),
            queue: Duration::from_millis(4),
            inference: Duration::from_millis(25),
            input_length: 7,
            generated_tokens: 5,
            max_new_tokens: 10,
        });
        let text = render(&handle);
        for prefix in PREFIXES {
            for name in [
                "request_count",
                "request_failure{err=\"validation\"}",
                "request_success",
                "request_duration_bucket",
                "request_validation_duration_bucket",
                "request_queue_duration_bucket",
                "request_inference_duration_bucket",
                "request_mean_time_per_token_duration_bucket",
                "request_generated_tokens_bucket",
                "request_input_length_bucket",
                "request_max_new_tokens_bucket",
            ] {
                let series = format!("{prefix}_{name}");
                assert!(text.contains(&series), "{series} missing from:\n{text}");
            }
            // Installing describes the series.
            assert!(text.contains(&format!("# HELP {prefix}_request_duration ")), "{text}");
        }
    }

    #[test]
    fn time_per_token_divides_inference_time() {
        let figures = RequestFigures {
            total: Duration::ZERO,
            validation: Duration::ZERO,
            queue: Duration::ZERO,
            inference: Duration::from_millis(100),
            input_length: 1,
            generated_tokens: 4,
            max_new_tokens: 4,
        };
        assert_eq!(figures.time_per_token(), Duration::from_millis(25));
    }
}
