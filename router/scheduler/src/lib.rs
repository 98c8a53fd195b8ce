//! SuperInfer's scheduling core: the two-tier KV block manager (`kv`) and the scheduling
//! policies (`policy`). Everything here is a pure, synchronous state machine with no I/O and no
//! clock of its own, so the live engine loop and the simulator drive the same code.
//!
//! Map of the crate:
//! - `config`: [`SchedulerConfig`], [`PolicyKind`], [`Slo`] — typed configuration.
//! - `attainment`: how a finished request is judged against its objectives, and the one
//!   percentile definition (engine, simulator and benchmark use it).
//! - `cost_model`: [`CostModel`] — step and transfer time prediction, refined online;
//!   `cost_fit`: the one fit of its step terms to timed steps (warm-up and simulator).
//! - `request`: [`RequestSpec`] — what the engine submits.
//! - `plan`: [`StepPlan`], [`ScheduledEntry`], [`Transfer`], [`StepResults`] — the step
//!   contract, mirroring `proto/shard.proto`.
//! - `scheduler`: [`Scheduler`] — the state machine the engine drives (`add`, `complete`,
//!   `finish`, `cancel`); `policy/` holds `plan` and the four policies (fcfs, recompute, swap,
//!   rotasched); `step` the machinery they share (budgets, admission, preemption, rotation);
//!   `inspect` the stats snapshot and the invariant check.
//! - `kv`: the two-tier block manager — device/host pools, prefix cache, transfers in flight;
//!   [`KvCacheEvent`], the prefix cache's changes for KV-aware routers.
//! - `byte_budget`, `arrivals`: RotaSched's per-step transfer budget and arrival-rate estimate.
//! - `stats`: [`SchedulerStats`] — what /metrics exports.
//! - `sim`: the discrete-event simulator driving the same `Scheduler`.
//!
//! Driving it: `add` each request; per step `plan(now)`, send the plan to the shard, then
//! `complete(results, now)`; `finish`/`cancel` when the engine or the client ends a request.
//! Debug builds check every invariant after each call.
//!
//! Decisions never depend on hash-map iteration order, so identical inputs give identical plans
//! (the simulator relies on it).

mod admission;
mod arrival_rate;
pub mod attainment;
mod byte_budget;
mod config;
mod cost_model;
pub mod cost_fit;
mod error;
mod kv;
mod inspect;
mod plan;
mod policy;
mod request;
mod scheduler;
mod stats;
mod step;
mod step_timing;

#[cfg(test)]
mod tests;

pub mod sim;

pub use admission::AdmissionView;
pub use config::{
    PolicyKind, RotaSchedSettings, SchedulerConfig, Slo, DEFAULT_MAX_BATCH_REQUESTS, DEFAULT_MAX_BATCH_TOKENS, DEFAULT_STALL_FACTOR,
    DEFAULT_TBT_PERCENTILE, DEFAULT_TBT_S, DEFAULT_TTFT_S,
};
pub use cost_model::{CostModel, Direction, StepShape, TokenCurve};
pub use error::SchedulerError;
pub use kv::KvCacheEvent;
pub use plan::{ScheduledEntry, StepPlan, StepResults, Transfer};
pub use request::RequestSpec;
pub use scheduler::Scheduler;
pub use stats::SchedulerStats;
