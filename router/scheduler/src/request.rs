//! A request as the scheduler sees it: the immutable spec from the engine, and the mutable
//! per-request state (phase, tokens, progress, timing) that the scheduler alone owns.

use crate::config::Slo;

/// What the engine submits.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestSpec {
    /// Unique among the requests the scheduler currently knows.
    pub id: u64,
    pub prompt_token_ids: Vec<u32>,
    /// Generation limit; the engine calls `finish` at EOS or at this length.
    pub max_new_tokens: u32,
    /// Objectives; the scheduler's `default_slo` when absent.
    pub slo: Option<Slo>,
    /// Arrival time, seconds on the engine's clock.
    pub arrival: f64,
}
