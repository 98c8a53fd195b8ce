//! The streamed form of the OpenAI routes: one chunk per generated token for each choice,
//! then the usage chunk when asked (`stream_options.include_usage`), then `data: [DONE]`.
//! A choice's error is an event in OpenAI's stream error shape (status stays 200; a refusal
//! before the stream opens answers with its own status, `sse_response`); the other choices run
//! to their end and the stream still ends with `data: [DONE]`, without the usage chunk.
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::http::HeaderMap;
use axum::response::Response;
use futures::future::join_all;
use tokio::sync::OwnedSemaphorePermit;
use tracing::Instrument;

use super::generation::{Generation, GenerationEvent, GenerationOutput};
use super::openai_types::{unix_now, Usage, UsageReports};
use super::request::{acquire_permit, validate_request, validate_token_prompt, ValidRequest};
use super::request_log::RequestLog;
use super::sse::{sse_response, ErrorsBeforeOpen, EventSender};
use super::state::AppState;
use super::types::{GenerateParameters, PrefillToken, Token};
use crate::chat_template::Conversation;
use crate::error::HttpError;
use crate::validation::validate_stream;

/// Identity fields that every response and chunk of one request repeats.
#[derive(Debug, Clone)]
pub(crate) struct ResponseIdentity {
    pub id: String,
    pub created: u64,
    pub model: String,
    /// `chat.completion.chunk` or `text_completion`.
    pub chunk_object: &'static str,
    /// The client asked for each token's log-probability (even with no alternatives).
    pub logprobs: bool,
}

impl ResponseIdentity {
    pub fn new(model: &str, chunk_object: &'static str) -> Self {
        let created = unix_now();
        Self {
            id: format!("{created}-{:08x}", rand::random::<u32>()),
            created,
            model: model.to_string(),
            chunk_object,
            logprobs: false,
        }
    }

    pub fn with_logprobs(self, logprobs: bool) -> Self {
        Self { logprobs, ..self }
    }
}

pub(crate) fn fingerprint() -> String {
    format!("{}-{}", env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION"))
}

/// What one chunk reports for one choice.
pub(crate) struct ChoiceUpdate<'a> {
    pub index: u32,
    /// The choice's prompt as the model reads it (a conversation rendered).
    pub prompt: &'a str,
    /// The text released by this token (empty mid-character and for special tokens).
    pub text: String,
    pub token: Option<&'a Token>,
    pub top_tokens: &'a [Token],
    /// Present on the choice's last chunk.
    pub finish: Option<&'a GenerationOutput>,
    /// Set on the chunk that echoes the prompt (`text` is the prompt's).
    pub echoed: Option<EchoedPrompt<'a>>,
}

/// An echoed prompt's tokens and their alternatives (empty unless the request asked for
/// logprobs).
pub(crate) struct EchoedPrompt<'a> {
    pub tokens: &'a [PrefillToken],
    pub top_tokens: &'a [Vec<Token>],
}

