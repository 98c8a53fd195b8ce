//! The router's configuration: every flag also reads an environment variable of the same name
//! in upper case (TGI's convention). Parsed once at the edge and passed down as typed values.
//!
//! Where TGI names a flag differently, its name is a visible alias on the field
//! (`--max-batch-prefill-tokens`), and its variable, the alias in upper case
//! (`MAX_BATCH_PREFILL_TOKENS`), is read when neither the flag nor its own variable is set.
use std::ffi::OsString;
use std::path::PathBuf;

use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches, Parser, ValueEnum};
use superinfer_scheduler::{
    RotaSchedSettings, DEFAULT_MAX_BATCH_REQUESTS, DEFAULT_MAX_BATCH_TOKENS, DEFAULT_TBT_PERCENTILE, DEFAULT_TBT_S,
    DEFAULT_TTFT_S,
};

use crate::grammar::UnlistedProperties;
use crate::kv_events::KvEventsConfig;

/// Which scheduling policy drives the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SchedulerKind {
    /// TGI v3: admit in order, reserve worst-case blocks, never preempt.
    Fcfs,
    /// vLLM V1 / SGLang: preempt the newest request and redo its prefill later.
    Recompute,
    /// vLLM V0: preempt reactively, copy the KV cache to host memory and back.
    Swap,
    /// SuperInfer: proactive rotation by virtual lag time.
    Rotasched,
}

/// Which requests are admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum AdmissionKind {
    /// Every request is queued (TGI); only --max-concurrent-requests refuses.
    All,
    /// A request whose first token is predicted past its objective by more than
    /// --admission-slack-ms is refused at once with 429 and Retry-After.
    Slo,
}

