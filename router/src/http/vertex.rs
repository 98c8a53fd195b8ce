//! Vertex AI's prediction route, `POST /vertex`, as TGI serves it: `{"instances": [...]}`, each
//! instance TGI's `{inputs, parameters}` or a chat completion (`messages`), answered as
//! `{"predictions": [text, ...]}` in the instances' order. Each instance runs as its own route
//! runs it (validation, template, parameters; TGI keeps only `max_new_tokens` and `seed` of a
//! generate instance's parameters and samples, which a client cannot tell from its request),
//! all at once; the first error answers for the request, as a batch of completions does.
use std::sync::Arc;
use std::time::Instant;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use super::extract::JsonBody;
use super::generate::full_text;
use super::headers::finished_headers;
use super::openai::{prepare_chat, run_choices};
use super::openai_stream::PromptText;
use super::openai_types::ChatRequest;
use super::request_log::RequestLog;
use super::state::AppState;
use super::types::{GenerateParameters, GenerateRequest};
use crate::error::{ErrorBody, HttpError};
use crate::validation::ValidationError;

const ROUTE: &str = "/vertex";

/// Instances are read one by one (`instance`), so that a malformed one gets its own route's
/// error rather than an untagged enum's "did not match any variant".
#[derive(Debug, Deserialize, ToSchema)]
pub struct VertexRequest {
    /// TGI's `{inputs, parameters}` or a chat completion request (`messages`).
    #[schema(value_type = Vec<Object>)]
    pub instances: Vec<Value>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct VertexResponse {
    /// Each instance's generated text, in order.
    pub predictions: Vec<String>,
}

/// Generates for every instance.
#[utoipa::path(post, path = "/vertex", tag = "Text Generation Inference",
    request_body = VertexRequest,
    responses((status = 200, body = VertexResponse), (status = 422, body = ErrorBody),
        (status = 424, body = ErrorBody), (status = 429, body = ErrorBody)))]
#[tracing::instrument(skip_all, fields(instances = request.instances.len()))]
pub(crate) async fn vertex(
    State(state): State<Arc<AppState>>,
    JsonBody(request): JsonBody<VertexRequest>,
) -> Response {
    let arrival = Instant::now();
    let log = RequestLog::start(ROUTE, arrival);
    let result = async {
        let limit = state.config.max_client_batch_size;
        let count = request.instances.len();
        if count == 0 || count > limit {
            return Err(ValidationError::InstanceCount(limit, count).into());
        }
        let prompts = request
            .instances
            .into_iter()
            .map(|body| instance(&state, body))
            .collect::<Result<Vec<_>, HttpError>>()?;
        let outputs = run_choices(&state, prompts, arrival, &log).await?;
        let (valid, first) = outputs.first().ok_or(HttpError::Incomplete)?;
        // One request with one set of headers and figures: the first instance's, as a batch's.
        let figures = log.succeeded(first, valid.max_new_tokens);
        let headers = finished_headers(&figures, first, &state.config.compute_type, 0);
        let predictions = outputs
            .iter()
            .map(|(valid, output)| full_text(valid, &output.generated_text))
            .collect();
        Ok::<_, HttpError>((headers, Json(VertexResponse { predictions })))
    }
    .await;
    match result {
        Ok(response) => response.into_response(),
        Err(error) => {
            log.failed(&error);
            error.into_response()
        }
    }
}

/// One instance, by its fields: `messages` is a chat completion, anything else TGI's generate
/// request. A chat instance answers with one choice, not streamed; with `tools`, its prediction
/// is the call as generated (JSON).
fn instance(
    state: &AppState,
    body: Value,
) -> Result<(PromptText, GenerateParameters), HttpError> {
    let has = |field: &str| body.as_object().is_some_and(|o| o.contains_key(field));
    let shape_error = |error: serde_json::Error| HttpError::undeserializable(format!("instances: {error}"));
    if has("messages") {
        let request: ChatRequest = serde_json::from_value(body).map_err(shape_error)?;
        // One prediction per instance, answered at once.
        if request.stream {
            return Err(ValidationError::Unsupported("stream").into());
        }
        if request.sampling.choices() != 1 {
            return Err(ValidationError::Unsupported("n").into());
        }
        prepare_chat(state, &request)
    } else {
        let request: GenerateRequest = serde_json::from_value(body).map_err(shape_error)?;
        Ok((PromptText::Text(request.inputs), request.parameters))
    }
}
