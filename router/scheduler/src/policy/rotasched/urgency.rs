//! RotaSched's view of time: each request's slack against the deadline of its next token, the
//! late class, and what a rotation would cost.

use super::Planner;
use crate::cost_model::{Direction, StepShape};
use crate::request::{Phase, RequestState};
use crate::step::StepBuilder;

/// A parked request becomes punctual again this many (predicted) steps before its return would
/// break the stall bound: one step for the rotation in to be issued while it is due, one for
/// the step that then computes its token.
pub(super) const STALL_RETURN_STEPS: f64 = 2.0;

/// How urgent one request is this step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Urgency {
    pub(super) id: u64,
    pub(super) seq: u64,
    /// Its priority class (lower first).
    pub(super) priority: i32,
    /// Deadline minus (now + predicted service time); negative = will be late even if served
    /// now.
    pub(super) slack: f64,
    /// The first-token deadline is already hopeless: served after every punctual request, in
    /// arrival order, and never allowed to evict anyone.
    pub(super) late: bool,
    /// Rotated and already past the deadline of its next token: that gap is late whatever
    /// happens now, so waiting longer costs it no further late gap. It returns with the blocks
    /// the punctual ones leave, in arrival order, and never evicts anyone (until starving).
    pub(super) parked: bool,
}

impl Urgency {
    /// Served after every punctual request and never allowed to evict.
    pub(super) fn deferred_class(&self) -> bool {
        self.late || self.parked
    }
}

/// How a victim would leave the device, with the time until it could compute again.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Eviction {
    RotateOut { round_trip_s: f64 },
    Recompute { round_trip_s: f64 },
}

impl Eviction {
    pub(super) fn round_trip_s(self) -> f64 {
        match self {
            Eviction::RotateOut { round_trip_s } | Eviction::Recompute { round_trip_s } => round_trip_s,
        }
    }
}

/// Predicted time of a step serving the current load (decodes plus what prefill fits).
pub(super) fn step_estimate(step: &StepBuilder) -> f64 {
    let mut shape = StepShape::default();
    let mut prefill_wanted = 0u64;
    for request in step.requests().values().filter(|r| r.has_work()) {
        match request.phase {
            Phase::Running if request.is_decode() => shape.decode_requests += 1,
            Phase::Running | Phase::Waiting => prefill_wanted += u64::from(request.uncomputed()),
            _ => continue,
        }
        shape.context_tokens += u64::from(request.num_computed) + 1;
    }
    let room = u64::from(step.config().max_batch_tokens).saturating_sub(shape.decode_requests);
    shape.prefill_tokens = prefill_wanted.min(room);
    step.cost().predict_step(shape).max(1e-6)
}

/// The running decodes alone, as one step computes them.
pub(super) fn decodes_alone(step: &StepBuilder) -> StepShape {
    let mut shape = StepShape::default();
    for r in step.requests().values().filter(|r| r.phase == Phase::Running && r.has_work() && r.is_decode()) {
        shape.decode_requests += 1;
        shape.context_tokens += u64::from(r.num_computed) + 1;
    }
    shape
}

impl Planner<'_, '_> {
    /// Time to compute a prompt's remaining `uncomputed` tokens if it were served now: its
    /// first chunk in a step beside the running decodes, the rest at prefill speed. Not the
    /// step estimate, which prices every waiting prompt into the step: a prompt whose deadline
    /// it can still meet when served first is punctual, not late.
    fn prefill_service_s(&self, computed: u32, uncomputed: u32) -> f64 {
        let room = u64::from(self.config().max_batch_tokens).saturating_sub(self.decodes_alone.decode_requests).max(1);
        let chunk = u64::from(uncomputed).min(room);
        let mut shape = self.decodes_alone;
        shape.prefill_tokens += chunk;
        shape.context_tokens += u64::from(computed) + chunk;
        let rest = u64::from(uncomputed) - chunk;
        self.cost().predict_step(shape) + if rest > 0 { self.cost().predict_prefill(rest) } else { 0.0 }
    }

    /// Late for longer than `late_starvation_s`: served with the punctual ones again.
    pub(super) fn starved(&self, r: &RequestState, now: f64) -> bool {
        r.starved(now, self.settings.late_starvation_s)
    }