#[derive(Debug, Clone, Parser)]
#[command(name = "superinfer-router", about = "SuperInfer's HTTP router", version)]
pub struct RouterConfig {
    /// Port of the HTTP API.
    #[arg(long, short = 'p', env = "PORT", default_value_t = 3000)]
    pub port: u16,
    /// Address the HTTP API binds to.
    #[arg(long, env = "HOSTNAME", default_value = "0.0.0.0")]
    pub hostname: String,
    /// Unix socket of the shard's gRPC server.
    #[arg(long, env = "UDS_PATH", default_value = "/tmp/superinfer-shard.sock")]
    pub uds_path: PathBuf,
    /// Seconds to wait for the shard to answer at start-up.
    #[arg(long, env = "SHARD_CONNECT_TIMEOUT_S", default_value_t = 60)]
    pub shard_connect_timeout_s: u64,
    /// Deadline of every model step, in seconds; by default 20 times the step time the warm-up
    /// cost model predicts, at least 30 s. A step past it fails the requests in flight and
    /// starts recovery.
    #[arg(long, env = "STEP_TIMEOUT_S")]
    pub step_timeout_s: Option<f64>,
    /// Seconds a failed shard may take to answer again (requests are refused meanwhile) before
    /// the router gives up and exits non-zero, so that the server is restarted.
    #[arg(long, env = "SHARD_RECOVERY_TIMEOUT_S", default_value_t = 60.0)]
    pub shard_recovery_timeout_s: f64,
    /// On SIGTERM: seconds requests in flight get to finish (new ones are refused with 503)
    /// before the router stops.
    #[arg(long, visible_alias = "graceful-termination-timeout", env = "GRACEFUL_TERMINATION_TIMEOUT_S",
          default_value_t = 30.0)]
    pub graceful_termination_timeout_s: f64,

    /// Scheduling policy.
    #[arg(long, env = "SCHEDULER", value_enum, default_value_t = SchedulerKind::Rotasched)]
    pub scheduler: SchedulerKind,
    /// Upper bound on the device KV blocks the scheduler uses (the shard's pool may be smaller).
    #[arg(long, env = "DEVICE_KV_BLOCKS")]
    pub device_kv_blocks: Option<u32>,
    /// Upper bound on the host KV blocks the scheduler uses (the shard's pool may be smaller).
    #[arg(long, env = "HOST_KV_BLOCKS")]
    pub host_kv_blocks: Option<u32>,
    /// Default time-to-first-token objective, in milliseconds.
    #[arg(long, env = "TTFT_SLO_MS", default_value_t = DEFAULT_TTFT_S * 1e3)]
    pub ttft_slo_ms: f64,
    /// Default time-between-tokens objective, in milliseconds.
    #[arg(long, env = "TBT_SLO_MS", default_value_t = DEFAULT_TBT_S * 1e3)]
    pub tbt_slo_ms: f64,
    /// Percentile of each request's gaps between tokens that the TBT objective is for (90: up
    /// to a tenth of its gaps may be longer); RotaSched spends the rest on prefill.
    #[arg(long, env = "TBT_SLO_PERCENTILE", default_value_t = DEFAULT_TBT_PERCENTILE)]
    pub tbt_slo_percentile: f64,
    /// Default stall bound, in milliseconds: the longest gap between two tokens a request
    /// allows at all (its TBT objective is missed above it, whatever the percentile). Default:
    /// 5 times --tbt-slo-ms (1 s at the default 200 ms, about where a reader sees a stream stop).
    #[arg(long, env = "MAX_STALL_MS")]
    pub max_stall_ms: Option<f64>,
    /// Which requests are admitted: all (TGI), or slo — refuse with 429 those whose first token
    /// is predicted (cost model and queue) past their objective by more than --admission-slack-ms.
    #[arg(long, env = "ADMISSION", value_enum, default_value_t = AdmissionKind::All)]
    pub admission: AdmissionKind,
    /// With --admission slo: how far past its first-token objective a request may be predicted
    /// and still be admitted, in milliseconds.
    #[arg(long, visible_alias = "admission-slack", env = "ADMISSION_SLACK_MS", default_value_t = 0.0)]
    pub admission_slack_ms: f64,
    /// Fail a queued request (never started) once its first-token deadline has passed by more
    /// than this many milliseconds, with an error event (off by default).
    #[arg(long, env = "QUEUE_TIMEOUT_MS")]
    pub queue_timeout_ms: Option<f64>,
    /// Largest number of tokens (prefill chunks + decodes) in one model step. TGI's
    /// --max-batch-prefill-tokens counts prefill tokens only.
    #[arg(long, visible_alias = "max-batch-prefill-tokens", env = "MAX_BATCH_TOKENS", default_value_t = DEFAULT_MAX_BATCH_TOKENS)]
    pub max_batch_tokens: u32,
    /// Largest number of requests in one model step.
    #[arg(long, visible_alias = "max-batch-size", env = "MAX_BATCH_REQUESTS", default_value_t = DEFAULT_MAX_BATCH_REQUESTS)]
    pub max_batch_requests: u32,

    /// Requests in flight (queued or running) before new ones are refused with 429.
    #[arg(long, env = "MAX_CONCURRENT_REQUESTS", default_value_t = 512)]
    pub max_concurrent_requests: usize,
    /// Longest prompt in tokens; defaults to the longest the model and KV pool allow minus one.
    #[arg(long, visible_alias = "max-input-length", env = "MAX_INPUT_TOKENS")]
    pub max_input_tokens: Option<u32>,
    /// Longest prompt + generation in tokens; defaults to what the model and KV pool allow.
    #[arg(long, env = "MAX_TOTAL_TOKENS")]
    pub max_total_tokens: Option<u32>,
    /// Stop sequences per request.
    #[arg(long, env = "MAX_STOP_SEQUENCES", default_value_t = 4)]
    pub max_stop_sequences: usize,
    /// Largest `best_of`.
    #[arg(long, env = "MAX_BEST_OF", default_value_t = 2)]
    pub max_best_of: usize,
    /// Largest `top_n_tokens`.
    #[arg(long, env = "MAX_TOP_N_TOKENS", default_value_t = 5)]
    pub max_top_n_tokens: u32,
    /// Largest number of prompts in one request (OpenAI completions with a list of prompts).
    #[arg(long, env = "MAX_CLIENT_BATCH_SIZE", default_value_t = 4)]
    pub max_client_batch_size: usize,
    /// Refuse `grammar`, `response_format` and `tools` (422), as TGI's flag does.
    #[arg(long, env = "DISABLE_GRAMMAR_SUPPORT")]
    pub disable_grammar_support: bool,
    /// How a JSON schema's object that lists its properties treats the others, when it says
    /// nothing (no `additionalProperties`): `forbid` closes it, as vLLM's default backend does
    /// (a model otherwise adds keys until its token budget ends); `allow` keeps JSON Schema's
    /// letter. A schema's own `"additionalProperties": true` always wins.
    #[arg(long, env = "GRAMMAR_UNLISTED_PROPERTIES", value_enum, default_value_t = UnlistedProperties::Forbid)]
    pub grammar_unlisted_properties: UnlistedProperties,
    /// Split a thinking model's reasoning (`<think>…</think>`) out of chat replies into
    /// `reasoning_content` (vLLM's flag): qwen3 where the reply opens the block, deepseek_r1
    /// where the template opens it in the prompt. Off by default: the reply is all content.
    #[arg(long, env = "REASONING_PARSER", value_enum)]
    pub reasoning_parser: Option<crate::http::reasoning::ReasoningParser>,
    /// Read chat replies' tool calls in the model's own format (vLLM's flag): with
    /// `tool_choice: "auto"` the reply is generated freely and any number of calls are read out
    /// of it; `hermes` reads `<tool_call>{"name": …, "arguments": …}</tool_call>` (Qwen 2.5 and
    /// 3, Hermes), `llama3_json` a reply of `{"name": …, "parameters": …}` objects (Llama 3.1
    /// to 3.3), `mistral` the calls after `[TOOL_CALLS]` (Mistral, Mixtral). The chat template
    /// must write the tools. Off by default, and for `required` or a named function: TGI's
    /// grammar (one call; with `required` and `parallel_tool_calls: true`, one or more).
    #[arg(long, env = "TOOL_CALL_PARSER", value_enum)]
    pub tool_call_parser: Option<crate::http::tool_parser::ToolCallParser>,
    /// Serve `POST /v1/load_lora_adapter` and `/v1/unload_lora_adapter` (vLLM's routes; vLLM's
    /// switch, `VLLM_ALLOW_RUNTIME_LORA_UPDATING=1|true`, turns them on too): LoRA adapters
    /// loaded and unloaded while the server runs, from a path on the server's machine or a hub
    /// id. Off by default: whoever can call the API could then make the server read files it can
    /// read. See `runtime_lora_updating`.
    #[arg(long, env = "ALLOW_RUNTIME_LORA_UPDATING")]
    pub allow_runtime_lora_updating: bool,
    /// A directory of LoRA adapters, one subdirectory each (vLLM's filesystem resolver; its
    /// `VLLM_LORA_RESOLVER_CACHE_DIR` is read too): a request naming an adapter not loaded
    /// (`adapter_id`, or OpenAI's `model`) loads `DIR/<name>` first when it holds an
    /// `adapter_config.json`, and the adapter stays loaded. Off by default. See
    /// `lora_resolver_dir`.
    #[arg(long, env = "LORA_RESOLVER_DIR", value_name = "DIR")]
    pub lora_resolver_dir: Option<std::path::PathBuf>,
    /// The most LoRA adapters served at once, those of `--lora-adapters` and of
    /// `/v1/load_lora_adapter` included. An adapter `--lora-resolver-dir` must load past it
    /// takes the place of the least recently named adapter the resolver loaded that no request
    /// holds (it is loaded again when named again), and waits while requests hold each; a load
    /// by route past it evicts likewise, or is refused. Unbounded by default. (vLLM's flag of
    /// this name bounds the adapters of one batch, over a cache of `--max-cpu-loras`; here every
    /// served adapter is on the device, so this bounds both.)
    #[arg(long, env = "MAX_LORAS", value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_loras: Option<u32>,
    /// Memory for the Responses API's kept responses (`store`, true unless a request says false,
    /// as at OpenAI), in bytes of their JSON: a request continues one by `previous_response_id`,
    /// and `GET`/`DELETE /v1/responses/{id}` read and remove it. The oldest go first; they live
    /// in this process only (a restart forgets them, each replica keeps its own). 0: none is
    /// kept, and `previous_response_id` is refused.
    #[arg(long, env = "RESPONSES_STORE_BYTES", default_value_t = crate::http::response_store::DEFAULT_STORE_BYTES)]
    pub responses_store_bytes: usize,
    /// One step in flight: send step N+1 while the shard computes step N (decodes take the
    /// token N samples from the shard); stops apply one step late, the extra token is never
    /// returned. Requests with a grammar wait for each result.
    #[arg(long, env = "ASYNC_SCHEDULING")]
    pub async_scheduling: bool,
    /// Under overload, RotaSched time-shares the device by next-token deadline: a request
    /// brought back computes in the step that brings it, one that leaves computes in its last
    /// step first. Keeps every gap within the stall bound; spreads the waiting over more, shorter
    /// pauses. `--time-share false`: serve overload as swap does (the 99th-percentile gap stays
    /// the compute's own, the lost requests wait past their stall bound).
    #[arg(long, env = "TIME_SHARE", value_name = "BOOL", num_args = 0..=1, default_missing_value = "true",
          default_value_t = RotaSchedSettings::default().time_share, action = clap::ArgAction::Set)]
    pub time_share: bool,
    /// Largest request body, in bytes.
    #[arg(long, env = "PAYLOAD_LIMIT", default_value_t = 2_000_000)]
    pub payload_limit: usize,
    /// Open HTTP connections at most; past it new connections are closed at once (counted in
    /// `superinfer_http_connections_refused`).
    #[arg(long, env = "MAX_CONNECTIONS", default_value_t = 8192)]
    pub max_connections: usize,
    /// Seconds a client has to send a request head, after connecting and between requests on
    /// a kept-alive HTTP/1 connection; also the longest pause within a request body.
    #[arg(long, env = "HTTP_HEADER_TIMEOUT_S", default_value_t = 10)]
    pub http_header_timeout_s: u64,
    /// Seconds a connection may stay open without a request after its last one ended.
    #[arg(long, env = "HTTP_IDLE_TIMEOUT_S", default_value_t = 60)]
    pub http_idle_timeout_s: u64,
    /// When set, requests must carry `Authorization: Bearer <key>`. Read from the `API_KEY`
    /// environment variable only: a flag's value is visible to every local user (`ps`).
    #[arg(skip)]
    pub api_key: Option<String>,
    /// KV-cache events in vLLM's format, as vLLM's `--kv-events-config` JSON, e.g.
    /// '{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:5557",
    /// "replay_endpoint":"tcp://*:5558","topic":"kv-events"}'. Off by default.
    #[arg(long, env = "KV_EVENTS_CONFIG", value_parser = KvEventsConfig::parse)]
    pub kv_events_config: Option<KvEventsConfig>,
    /// Origins allowed by CORS (repeatable); none allows none.
    #[arg(long, env = "CORS_ALLOW_ORIGIN", value_delimiter = ',')]
    pub cors_allow_origin: Vec<String>,

    /// OpenTelemetry collector (OTLP/gRPC), e.g. http://localhost:4317; traces are off without it.
    #[arg(long, env = "OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,
    /// Service name reported with the traces.
    #[arg(long, env = "OTLP_SERVICE_NAME", default_value = "superinfer.router")]
    pub otlp_service_name: String,
    /// Log as JSON lines instead of text.
    #[arg(long, env = "JSON_OUTPUT")]
    pub json_output: bool,
    /// Log filter (tracing's EnvFilter syntax), e.g. "info" or "superinfer_router=debug".
    #[arg(long, env = "LOG_LEVEL", default_value = "info")]
    pub log_level: String,
}

