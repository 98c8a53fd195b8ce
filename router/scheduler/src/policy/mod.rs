//! The scheduling policies, each behind one seam (`SchedulingPolicy`: plan, on arrival, on
//! results, stats). Each fills a `StepCtx` through the shared step machinery (`step.rs`) and
//! keeps its own state to itself; they differ only in order and in what they do when blocks
//! run out:
//!
//! - `fcfs`: worst-case reservation at admission, head-of-line, never preempts.
//! - `reactive`: blocks on demand; on shortage the newest running request is preempted —
//!   recomputed later (`recompute`) or rotated out to host and brought back (`swap`).
//! - `rotasched`: least slack first with a late class, proactive rotation under a per-step
//!   byte budget, rotate out or recompute by the cost model (`urgency` computes slack). Its
//!   state — arrival estimate, reserve, step timing, rotation budget — is its own.

mod fcfs;
mod reactive;
mod rotasched;

use crate::config::{PolicyKind, SchedulerConfig};
use crate::plan::StepPlan;
use crate::request::Phase;
use crate::scheduler::Core;
use crate::stats::SchedulerStats;
use crate::step::{Fit, StepBuilder, StepCtx};

pub(crate) use rotasched::RotaSched;

/// What one step's results told the scheduler, handed to the policy after the core applied them.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct StepFeedback {
    /// The step's measured time against the cost model's prediction (None when the shard
    /// reported no time).
    pub(crate) timing: Option<TimingSample>,
    /// Gaps between tokens the step produced (every token after a request's first).
    pub(crate) gaps: u64,
    /// Of those, the late ones of requests rotated out since their previous token.
    pub(crate) late_rotation_gaps: u64,
    /// The scheduler's smoothing factor for online estimates (`SchedulerConfig::ema_alpha`).
    pub(crate) alpha: f64,
}

/// One measured step, as `StepTiming::observe` takes it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TimingSample {
    /// Measured over uncorrected predicted time.
    pub(crate) ratio: f64,
    /// The cost model's correction before this step.
    pub(crate) correction: f64,
    /// A prefill chunk beside decodes.
    pub(crate) mixed: bool,
    pub(crate) measured_s: f64,
    /// Plan to results, when no other step was in flight.
    pub(crate) cycle_s: Option<f64>,
}

/// The seam between the scheduler's shared machinery and a scheduling policy. The `Core`
/// owns requests, blocks, queue, cost model and counters and applies results; a policy owns
/// its own state and, each step, fills a `StepCtx` through the narrow `StepBuilder`
/// (`step.rs`: read access to requests, blocks, cost model and configuration; the orders
/// `running_by_rank`, `waiting_by_priority`; and `schedule_running`, `admit`, `rotate_out`,
/// `rotate_in`, `preempt_for_recompute`). It never reaches the `Core` itself.
pub(crate) trait SchedulingPolicy: std::fmt::Debug + Send {
    /// Fills `ctx` with the next step: what to compute, what to move, whom to preempt.
    fn plan(&mut self, step: &mut StepBuilder, ctx: &mut StepCtx);

    /// Whether its plans can leave blocks held with nobody able to move (rotated requests keep
    /// their shared prefix blocks on device), so an empty plan is checked for a deadlock.
    fn may_strand_blocks(&self) -> bool {
        false
    }

    /// A request arrived with a prompt of `prompt_blocks` blocks.
    fn on_arrival(&mut self, _now: f64, _prompt_blocks: u64, _alpha: f64) {}

    /// A step's results were applied.
    fn on_results(&mut self, _feedback: &StepFeedback) {}

    /// Every request was dropped (the shard restarted empty): the steps in flight never report.
    fn on_reset(&mut self) {}

    /// Fills in the policy's own figures of the /metrics snapshot.
    fn stats(&self, _stats: &mut SchedulerStats) {}
}

/// fcfs (`fcfs.rs`).
#[derive(Debug)]
struct Fcfs;

impl SchedulingPolicy for Fcfs {
    fn plan(&mut self, step: &mut StepBuilder, ctx: &mut StepCtx) {
        fcfs::plan(step, ctx);
    }
}

/// recompute and swap (`reactive.rs`): preempts the newest running request on shortage, rotated
/// out to host and back when `swap`, else recomputed later.
#[derive(Debug)]
struct Reactive {
    swap: bool,
}

impl SchedulingPolicy for Reactive {
    fn plan(&mut self, step: &mut StepBuilder, ctx: &mut StepCtx) {
        reactive::plan(step, ctx, self.swap, false);
    }

    fn may_strand_blocks(&self) -> bool {
        self.swap
    }
}

/// The policy a scheduler runs, behind the seam.
#[derive(Debug)]
pub(crate) struct Policy(Box<dyn SchedulingPolicy>);

impl Policy {
    pub(crate) fn new(config: &SchedulerConfig) -> Self {
        Policy(match config.policy {
            PolicyKind::Fcfs => Box::new(Fcfs),
            PolicyKind::Recompute => Box::new(Reactive { swap: false }),
            PolicyKind::Swap => Box::new(Reactive { swap: true }),
            PolicyKind::RotaSched => Box::new(RotaSched::new(config.rotasched)),
        })
    }

