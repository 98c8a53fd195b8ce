//! TGI's response headers: of a finished generation, or of a stream (sent before its end).
use axum::http::{HeaderMap, HeaderName, HeaderValue};

use super::generation::GenerationOutput;
use crate::metrics::RequestFigures;

/// TGI's x-* headers of a non-streamed response (`figures`: from `RequestLog::succeeded`).
pub(crate) fn finished_headers(
    figures: &RequestFigures,
    output: &GenerationOutput,
    compute_type: &str,
    compute_characters: usize,
) -> HeaderMap {
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
