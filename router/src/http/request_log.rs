//! A generation request's outcome, recorded once: in the metrics, and as one INFO line with
//! its timings, token counts and engine request ids, as TGI logs (`Success`, or `Failure`
//! with the error). A request dropped without an outcome — its client went away, its handler
//! was cancelled — records `Dropped` when the `RequestLog` is dropped, so every request the
//! metrics count as received ends in exactly one line.
use std::fmt;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::generation::GenerationOutput;
use super::request::ValidRequest;
use crate::engine::api::SamplingParams;
use crate::engine::RequestStream;
use crate::error::HttpError;
use crate::metrics::{self, RequestFigures};

/// One request on one route (an OpenAI stream's choices are one each, as in the metrics).
pub(crate) struct RequestLog {
    route: &'static str,
    arrival: Instant,
    progress: Mutex<Progress>,
}

/// What is known so far; behind a mutex because the prompts of a batch (and `best_of`
/// candidates) are submitted from concurrent futures that share the log.
#[derive(Default)]
struct Progress {
    request_ids: Vec<u64>,
    /// The first submitted request's prompt length and sampling parameters.
    submitted: Option<(u32, SamplingParams)>,
    finished: bool,
}

impl RequestLog {
    /// A request arrived on `route` (counted in the metrics).
    pub fn start(route: &'static str, arrival: Instant) -> Self {
        metrics::request_received();
        Self {
            route,
            arrival,
            progress: Mutex::new(Progress::default()),
        }
    }

    pub fn arrival(&self) -> Instant {
        self.arrival
    }

    /// The engine accepted `valid` as `stream` (several times for `best_of` or a batch).
    pub fn submitted(&self, valid: &ValidRequest, stream: &RequestStream) {
        let mut progress = self.progress();
        progress.request_ids.push(stream.id());
        progress.submitted.get_or_insert_with(|| {
            (
                valid.prompt_ids.len() as u32,
                valid.parameters.sampling.clone(),
            )
        });
    }

    /// Records the success of `output` (metrics, the handler span's TGI fields, the log line)
    /// and returns its figures for the response headers.
    pub fn succeeded(&self, output: &GenerationOutput, max_new_tokens: u32) -> RequestFigures {
        let figures = figures(output, max_new_tokens);
        let mut progress = self.progress();
        if std::mem::replace(&mut progress.finished, true) {
            return figures;
        }
        metrics::request_succeeded(&figures);
        record_in_span(&figures, output.seed);
        tracing::info!(
            request_id = %RequestIds(&progress.request_ids),
            route = self.route,
            total_time = ?figures.total,
            validation_time = ?figures.validation,
            queue_time = ?figures.queue,
            inference_time = ?figures.inference,
            time_per_token = ?figures.time_per_token(),
            input_length = figures.input_length,
            generated_tokens = figures.generated_tokens,
            max_new_tokens,
            finish_reason = ?output.finish_reason,
            seed = ?output.seed,
            parameters = %Parameters(progress.submitted.as_ref().map(|(_, sampling)| sampling)),
            "Success"
        );
        figures
    }

    /// Records the failure (metrics and the log line).
    pub fn failed(&self, error: &HttpError) {
        self.end(error.error_type(), &error.to_string(), Some(error.status().as_u16()), "Failure");
    }

    /// `status`: the response's, when the request got one (a client that went away did not).
    fn end(&self, error_type: &'static str, error: &str, status: Option<u16>, message: &str) {
        let mut progress = self.progress();
        if std::mem::replace(&mut progress.finished, true) {
            return;
        }
        metrics::request_failed(error_type);
        tracing::info!(
            request_id = %RequestIds(&progress.request_ids),
            route = self.route,
            error_type,
            error,
            status,
            total_time = ?self.arrival.elapsed(),
            input_length = progress.submitted.as_ref().map(|(length, _)| *length),
            "{message}"
        );
    }

    fn progress(&self) -> std::sync::MutexGuard<'_, Progress> {
        self.progress.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for RequestLog {
    fn drop(&mut self) {
        self.end(
            "dropped",
            "the request ended before its response did (the client went away)",
            None,
            "Dropped",
        );
    }
}

/// The engine's ids of a request's generations: `-` before any was submitted, comma-separated
/// for `best_of` candidates and batches.
struct RequestIds<'a>(&'a [u64]);

impl fmt::Display for RequestIds<'_> {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return formatter.write_str("-");
        }
        for (position, id) in self.0.iter().enumerate() {
            if position > 0 {
                formatter.write_str(",")?;
            }
            write!(formatter, "{id}")?;
        }
        Ok(())
    }
}

/// The sampling parameters as Debug shows them, `-` when none were submitted.
struct Parameters<'a>(Option<&'a SamplingParams>);

impl fmt::Display for Parameters<'_> {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(sampling) => write!(formatter, "{sampling:?}"),
            None => formatter.write_str("-"),
        }
    }
}

/// TGI's figures of a finished generation, measured from its arrival until now.
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

