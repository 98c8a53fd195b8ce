//! What a simulation is given: the scheduler's configuration (including the cost model it
//! believes), the simulated machine (step time and link), and the workload.

use thiserror::Error;

use crate::config::{SchedulerConfig, Slo};
use crate::error::SchedulerError;
use crate::sim::timing::{LinkModel, StepTimeModel};

/// One request of the workload. Its prompt is synthetic: token ids drawn from the request's
/// index, so no two requests share a cached prefix.
#[derive(Debug, Clone, PartialEq)]
pub struct SimRequest {
    pub arrival: f64,
    pub prompt_tokens: u32,
    /// Tokens generated before the simulated client stops it (EOS ignored).
    pub max_new_tokens: u32,
    pub slo: Option<Slo>,
    /// Priority class (lower first; `RequestSpec::priority`).
    pub priority: i32,
}

/// What a step costs on the simulated machine beyond its forward pass (`StepTimeModel`). All
/// zero (the default): steps cost their forward alone, transfers run beside them on the link
/// and planning is free.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Charges {
    /// Each step's fixed cost outside the forward — the router's turn, the gRPC hop, the shard's
    /// work around the model — in seconds; a step that computes nothing pays it too.
    pub per_step_s: f64,
    /// Share of each transfer's link time that delays the step it is issued with: 0 where copies
    /// run beside the compute (a GPU's copy engines), 1 where they take the compute's own
    /// resources (copy threads on the cores the forward uses).
    pub transfer_stall: f64,
    /// Charge the scheduler's planning as it runs (the wall time of each `plan`): closer to the
    /// engine, but the report is then no longer exactly reproducible.
    pub planning: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SimConfig {
    pub scheduler: SchedulerConfig,
    pub step_time: StepTimeModel,
    pub link: LinkModel,
    pub charges: Charges,
    /// Sorted by arrival (checked).
    pub requests: Vec<SimRequest>,
    /// Safety bound on simulated time: requests unfinished by then are reported unfinished.
    pub max_sim_time_s: f64,
    /// How many evenly spaced gap quantiles to return for CDFs.
    pub gap_samples: usize,
    /// Record every planned step (`SimReport::step_log`): what it computed and moved, and
    /// where each request stood. Off by default; it grows with steps × live requests.
    pub step_log: bool,
}

#[derive(Debug, Clone, PartialEq, Error)]
pub enum SimError {
    #[error(transparent)]
    Scheduler(#[from] SchedulerError),
    #[error("invalid simulation: {0}")]
    Invalid(String),
}

impl SimConfig {
    pub fn validate(&self) -> Result<(), SimError> {
        self.scheduler.validate()?;
        let invalid = |msg: String| Err(SimError::Invalid(msg));
        if let Some(i) = self.requests.windows(2).position(|w| w[1].arrival < w[0].arrival) {
            return invalid(format!(
                "requests must be sorted by arrival (request {} comes before {})",
                i,
                i + 1
            ));
        }
        if let Some(r) = self
            .requests
            .iter()
            .find(|r| !(r.arrival.is_finite() && r.arrival >= 0.0))
        {
            return invalid(format!("arrival {} is not a finite time >= 0", r.arrival));
        }
        let link = self.link;
        if !(link.out_bytes_per_s > 0.0 && link.in_bytes_per_s > 0.0 && link.overhead_s >= 0.0) {
            return invalid("link bandwidths must be > 0 and its overhead >= 0".into());
        }
        let charges = self.charges;
        if !(charges.per_step_s.is_finite() && charges.per_step_s >= 0.0) {
            return invalid(format!("the per-step charge must be a finite time >= 0, got {}", charges.per_step_s));
        }
        if !(0.0..=1.0).contains(&charges.transfer_stall) {
            return invalid(format!("the transfer stall must be a share in [0, 1], got {}", charges.transfer_stall));
        }
        if !(self.max_sim_time_s > 0.0) {
            return invalid("max_sim_time_s must be > 0".into());
        }
        Ok(())
    }
}
