//! Returns before the stall bound, under overload. The overload mode brings requests rotated out
//! back only into free blocks, so one pushed out waits for memory for as long as the running
//! requests hold it — past its stall bound, though some of those that hold it can no longer meet
//! their objectives anyway. A request rotated out that still can comes back in exchange for them:
//! when its stall bound is a few steps away (the exchange's rotation out, its rotation in and the
//! step that computes its token: `EXCHANGE_STEPS`) and the blocks it needs are not free, running
//! requests that yield (`reactive::yields`: already lost, not starved) are rotated out, those
//! with the most tokens left first, until their blocks cover what it misses; the overload mode's
//! returns, where the lost ones yield too, bring it back once those are acknowledged. Only the
//! lost pay: no request that can still meet its objectives is pushed out for it, and none is
//! pushed out unless the lost ones free enough.

use super::reactive;
use super::urgency::STALL_RETURN_STEPS;
use super::Planner;
use crate::step::StepCtx;

/// How many (predicted) steps before its stall bound a request rotated out is exchanged for lost
/// ones: one for their rotation out, then the `STALL_RETURN_STEPS` of a planned return.
const EXCHANGE_STEPS: f64 = STALL_RETURN_STEPS + 1.0;

impl Planner<'_, '_> {
    /// Rotates out the lost running requests that make room for the request rotated out that is
    /// first due to break its stall bound; call before the overload mode serves the step.
    pub(super) fn exchange_for_the_lost(&mut self, ctx: &mut StepCtx) {
        let starve_s = self.settings.late_starvation_s;
        let window = EXCHANGE_STEPS * self.step_s;
        let due = self.rotated_by_rank().into_iter().find(|&id| {
            let r = &self.requests()[&id];
            !reactive::yields(self.step, id, ctx.now, starve_s)
                && r.stall_deadline().is_some_and(|at| at > ctx.now && at - ctx.now <= window)
        });
        let Some(due) = due else { return };
        // Blocks already on their way out (`release_credit`) free at acknowledgement, in time
        // for its return.
        let need = reactive::return_blocks(self.step, due, 1);
        let missing = reactive::growth_deficit(self.step, need, 1).saturating_sub(ctx.release_credit);
        if missing == 0 {
            return;
        }
        let mut victims = Vec::new();
        let mut freed = 0;
        // The lost that would hold their blocks longest go first: one about to end frees its
        // own soon anyway (newest first among equals; the sort is stable).
        let mut order = self.running_by_rank();
        order.reverse();
        order.sort_by_key(|id| std::cmp::Reverse(self.requests()[id].tokens_left()));
        for id in order {
            if freed >= missing {
                break;
            }
            if self.evictable(ctx, id) && reactive::yields(self.step, id, ctx.now, starve_s) {
                freed += u64::from(self.blocks().private_device_blocks(id));
                victims.push(id);
            }
        }
        if freed < missing {
            return;
        }
        for id in victims {
            if self.rotate_out(ctx, id) == 0 {
                self.preempt_for_recompute(ctx, id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::Planner;
    use crate::config::{PolicyKind, RotaSchedSettings};
    use crate::request::Phase;
    use crate::step::{Fit, StepBuilder};
    use crate::step_timing::StepTiming;
    use crate::tests::driver::{config, spec, Driver};

    /// 4-token blocks, 24 on device (10 ms steps, stall bound 0.5 s). Requests 1–4 (16-token
    /// prompts, 60 tokens to generate, request 4 only 20) run to their first token; request 1 is
    /// rotated out and request 5 (a 16-token prompt) admitted into its blocks, so it cannot come
    /// back. The requests `lost` can no longer meet their objectives. At `before_bound` seconds
    /// before request 1's stall bound, returns the blocks request 1 misses and whom the exchange
    /// rotates out.
    fn exchange(lost: &[u64], before_bound: f64) -> (u64, Vec<u64>) {
        let mut d = Driver::new(config(PolicyKind::RotaSched, 24));
        for (id, max_new) in [(1, 60), (2, 60), (3, 60), (4, 20)] {
            d.add(spec(id, 16, max_new, d.now));
        }
        d.step_to_first_tokens(&[1, 2, 3, 4]);
        d.by_hand(|step, ctx| assert!(step.rotate_out(ctx, 1) > 0));
        d.add(spec(5, 16, 60, d.now));
        d.by_hand(|step, ctx| assert_eq!(step.admit(ctx, 5, 0), Fit::Scheduled));
        let core = &mut d.scheduler.core;
        assert_eq!(core.requests[&1].phase, Phase::Rotated);
        for id in lost {
            core.requests.get_mut(id).unwrap().objectives_lost = true;
        }
        let bound = core.requests[&1].stall_deadline().expect("request 1 has a token");
        let mut ctx = core.new_ctx(bound - before_bound);
        let mut step = StepBuilder::new(core);
        let need = super::reactive::return_blocks(&step, 1, 1);
        let missing = super::reactive::growth_deficit(&step, need, 1);
        let mut planner = Planner::new(&mut step, RotaSchedSettings::default(), 0.01, 0, true, StepTiming::default());
        planner.exchange_for_the_lost(&mut ctx);
        (missing, ctx.plan.rotate_out.iter().map(|t| t.request_id).collect())
    }

    /// Two steps before its bound, request 1 (5 blocks short at most) comes back in exchange for
    /// request 3, lost: the newest running request (5) can still meet its objectives and stays.
    /// With 3 and 4 lost, 3 still goes: 4, newer, ends sooner and frees its blocks itself. With
    /// nobody lost, or ten steps before the bound, nobody is pushed out.
    #[test]
    fn under_overload_a_request_due_to_break_its_stall_bound_comes_back_in_exchange_for_a_lost_one() {
        let (missing, out) = exchange(&[3], 0.02);
        assert!(missing > 0 && missing <= 5, "request 1 misses {missing} blocks");
        assert_eq!(out, vec![3]);
        assert_eq!(exchange(&[3, 4], 0.02).1, vec![3]);
        assert_eq!(exchange(&[], 0.02).1, Vec::<u64>::new());
        assert_eq!(exchange(&[3], 0.1).1, Vec::<u64>::new());
    }
}
