//! RotaSched: SLO-aware scheduling that rotates KV caches between device and host memory
//! ahead of need. Each step:
//!
//! 1. **Budgets.** The step's predicted time bounds the bytes each direction may move
//!    (`ByteBudget`), so rotation hides behind compute; a reserve of free device blocks is kept
//!    for the arrivals expected during one rotation out (`arrival_reserve`, `keep_reserve`).
//! 2. **Order.** Least slack first — time to a request's next deadline minus the work before
//!    it (`urgency.rs`; a prompt's work is its own prefill beside the running decodes, not the
//!    whole queue's). Requests whose deadline is already lost — a prompt's, even served at once
//!    after the punctual prompts ahead of it — form a *late class*, served after every punctual
//!    one until they have starved for `late_starvation_s` (then admitted only while the running
//!    requests can still grow: a starved prompt has no deadline left to win); a rotated
//!    request that missed its return is *parked* there (that gap is late anyway), so it comes
//!    back with the blocks the punctual ones leave instead of evicting them — until its return
//!    would break its stall bound (`Slo::max_stall_s`): `STALL_RETURN_STEPS` steps before that it
//!    is punctual again, the stall deadline its deadline. Priority classes are strict (lower
//!    first): every request of a class, late and parked ones included, is served before any of
//!    a lower class.
//! 3. **Step-time cap.** A step may not outlast the earliest next-token deadline of the running
//!    decodes with no late gap left to spend (the TBT objective holds for `tbt_percentile` of a
//!    request's gaps; `tbt_late_share` of them may be late), nor the stall deadline of those
//!    with one that still meet their objectives: prefill chunks are cut to fit,
//!    with a margin for the step's overhead and for mixed steps running long (`StepTiming`),
//!    unless the prompt would miss its own first-token deadline by waiting one more step.
//! 4. **Room.** When an urgent request lacks blocks, the running requests with the most slack
//!    are evicted — rotated out within the budget, or dropped for recompute when the cost model
//!    says that is cheaper — never one just rotated in, about to finish, unable to return
//!    before its deadline, of a higher priority class than the requester, or without a late gap
//!    it may still risk (a return can fail under load), nor one that memory would not come back
//!    for within its stall bound (the running requests that end first, by their generation
//!    limits, must free the blocks it gives up: `back_within_stall_bound`); the lowest class
//!    goes first. A prompt about to miss its first token when nobody has slack for a round trip
//!    parks running decodes that have late gaps to spare and can come back within their stall
//!    bound. A request of a higher class takes the blocks of a lower class's running requests
//!    whatever their slack (lowest class and newest first; rotated out, or recomputed when a
//!    rotation does not fit).
//!    A prompt for which no running request can make room (nor ends soon enough to bring back
//!    within the stall bound the one it would push out) is admitted only while the running
//!    requests can still grow through its prefill and first token (`admission_deficit`):
//!    admitted into their blocks, it would win its first token and be pushed out at once.
//! 5. **Return.** Rotated requests come back a step before they are due, and keep the device
//!    until they have computed a token (no round trip that buys nothing).
//! 6. **Budget.** Rotations may make at most `rotation_late_gap_share` of all gaps late (a
//!    parked decode, a victim whose return failed); while that is spent, no victim is rotated
//!    out proactively and no decode is parked, so the 99th-percentile gap stays the compute's.
//!
//! Under overload it serves steps as swap does (unless a request of a higher class waits on a
//! lower class's memory, which swap's order would keep it waiting on): when the running
//! requests cannot all grow and none has slack for a round trip (or the rotation budget is
//! spent), when a request on host is due back by its stall bound and the free blocks cannot take
//! it (`return_stranded`: no victim memory brings back in time, so it would wait for the running
//! requests to end), or once a running request short of a block has pushed newer ones out
//! (`Walk::ForRequesterUnderOverload`), running requests come first, the newest is preempted on
//! shortage and those rotated out return oldest first before any admission (one behind an oldest
//! that cannot return yet comes back first where that does not delay it: `backfill.rs`), until
//! every request so pushed out is back — except that the requests that can no longer meet their
//! objectives yield to those that still can (`reactive::yields`): prompts that can still make
//! their first token are admitted first, those rotated out come back before the lost ones, on a
//! shortage the newest request already lost (no larger than the newest) is pushed out before
//! the newest of all, and one rotated out a few steps from its stall bound, with no free blocks
//! to come back to, comes back in exchange for running requests already lost (`exchange.rs`; a
//! lost request that has starved for `late_starvation_s` is served in its turn again); a
//! return, and then a new prompt, is let in only while the running requests can still grow
//! through the steps that compute its next token (`return_keeps_growth`,
//! `admission_keeps_growth`, `reactive.rs`) — one let into their blocks would push one of them,
//! or itself, out again before it computes. Left as RotaSched's own
//! rotations are (to their deadline, then parked behind new prompts), such a request stalled
//! for several times swap's longest gap.
//!
//! Layout: this file holds the policy's state (`RotaSched`, behind `SchedulingPolicy`: its
//! settings, `RotaSchedSettings`, among them) and one step's planning (`Planner`: the
//! `StepBuilder` and what was settled for the step — its predicted time,
//! the reserve, whether the rotation budget is left, the step timing), whose loop serves each
//! request in order (running, waiting, rotated); `ordering.rs` the service order and the parking
//! decisions (2), `step_cap.rs` the step-time cap (3), `eviction.rs` the one eviction walk and
//! its candidates and victims (4), `reserve.rs` the reserve (1), `backfill.rs` the overload
//! mode's returns past a blocked one, `exchange.rs` its returns before the stall bound,
//! `timeshare.rs` the overload mode's time-sharing (`RotaSchedSettings::time_share`, the default).