/// One router flag as `clap` declares it: what the launcher offers and forwards, so that the
/// router's flags are declared once (here).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct FlagSpec {
    /// `--max-batch-tokens`.
    pub name: String,
    /// Other names for it: TGI's (`--max-batch-prefill-tokens`) and a short form (`-p`).
    pub aliases: Vec<String>,
    pub help: String,
    /// The environment variable the router reads it from.
    pub env: Option<String>,
    /// Variables read when neither the flag nor `env` is set: each long alias in upper case.
    pub env_aliases: Vec<String>,
    pub default: Option<String>,
    /// False for switches (`--json-output`).
    pub takes_value: bool,
    /// The value the flag takes when given without one (`--time-share` alone is `true`).
    pub value_if_bare: Option<String>,
}

/// The variables named after a flag's long aliases (TGI's convention: a flag's variable is its
/// name in upper case).
fn alias_variables(arg: &clap::Arg) -> Vec<String> {
    arg.get_visible_aliases()
        .unwrap_or_default()
        .into_iter()
        .map(|alias| alias.replace('-', "_").to_uppercase())
        .collect()
}

impl RouterConfig {
    /// Whether the run-time LoRA routes are served: `--allow-runtime-lora-updating`, or vLLM's
    /// switch as vLLM reads it (`VLLM_ALLOW_RUNTIME_LORA_UPDATING` of 1 or true, any case).
    pub fn runtime_lora_updating(&self) -> bool {
        self.allow_runtime_lora_updating
            || std::env::var("VLLM_ALLOW_RUNTIME_LORA_UPDATING")
                .is_ok_and(|value| matches!(value.trim().to_lowercase().as_str(), "1" | "true"))
    }

