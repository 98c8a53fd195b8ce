//! The OpenAI-compatible routes: `/v1/chat/completions` and `/v1/completions`, streamed
//! (`data: [DONE]` at the end, usage on request) or not. Both run through the same
//! validation and generation as TGI's routes.
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::future::try_join_all;

use super::extract::JsonBody;
use super::generate::run_candidates;
use super::generation::GenerationOutput;
use super::headers::{finished_headers, stream_headers};
use super::logprobs::{chat_logprobs, choice_logprobs, legacy_logprobs, prompt_logprobs, vllm_prompt_logprobs, LegacyToken};
use super::openai_stream::{
    fingerprint, openai_stream, ChoiceUpdate, PreparedPrompt, PromptText, ResponseIdentity,
    StreamPlan,
};
use super::openai_types::*;
use super::request::{acquire_permit, ValidRequest};
use super::request_log::RequestLog;
use super::reasoning::{ChoiceSplitters, ReasoningParser, ReasoningSplitter};
use super::state::AppState;
use super::tool_parser::{CallDelta, ParsedCall, ToolCallSplitter, Whole};
use super::tools::{self, CallStream, ChoiceCalls, ToolAnswer, ToolReading, ToolStream};
use super::types::GenerateParameters;
use crate::chat_template::{Conversation, TemplateMessage};
use crate::error::{ErrorBody, HttpError};
use crate::tokenizer::Tokenizer;
use crate::validation::ValidationError;

const CHAT_ROUTE: &str = "/v1/chat/completions";
const COMPLETIONS_ROUTE: &str = "/v1/completions";
/// The id of a reply's call under TGI's grammar, by its place: `"0"` for the first (TGI's own
/// id for its one call), `"1"` for the next.
fn grammar_call_id(index: usize) -> String {
    index.to_string()
}

/// Chat completion over the model's chat template.
#[utoipa::path(post, path = "/v1/chat/completions", tag = "OpenAI",
    request_body = ChatRequest,
    responses((status = 200, body = ChatCompletion), (status = 422, body = ErrorBody)))]
#[tracing::instrument(skip_all, fields(stream = request.stream))]
pub(crate) async fn chat_completions(
    State(state): State<Arc<AppState>>,
    JsonBody(request): JsonBody<ChatRequest>,
) -> Response {
    let arrival = Instant::now();
    log_ignored_fields(CHAT_ROUTE, &request.ignored);
    let stream = request.stream;
    let usage = UsageReports::of(request.stream_options.as_ref());
    let prepared = prepare_chat(&state, &request);
    let reading = tool_reading(&state, &request);
    let calls_tools = reading != ToolReading::None;
    let echo = chat_echo(&request);
    // `n` choices: the same conversation n times, n engine requests, admitted together: the
    // first computes the prompt, the others share its full blocks through the prefix cache.
    let prepared = prepared.and_then(|(prompt, parameters)| {
        let n = choice_count(&state, request.sampling.choices(), 1)?;
        if calls_tools && request.echo {
            return Err(HttpError::from(ValidationError::Unsupported("`echo` with `tools`")));
        }
        Ok(choice_parameters(&parameters, n).into_iter().map(|p| (prompt.clone(), p)).collect::<Vec<_>>())
    });
    // A grammar (a format, tools) holds the reply after its reasoning where the model's tags are
    // tokens; otherwise from its first token, and the reply has no reasoning.
    let constrained = matches!(&prepared, Ok(choices) if choices.iter().any(|(_, p)| p.grammar.is_some()));
    let reasoning_parser = reasoning_parser_for(&state, constrained);
    if stream {
        let headers = stream_headers(&state.config.compute_type, 0);
        let choices = prepared.as_ref().map_or(1, Vec::len);
        let plan = StreamPlan {
            route: CHAT_ROUTE,
            prompts: match prepared {
                Ok(choices) => choices.into_iter().map(Ok).collect(),
                Err(error) => vec![Err(error)],
            },
            usage,
            identity: ResponseIdentity::new(&state.model_id, "chat.completion.chunk").with_logprobs(request.logprobs),
            arrival,
            choices_per_prompt: choices,
            echo: false,
        };
        // Each choice's calls are read on their own.
        let tools = reading.stream();
        let reasoning = reasoning_parser.map(ChoiceSplitters::new);
        let echo = echo.map(ChoiceEcho::new);
        let tokenizer = state.tokenizer.clone();
        let chunk = move |identity: &ResponseIdentity, update: ChoiceUpdate<'_>| {
            let chunk = chat_chunk(identity, update, tools.as_ref(), reasoning.as_ref(), echo.as_ref(), &tokenizer);
            serde_json::to_value(chunk).unwrap_or_default()
        };
        return openai_stream(state, headers, plan, Arc::new(chunk)).await;
    }
    let log = RequestLog::start(CHAT_ROUTE, arrival);
    let result = async {
        let outputs = run_choices(&state, prepared?, arrival, &log).await?;
        let (valid, first) = outputs.first().ok_or(HttpError::Incomplete)?;
        let figures = log.succeeded(first, valid.max_new_tokens);
        let headers = finished_headers(&figures, first, &state.config.compute_type, 0);
        let logprobs = valid.parameters.top_n_tokens > 0 || request.logprobs;
        Ok::<_, HttpError>((
            headers,
            Json(chat_completion(&state, &outputs, logprobs, reading, reasoning_parser, echo.as_deref())),
        ))
    }
    .await;
    respond(result, &log)
}

