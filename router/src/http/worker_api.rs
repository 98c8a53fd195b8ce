//! The routes a load-balancing router asks of its workers (vllm-router's contract with a vLLM
//! or SGLang worker), answered from the engine's and the model's real state:
//! - `/get_load`: the requests the engine holds (`power_of_two` balances on `load`);
//! - `/get_server_info`: model, instance and KV block size (its KV index keys on these);
//! - `/get_model_info`: the model's path and that it generates;
//! - `/kv_event_sources`: where its KV-cache events are published (`kv_aware` subscribes);
//! - `/health_generate`: a health check that generates one token;
//! - `/v1/chat/completions/render`, `/v1/completions/render`: the token ids a request would be
//!   served with (`cache_aware` and `kv_aware` place requests on them), without generating.
//!
//! Owns no state: every answer is read from `AppState` and the engine handle when asked.
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::extract::JsonBody;
use super::openai::{prepare_chat, prepare_completion};
use super::openai_stream::PromptText;
use super::openai_types::{ChatRequest, CompletionRequest};
use super::request::acquire_permit;
use super::state::AppState;
use super::types::GenerateParameters;
use crate::engine::api::{EngineEvent, GenerationRequest, SamplingParams};
use crate::engine::EngineLoad;
use crate::error::{ErrorBody, HttpError};
use crate::kv_events::KvEventSource;
use crate::trace_context;

/// How long `/health_generate` waits for its one token before it reports the engine stuck.
const HEALTH_GENERATE_DEADLINE: Duration = Duration::from_secs(30);
/// What `/health_generate` generates from.
const HEALTH_GENERATE_PROMPT: &str = "Hi";

/// The engine's requests as of its last turn.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct WorkerLoad {
    /// Every request the engine holds: `running + waiting + rotated`.
    pub load: u32,
    /// Requests with their KV on device.
    pub running: u32,
    /// Requests waiting for device KV (admission or readmission).
    pub waiting: u32,
    /// Requests whose KV is on host (rotated out).
    pub rotated: u32,
}

impl From<EngineLoad> for WorkerLoad {
    fn from(load: EngineLoad) -> Self {
        Self { load: load.requests(), running: load.running, waiting: load.waiting, rotated: load.rotated }
    }
}

/// What a router learns about this worker when it adds it. One flat object: a router reads the
/// fields it knows and ignores the others, so a field is added here without breaking one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ServerInfo {
    /// The served model name (requests' `model`, `/v1/models`).
    pub model_id: String,
    /// Where the shard loaded the model from.
    pub model_path: String,
    /// This server process, unique among replicas: events and cache state are keyed on it.
    pub instance_id: String,
    /// "regular": serves prefill and decode.
    pub worker_type: String,
    /// Tokens per KV block (a cached prefix is reused in whole blocks).
    pub kv_block_size: u32,
    pub num_device_blocks: u32,
    pub num_host_blocks: u32,
    /// Shard processes (tensor-parallel degree).
    pub tensor_parallel_size: u32,
    pub max_input_tokens: usize,
    pub max_total_tokens: usize,
    pub max_concurrent_requests: usize,
    pub dtype: String,
    pub device_type: String,
    pub version: String,
}

impl ServerInfo {
    fn of(state: &AppState) -> Self {
        let info = &state.info;
        Self {
            model_id: state.model_id.clone(),
            model_path: info.model_id.clone(),
            instance_id: state.instance_id.clone(),
            worker_type: "regular".to_string(),
            kv_block_size: info.block_size,
            num_device_blocks: info.num_device_blocks,
            num_host_blocks: info.num_host_blocks,
            tensor_parallel_size: info.world_size,
            max_input_tokens: state.config.max_input_tokens,
            max_total_tokens: state.config.max_total_tokens,
            max_concurrent_requests: state.config.max_concurrent_requests,
            dtype: info.dtype.clone(),
            device_type: info.device_type.clone(),
            version: env!("CARGO_PKG_VERSION").to_string(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ServedModel {
    pub model_path: String,
    pub tokenizer_path: String,
    pub is_generation: bool,
}

/// One prompt's token ids, as the engine would get them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct RenderedPrompt {
    pub token_ids: Vec<u32>,
}

/// The requests the engine holds (vllm-router's `power_of_two` reads `load`).
#[utoipa::path(get, path = "/get_load", tag = "Router",
    responses((status = 200, body = WorkerLoad)))]
pub(crate) async fn get_load(State(state): State<Arc<AppState>>) -> Json<WorkerLoad> {
    Json(state.engine.load().into())
}

/// Model, instance and KV cache facts for a router's worker registry and KV index.
#[utoipa::path(get, path = "/get_server_info", tag = "Router",
    responses((status = 200, body = ServerInfo)))]
