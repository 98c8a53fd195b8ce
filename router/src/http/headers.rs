//! TGI's response headers and the success metrics, both computed from a finished generation.
use std::time::Instant;

use axum::http::{HeaderMap, HeaderName, HeaderValue};

use super::generation::GenerationOutput;
use crate::metrics::{self, RequestFigures};

pub(crate) fn figures(output: &GenerationOutput, max_new_tokens: u32) -> RequestFigures {
    let timings = &output.timings;
    RequestFigures {
        total: Instant::now().saturating_duration_since(timings.arrival),
        validation: timings.validated.saturating_duration_since(timings.arrival),
        queue: timings
            .first_scheduled
            .saturating_duration_since(timings.validated),
        inference: timings
            .finished
            .saturating_duration_since(timings.first_scheduled),
        input_length: output.input_length,
        generated_tokens: output.generated_tokens,
        max_new_tokens,
    }
}

/// Records the success metrics and returns TGI's x-* headers of a non-streamed response.
pub(crate) fn finished_headers(
    output: &GenerationOutput,
    max_new_tokens: u32,
    compute_type: &str,
    compute_characters: usize,
) -> HeaderMap {
    let figures = figures(output, max_new_tokens);
    metrics::request_succeeded(&figures);
    record_in_span(&figures, output.seed);
    let mut headers = HeaderMap::new();
    let mut insert = |name: &'static str, value: String| {
        if let Ok(value) = HeaderValue::from_str(&value) {
            headers.insert(HeaderName::from_static(name), value);
        }
    };
    insert("x-compute-type", compute_type.to_string());
    insert("x-compute-time", figures.total.as_secs_f64().to_string());
    insert("x-compute-characters", compute_characters.to_string());
    insert("x-total-time", figures.total.as_millis().to_string());
    insert(
        "x-validation-time",
        figures.validation.as_millis().to_string(),
    );
    insert("x-queue-time", figures.queue.as_millis().to_string());
    insert(
        "x-inference-time",
        figures.inference.as_millis().to_string(),
    );
    insert(
        "x-time-per-token",
        figures.time_per_token().as_millis().to_string(),
    );
    insert("x-prompt-tokens", output.input_length.to_string());
    insert("x-generated-tokens", output.generated_tokens.to_string());
    headers
}

/// TGI's handler span fields; a span that does not declare them ignores the values.
pub(crate) fn record_in_span(figures: &RequestFigures, seed: Option<u64>) {
    let span = tracing::Span::current();
    span.record("total_time", tracing::field::debug(figures.total));
    span.record("validation_time", tracing::field::debug(figures.validation));
    span.record("queue_time", tracing::field::debug(figures.queue));
    span.record("inference_time", tracing::field::debug(figures.inference));
    span.record(
        "time_per_token",
        tracing::field::debug(figures.time_per_token()),
    );
    if let Some(seed) = seed {
        span.record("seed", seed);
    }
}

/// The headers of a streamed response (sent before the outcome is known).
pub(crate) fn stream_headers(compute_type: &str, compute_characters: usize) -> HeaderMap {
    let mut headers = HeaderMap::new();
    if let Ok(value) = HeaderValue::from_str(compute_type) {
        headers.insert(HeaderName::from_static("x-compute-type"), value);
    }
    headers.insert(
        HeaderName::from_static("x-compute-characters"),
        HeaderValue::from(compute_characters),
    );
    headers.insert(
        HeaderName::from_static("x-accel-buffering"),
        HeaderValue::from_static("no"),
    );
    headers
}