    /// The adapters' directory requests may load from: `--lora-resolver-dir`, or vLLM's
    /// `VLLM_LORA_RESOLVER_CACHE_DIR` when the flag is not given.
    pub fn lora_resolver_dir(&self) -> Option<std::path::PathBuf> {
        self.lora_resolver_dir.clone().or_else(|| {
            std::env::var_os("VLLM_LORA_RESOLVER_CACHE_DIR").filter(|dir| !dir.is_empty()).map(Into::into)
        })
    }

    /// The checks of flag values that need no model and no shard (clap's parser makes the
    /// rest): the launcher runs them before it starts a shard, the router again at its start.
    pub fn check_values(&self) -> Result<(), crate::http::ConfigError> {
        crate::http::lora::check_resolver_dir(self.lora_resolver_dir().as_deref())?;
        crate::http::cors_layer(&self.cors_allow_origin).map(drop)
    }

    /// Every router flag with its aliases, help, environment variables and default.
    pub fn flag_specs() -> Vec<FlagSpec> {
        Self::command()
            .get_arguments()
            .filter(|arg| !arg.is_hide_set())
            .filter_map(|arg| {
                let name = format!("--{}", arg.get_long()?);
                let default = arg.get_default_values().first().map(|value| value.to_string_lossy().into_owned());
                let value_if_bare = Self::value_if_bare(arg, &name);
                let long_aliases = arg.get_visible_aliases().unwrap_or_default().into_iter().map(|alias| format!("--{alias}"));
                Some(FlagSpec {
                    name,
                    aliases: long_aliases.chain(arg.get_short().map(|short| format!("-{short}"))).collect(),
                    help: arg.get_help().map(ToString::to_string).unwrap_or_default(),
                    env: arg.get_env().map(|env| env.to_string_lossy().into_owned()),
                    env_aliases: alias_variables(arg),
                    default,
                    takes_value: arg.get_action().takes_values(),
                    value_if_bare,
                })
            })
            .filter(|spec| spec.name != "--help" && spec.name != "--version")
            .collect()
    }

