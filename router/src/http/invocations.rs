//! SageMaker's `/invocations`: one route for every request shape, told apart by its fields as
//! TGI does — `messages` is a chat completion, `prompt` a completion, anything else TGI's
//! `{inputs, parameters, stream}` (answered as `/` answers it). Each shape is then served by
//! its own route's handler, with its validation, errors and streaming.
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::sync::Arc;

use super::extract::JsonBody;
use super::state::AppState;
use super::types::CompatGenerateRequest;
use super::{generate, openai, openai_types};
use crate::error::{ErrorBody, HttpError};

/// The body as the shape it names, or the 422 its route would give.
fn shaped<T: DeserializeOwned>(body: Value) -> Result<T, Response> {
    serde_json::from_value(body).map_err(|error| HttpError::undeserializable(error).into_response())
}

/// A generation, a chat completion or a completion, by the body's fields.
#[utoipa::path(post, path = "/invocations", tag = "Text Generation Inference",
    request_body(content = Object, description = "a chat completion (`messages`), a completion \
        (`prompt`), or TGI's `{inputs, parameters, stream}`"),
    responses((status = 200, description = "as the matching route answers"),
        (status = 422, body = ErrorBody)))]
pub(crate) async fn invocations(
    State(state): State<Arc<AppState>>,
    JsonBody(body): JsonBody<Value>,
) -> Response {
    let has = |field: &str| body.as_object().is_some_and(|o| o.contains_key(field));
    if has("messages") {
        match shaped::<openai_types::ChatRequest>(body) {
            Ok(request) => openai::chat_completions(State(state), JsonBody(request)).await,
            Err(response) => response,
        }
    } else if has("prompt") {
        match shaped::<openai_types::CompletionRequest>(body) {
            Ok(request) => openai::completions(State(state), JsonBody(request)).await,
            Err(response) => response,
        }
    } else {
        match shaped::<CompatGenerateRequest>(body) {
            Ok(request) => generate::compat_generate(State(state), JsonBody(request)).await,
            Err(response) => response,
        }
    }
}
