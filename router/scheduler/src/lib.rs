//! SuperInfer's scheduling core: the two-tier KV block manager (`kv`) and the scheduling
//! policies (`policy`). Everything here is a pure, synchronous state machine with no I/O and no
//! clock of its own, so the live engine loop and the simulator drive the same code.
//!
//! Map of the crate:
//! - `config`: [`SchedulerConfig`], [`PolicyKind`], [`Slo`] — typed configuration.
//! - `cost_model`: [`CostModel`] — step and transfer time prediction, refined online.
//! - `request`: [`RequestSpec`] — what the engine submits.
//! - `plan`: [`StepPlan`], [`ScheduledEntry`], [`Transfer`], [`StepResults`] — the step
//!   contract, mirroring `proto/shard.proto`.
//! - `scheduler`: [`Scheduler`] — the state machine the engine drives.
//! - `stats`: [`SchedulerStats`] — what /metrics exports.
//!
//! Decisions never depend on hash-map iteration order, so identical inputs give identical plans
//! (the simulator relies on it).

mod arrivals;
mod byte_budget;
mod config;
mod cost_model;
mod error;
mod kv;
mod inspect;
mod plan;
mod policy;
mod request;
mod scheduler;
mod stats;
mod step;

#[cfg(test)]
mod tests;

pub mod sim;

pub use config::{PolicyKind, SchedulerConfig, Slo};
pub use cost_model::{CostModel, Direction, StepShape};
pub use error::SchedulerError;
pub use plan::{ScheduledEntry, StepPlan, StepResults, Transfer};
pub use request::RequestSpec;
pub use scheduler::Scheduler;
pub use stats::SchedulerStats;
