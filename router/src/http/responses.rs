//! OpenAI's Responses API, `POST /v1/responses`, served by the chat route's machinery.
//!
//! The request becomes a chat request (`ResponsesRequest::parse`): `instructions` the system
//! message, `input` (a string, or a list of items) the conversation — messages, function calls
//! and their outputs (the assistant's `tool_calls` and `tool` messages), reasoning items (the next
//! assistant turn's `reasoning_content`) — `text.format` the chat's `response_format`, the flat
//! function tools the chat's, `max_output_tokens` its `max_tokens`; the other fields (sampling,
//! `priority`, `slo`, …) are read as the chat route reads them. The answer's reasoning
//! (`--reasoning-parser`), text and call become the response's output items (`Output`), whole or
//! streamed as OpenAI's typed events (`response.created` … `response.completed`, each with its
//! `sequence_number`). Both forms are one run (`Run`): the engine's tokens read as the chat
//! route's stream reads them, so a whole response is its stream's last event. A reply cut by
//! `max_output_tokens` is `incomplete`. The usage counts the prompt tokens the prefix cache
//! served and the reasoning's tokens (those before the answer's first, the tags included); the
//! message's tokens' logprobs come with `include: ["message.output_text.logprobs"]` or
//! `top_logprobs`.
//!
//! Responses are kept (`store`, true unless the request says false, as at OpenAI) within
//! `--responses-store-bytes` (`response_store.rs`): `previous_response_id` continues one (its
//! conversation, then the new `input`), `GET`/`DELETE /v1/responses/{id}` read and remove one.
//! `conversation` and `background` are refused (422). A client can also keep its conversation
//! itself by sending the previous output items back in `input`, as with `store: false`.
use std::sync::Arc;
use std::time::Instant;

use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Map, Value};
use tokio::sync::OwnedSemaphorePermit;
use tracing::Instrument;

use super::extract::JsonBody;
use super::generation::{Generation, GenerationEvent, GenerationOutput};
use super::headers::{finished_headers, stream_headers};
use super::openai::{chat_chunk, prepare_chat, reasoning_parser_for, respond, tool_reading};
use super::openai_stream::{submit_streamed, ChoiceUpdate, PromptText, ResponseIdentity, Submitted};
use super::openai_types::{log_ignored_fields, unix_now, ChatRequest};
use super::request::ValidRequest;
use super::request_log::RequestLog;
use super::reasoning::ChoiceSplitters;
use super::response_store::ResponseStore;
use super::sse::{sse_response, ErrorsBeforeOpen, EventSender};
use super::state::AppState;
use super::tool_parser::ToolCallParser;
use super::tools::{ToolReading, ToolStream};
use super::types::{FinishReason, GenerateParameters};
use crate::error::HttpError;
use crate::validation::ValidationError;

const ROUTE: &str = "/v1/responses";

/// A model response (OpenAI's Responses API): one output, whole or streamed as typed events.
#[utoipa::path(post, path = "/v1/responses", tag = "OpenAI",
    request_body(content = Object, description = "OpenAI's Responses request: `input` (a string or a list of \
        message, function_call, function_call_output and reasoning items), `instructions`, `tools` (functions), \
        `tool_choice`, `text.format`, `max_output_tokens`, the chat route's sampling fields"),
    responses((status = 200, body = Object, description = "A `response` object, or its events when streamed"),
        (status = 422, body = crate::error::ErrorBody)))]
#[tracing::instrument(skip_all)]
pub(crate) async fn responses(State(state): State<Arc<AppState>>, JsonBody(body): JsonBody<Value>) -> Response {
    let arrival = Instant::now();
    let request = match ResponsesRequest::parse(body, Some(&state.responses)) {
        Ok(request) => request,
        Err(error) => return respond::<Response>(Err(error), &RequestLog::start(ROUTE, arrival)),
    };
    log_ignored_fields(ROUTE, &request.chat.ignored);
    let reading = tool_reading(&state, &request.chat);
    let prepared = prepare_chat(&state, &request.chat).map(|(prompt, parameters)| (prompt, parameters, reading));
    let mut output = Output::new(&state.model_id, request.repeated);
    if let ToolReading::Parser { parser, .. } = reading {
        output.parser = Some(parser);
    }
    output.keep = request.store.then_some(request.items);
    let logprobs = request.chat.logprobs;
    if request.chat.stream {
        return stream(state, prepared, output, logprobs, arrival).await;
    }
    let log = RequestLog::start(ROUTE, arrival);
    let result = async {
        let mut run = Run::start(&state, prepared?, output, logprobs, arrival, &log).await?;
        loop {
            let (mut events, end) = run.next().await?;
            if let Some(end) = end {
                let figures = log.succeeded(&end, run.valid.max_new_tokens);
                let headers = finished_headers(&figures, &end, &state.config.compute_type, 0);
                // The last event holds the whole response.
                let response = events.pop().map(|mut event| event["response"].take()).unwrap_or_default();
                run.output.keep(&state.responses, &response);
                return Ok::<_, HttpError>((headers, Json(response)));
            }
        }
    }
    .await;
    respond(result, &log)
}

/// A kept response, as it was returned (`store`; OpenAI's `responses.retrieve`).
#[utoipa::path(get, path = "/v1/responses/{id}", tag = "OpenAI",
    params(("id" = String, Path, description = "The response's id")),
    responses((status = 200, body = Object, description = "The `response` object"),
        (status = 404, body = crate::error::ErrorBody, description = "Not kept: never, deleted, or gone for room")))]
