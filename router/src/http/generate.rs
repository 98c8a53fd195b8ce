//! TGI's generation routes: `POST /generate`, `/generate_stream`, `/` (compat) and
//! `/chat_tokenize` (`/tokenize` is `tokenize`'s, in TGI's shape and vLLM's).
use std::sync::Arc;
use std::time::Instant;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::future::try_join_all;
use tracing::Instrument;

use super::extract::JsonBody;
use super::generation::{Generation, GenerationEvent, GenerationOutput};
use super::headers::{finished_headers, stream_headers};
use super::openai::prepare_chat;
use super::openai_types::ChatRequest;
use super::request::{acquire_permit, validate_request, ValidRequest};
use super::request_log::RequestLog;
use super::sse::{sse_response, ErrorsBeforeOpen, EventSender};
use super::state::AppState;
use super::types::{
    BestOfSequence, ChatTokenizeResponse, CompatGenerateRequest, Details, GenerateRequest,
    GenerateResponse, SimpleToken, StreamDetails, StreamResponse,
};
use crate::error::{ErrorBody, HttpError};
use crate::validation::validate_stream;

/// Generate tokens.
#[utoipa::path(post, path = "/generate", tag = "Text Generation Inference",
    request_body = GenerateRequest,
    responses((status = 200, body = GenerateResponse),
        (status = 422, body = ErrorBody), (status = 424, body = ErrorBody),
        (status = 429, body = ErrorBody)))]
#[tracing::instrument(
    skip_all,
    fields(
        total_time,
        validation_time,
        queue_time,
        inference_time,
        time_per_token,
        seed
    )
)]
pub(crate) async fn generate(
    State(state): State<Arc<AppState>>,
    JsonBody(request): JsonBody<GenerateRequest>,
) -> Result<(HeaderMap, Json<GenerateResponse>), HttpError> {
    let log = RequestLog::start("/generate", Instant::now());
    generate_response(&state, request, &log)
        .await
        .map(|(headers, response)| (headers, Json(response)))
}

/// Generate a stream of tokens as server-sent events.
#[utoipa::path(post, path = "/generate_stream", tag = "Text Generation Inference",
    request_body = GenerateRequest,
    responses((status = 200, description = "`data:` events", body = StreamResponse,
        content_type = "text/event-stream")))]
#[tracing::instrument(skip_all)]
pub(crate) async fn generate_stream(
    State(state): State<Arc<AppState>>,
    JsonBody(request): JsonBody<GenerateRequest>,
) -> Response {
    stream_response(state, request, "/generate_stream", Instant::now()).await
}

/// TGI's compat route: `stream` chooses; the non-streamed answer is a one-element array.
#[utoipa::path(post, path = "/", tag = "Text Generation Inference",
    request_body = CompatGenerateRequest,
    responses((status = 200, body = [GenerateResponse]), (status = 422, body = ErrorBody)))]
#[tracing::instrument(
    skip_all,
    fields(
        stream = request.stream,
        total_time,
        validation_time,
        queue_time,
        inference_time,
        time_per_token,
        seed
    )
)]
pub(crate) async fn compat_generate(
    State(state): State<Arc<AppState>>,
    JsonBody(request): JsonBody<CompatGenerateRequest>,
) -> Response {
    let arrival = Instant::now();
    if request.stream {
        return stream_response(state, request.into(), "/", arrival).await;
    }
    let log = RequestLog::start("/", arrival);
    match generate_response(&state, request.into(), &log).await {
        Ok((headers, response)) => (headers, Json(vec![response])).into_response(),
        Err(error) => error.into_response(),
    }
}

/// The conversation as the chat route's template writes it (tools included), and its tokens.
#[utoipa::path(post, path = "/chat_tokenize", tag = "Text Generation Inference",
    request_body = ChatRequest,
    responses((status = 200, body = ChatTokenizeResponse), (status = 422, body = ErrorBody),
        (status = 429, body = ErrorBody)))]
