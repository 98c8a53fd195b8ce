//! The service order: least slack first, with the requests that can wait (possible victims,
//! decodes that may park) behind the ones that cannot, and the late and parked classes last.

use super::urgency::{Urgency, STALL_RETURN_STEPS};
use super::{reactive, Planner};
use crate::request::Phase;
use crate::step::StepCtx;

impl Planner<'_, '_> {
    /// Whether the running requests need more new blocks for their next tokens than are free.
    pub(super) fn blocks_short_for_running(&self) -> bool {
        let needed: u64 = self
            .running_by_rank()
            .into_iter()
            .filter_map(|id| {
                let r = &self.requests()[&id];
                let next = u64::from(r.num_computed) + u64::from(r.uncomputed().min(1));
                r.has_work().then(|| self.blocks().new_blocks_needed(id, next))
            })
            .sum();
        needed > u64::from(self.blocks().free_device())
    }

    /// Overload: the running requests need more new blocks for their next tokens than are
    /// free, and none of them has slack for a round trip (or the rotation budget is spent); or a
    /// request on host is due back by its stall bound and the free blocks cannot take it
    /// (`return_stranded`).
    pub(super) fn overloaded(&self, ctx: &StepCtx) -> bool {
        (self.blocks_short_for_running() && self.rotation_victims(ctx, u64::MAX).is_empty()) || self.return_stranded(ctx)
    }

    /// A request on host within `STALL_RETURN_STEPS` steps of its stall bound for which the free
    /// blocks do not suffice. This mode makes room only with victims that memory brings back
    /// within their own bound (`back_within_stall_bound`); where none is, such a request would
    /// wait for the running requests to end, for as long as they run — time-sharing brings it
    /// back by its deadline and sends out whoever is due latest.
    fn return_stranded(&self, ctx: &StepCtx) -> bool {
        let horizon = ctx.now + STALL_RETURN_STEPS * self.step_s;
        let free = u64::from(self.blocks().free_device());
        self.requests().values().any(|r| {
            r.phase == Phase::Rotated
                && !r.doomed
                && r.has_work()
                && r.stall_deadline().is_some_and(|at| at <= horizon)
                && reactive::return_blocks(self.step, r.id, 1) > free
        })
    }

    /// Urgency order, except that running requests with slack to spare for a round trip (the
    /// possible victims) come after the other punctual ones: the requests that cannot wait
    /// claim memory first, and the ones that can are served with what is left — or rotated out
    /// to make room. While a prompt is about to miss its first token, decodes that may park
    /// (see `parking_candidates`) wait behind it the same way. The late and parked classes
    /// still come last, so a hopeless request never takes the blocks a punctual one needs.
    pub(super) fn service_order(&self, ctx: &StepCtx) -> Vec<Urgency> {
        let (late, punctual): (Vec<Urgency>, Vec<Urgency>) =
            self.urgency_order(ctx.now, self.step_s).into_iter().partition(|u| u.deferred_class());
        let mut spare: std::collections::BTreeSet<u64> =
            self.rotation_victims(ctx, u64::MAX).iter().map(|v| v.id).collect();
        if punctual.iter().any(|u| self.needs_parking(u)) {
            spare.extend(self.parking_candidates(ctx, u64::MAX));
        }
        let (deferred, urgent): (Vec<Urgency>, Vec<Urgency>) =
            punctual.into_iter().partition(|u| spare.contains(&u.id));
        urgent.into_iter().chain(deferred).chain(late).collect()
    }

    /// A waiting prompt close enough to its first-token deadline that waiting for blocks to
    /// free up would miss it.
    pub(super) fn needs_parking(&self, urgency: &Urgency) -> bool {
        let waiting = self.requests().get(&urgency.id).is_some_and(|r| r.phase == Phase::Waiting);
        waiting && !urgency.deferred_class() && urgency.slack < 2.0 * self.step_s
    }

    /// Decodes that may be parked on host, best first, for a prompt about to miss its
    /// first-token deadline when no running request has slack for a round trip: eviction
    /// candidates of the requester's class or lower, with tokens left, with two late gaps or
    /// more to spare (one for the parking, one for the unforeseen), and able to come back
    /// within their stall bound — the round trip plus the steps a return is planned ahead
    /// (`STALL_RETURN_STEPS`) and one more for the unforeseen. Lowest class first, then most
    /// late gaps to spare, then newest. Their next gap will be late (the objective holds for a
    /// percentile of gaps); they come back with the blocks punctual requests leave, or, as
    /// their stall bound nears, as punctual requests themselves.
    pub(super) fn parking_candidates(&self, ctx: &StepCtx, requester: u64) -> Vec<u64> {
        if !self.rotation_budget_left {
            return Vec::new();
        }
        let share = self.config().tbt_late_share();
        let requester_priority = self.requests().get(&requester).map(|r| r.priority);
        let mut candidates: Vec<(i32, u32, u64, u64)> = self
            .eviction_candidates(ctx, requester)
            .into_iter()
            .filter(|id| self.is_running_decode(*id) && self.yields_to(*id, requester_priority))
            .filter_map(|id| {
                let r = &self.requests()[&id];
                let spare = r.late_gaps_left(share);
                let worth = r.tokens_left() >= self.settings.min_rotation_tokens_left;
                let round_trip = self.cheaper_eviction(id, self.step_s).round_trip_s();
                let returns_in_time = r.stall_deadline().is_some_and(|at| {
                    at - ctx.now > round_trip + (STALL_RETURN_STEPS + 1.0) * self.step_s
                });
                (spare > 1 && worth && returns_in_time).then_some((r.priority, spare, r.seq, id))
            })
            .collect();
        candidates.sort_by(|a, b| b.0.cmp(&a.0).then(b.1.cmp(&a.1)).then(b.2.cmp(&a.2)));
        candidates.into_iter().map(|(_, _, _, id)| id).collect()
    }
}