pub(crate) async fn retrieve(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Response {
    match state.responses.get(&id) {
        Some(stored) => Json(stored.response).into_response(),
        None => HttpError::ResponseNotFound(id).into_response(),
    }
}

/// Removes a kept response (OpenAI's `responses.delete`); a later `previous_response_id` naming
/// it is a 404.
#[utoipa::path(delete, path = "/v1/responses/{id}", tag = "OpenAI",
    params(("id" = String, Path, description = "The response's id")),
    responses((status = 200, body = Object, description = "`{\"id\", \"object\": \"response\", \"deleted\": true}`"),
        (status = 404, body = crate::error::ErrorBody)))]
pub(crate) async fn delete(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Response {
    if state.responses.delete(&id) {
        Json(json!({"id": id, "object": "response", "deleted": true})).into_response()
    } else {
        HttpError::ResponseNotFound(id).into_response()
    }
}

/// The streamed response: `response.created` and `response.in_progress` once the engine took
/// the request, each item's events as the reply grows, then `response.completed` (or
/// `response.incomplete`). An error before the stream opens is answered with its status; after,
/// it is an `error` event.
async fn stream(
    state: Arc<AppState>,
    prepared: Result<Prepared, HttpError>,
    output: Output,
    logprobs: bool,
    arrival: Instant,
) -> Response {
    let headers = stream_headers(&state.config.compute_type, 0);
    let span = tracing::Span::current();
    sse_response(headers, ErrorsBeforeOpen::Answered, move |sender| {
        async move {
            let log = RequestLog::start(ROUTE, arrival);
            let mut sequence = 0;
            if let Err(error) = stream_events(&state, prepared, output, logprobs, &sender, &log, arrival, &mut sequence).await {
                log.failed(&error);
                let event = json!({"type": "error", "code": error.error_type(), "message": error.to_string(),
                    "param": null, "sequence_number": sequence});
                sender.fail(&error, &event).await;
            }
        }
        .instrument(span)
    })
    .await
}

/// Streams a run's events; `sequence` is the next event's number (an error event's).
#[allow(clippy::too_many_arguments)]
async fn stream_events(
    state: &AppState,
    prepared: Result<Prepared, HttpError>,
    output: Output,
    logprobs: bool,
    sender: &EventSender,
    log: &RequestLog,
    arrival: Instant,
    sequence: &mut u64,
) -> Result<(), HttpError> {
    let mut run = Run::start(state, prepared?, output, logprobs, arrival, log).await?;
    let opening = [run.output.lifecycle("response.created"), run.output.lifecycle("response.in_progress")];
    *sequence = run.output.sequence;
    if !send_all(sender, opening).await {
        return Ok(());
    }
    loop {
        let step = tokio::select! {
            // The log records the request as dropped.
            _ = sender.closed() => return Ok(()),
            step = run.next() => step,
        };
        let (events, end) = step?;
        *sequence = run.output.sequence;
        if let Some(end) = &end {
            log.succeeded(end, run.valid.max_new_tokens);
            if let Some(last) = events.last() {
                run.output.keep(&state.responses, &last["response"]);
            }
        }
        if !send_all(sender, events).await || end.is_some() {
            return Ok(());
        }
    }
}

/// Sends events in order; false when the client has gone.
async fn send_all(sender: &EventSender, events: impl IntoIterator<Item = Value>) -> bool {
    for event in events {
        if !sender.send_json(&event).await {
            return false;
        }
    }
    true
}

/// A request's conversation, parameters and how its tool calls are read.
type Prepared = (PromptText, GenerateParameters, ToolReading);

/// One response being generated: the engine's tokens read as the chat route's stream reads them
/// (its reasoning split, its tool call), each chunk turned into the output's events. The whole
/// response is the same run with its events unsent, so both forms have one reading.
struct Run<'a> {
    state: &'a AppState,
    valid: ValidRequest,
    generation: Generation,
    tools: Option<ToolStream>,
    splitters: Option<ChoiceSplitters>,
    identity: ResponseIdentity,
    output: Output,
    /// Tokens' logprobs not yet given to a piece of the message (held-back text).
    pending_logprobs: Vec<Value>,
    /// Tokens generated before the reply's first answer (text or call).
    tokens_before_answer: u32,
    _permit: OwnedSemaphorePermit,
}

impl<'a> Run<'a> {
    /// Takes a permit, validates (a stream's rules: the output has no place for prompt
    /// logprobs) and submits the request.
    async fn start(
        state: &'a AppState,
        (prompt, parameters, reading): Prepared,
        output: Output,
        logprobs: bool,
        arrival: Instant,
        log: &RequestLog,
    ) -> Result<Run<'a>, HttpError> {
        let reasoning_parser = reasoning_parser_for(state, parameters.grammar.is_some());
        let Submitted { permit, valid, generation } = submit_streamed(state, prompt, &parameters, arrival, log, false).await?;
        Ok(Run {
            state,
            valid,
            generation,
            tools: reading.stream(),
            splitters: reasoning_parser.map(ChoiceSplitters::new),
            identity: ResponseIdentity::new(&state.model_id, "chat.completion.chunk").with_logprobs(logprobs),
            output,
            pending_logprobs: Vec::new(),
            tokens_before_answer: 0,
            _permit: permit,
        })
    }

    /// The events of the engine's next token (or end), and the output once it has ended.
    async fn next(&mut self) -> Result<(Vec<Value>, Option<Box<GenerationOutput>>), HttpError> {
        let (text, token, top_tokens, end) = match self.generation.next().await.ok_or(HttpError::Incomplete)?? {
            GenerationEvent::Token { token, top_tokens, text, end, .. } => (text, Some(token), top_tokens, end),
            GenerationEvent::End { output, text } => (text, None, Vec::new(), Some(output)),
        };
        let update = ChoiceUpdate {
            index: 0,
            prompt: &self.valid.inputs,
            text,
            token: token.as_ref(),
            top_tokens: &top_tokens,
            finish: end.as_deref(),
            echoed: None,
        };
        let chunk = chat_chunk(&self.identity, update, self.tools.as_ref(), self.splitters.as_ref(), None, &self.state.tokenizer);
        let mut events = Vec::new();
        if let Some(choice) = chunk.choices.into_iter().next() {
            let delta = choice.delta;
            let logprobs = choice.logprobs.map(|logprobs| logprobs.content).unwrap_or_default();
            if let Some(reasoning) = delta.reasoning_content.filter(|text| !text.is_empty()) {
                events.extend(self.output.reasoning(&reasoning));
            }
            let content = delta.content.filter(|text| !text.is_empty());
            let answers = content.is_some() || delta.tool_calls.is_some();
            if !self.output.answered() {
                self.tokens_before_answer += u32::from(token.is_some() && !answers);
                if answers && self.output.reasoned() {
                    // What came before the answer was its reasoning, the tags included: not
                    // the message's tokens.
                    self.pending_logprobs.clear();
                }
            }
            self.pending_logprobs.extend(logprobs.iter().filter_map(|logprob| serde_json::to_value(logprob).ok()));
            if let Some(content) = content {
                let logprobs = std::mem::take(&mut self.pending_logprobs);
                events.extend(self.output.text(&content, logprobs));
            }
            for piece in delta.tool_calls.into_iter().flatten() {
                self.pending_logprobs.clear();
                if let Some(name) = &piece.function.name {
                    events.extend(self.output.call(name));
                }
                events.extend(self.output.arguments(&piece.function.arguments));
            }
        }
        if let Some(end) = &end {
            // What is left (the end-of-sequence token's) closes the message, if one is open.
            let rest = std::mem::take(&mut self.pending_logprobs);
            self.output.add_logprobs(rest);
            let reasoning_tokens = if self.output.reasoned() { self.tokens_before_answer } else { 0 };
            events.extend(self.output.finish(end, reasoning_tokens));
        }
        Ok((events, end))
    }
}