#[tracing::instrument(skip_all)]
pub(crate) async fn chat_tokenize(
    State(state): State<Arc<AppState>>,
    JsonBody(request): JsonBody<ChatRequest>,
) -> Result<Json<ChatTokenizeResponse>, HttpError> {
    let (prompt, _) = prepare_chat(&state, &request)?;
    let _permit = acquire_permit(&state.permits)?;
    let add_special_tokens = prompt.adds_special_tokens();
    let templated_text = prompt.render(&state)?;
    let tokens = simple_tokens(&state, templated_text.clone(), add_special_tokens).await?;
    Ok(Json(ChatTokenizeResponse {
        tokenize_response: tokens,
        templated_text,
    }))
}

/// `text`'s tokens with their spans in it.
pub(super) async fn simple_tokens(
    state: &AppState,
    text: String,
    add_special_tokens: bool,
) -> Result<Vec<SimpleToken>, HttpError> {
    let encoded = state
        .tokenizer
        .encode_off_executor(text.clone(), add_special_tokens)
        .await
        .map_err(|error| HttpError::Tokenizer(error.to_string()))?;
    Ok(encoded
        .ids
        .iter()
        .zip(&encoded.offsets)
        .map(|(&id, &(start, stop))| SimpleToken {
            id,
            text: text.get(start..stop).unwrap_or_default().to_string(),
            start,
            stop,
        })
        .collect())
}

async fn generate_response(
    state: &AppState,
    request: GenerateRequest,
    log: &RequestLog,
) -> Result<(HeaderMap, GenerateResponse), HttpError> {
    let characters = request.inputs.chars().count();
    let run = async {
        let _permit = acquire_permit(&state.permits)?;
        let valid = validate_request(
            state,
            request.inputs,
            &request.parameters,
            true,
            log.arrival(),
        )
        .await?;
        let (best, others) = run_candidates(state, &valid, log).await?;
        Ok((valid, best, others))
    };
    let (valid, best, others) = run.await.inspect_err(|error| log.failed(error))?;
    let figures = log.succeeded(&best, valid.max_new_tokens);
    let headers = finished_headers(&figures, &best, &state.config.compute_type, characters);
    Ok((headers, to_response(&valid, best, others)))
}

/// Runs the request (`best_of` independent samples of it) to the end. Returns the candidate
/// with the highest mean logprob and the others. Each candidate is noted in `log`.
#[tracing::instrument(skip_all, fields(best_of = valid.parameters.best_of))]
pub(crate) async fn run_candidates(
    state: &AppState,
    valid: &ValidRequest,
    log: &RequestLog,
) -> Result<(GenerationOutput, Vec<GenerationOutput>), HttpError> {
    let best_of = valid.parameters.best_of.max(1);
    let candidates = (0..best_of).map(|_| {
        // A single request keeps its validated seed; best_of candidates each draw their own.
        let seed = if best_of == 1 {
            valid.parameters.sampling.seed
        } else {
            rand::random()
        };
        async move {
            let stream = state.engine.submit(valid.engine_request(Some(seed)))?;
            log.submitted(valid, &stream);
            Generation::new(stream, valid, state.tokenizer.clone(), seed)
                .collect()
                .await
        }
    });
    let mut outputs = try_join_all(candidates).await?;
    let best_index = outputs
        .iter()
        .enumerate()
        .max_by(|(_, a), (_, b)| a.mean_logprob().total_cmp(&b.mean_logprob()))
        .map(|(index, _)| index)
        .ok_or(HttpError::Incomplete)?;
    let best = outputs.swap_remove(best_index);
    Ok((best, outputs))
}

pub(super) fn full_text(valid: &ValidRequest, generated_text: &str) -> String {
    if valid.parameters.return_full_text {
        format!("{}{}", valid.inputs, generated_text)
    } else {
        generated_text.to_string()
    }
}

