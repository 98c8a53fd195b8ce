//! Prometheus metrics: the process-wide recorder (installed once; the engine's gauges go to the
//! same one) and the per-request metrics, named as TGI's with the `superinfer_` prefix.
use std::sync::OnceLock;
use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

#[derive(Debug, Clone, thiserror::Error)]
pub enum MetricsError {
    #[error("the Prometheus recorder cannot be built: {0}")]
    Build(String),
    #[error("another metrics recorder is already installed in this process")]
    AlreadyInstalled,
}

/// Name of the engine's histogram of token lags (production time minus deadline, seconds).
pub const LAG_HISTOGRAM: &str = "superinfer_token_lag_seconds";
/// Lag buckets in seconds: negative is early, positive late, finer near the deadline.
pub const LAG_BUCKETS: [f64; 19] =
    [-5.0, -2.0, -1.0, -0.5, -0.2, -0.1, -0.05, -0.02, -0.01, 0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0];

/// The `metrics` crate allows one global recorder per process, so its handle is process-wide
/// too; kept here so that every HTTP app built in this process renders the same recorder.
static RECORDER: OnceLock<PrometheusHandle> = OnceLock::new();

/// Installs the Prometheus recorder on first use and returns the handle that renders it.
pub fn install_recorder() -> Result<PrometheusHandle, MetricsError> {
    if let Some(handle) = RECORDER.get() {
        return Ok(handle.clone());
    }
    // TGI's buckets: 35 geometric steps from 150 µs (×1.5) for durations, 1..1024 for sizes.
    let duration_buckets: Vec<f64> = (0..35).map(|n| 0.00015 * 1.5f64.powi(n)).collect();
    let token_buckets: Vec<f64> = (0..=10).map(|n| f64::from(1u32 << n)).collect();
    let recorder = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("duration".into()), &duration_buckets)
        .and_then(|builder| {
            builder.set_buckets_for_metric(Matcher::Suffix("tokens".into()), &token_buckets)
        })
        .and_then(|builder| {
            builder.set_buckets_for_metric(Matcher::Suffix("length".into()), &token_buckets)
        })
        .and_then(|builder| builder.set_buckets_for_metric(Matcher::Full(LAG_HISTOGRAM.into()), &LAG_BUCKETS))
        .map_err(|error| MetricsError::Build(error.to_string()))?
        .build_recorder();
    let handle = recorder.handle();
    // Two apps racing here: the loser's recorder is dropped and both use the winner's handle.
    match RECORDER.set(handle.clone()) {
        Ok(()) => {
            metrics::set_global_recorder(recorder).map_err(|_| MetricsError::AlreadyInstalled)?;
            Ok(handle)
        }
        Err(_) => RECORDER
            .get()
            .cloned()
            .ok_or(MetricsError::AlreadyInstalled),
    }
}

/// The Prometheus text exposition of every metric recorded so far.
pub fn render(handle: &PrometheusHandle) -> String {
    handle.run_upkeep();
    handle.render()
}

/// A request entered a generation route.
pub fn request_received() {
    metrics::counter!("superinfer_request_count").increment(1);
}

/// A request failed; `error_type` is `HttpError::error_type` (TGI's `err` label).
pub fn request_failed(error_type: &'static str) {
    metrics::counter!("superinfer_request_failure", "err" => error_type).increment(1);
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
    metrics::counter!("superinfer_request_success").increment(1);
    metrics::histogram!("superinfer_request_duration").record(figures.total.as_secs_f64());
    metrics::histogram!("superinfer_request_validation_duration")
        .record(figures.validation.as_secs_f64());
    metrics::histogram!("superinfer_request_queue_duration").record(figures.queue.as_secs_f64());
    metrics::histogram!("superinfer_request_inference_duration")
        .record(figures.inference.as_secs_f64());
    metrics::histogram!("superinfer_request_mean_time_per_token_duration")
        .record(figures.time_per_token().as_secs_f64());
    metrics::histogram!("superinfer_request_generated_tokens")
        .record(f64::from(figures.generated_tokens));
    metrics::histogram!("superinfer_request_input_length").record(f64::from(figures.input_length));
    metrics::histogram!("superinfer_request_max_new_tokens")
        .record(f64::from(figures.max_new_tokens));
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
        for name in [
            "superinfer_request_count",
            "superinfer_request_failure{err=\"validation\"}",
            "superinfer_request_success",
            "superinfer_request_duration_bucket",
            "superinfer_request_queue_duration_bucket",
            "superinfer_request_inference_duration_bucket",
            "superinfer_request_mean_time_per_token_duration_bucket",
            "superinfer_request_generated_tokens_bucket",
            "superinfer_request_input_length_bucket",
        ] {
            assert!(text.contains(name), "{name} missing from:\n{text}");
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
