//! The HTTP layer: TGI's API and the OpenAI-compatible routes over the engine.
//! - `state`: `HttpConfig` and the state handlers share; `request`: validation of one request;
//!   `generation`: one generation (detokenization, stop sequences, details).
//! - routes: `generate` (TGI), `openai` (chat and completions; `tools`: tool calls under a
//!   grammar), `responses` (OpenAI's Responses API over the chat route), `info` (health,
//!   info, metrics, models), `lora` (LoRA adapters loaded and unloaded at run time), `openapi` (spec and docs page), `worker_api` (what a load-balancing router in front asks: load, server info, render).
//! - plumbing: `types` / `openai_types` (bodies), `extract` (JSON body, API key), `sse`,
//!   `headers`, `stop`, `trace` (the request span, continuing the client's trace),
//!   `request_log` (a request's outcome: metrics and its one log line).
//! - serving: `listener` (accept loop, connection cap, graceful shutdown), `connection` (one
//!   connection's protocols and timeouts).
mod connection;
mod extract;
mod generate;
mod generation;
mod headers;
mod info;
mod invocations;
mod listener;
mod logprobs;
pub(crate) mod lora;
mod openai;
mod openai_stream;
pub mod openai_types;
mod openapi;
pub mod reasoning;
mod request;
mod request_log;
pub(crate) mod response_store;
mod responses;
mod sse;
mod state;
mod stop;
mod tokenize;
pub mod tool_parser;
mod tools;
#[cfg(test)]
mod tests;
mod trace;
pub mod types;
mod vertex;
mod worker_api;

use std::sync::Arc;
use std::time::Duration;

use axum::extract::DefaultBodyLimit;
use axum::http::{HeaderValue, Method};
use axum::routing::{get, post};
use axum::{middleware, Router};
use tower_http::cors::{AllowOrigin, CorsLayer};

pub use connection::ConnectionTimeouts;
pub use listener::{serve, ConnectionLimits};
pub use state::{ConfigError, HttpConfig};

use crate::engine::{EngineHandle, ModelInfo};

/// How long `serve` waits for open connections once told to stop. Requests in flight are
/// drained (or failed) by the engine before that, so what is left is mostly idle kept-alive
/// connections, which close at once; this bounds a client that does not read its answer.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(3);

/// The routes and the limits their connections are served with (`serve`).
pub struct App {
    pub routes: Router,
    pub connections: ConnectionLimits,
}

/// Builds the app: every route, the API-key check on the generation routes, the payload limit
/// and CORS.
pub fn router(
    config: HttpConfig,
    engine: EngineHandle,
    info: &ModelInfo,
) -> Result<App, ConfigError> {
    let payload_limit = config.payload_limit;
    let connections = ConnectionLimits {
        max_connections: config.max_connections,
        timeouts: ConnectionTimeouts {
            header_timeout: config.http_header_timeout,
            idle_timeout: config.http_idle_timeout,
        },
        drain_timeout: DRAIN_TIMEOUT,
    };
    let cors = cors_layer(&config.cors_allow_origin)?;
    let state = Arc::new(state::AppState::new(config, engine, info)?);
    let generation_routes = Router::new()
        .route("/", post(generate::compat_generate))
        .route("/generate", post(generate::generate))
        .route("/generate_stream", post(generate::generate_stream))
        .route("/tokenize", post(tokenize::tokenize))
        .route("/detokenize", post(tokenize::detokenize))
        .route("/chat_tokenize", post(generate::chat_tokenize))
        .route("/v1/chat/completions", post(openai::chat_completions))
        .route("/v1/completions", post(openai::completions))
        .route("/v1/responses", post(responses::responses))
        .route("/v1/responses/{id}", get(responses::retrieve).delete(responses::delete))
        .route("/invocations", post(invocations::invocations))
        .route("/vertex", post(vertex::vertex))
        .route("/v1/chat/completions/render", post(worker_api::render_chat))
        .route("/v1/completions/render", post(worker_api::render_completion))
        .route("/v1/load_lora_adapter", post(lora::load_lora_adapter))
        .route("/v1/unload_lora_adapter", post(lora::unload_lora_adapter))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            extract::require_api_key,
        ))
        // Outermost, so a refused key is traced too. The generation routes only: a trace per
        // scrape of /metrics or probe of /health would bury theirs.
        .route_layer(middleware::from_fn(trace::request_span));
    let open_routes = Router::new()
        // As TGI: GET / is a health probe (POST / generates, behind the key).
        .route("/", get(info::root))
        .route("/health", get(info::health))
        .route("/ping", get(info::ping))
        .route("/info", get(info::info))
        .route("/version", get(info::version))
        .route("/metrics", get(info::metrics))
        .route("/v1/models", get(info::models))
        .route("/v1/models/{model}", get(info::model))
        .route("/get_load", get(worker_api::get_load))
        .route("/get_server_info", get(worker_api::get_server_info))
        .route("/get_model_info", get(worker_api::get_model_info))
        .route("/kv_event_sources", get(worker_api::kv_event_sources))
        .route("/health_generate", get(worker_api::health_generate))
        .route("/api-doc/openapi.json", get(openapi::openapi_json))
        .route("/docs", get(openapi::docs));
    let mut app = generation_routes
        .merge(open_routes)
        .fallback(unknown_route)
        .layer(DefaultBodyLimit::max(payload_limit))
        .with_state(state);
    if let Some(cors) = cors {
        app = app.layer(cors);
    }
    Ok(App {
        routes: app,
        connections,
    })
}

/// A path no route serves: a 404 in TGI's error shape, naming what was asked for.
async fn unknown_route(method: Method, uri: axum::http::Uri) -> crate::error::HttpError {
    crate::error::HttpError::RouteNotFound(format!("{method} {}", uri.path()))
}

pub(crate) fn cors_layer(origins: &[String]) -> Result<Option<CorsLayer>, ConfigError> {
    if origins.is_empty() {
        return Ok(None);
    }
    let allow_origin = if origins.iter().any(|origin| origin == "*") {
        AllowOrigin::any()
    } else {
        let values = origins
            .iter()
            .map(|origin| {
                HeaderValue::from_str(origin).map_err(|_| ConfigError::CorsOrigin(origin.clone()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        AllowOrigin::list(values)
    };
    Ok(Some(
        CorsLayer::new()
            .allow_methods([Method::GET, Method::POST])
            .allow_headers([
                axum::http::header::CONTENT_TYPE,
                axum::http::header::AUTHORIZATION,
            ])
            .allow_origin(allow_origin),
    ))
}
