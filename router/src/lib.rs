//! SuperInfer's router: everything about requests. Module map:
//! - `pb`: the generated shard protocol (`proto/shard.proto`).
//! - `engine`: the step loop that drives the scheduler and the shard; `engine::api` is the
//!   request-level interface the HTTP layer uses.
//! - `client`: the gRPC client of the shard (unix socket), with health checks.
//! - `config`: the router's flags (clap; each also an environment variable).
//! - `server`: start-up wiring, `run(config, shutdown)`.
//! - `telemetry`: logging and OpenTelemetry traces; `trace_context`: W3C trace context in from
//!   HTTP headers and out to the shard's gRPC metadata.
//! - `kv_events`: the prefix cache's changes published in vLLM's KV-event format
//!   (`--kv-events-config`), for KV-aware routers in front of several servers.
//! - `grammar`: constrained decoding (JSON schemas, regexes) compiled by llguidance into
//!   per-request token masks.
//! - `http`: the HTTP API (TGI's routes, OpenAI's, health/info/metrics, OpenAPI); built on
//!   `validation`, `tokenizer` + `detokenizer`, `chat_template`, `error` (HTTP error mapping)
//!   and `metrics` (the Prometheus recorder and the request metrics).
//! - `python`: the pyo3 shim that the `superinfer` package calls; `contracts` the scheduler
//!   crate's formulas the Python side calls (percentile, attainment, step-cost fit, step time).

pub mod pb {
    tonic::include_proto!("superinfer.shard.v1");
}

pub mod chat_template;
pub mod client;
pub mod config;
pub mod detokenizer;
pub mod engine;
pub mod error;
pub mod grammar;
pub mod http;
pub mod kv_events;
pub mod metrics;
pub mod server;
pub mod telemetry;
pub mod tokenizer;
pub mod trace_context;
pub mod validation;
mod contracts;
mod python;
mod simulate;