/// How the reply to `request` has its tool calls read (`ToolReading::of`, with the server's
/// `--tool-call-parser` and whether its chat template writes the tools).
pub(super) fn tool_reading(state: &AppState, request: &ChatRequest) -> ToolReading {
    let renders_tools = state.chat_template().is_ok_and(|template| template.renders_tools());
    let parallel = request.parallel_tool_calls.unwrap_or(true);
    ToolReading::of(request.tools.as_ref(), request.tool_choice.as_ref(), parallel, state.config.tool_call_parser, renders_tools)
}

/// The parser that splits a chat reply's reasoning from its answer: the server's, unless a
/// grammar (`constrained`) holds the reply from its first token, as it does where the model's
/// reasoning tags are not tokens (the reply then has no reasoning).
pub(super) fn reasoning_parser_for(state: &AppState, constrained: bool) -> Option<ReasoningParser> {
    state.config.reasoning_parser.filter(|_| !constrained || state.reasoning_tokens.is_some())
}

/// Choices of a request: `n` per prompt, checked against the limit on sequences per request
/// (`--max-client-batch-size`, which also bounds the prompts).
fn choice_count(state: &AppState, n: u32, prompts: usize) -> Result<usize, HttpError> {
    let limit = state.config.max_client_batch_size;
    let n = n as usize;
    if n == 0 || n.saturating_mul(prompts) > limit {
        return Err(ValidationError::ChoiceCount(limit, n).into());
    }
    Ok(n)
}

/// The parameters of `n` choices of one prompt: with a seed, choice j samples with seed + j,
/// so that the choices differ and the response is still reproducible.
fn choice_parameters(parameters: &GenerateParameters, n: usize) -> Vec<GenerateParameters> {
    (0..n as u64)
        .map(|j| GenerateParameters {
            seed: parameters.seed.map(|seed| seed.wrapping_add(j)),
            ..parameters.clone()
        })
        .collect()
}

/// Runs every choice at once (each under its own permit) and returns them in order.
pub(super) async fn run_choices(
    state: &Arc<AppState>,
    choices: Vec<(PromptText, GenerateParameters)>,
    arrival: Instant,
    log: &RequestLog,
) -> Result<Vec<(ValidRequest, GenerationOutput)>, HttpError> {
    let runs = choices.into_iter().map(|(prompt, parameters)| async move {
        let _permit = acquire_permit(&state.permits)?;
        let valid = prompt.validate(state, &parameters, arrival).await?;
        let (output, _) = run_candidates(state, &valid, log).await?;
        Ok::<_, HttpError>((valid, output))
    });
    try_join_all(runs).await
}

/// Text completion of one prompt or a batch of them (up to `max_client_batch_size`).
#[utoipa::path(post, path = "/v1/completions", tag = "OpenAI",
    request_body = CompletionRequest,
    responses((status = 200, body = Completion), (status = 422, body = ErrorBody)))]
