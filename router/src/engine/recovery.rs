//! The engine's side of the failure model: what a failed or late step does, and how the engine
//! comes back.
//!
//! Every Step has a deadline (`EngineTimeouts::step_deadline`). A Step that fails or misses it,
//! or a failed liveness probe, is treated as *transient*: the requests the shard held fail at
//! once with an error event (their KV state is gone or suspect), requests still queued wait,
//! new requests are refused (503) and `/health` answers 503. The engine then probes the shard
//! until it answers `Health` and `Reset` (which also waits out a step the shard may still be
//! running), rebuilds the scheduler — every block back in its pool — and serves again. If the
//! shard does not come back within `EngineTimeouts::recovery`, or answers that it lost its
//! warm-up, the engine gives up: its status becomes `Failed` and the router exits non-zero,
//! so the launcher (and Docker or Kubernetes above it) restarts the server.
use std::time::{Duration, Instant};

use super::api::{EngineError, EngineEvent};
use super::handle::EngineStatus;
use super::step_loop::{refusal, Engine};
use crate::client::ClientError;

/// Pause between probes of a failed shard.
const PROBE_INTERVAL: Duration = Duration::from_millis(500);

/// The `Retry-After` of a request refused while the shard recovers: the next probe, in whole
/// seconds (a retry sooner finds the same state).
pub(crate) fn recovery_retry_after_s() -> u64 {
    PROBE_INTERVAL.as_secs_f64().ceil().max(1.0) as u64
}

/// The default step deadline is this many times the step's predicted duration...
const STEP_DEADLINE_FACTOR: f64 = 20.0;
/// ...but never shorter than this (a loaded machine, a first CUDA graph, a large prefill)...
const STEP_DEADLINE_FLOOR: Duration = Duration::from_secs(30);
/// ...nor longer than this.
const STEP_DEADLINE_CEILING: Duration = Duration::from_secs(600);

/// How long the engine waits on the shard.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EngineTimeouts {
    /// A fixed deadline for every Step; `None`: from the warm-up cost model
    /// (`STEP_DEADLINE_FACTOR` × the predicted step time, within the floor and ceiling).
    pub step: Option<Duration>,
    /// How long a failed shard may take to answer again before the engine gives up.
    pub recovery: Duration,
}

impl Default for EngineTimeouts {
    fn default() -> Self {
        Self { step: None, recovery: Duration::from_secs(60) }
    }
}

impl EngineTimeouts {
    /// The deadline of a step the cost model predicts to take `predicted_s` seconds.
    pub fn step_deadline(&self, predicted_s: f64) -> Duration {
        self.step.unwrap_or_else(|| {
            Duration::try_from_secs_f64(predicted_s * STEP_DEADLINE_FACTOR)
                .unwrap_or(STEP_DEADLINE_CEILING)
                .clamp(STEP_DEADLINE_FLOOR, STEP_DEADLINE_CEILING)
        })
    }
}

/// A failure the engine is recovering from.
#[derive(Debug, Clone)]
pub(super) struct Recovery {
    since: Instant,
    /// What failed first (reported to clients and in the final error if recovery fails).
    reason: String,
    next_probe: Instant,
}

pub(super) enum RecoveryTurn {
    /// The shard answers and was reset; the engine serves again.
    Recovered,
    /// Still down; probe again after this long.
    Wait(Duration),
    /// The shard will not come back; the engine stops and the process must exit.
    GiveUp,
}

impl Engine {
    /// A Step or a probe failed: fail what the shard held, refuse new work, start probing.
    pub(super) fn on_shard_failure(&mut self, error: ClientError) {
        // A step still in flight is moot: Reset drops everything on the shard.
        self.abandon_in_flight();
        let message = error.to_string();
        ::metrics::counter!("superinfer_engine_failures_total").increment(1);
        if !error.is_transient() {
            self.give_up(message);
            return;
        }
        let on_shard: Vec<u64> =
            self.requests.ids().filter(|&id| self.requests.get(id).is_some_and(|active| active.sent_to_shard)).collect();
        tracing::error!(error = %message, failed = on_shard.len(), waiting = self.requests.len() - on_shard.len(),
            "shard failure: failing the requests it held, recovering");
        for id in on_shard {
            if let Some(active) = self.requests.remove(id) {
                active.send(EngineEvent::Failed(EngineError::Shard(message.clone())));
            }
        }
        // The old plan's forgets and transfers are moot: Reset drops everything on the shard.
        self.forget.clear();
        self.status.send_replace(EngineStatus::Recovering(message.clone()));
        let now = Instant::now();
        self.recovery.get_or_insert(Recovery { since: now, reason: message, next_probe: now });
    }