    /// The value a flag whose value is optional (`num_args(0..=1)`) takes when given bare:
    /// what clap itself makes of `--flag` alone.
    fn value_if_bare(arg: &clap::Arg, name: &str) -> Option<String> {
        let optional = arg.get_action().takes_values() && arg.get_num_args().is_some_and(|n| n.min_values() == 0);
        if !optional {
            return None;
        }
        let matches = Self::command().try_get_matches_from(["router", name]).ok()?;
        let value = matches.get_raw(arg.get_id().as_str())?.next()?;
        Some(value.to_string_lossy().into_owned())
    }

    /// Parses `argv` (program name first), reading unset flags from the environment, and the
    /// API key from `API_KEY`.
    pub fn parse_argv<I, T>(argv: I) -> Result<Self, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString> + Clone,
    {
        Self::parse_with(argv, |name| std::env::var_os(name), std::env::var_os("API_KEY"))
    }

    /// `variable` reads the aliases' variables (clap reads each flag's own `env` itself).
    fn parse_with<I, T>(
        argv: I,
        variable: impl Fn(&str) -> Option<OsString>,
        api_key: Option<OsString>,
    ) -> Result<Self, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString> + Clone,
    {
        let command = Self::command();
        let mut argv: Vec<OsString> = argv.into_iter().map(Into::into).collect();
        let matches = command.clone().try_get_matches_from(&argv)?;
        for arg in command.get_arguments() {
            let given = matches!(
                matches.value_source(arg.get_id().as_str()),
                Some(ValueSource::CommandLine | ValueSource::EnvVariable)
            );
            let (Some(long), false) = (arg.get_long(), given) else { continue };
            if let Some(value) = alias_variables(arg).iter().find_map(|name| variable(name)) {
                // `--flag=value`: a value that starts with '-' is not taken for a flag.
                let mut flag = OsString::from(format!("--{long}="));
                flag.push(value);
                argv.push(flag);
            }
        }
        let mut config = Self::from_arg_matches(&command.try_get_matches_from(argv)?)?;
        config.api_key = match api_key {
            // A key that cannot be read must not leave the routes open.
            Some(key) => Some(key.into_string().map_err(|_| {
                clap::Error::raw(clap::error::ErrorKind::InvalidUtf8, "API_KEY is not valid UTF-8\n")
            })?),
            None => None,
        }
        .filter(|key| !key.is_empty());
        Ok(config)
    }