/// A Responses request as the chat route reads it, and the fields its response repeats.
pub(crate) struct ResponsesRequest {
    pub chat: ChatRequest,
    pub repeated: Map<String, Value>,
    /// The conversation as items: the continued response's (`previous_response_id`), then this
    /// request's `input` (a string as one user message).
    pub items: Vec<Value>,
    /// The response is kept (`store`, and a store to keep it in).
    pub store: bool,
}

/// Fields that need state this server does not keep.
const STATEFUL_FIELDS: [&str; 2] = ["conversation", "prompt"];
/// Fields read here and not passed on to the chat request: logged as not read.
const UNREAD_FIELDS: [&str; 2] = ["reasoning", "truncation"];
/// The one `include` this server answers: the message's tokens' logprobs.
const INCLUDE_LOGPROBS: &str = "message.output_text.logprobs";

impl ResponsesRequest {
    /// `store`: where responses are kept (none: nothing is, as with `--responses-store-bytes 0`).
    pub fn parse(body: Value, store: Option<&ResponseStore>) -> Result<Self, HttpError> {
        let Value::Object(mut body) = body else {
            return Err(HttpError::undeserializable("a Responses request is a JSON object"));
        };
        let store = store.filter(|store| store.enabled());
        let mut take = |field: &str| body.remove(field).filter(|value| !value.is_null());
        for field in STATEFUL_FIELDS {
            if take(field).is_some() {
                let why = match field {
                    "conversation" => "this server stores no conversations; send the items in `input`, or continue a response by `previous_response_id`",
                    _ => "this server stores no prompt templates",
                };
                return Err(ValidationError::UnsupportedBecause(field, why).into());
            }
        }
        let previous = match take("previous_response_id") {
            None => None,
            Some(Value::String(id)) => match store {
                None => {
                    let why = "this server keeps no responses (--responses-store-bytes 0); send the output items back in `input`";
                    return Err(ValidationError::UnsupportedBecause("previous_response_id", why).into());
                }
                Some(store) => Some(store.get(&id).ok_or(HttpError::ResponseNotFound(id))?),
            },
            Some(_) => return Err(invalid("previous_response_id", "must be a string".into()).into()),
        };
        let keep = match take("store") {
            None => true,
            Some(Value::Bool(keep)) => keep,
            Some(_) => return Err(invalid("store", "must be a boolean".into()).into()),
        } && store.is_some();
        if take("background").is_some_and(|background| background != Value::Bool(false)) {
            return Err(ValidationError::Unsupported("background").into());
        }
        if take("messages").is_some() {
            return Err(invalid("input", "give the conversation as `input`, not `messages`".into()).into());
        }
        let input = take("input").ok_or_else(|| invalid("input", "required".into()))?;
        let instructions = take("instructions");
        let mut messages = Vec::new();
        if let Some(instructions) = &instructions {
            let text = instructions.as_str().ok_or_else(|| invalid("instructions", "must be a string".into()))?;
            messages.push(json!({"role": "system", "content": text}));
        }
        // The continued conversation, then this input (the previous `instructions` are not
        // carried over, as at OpenAI).
        let mut items = previous.as_ref().map(|previous| previous.items.to_vec()).unwrap_or_default();
        match input {
            Value::String(text) => items.push(json!({"role": "user", "content": text})),
            Value::Array(input) => items.extend(input),
            _ => return Err(invalid("input", "must be a string or a list of items".into()).into()),
        }
        messages.extend(input_messages(Value::Array(items.clone()))?);
        let mut chat = Map::new();
        chat.insert("messages".into(), Value::Array(messages));
        let max_output_tokens = take("max_output_tokens");
        if let Some(max) = &max_output_tokens {
            chat.insert("max_tokens".into(), max.clone());
        }
        let tools = take("tools");
        if let Some(tools) = tools.as_ref().filter(|tools| tools.as_array().is_none_or(|tools| !tools.is_empty())) {
            chat.insert("tools".into(), chat_tools(tools)?);
        }
        let tool_choice = take("tool_choice");
        if let Some(choice) = &tool_choice {
            chat.insert("tool_choice".into(), chat_tool_choice(choice)?);
        }
        let text = take("text");
        if let Some(format) = text.as_ref().and_then(|text| text.get("format")).filter(|format| !format.is_null()) {
            if let Some(response_format) = chat_response_format(format)? {
                chat.insert("response_format".into(), response_format);
            }
        }
        let metadata = take("metadata");
        let mut unread: Vec<(&str, Value)> = UNREAD_FIELDS.iter().filter_map(|&field| take(field).map(|value| (field, value))).collect();
        // Logprobs: asked by `include` (OpenAI's way) or by `top_logprobs` alone.
        let include = take("include");
        let included = |wanted: &Value| wanted == INCLUDE_LOGPROBS;
        let mut logprobs = include.as_ref().and_then(Value::as_array).is_some_and(|asked| asked.iter().any(included));
        let top_logprobs = take("top_logprobs");
        if let Some(top) = &top_logprobs {
            chat.insert("top_logprobs".into(), top.clone());
            logprobs = true;
        }
        if logprobs {
            chat.insert("logprobs".into(), Value::Bool(true));
        }
        if let Some(include) = include.filter(|include| !include.as_array().is_some_and(|asked| asked.iter().all(included))) {
            unread.push(("include", include));
        }
        // The stream's options (`include_obfuscation`) do not apply.
        take("stream_options");
        let mut repeated = Map::new();
        repeated.insert("instructions".into(), instructions.unwrap_or(Value::Null));
        repeated.insert("max_output_tokens".into(), max_output_tokens.unwrap_or(Value::Null));
        repeated.insert("metadata".into(), metadata.unwrap_or_else(|| json!({})));
        repeated.insert("tools".into(), tools.unwrap_or_else(|| json!([])));
        repeated.insert("tool_choice".into(), tool_choice.unwrap_or_else(|| json!("auto")));
        repeated.insert("text".into(), text.unwrap_or_else(|| json!({"format": {"type": "text"}})));
        for (field, default) in [("temperature", Value::Null), ("top_p", Value::Null), ("parallel_tool_calls", Value::Bool(true))] {
            repeated.insert(field.into(), body.get(field).filter(|value| !value.is_null()).cloned().unwrap_or(default));
        }
        let reasoning = unread.iter().find(|(field, _)| *field == "reasoning").map(|(_, value)| value.clone());
        repeated.insert("reasoning".into(), reasoning.unwrap_or(Value::Null));
        repeated.insert("truncation".into(), json!("disabled"));
        repeated.insert("top_logprobs".into(), top_logprobs.unwrap_or(Value::Null));
        let previous_id = previous.as_ref().map_or(Value::Null, |previous| previous.response["id"].clone());
        repeated.insert("previous_response_id".into(), previous_id);
        repeated.insert("store".into(), Value::Bool(keep));
        repeated.insert("background".into(), Value::Bool(false));
        // Everything else is the chat route's: sampling, `stream`, `model`, `priority`, `slo`, ….
        chat.extend(body);
        let mut chat: ChatRequest =
            serde_json::from_value(Value::Object(chat)).map_err(HttpError::undeserializable)?;
        if chat.sampling.choices() != 1 {
            return Err(ValidationError::UnsupportedBecause("n", "a response has one output").into());
        }
        for (field, value) in unread {
            // `truncation: "disabled"` is what this server does.
            if !(field == "truncation" && value == "disabled") {
                chat.ignored.insert(field.to_string(), value);
            }
        }
        Ok(Self { chat, repeated, items, store: keep })
    }
}

