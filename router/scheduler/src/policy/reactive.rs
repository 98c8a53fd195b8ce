//! recompute (vLLM V1, SGLang) and swap (vLLM V0): blocks on demand; when a running request
//! needs a block and none is free, the newest running request of the lowest priority class is
//! preempted (vLLM's priority scheduling). recompute drops its KV (it returns to the front of
//! the queue); swap copies it to host and brings it back, highest class and oldest first, before
//! any new request is admitted. The queue is served by priority class, then in order.

use crate::request::Phase;
use crate::scheduler::Core;
use crate::step::{Fit, StepCtx};

impl Core {
    /// `keep_growth`: admit a request only if the running ones can still grow through its
    /// prefill and first token (RotaSched's overload mode; the baselines admit while it fits).
    pub(crate) fn plan_reactive(&mut self, ctx: &mut StepCtx, swap: bool, keep_growth: bool) {
        let running = self.running_by_rank();
        for decodes in [true, false] {
            for id in &running {
                let request = &self.requests[id];
                if request.phase == Phase::Running && request.is_decode() == decodes {
                    self.schedule_or_preempt(ctx, *id, swap);
                }
            }
        }
        if swap && !self.rotate_in_oldest(ctx) {
            return;
        }
        if !ctx.plan.preempted_for_recompute.is_empty() {
            return;
        }
        for id in self.waiting_by_priority() {
            if keep_growth && !self.admission_keeps_growth(id) {
                break;
            }
            if self.admit(ctx, id, 0) != Fit::Scheduled {
                break;
            }
        }
    }

    fn schedule_or_preempt(&mut self, ctx: &mut StepCtx, id: u64, swap: bool) {
        loop {
            let Fit::NoBlocks(short) = self.schedule_running(ctx, id, 0) else { return };
            if swap && ctx.release_credit >= short {
                // Transfers out already issued will free enough once acknowledged: wait.
                ctx.release_credit -= short;
                return;
            }
            let Some(victim) = self.newest_evictable(ctx) else { return };
            let moved = if swap { self.rotate_out(ctx, victim) } else { 0 };
            if moved > 0 {
                ctx.release_credit += moved;
            } else {
                self.preempt_for_recompute(ctx, victim);
            }
            if victim == id {
                return;
            }
        }
    }

    fn newest_evictable(&self, ctx: &StepCtx) -> Option<u64> {
        let running = self.running_by_rank();
        running.into_iter().rev().find(|id| self.evictable(ctx, *id))
    }

    /// Brings rotated requests back oldest first while they fit; true when none is left out
    /// (only then may new requests be admitted).
    fn rotate_in_oldest(&mut self, ctx: &mut StepCtx) -> bool {
        let mut rotated: Vec<((i32, u64), u64)> = self
            .requests
            .values()
            .filter(|r| r.phase == Phase::Rotated && !r.doomed)
            .map(|r| (r.rank(), r.id))
            .collect();
        rotated.sort_unstable();
        for (_, id) in rotated {
            if !self.rotate_in(ctx, id) {
                return false;
            }
        }
        !self.requests.values().any(|r| r.phase == Phase::RotatingOut)
    }
}
