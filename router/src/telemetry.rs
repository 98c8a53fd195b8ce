//! Logging and tracing: a `tracing` subscriber (text or JSON lines) plus, when an OTLP endpoint
//! is configured, an OpenTelemetry exporter so spans reach a collector.
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("invalid log filter {filter:?}: {message}")]
    Filter { filter: String, message: String },
    #[error("cannot build the OTLP exporter: {0}")]
    Exporter(String),
}

/// What the subscriber needs from the configuration.
pub struct TelemetryConfig<'a> {
    pub log_level: &'a str,
    pub json_output: bool,
    pub otlp_endpoint: Option<&'a str>,
    pub otlp_service_name: &'a str,
}

/// Flushes and stops the span exporter when dropped (at the end of `serve`).
pub struct TelemetryGuard {
    provider: Option<SdkTracerProvider>,
}

impl Drop for TelemetryGuard {
    fn drop(&mut self) {
        if let Some(provider) = self.provider.take() {
            if let Err(error) = provider.shutdown() {
                eprintln!("OTLP exporter shutdown: {error}");
            }
        }
    }
}

/// Installs the global subscriber. A second call in the same process keeps the first
/// subscriber (tracing allows one) and only returns a guard.
pub fn init(config: &TelemetryConfig<'_>) -> Result<TelemetryGuard, TelemetryError> {
    let filter = EnvFilter::try_new(config.log_level).map_err(|error| TelemetryError::Filter {
        filter: config.log_level.to_string(),
        message: error.to_string(),
    })?;
    let fmt_layer = if config.json_output {
        tracing_subscriber::fmt::layer().json().flatten_event(true).boxed()
    } else {
        tracing_subscriber::fmt::layer().with_target(false).boxed()
    };
    let provider = config.otlp_endpoint.map(|endpoint| exporter(endpoint, config.otlp_service_name)).transpose()?;
    let otel_layer = provider
        .as_ref()
        .map(|provider| tracing_opentelemetry::layer().with_tracer(provider.tracer("superinfer-router")));
    let installed = tracing_subscriber::registry().with(filter).with(fmt_layer).with(otel_layer).try_init();
    if installed.is_err() {
        tracing::debug!("a tracing subscriber was already installed");
    }
    Ok(TelemetryGuard { provider })
}

fn exporter(endpoint: &str, service_name: &str) -> Result<SdkTracerProvider, TelemetryError> {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint)
        .build()
        .map_err(|error| TelemetryError::Exporter(error.to_string()))?;
    let resource = Resource::builder().with_service_name(service_name.to_string()).build();
    Ok(SdkTracerProvider::builder().with_batch_exporter(exporter).with_resource(resource).build())
}
