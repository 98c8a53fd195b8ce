//! The engine: owns the scheduler and the shard client, and runs the step loop.
//! - `api`: request-level types shared with the HTTP layer.
//! - `handle`: `EngineHandle` (cloneable commands) and `RequestStream` (events; drop cancels).
//! - `model_info`: what the shard told us about the model and its KV pools.
//! - `step_loop`: the engine task (schedule → run → postprocess).
//! - `step_request` / `postprocess`: plan → `StepRequest`, `StepResponse` → events.
//! - `constraints`: the grammar's allowed-token masks before a step, its advance after.
//! - `step_trace`: the step span's links to the requests it serves and its rotation events.
//! - `recovery`: the failure model — step deadlines, recovery from a failed shard, giving up.
//! - `active`: per-request bookkeeping (stream, limits, progress).
//! - `adapters`: the LoRA adapters served, loaded and unloaded at run time too.
//! - `metrics`: the engine's /metrics series.
mod active;
pub mod adapters;
mod admission;
mod attainment;
mod constraints;
pub mod api;
mod handle;
mod metrics;
mod model_info;
mod postprocess;
mod recovery;
mod step_loop;
mod step_request;
mod step_trace;
mod vllm_metrics;
#[cfg(test)]
mod testing;

pub use admission::Admission;
pub use adapters::{AdapterChange, AdapterRegistry, Residency};
pub use handle::{AdapterError, EngineHandle, EngineLoad, RequestStream};
pub use model_info::ModelInfo;
pub use recovery::EngineTimeouts;
pub use step_loop::{spawn_engine, EngineConfig};