/// Builds one chunk's JSON from an update.
pub(crate) type ChunkBuilder =
    dyn Fn(&ResponseIdentity, ChoiceUpdate<'_>) -> serde_json::Value + Send + Sync;

/// A stream's state kept per choice (a reasoning split, a tool-call reading), by choice index:
/// begun at the choice's first piece, dropped with its last.
#[derive(Debug)]
pub(crate) struct PerChoice<T>(Mutex<HashMap<u32, T>>);

impl<T> Default for PerChoice<T> {
    fn default() -> Self {
        Self(Mutex::default())
    }
}

impl<T> PerChoice<T> {
    /// Runs `read` on choice `index`'s state (`begin` makes it at its first piece); its `last`
    /// piece ends it.
    pub fn with<R>(&self, index: u32, last: bool, begin: impl FnOnce() -> T, read: impl FnOnce(&mut T) -> R) -> R {
        let mut choices = self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let result = read(choices.entry(index).or_insert_with(begin));
        if last {
            choices.remove(&index);
        }
        result
    }
}

/// A prepared prompt (its text and parameters), or why it could not be prepared.
pub(crate) type PreparedPrompt = Result<(PromptText, GenerateParameters), HttpError>;

/// A prompt's text, or the conversation it is rendered from: rendering waits until the
/// request holds its concurrency permit, as everything that costs CPU time does.
#[derive(Clone)]
pub(crate) enum PromptText {
    Text(String),
    /// Token ids, used as given (OpenAI's completions take them).
    Tokens(Vec<u32>),
    /// A conversation, with the tools its template is given and how to render it.
    Chat(Conversation),
}

impl PromptText {
    /// Whether its tokens get the tokenizer's special tokens: a text prompt's do, as TGI's
    /// `/generate` and OpenAI's completions; a conversation's template writes its own.
    pub fn adds_special_tokens(&self) -> bool {
        matches!(self, PromptText::Text(_))
    }

    /// Its text: a conversation as the template writes it, token ids decoded.
    pub fn render(self, state: &AppState) -> Result<String, HttpError> {
        match self {
            PromptText::Text(text) => Ok(text),
            PromptText::Tokens(ids) => state.tokenizer.decode(&ids, false).map_err(|error| HttpError::Tokenizer(error.to_string())),
            PromptText::Chat(conversation) => Ok(state.chat_template()?.render_conversation(&conversation)?),
        }
    }

    /// The request the engine gets for this prompt: rendered and tokenized (token ids as
    /// given), and checked by the generation routes' rules.
    pub async fn validate(
        self,
        state: &AppState,
        parameters: &GenerateParameters,
        arrival: Instant,
    ) -> Result<ValidRequest, HttpError> {
        if let PromptText::Tokens(ids) = self {
            return validate_token_prompt(state, ids, parameters, arrival).await;
        }
        let add_special_tokens = self.adds_special_tokens();
        let inputs = self.render(state)?;
        validate_request(state, inputs, parameters, add_special_tokens, arrival).await
    }
}

pub(crate) struct StreamPlan {
    /// For the request log.
    pub route: &'static str,
    pub prompts: Vec<PreparedPrompt>,
    pub usage: UsageReports,
    pub identity: ResponseIdentity,
    pub arrival: Instant,
    /// Consecutive prompts that are `n` choices of one prompt: its tokens count once in usage.
    pub choices_per_prompt: usize,
    /// Each choice's first chunk echoes its prompt (the completions' `echo`).
    pub echo: bool,
}

/// Runs every prompt as one choice of the stream; answers with SSE once the engine took a
/// choice, or with the refusal met before (`sse_response`).
pub(crate) async fn openai_stream(
    state: Arc<AppState>,
    headers: HeaderMap,
    plan: StreamPlan,
    chunk: Arc<ChunkBuilder>,
) -> Response {
    let span = tracing::Span::current();
    sse_response(headers, ErrorsBeforeOpen::Answered, move |sender| {
        async move {
            let StreamPlan {
                route,
                prompts,
                usage: reports,
                identity,
                arrival,
                choices_per_prompt,
                echo,
            } = plan;
            let choices = prompts.into_iter().enumerate().map(|(index, prompt)| {
                let choice = Choice {
                    route,
                    index: index as u32,
                    arrival,
                    echo,
                    usage_per_chunk: reports.every_chunk,
                };
                let shared = Shared {
                    state: &state,
                    identity: &identity,
                    sender: &sender,
                    chunk: chunk.as_ref(),
                };
                run_choice(shared, choice, prompt)
            });
            let results = join_all(choices).await;
            let (mut usage, mut failed) = (Usage::new(0, 0), false);
            for (index, result) in results.into_iter().enumerate() {
                match result {
                    Ok(Some(choice_usage)) => {
                        let first_choice = index % choices_per_prompt.max(1) == 0;
                        usage = usage.plus(choice_usage, first_choice)
                    }
                    // The client left.
                    Ok(None) => return,
                    // The choice reported its error; the others ran to their end. The stream still
                    // ends with `[DONE]` (as OpenAI's routes do after an error event), without
                    // usage, which would count only part of the request.
                    Err(()) => failed = true,
                }
            }
            if reports.at_end && !failed && !sender.send_json(&usage_chunk(&identity, usage)).await {
                return;
            }
            sender.send_text("[DONE]").await;
        }
        .instrument(span)
    })
    .await
}

fn usage_chunk(identity: &ResponseIdentity, usage: Usage) -> serde_json::Value {
    serde_json::json!({
        "id": identity.id, "object": identity.chunk_object, "created": identity.created,
        "model": identity.model, "system_fingerprint": fingerprint(), "choices": [],
        "usage": usage,
    })
}

/// What the choices of one stream share.
#[derive(Clone, Copy)]
struct Shared<'a> {
    state: &'a AppState,
    identity: &'a ResponseIdentity,
    sender: &'a EventSender,
    chunk: &'a ChunkBuilder,
}

#[derive(Clone, Copy)]
struct Choice {
    route: &'static str,
    index: u32,
    arrival: Instant,
    echo: bool,
    /// Each chunk carries the choice's usage so far (`UsageReports::every_chunk`).
    usage_per_chunk: bool,
}

/// Streams one choice; `Ok(None)` when the client left, `Err` after reporting an error.
async fn run_choice(
    shared: Shared<'_>,
    choice: Choice,
    prompt: PreparedPrompt,
) -> Result<Option<Usage>, ()> {
    let log = RequestLog::start(choice.route, choice.arrival);
    match stream_choice(shared, choice, prompt, &log).await {
        Ok(usage) => Ok(usage),
        Err(error) => {
            log.failed(&error);
            shared.sender.fail(&error, &error.openai_stream_body()).await;
            Err(())
        }
    }
}