#[tracing::instrument(skip_all, fields(stream = request.stream))]
pub(crate) async fn completions(
    State(state): State<Arc<AppState>>,
    JsonBody(request): JsonBody<CompletionRequest>,
) -> Response {
    let arrival = Instant::now();
    log_ignored_fields(COMPLETIONS_ROUTE, &request.ignored);
    let usage = UsageReports::of(request.stream_options.as_ref());
    let prepared = prepare_completion(&state, &request);
    if request.stream {
        let headers = stream_headers(&state.config.compute_type, 0);
        let prompts: Vec<PreparedPrompt> = match prepared {
            Ok(prompts) => prompts.into_iter().map(Ok).collect(),
            Err(error) => vec![Err(error)],
        };
        let plan = StreamPlan {
            route: COMPLETIONS_ROUTE,
            prompts,
            usage,
            identity: ResponseIdentity::new(&state.model_id, "text_completion")
                .with_logprobs(request.logprobs.is_some()),
            arrival,
            choices_per_prompt: request.sampling.choices() as usize,
            echo: request.echo,
        };
        let tokenizer = state.tokenizer.clone();
        let chunk = move |identity: &ResponseIdentity, update: ChoiceUpdate<'_>| completion_chunk(identity, update, &tokenizer);
        return openai_stream(state, headers, plan, Arc::new(chunk)).await;
    }
    let log = RequestLog::start(COMPLETIONS_ROUTE, arrival);
    let result = async {
        let outputs = run_choices(&state, prepared?, arrival, &log).await?;
        let (valid, first) = outputs.first().ok_or(HttpError::Incomplete)?;
        // One request with one set of headers and figures: the first prompt's, as TGI's.
        let figures = log.succeeded(first, valid.max_new_tokens);
        let headers = finished_headers(&figures, first, &state.config.compute_type, 0);
        let logprobs = request.logprobs.is_some();
        let n = request.sampling.choices() as usize;
        Ok::<_, HttpError>((headers, Json(completion(&state, &outputs, logprobs, request.echo, n))))
    }
    .await;
    respond(result, &log)
}

pub(super) fn respond<T: IntoResponse>(result: Result<T, HttpError>, log: &RequestLog) -> Response {
    match result {
        Ok(response) => response.into_response(),
        Err(error) => {
            log.failed(&error);
            error.into_response()
        }
    }
}

/// The conversation (rendered later, under the permit) and its generation parameters.
pub(super) fn prepare_chat(
    state: &AppState,
    request: &ChatRequest,
) -> Result<(PromptText, GenerateParameters), HttpError> {
    if request.messages.is_empty() {
        return Err(ValidationError::EmptyConversation.into());
    }
    // Under TGI's grammar a list of calls is asked for, not assumed: a model not told of the
    // list (TGI's instruction asks for one call) may add call after call to the token limit.
    let list = request.parallel_tool_calls == Some(true);
    let tool_plan = tools::plan(request.tools.as_ref(), request.tool_choice.as_ref(), request.tool_prompt.as_deref(), list)?;
    if tool_plan.is_some() && request.sampling.asks_for_format() {
        return Err(ValidationError::InvalidTools("`tools` and `response_format` (or structured outputs) cannot be used together".into()).into());
    }
    let add_generation_prompt = request.add_generation_prompt.unwrap_or(!request.continue_final_message);
    if add_generation_prompt && request.continue_final_message {
        return Err(ValidationError::ContinueWithGenerationPrompt.into());
    }
    let variables = request.chat_template_kwargs.clone().unwrap_or_default();
    if let Some(name) = variables.keys().find(|name| Conversation::RESERVED.contains(&name.as_str())) {
        return Err(ValidationError::TemplateVariable(name.clone()).into());
    }
    // A model without a usable template is refused before the request waits for a permit.
    let template = state.chat_template()?;
    let mut messages = request
        .messages
        .iter()
        .enumerate()
        .map(|(index, message)| template_message(index, message, template.renders_tool_calls()))
        .collect::<Result<Vec<_>, ValidationError>>()?;
    let top_n_tokens = request.logprobs.then(|| request.top_logprobs.unwrap_or(0));
    let mut parameters = request.sampling.to_parameters(top_n_tokens)?;
    parameters.truncate = request.sampling.truncate(state.limits.max_input_tokens)?;
    parameters.adapter_id = state.adapter_for_model(request.model.as_deref());
    parameters.reasoning_first = true;
    // Reasoning tags that are special tokens are read from a text that keeps them.
    if state.config.reasoning_parser.is_some() {
        parameters.kept_special_tokens.extend(super::reasoning::special_tags(&state.tokenizer));
    }
    let tools = match (tool_plan, tool_reading(state, request)) {
        // The template writes the tools with its model's own instruction; the reply is free.
        (Some(_), ToolReading::Parser { parser, .. }) => {
            // A format whose tags are special tokens is read from a text that keeps them.
            parameters.kept_special_tokens.extend(parser.special_tags(&state.tokenizer));
            request.tools.clone()
        }
        (Some(plan), _) => {
            // As TGI: the instruction and the tools follow the last message, for templates
            // that do not render `tools` themselves.
            if let Some(last) = messages.last_mut() {
                last.content.push_str(&plan.prompt_suffix);
            }
            parameters.grammar = Some(plan.grammar.to_tgi());
            request.tools.clone()
        }
        (None, _) => None,
    };
    let conversation = Conversation {
        messages,
        tools,
        add_generation_prompt,
        continue_final_message: request.continue_final_message,
        variables,
    };
    Ok((PromptText::Chat(conversation), parameters))
}