mod backfill;
mod eviction;
mod exchange;
mod ordering;
mod reserve;
mod step_cap;
mod timeshare;
mod urgency;

use std::collections::BTreeSet;
use std::ops::{Deref, DerefMut};

use self::urgency::Urgency;
use super::{reactive, SchedulingPolicy, StepFeedback};
use crate::arrival_rate::ArrivalEstimator;
use crate::byte_budget::ByteBudget;
use crate::config::RotaSchedSettings;
use crate::cost_model::{Direction, StepShape};
use crate::request::Phase;
use crate::stats::SchedulerStats;
use crate::step::{Fit, StepBuilder, StepCtx};
use crate::step_timing::StepTiming;

/// RotaSched's own state: its settings, the arrival-rate estimate its reserve is sized from,
/// the reserve of free device blocks it keeps this step, how steps stray from the cost model
/// (the margin of its step-time cap), and its rotation budget's count of gaps.
#[derive(Debug, Clone, Default)]
pub(crate) struct RotaSched {
    settings: RotaSchedSettings,
    arrival_rate: ArrivalEstimator,
    reserve_blocks: u32,
    timing: StepTiming,
    budget: RotationBudget,
    /// Requests the overload mode rotated out that are not back yet.
    owed: BTreeSet<u64>,
    /// How often steps come while time-sharing (`timeshare::Cadence`).
    cadence: timeshare::Cadence,
}

/// Rotations may make at most `rotation_late_gap_share` of all gaps late (a parked decode, a
/// victim whose return failed): the gaps produced, and the late ones of requests rotated out
/// since their previous token.
#[derive(Debug, Clone, Copy, Default)]
struct RotationBudget {
    gaps: u64,
    late_rotation_gaps: u64,
}

impl RotationBudget {
    /// Whether one more late gap from a rotation keeps them within `share` of every gap produced
    /// so far: parking and proactive rotation wait while it does not.
    fn left(&self, share: f64) -> bool {
        (self.late_rotation_gaps + 1) as f64 <= share * self.gaps as f64
    }
}

impl RotaSched {
    pub(crate) fn new(settings: RotaSchedSettings) -> Self {
        RotaSched { settings, ..RotaSched::default() }
    }
}

impl SchedulingPolicy for RotaSched {
    fn plan(&mut self, step: &mut StepBuilder, ctx: &mut StepCtx) {
        self.owed.retain(|id| {
            step.requests().get(id).is_some_and(|r| matches!(r.phase, Phase::Rotated | Phase::RotatingOut))
        });
        let step_s = urgency::step_estimate(step);
        self.reserve_blocks = reserve::arrival_reserve(step, &self.arrival_rate, ctx.now, step_s);
        let rotation_budget_left = self.budget.left(self.settings.rotation_late_gap_share);
        let mut planner = Planner::new(step, self.settings, step_s, self.reserve_blocks, rotation_budget_left, self.timing);
        if (!self.owed.is_empty() || planner.overloaded(ctx)) && !planner.priority_inversion() {
            // Overload: the running requests cannot all grow and none has slack for a round
            // trip, a return due by its stall bound does not fit the free blocks, or a running
            // request already pushed newer ones out for want of such a
            // victim (`Walk::ForRequesterUnderOverload`). Until every request rotated out that
            // way is back, the device is time-shared by next-token deadline (`timeshare.rs`;
            // `time_share`, the default).
            self.reserve_blocks = 0;
            if self.settings.time_share {
                drop(planner);
                timeshare::plan(step, ctx, step_s, &mut self.cadence);
                self.owed.extend(ctx.plan.rotate_out.iter().map(|t| t.request_id));
                return;
            }
            // Without it, steps are served as swap serves them — running first, the newest
            // preempted on shortage, those rotated out brought back oldest first before any
            // admission: there is no slack to plan with, and a victim left to wait behind new
            // prompts would stall for seconds. First, one due to break its stall bound is
            // exchanged for running requests already lost (`exchange.rs`).
            self.cadence.off();
            planner.exchange_for_the_lost(ctx);
            reactive::plan_with(planner.step, ctx, true, true, Some(self.settings.late_starvation_s));
            planner.return_past_the_blocked(ctx);
            self.owed.extend(ctx.plan.rotate_out.iter().map(|t| t.request_id));
            return;
        }
        self.cadence.off();
        planner.plan(ctx);
        self.owed.extend(planner.overload_victims);
    }