    #[cfg(test)]
    fn parse_with_api_key<I, T>(argv: I, api_key: Option<OsString>) -> Result<Self, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString> + Clone,
    {
        Self::parse_with(argv, |_| None, api_key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_flags() {
        let config = RouterConfig::parse_argv(["router", "--port", "8080", "--scheduler", "swap"]).unwrap();
        assert_eq!(config.port, 8080);
        assert_eq!(config.scheduler, SchedulerKind::Swap);
        assert_eq!(config.max_batch_tokens, 2048);
        assert!(config.api_key.is_none());
    }

    #[test]
    fn time_sharing_is_on_by_default_and_takes_an_optional_value() {
        let parse = |argv: &[&str]| {
            let argv = std::iter::once("router").chain(argv.iter().copied());
            RouterConfig::parse_with(argv, |_| None, None).map(|c| c.time_share)
        };
        assert_eq!(parse(&[]).unwrap(), RotaSchedSettings::default().time_share);
        assert!(parse(&[]).unwrap());
        assert!(!parse(&["--time-share", "false"]).unwrap());
        assert!(parse(&["--time-share"]).unwrap());
        assert!(parse(&["--time-share", "--port", "9000"]).unwrap());
        assert!(parse(&["--time-share", "maybe"]).is_err());
        let spec = RouterConfig::flag_specs().into_iter().find(|s| s.name == "--time-share").unwrap();
        assert_eq!((spec.takes_value, spec.value_if_bare.as_deref()), (true, Some("true")));
    }

    #[test]
    fn the_api_key_comes_from_the_environment_only() {
        let config = RouterConfig::parse_with_api_key(["router"], Some("s3cret".into())).unwrap();
        assert_eq!(config.api_key.as_deref(), Some("s3cret"));
        let empty = RouterConfig::parse_with_api_key(["router"], Some("".into())).unwrap();
        assert!(empty.api_key.is_none());
        let flag = RouterConfig::parse_with_api_key(["router", "--api-key", "s3cret"], None);
        assert!(flag.is_err(), "a key on the command line is visible to every local user");
        #[cfg(unix)]
        {
            use std::os::unix::ffi::OsStringExt;
            let unreadable = std::ffi::OsString::from_vec(vec![0xff, 0xfe]);
            assert!(RouterConfig::parse_with_api_key(["router"], Some(unreadable)).is_err());
        }
    }

    #[test]
    fn connection_limits_have_defaults() {
        let config = RouterConfig::parse_with_api_key(["router"], None).unwrap();
        assert_eq!(
            (config.max_connections, config.http_header_timeout_s, config.http_idle_timeout_s),
            (8192, 10, 60)
        );
    }

    #[test]
    fn flag_specs_describe_every_flag_once() {
        let specs = RouterConfig::flag_specs();
        let tokens = specs.iter().find(|spec| spec.name == "--max-batch-tokens").unwrap();
        assert_eq!(tokens.env.as_deref(), Some("MAX_BATCH_TOKENS"));
        assert_eq!(tokens.default.as_deref(), Some("2048"));
        assert!(tokens.takes_value && tokens.help.contains("tokens"));
        let json = specs.iter().find(|spec| spec.name == "--json-output").unwrap();
        assert!(!json.takes_value);
        assert!(specs.iter().all(|spec| spec.name != "--api-key" && spec.name != "--help"));
        let mut names: Vec<_> = specs.iter().flat_map(|spec| std::iter::once(&spec.name).chain(&spec.aliases)).collect();
        let count = names.len();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), count, "no name or alias is used twice");
    }

