//! SLO admission (`--admission slo`): a request whose predicted first-token time exceeds its
//! objective by more than the slack is refused at once, before it reaches the engine task, so
//! the refusal costs no step and a router in front can retry it elsewhere.
//!
//! The prediction is the scheduler crate's (`AdmissionView::predict_ttft`). The engine task
//! publishes a fresh view after each turn; requests admitted here since then are added as
//! prompt tokens in transit, and taken off when the engine publishes a view that holds them, so
//! a burst arriving between two steps is judged against the queue it builds, not against the
//! queue before it.
use std::sync::Mutex;
use std::time::Instant;

use superinfer_scheduler::{AdmissionView, Slo};

use super::api::EngineError;

/// Whether new requests are admitted whatever the load (TGI) or only when their first-token
/// objective can still be met.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Admission {
    All,
    /// Refuse when the predicted first-token time exceeds the objective by more than this many
    /// seconds.
    Slo { slack_s: f64 },
}

#[derive(Debug, Default)]
struct GateState {
    view: AdmissionView,
    /// Prompt tokens admitted here that the published view does not hold yet.
    in_transit_tokens: u64,
}

/// The shared admission decision (one per engine; the HTTP handlers consult it through
/// `EngineHandle::submit`).
#[derive(Debug)]
pub(crate) struct AdmissionGate {
    slack_s: f64,
    default_slo: Slo,
    state: Mutex<GateState>,
}

impl AdmissionGate {
    pub(crate) fn new(slack_s: f64, default_slo: Slo) -> Self {
        Self { slack_s, default_slo, state: Mutex::new(GateState::default()) }
    }

    /// Admits a request (its prompt's tokens are then in transit and returned, for the engine
    /// to hand back to `published`) or refuses it with its predicted and objective times.
    pub(crate) fn admit(
        &self,
        prompt_tokens: u64,
        priority: i32,
        slo: Option<Slo>,
        arrival: Instant,
    ) -> Result<u64, EngineError> {
        let objective_s = slo.unwrap_or(self.default_slo).ttft_s;
        let waited_s = arrival.elapsed().as_secs_f64();
        let mut state = self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let predicted_s = waited_s + state.view.predict_ttft(prompt_tokens, priority, state.in_transit_tokens);
        if predicted_s > objective_s + self.slack_s {
            let over_s = predicted_s - objective_s;
            return Err(EngineError::SloUnreachable {
                predicted_ms: (predicted_s * 1e3).round() as u64,
                objective_ms: (objective_s * 1e3).round() as u64,
                retry_after_s: over_s.ceil().max(1.0) as u64,
            });
        }
        state.in_transit_tokens += prompt_tokens;
        Ok(prompt_tokens)
    }

    /// The engine's new view, which now holds `arrived_tokens` of the tokens in transit.
    pub(crate) fn published(&self, view: AdmissionView, arrived_tokens: u64) {
        let mut state = self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        state.view = view;
        state.in_transit_tokens = state.in_transit_tokens.saturating_sub(arrived_tokens);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use superinfer_scheduler::{PolicyKind, RequestSpec, Scheduler, SchedulerConfig};

    fn scheduler() -> Scheduler {
        let mut config = SchedulerConfig { policy: PolicyKind::Fcfs, max_batch_tokens: 256, ..SchedulerConfig::default() };
        config.cost_model.step_base_s = 0.01;
        config.cost_model.per_prefill_token_s = 0.001;
        Scheduler::new(config).unwrap()
    }

    #[test]
    fn a_burst_between_two_views_is_judged_against_the_queue_it_builds() {
        let gate = AdmissionGate::new(0.0, Slo::new(1.0, 0.1));
        gate.published(scheduler().admission_view(), 0);
        let now = Instant::now();
        // Each 256-token prompt costs 0.266 s to prefill: three fit in one second, the fourth
        // would come after 1.064 s.
        let admitted: Vec<bool> = (0..5).map(|_| gate.admit(256, 0, None, now).is_ok()).collect();
        assert_eq!(admitted, vec![true, true, true, false, false]);
        // A looser objective is met behind the same queue (tokens in transit count for every
        // class: their classes are not known until the engine holds them).
        assert!(gate.admit(256, 0, Some(Slo::new(5.0, 0.1)), now).is_ok());
    }

    #[test]
    fn the_engine_view_takes_over_from_the_tokens_in_transit() {
        let gate = AdmissionGate::new(0.0, Slo::new(1.0, 0.1));
        gate.published(scheduler().admission_view(), 0);
        let now = Instant::now();
        let tokens: u64 = (0..3).map(|_| gate.admit(256, 0, None, now).unwrap()).sum();
        assert!(gate.admit(256, 0, None, now).is_err());
        // The engine took them in and ran them: an idle view with nothing in transit.
        gate.published(scheduler().admission_view(), tokens);
        assert!(gate.admit(256, 0, None, now).is_ok());
        // A view that still holds them queued refuses as the tokens in transit did.
        let mut busy = scheduler();
        for id in 0..3 {
            let spec = RequestSpec { id, prompt_token_ids: vec![7; 256], max_new_tokens: 4, slo: None, arrival: 0.0, priority: 1, kv_namespace: 0, scores_prompt: false };
            busy.add(spec, 0.0).unwrap();
        }
        gate.published(busy.admission_view(), 256);
        match gate.admit(256, 1, None, now) {
            Err(EngineError::SloUnreachable { retry_after_s, objective_ms, .. }) => {
                assert_eq!((retry_after_s, objective_ms), (1, 1000));
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
        // Class 0 is served before the queued class-1 requests.
        assert!(gate.admit(256, 0, None, now).is_ok());
    }
}