fn invalid(field: &'static str, reason: String) -> ValidationError {
    ValidationError::Field(field, reason)
}

/// The conversation of `input`: a string is one user message; a list holds messages (their
/// content a string or text parts), function calls (an assistant turn's calls: consecutive
/// ones, and a message the calls follow, make one assistant message), function call outputs
/// (`tool` messages) and reasoning items (the next assistant message's `reasoning_content`).
fn input_messages(input: Value) -> Result<Vec<Value>, ValidationError> {
    let items = match input {
        Value::String(text) => return Ok(vec![json!({"role": "user", "content": text})]),
        Value::Array(items) => items,
        _ => return Err(invalid("input", "must be a string or a list of items".into())),
    };
    let mut messages: Vec<Value> = Vec::new();
    let mut reasoning: Option<String> = None;
    for (index, item) in items.into_iter().enumerate() {
        let field = |name: &str| -> Result<String, ValidationError> {
            item.get(name)
                .and_then(Value::as_str)
                .map(String::from)
                .ok_or_else(|| invalid("input", format!("`input[{index}].{name}` must be a string")))
        };
        let default_kind = if item.get("role").is_some() { "message" } else { "" };
        let kind = item.get("type").and_then(Value::as_str).unwrap_or(default_kind);
        match kind {
            "message" => {
                let role = match field("role")?.as_str() {
                    // OpenAI's developer messages are its models' system messages.
                    "system" | "developer" => "system",
                    "user" => "user",
                    "assistant" => "assistant",
                    other => return Err(invalid("input", format!("`input[{index}].role` `{other}` is not one of user, assistant, system, developer"))),
                };
                let content = item_text(index, item.get("content").unwrap_or(&Value::Null))?;
                let mut message = json!({"role": role, "content": content});
                if role == "assistant" {
                    if let Some(reasoning) = reasoning.take() {
                        message["reasoning_content"] = Value::String(reasoning);
                    }
                }
                messages.push(message);
            }
            "function_call" => {
                let call = json!({"id": field("call_id")?, "type": "function",
                    "function": {"name": field("name")?, "arguments": field("arguments")?}});
                match messages.last_mut().filter(|last| last["role"] == "assistant") {
                    Some(last) => match last.get_mut("tool_calls").and_then(Value::as_array_mut) {
                        Some(calls) => calls.push(call),
                        None => last["tool_calls"] = json!([call]),
                    },
                    None => {
                        let mut message = json!({"role": "assistant", "content": null, "tool_calls": [call]});
                        if let Some(reasoning) = reasoning.take() {
                            message["reasoning_content"] = Value::String(reasoning);
                        }
                        messages.push(message);
                    }
                }
            }
            "function_call_output" => {
                let output = item_text(index, item.get("output").unwrap_or(&Value::Null))?;
                messages.push(json!({"role": "tool", "tool_call_id": field("call_id")?, "content": output}));
            }
            "reasoning" => {
                // Its text, else its summary's.
                let texts = |name: &str| -> Vec<String> {
                    item.get(name)
                        .and_then(Value::as_array)
                        .into_iter()
                        .flatten()
                        .filter_map(|part| part.get("text").and_then(Value::as_str).map(String::from))
                        .collect()
                };
                let content = texts("content");
                let text = if content.is_empty() { texts("summary").join("\n\n") } else { content.join("") };
                reasoning = Some(text).filter(|text| !text.is_empty());
            }
            "" => return Err(invalid("input", format!("`input[{index}]` has neither a `type` nor a `role`"))),
            other => {
                return Err(invalid("input", format!("`input[{index}]`: items of type `{other}` are not supported (message, function_call, function_call_output and reasoning are)")));
            }
        }
    }
    Ok(messages)
}

