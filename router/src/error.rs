//! The HTTP-facing error enum and its one mapping to a status code and a stable `error_type`
//! (TGI's names, so that TGI's clients raise the matching exception).
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};

use crate::chat_template::TemplateError;
use crate::engine::api::EngineError;
use crate::engine::{AdapterChange, AdapterError};
use crate::validation::ValidationError;

#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("Input validation error: {0}")]
    Validation(#[from] ValidationError),
    #[error("Template error: {0}")]
    Template(#[from] TemplateError),
    #[error("Request failed during generation: {0}")]
    Generation(String),
    /// Every concurrency permit (`--max-concurrent-requests`) is taken: 429 at once, as TGI
    /// answers, with `Retry-After` (`CONCURRENCY_RETRY_AFTER_S`).
    #[error("Model is overloaded")]
    Overloaded,
    /// The request cannot meet its objective here now (SLO admission, queue time-out): 429, with
    /// `Retry-After` when known, so a router can send it elsewhere.
    #[error("Model is overloaded: {message}")]
    SloOverloaded { message: String, retry_after_s: Option<u64> },
    #[error("Request failed during generation: the generation ended without a result")]
    Incomplete,
    #[error("unhealthy: {0}")]
    Unhealthy(String),
    /// The server cannot take the request now (shard recovering, or shutting down); retry, with
    /// `Retry-After` when it will be back here.
    #[error("Service unavailable: {message}")]
    Unavailable { message: String, retry_after_s: Option<u64> },
    #[error("Unauthorized")]
    Unauthorized,
    /// `GET /v1/models/{id}` for a model this server does not serve.
    #[error("The model `{0}` does not exist")]
    ModelNotFound(String),
    /// A Responses API id this server does not keep (`GET`/`DELETE /v1/responses/{id}`,
    /// `previous_response_id`): never kept, deleted, or gone for room.
    #[error("Response with id '{0}' not found.")]
    ResponseNotFound(String),
    /// A path no route serves (`POST /v1/embeddings` to a text generator, a typo): TGI's body
    /// shape instead of an empty 404.
    #[error("{0}: no such route on this server, which generates text; /docs lists its routes")]
    RouteNotFound(String),
    #[error("Payload too large: the request body is over {0} bytes")]
    PayloadTooLarge(usize),
    /// The body is not a request of this route (bad JSON, wrong types, missing fields): the
    /// whole message, as axum's rejections word it (`HttpError::undeserializable` for a detail).
    #[error("{0}")]
    BadRequestBody(String),
    #[error("Tokenizer error: {0}")]
    Tokenizer(String),
    #[error("Metrics recorder error: {0}")]
    Metrics(String),
    /// A run-time LoRA adapter load or unload that did not happen.
    #[error("{0}")]
    Adapter(#[from] AdapterError),
    /// `/v1/load_lora_adapter` or `/v1/unload_lora_adapter` without `--allow-runtime-lora-updating`.
    #[error("Loading and unloading LoRA adapters at run time is off: start the server with --allow-runtime-lora-updating (or VLLM_ALLOW_RUNTIME_LORA_UPDATING=true)")]
    RuntimeLoraOff,
}

impl From<EngineError> for HttpError {
    fn from(error: EngineError) -> Self {
        match error {
            EngineError::Unavailable(_) | EngineError::Draining => {
                HttpError::Unavailable { message: error.to_string(), retry_after_s: error.retry_after_s() }
            }
            EngineError::SloUnreachable { .. } | EngineError::QueueTimeout { .. } => {
                HttpError::SloOverloaded { message: error.to_string(), retry_after_s: error.retry_after_s() }
            }
            other => HttpError::Generation(other.to_string()),
        }
    }
}

/// TGI's error body: `{"error": …, "error_type": …}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ErrorBody {
    pub error: String,
    pub error_type: String,
}

impl HttpError {
    /// A body that is JSON but not this route's request, worded as axum's `Json` rejection
    /// words it (and TGI answers): `detail` is serde's error.
    pub fn undeserializable(detail: impl std::fmt::Display) -> Self {
        HttpError::BadRequestBody(format!("Failed to deserialize the JSON body into the target type: {detail}"))
    }

    pub fn status(&self) -> StatusCode {
        match self {
            HttpError::Validation(_) | HttpError::Template(_) | HttpError::BadRequestBody(_) => {
                StatusCode::UNPROCESSABLE_ENTITY
            }
            HttpError::Tokenizer(_) => StatusCode::UNPROCESSABLE_ENTITY,
            HttpError::Generation(_) => StatusCode::FAILED_DEPENDENCY,
            HttpError::Overloaded | HttpError::SloOverloaded { .. } => StatusCode::TOO_MANY_REQUESTS,
            HttpError::Incomplete | HttpError::Metrics(_) => StatusCode::INTERNAL_SERVER_ERROR,
            HttpError::Unhealthy(_) | HttpError::Unavailable { .. } => StatusCode::SERVICE_UNAVAILABLE,
            HttpError::Unauthorized => StatusCode::UNAUTHORIZED,
            HttpError::ModelNotFound(_) | HttpError::ResponseNotFound(_) | HttpError::RouteNotFound(_) => StatusCode::NOT_FOUND,
            HttpError::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            HttpError::Adapter(error) => match error {
                AdapterError::Change(AdapterChange::NotFound(_)) => StatusCode::NOT_FOUND,
                // Requests hold every adapter `--max-loras` could evict: it passes once one ends.
                AdapterError::Change(AdapterChange::Busy(_)) => StatusCode::SERVICE_UNAVAILABLE,
                AdapterError::Change(_) | AdapterError::Refused { .. } => StatusCode::BAD_REQUEST,
                AdapterError::Engine { error: EngineError::Unavailable(_) | EngineError::Draining, .. } => {
                    StatusCode::SERVICE_UNAVAILABLE
                }
                AdapterError::Engine { .. } => StatusCode::INTERNAL_SERVER_ERROR,
            },
            HttpError::RuntimeLoraOff => StatusCode::NOT_FOUND,
        }
    }

    /// Stable machine-readable kind; also the `err` label of `superinfer_request_failure`.
    pub fn error_type(&self) -> &'static str {
        match self {
            HttpError::Validation(_) | HttpError::BadRequestBody(_) | HttpError::Tokenizer(_) => {
                "validation"
            }
            HttpError::Template(_) => "template_error",
            HttpError::Generation(_) => "generation",
            HttpError::Overloaded | HttpError::SloOverloaded { .. } => "overloaded",
            HttpError::Incomplete => "incomplete_generation",
            HttpError::Unhealthy(_) => "healthcheck",
            HttpError::Unavailable { .. } => "unavailable",
            HttpError::Unauthorized => "unauthorized",
            HttpError::ModelNotFound(_) | HttpError::ResponseNotFound(_) | HttpError::RouteNotFound(_) => "not_found",
            HttpError::PayloadTooLarge(_) => "payload_too_large",
            HttpError::Metrics(_) => "metrics",
            HttpError::Adapter(AdapterError::Change(AdapterChange::NotFound(_))) => "not_found",
            HttpError::Adapter(AdapterError::Engine { .. }) => "lora_adapter_not_loaded",
            HttpError::Adapter(_) => "lora_adapter",
            HttpError::RuntimeLoraOff => "not_found",
        }
    }

    pub fn body(&self) -> ErrorBody {
        ErrorBody {
            error: self.to_string(),
            error_type: self.error_type().to_string(),
        }
    }

    /// The OpenAI streaming routes' error shape: `{"error":{"message":…,"http_status_code":…}}`.
    pub fn openai_stream_body(&self) -> serde_json::Value {
        serde_json::json!({
            "error": {"message": self.to_string(), "http_status_code": self.status().as_u16()}
        })
    }
}

