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

    /// Guarantees progress when a plan would do nothing although requests wait: rotated
    /// requests keep their shared prefix blocks on device, and RotaSched refuses victims that
    /// could not return on time, so blocks can end up held with nobody able to move. With no
    /// transfer or step result still to come, the newest rotated request (else the newest
    /// running one) is dropped for recompute. Always evicting the newest means the oldest
    /// request keeps progressing, and every admitted request fits the device pool alone.
    fn break_deadlock(&mut self, ctx: &mut StepCtx) {
        if !ctx.plan.is_empty() {
            return;
        }
        let settling = self.requests.values().any(|r| {
            r.pending_steps > 0 || matches!(r.phase, Phase::SwappingOut | Phase::SwappingIn)
        });
        let starved = self.requests.values().any(|r| r.has_work());
        if settling || !starved {
            return;
        }
        let newest = |phase: Phase, this: &Self| {
            this.requests
                .values()
                .filter(|r| r.phase == phase && !r.doomed && (phase == Phase::Rotated || r.has_work()))
                .max_by_key(|r| r.seq)
                .map(|r| r.id)
        };
        let victim = newest(Phase::Rotated, self).or_else(|| newest(Phase::Running, self));
        if let Some(id) = victim {
            if self.requests.values().filter(|r| r.has_work() || r.phase == Phase::Rotated).count() > 1
                || self.requests[&id].phase == Phase::Rotated
            {
                self.preempt_for_recompute(ctx, id);
            }
        }
    }
}