#[tracing::instrument(skip_all, fields(index = choice.index))]
async fn stream_choice(
    shared: Shared<'_>,
    choice: Choice,
    prompt: PreparedPrompt,
    log: &RequestLog,
) -> Result<Option<Usage>, HttpError> {
    let Shared {
        state,
        identity,
        sender,
        chunk,
    } = shared;
    let (prompt, parameters) = prompt?;
    let Submitted { permit: _permit, valid, mut generation } =
        submit_streamed(state, prompt, &parameters, choice.arrival, log, choice.echo).await?;
    sender.open();
    let mut echo = choice.echo;
    let prompt_tokens = valid.prompt_ids.len() as u32;
    let mut generated = 0;
    // vLLM's continuous usage: the choice's prompt (its cached part once scheduled) and the
    // tokens it has generated so far.
    let with_usage = |mut update: serde_json::Value, usage: Usage| {
        if let (true, Some(fields)) = (choice.usage_per_chunk, update.as_object_mut()) {
            fields.insert("usage".into(), serde_json::json!(usage));
        }
        update
    };
    loop {
        let event = tokio::select! {
            // The log records the choice as dropped.
            _ = sender.closed() => return Ok(None),
            event = generation.next() => event,
        };
        let event = event.ok_or(HttpError::Incomplete)??;
        // The prompt's chunk goes ahead of the first token's, once its logprobs are known.
        if std::mem::take(&mut echo) {
            let (tokens, top_tokens) = (generation.prefill_tokens(), generation.prefill_top_tokens());
            let update = ChoiceUpdate {
                index: choice.index,
                prompt: &valid.inputs,
                text: valid.inputs.clone(),
                token: None,
                top_tokens: &[],
                finish: None,
                echoed: Some(EchoedPrompt { tokens: &tokens, top_tokens: &top_tokens }),
            };
            let usage = Usage::new(prompt_tokens, 0).with_cached(generation.cached_tokens());
            if !sender.send_json(&with_usage(chunk(identity, update), usage)).await {
                return Ok(None);
            }
        }
        generated += u32::from(matches!(event, GenerationEvent::Token { .. }));
        let (update, output) = chunk_of(event, choice.index, &valid.inputs, identity, chunk);
        let usage = match &output {
            Some(output) => Usage::new(output.input_length, output.generated_tokens).with_cached(output.cached_tokens),
            None => Usage::new(prompt_tokens, generated).with_cached(generation.cached_tokens()),
        };
        if !sender.send_json(&with_usage(update, usage)).await {
            return Ok(None);
        }
        if let Some(output) = output {
            log.succeeded(&output, valid.max_new_tokens);
            return Ok(Some(usage));
        }
    }
}

/// A streamed request as the engine took it: its concurrency permit (held while it runs), the
/// request, and its generation.
pub(crate) struct Submitted {
    pub permit: OwnedSemaphorePermit,
    pub valid: ValidRequest,
    pub generation: Generation,
}

/// Takes a permit, validates the prompt by a stream's rules (`streams_prompt`: an echo streams
/// the prompt's logprobs) and submits it, logged.
pub(crate) async fn submit_streamed(
    state: &AppState,
    prompt: PromptText,
    parameters: &GenerateParameters,
    arrival: Instant,
    log: &RequestLog,
    streams_prompt: bool,
) -> Result<Submitted, HttpError> {
    let permit = acquire_permit(&state.permits)?;
    let valid = prompt.validate(state, parameters, arrival).await?;
    validate_stream(&valid.parameters, streams_prompt)?;
    let seed = valid.parameters.sampling.seed;
    let stream = state.engine.submit(valid.engine_request(None))?;
    log.submitted(&valid, &stream);
    let generation = Generation::new(stream, &valid, state.tokenizer.clone(), seed);
    Ok(Submitted { permit, valid, generation })
}

/// The chunk that reports one generation event, and the output when the choice has ended.
fn chunk_of(
    event: GenerationEvent,
    index: u32,
    prompt: &str,
    identity: &ResponseIdentity,
    chunk: &ChunkBuilder,
) -> (serde_json::Value, Option<Box<GenerationOutput>>) {
    match event {
        GenerationEvent::Token {
            token,
            top_tokens,
            text,
            end,
            ..
        } => {
            let update = ChoiceUpdate {
                index,
                prompt,
                text,
                token: Some(&token),
                top_tokens: &top_tokens,
                finish: end.as_deref(),
                echoed: None,
            };
            (chunk(identity, update), end)
        }
        GenerationEvent::End { output, text } => {
            let update = ChoiceUpdate {
                index,
                prompt,
                text,
                token: None,
                top_tokens: &[],
                finish: Some(&output),
                echoed: None,
            };
            (chunk(identity, update), Some(output))
        }
    }
}
