//! The scheduling policies. Each fills a `StepCtx` through the shared step machinery
//! (`step.rs`); they differ only in order and in what they do when blocks run out:
//!
//! - `fcfs`: worst-case reservation at admission, head-of-line, never preempts.
//! - `reactive`: blocks on demand; on shortage the newest running request is preempted —
//!   recomputed later (`recompute`) or rotated out to host and brought back (`swap`).
//! - `rotasched`: least slack first with a late class, proactive rotation under a per-step
//!   byte budget, rotate out or recompute by the cost model (`urgency` computes slack).

mod fcfs;
mod reactive;
mod rotasched;
mod urgency;

use crate::config::PolicyKind;
use crate::plan::StepPlan;
use crate::request::Phase;
use crate::scheduler::Core;
use crate::step::{Fit, StepCtx};

pub(crate) use rotasched::RotaSched;

/// The policy a scheduler runs, with the state it owns (only RotaSched keeps any: its arrival
/// estimate and its current reserve of free blocks).
#[derive(Debug)]
pub(crate) enum Policy {
    Fcfs,
    /// Preempts the newest running request on shortage: rotated out to host and back when `swap`,
    /// else recomputed later.
    Reactive { swap: bool },
    RotaSched(RotaSched),
}

impl Policy {
    pub(crate) fn new(kind: PolicyKind) -> Self {
        match kind {
            PolicyKind::Fcfs => Policy::Fcfs,
            PolicyKind::Recompute => Policy::Reactive { swap: false },
            PolicyKind::Swap => Policy::Reactive { swap: true },
            PolicyKind::RotaSched => Policy::RotaSched(RotaSched::default()),
        }
    }

    /// Decides the next step: what to compute, what to move, whom to preempt. Requests whose
    /// transfer in has not been acknowledged are never scheduled; blocks whose transfer out has not
    /// been acknowledged are never handed out.
    pub(crate) fn plan(&mut self, core: &mut Core, now: f64) -> StepPlan {
        let mut ctx = core.new_ctx(now);
        // Only the policies that rotate can strand blocks on device.
        let may_strand_blocks = match self {
            Policy::Fcfs => {
                core.plan_fcfs(&mut ctx);
                false
            }
            Policy::Reactive { swap } => {
                core.plan_reactive(&mut ctx, *swap);
                *swap
            }
            Policy::RotaSched(rotasched) => {
                rotasched.plan(core, &mut ctx);
                true
            }
        };
        if may_strand_blocks {
            core.break_deadlock(&mut ctx);
        }
        let plan = core.seal(ctx);
        core.debug_check("plan");
        plan
    }

    /// A request arrived with a prompt of `prompt_blocks` blocks.
    pub(crate) fn observe_arrival(&mut self, now: f64, prompt_blocks: u64, alpha: f64) {
        if let Policy::RotaSched(rotasched) = self {
            rotasched.observe_arrival(now, prompt_blocks, alpha);
        }
    }

    /// Free device blocks the policy currently keeps for arrivals (for /metrics).
    pub(crate) fn reserve_blocks(&self) -> u32 {
        match self {
            Policy::RotaSched(rotasched) => rotasched.reserve_blocks(),
            _ => 0,
        }
    }
}

impl Core {
    /// Guarantees progress when a plan would do nothing although requests wait: rotated
    /// requests keep their shared prefix blocks on device, and RotaSched refuses victims that
    /// could not return on time, so blocks can end up held with nobody able to move. With no
    /// transfer or step result still to come, rotated requests are dropped for recompute
    /// (newest first) and then the oldest request with work is served, evicting the newest
    /// running ones for recompute as vLLM does (oldest and newest by priority class first). The oldest thus always progresses, and it fits
    /// the device pool alone, so nothing livelocks.
    fn break_deadlock(&mut self, ctx: &mut StepCtx) {
        if !ctx.plan.is_empty() {
            return;
        }
        let settling = self.requests.values().any(|r| {
            r.pending_steps > 0 || matches!(r.phase, Phase::RotatingOut | Phase::RotatingIn)
        });
        let oldest = self
            .requests
            .values()
            .filter(|r| r.has_work() && matches!(r.phase, Phase::Running | Phase::Waiting | Phase::Rotated))
            .min_by_key(|r| r.rank())
            .map(|r| r.id);
        let Some(oldest) = oldest else { return };
        if settling {
            return;
        }
        while let Some(rotated) = self.newest(ctx, Phase::Rotated) {
            self.preempt_for_recompute(ctx, rotated);
        }
        loop {
            let fit = match self.requests[&oldest].phase {
                Phase::Running => self.schedule_running(ctx, oldest, 0),
                _ => self.admit(ctx, oldest, 0),
            };
            if !matches!(fit, Fit::NoBlocks(_)) {
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
            .max_by_key(|r| r.rank())
            .map(|r| r.id)
    }
}