/// The `Retry-After` of a request refused for want of a concurrency permit: one frees when any
/// request in flight ends, which at a full server is a matter of steps, so the shortest
/// header value; a router in front may send it elsewhere at once.
pub const CONCURRENCY_RETRY_AFTER_S: u64 = 1;

impl HttpError {
    /// The server refuses the request for now (its load, a drain or a recovery), not for what it
    /// asks: a client or a router may retry it, here later or elsewhere.
    pub fn is_refusal(&self) -> bool {
        matches!(self, HttpError::Overloaded | HttpError::SloOverloaded { .. } | HttpError::Unavailable { .. })
    }

    /// Seconds after which a retry may succeed here (the `Retry-After` header), when known.
    pub fn retry_after_s(&self) -> Option<u64> {
        match self {
            HttpError::SloOverloaded { retry_after_s, .. } | HttpError::Unavailable { retry_after_s, .. } => *retry_after_s,
            HttpError::Overloaded => Some(CONCURRENCY_RETRY_AFTER_S),
            _ => None,
        }
    }
}

impl HttpError {
    /// The error as a response: its status, TGI's body and `Retry-After` when known.
    pub fn response(&self) -> Response {
        let mut response = (self.status(), Json(self.body())).into_response();
        if let Some(seconds) = self.retry_after_s() {
            response.headers_mut().insert(axum::http::header::RETRY_AFTER, axum::http::HeaderValue::from(seconds));
        }
        response
    }
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        self.response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_error_maps_to_tgi_status_and_type() {
        let cases = [
            (
                HttpError::Validation(ValidationError::EmptyInput),
                422,
                "validation",
            ),
            (
                HttpError::Template(TemplateError::Render("x".into())),
                422,
                "template_error",
            ),
            (
                HttpError::Generation("shard died".into()),
                424,
                "generation",
            ),
            (HttpError::Overloaded, 429, "overloaded"),
            (HttpError::Incomplete, 500, "incomplete_generation"),
            (HttpError::Unhealthy("down".into()), 503, "healthcheck"),
            (HttpError::Unavailable { message: "draining".into(), retry_after_s: None }, 503, "unavailable"),
            (HttpError::Unauthorized, 401, "unauthorized"),
            (HttpError::PayloadTooLarge(10), 413, "payload_too_large"),
            (
                HttpError::BadRequestBody("missing field".into()),
                422,
                "validation",
            ),
        ];
        for (error, status, error_type) in cases {
            assert_eq!(error.status().as_u16(), status, "{error}");
            assert_eq!(error.error_type(), error_type, "{error}");
        }
    }