    fn may_strand_blocks(&self) -> bool {
        true
    }

    fn on_arrival(&mut self, now: f64, prompt_blocks: u64, alpha: f64) {
        self.arrival_rate.observe(now, prompt_blocks as f64, alpha);
    }

    fn on_results(&mut self, feedback: &StepFeedback) {
        self.cadence.on_results(feedback.alpha);
        self.budget.gaps += feedback.gaps;
        self.budget.late_rotation_gaps += feedback.late_rotation_gaps;
        if let Some(t) = feedback.timing {
            self.timing.observe(t.ratio, t.correction, t.mixed, t.measured_s, t.cycle_s, feedback.alpha);
        }
    }

    fn on_reset(&mut self) {
        // The interval learnt stays; the one running across the recovery is no step's.
        self.cadence.off();
    }

    fn stats(&self, stats: &mut SchedulerStats) {
        stats.reserve_blocks = self.reserve_blocks;
        stats.step_time_deviation = self.timing.deviation;
        stats.step_overhead_s = self.timing.overhead_s;
        stats.chunk_step_ratio = self.timing.chunk_ratio.unwrap_or(0.0);
        stats.chunk_step_deviation = self.timing.chunk_deviation.unwrap_or(0.0);
    }
}

/// One step's planning: the step being built, and what RotaSched settled for the step before
/// serving anyone. The walks of `urgency.rs`, `ordering.rs`, `step_cap.rs`, `eviction.rs` and
/// `reserve.rs` are its methods; the step builder's (requests, blocks, cost model, the
/// step-building operations) are reached through it.
pub(super) struct Planner<'a, 'b> {
    step: &'a mut StepBuilder<'b>,
    settings: RotaSchedSettings,
    /// The step's predicted time.
    step_s: f64,
    /// Free device blocks kept for arrivals this step.
    reserve_blocks: u32,
    /// Whether rotations may still make a gap late (`RotationBudget`).
    rotation_budget_left: bool,
    timing: StepTiming,
    /// The running decodes alone, as one step computes them (`urgency::decodes_alone`).
    decodes_alone: StepShape,
    /// Requests rotated out this step by the overload fallback.
    overload_victims: Vec<u64>,
}

impl<'b> Deref for Planner<'_, 'b> {
    type Target = StepBuilder<'b>;

    fn deref(&self) -> &StepBuilder<'b> {
        self.step
    }
}

impl<'b> DerefMut for Planner<'_, 'b> {
    fn deref_mut(&mut self) -> &mut StepBuilder<'b> {
        self.step
    }
}

impl<'a, 'b> Planner<'a, 'b> {
    fn new(
        step: &'a mut StepBuilder<'b>,
        settings: RotaSchedSettings,
        step_s: f64,
        reserve_blocks: u32,
        rotation_budget_left: bool,
        timing: StepTiming,
    ) -> Self {
        let decodes_alone = urgency::decodes_alone(step);
        Planner {
            step,
            settings,
            step_s,
            reserve_blocks,
            rotation_budget_left,
            timing,
            decodes_alone,
            overload_victims: Vec::new(),
        }
    }
}

