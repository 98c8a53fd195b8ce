//! The discrete-event simulator: the same `Scheduler` the engine drives, with a simulated clock
//! and a simulated machine, to study scales no test machine has.
//!
//! - `config`: [`SimConfig`], [`Charges`], [`SimRequest`], [`SimError`] — what a simulation is given.
//! - `timing`: [`StepTimeModel`] (linear or roofline), [`LinkModel`] — the simulated machine.
//! - `link`: transfers in flight on the device ⇄ host link.
//! - `report`: [`SimReport`], [`RequestOutcome`], [`GapStats`] and the token-time recorder.
//! - `simulator`: [`simulate`] — the event loop.

mod config;
pub(crate) mod link;
mod report;
mod simulator;
mod timing;

pub use config::{Charges, SimConfig, SimError, SimRequest};
pub use report::{percentile_sorted, GapStats, RequestOutcome, SimReport, StepRecord};
pub use simulator::simulate;
pub use timing::{step_shape, LinkModel, Roofline, StepTimeModel};

#[cfg(test)]
mod tests;
