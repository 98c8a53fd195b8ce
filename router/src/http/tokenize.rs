//! `POST /tokenize` in both servers' shapes, and vLLM's `POST /detokenize`. The path is one;
//! the body says which shape:
//! - TGI's names `inputs` (or `text`): the tokens with their spans in the text (`SimpleToken`).
//! - vLLM's names `prompt` (a text; the tokenizer's special tokens added unless
//!   `add_special_tokens: false`) or `messages` (a conversation rendered as the chat route
//!   renders it — template, tools, `add_generation_prompt`, `continue_final_message`,
//!   `chat_template_kwargs` — with special tokens only on `add_special_tokens: true`), and gets
//!   `{count, max_model_len, tokens, token_strs}` (`token_strs`, the vocabulary's entries, with
//!   `return_token_strs: true`; otherwise null).
//!
//! A conversation's `tokens` are the ids `/v1/chat/completions` serves it with (its
//! `usage.prompt_tokens`), so a client can count a prompt against `max_model_len` before
//! sending it.
use std::sync::Arc;

use axum::extract::State;
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::ToSchema;

use super::extract::JsonBody;
use super::generate::simple_tokens;
use super::openai::prepare_chat;
use super::openai_types::{log_ignored_fields, ChatRequest};
use super::request::{acquire_permit, in_vocabulary};
use super::state::AppState;
use super::types::{GenerateRequest, SimpleToken};
use crate::error::{ErrorBody, HttpError};

/// vLLM's `/tokenize` of a text.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
pub struct TokenizeText {
    /// Not read: the served model and its adapters share one tokenizer.
    #[serde(default)]
    pub model: Option<String>,
    pub prompt: String,
    /// Default true: the tokenizer's special tokens (a BOS) are added, as for a completion.
    #[serde(default)]
    pub add_special_tokens: Option<bool>,
    #[serde(default)]
    pub return_token_strs: Option<bool>,
}

/// vLLM's `/tokenize` of a conversation: the chat route's request, plus the tokenizer options.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
pub struct TokenizeChat {
    #[serde(flatten)]
    pub chat: ChatRequest,
    /// Default false: the chat template writes the special tokens it wants.
    #[serde(default)]
    pub add_special_tokens: Option<bool>,
    #[serde(default)]
    pub return_token_strs: Option<bool>,
}

/// The three bodies `/tokenize` reads (for the API description; the handler reads the body's
/// keys to pick one, so that an error names the shape's own fields).
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
#[serde(untagged)]
#[allow(clippy::large_enum_variant)] // never built: it describes the body
pub enum TokenizeRequest {
    Tgi(GenerateRequest),
    Text(TokenizeText),
    Chat(TokenizeChat),
}

/// vLLM's answer.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, ToSchema)]
pub struct TokenizeResponse {
    pub count: usize,
    /// The most tokens a request may hold, prompt and generated (`--max-total-tokens`).
    pub max_model_len: usize,
    pub tokens: Vec<u32>,
    /// Each token's vocabulary entry (`Ġworld` in a byte-level vocabulary), when asked.
    pub token_strs: Option<Vec<String>>,
}

/// `/tokenize`'s answer, in the request's shape.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, ToSchema)]
#[serde(untagged)]
pub enum TokenizeAnswer {
    Tgi(Vec<SimpleToken>),
    Vllm(TokenizeResponse),
}

/// Tokenize a text or a conversation: TGI's body (`inputs`) or vLLM's (`prompt` or
/// `messages`).
#[utoipa::path(post, path = "/tokenize", tag = "Text Generation Inference",
    request_body = TokenizeRequest,
    responses((status = 200, body = TokenizeAnswer), (status = 422, body = ErrorBody),
        (status = 429, body = ErrorBody)))]