pub(crate) async fn get_server_info(State(state): State<Arc<AppState>>) -> Json<ServerInfo> {
    Json(ServerInfo::of(&state))
}

/// Where this server publishes its KV-cache events, by data-parallel rank (vLLM's
/// `KVEventsConfig` fields, with the wire format they use); 404 when it publishes none.
#[utoipa::path(get, path = "/kv_event_sources", tag = "Router",
    responses((status = 200, body = std::collections::BTreeMap<String, KvEventSource>),
        (status = 404, description = "KV-cache events are off", body = ErrorBody)))]
pub(crate) async fn kv_event_sources(State(state): State<Arc<AppState>>) -> Response {
    let sources = &state.config.kv_event_sources;
    if sources.is_empty() {
        let body = ErrorBody { error: "KV-cache events are off (--kv-events-config)".into(), error_type: "not_found".into() };
        return (StatusCode::NOT_FOUND, Json(body)).into_response();
    }
    Json(sources).into_response()
}

/// The served model (SGLang's shape).
#[utoipa::path(get, path = "/get_model_info", tag = "Router",
    responses((status = 200, body = ServedModel)))]
pub(crate) async fn get_model_info(State(state): State<Arc<AppState>>) -> Json<ServedModel> {
    Json(ServedModel {
        model_path: state.info.model_id.clone(),
        tokenizer_path: state.info.model_id.clone(),
        is_generation: true,
    })
}

/// Ok once the engine has generated one token for a one-token probe: unlike `/health`, this
/// proves a step runs end to end. Under SLO admission a busy server refuses the probe (429).
#[utoipa::path(get, path = "/health_generate", tag = "Router",
    responses((status = 200, description = "A token was generated"),
        (status = 429, description = "Refused under load (SLO admission)", body = ErrorBody),
        (status = 503, description = "The engine cannot generate", body = ErrorBody)))]
#[tracing::instrument(skip_all)]
pub(crate) async fn health_generate(State(state): State<Arc<AppState>>) -> Result<(), HttpError> {
    let encoded = state
        .tokenizer
        .encode_off_executor(HEALTH_GENERATE_PROMPT.to_string(), true)
        .await
        .map_err(|error| HttpError::Tokenizer(error.to_string()))?;
    let mut stream = state.engine.submit(probe_request(encoded.ids))?;
    let generated = tokio::time::timeout(HEALTH_GENERATE_DEADLINE, async {
        loop {
            match stream.recv().await {
                Some(EngineEvent::Finished { .. }) => return Ok(()),
                Some(EngineEvent::Failed(error)) => return Err(HttpError::from(error)),
                Some(_) => {}
                None => return Err(HttpError::Incomplete),
            }
        }
    })
    .await;
    match generated {
        Ok(result) => result,
        Err(_) => Err(HttpError::Unhealthy(format!(
            "no token within {} s",
            HEALTH_GENERATE_DEADLINE.as_secs()
        ))),
    }
}

/// One greedy token, at the default priority and objectives.
fn probe_request(prompt_token_ids: Vec<u32>) -> GenerationRequest {
    GenerationRequest {
        prompt_token_ids,
        sampling: SamplingParams::greedy(),
        max_new_tokens: 1,
        ignore_eos: true,
        prompt_logprobs: false,
        prompt_top_n: None,
        top_n_tokens: 0,
        slo: None,
        priority: 0,
        arrival: Instant::now(),
        span_context: trace_context::span_context(&tracing::Span::current()),
        constraint: None,
        adapter: None,
    }
}