    #[test]
    fn tgi_names_are_aliases() {
        let argv = [
            "router", "-p", "8080", "--max-batch-prefill-tokens", "512", "--max-batch-size", "8",
            "--max-input-length", "100", "--graceful-termination-timeout", "5",
        ];
        let config = RouterConfig::parse_with_api_key(argv, None).unwrap();
        assert_eq!((config.port, config.max_batch_tokens, config.max_batch_requests), (8080, 512, 8));
        assert_eq!((config.max_input_tokens, config.graceful_termination_timeout_s), (Some(100), 5.0));
        let specs = RouterConfig::flag_specs();
        let tokens = specs.iter().find(|spec| spec.name == "--max-batch-tokens").unwrap();
        assert_eq!(tokens.aliases, ["--max-batch-prefill-tokens"]);
        assert_eq!(tokens.env_aliases, ["MAX_BATCH_PREFILL_TOKENS"]);
        let port = specs.iter().find(|spec| spec.name == "--port").unwrap();
        assert_eq!((port.aliases.as_slice(), port.env_aliases.len()), (["-p".to_string()].as_slice(), 0));
    }

    #[test]
    fn tgi_variables_apply_when_the_flag_is_not_given() {
        let variables = |name: &str| match name {
            "MAX_BATCH_PREFILL_TOKENS" => Some(OsString::from("512")),
            "MAX_BATCH_SIZE" => Some(OsString::from("8")),
            "GRACEFUL_TERMINATION_TIMEOUT" => Some(OsString::from("-1")),
            _ => None,
        };
        let config = RouterConfig::parse_with(["router", "--max-batch-requests", "4"], variables, None).unwrap();
        assert_eq!(config.max_batch_tokens, 512);
        assert_eq!(config.max_batch_requests, 4, "the flag wins over TGI's variable");
        assert_eq!(config.graceful_termination_timeout_s, -1.0, "a value starting with '-' is a value");
        let bad = |name: &str| (name == "MAX_BATCH_SIZE").then(|| OsString::from("many"));
        assert!(RouterConfig::parse_with(["router"], bad, None).is_err());
    }

    #[test]
    fn one_step_in_flight_is_off_unless_asked() {
        // (The whole suite may run with ASYNC_SCHEDULING=true, which turns it on.)
        if std::env::var_os("ASYNC_SCHEDULING").is_none() {
            assert!(!RouterConfig::parse_with_api_key(["router"], None).unwrap().async_scheduling);
        }
        assert!(RouterConfig::parse_with_api_key(["router", "--async-scheduling"], None).unwrap().async_scheduling);
        let specs = RouterConfig::flag_specs();
        let spec = specs.iter().find(|spec| spec.name == "--async-scheduling").unwrap();
        assert_eq!(spec.env.as_deref(), Some("ASYNC_SCHEDULING"));
    }

    #[test]
    fn rejects_unknown_scheduler() {
        assert!(RouterConfig::parse_argv(["router", "--scheduler", "lifo"]).is_err());
    }

    #[test]
    fn every_flag_has_an_environment_variable() {
        use clap::CommandFactory;
        let command = RouterConfig::command();
        for arg in command.get_arguments() {
            let id = arg.get_id().as_str();
            if id == "help" || id == "version" {
                continue;
            }
            let env = arg.get_env().map(|name| name.to_string_lossy().into_owned());
            assert_eq!(env, Some(id.to_uppercase()), "flag --{id}");
        }
    }
}