    pub(super) fn urgency(&self, id: u64, now: f64, step_s: f64) -> Urgency {
        let r = &self.requests()[&id];
        let service = match r.phase {
            Phase::Running if r.is_decode() => step_s,
            Phase::Running | Phase::Waiting => self.prefill_service_s(r.num_computed, r.uncomputed()),
            Phase::Rotated => self.transfer_s(self.blocks().host_slots(id), Direction::In) + 2.0 * step_s,
            Phase::RotatingIn | Phase::RotatingOut => 2.0 * step_s,
        };
        let deadline = r.next_deadline();
        let mut slack = deadline - (now + service);
        let starving = self.starved(r, now);
        let late = r.last_token_at.is_none() && slack < 0.0 && !starving;
        let mut parked = r.phase == Phase::Rotated && r.last_token_at.is_some() && slack < 0.0 && !starving;
        if let Some(stall_deadline) = r.stall_deadline().filter(|_| parked) {
            // Its gap is late already, so it may wait — but only while its return still beats
            // the stall bound. Within two steps of that it is punctual again, with the stall
            // deadline as its deadline: it is served before the requests with more slack, and
            // may make room for itself as any punctual request does.
            let stall_slack = stall_deadline - (now + service);
            if stall_slack <= STALL_RETURN_STEPS * step_s {
                parked = false;
                slack = stall_slack;
            }
        }
        Urgency { id, seq: r.seq, priority: r.priority, slack, late, parked }
    }

    /// Punctual requests by priority class, then slack (least first), then the parked, then
    /// the late class, each by priority class and arrival order. A first token is late when it
    /// cannot come in time even served at once — after the prompts ahead of it in this order,
    /// whose tokens are computed first: under a queue of prompts only those that can still make
    /// it are punctual, so the rest do not each wait until just too late (earliest deadline
    /// first collapses under overload otherwise).
    pub(super) fn urgency_order(&self, now: f64, step_s: f64) -> Vec<Urgency> {
        let mut order: Vec<Urgency> = self
            .requests()
            .values()
            .filter(|r| !r.doomed && (r.has_work() || r.phase == Phase::Rotated))
            .filter(|r| matches!(r.phase, Phase::Running | Phase::Waiting | Phase::Rotated))
            .map(|r| self.urgency(r.id, now, step_s))
            .collect();
        let sort = |order: &mut Vec<Urgency>| {
            order.sort_by(|a, b| {
                let class = |u: &Urgency| (u.deferred_class(), u.late);
                let key = |u: &Urgency| if u.deferred_class() { 0.0 } else { u.slack };
                class(a)
                    .cmp(&class(b))
                    .then(a.priority.cmp(&b.priority))
                    .then(key(a).total_cmp(&key(b)))
                    .then(a.seq.cmp(&b.seq))
            })
        };
        sort(&mut order);
        let mut ahead = 0u32;
        let mut queued_late = false;
        for u in order.iter_mut().filter(|u| !u.deferred_class()) {
            let r = &self.requests()[&u.id];
            let prompt = r.last_token_at.is_none() && matches!(r.phase, Phase::Running | Phase::Waiting);
            if !prompt || r.is_decode() {
                continue;
            }
            if ahead > 0 && !self.starved(r, now) {
                let slack = r.next_deadline() - (now + self.prefill_service_s(r.num_computed, ahead + r.uncomputed()));
                if slack < 0.0 {
                    u.late = true;
                    u.slack = slack;
                    queued_late = true;
                    continue;
                }
            }
            ahead = ahead.saturating_add(r.uncomputed());
        }
        if queued_late {
            sort(&mut order);
        }
        order
    }

    pub(super) fn transfer_s(&self, blocks: u32, direction: Direction) -> f64 {
        let bytes = u64::from(blocks) * self.config().block_bytes;
        self.cost().predict_transfer(bytes, direction)
    }