/// One message as the template reads it. Its content is required unless it is an assistant's
/// tool calls (OpenAI's rule); the calls go to templates that render them, and are written in
/// the content, as JSON, for those that do not.
fn template_message(index: usize, message: &ChatMessage, renders_tool_calls: bool) -> Result<TemplateMessage, ValidationError> {
    let content = message.content.as_ref().map(MessageContent::text).transpose()?;
    let calls = message.tool_calls.as_ref().filter(|calls| !calls.is_empty());
    if calls.is_some() && message.role != "assistant" {
        return Err(ValidationError::Message(index, "only an assistant message can hold `tool_calls`"));
    }
    if content.is_none() && calls.is_none() {
        return Err(ValidationError::Message(index, "`content` is required unless the message holds `tool_calls`"));
    }
    if message.reasoning_content.is_some() && message.role != "assistant" {
        return Err(ValidationError::Message(index, "only an assistant message can hold `reasoning_content`"));
    }
    let mut template_message = TemplateMessage::new(&message.role, &content.unwrap_or_default());
    template_message.tool_call_id = message.tool_call_id.clone();
    template_message.reasoning_content = message.reasoning_content.clone();
    if let Some(calls) = calls {
        if renders_tool_calls {
            template_message.tool_calls = Some(calls.iter().map(template_tool_call).collect());
        } else {
            let written = serde_json::to_string(calls).unwrap_or_default();
            template_message.content = match template_message.content.is_empty() {
                true => written,
                false => format!("{}\n{written}", template_message.content),
            };
        }
    }
    Ok(template_message)
}

/// A call as Hugging Face templates read it: the arguments as an object (they write them with
/// `tojson`) where the caller's string is JSON, else the string as sent.
fn template_tool_call(call: &ToolCall) -> serde_json::Value {
    let arguments = serde_json::from_str::<serde_json::Value>(&call.function.arguments)
        .unwrap_or_else(|_| serde_json::Value::String(call.function.arguments.clone()));
    serde_json::json!({
        "id": call.id,
        "type": call.kind,
        "function": {"name": call.function.name, "arguments": arguments},
    })
}