/// A message's (or a call output's) text: a string, or its text parts joined.
fn item_text(index: usize, content: &Value) -> Result<String, ValidationError> {
    match content {
        Value::String(text) => Ok(text.clone()),
        Value::Array(parts) => parts
            .iter()
            .map(|part| {
                let kind = part.get("type").and_then(Value::as_str).unwrap_or("");
                let key = match kind {
                    "input_text" | "output_text" | "text" => "text",
                    "refusal" => "refusal",
                    _ => return Err(invalid("input", format!("`input[{index}]`: content of type `{kind}` is not supported (text only)"))),
                };
                part.get(key)
                    .and_then(Value::as_str)
                    .ok_or_else(|| invalid("input", format!("`input[{index}]`: a `{kind}` part needs its `{key}`")))
            })
            .collect::<Result<Vec<_>, _>>()
            .map(|texts| texts.concat()),
        _ => Err(invalid("input", format!("`input[{index}]` needs its content as a string or a list of parts"))),
    }
}

/// The Responses API's flat function tools (`{"type": "function", "name", "parameters", …}`) as
/// the chat route's.
fn chat_tools(tools: &Value) -> Result<Value, ValidationError> {
    let tools = tools.as_array().ok_or_else(|| ValidationError::InvalidTools("`tools` must be a list".into()))?;
    tools
        .iter()
        .enumerate()
        .map(|(index, tool)| {
            let kind = tool.get("type").and_then(Value::as_str).unwrap_or("");
            if kind != "function" {
                return Err(ValidationError::InvalidTools(format!(
                    "`tools[{index}]`: tools of type `{kind}` are not supported (only `function` tools are)"
                )));
            }
            // The chat shape, as some clients send it here too.
            if let Some(function) = tool.get("function") {
                return Ok(json!({"type": "function", "function": function}));
            }
            let mut function = Map::new();
            for field in ["name", "description", "parameters"] {
                if let Some(value) = tool.get(field).filter(|value| !value.is_null()) {
                    function.insert(field.into(), value.clone());
                }
            }
            Ok(json!({"type": "function", "function": function}))
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Value::Array)
}

fn chat_tool_choice(choice: &Value) -> Result<Value, ValidationError> {
    match (choice.as_str(), choice.get("type").and_then(Value::as_str), choice.get("name")) {
        (Some(mode), _, _) => Ok(json!(mode)),
        (None, Some("function"), Some(name)) => Ok(json!({"type": "function", "function": {"name": name}})),
        _ => Err(ValidationError::InvalidTools(format!(
            "`tool_choice` {choice} is not supported (\"auto\", \"none\", \"required\" or {{\"type\": \"function\", \"name\": …}} are)"
        ))),
    }
}

/// `text.format` as the chat route's `response_format`; plain text has none.
fn chat_response_format(format: &Value) -> Result<Option<Value>, ValidationError> {
    match format.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(json!({"type": "json_object"}))),
        Some("json_schema") => {
            let mut schema = Map::new();
            for field in ["name", "schema", "strict", "description"] {
                if let Some(value) = format.get(field).filter(|value| !value.is_null()) {
                    schema.insert(field.into(), value.clone());
                }
            }
            if !schema.contains_key("schema") {
                return Err(invalid("text.format", "a `json_schema` format needs its `schema`".into()));
            }
            Ok(Some(json!({"type": "json_schema", "json_schema": schema})))
        }
        _ => Err(invalid("text.format", format!("{format} is not one of text, json_object, json_schema"))),
    }
}

/// An output item being written.
enum OpenItem {
    Reasoning { id: String, text: String },
    Message { id: String, text: String, logprobs: Vec<Value> },
    Call { id: String, call_id: String, name: String, arguments: String },
}

/// A response's output, built piece by piece: each piece returns the stream's events for it
/// (the whole response ignores them), and the items done so far make the response's `output`.
struct Output {
    id: String,
    created_at: u64,
    model: String,
    repeated: Map<String, Value>,
    items: Vec<Value>,
    open: Option<OpenItem>,
    sequence: u64,
    /// The format the reply's calls are read in, where a parser reads them: Mistral's chat
    /// templates take back only its own form of call id.
    parser: Option<ToolCallParser>,
    /// The conversation this response ends, when it is to be kept (`store`).
    keep: Option<Vec<Value>>,
}

fn item_id(prefix: &str) -> String {
    format!("{prefix}_{:016x}{:016x}", rand::random::<u64>(), rand::random::<u64>())
}

