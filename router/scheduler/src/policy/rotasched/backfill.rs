//! Returns past a blocked one, under overload. The overload mode brings requests rotated out
//! back oldest first, as swap does, so the oldest never starves. When the oldest cannot come
//! back yet — the blocks it needs are not free — every one behind it waits too, with free blocks
//! idle: a 12-block request one block short holds back a 2-block one that fits now, and that one
//! stalls for as long. One behind it may come back first when that does not delay it (batch
//! schedulers' backfilling): by the end forecast, the running requests that end by the time the
//! oldest's blocks free must also free what those let past it then hold. And it must fit until
//! then, with the running requests' growth, in the blocks free now: one that runs short before
//! then is among the newest, pushed out again — a second long gap where it had one.

use super::reactive;
use super::Planner;
use crate::step::StepCtx;

impl Planner<'_, '_> {
    /// Brings rotated requests back past the oldest one when it cannot return yet and they do
    /// not delay it; call after the overload mode's oldest-first returns.
    pub(super) fn return_past_the_blocked(&mut self, ctx: &mut StepCtx) {
        let rotated = reactive::return_order(self.step, ctx.now, Some(self.settings.late_starvation_s));
        let Some(&oldest) = rotated.first() else { return };
        let oldest_blocks = reactive::return_blocks(self.step, oldest, 1);
        let missing = reactive::growth_deficit(self.step, oldest_blocks, 1);
        if missing == 0 {
            return; // it was let back (or waits on something other than memory)
        }
        let ends = self.end_forecast();
        let Some(oldest_s) = ends.free_within(missing, &[], None) else { return };
        // What it misses by then, the running requests having grown meanwhile.
        let steps = (oldest_s / ends.token_s).ceil().max(1.0) as u64;
        let missing = reactive::growth_deficit(self.step, oldest_blocks, steps);
        let mut let_past = 0;
        for &id in &rotated[1..] {
            let then = reactive::return_blocks(self.step, id, steps);
            if reactive::growth_deficit(self.step, then, steps) > 0 {
                continue; // it would run short before then, and be pushed out again
            }
            let ends_then = (self.requests()[&id].tokens_left(), then);
            let free_s = ends.free_within(missing + let_past + then, &[], Some(ends_then));
            if free_s.is_some_and(|free_s| free_s <= oldest_s) && self.step.rotate_in(ctx, id) {
                let_past += then;
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

    /// 4-token blocks, `pool` on device (10 ms steps). Running: the oldest, request 1 (a 60-token
    /// prompt), request 2 (6 tokens), request 3 (`c.0` tokens, `c.1` to generate) and request 4
    /// (8 tokens, 100 to generate); requests 1 and 2 are rotated out, then request 5 (`e_prompt`
    /// tokens, 100 to generate) is admitted into their blocks. Returns the blocks the oldest
    /// misses to come back, request 3's blocks (it ends first), whether request 2 fits now, and
    /// whom the overload mode's returns past the blocked one bring back.
    fn past_the_oldest(pool: u32, c: (u32, u32), e_prompt: u32) -> (u64, u32, bool, Vec<u64>) {
        let mut d = Driver::new(config(PolicyKind::RotaSched, pool));
        for (id, prompt, max_new) in [(1, 60, 60), (2, 6, 60), (3, c.0, c.1), (4, 8, 100)] {
            d.add(spec(id, prompt, max_new, d.now));
        }
        d.step_to_first_tokens(&[1, 2, 3, 4]);
        d.by_hand(|step, ctx| assert!(step.rotate_out(ctx, 1) > 0 && step.rotate_out(ctx, 2) > 0));
        d.add(spec(5, e_prompt, 100, d.now));
        d.by_hand(|step, ctx| assert_eq!(step.admit(ctx, 5, 0), Fit::Scheduled));
        let core = &mut d.scheduler.core;
        assert!([1, 2].iter().all(|id| core.requests[id].phase == Phase::Rotated));
        let ending_first = core.blocks.private_device_blocks(3);
        let mut ctx = core.new_ctx(d.now);
        let mut step = StepBuilder::new(core);
        let deficit = |step: &StepBuilder, id| super::reactive::growth_deficit(step, super::reactive::return_blocks(step, id, 1), 1);
        let (missing, fits) = (deficit(&step, 1), deficit(&step, 2) == 0);
        let mut planner = Planner::new(&mut step, RotaSchedSettings::default(), 0.01, 0, true, StepTiming::default());
        planner.return_past_the_blocked(&mut ctx);
        (missing, ending_first, fits, ctx.plan.rotate_in.iter().map(|t| t.request_id).collect())
    }

    /// With request 5 of 52 tokens, the oldest misses 4 blocks; request 3, 5 tokens from its end,
    /// frees 10 then: room for the oldest (7 short by then, the others having grown) and for
    /// request 2 as it will be (3 blocks), which comes back past it. With 56 tokens the oldest
    /// misses 5 (8 by then): request 3's blocks are its, and request 2 waits though it fits now —
    /// back first, it would keep the oldest out until a 100-token request ends. And with request
    /// 3 freeing 20 blocks only after 19 tokens, request 2 waits too, though those 20 would cover
    /// the oldest (13 short by then) and it (7): it fits now, but the running requests' growth
    /// over those 19 steps would leave it 4 blocks short first, and it would be pushed out again.
    #[test]
    fn under_overload_a_request_comes_back_past_a_blocked_older_one_only_if_that_does_not_delay_it() {
        let (missing, ending_first, fits, returned) = past_the_oldest(40, (40, 6), 52);
        assert_eq!((missing, ending_first, fits), (4, 10, true));
        assert_eq!(returned, vec![2]);
        let (missing, ending_first, fits, returned) = past_the_oldest(40, (40, 6), 56);
        assert_eq!((missing, ending_first, fits), (5, 10, true));
        assert!(returned.is_empty(), "request 2 came back into blocks the oldest needs");
        let (missing, ending_first, fits, returned) = past_the_oldest(52, (80, 20), 48);
        assert_eq!((missing, ending_first, fits), (1, 20, true));
        assert!(returned.is_empty(), "request 2 came back to be pushed out before the oldest returns");
    }
}