pub(super) fn prepare_completion(
    state: &AppState,
    request: &CompletionRequest,
) -> Result<Vec<(PromptText, GenerateParameters)>, HttpError> {
    if request.suffix.is_some() {
        return Err(ValidationError::Unsupported("suffix").into());
    }
    let prompts: Vec<PromptText> = match &request.prompt {
        Prompt::One(prompt) => vec![PromptText::Text(prompt.clone())],
        Prompt::Many(prompts) => prompts.iter().cloned().map(PromptText::Text).collect(),
        Prompt::Tokens(ids) => vec![PromptText::Tokens(ids.clone())],
        Prompt::ManyTokens(prompts) => prompts.iter().cloned().map(PromptText::Tokens).collect(),
    };
    if prompts.is_empty() {
        return Err(ValidationError::EmptyPromptList.into());
    }
    let limit = state.config.max_client_batch_size;
    if prompts.len() > limit {
        return Err(ValidationError::ClientBatchSize(limit, prompts.len()).into());
    }
    let n = choice_count(state, request.sampling.choices(), prompts.len())?;
    let mut parameters = request.sampling.to_parameters(request.logprobs)?;
    parameters.truncate = request.sampling.truncate(state.limits.max_input_tokens)?;
    parameters.adapter_id = state.adapter_for_model(request.model.as_deref());
    // An echoed prompt's logprobs are the prompt's, computed with it.
    parameters.decoder_input_details = request.echo && request.logprobs.is_some();
    if let Some(best_of) = request.best_of.filter(|&best_of| best_of != 1) {
        if n != 1 {
            return Err(ValidationError::BestOfChoices(n as u32).into());
        }
        parameters.best_of = Some(best_of as usize);
    }
    // OpenAI's order: prompt by prompt, each prompt's n choices together.
    Ok(prompts
        .into_iter()
        .flat_map(|prompt| {
            choice_parameters(&parameters, n).into_iter().map(move |p| (prompt.clone(), p))
        })
        .collect())
}

/// vLLM's chat `echo`: the last message's text, where that message has the reply's role (the
/// assistant's under a generation prompt, else the last message's own, as vLLM names the role).
fn chat_echo(request: &ChatRequest) -> Option<String> {
    let last = request.messages.last().filter(|_| request.echo)?;
    let generation_prompt = request.add_generation_prompt.unwrap_or(!request.continue_final_message);
    if generation_prompt && last.role != "assistant" {
        return None;
    }
    last.content.as_ref().and_then(|content| content.text().ok()).filter(|text| !text.is_empty())
}

/// The echo of a stream's choices: each choice's first chunk starts with it.
pub(super) struct ChoiceEcho {
    text: String,
    sent: Mutex<std::collections::HashSet<u32>>,
}

impl ChoiceEcho {
    fn new(text: String) -> Self {
        Self { text, sent: Mutex::default() }
    }

    /// The echo, the first time choice `index` asks.
    fn take(&self, index: u32) -> Option<&str> {
        let mut sent = self.sent.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        sent.insert(index).then_some(self.text.as_str())
    }
}

/// The assistant's answer: its text (the reply after its reasoning, under a reasoning parser),
/// or the tool calls the text holds (`reading`), with OpenAI's finish reason for it.
fn answer(text: &str, output: &GenerationOutput, reading: ToolReading) -> (Option<String>, Option<Vec<ToolCall>>, String) {
    let reason = finish_reason(output.finish_reason);
    if let Some(splitter) = reading.splitter() {
        let parser = splitter.parser();
        let call = |ParsedCall { name, arguments }| ToolCall { id: parser.call_id(), kind: "function".into(), function: FunctionCall { name, arguments } };
        let Whole { content, calls, called } = splitter.split_whole(text);
        if calls.is_empty() {
            return (content.or_else(|| Some(String::new())), None, reason);
        }
        let reason = if called { "tool_calls".into() } else { reason };
        return (content, Some(calls.into_iter().map(call).collect()), reason);
    }
    if reading == ToolReading::None {
        return (Some(text.to_string()), None, reason);
    }
    let grammar_calls = |calls: Vec<ParsedCall>| -> Vec<ToolCall> {
        let call = |(index, ParsedCall { name, arguments })| ToolCall {
            id: grammar_call_id(index),
            kind: "function".into(),
            function: FunctionCall { name, arguments },
        };
        calls.into_iter().enumerate().map(call).collect()
    };
    match tools::parse_answer(text) {
        Some(ToolAnswer::Calls(calls)) => (None, Some(grammar_calls(calls)), "tool_calls".into()),
        Some(ToolAnswer::Text(text)) => (Some(text), None, reason),
        // Cut short: the calls it finished, else the text as it is.
        None => match tools::complete_calls(text) {
            calls if calls.is_empty() => (Some(text.to_string()), None, reason),
            calls => (None, Some(grammar_calls(calls)), reason),
        },
    }
}