/// The token ids `/v1/chat/completions` would serve this conversation with.
#[utoipa::path(post, path = "/v1/chat/completions/render", tag = "Router",
    request_body = ChatRequest,
    responses((status = 200, body = RenderedPrompt), (status = 422, body = ErrorBody),
        (status = 429, body = ErrorBody)))]
#[tracing::instrument(skip_all)]
pub(crate) async fn render_chat(
    State(state): State<Arc<AppState>>,
    JsonBody(request): JsonBody<ChatRequest>,
) -> Result<Json<RenderedPrompt>, HttpError> {
    let (prompt, parameters) = prepare_chat(&state, &request)?;
    let _permit = acquire_permit(&state.permits)?;
    Ok(Json(render(&state, prompt, &parameters).await?))
}

/// The token ids `/v1/completions` would serve each prompt with, in order (one per prompt,
/// whatever `n`).
#[utoipa::path(post, path = "/v1/completions/render", tag = "Router",
    request_body = CompletionRequest,
    responses((status = 200, body = [RenderedPrompt]), (status = 422, body = ErrorBody),
        (status = 429, body = ErrorBody)))]
#[tracing::instrument(skip_all)]
pub(crate) async fn render_completion(
    State(state): State<Arc<AppState>>,
    JsonBody(request): JsonBody<CompletionRequest>,
) -> Result<Json<Vec<RenderedPrompt>>, HttpError> {
    // Each prompt comes `n` times in a row, once per choice; its tokens are the same each time.
    let choices = request.sampling.choices().max(1) as usize;
    let prompts = prepare_completion(&state, &request)?;
    let _permit = acquire_permit(&state.permits)?;
    let mut rendered = Vec::with_capacity(prompts.len() / choices);
    for (prompt, parameters) in prompts.into_iter().step_by(choices) {
        rendered.push(render(&state, prompt, &parameters).await?);
    }
    Ok(Json(rendered))
}

/// Validates and tokenizes as the generation route does (truncation and length rules
/// included), so the ids are those the engine would get.
async fn render(
    state: &AppState,
    prompt: PromptText,
    parameters: &GenerateParameters,
) -> Result<RenderedPrompt, HttpError> {
    let valid = prompt.validate(state, parameters, Instant::now()).await?;
    Ok(RenderedPrompt { token_ids: valid.prompt_ids })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn load_counts_every_request_the_engine_holds() {
        let load = WorkerLoad::from(EngineLoad { running: 3, waiting: 2, rotated: 1 });
        assert_eq!(load, WorkerLoad { load: 6, running: 3, waiting: 2, rotated: 1 });
        assert_eq!(serde_json::to_value(WorkerLoad::from(EngineLoad::default())).unwrap()["load"], 0);
    }

    #[test]
    fn server_info_names_the_block_size_once() {
        // vllm-router reads `kv_block_size` or its alias `block_size`; both at once would be a
        // duplicate field there and fail the whole body.
        let info = ServerInfo {
            model_id: "m".into(),
            model_path: "org/m".into(),
            instance_id: "i".into(),
            worker_type: "regular".into(),
            kv_block_size: 16,
            num_device_blocks: 8,
            num_host_blocks: 0,
            tensor_parallel_size: 1,
            max_input_tokens: 1,
            max_total_tokens: 2,
            max_concurrent_requests: 1,
            dtype: "float32".into(),
            device_type: "cpu".into(),
            version: "0".into(),
        };
        let body = serde_json::to_value(&info).unwrap();
        assert_eq!(body["kv_block_size"], 16);
        assert!(body.get("block_size").is_none());
        assert!(body.get("effective_attention_block_size").is_none());
    }

    #[test]
    fn the_probe_generates_one_greedy_token() {
        let probe = probe_request(vec![5]);
        assert_eq!((probe.max_new_tokens, probe.sampling.do_sample, probe.prompt_token_ids), (1, false, vec![5]));
        // EOS as the first token still counts as the one token generated.
        assert!(probe.ignore_eos);
    }
}
