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
use crate::step::{Outcome, StepCtx};

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
        if matches!(self.config.policy, PolicyKind::Swap | PolicyKind::RotaSched) {
            // Only the policies that rotate can strand blocks on device.
            self.break_deadlock(&mut ctx);
        }
        let plan = self.seal(ctx);
        self.debug_check("plan");
        plan
    }

    /// Guarantees progress when a plan would do nothing although requests wait: rotated
    /// requests keep their shared prefix blocks on device, and RotaSched refuses victims that
    /// could not return on time, so blocks can end up held with nobody able to move. With no
    /// transfer or step result still to come, rotated requests are dropped for recompute
    /// (newest first) and then the oldest request with work is served, evicting the newest
    /// running ones for recompute as vLLM does. The oldest thus always progresses, and it fits
    /// the device pool alone, so nothing livelocks.
    fn break_deadlock(&mut self, ctx: &mut StepCtx) {
        if !ctx.plan.is_empty() {
            return;
        }
        let settling = self.requests.values().any(|r| {
            r.pending_steps > 0 || matches!(r.phase, Phase::SwappingOut | Phase::SwappingIn)
        });
        let oldest = self
            .requests
            .values()
            .filter(|r| r.has_work() && matches!(r.phase, Phase::Running | Phase::Waiting | Phase::Rotated))
            .min_by_key(|r| r.seq)
            .map(|r| r.id);
        let Some(oldest) = oldest else { return };
        if settling {
            return;
        }
        while let Some(rotated) = self.newest(ctx, Phase::Rotated) {
            self.preempt_for_recompute(ctx, rotated);
        }
        loop {
            let outcome = match self.requests[&oldest].phase {
                Phase::Running => self.schedule_running(ctx, oldest, 0),
                _ => self.admit(ctx, oldest, 0),
            };
            if !matches!(outcome, Outcome::NoBlocks(_)) {
                return;
            }
            match self.newest(ctx, Phase::Running).filter(|id| *id != oldest) {
                Some(victim) => {
                    self.preempt_for_recompute(ctx, victim);
                }
                None => return,
            }
        }
    }

    fn newest(&self, ctx: &StepCtx, phase: Phase) -> Option<u64> {
        self.requests
            .values()
            .filter(|r| r.phase == phase && !r.doomed)
            .filter(|r| phase != Phase::Running || (r.has_work() && self.evictable(ctx, r.id)))
            .max_by_key(|r| r.seq)
            .map(|r| r.id)
    }
}