impl Output {
    fn new(model: &str, repeated: Map<String, Value>) -> Self {
        Self {
            id: item_id("resp"),
            created_at: unix_now(),
            model: model.to_string(),
            repeated,
            items: Vec::new(),
            open: None,
            sequence: 0,
            parser: None,
            keep: None,
        }
    }

    /// Keeps the finished `response` with its conversation, if it is to be kept: the input items,
    /// then its output items.
    fn keep(&mut self, store: &ResponseStore, response: &Value) {
        if let Some(mut items) = self.keep.take() {
            items.extend(response["output"].as_array().into_iter().flatten().cloned());
            store.put(response.clone(), items);
        }
    }

    /// An event of the stream: its fields, its type and the next sequence number.
    fn event(&mut self, kind: &str, mut fields: Value) -> Value {
        if let Some(object) = fields.as_object_mut() {
            object.insert("type".into(), json!(kind));
            object.insert("sequence_number".into(), json!(self.sequence));
        }
        self.sequence += 1;
        fields
    }

    /// The response object in its state now.
    fn response(&self, status: &str, usage: Option<Value>, incomplete: Option<&str>) -> Value {
        let mut response = json!({
            "id": self.id, "object": "response", "created_at": self.created_at, "status": status,
            "error": null, "incomplete_details": incomplete.map(|reason| json!({"reason": reason})),
            "model": self.model, "output": self.items, "usage": usage,
        });
        if let Some(object) = response.as_object_mut() {
            object.extend(self.repeated.clone());
        }
        response
    }

    /// `response.created`, `response.in_progress`: the response as it starts.
    fn lifecycle(&mut self, kind: &str) -> Value {
        let response = self.response("in_progress", None, None);
        self.event(kind, json!({"response": response}))
    }

    fn index(&self) -> usize {
        self.items.len()
    }

    fn reasoning(&mut self, piece: &str) -> Vec<Value> {
        let mut events = Vec::new();
        if !matches!(self.open, Some(OpenItem::Reasoning { .. })) {
            events.extend(self.close("completed"));
            let id = item_id("rs");
            let item = json!({"id": id, "type": "reasoning", "summary": [], "content": [], "status": "in_progress"});
            events.push(self.event("response.output_item.added", json!({"output_index": self.index(), "item": item})));
            self.open = Some(OpenItem::Reasoning { id, text: String::new() });
        }
        let index = self.index();
        if let Some(OpenItem::Reasoning { id, text }) = &mut self.open {
            text.push_str(piece);
            let fields = json!({"item_id": id, "output_index": index, "content_index": 0, "delta": piece});
            events.push(self.event("response.reasoning_text.delta", fields));
        }
        events
    }

    /// A piece of the message, with its tokens' logprobs (when asked).
    fn text(&mut self, piece: &str, logprobs: Vec<Value>) -> Vec<Value> {
        let mut events = Vec::new();
        if !matches!(self.open, Some(OpenItem::Message { .. })) {
            events.extend(self.close("completed"));
            let id = item_id("msg");
            let (index, item) = (self.index(), json!({"id": id, "type": "message", "status": "in_progress", "role": "assistant", "content": []}));
            events.push(self.event("response.output_item.added", json!({"output_index": index, "item": item})));
            let part = text_part("", &[]);
            events.push(self.event("response.content_part.added", json!({"item_id": id, "output_index": index, "content_index": 0, "part": part})));
            self.open = Some(OpenItem::Message { id, text: String::new(), logprobs: Vec::new() });
        }
        let index = self.index();
        if let Some(OpenItem::Message { id, text, logprobs: all }) = &mut self.open {
            if !piece.is_empty() {
                text.push_str(piece);
                all.extend(logprobs.iter().cloned());
                let fields = json!({"item_id": id, "output_index": index, "content_index": 0, "delta": piece, "logprobs": logprobs});
                events.push(self.event("response.output_text.delta", fields));
            }
        }
        events
    }

    /// Logprobs of tokens that wrote no text (the end-of-sequence token's): the open message's.
    fn add_logprobs(&mut self, logprobs: Vec<Value>) {
        if let Some(OpenItem::Message { logprobs: all, .. }) = &mut self.open {
            all.extend(logprobs);
        }
    }

    /// Whether the output has an answer (a message or a call) begun.
    fn answered(&self) -> bool {
        matches!(self.open, Some(OpenItem::Message { .. } | OpenItem::Call { .. }))
            || self.items.iter().any(|item| item["type"] != "reasoning")
    }

    /// Whether the output has a reasoning item.
    fn reasoned(&self) -> bool {
        matches!(self.open, Some(OpenItem::Reasoning { .. })) || self.items.iter().any(|item| item["type"] == "reasoning")
    }

    /// A function call begins.
    fn call(&mut self, name: &str) -> Vec<Value> {
        let mut events = self.close("completed");
        let call_id = match self.parser {
            Some(parser @ ToolCallParser::Mistral) => parser.call_id(),
            _ => item_id("call"),
        };
        let id = item_id("fc");
        let item = json!({"id": id, "type": "function_call", "call_id": call_id, "name": name, "arguments": "", "status": "in_progress"});
        events.push(self.event("response.output_item.added", json!({"output_index": self.index(), "item": item})));
        self.open = Some(OpenItem::Call { id, call_id, name: name.to_string(), arguments: String::new() });
        events
    }

    /// A piece of the open call's arguments.
    fn arguments(&mut self, piece: &str) -> Vec<Value> {
        let index = self.index();
        match &mut self.open {
            Some(OpenItem::Call { id, arguments, .. }) if !piece.is_empty() => {
                arguments.push_str(piece);
                let fields = json!({"item_id": id, "output_index": index, "delta": piece});
                vec![self.event("response.function_call_arguments.delta", fields)]
            }
            _ => Vec::new(),
        }
    }

