//! vLLM's run-time LoRA routes, behind `--allow-runtime-lora-updating` (vLLM's switch is
//! `VLLM_ALLOW_RUNTIME_LORA_UPDATING`, read as the flag's environment variable) and the API key:
//! - `POST /v1/load_lora_adapter` `{"lora_name", "lora_path", "load_inplace"?}`: the shard reads
//!   the PEFT adapter at `lora_path` (a directory on the server's machine, or a hub id) and
//!   installs it between steps; once answered, requests name it as they name the adapters of
//!   `--lora-adapters` (TGI's `adapter_id`, OpenAI's `model`) and `/v1/models` lists it.
//!   `load_inplace: true` replaces an adapter served under that name (requests already running
//!   with the old one finish with it); otherwise a name in use is a 400.
//! - `POST /v1/unload_lora_adapter` `{"lora_name"}`: new requests naming it are refused at
//!   once (422, as for any adapter not loaded); requests running with it finish, and the shard
//!   frees it after them. An unknown name is a 404.
//!
//! Success is vLLM's: 200 with a line of text. An adapter the shard cannot serve is a 400
//! saying why (its files, its targets, its shapes); nothing changes then.
//!
//! `--lora-resolver-dir DIR` (vLLM's filesystem resolver, `VLLM_LORA_RESOLVER_CACHE_DIR`): a
//! request naming an adapter that is not loaded (`adapter_id`, or OpenAI's `model`) loads
//! `DIR/<name>` first when that directory holds an `adapter_config.json`, with the checks of a
//! load by route, and is then served with it; the adapter stays loaded. Names are single path
//! components: a request cannot reach outside `DIR`.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::extract::State;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::extract::JsonBody;
use super::openai_types::log_ignored_fields;
use super::state::{AppState, ConfigError};
use crate::engine::Residency;
use crate::error::{ErrorBody, HttpError};
use crate::validation::ValidationError;

/// vLLM's `LoadLoRAAdapterRequest`.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
pub struct LoadLoraAdapter {
    /// The name requests will use (`adapter_id`, or OpenAI's `model`).
    pub lora_name: String,
    /// A directory holding `adapter_config.json` and `adapter_model.safetensors`, on the
    /// server's machine, or a Hugging Face model id.
    pub lora_path: String,
    /// Replace an adapter already served under `lora_name`.
    #[serde(default)]
    pub load_inplace: bool,
    #[serde(flatten)]
    #[schema(ignore)]
    pub ignored: BTreeMap<String, serde_json::Value>,
}

/// vLLM's `UnloadLoRAAdapterRequest`.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
pub struct UnloadLoraAdapter {
    pub lora_name: String,
    /// vLLM's internal number of the adapter; not read (the name says which).
    #[serde(default)]
    pub lora_int_id: Option<i64>,
    #[serde(flatten)]
    #[schema(ignore)]
    pub ignored: BTreeMap<String, serde_json::Value>,
}

/// Finds the adapters requests name in `--lora-resolver-dir`.
#[derive(Debug)]
pub struct LoraResolver {
    dir: PathBuf,
    /// Held while an adapter is loaded (`AppState::resolve_adapter`).
    pub(super) loading: tokio::sync::Mutex<()>,
}

impl LoraResolver {
    pub fn new(dir: PathBuf) -> Self {
        Self { dir, loading: tokio::sync::Mutex::new(()) }
    }

    /// The directory of the adapter `name`, when `name` is one path component and that
    /// directory holds an `adapter_config.json`.
    pub fn find(&self, name: &str) -> Option<PathBuf> {
        let component = !name.is_empty()
            && !matches!(name, "." | "..")
            && !name.contains(['/', '\\', '\0'])
            && Path::new(name).components().count() == 1;
        let path = self.dir.join(name);
        (component && path.join("adapter_config.json").is_file()).then_some(path)
    }
}

/// `--lora-resolver-dir`, when given, is a directory this process can read.
pub(crate) fn check_resolver_dir(dir: Option<&Path>) -> Result<(), ConfigError> {
    match dir {
        Some(dir) if std::fs::read_dir(dir).is_err() => Err(ConfigError::LoraResolverDir(dir.to_path_buf())),
        _ => Ok(()),
    }
}

fn check_switch(state: &AppState) -> Result<(), HttpError> {
    if state.config.allow_runtime_lora_updating {
        Ok(())
    } else {
        Err(HttpError::RuntimeLoraOff)
    }
}

/// Loads a LoRA adapter while the server runs.
#[utoipa::path(post, path = "/v1/load_lora_adapter", tag = "OpenAI", request_body = LoadLoraAdapter,
    responses((status = 200, body = String, content_type = "text/plain"),
        (status = 400, description = "a name in use, or an adapter the server cannot serve", body = ErrorBody),
        (status = 404, description = "run-time loading is off", body = ErrorBody),
        (status = 422, description = "a malformed body", body = ErrorBody)))]
pub(crate) async fn load_lora_adapter(
    State(state): State<Arc<AppState>>,
    JsonBody(request): JsonBody<LoadLoraAdapter>,
) -> Result<String, HttpError> {
    check_switch(&state)?;
    log_ignored_fields("load_lora_adapter", &request.ignored);
    let name = request.lora_name.trim();
    if name.is_empty() || request.lora_path.trim().is_empty() {
        return Err(ValidationError::LoraAdapter("both 'lora_name' and 'lora_path' must be given".to_string()).into());
    }
    if name == state.model_id {
        return Err(ValidationError::LoraAdapter(format!("'{name}' is the served model's name; an adapter needs its own")).into());
    }
    state.engine.load_adapter(name, request.lora_path.trim(), request.load_inplace, Residency::Pinned).await?;
    Ok(format!("Success: LoRA adapter '{name}' added successfully."))
}

/// Unloads a LoRA adapter while the server runs.
#[utoipa::path(post, path = "/v1/unload_lora_adapter", tag = "OpenAI", request_body = UnloadLoraAdapter,
    responses((status = 200, body = String, content_type = "text/plain"),
        (status = 404, description = "no adapter of that name, or run-time unloading is off", body = ErrorBody),
        (status = 422, description = "a malformed body", body = ErrorBody)))]
pub(crate) async fn unload_lora_adapter(
    State(state): State<Arc<AppState>>,
    JsonBody(request): JsonBody<UnloadLoraAdapter>,
) -> Result<String, HttpError> {
    check_switch(&state)?;
    log_ignored_fields("unload_lora_adapter", &request.ignored);
    let name = request.lora_name.trim();
    state.engine.unload_adapter(name)?;
    Ok(format!("Success: LoRA adapter '{name}' removed successfully."))
}
