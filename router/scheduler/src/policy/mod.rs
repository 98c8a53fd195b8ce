//! The scheduling policies. Each fills a `StepCtx` through the shared step machinery
//! (`step.rs`); they differ only in order and in what they do when blocks run out:
//!
//! - `fcfs`: worst-case reservation at admission, head-of-line, never preempts.
//! - `reactive`: blocks on demand; on shortage the newest running request is preempted —
//!   recomputed later (`recompute`) or swapped to host and brought back (`swap`).
//! - `rotasched`: least slack first with a late class, proactive rotation under a per-step
//!   byte budget, swap or recompute by the cost model (`urgency` computes slack).

mod fcfs;
mod reactive;
mod rotasched;
mod urgency;

use crate::config::PolicyKind;
use crate::plan::StepPlan;
use crate::request::Phase;
use crate::scheduler::Scheduler;
use crate::step::StepCtx;

impl Scheduler {
    /// Decides the next step: what to compute, what to move, whom to preempt. Requests whose
    /// swap-in has not been acknowledged are never scheduled; blocks whose swap-out has not
    /// been acknowledged are never handed out.
    pub fn plan(&mut self, now: f64) -> StepPlan {
        let mut ctx = self.new_ctx(now);
        match self.config.policy {
            PolicyKind::Fcfs => self.plan_fcfs(&mut ctx),
            PolicyKind::Recompute => self.plan_reactive(&mut ctx, false),
            PolicyKind::Swap => self.plan_reactive(&mut ctx, true),
            PolicyKind::RotaSched => self.plan_rotasched(&mut ctx),
        }
        self.break_deadlock(&mut ctx);
        let plan = self.seal(ctx);
        self.debug_check("plan");
        plan
    }

    /// Rotated requests keep their shared prefix blocks on device; if those are all that is
    /// left and nothing runs or moves, no swap-in can ever fit. Dropping the oldest rotated
    /// request's KV (it is recomputed later) guarantees progress, because every admitted
    /// request fits the device pool alone.
    fn break_deadlock(&mut self, ctx: &mut StepCtx) {
        let busy = self.requests.values().any(|r| {
            matches!(r.phase, Phase::Running | Phase::SwappingOut | Phase::SwappingIn)
        });
        if busy || !ctx.plan.is_empty() {
            return;
        }
        let oldest_rotated = self
            .requests
            .values()
            .filter(|r| r.phase == Phase::Rotated && !r.doomed)
            .min_by_key(|r| r.seq)
            .map(|r| r.id);
        if let Some(id) = oldest_rotated {
            self.preempt_for_recompute(ctx, id);
        }
    }
}