/// The whole reply of each choice; `reasoning_parser` where its reasoning is split out (under a
/// grammar, only where the grammar held after the reasoning); `echo` starts each choice's text.
fn chat_completion(
    state: &AppState,
    outputs: &[(ValidRequest, GenerationOutput)],
    logprobs: bool,
    reading: ToolReading,
    reasoning_parser: Option<ReasoningParser>,
    echo: Option<&str>,
) -> ChatCompletion {
    let identity = ResponseIdentity::new(&state.model_id, "chat.completion.chunk");
    let choices = outputs
        .iter()
        .enumerate()
        .map(|(index, (valid, output))| {
            let (reasoning_content, text) = match reasoning_parser {
                Some(parser) => ReasoningSplitter::split_whole(parser, &valid.inputs, &output.generated_text),
                None => (None, output.generated_text.clone()),
            };
            let (mut content, tool_calls, finish_reason) = answer(&text, output, reading);
            if let (Some(echo), Some(content)) = (echo, content.as_mut()) {
                content.insert_str(0, echo);
            }
            ChatChoice {
                index: index as u32,
                message: AssistantMessage {
                    role: "assistant".to_string(),
                    reasoning_content,
                    content,
                    tool_calls,
                },
                logprobs: logprobs.then(|| chat_logprobs(&state.tokenizer, &output.tokens, &output.top_tokens)),
                finish_reason,
            }
        })
        .collect();
    ChatCompletion {
        id: identity.id,
        object: "chat.completion".to_string(),
        created: identity.created,
        model: identity.model,
        system_fingerprint: fingerprint(),
        choices,
        // The conversation counts once, every choice's tokens each.
        usage: usage_of(outputs, outputs.len()),
        prompt_logprobs: outputs.first().and_then(|(valid, output)| prompt_logprobs_of(state, valid, output)),
    }
}

/// The usage of outputs that are `n` choices per prompt, in order: each prompt (and its cached
/// part) counts once, every choice's tokens each.
fn usage_of(outputs: &[(ValidRequest, GenerationOutput)], n: usize) -> Usage {
    outputs.iter().enumerate().fold(Usage::new(0, 0).with_cached(0), |usage, (index, (_, output))| {
        let choice = Usage::new(output.input_length, output.generated_tokens).with_cached(output.cached_tokens);
        usage.plus(choice, index % n.max(1) == 0)
    })
}

/// vLLM's `prompt_logprobs` of one output, when its request asked for them.
fn prompt_logprobs_of(
    state: &AppState,
    valid: &ValidRequest,
    output: &GenerationOutput,
) -> Option<Vec<Option<serde_json::Map<String, serde_json::Value>>>> {
    let top_n = valid.parameters.prompt_top_n?;
    Some(vllm_prompt_logprobs(&state.tokenizer, &output.prefill, &output.prefill_top_tokens, top_n as usize))
}

fn completion(state: &AppState, outputs: &[(ValidRequest, GenerationOutput)], logprobs: bool, echo: bool, n: usize) -> Completion {
    let identity = ResponseIdentity::new(&state.model_id, "text_completion");
    Completion {
        id: identity.id,
        object: "text_completion".to_string(),
        created: identity.created,
        model: identity.model,
        system_fingerprint: fingerprint(),
        choices: outputs
            .iter()
            .enumerate()
            .map(|(index, (valid, output))| CompletionChoice {
                index: index as u32,
                text: match echo {
                    true => format!("{}{}", valid.inputs, output.generated_text),
                    false => output.generated_text.clone(),
                },
                logprobs: logprobs.then(|| {
                    let top_n = valid.parameters.top_n_tokens as usize;
                    choice_logprobs(&state.tokenizer, output, echo.then_some(valid.inputs.as_str()), top_n)
                }),
                finish_reason: Some(finish_reason(output.finish_reason)),
                prompt_logprobs: prompt_logprobs_of(state, valid, output),
            })
            .collect(),
        usage: Some(usage_of(outputs, n)),
    }
}