    #[test]
    fn validation_messages_carry_tgi_prefix() {
        let body = HttpError::from(ValidationError::EmptyInput).body();
        assert_eq!(
            body.error,
            "Input validation error: `inputs` cannot be empty"
        );
        assert_eq!(body.error_type, "validation");
        let json = serde_json::to_value(&body).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"error": body.error, "error_type": "validation"})
        );
    }

    #[test]
    fn engine_errors_are_generation_errors() {
        let error = HttpError::from(EngineError::Shard("boom".into()));
        assert_eq!(error.status(), StatusCode::FAILED_DEPENDENCY);
        assert_eq!(
            error.to_string(),
            "Request failed during generation: shard error: boom"
        );
        let stream = error.openai_stream_body();
        assert_eq!(stream["error"]["http_status_code"], 424);
        for refused in [EngineError::Draining, EngineError::Unavailable("step timed out".into())] {
            assert_eq!(HttpError::from(refused).status(), StatusCode::SERVICE_UNAVAILABLE);
        }
        // A recovering shard is probed again within a second: a retry then may succeed here. A
        // draining server will not take it again.
        let recovering = HttpError::from(EngineError::Unavailable("step timed out".into())).response();
        assert_eq!(recovering.headers()[axum::http::header::RETRY_AFTER], "1");
        let draining = HttpError::from(EngineError::Draining).response();
        assert!(draining.headers().get(axum::http::header::RETRY_AFTER).is_none());
    }

    #[test]
    fn a_full_server_says_when_to_retry() {
        let full = HttpError::Overloaded.response();
        assert_eq!(full.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(full.headers()[axum::http::header::RETRY_AFTER], CONCURRENCY_RETRY_AFTER_S.to_string().as_str());
    }
}
