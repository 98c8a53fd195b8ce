//! The HTTP layer's configuration and the state its handlers share (read-only, behind an Arc).
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusHandle;
use tokio::sync::Semaphore;

use crate::chat_template::{ChatTemplate, TemplateError};
use crate::engine::api::AdapterRef;
use crate::engine::{AdapterChange, AdapterError, EngineHandle, ModelInfo, Residency};
use crate::error::HttpError;
use crate::grammar::{GrammarCompiler, GrammarError, ReasoningTokens, UnlistedProperties};
use crate::kv_events::KvEventSource;
use crate::tokenizer::Tokenizer;
use crate::validation::{ValidationError, ValidationLimits};

/// How often a request waiting for a `--max-loras` slot looks for an idle adapter again.
const ADAPTER_IDLE_POLL: Duration = Duration::from_millis(20);

/// Everything the HTTP layer is configured with (parsed once by the CLI).
#[derive(Debug, Clone, PartialEq)]
pub struct HttpConfig {
    /// Requests in flight at most; more are answered 429 at once.
    pub max_concurrent_requests: usize,
    pub max_best_of: usize,
    pub max_stop_sequences: usize,
    pub max_top_n_tokens: u32,
    pub max_input_tokens: usize,
    pub max_total_tokens: usize,
    /// Prompts per `/v1/completions` request at most.
    pub max_client_batch_size: usize,
    /// Grammars (and so `response_format` and `tools`) are refused with 422.
    pub disable_grammar_support: bool,
    pub grammar_unlisted_properties: UnlistedProperties,
    /// Chat replies' reasoning goes to `reasoning_content` (`--reasoning-parser`).
    pub reasoning_parser: Option<super::reasoning::ReasoningParser>,
    /// Chat replies' tool calls read in the model's own format under `tool_choice: "auto"`
    /// (`--tool-call-parser`).
    pub tool_call_parser: Option<super::tool_parser::ToolCallParser>,
    /// `/v1/load_lora_adapter` and `/v1/unload_lora_adapter` are served
    /// (`--allow-runtime-lora-updating`).
    pub allow_runtime_lora_updating: bool,
    /// A request naming an adapter not loaded loads it from this directory's subdirectory of
    /// that name, if there is one (`--lora-resolver-dir`).
    pub lora_resolver_dir: Option<std::path::PathBuf>,
    /// The Responses API keeps responses within this many bytes (`--responses-store-bytes`;
    /// 0: none).
    pub responses_store_bytes: usize,
    /// Request bodies larger than this are answered 413.
    pub payload_limit: usize,
    /// When set, the generation routes require `Authorization: Bearer <key>`.
    pub api_key: Option<String>,
    /// Served model name (`/info`, `/v1/models`, OpenAI responses); the shard's when empty.
    pub model_id: String,
    /// Allowed CORS origins; empty: no CORS headers.
    pub cors_allow_origin: Vec<String>,
    /// Value of the `x-compute-type` header.
    pub compute_type: String,
    /// Open connections at most; more are closed at once.
    pub max_connections: usize,
    /// Time a client has to send a request head (see `connection`).
    pub http_header_timeout: Duration,
    /// Time a connection may stay open without a request after its last one.
    pub http_idle_timeout: Duration,
    /// `/kv_event_sources`: where KV-cache events are published, by data-parallel rank; empty
    /// when they are not.
    pub kv_event_sources: BTreeMap<String, KvEventSource>,
}

impl Default for HttpConfig {
    /// TGI's defaults.
    fn default() -> Self {
        Self {
            max_concurrent_requests: 128,
            max_best_of: 2,
            max_stop_sequences: 4,
            max_top_n_tokens: 5,
            max_input_tokens: 1024,
            max_total_tokens: 2048,
            max_client_batch_size: 4,
            disable_grammar_support: false,
            grammar_unlisted_properties: UnlistedProperties::default(),
            reasoning_parser: None,
            tool_call_parser: None,
            allow_runtime_lora_updating: false,
            lora_resolver_dir: None,
            responses_store_bytes: super::response_store::DEFAULT_STORE_BYTES,
            payload_limit: 2_000_000,
            api_key: None,
            model_id: String::new(),
            cors_allow_origin: Vec::new(),
            compute_type: "gpu+optimized".to_string(),
            max_connections: 8192,
            http_header_timeout: Duration::from_secs(10),
            http_idle_timeout: Duration::from_secs(60),
            kv_event_sources: BTreeMap::new(),
        }
    }
}