/// One chunk per token. Under TGI's tool grammar (`tools`) the tokens' text is not content:
/// the chunks carry the call as it grows (its name once complete, then pieces of its
/// arguments), and the last one what is left of it, or the `no_tool` text. Under a tool-call
/// parser the text is content until a call begins, and each call comes whole in the chunk
/// that closes it. Under a reasoning parser (`reasoning`) each piece goes to
/// `reasoning_content` or content; calls are read from the content. (The Responses API's
/// stream reads its delta.)
pub(super) fn chat_chunk(
    identity: &ResponseIdentity,
    update: ChoiceUpdate<'_>,
    tools: Option<&ToolStream>,
    reasoning: Option<&ChoiceSplitters>,
    echo: Option<&ChoiceEcho>,
    tokenizer: &Tokenizer,
) -> ChatCompletionChunk {
    let generated_reason = update.finish.map(|output| finish_reason(output.finish_reason));
    // Under a reasoning parser the reasoning is a field of its own; the rest is the reply.
    let (mut text, reasoning_content) = match reasoning {
        Some(splitters) => {
            let split = splitters.push(update.index, update.prompt, &update.text, update.finish.is_some());
            (split.content, Some(split.reasoning).filter(|text| !text.is_empty()))
        }
        None => (update.text.clone(), None),
    };
    if let Some(echoed) = echo.and_then(|echo| echo.take(update.index)) {
        text.insert_str(0, echoed);
    }
    let (content, tool_calls, finish) = match tools {
        // A chunk of reasoning alone has no content.
        None if text.is_empty() && reasoning_content.is_some() => (None, None, generated_reason),
        None => (Some(text), None, generated_reason),
        Some(tools) => {
            let (finish, has_reasoning) = (update.finish, reasoning_content.is_some());
            tools.with(update.index, finish.is_some(), |calls| match calls {
                ChoiceCalls::Parser(splitter) => parsed_calls_chunk(splitter, &text, finish.is_some(), has_reasoning, generated_reason),
                ChoiceCalls::Grammar(call) => grammar_chunk(call, &text, finish, reasoning, update.prompt, generated_reason),
            })
        }
    };
    let logprobs = update
        .token
        .filter(|_| identity.logprobs || !update.top_tokens.is_empty())
        .map(|token| chat_logprobs(tokenizer, std::slice::from_ref(token), &[update.top_tokens.to_vec()]));
    ChatCompletionChunk {
        id: identity.id.clone(),
        object: "chat.completion.chunk".to_string(),
        created: identity.created,
        model: identity.model.clone(),
        system_fingerprint: fingerprint(),
        choices: vec![ChatChunkChoice {
            index: update.index,
            delta: Delta {
                role: "assistant".to_string(),
                reasoning_content,
                content,
                tool_calls,
            },
            logprobs,
            finish_reason: finish,
        }],
        usage: None,
    }
}

/// What a chunk carries of a reply read by a tool-call parser: its content, the pieces of
/// calls it adds (a call's first carries its id, type and name), and the finish reason
/// (`tool_calls` where the reply called).
fn parsed_calls_chunk(
    splitter: &mut ToolCallSplitter,
    text: &str,
    last: bool,
    has_reasoning: bool,
    generated_reason: Option<String>,
) -> (Option<String>, Option<Vec<ToolCallChunk>>, Option<String>) {
    let mut parsed = splitter.push(text);
    if last {
        let rest = splitter.finish();
        parsed.content.push_str(&rest.content);
        parsed.calls.extend(rest.calls);
    }
    let calls = (!parsed.calls.is_empty()).then(|| {
        let pieces = parsed.calls.into_iter();
        pieces
            .map(|CallDelta { index, name, arguments }| ToolCallChunk {
                index,
                id: name.is_some().then(|| splitter.parser().call_id()),
                kind: name.is_some().then(|| "function".to_string()),
                function: FunctionCallChunk { name, arguments },
            })
            .collect::<Vec<_>>()
    });
    let content = (!parsed.content.is_empty() || (calls.is_none() && !has_reasoning)).then_some(parsed.content);
    let finish = generated_reason.map(|reason| if splitter.called() { "tool_calls".to_string() } else { reason });
    (content, calls, finish)
}