    /// Decides the next step: what to compute, what to move, whom to preempt. Requests whose
    /// transfer in has not been acknowledged are never scheduled; blocks whose transfer out has not
    /// been acknowledged are never handed out.
    pub(crate) fn plan(&mut self, core: &mut Core, now: f64) -> StepPlan {
        let mut ctx = core.new_ctx(now);
        let mut step = StepBuilder::new(core);
        self.0.plan(&mut step, &mut ctx);
        if self.0.may_strand_blocks() {
            break_deadlock(&mut step, &mut ctx);
        }
        let plan = core.seal(ctx);
        core.debug_check("plan");
        plan
    }

    pub(crate) fn on_arrival(&mut self, now: f64, prompt_blocks: u64, alpha: f64) {
        self.0.on_arrival(now, prompt_blocks, alpha);
    }

    pub(crate) fn on_results(&mut self, feedback: &StepFeedback) {
        self.0.on_results(feedback);
    }

    pub(crate) fn on_reset(&mut self) {
        self.0.on_reset();
    }

    /// The core's snapshot with the policy's own figures filled in.
    pub(crate) fn stats(&self, core: &Core) -> SchedulerStats {
        let mut stats = core.stats();
        self.0.stats(&mut stats);
        stats
    }
}

/// Guarantees progress when a plan would do nothing although requests wait: rotated
/// requests keep their shared prefix blocks on device, and RotaSched refuses victims that
/// could not return on time, so blocks can end up held with nobody able to move. With no
/// transfer or step result still to come, rotated requests are dropped for recompute
/// (newest first) and then the oldest request with work is served, evicting the newest
/// running ones for recompute as vLLM does (oldest and newest by priority class first). The
/// oldest thus always progresses, and it fits the device pool alone, so nothing livelocks.
fn break_deadlock(step: &mut StepBuilder, ctx: &mut StepCtx) {
    if !ctx.plan.is_empty() {
        return;
    }
    let settling = step.requests().values().any(|r| {
        r.pending_steps > 0 || matches!(r.phase, Phase::RotatingOut | Phase::RotatingIn)
    });
    let oldest = step
        .requests()
        .values()
        .filter(|r| r.has_work() && matches!(r.phase, Phase::Running | Phase::Waiting | Phase::Rotated))
        .min_by_key(|r| r.rank())
        .map(|r| r.id);
    let Some(oldest) = oldest else { return };
    if settling {
        return;
    }
    while let Some(rotated) = newest(step, ctx, Phase::Rotated) {
        step.preempt_for_recompute(ctx, rotated);
    }
    loop {
        let fit = match step.requests()[&oldest].phase {
            Phase::Running => step.schedule_running(ctx, oldest, 0),
            _ => step.admit(ctx, oldest, 0),
        };
        if !matches!(fit, Fit::NoBlocks(_)) {
            return;
        }
        match newest(step, ctx, Phase::Running).filter(|id| *id != oldest) {
            Some(victim) => {
                step.preempt_for_recompute(ctx, victim);
            }
            None => return,
        }
    }
}

fn newest(step: &StepBuilder, ctx: &StepCtx, phase: Phase) -> Option<u64> {
    step.requests()
        .values()
        .filter(|r| r.phase == phase && !r.doomed)
        .filter(|r| phase != Phase::Running || (r.has_work() && step.evictable(ctx, r.id)))
        .max_by_key(|r| r.rank())
        .map(|r| r.id)
}

#[cfg(test)]
mod tests {
    /// The policies build steps through `StepBuilder` only: none names the scheduler's `Core`
    /// or adds methods to it, so what a policy may do to a step is what the builder offers.
    #[test]
    fn policies_reach_the_scheduler_only_through_the_step_builder() {
        let sources = [
            ("fcfs.rs", include_str!("fcfs.rs")),
            ("reactive.rs", include_str!("reactive.rs")),
            ("rotasched/mod.rs", include_str!("rotasched/mod.rs")),
            ("rotasched/eviction.rs", include_str!("rotasched/eviction.rs")),
            ("rotasched/ordering.rs", include_str!("rotasched/ordering.rs")),
            ("rotasched/reserve.rs", include_str!("rotasched/reserve.rs")),
            ("rotasched/step_cap.rs", include_str!("rotasched/step_cap.rs")),
            ("rotasched/timeshare.rs", include_str!("rotasched/timeshare.rs")),
            ("rotasched/urgency.rs", include_str!("rotasched/urgency.rs")),
        ];
        for (name, source) in sources {
            let code: String = source
                .lines()
                .filter(|l| !l.trim_start().starts_with("//"))
                .collect::<Vec<_>>()
                .join("\n");
            let code = code.split("#[cfg(test)]").next().unwrap_or_default();
            for forbidden in ["scheduler::Core", "impl Core", "&mut Core", "&Core"] {
                assert!(!code.contains(forbidden), "{name} reaches the Core ({forbidden})");
            }
        }
    }
}