/// Configuration that cannot serve any request.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ConfigError {
    #[error("max_input_tokens ({0}) must be less than max_total_tokens ({1})")]
    InputNotBelowTotal(usize, usize),
    #[error("max_total_tokens ({0}) exceeds the model's limit of {1} tokens")]
    TotalAboveModel(usize, u32),
    #[error("{0} must be at least 1")]
    Zero(&'static str),
    #[error("{0} must be longer than zero")]
    ZeroTimeout(&'static str),
    #[error(transparent)]
    Tokenizer(#[from] crate::tokenizer::TokenizerError),
    #[error("metrics: {0}")]
    Metrics(#[from] crate::metrics::MetricsError),
    #[error("invalid CORS origin {0:?}")]
    CorsOrigin(String),
    #[error("--lora-resolver-dir {0}: not a directory this server can read")]
    LoraResolverDir(std::path::PathBuf),
    #[error("the shard serves {0} LoRA adapters from its start (--lora-adapters), more than --max-loras {1}")]
    MaxLoras(usize, usize),
}

pub(crate) struct AppState {
    pub config: HttpConfig,
    pub engine: EngineHandle,
    pub tokenizer: Tokenizer,
    /// The compiled template, or why chat is unavailable (a template minijinja cannot compile
    /// disables the chat route instead of the whole server).
    pub chat_template: Result<ChatTemplate, TemplateError>,
    pub limits: ValidationLimits,
    /// Compiles requests' grammars, or why this model's tokenizer cannot follow one (grammars
    /// are then refused; everything else is served).
    pub grammar: Result<GrammarCompiler, GrammarError>,
    /// Under `--reasoning-parser`, the model's reasoning tags as tokens, where each is one: a
    /// chat reply under a grammar then reasons before the grammar holds.
    pub reasoning_tokens: Option<ReasoningTokens>,
    pub permits: Arc<Semaphore>,
    pub metrics: PrometheusHandle,
    pub model_id: String,
    /// Shard processes serving the model (its tensor-parallel degree).
    pub num_shard: u32,
    /// The model's facts, the LoRA adapters it serves among them.
    pub info: ModelInfo,
    /// This process among replicas (`/get_server_info`): random, fixed for its lifetime.
    pub instance_id: String,
    /// The Responses API's kept responses.
    pub responses: super::response_store::ResponseStore,
    /// Loads the adapters requests name from `--lora-resolver-dir`.
    pub lora_resolver: Option<super::lora::LoraResolver>,
}

impl AppState {
    pub fn new(
        config: HttpConfig,
        engine: EngineHandle,
        info: &ModelInfo,
    ) -> Result<Self, ConfigError> {
        check_config(&config, info)?;
        let tokenizer = Tokenizer::from_json(&info.tokenizer_json)?;
        let chat_template = match info.chat_template.as_deref() {
            None => Err(TemplateError::Missing),
            Some(source) => {
                ChatTemplate::new(source, info.bos_token.as_deref(), info.eos_token.as_deref())
                    .inspect_err(|error| tracing::warn!(%error, "chat completions are disabled"))
            }
        };
        let grammar = if config.disable_grammar_support {
            Err(GrammarError::Disabled)
        } else {
            GrammarCompiler::new(&info.tokenizer_json, tokenizer.clone(), &info.eos_token_ids, info.vocab_size)
                .map(|compiler| compiler.with_unlisted_properties(config.grammar_unlisted_properties))
                .inspect_err(|error| tracing::warn!(%error, "grammars are disabled"))
        };
        let reasoning_tokens = config.reasoning_parser.and_then(|parser| {
            let tokens = super::reasoning::tag_tokens(&tokenizer, info.vocab_size);
            if tokens.is_none() {
                tracing::warn!(
                    ?parser,
                    "the tokenizer has no single token for <think> or </think>: a chat reply under a grammar \
                     (a response format, tools) follows it from its first token and has no reasoning part"
                );
            }
            tokens
        });
        let limits = ValidationLimits {
            max_best_of: config.max_best_of,
            max_stop_sequences: config.max_stop_sequences,
            max_top_n_tokens: config.max_top_n_tokens,
            max_input_tokens: config.max_input_tokens,
            max_total_tokens: config.max_total_tokens,
        };
        let model_id = if config.model_id.is_empty() {
            info.model_id.clone()
        } else {
            config.model_id.clone()
        };
        let responses = super::response_store::ResponseStore::new(config.responses_store_bytes);
        // Absolute, so the shard reads the same directory whatever its working directory.
        let lora_resolver = config
            .lora_resolver_dir
            .clone()
            .map(|dir| super::lora::LoraResolver::new(std::fs::canonicalize(&dir).unwrap_or(dir)));
        Ok(Self {
            permits: Arc::new(Semaphore::new(config.max_concurrent_requests)),
            metrics: crate::metrics::install_recorder()?,
            config,
            engine,
            tokenizer,
            chat_template,
            grammar,
            reasoning_tokens,
            limits,
            model_id,
            num_shard: info.world_size,
            info: info.clone(),
            instance_id: format!("{:032x}", rand::random::<u128>()),
            responses,
            lora_resolver,
        })
    }

    /// The adapter a request names (`adapter_id`), held for the request: `None` (the base
    /// model) when it names none or the served model itself; an adapter `--lora-resolver-dir`
    /// holds is loaded first; a 422 when it names an adapter the server does not serve.
    pub async fn adapter(&self, id: Option<&str>) -> Result<Option<AdapterRef>, HttpError> {
        let id = match id {
            None | Some("") => return Ok(None),
            Some(id) if id == self.model_id => return Ok(None),
            Some(id) => id,
        };
        if let Some(adapter) = self.engine.adapters().get(id) {
            return Ok(Some(adapter));
        }
        if let Some(adapter) = self.resolve_adapter(id).await? {
            return Ok(Some(adapter));
        }
        let ids = self.engine.adapters().ids();
        let loaded = if ids.is_empty() { "none".to_string() } else { ids.join(", ") };
        Err(ValidationError::UnknownAdapter(id.to_string(), loaded).into())
    }

    /// The adapter an OpenAI request's `model` selects: a loaded adapter's id, or one
    /// `--lora-resolver-dir` holds, selects it; any other name (the served model's, or whatever
    /// a client library sends) is the base model.
    pub fn adapter_for_model(&self, model: Option<&str>) -> Option<String> {
        let resolvable = |name: &str| self.lora_resolver.as_ref().is_some_and(|resolver| resolver.find(name).is_some());
        model
            .filter(|name| *name != self.model_id && (self.engine.adapters().contains(name) || resolvable(name)))
            .map(str::to_string)
    }

    /// Loads the adapter `id` from `--lora-resolver-dir` when the directory holds it. Loads are
    /// one at a time, so requests naming the same new adapter at once load it once. Past
    /// `--max-loras`, the load evicts an idle adapter the resolver loaded, and waits while
    /// requests hold each (the client leaving ends the wait).
    async fn resolve_adapter(&self, id: &str) -> Result<Option<AdapterRef>, HttpError> {
        let Some(resolver) = &self.lora_resolver else { return Ok(None) };
        let Some(path) = resolver.find(id) else { return Ok(None) };
        let _one_at_a_time = resolver.loading.lock().await;
        let mut waited = false;
        loop {
            if let Some(adapter) = self.engine.adapters().get(id) {
                return Ok(Some(adapter));
            }
            match self.engine.load_adapter(id, &path.to_string_lossy(), false, Residency::Evictable).await {
                Ok(adapter) => {
                    tracing::info!(adapter_id = id, path = %path.display(), "LoRA adapter resolved from --lora-resolver-dir");
                    return Ok(Some(adapter));
                }
                Err(AdapterError::Change(AdapterChange::Busy(max))) => {
                    if !waited {
                        tracing::info!(adapter_id = id, max_loras = max, "LoRA adapter waits for one of the loaded ones to be idle");
                        waited = true;
                    }
                    tokio::time::sleep(ADAPTER_IDLE_POLL).await;
                }
                Err(error) => return Err(error.into()),
            }
        }
    }

    pub fn chat_template(&self) -> Result<&ChatTemplate, HttpError> {
        self.chat_template
            .as_ref()
            .map_err(|error| HttpError::Template(error.clone()))
    }
}

fn check_config(config: &HttpConfig, info: &ModelInfo) -> Result<(), ConfigError> {
    for (name, value) in [
        ("max_concurrent_requests", config.max_concurrent_requests),
        ("max_best_of", config.max_best_of),
        ("max_input_tokens", config.max_input_tokens),
        ("max_client_batch_size", config.max_client_batch_size),
        ("max_connections", config.max_connections),
    ] {
        if value == 0 {
            return Err(ConfigError::Zero(name));
        }
    }
    super::lora::check_resolver_dir(config.lora_resolver_dir.as_deref())?;
    for (name, value) in [
        ("http_header_timeout", config.http_header_timeout),
        ("http_idle_timeout", config.http_idle_timeout),
    ] {
        if value.is_zero() {
            return Err(ConfigError::ZeroTimeout(name));
        }
    }
    if config.max_input_tokens >= config.max_total_tokens {
        return Err(ConfigError::InputNotBelowTotal(
            config.max_input_tokens,
            config.max_total_tokens,
        ));
    }
    if info.max_position_embeddings > 0
        && config.max_total_tokens > info.max_position_embeddings as usize
    {
        return Err(ConfigError::TotalAboveModel(
            config.max_total_tokens,
            info.max_position_embeddings,
        ));
    }
    Ok(())
}