/// What a chunk carries of a reply under TGI's tool grammar: no content but the `no_tool`
/// answer (or a reply the grammar did not finish), and the calls' pieces as they grow.
fn grammar_chunk(
    call: &mut CallStream,
    text: &str,
    finish: Option<&GenerationOutput>,
    reasoning: Option<&ChoiceSplitters>,
    prompt: &str,
    generated_reason: Option<String>,
) -> (Option<String>, Option<Vec<ToolCallChunk>>, Option<String>) {
    let (content, pieces, finish) = match finish {
        None => (None, call.push(text), None),
        Some(output) => {
            let last = call.push(text);
            let answer = match reasoning {
                Some(splitters) => ReasoningSplitter::split_whole(splitters.parser(), prompt, &output.generated_text).1,
                None => output.generated_text.clone(),
            };
            match tools::parse_answer(&answer) {
                Some(answer @ ToolAnswer::Calls(_)) => {
                    let pieces = tools::joined(last, call.finish(&answer));
                    (None, pieces, Some("tool_calls".into()))
                }
                Some(ToolAnswer::Text(text)) => (Some(text), Vec::new(), generated_reason),
                // Cut short: the calls begun stay as sent, else the text is all.
                None if call.started() => (None, last, generated_reason),
                None => (Some(answer), Vec::new(), generated_reason),
            }
        }
    };
    let calls = (!pieces.is_empty()).then(|| pieces.into_iter().map(grammar_call_chunk).collect());
    (content, calls, finish)
}

/// A piece of a call under TGI's grammar as a chunk's tool call: the first carries its id and
/// type.
fn grammar_call_chunk(piece: CallDelta) -> ToolCallChunk {
    let first = piece.name.is_some();
    ToolCallChunk {
        index: piece.index,
        id: first.then(|| grammar_call_id(piece.index as usize)),
        kind: first.then(|| "function".to_string()),
        function: FunctionCallChunk { name: piece.name, arguments: piece.arguments },
    }
}

fn completion_chunk(identity: &ResponseIdentity, update: ChoiceUpdate<'_>, tokenizer: &Tokenizer) -> serde_json::Value {
    let chunk = Completion {
        id: identity.id.clone(),
        object: "text_completion".to_string(),
        created: identity.created,
        model: identity.model.clone(),
        system_fingerprint: fingerprint(),
        choices: vec![CompletionChoice {
            index: update.index,
            logprobs: match (&update.echoed, update.token) {
                _ if !identity.logprobs => None,
                (Some(echoed), _) => Some(prompt_logprobs(tokenizer, echoed.tokens, echoed.top_tokens, None)),
                (None, Some(token)) => Some(legacy_logprobs(tokenizer, [LegacyToken::generated(token, update.top_tokens)], None)),
                (None, None) => None,
            },
            text: update.text,
            finish_reason: update
                .finish
                .map(|output| finish_reason(output.finish_reason)),
            prompt_logprobs: None,
        }],
        usage: None,
    };
    serde_json::to_value(chunk).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat_template::ChatTemplate;

    /// A template that renders `tool_calls` (as Qwen 2.5's and Llama 3.1's do) gets each call
    /// with its arguments as an object, and the content stays the caller's.
    #[test]
    fn templates_that_render_tool_calls_read_the_arguments_as_an_object() {
        let source = "{% for m in messages %}{{ m.role }}:{{ m.content }}{% for c in m.tool_calls or [] %}\
            <{{ c.function.name }} {{ c.function.arguments.sides }} {{ c.function.arguments | tojson }}>{% endfor %}\
            {% if m.tool_call_id %}[{{ m.tool_call_id }}]{% endif %};{% endfor %}";
        let template = ChatTemplate::new(source, None, None).unwrap();
        assert!(template.renders_tool_calls());
        let message: ChatMessage = serde_json::from_value(serde_json::json!({"role": "assistant", "content": null,
            "tool_calls": [{"id": "7", "type": "function", "function": {"name": "dice", "arguments": "{\"sides\": 6}"}}]}))
        .unwrap();
        let result: ChatMessage =
            serde_json::from_value(serde_json::json!({"role": "tool", "tool_call_id": "7", "content": "4"})).unwrap();
        let messages = [template_message(0, &message, true).unwrap(), template_message(1, &result, true).unwrap()];
        assert_eq!(messages[0].content, "");
        let rendered = template.render(&messages, false).unwrap();
        assert_eq!(rendered, "assistant:<dice 6 {\"sides\": 6}>;tool:4[7];");
    }
}