    /// One recovery attempt (or the wait until the next one).
    pub(super) async fn recover(&mut self) -> RecoveryTurn {
        let Some(recovery) = self.recovery.clone() else { return RecoveryTurn::Recovered };
        let now = Instant::now();
        if now.saturating_duration_since(recovery.since) >= self.timeouts.recovery {
            self.give_up(format!(
                "the shard did not recover within {:?} (first failure: {})",
                self.timeouts.recovery, recovery.reason
            ));
            return RecoveryTurn::GiveUp;
        }
        if now < recovery.next_probe {
            return RecoveryTurn::Wait(recovery.next_probe - now);
        }
        // A probe never outlives the recovery window (a stopped shard makes each one wait out
        // its own timeout).
        let remaining = self.timeouts.recovery.saturating_sub(now.saturating_duration_since(recovery.since));
        let attempt = async {
            self.client.health().await?;
            self.client.reset().await
        };
        let attempt = tokio::time::timeout(remaining, attempt).await.unwrap_or(Err(ClientError::Timeout(remaining)));
        match attempt {
            Ok(reset) => {
                self.resume(reset.dropped_requests, recovery.since.elapsed());
                RecoveryTurn::Recovered
            }
            Err(error) if !error.is_transient() => {
                self.give_up(format!("the shard cannot serve again: {error}"));
                RecoveryTurn::GiveUp
            }
            Err(error) => {
                tracing::warn!(%error, "the shard is still failing");
                if let Some(recovery) = self.recovery.as_mut() {
                    recovery.next_probe = Instant::now() + PROBE_INTERVAL;
                }
                RecoveryTurn::Wait(PROBE_INTERVAL)
            }
        }
    }

    /// The shard is back and empty: the scheduler forgets every request and block but keeps
    /// what it learnt (cost model, step timing, arrival estimate, counters), and takes the
    /// requests that were still waiting, in arrival order.
    fn resume(&mut self, dropped_on_shard: u32, outage: Duration) {
        self.scheduler.reset();
        let mut waiting: Vec<(u64, std::time::Instant)> =
            self.requests.ids().filter_map(|id| self.requests.get(id).map(|active| (id, active.request.arrival))).collect();
        waiting.sort_by_key(|&(id, arrival)| (arrival, id));
        for (id, _) in &waiting {
            let Some(active) = self.requests.get(*id) else { continue };
            let (spec, constrained) = (self.spec(*id, &active.request), active.constraint.is_some());
            if let Err(error) = self.admit(spec, constrained) {
                if let Some(active) = self.requests.remove(*id) {
                    active.send(EngineEvent::Failed(refusal(error)));
                }
            }
        }
        self.recovery = None;
        let status = if self.draining { EngineStatus::Draining } else { EngineStatus::Running };
        self.status.send_replace(status);
        tracing::warn!(outage_s = outage.as_secs_f64(), dropped_on_shard, requeued = waiting.len(),
            "the shard answers again; serving");
        self.publish_stats();
    }

    /// The engine cannot serve again: fail everything and publish `Failed` (the router exits).
    fn give_up(&mut self, message: String) {
        tracing::error!(error = %message, "the engine gives up on the shard; the process must restart");
        self.fail_all(EngineError::Shard(message.clone()));
        self.status.send_replace(EngineStatus::Failed(message));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_step_deadline_scales_the_prediction_within_bounds() {
        let timeouts = EngineTimeouts::default();
        assert_eq!(timeouts.step_deadline(0.01), STEP_DEADLINE_FLOOR);
        assert_eq!(timeouts.step_deadline(2.0), Duration::from_secs(40));
        assert_eq!(timeouts.step_deadline(1e9), STEP_DEADLINE_CEILING);
        assert_eq!(timeouts.step_deadline(f64::NAN), STEP_DEADLINE_CEILING);
        assert_eq!(timeouts.step_deadline(-1.0), STEP_DEADLINE_CEILING);
        let fixed = EngineTimeouts { step: Some(Duration::from_millis(1500)), ..EngineTimeouts::default() };
        assert_eq!(fixed.step_deadline(100.0), Duration::from_millis(1500));
    }
}