    /// Ends the open item (`status`: `completed`, or `incomplete` when the reply was cut).
    fn close(&mut self, status: &str) -> Vec<Value> {
        let index = self.index();
        let (mut events, item) = match self.open.take() {
            None => return Vec::new(),
            Some(OpenItem::Reasoning { id, text }) => {
                let done = self.event("response.reasoning_text.done", json!({"item_id": id, "output_index": index, "content_index": 0, "text": text}));
                let item = json!({"id": id, "type": "reasoning", "summary": [], "status": status,
                    "content": [{"type": "reasoning_text", "text": text}]});
                (vec![done], item)
            }
            Some(OpenItem::Message { id, text, logprobs }) => {
                let done = self.event("response.output_text.done", json!({"item_id": id, "output_index": index, "content_index": 0, "text": text, "logprobs": logprobs}));
                let part = text_part(&text, &logprobs);
                let part_done = self.event("response.content_part.done", json!({"item_id": id, "output_index": index, "content_index": 0, "part": part}));
                let item = json!({"id": id, "type": "message", "status": status, "role": "assistant", "content": [part]});
                (vec![done, part_done], item)
            }
            Some(OpenItem::Call { id, call_id, name, arguments }) => {
                let done = self.event("response.function_call_arguments.done", json!({"item_id": id, "output_index": index, "name": name, "arguments": arguments}));
                let item = json!({"id": id, "type": "function_call", "call_id": call_id, "name": name, "arguments": arguments, "status": status});
                (vec![done], item)
            }
        };
        events.push(self.event("response.output_item.done", json!({"output_index": index, "item": item})));
        self.items.push(item);
        events
    }

    /// Ends the response: its last item (a reply with no output has an empty message), then
    /// `response.completed`, or `response.incomplete` where `max_output_tokens` cut it. The last
    /// event holds the whole response.
    fn finish(&mut self, end: &GenerationOutput, reasoning_tokens: u32) -> Vec<Value> {
        let cut = end.finish_reason == FinishReason::Length;
        let mut events = Vec::new();
        if self.items.is_empty() && self.open.is_none() {
            events.extend(self.text("", Vec::new()));
        }
        events.extend(self.close(if cut { "incomplete" } else { "completed" }));
        let usage = json!({
            "input_tokens": end.input_length, "output_tokens": end.generated_tokens,
            "total_tokens": end.input_length + end.generated_tokens,
            "input_tokens_details": {"cached_tokens": end.cached_tokens},
            "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
        });
        let (status, kind, reason) = match cut {
            true => ("incomplete", "response.incomplete", Some("max_output_tokens")),
            false => ("completed", "response.completed", None),
        };
        let response = self.response(status, Some(usage), reason);
        events.push(self.event(kind, json!({"response": response})));
        events
    }
}