#[tracing::instrument(skip_all)]
pub(crate) async fn tokenize(
    State(state): State<Arc<AppState>>,
    JsonBody(body): JsonBody<Value>,
) -> Result<Json<TokenizeAnswer>, HttpError> {
    let Value::Object(fields) = body else {
        return Err(HttpError::undeserializable("the body must be a JSON object"));
    };
    if fields.contains_key("inputs") || fields.contains_key("text") {
        let request: GenerateRequest = from_fields(fields)?;
        // Tokenizing costs CPU time like generating: it counts against the same limit.
        let _permit = acquire_permit(&state.permits)?;
        return Ok(Json(TokenizeAnswer::Tgi(simple_tokens(&state, request.inputs, true).await?)));
    }
    let (text, add_special_tokens, return_token_strs) = if fields.contains_key("messages") {
        let request: TokenizeChat = from_fields(fields)?;
        log_ignored_fields("/tokenize", &request.chat.ignored);
        let (prompt, _) = prepare_chat(&state, &request.chat)?;
        let _permit = acquire_permit(&state.permits)?;
        let add = request.add_special_tokens.unwrap_or_else(|| prompt.adds_special_tokens());
        (prompt.render(&state)?, add, request.return_token_strs)
    } else if fields.contains_key("prompt") {
        let request: TokenizeText = from_fields(fields)?;
        (request.prompt, request.add_special_tokens.unwrap_or(true), request.return_token_strs)
    } else {
        return Err(HttpError::undeserializable(
            "the body names no text: `inputs` (TGI's form), or `prompt` or `messages` (vLLM's)",
        ));
    };
    let _permit = acquire_permit(&state.permits)?;
    let tokens = state
        .tokenizer
        .encode_off_executor(text, add_special_tokens)
        .await
        .map_err(|error| HttpError::Tokenizer(error.to_string()))?
        .ids;
    let token_strs = return_token_strs
        .unwrap_or(false)
        .then(|| tokens.iter().map(|&id| state.tokenizer.vocabulary_entry(id).unwrap_or_default()).collect());
    Ok(Json(TokenizeAnswer::Vllm(TokenizeResponse {
        count: tokens.len(),
        max_model_len: state.limits.max_total_tokens,
        tokens,
        token_strs,
    })))
}

/// vLLM's `/detokenize` body.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
pub struct DetokenizeRequest {
    #[serde(default)]
    pub model: Option<String>,
    pub tokens: Vec<u32>,
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, ToSchema)]
pub struct DetokenizeResponse {
    /// The tokens' text, special tokens included.
    pub prompt: String,
}

/// The text of token ids (vLLM's `/detokenize`); an id outside the vocabulary is a 422.
#[utoipa::path(post, path = "/detokenize", tag = "Text Generation Inference",
    request_body = DetokenizeRequest,
    responses((status = 200, body = DetokenizeResponse), (status = 422, body = ErrorBody),
        (status = 429, body = ErrorBody)))]
#[tracing::instrument(skip_all)]
pub(crate) async fn detokenize(
    State(state): State<Arc<AppState>>,
    JsonBody(request): JsonBody<DetokenizeRequest>,
) -> Result<Json<DetokenizeResponse>, HttpError> {
    in_vocabulary(&state, request.tokens.iter().copied())?;
    let _permit = acquire_permit(&state.permits)?;
    let tokenizer = state.tokenizer.clone();
    let prompt = tokio::task::spawn_blocking(move || tokenizer.decode(&request.tokens, false))
        .await
        .map_err(|error| HttpError::Tokenizer(error.to_string()))?
        .map_err(|error| HttpError::Tokenizer(error.to_string()))?;
    Ok(Json(DetokenizeResponse { prompt }))
}

/// One of the bodies, from the object's fields; a mismatch is a 422 naming the field.
fn from_fields<T: serde::de::DeserializeOwned>(fields: Map<String, Value>) -> Result<T, HttpError> {
    serde_json::from_value(Value::Object(fields)).map_err(HttpError::undeserializable)
}