    /// The cheaper way to evict `id` by the cost model: copying its private blocks out (those
    /// the host holds no mirror of) and back, or the marginal prefill time of its context (the
    /// step's base cost is paid anyway). Rotating out needs host room. The returned round trip — time until it could compute again,
    /// including the step boundaries at which acknowledgements arrive — is what its slack must
    /// cover.
    pub(super) fn cheaper_eviction(&self, id: u64, step_s: f64) -> Eviction {
        let private = self.blocks().private_device_blocks(id);
        let copy_s =
            self.transfer_s(self.blocks().blocks_to_copy_out(id), Direction::Out) + self.transfer_s(private, Direction::In);
        let computed = u64::from(self.requests()[&id].num_computed);
        let marginal_prefill_s = self.cost().predict_prefill(computed) - self.cost().predict_prefill(0);
        let rotate_s = copy_s + 2.0 * step_s;
        let recompute_s = self.cost().predict_prefill(computed) + step_s;
        if private <= self.blocks().free_host() && copy_s <= marginal_prefill_s {
            Eviction::RotateOut { round_trip_s: rotate_s }
        } else {
            Eviction::Recompute { round_trip_s: recompute_s }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::Planner;
    use super::{Eviction, STALL_RETURN_STEPS};
    use crate::step::StepBuilder;
    use crate::config::RotaSchedSettings;
    use crate::step_timing::StepTiming;

    fn planner<'a, 'b>(step: &'a mut StepBuilder<'b>) -> Planner<'a, 'b> {
        Planner::new(step, RotaSchedSettings::default(), 0.02, 0, true, StepTiming::default())
    }

    use crate::config::{PolicyKind, SchedulerConfig, Slo};
    use crate::request::Phase;
    use crate::cost_model::CostModel;
    use crate::request::RequestSpec;
    use crate::scheduler::Scheduler;

    /// One running request with `context` computed tokens under the given link bandwidth.
    fn eviction(context: u32, bytes_per_s: f64) -> Eviction {
        let config = SchedulerConfig {
            block_size: 16,
            num_device_blocks: 64,
            num_host_blocks: 64,
            block_bytes: 1 << 20,
            policy: PolicyKind::RotaSched,
            cost_model: CostModel {
                per_prefill_token_s: 0.000_1,
                swap_out_bytes_per_s: bytes_per_s,
                swap_in_bytes_per_s: bytes_per_s,
                ..CostModel::default()
            },
            ..SchedulerConfig::default()
        };
        let mut s = Scheduler::new(config).unwrap();
        let prompt = (0..context).collect();
        let spec = RequestSpec { id: 1, prompt_token_ids: prompt, max_new_tokens: 8, slo: None, arrival: 0.0, priority: 0, kv_namespace: 0, scores_prompt: false };
        s.add(spec, 0.0).unwrap();
        s.plan(0.0);
        let mut step = StepBuilder::new(&mut s.core);
        planner(&mut step).cheaper_eviction(1, 0.02)
    }

    /// A rotated request past its TBT deadline is parked (deferred) while its return can still
    /// beat its stall bound; within `STALL_RETURN_STEPS` steps of that it is punctual again,
    /// its slack measured to the stall deadline.
    #[test]
    fn a_parked_request_turns_punctual_as_its_stall_bound_nears() {
        let config = SchedulerConfig { policy: PolicyKind::RotaSched, ..SchedulerConfig::default() };
        let mut s = Scheduler::new(config).unwrap();
        let slo = Slo::new(1.0, 0.1).with_max_stall(Some(1.0));
        let spec = RequestSpec { id: 1, prompt_token_ids: vec![1, 2, 3], max_new_tokens: 8, slo: Some(slo), arrival: 0.0, priority: 0, kv_namespace: 0, scores_prompt: false };
        s.add(spec, 0.0).unwrap();
        let request = s.core.requests.get_mut(&1).unwrap();
        request.phase = Phase::Rotated;
        request.last_token_at = Some(0.0);
        let step_s = 0.01;
        // The return itself takes 2 steps (the transfer of no blocks is free).
        let mut step = StepBuilder::new(&mut s.core);
        let planner = planner(&mut step);
        let parked = planner.urgency(1, 0.5, step_s);
        assert!(parked.parked && parked.deferred_class());
        let due = planner.urgency(1, 1.0 - 2.0 * step_s - STALL_RETURN_STEPS * step_s + 1e-6, step_s);
        assert!(!due.deferred_class(), "{due:?}");
        assert!(due.slack <= STALL_RETURN_STEPS * step_s && due.slack > 0.0, "{due:?}");
    }

    #[test]
    fn rotate_out_or_recompute_by_the_cost_model() {
        // 1 MiB blocks of 16 tokens: recomputing a block costs 1.6 ms; copying it both ways
        // costs 0.17 ms at 12 GB/s but 21 ms at 100 MB/s.
        assert!(matches!(eviction(512, 12e9), Eviction::RotateOut { .. }));
        assert!(matches!(eviction(512, 1e8), Eviction::Recompute { .. }));
    }
}