/// An output text part.
fn text_part(text: &str, logprobs: &[Value]) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs})
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(body: Value) -> Result<ResponsesRequest, String> {
        ResponsesRequest::parse(body, None).map_err(|error| error.to_string())
    }

    #[test]
    fn input_items_become_the_chat_conversation() {
        let request = parse(json!({
            "instructions": "Be brief.",
            "input": [
                {"role": "user", "content": "Roll a die."},
                {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "A die roll."}]},
                {"type": "function_call", "call_id": "call_1", "name": "dice", "arguments": "{\"sides\": 6}"},
                {"type": "function_call", "call_id": "call_2", "name": "dice", "arguments": "{\"sides\": 8}"},
                {"type": "function_call_output", "call_id": "call_1", "output": "4"},
                {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "7"}]},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "4 and 7."}]},
                {"role": "developer", "content": [{"type": "input_text", "text": "Now "}, {"type": "input_text", "text": "again."}]},
            ],
            "max_output_tokens": 12, "temperature": 0.5,
            "tools": [{"type": "function", "name": "dice", "parameters": {"type": "object"}, "strict": true}],
            "tool_choice": {"type": "function", "name": "dice"},
        }))
        .unwrap();
        let chat = serde_json::to_value(&request.chat).unwrap();
        assert_eq!(chat["messages"], json!([
            {"role": "system", "content": "Be brief.", "tool_calls": null, "tool_call_id": null, "reasoning_content": null},
            {"role": "user", "content": "Roll a die.", "tool_calls": null, "tool_call_id": null, "reasoning_content": null},
            {"role": "assistant", "content": null, "tool_call_id": null, "reasoning_content": "A die roll.", "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "dice", "arguments": "{\"sides\": 6}"}},
                {"id": "call_2", "type": "function", "function": {"name": "dice", "arguments": "{\"sides\": 8}"}}]},
            {"role": "tool", "content": "4", "tool_call_id": "call_1", "tool_calls": null, "reasoning_content": null},
            {"role": "tool", "content": "7", "tool_call_id": "call_2", "tool_calls": null, "reasoning_content": null},
            {"role": "assistant", "content": "4 and 7.", "tool_calls": null, "tool_call_id": null, "reasoning_content": null},
            {"role": "system", "content": "Now again.", "tool_calls": null, "tool_call_id": null, "reasoning_content": null},
        ]));
        assert_eq!(chat["tools"], json!([{"type": "function", "function": {"name": "dice", "parameters": {"type": "object"}}}]));
        assert_eq!(chat["tool_choice"], json!({"type": "function", "function": {"name": "dice"}}));
        assert_eq!(request.chat.sampling.max_tokens, Some(12));
        // The response repeats the request's own shapes.
        assert_eq!(request.repeated["tools"][0]["name"], "dice");
        assert_eq!(request.repeated["tool_choice"], json!({"type": "function", "name": "dice"}));
        assert_eq!(request.repeated["temperature"], 0.5);
        assert_eq!(request.repeated["instructions"], "Be brief.");
        assert_eq!(request.repeated["store"], false);
    }

    #[test]
    fn a_text_format_is_the_chats_response_format() {
        let schema = json!({"type": "object", "properties": {"ok": {"type": "boolean"}}});
        let request = parse(json!({"input": "Well?", "text": {"format": {"type": "json_schema", "name": "verdict", "schema": schema, "strict": true}}})).unwrap();
        let chat = serde_json::to_value(&request.chat).unwrap();
        assert_eq!(chat["response_format"], json!({"type": "json_schema", "json_schema": {"name": "verdict", "schema": schema, "strict": true}}));
        assert_eq!(chat["messages"][0]["role"], "user");
        let plain = parse(json!({"input": "Hi", "text": {"format": {"type": "text"}}})).unwrap();
        assert!(serde_json::to_value(&plain.chat).unwrap().get("response_format").is_none_or(Value::is_null));
    }

    #[test]
    fn what_needs_stored_state_or_is_not_text_is_refused() {
        for (body, expected) in [
            // Without a store (`--responses-store-bytes 0`).
            (json!({"input": "Hi", "previous_response_id": "resp_1"}), "previous_response_id"),
            (json!({"input": "Hi", "store": 1}), "store"),
            (json!({"input": "Hi", "conversation": "conv_1"}), "conversation"),
            (json!({"input": "Hi", "background": true}), "background"),
            (json!({"messages": [{"role": "user", "content": "Hi"}]}), "`input`"),
            (json!({"max_output_tokens": 3}), "input"),
            (json!({"input": 3}), "string or a list"),
            (json!({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}), "input_image"),
            (json!({"input": [{"type": "item_reference", "id": "msg_1"}]}), "item_reference"),
            (json!({"input": [{"role": "tool", "content": "x"}]}), "role"),
            (json!({"input": [{"type": "function_call", "name": "dice"}]}), "call_id"),
            (json!({"input": "Hi", "tools": [{"type": "web_search"}]}), "web_search"),
            (json!({"input": "Hi", "text": {"format": {"type": "yaml"}}}), "text.format"),
            (json!({"input": "Hi", "n": 2}), "`n`"),
            (json!({"input": "Hi", "temperature": "hot"}), "invalid type"),
        ] {
            let error = parse(body.clone()).err().unwrap_or_else(|| panic!("{body} was accepted"));
            assert!(error.contains(expected), "{body}: {error}");
        }
        // Given as not set, they are no error.
        assert!(parse(json!({"input": "Hi", "previous_response_id": null, "background": false, "store": true})).is_ok());
    }

    #[test]
    fn logprobs_are_asked_by_include_or_top_logprobs() {
        let chat = |body: Value| serde_json::to_value(parse(body).unwrap().chat).unwrap();
        let included = chat(json!({"input": "Hi", "include": ["message.output_text.logprobs"]}));
        assert_eq!((&included["logprobs"], &included["top_logprobs"]), (&json!(true), &Value::Null));
        let top = chat(json!({"input": "Hi", "top_logprobs": 3}));
        assert_eq!((&top["logprobs"], &top["top_logprobs"]), (&json!(true), &json!(3)));
        assert_eq!(chat(json!({"input": "Hi"}))["logprobs"], false);
        // Another include is not answered, and is logged as such.
        let request = parse(json!({"input": "Hi", "include": ["reasoning.encrypted_content"]})).unwrap();
        assert!(!request.chat.logprobs && request.chat.ignored.contains_key("include"));
    }

    #[test]
    fn fields_not_read_are_logged_as_such() {
        let request = parse(json!({"input": "Hi", "reasoning": {"effort": "low"}, "truncation": "disabled", "user": "u"})).unwrap();
        assert!(request.chat.ignored.contains_key("reasoning") && request.chat.ignored.contains_key("user"));
        assert!(!request.chat.ignored.contains_key("truncation"));
        assert_eq!(request.repeated["reasoning"], json!({"effort": "low"}));
    }

    #[test]
    fn streamed_items_number_their_events_and_end_in_the_whole_response() {
        let mut output = Output::new("m", Map::new());
        let mut events = vec![output.lifecycle("response.created")];
        events.extend(output.reasoning("Think"));
        events.extend(output.reasoning("ing."));
        events.extend(output.text("Hel", Vec::new()));
        events.extend(output.text("lo", Vec::new()));
        events.extend(output.call("dice"));
        events.extend(output.arguments("{}"));
        events.extend(output.close("completed"));
        let numbers: Vec<u64> = events.iter().map(|event| event["sequence_number"].as_u64().unwrap()).collect();
        assert_eq!(numbers, (0..events.len() as u64).collect::<Vec<_>>());
        let kinds: Vec<&str> = events.iter().map(|event| event["type"].as_str().unwrap()).collect();
        assert_eq!(kinds, [
            "response.created",
            "response.output_item.added", "response.reasoning_text.delta", "response.reasoning_text.delta",
            "response.reasoning_text.done", "response.output_item.done",
            "response.output_item.added", "response.content_part.added", "response.output_text.delta", "response.output_text.delta",
            "response.output_text.done", "response.content_part.done", "response.output_item.done",
            "response.output_item.added", "response.function_call_arguments.delta", "response.function_call_arguments.done",
            "response.output_item.done",
        ]);
        assert_eq!(output.items.len(), 3);
        assert_eq!(output.items[0]["content"][0]["text"], "Thinking.");
        assert_eq!(output.items[1]["content"][0]["text"], "Hello");
        assert_eq!(output.items[2]["arguments"], "{}");
        // An item's done event repeats the item its added event announced, by id and index.
        assert_eq!(events[1]["item"]["id"], events[5]["item"]["id"]);
        assert_eq!(events[6]["output_index"], 1);
        assert_eq!(events[13]["item"]["call_id"], output.items[2]["call_id"]);
    }
}
