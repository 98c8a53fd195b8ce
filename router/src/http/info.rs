//! The read-only routes: `/health` (and `/ping`), `/info`, `/metrics`, `/v1/models`.
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;
use axum::Json;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::state::AppState;
use super::types::Info;
use crate::error::{ErrorBody, HttpError};

/// Ok when the engine runs and the shard answers.
#[utoipa::path(get, path = "/health", tag = "Text Generation Inference",
    responses((status = 200, description = "Everything is working fine"),
        (status = 503, description = "The shard is down", body = ErrorBody)))]
#[tracing::instrument(skip_all)]
pub(crate) async fn health(State(state): State<Arc<AppState>>) -> Result<(), HttpError> {
    state
        .engine
        .health()
        .await
        .map_err(|error| HttpError::Unhealthy(error.to_string()))
}

/// Same as `/health` (the name SageMaker probes).
#[utoipa::path(get, path = "/ping", tag = "Text Generation Inference",
    responses((status = 200, description = "Everything is working fine"),
        (status = 503, description = "The shard is down", body = ErrorBody)))]
pub(crate) async fn ping(state: State<Arc<AppState>>) -> Result<(), HttpError> {
    health(state).await
}

/// Same as `/health`: TGI answers `GET /` as a health probe (`POST /` generates).
#[utoipa::path(get, path = "/", tag = "Text Generation Inference",
    responses((status = 200, description = "Everything is working fine"),
        (status = 503, description = "The shard is down", body = ErrorBody)))]
pub(crate) async fn root(state: State<Arc<AppState>>) -> Result<(), HttpError> {
    health(state).await
}

/// Served model and server limits.
#[utoipa::path(get, path = "/info", tag = "Text Generation Inference",
    responses((status = 200, body = Info)))]
pub(crate) async fn info(State(state): State<Arc<AppState>>) -> Json<Info> {
    let config = &state.config;
    Json(Info {
        model_id: state.model_id.clone(),
        model_sha: None,
        model_pipeline_tag: Some("text-generation".to_string()),
        max_concurrent_requests: config.max_concurrent_requests,
        max_best_of: config.max_best_of,
        max_stop_sequences: config.max_stop_sequences,
        max_input_tokens: config.max_input_tokens,
        max_total_tokens: config.max_total_tokens,
        validation_workers: 1,
        max_client_batch_size: config.max_client_batch_size,
        router: env!("CARGO_PKG_NAME").to_string(),
        version: env!("CARGO_PKG_VERSION").to_string(),
        sha: None,
        docker_label: None,
        num_shard: state.num_shard,
    })
}

/// vLLM's `/version`: the server's version.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Version {
    pub version: String,
}

/// The server's version (vLLM's route; `/info` has it too).
#[utoipa::path(get, path = "/version", tag = "Router", responses((status = 200, body = Version)))]
pub(crate) async fn version() -> Json<Version> {
    Json(Version { version: env!("CARGO_PKG_VERSION").to_string() })
}

/// Prometheus metrics.
#[utoipa::path(get, path = "/metrics", tag = "Text Generation Inference",
    responses((status = 200, description = "Prometheus text format", body = String)))]
pub(crate) async fn metrics(State(state): State<Arc<AppState>>) -> impl IntoResponse {
    (
        [(CONTENT_TYPE, "text/plain; version=0.0.4")],
        crate::metrics::render(&state.metrics),
    )
}

/// OpenAI's model object, with vLLM's additions that its clients and routers read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ModelCard {
    pub id: String,
    pub object: String,
    pub created: u64,
    pub owned_by: String,
    /// The model a LoRA adapter runs on (the served model's id); null for the served model.
    pub parent: Option<String>,
    /// The longest prompt plus generation a request may ask for (`--max-total-tokens`).
    pub max_model_len: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ModelList {
    pub object: String,
    pub data: Vec<ModelCard>,
}

/// The served model and its LoRA adapters, OpenAI style: a request's `model` picks one.
#[utoipa::path(get, path = "/v1/models", tag = "OpenAI", responses((status = 200, body = ModelList)))]
pub(crate) async fn models(State(state): State<Arc<AppState>>) -> Json<ModelList> {
    Json(ModelList { object: "list".to_string(), data: model_cards(&state) })
}

/// One of the served models (`client.models.retrieve`); 404 for any other id.
#[utoipa::path(get, path = "/v1/models/{model}", tag = "OpenAI",
    params(("model" = String, Path, description = "the served model's id or an adapter's")),
    responses((status = 200, body = ModelCard), (status = 404, body = ErrorBody)))]
pub(crate) async fn model(
    State(state): State<Arc<AppState>>,
    Path(model): Path<String>,
) -> Result<Json<ModelCard>, HttpError> {
    model_cards(&state)
        .into_iter()
        .find(|card| card.id == model)
        .map(Json)
        .ok_or(HttpError::ModelNotFound(model))
}

/// The served model, then its adapters.
fn model_cards(state: &AppState) -> Vec<ModelCard> {
    let created = super::openai_types::unix_now();
    let card = |id: &str, parent: Option<&str>| ModelCard {
        id: id.to_string(),
        object: "model".to_string(),
        created,
        owned_by: state.model_id.clone(),
        parent: parent.map(str::to_string),
        max_model_len: state.limits.max_total_tokens,
    };
    let mut cards = vec![card(&state.model_id, None)];
    cards.extend(state.engine.adapters().ids().iter().map(|adapter| card(adapter, Some(&state.model_id))));
    cards
}