fn to_response(
    valid: &ValidRequest,
    best: GenerationOutput,
    others: Vec<GenerationOutput>,
) -> GenerateResponse {
    let parameters = &valid.parameters;
    let want_details = parameters.details || parameters.decoder_input_details;
    let best_of_sequences = (parameters.best_of > 1).then(|| {
        others
            .into_iter()
            .map(|other| BestOfSequence {
                generated_text: full_text(valid, &other.generated_text),
                finish_reason: other.finish_reason,
                generated_tokens: other.generated_tokens,
                seed: other.seed,
                prefill: other.prefill,
                tokens: other.tokens,
                top_tokens: other.top_tokens,
            })
            .collect()
    });
    let generated_text = full_text(valid, &best.generated_text);
    let details = want_details.then(|| Details {
        finish_reason: best.finish_reason,
        generated_tokens: best.generated_tokens,
        seed: best.seed,
        prefill: best.prefill,
        tokens: best.tokens,
        top_tokens: best.top_tokens,
        best_of_sequences,
    });
    GenerateResponse {
        generated_text,
        details,
    }
}

/// Answers with SSE once the engine took the request; validation and engine errors arrive as an
/// error event, a refusal before the engine took it as its own status (`sse_response`).
async fn stream_response(
    state: Arc<AppState>,
    request: GenerateRequest,
    route: &'static str,
    arrival: Instant,
) -> Response {
    let headers = stream_headers(&state.config.compute_type, request.inputs.chars().count());
    let span = tracing::Span::current();
    sse_response(headers, ErrorsBeforeOpen::RefusalsAnswered, move |sender| {
        async move {
            let log = RequestLog::start(route, arrival);
            if let Err(error) = run_stream(&state, request, &log, &sender).await {
                log.failed(&error);
                sender.fail(&error, &error.body()).await;
            }
        }
        .instrument(span)
    })
    .await
}

#[tracing::instrument(
    skip_all,
    name = "generate_stream_events",
    fields(
        total_time,
        validation_time,
        queue_time,
        inference_time,
        time_per_token,
        seed
    )
)]
async fn run_stream(
    state: &AppState,
    request: GenerateRequest,
    log: &RequestLog,
    sender: &EventSender,
) -> Result<(), HttpError> {
    let _permit = acquire_permit(&state.permits)?;
    let valid = validate_request(
        state,
        request.inputs,
        &request.parameters,
        true,
        log.arrival(),
    )
    .await?;
    validate_stream(&valid.parameters, false)?;
    let seed = valid.parameters.sampling.seed;
    let stream = state.engine.submit(valid.engine_request(None))?;
    log.submitted(&valid, &stream);
    sender.open();
    let mut generation = Generation::new(stream, &valid, state.tokenizer.clone(), seed);
    loop {
        let event = tokio::select! {
            // The log records the request as dropped.
            _ = sender.closed() => return Ok(()),
            event = generation.next() => event,
        };
        match event.ok_or(HttpError::Incomplete)?? {
            GenerationEvent::Token {
                index,
                token,
                top_tokens,
                end,
                ..
            } => {
                let last = end
                    .as_ref()
                    .map(|output| last_event_fields(&valid, output, log));
                let done = last.is_some();
                let (generated_text, details) = last.unzip();
                let event = StreamResponse {
                    index,
                    token,
                    top_tokens,
                    generated_text,
                    details,
                };
                if !sender.send_json(&event).await || done {
                    return Ok(());
                }
            }
            GenerationEvent::End { output, .. } => {
                log.succeeded(&output, valid.max_new_tokens);
                return Ok(());
            }
        }
    }
}

/// `generated_text` and `details` of the last event; records the success.
fn last_event_fields(
    valid: &ValidRequest,
    output: &GenerationOutput,
    log: &RequestLog,
) -> (String, StreamDetails) {
    log.succeeded(output, valid.max_new_tokens);
    let details = StreamDetails {
        finish_reason: output.finish_reason,
        generated_tokens: output.generated_tokens,
        seed: output.seed,
        input_length: output.input_length,
    };
    (full_text(valid, &output.generated_text), details)
}
