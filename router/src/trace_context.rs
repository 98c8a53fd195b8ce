//! W3C trace context (`traceparent`, `tracestate`) across the router's process boundaries: read
//! from a client's HTTP headers so the router's spans continue the client's trace, and written
//! into the shard's gRPC metadata so the shard's spans continue the router's. One propagator
//! for both directions, so they speak the same format.
use axum::http::HeaderMap;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{SpanContext, TraceContextExt};
use opentelemetry::Context;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tonic::metadata::{MetadataKey, MetadataMap, MetadataValue};
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The caller's context in `headers`; an empty context when they carry none, or a malformed one.
pub fn extract(headers: &HeaderMap) -> Context {
    TraceContextPropagator::new().extract(&HeaderExtractor(headers))
}

/// Makes `span` a child of the caller's span when `headers` carry a valid `traceparent`;
/// otherwise `span` keeps its place (a new trace). Call before `span` is first entered.
pub fn set_remote_parent(span: &tracing::Span, headers: &HeaderMap) {
    let parent = extract(headers);
    if parent.span().span_context().is_valid() {
        // Fails only when traces are off (no OpenTelemetry layer) or the span is filtered
        // out: there is no trace to continue then.
        let _ = span.set_parent(parent);
    }
}

/// Writes `span`'s context into `metadata`; nothing when traces are off.
pub fn inject(span: &tracing::Span, metadata: &mut MetadataMap) {
    TraceContextPropagator::new().inject_context(&span.context(), &mut MetadataInjector(metadata));
}

/// `span`'s OpenTelemetry identity, to link other spans to it; invalid when traces are off.
pub fn span_context(span: &tracing::Span) -> SpanContext {
    span.context().span().span_context().clone()
}

struct HeaderExtractor<'a>(&'a HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|value| value.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|name| name.as_str()).collect()
    }
}

struct MetadataInjector<'a>(&'a mut MetadataMap);

impl Injector for MetadataInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        // The propagator writes lower-case ASCII names and printable values; anything else
        // would be a bug there, and dropping it only loses the trace, never the call.
        if let (Ok(key), Ok(value)) = (MetadataKey::from_bytes(key.as_bytes()), MetadataValue::try_from(value)) {
            self.0.insert(key, value);
        }
    }
}

#[cfg(test)]
mod tests {
    use opentelemetry::trace::{SpanId, TraceFlags, TraceId, TracerProvider as _};
    use opentelemetry_sdk::trace::SdkTracerProvider;
    use tracing_subscriber::layer::SubscriberExt;

    use super::*;

    const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    fn headers(traceparent: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert("traceparent", traceparent.parse().unwrap());
        headers
    }

    /// Runs `body` under a subscriber that records spans in OpenTelemetry (no exporter).
    fn with_otel<T>(body: impl FnOnce() -> T) -> T {
        let provider = SdkTracerProvider::builder().build();
        let subscriber =
            tracing_subscriber::registry().with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
        tracing::subscriber::with_default(subscriber, body)
    }

    #[test]
    fn extracts_the_callers_span() {
        let context = extract(&headers(TRACEPARENT));
        let span = context.span();
        let caller = span.span_context();
        assert!(caller.is_valid() && caller.is_remote() && caller.is_sampled());
        assert_eq!(caller.trace_id(), TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap());
        assert_eq!(caller.span_id(), SpanId::from_hex("00f067aa0ba902b7").unwrap());
    }

    #[test]
    fn a_malformed_or_missing_traceparent_is_no_parent() {
        for bad in ["00-zz-00f067aa0ba902b7-01", "00-00000000000000000000000000000000-00f067aa0ba902b7-01", "garbage"] {
            assert!(!extract(&headers(bad)).span().span_context().is_valid(), "{bad}");
        }
        assert!(!extract(&HeaderMap::new()).span().span_context().is_valid());
    }

    #[test]
    fn the_shard_gets_the_http_spans_trace() {
        let (span_context, metadata) = with_otel(|| {
            let span = tracing::info_span!("http_request");
            set_remote_parent(&span, &headers(TRACEPARENT));
            let mut metadata = MetadataMap::new();
            inject(&span, &mut metadata);
            (span_context(&span), metadata)
        });
        // The span continues the caller's trace under a span id of its own.
        assert_eq!(span_context.trace_id(), TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap());
        assert_ne!(span_context.span_id(), SpanId::from_hex("00f067aa0ba902b7").unwrap());
        assert_eq!(span_context.trace_flags(), TraceFlags::SAMPLED);
        let sent = metadata.get("traceparent").expect("traceparent in the metadata").to_str().unwrap();
        assert_eq!(sent, format!("00-4bf92f3577b34da6a3ce929d0e0e4736-{}-01", span_context.span_id()));
    }

    #[test]
    fn without_a_traceparent_the_span_starts_a_trace() {
        let span_context = with_otel(|| {
            let span = tracing::info_span!("http_request");
            set_remote_parent(&span, &HeaderMap::new());
            span_context(&span)
        });
        assert!(span_context.is_valid());
        assert_ne!(span_context.trace_id(), TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap());
    }

    #[test]
    fn nothing_is_sent_when_traces_are_off() {
        let span = tracing::info_span!("http_request");
        set_remote_parent(&span, &headers(TRACEPARENT));
        let mut metadata = MetadataMap::new();
        inject(&span, &mut metadata);
        assert!(metadata.is_empty());
        assert!(!span_context(&span).is_valid());
    }
}