/// TGI's handler span fields; a span that does not declare them ignores the values.
fn record_in_span(figures: &RequestFigures, seed: Option<u64>) {
    let span = tracing::Span::current();
    let record =
        |name: &str, duration: Duration| span.record(name, tracing::field::debug(duration));
    record("total_time", figures.total);
    record("validation_time", figures.validation);
    record("queue_time", figures.queue);
    record("inference_time", figures.inference);
    record("time_per_token", figures.time_per_token());
    if let Some(seed) = seed {
        span.record("seed", seed);
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::io::Write;
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    use serde_json::Value;
    use tracing::subscriber::DefaultGuard;

    use super::RequestLog;
    use crate::error::HttpError;
    use crate::http::generation::{GenerationOutput, Timings};
    use crate::http::types::FinishReason;
    use crate::validation::ValidationError;

    /// The JSON lines logged on this thread (the tasks of a current-thread runtime included)
    /// while it is held.
    pub(crate) struct CapturedLogs {
        buffer: Arc<Mutex<Vec<u8>>>,
        _guard: DefaultGuard,
    }

    struct Writer(Arc<Mutex<Vec<u8>>>);

    impl Write for Writer {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl CapturedLogs {
        pub fn install() -> Self {
            let buffer = Arc::new(Mutex::new(Vec::new()));
            let writer = buffer.clone();
            let subscriber = tracing_subscriber::fmt()
                .json()
                .flatten_event(true)
                .with_writer(move || Writer(writer.clone()))
                .finish();
            let _guard = tracing::subscriber::set_default(subscriber);
            Self { buffer, _guard }
        }

        /// The request lines (`Success`, `Failure`, `Dropped`) in the order they were logged.
        pub fn request_lines(&self) -> Vec<Value> {
            let text = String::from_utf8(self.buffer.lock().unwrap().clone()).unwrap();
            text.lines()
                .map(|line| serde_json::from_str::<Value>(line).unwrap())
                .filter(|line| {
                    matches!(
                        line["message"].as_str(),
                        Some("Success" | "Failure" | "Dropped")
                    )
                })
                .collect()
        }
    }

    fn output(generated_tokens: u32) -> GenerationOutput {
        let arrival = Instant::now() - Duration::from_millis(40);
        GenerationOutput {
            generated_text: "Hello".into(),
            finish_reason: FinishReason::Length,
            generated_tokens,
            seed: Some(7),
            prefill: Vec::new(),
            prefill_top_tokens: Vec::new(),
            tokens: Vec::new(),
            top_tokens: Vec::new(),
            input_length: 5,
            cached_tokens: 0,
            timings: Timings {
                arrival,
                validated: arrival + Duration::from_millis(1),
                first_scheduled: arrival + Duration::from_millis(11),
                finished: arrival + Duration::from_millis(31),
            },
        }
    }

    #[test]
    fn a_success_logs_tgis_timings_and_token_counts_once() {
        let logs = CapturedLogs::install();
        let log = RequestLog::start("/generate", Instant::now());
        let figures = log.succeeded(&output(4), 16);
        assert_eq!(figures.generated_tokens, 4);
        log.failed(&HttpError::Incomplete); // an outcome is recorded once
        drop(log);
        let lines = logs.request_lines();
        assert_eq!(lines.len(), 1, "{lines:?}");
        let line = &lines[0];
        assert_eq!(line["message"], "Success");
        assert_eq!(line["level"], "INFO");
        assert_eq!(line["route"], "/generate");
        assert_eq!(line["request_id"], "-");
        assert_eq!(line["queue_time"], "10ms");
        assert_eq!(line["inference_time"], "20ms");
        assert_eq!(line["time_per_token"], "5ms");
        assert_eq!(line["validation_time"], "1ms");
        assert!(
            line["total_time"].as_str().unwrap().ends_with("ms"),
            "{line}"
        );
        assert_eq!(line["input_length"], 5);
        assert_eq!(line["generated_tokens"], 4);
        assert_eq!(line["max_new_tokens"], 16);
        assert_eq!(line["seed"], "Some(7)");
        assert_eq!(line["finish_reason"], "Length");
    }

    #[test]
    fn a_failure_logs_its_error_type_and_a_dropped_request_says_so() {
        let logs = CapturedLogs::install();
        let failed = RequestLog::start("/v1/completions", Instant::now());
        failed.failed(&ValidationError::EmptyInput.into());
        drop(failed);
        drop(RequestLog::start("/generate_stream", Instant::now()));
        let lines = logs.request_lines();
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert_eq!(lines[0]["message"], "Failure");
        assert_eq!(lines[0]["route"], "/v1/completions");
        assert_eq!(lines[0]["error_type"], "validation");
        assert_eq!(lines[0]["status"], 422);
        assert!(lines[1].get("status").is_none(), "{}", lines[1]);
        assert!(
            lines[0]["error"]
                .as_str()
                .unwrap()
                .starts_with("Input validation error"),
            "{}",
            lines[0]
        );
        assert_eq!(lines[1]["message"], "Dropped");
        assert_eq!(lines[1]["route"], "/generate_stream");
        assert_eq!(lines[1]["error_type"], "dropped");
    }
}