impl Planner<'_, '_> {
    fn plan(&mut self, ctx: &mut StepCtx) {
        let step_s = self.step_s;
        ctx.budget = ByteBudget::new(self.cost(), step_s);
        let mut order = self.service_order(ctx);
        if self.blocks_short_for_running() {
            // Running requests come first for blocks when they cannot all grow: otherwise
            // returning and new requests take each block a rotation out frees, and the running
            // ones, all stuck at a block boundary, never compute.
            order.sort_by_key(|u| self.requests()[&u.id].phase != Phase::Running);
        }
        // Priority classes are strict: every request of a class is served before any of a
        // lower one, its late and parked requests included (the sort is stable, so each class
        // keeps the order above).
        order.sort_by_key(|u| u.priority);
        let decodes = order.iter().filter(|u| self.is_running_decode(u.id)).count() as u32;
        ctx.decode_reserve = decodes.min(ctx.tokens_left);
        let deadline = self.decode_deadline(&order, ctx.now);
        let mut admissions_blocked = false;
        for urgency in &order {
            match self.requests().get(&urgency.id).map(|r| r.phase) {
                Some(Phase::Running) => {
                    if self.is_running_decode(urgency.id) {
                        ctx.decode_reserve = ctx.decode_reserve.saturating_sub(1);
                    } else {
                        ctx.prefill_token_cap = self.prefill_token_cap(ctx, urgency, deadline.as_ref());
                    }
                    self.serve_running(ctx, urgency);
                }
                Some(Phase::Waiting) if !admissions_blocked => {
                    ctx.prefill_token_cap = self.prefill_token_cap(ctx, urgency, deadline.as_ref());
                    // A punctual request that does not fit keeps the blocks being freed for
                    // itself: less urgent admissions may not take them first.
                    admissions_blocked = !self.serve_waiting(ctx, urgency) && !urgency.deferred_class();
                }
                Some(Phase::Rotated) => {
                    // A due request left on host keeps the blocks being freed for itself, as a
                    // punctual admission does: under overload, admitting newer requests in
                    // its place only pushes other running requests out to make room for it.
                    let stranded = !self.serve_rotated(ctx, urgency, false);
                    admissions_blocked |= stranded && !urgency.deferred_class();
                }
                _ => {}
            }
        }
        ctx.prefill_token_cap = u32::MAX;
        if !admissions_blocked {
            // Early returns only take what the urgent ones left.
            for urgency in &order {
                if self.requests().get(&urgency.id).is_some_and(|r| r.phase == Phase::Rotated) {
                    self.serve_rotated(ctx, urgency, true);
                }
            }
        }
        self.keep_reserve(ctx);
    }

    /// A first token starved (`Planner::starved`): served with the punctual ones.
    fn starving_prompt(&self, now: f64, id: u64) -> bool {
        let r = &self.requests()[&id];
        r.last_token_at.is_none() && self.starved(r, now)
    }

    fn is_running_decode(&self, id: u64) -> bool {
        let r = &self.requests()[&id];
        r.phase == Phase::Running && r.is_decode()
    }

    fn serve_running(&mut self, ctx: &mut StepCtx, urgency: &Urgency) {
        loop {
            let Fit::NoBlocks(short) = self.schedule_running(ctx, urgency.id, 0) else { return };
            if !self.make_room(ctx, short, urgency) {
                return;
            }
        }
    }

    /// False when the request did not fit in memory.
    fn serve_waiting(&mut self, ctx: &mut StepCtx, urgency: &Urgency) -> bool {
        if ctx.plan.preempted_for_recompute.contains(&urgency.id) {
            return true;
        }
        // A prompt served only because it starved has no deadline left to win: admitted into
        // the blocks the running requests need, it would push one of them out and stall it for
        // seconds. It waits, first in line, for blocks to free.
        let deficit = reactive::admission_deficit(self.step, urgency.id);
        if deficit > 0 && self.starving_prompt(ctx.now, urgency.id) {
            return false;
        }
        // Likewise a prompt for which no running request can make room (`can_make_room`: none
        // ends soon enough to bring back in time whoever the prompt pushes out, none with slack
        // for a round trip or free to park that memory comes back for within its stall bound,
        // none of a lower class): admitted into the blocks the running requests grow into, it
        // wins its first token and is pushed out — or pushes a decode out — for seconds.
        if deficit > 0 && !self.can_make_room(ctx, urgency.id, deficit) {
            return false;
        }
        loop {
            match self.admit(ctx, urgency.id, 0) {
                Fit::NoBlocks(short) => {
                    if !self.make_room(ctx, short, urgency) {
                        return false;
                    }
                }
                _ => return true,
            }
        }
    }

    /// Issues the rotation in a step ahead of the deadline or, on the `early` pass, when blocks
    /// are plentiful. False when it was due but could not be issued.
    fn serve_rotated(&mut self, ctx: &mut StepCtx, urgency: &Urgency, early: bool) -> bool {
        let (step_s, reserve_blocks) = (self.step_s, self.reserve_blocks);
        let id = urgency.id;
        let need = self.blocks().host_slots(id);
        let due = urgency.slack <= step_s;
        let plentiful = self.blocks().free_device() >= need + reserve_blocks;
        if !(if early { plentiful } else { due }) {
            return true;
        }
        let bytes = u64::from(need) * self.config().block_bytes;
        let budget = &ctx.budget;
        // A request larger than a whole step's budget may still go alone when it is due (or
        // it could never return) or when the step computes nothing (the link is idle anyway).
        let alone = budget.used(Direction::In) == 0;
        let idle = ctx.plan.scheduled.is_empty();
        if !(budget.fits(Direction::In, bytes) || ((due || idle) && alone)) {
            return !due;
        }
        let free = self.blocks().free_device();
        if free < need && due {
            self.make_room(ctx, u64::from(need - free), urgency);
        }
        (self.blocks().free_device() >= need && self.rotate_in(ctx, id)) || !due
    }
}
