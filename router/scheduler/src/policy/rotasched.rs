//! RotaSched: SLO-aware scheduling that rotates KV caches between device and host memory
//! ahead of need. Each step:
//!
//! 1. **Budgets.** The step's predicted time bounds the bytes each direction may move
//!    (`ByteBudget`), so rotation hides behind compute; a reserve of free device blocks is kept
//!    for the arrivals expected during one swap-out (`arrival_reserve`, `keep_reserve`).
//! 2. **Order.** Least slack first — time to a request's next deadline minus the work before
//!    it (`urgency.rs`). Requests whose deadline is already lost form a *late class*, served
//!    after every punctual one until they have starved for `late_starvation_s`; a rotated
//!    request that missed its return is *parked* there (that gap is late anyway), so it comes
//!    back with the blocks the punctual ones leave instead of evicting them.
//! 3. **Step-time cap.** A step may not outlast the earliest next-token deadline of the running
//!    decodes with no late gap left to spend (the TBT objective holds for `tbt_percentile` of a
//!    request's gaps; `tbt_late_share` of them may be late): prefill chunks are cut to fit,
//!    unless the prompt would miss its own first-token deadline by waiting one more step.
//! 4. **Room.** When an urgent request lacks blocks, the running requests with the most slack
//!    are evicted — rotated out within the budget, or dropped for recompute when the cost model
//!    says that is cheaper — never one just rotated in, about to finish, unable to return
//!    before its deadline, or without a late gap it may still risk (a return can fail under
//!    load). A prompt about to miss its first token when nobody has slack for a round trip
//!    parks running decodes that have late gaps to spare.
//! 5. **Return.** Rotated requests come back a step before they are due.
//!
//! Under overload (no running request has slack left) it degrades to the reactive order:
//! running requests first for blocks, evicting newer ones, so the oldest always progresses.

use super::urgency::{Eviction, Urgency};
use crate::arrivals::ArrivalEstimator;
use crate::byte_budget::ByteBudget;
use crate::cost_model::{Direction, StepShape};
use crate::request::Phase;
use crate::scheduler::Core;
use crate::step::{Outcome, StepCtx};

/// The running decodes' side of the step-time cap.
struct DecodeDeadline {
    /// Earliest next-token deadline among the decodes that cannot spend a late gap.
    at: f64,
    /// Every running decode: (id, positions it attends this step).
    decodes: Vec<(u64, u64)>,
}

impl DecodeDeadline {
    /// The step of the given decodes alone.
    fn shape<'a>(decodes: impl Iterator<Item = &'a (u64, u64)>) -> StepShape {
        decodes.fold(StepShape::default(), |mut shape, (_, context)| {
            shape.decode_requests += 1;
            shape.context_tokens += context;
            shape
        })
    }
}

struct Victim {
    id: u64,
    slack: f64,
    eviction: Eviction,
}

/// How a request leaves the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Evict {
    /// Swapped out to host (within this step's byte budget); its blocks free when the copy ends.
    RotateOut,
    /// Dropped and recomputed later; its blocks free at once.
    Recompute,
}

impl From<Eviction> for Evict {
    fn from(eviction: Eviction) -> Self {
        match eviction {
            Eviction::Swap { .. } => Evict::RotateOut,
            Eviction::Recompute { .. } => Evict::Recompute,
        }
    }
}

/// One walk over eviction candidates: each leaves as the cost model says, except as the walk's
/// rule overrides, until enough blocks are free or on their way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Walk {
    /// For a requester: a swap-out that does not fit this step's byte budget is skipped, and the
    /// requester claims what is freed (only the excess is credited to later ones).
    ForRequester,
    /// Under overload, for a running requester: a swap-out that does not fit, or is not worth a
    /// round trip, becomes a recompute, so the oldest request always progresses.
    ForRequesterUnderOverload,
    /// The proactive reserve: swap-outs only (a recompute loses work for no one in particular),
    /// all of them credited as free-to-be.
    Reserve,
}

/// RotaSched's own state: the arrival-rate estimate its reserve is sized from, and the
/// reserve of free device blocks it keeps this step.
#[derive(Debug, Clone, Default)]
pub(crate) struct RotaSched {
    arrivals: ArrivalEstimator,
    reserve_blocks: u32,
}

impl RotaSched {
    pub(crate) fn observe_arrival(&mut self, now: f64, prompt_blocks: u64, alpha: f64) {
        self.arrivals.observe(now, prompt_blocks as f64, alpha);
    }

    pub(crate) fn reserve_blocks(&self) -> u32 {
        self.reserve_blocks
    }

    pub(crate) fn plan(&mut self, core: &mut Core, ctx: &mut StepCtx) {
        let step_s = core.step_estimate();
        self.reserve_blocks = core.arrival_reserve(&self.arrivals, ctx.now, step_s);
        core.plan_rotasched(ctx, step_s, self.reserve_blocks);
    }
}

impl Core {
    fn plan_rotasched(&mut self, ctx: &mut StepCtx, step_s: f64, reserve_blocks: u32) {
        ctx.budget = ByteBudget::new(&self.cost, step_s);
        let mut order = self.service_order(ctx, step_s);
        if self.blocks_short_for_running() {
            // Running requests come first for blocks when they cannot all grow: otherwise
            // returning and new requests take each block a swap-out frees, and the running
            // ones, all stuck at a block boundary, never compute.
            order.sort_by_key(|u| self.requests[&u.id].phase != Phase::Running);
        }
        let decodes = order.iter().filter(|u| self.is_running_decode(u.id)).count() as u32;
        ctx.decode_reserve = decodes.min(ctx.tokens_left);
        let deadline = self.decode_deadline(&order);
        let mut admissions_blocked = false;
        for urgency in &order {
            match self.requests.get(&urgency.id).map(|r| r.phase) {
                Some(Phase::Running) => {
                    if self.is_running_decode(urgency.id) {
                        ctx.decode_reserve = ctx.decode_reserve.saturating_sub(1);
                    } else {
                        ctx.prefill_token_cap = self.prefill_token_cap(ctx, urgency, deadline.as_ref());
                    }
                    self.serve_running(ctx, urgency, step_s);
                }
                Some(Phase::Waiting) if !admissions_blocked => {
                    ctx.prefill_token_cap = self.prefill_token_cap(ctx, urgency, deadline.as_ref());
                    // A punctual request that does not fit keeps the blocks being freed for
                    // itself: less urgent admissions may not take them first.
                    admissions_blocked = !self.serve_waiting(ctx, urgency, step_s) && !urgency.deferred_class();
                }
                Some(Phase::Rotated) => {
                    // A due request left on host keeps the blocks being freed for itself, as a
                    // punctual admission does: under overload, admitting newer requests in
                    // its place only pushes other running requests out to make room for it.
                    let stranded = !self.serve_rotated(ctx, urgency, step_s, false, reserve_blocks);
                    admissions_blocked |= stranded && !urgency.deferred_class();
                }
                _ => {}
            }
        }
        ctx.prefill_token_cap = u32::MAX;
        if !admissions_blocked {
            // Early returns only take what the urgent ones left.
            for urgency in &order {
                if self.requests.get(&urgency.id).is_some_and(|r| r.phase == Phase::Rotated) {
                    self.serve_rotated(ctx, urgency, step_s, true, reserve_blocks);
                }
            }
        }
        self.keep_reserve(ctx, step_s, reserve_blocks);
    }

    /// Deadline of the step: the earliest next-token deadline of the running decodes that
    /// cannot spend a late gap (None when every decode can, or nothing decodes).
    fn decode_deadline(&self, order: &[Urgency]) -> Option<DecodeDeadline> {
        let mut at: Option<f64> = None;
        let mut decodes = Vec::new();
        for urgency in order.iter().filter(|u| self.is_running_decode(u.id)) {
            let r = &self.requests[&urgency.id];
            decodes.push((urgency.id, u64::from(r.num_computed) + 1));
            if r.late_gaps_left(self.config.tbt_late_share()) == 0 {
                at = Some(at.map_or(r.next_deadline(), |t| t.min(r.next_deadline())));
            }
        }
        at.map(|at| DecodeDeadline { at, decodes })
    }

    /// Prefill tokens the next chunk of `urgency` may take so that the step, with every
    /// running decode and the chunks placed so far, ends by the decodes' earliest deadline.
    /// No cap when nothing decodes, or for a punctual request that would miss its first-token
    /// deadline by waiting out one more step of decodes alone.
    fn prefill_token_cap(&self, ctx: &StepCtx, urgency: &Urgency, deadline: Option<&DecodeDeadline>) -> u32 {
        let Some(deadline) = deadline else { return u32::MAX };
        let decodes_alone = DecodeDeadline::shape(deadline.decodes.iter());
        if !urgency.late && urgency.slack < self.cost.predict_step(decodes_alone) {
            return u32::MAX;
        }
        // What is placed so far, plus the decodes still to be placed.
        let unplaced = DecodeDeadline::shape(deadline.decodes.iter().filter(|(id, _)| !ctx.scheduled.contains(id)));
        let committed = StepShape {
            prefill_tokens: ctx.shape.prefill_tokens,
            decode_requests: ctx.shape.decode_requests + unplaced.decode_requests,
            context_tokens: ctx.shape.context_tokens + unplaced.context_tokens,
        };
        let left = deadline.at - ctx.now - self.cost.predict_step(committed);
        let computed = u64::from(self.requests[&urgency.id].num_computed);
        // A chunk of c tokens adds c prefill tokens and (computed + c) attended positions.
        let scale = self.cost.correction;
        let per_token = (self.cost.per_prefill_token_s + self.cost.per_context_token_s) * scale;
        let fixed = self.cost.per_context_token_s * scale * computed as f64;
        if left <= fixed {
            return 0;
        }
        if per_token <= 0.0 {
            return u32::MAX;
        }
        ((left - fixed) / per_token).floor().min(f64::from(u32::MAX)) as u32
    }

    /// Whether the running requests need more new blocks for their next tokens than are free.
    fn blocks_short_for_running(&self) -> bool {
        let needed: u64 = self
            .running_by_seq()
            .into_iter()
            .filter_map(|id| {
                let r = &self.requests[&id];
                let next = u64::from(r.num_computed) + u64::from(r.uncomputed().min(1));
                r.has_work().then(|| self.blocks.new_blocks_needed(id, next))
            })
            .sum();
        needed > u64::from(self.blocks.free_device())
    }

    /// Urgency order, except that running requests with slack to spare for a round trip (the
    /// possible victims) come after the other punctual ones: the requests that cannot wait
    /// claim memory first, and the ones that can are served with what is left — or rotated out
    /// to make room. While a prompt is about to miss its first token, decodes that may park
    /// (see `parking_candidates`) wait behind it the same way. The late and parked classes
    /// still come last, so a hopeless request never takes the blocks a punctual one needs.
    fn service_order(&self, ctx: &StepCtx, step_s: f64) -> Vec<Urgency> {
        let (late, punctual): (Vec<Urgency>, Vec<Urgency>) =
            self.urgency_order(ctx.now, step_s).into_iter().partition(|u| u.deferred_class());
        let mut spare: std::collections::BTreeSet<u64> =
            self.rotation_victims(ctx, u64::MAX, step_s).iter().map(|v| v.id).collect();
        if punctual.iter().any(|u| self.needs_parking(u, step_s)) {
            spare.extend(self.parking_candidates(ctx, u64::MAX));
        }
        let (deferred, urgent): (Vec<Urgency>, Vec<Urgency>) =
            punctual.into_iter().partition(|u| spare.contains(&u.id));
        urgent.into_iter().chain(deferred).chain(late).collect()
    }

    /// A waiting prompt close enough to its first-token deadline that waiting for blocks to
    /// free up would miss it.
    fn needs_parking(&self, urgency: &Urgency, step_s: f64) -> bool {
        let waiting = self.requests.get(&urgency.id).is_some_and(|r| r.phase == Phase::Waiting);
        waiting && !urgency.deferred_class() && urgency.slack < 2.0 * step_s
    }

    fn is_running_decode(&self, id: u64) -> bool {
        let r = &self.requests[&id];
        r.phase == Phase::Running && r.is_decode()
    }

    fn serve_running(&mut self, ctx: &mut StepCtx, urgency: &Urgency, step_s: f64) {
        loop {
            let Outcome::NoBlocks(short) = self.schedule_running(ctx, urgency.id, 0) else { return };
            if !self.make_room(ctx, short, urgency, step_s) {
                return;
            }
        }
    }

    /// False when the request did not fit in memory.
    fn serve_waiting(&mut self, ctx: &mut StepCtx, urgency: &Urgency, step_s: f64) -> bool {
        if ctx.plan.preempted_for_recompute.contains(&urgency.id) {
            return true;
        }
        loop {
            match self.admit(ctx, urgency.id, 0) {
                Outcome::NoBlocks(short) => {
                    if !self.make_room(ctx, short, urgency, step_s) {
                        return false;
                    }
                }
                _ => return true,
            }
        }
    }

    /// Issues the swap-in a step ahead of the deadline or, on the `early` pass, when blocks
    /// are plentiful. False when it was due but could not be issued.
    fn serve_rotated(&mut self, ctx: &mut StepCtx, urgency: &Urgency, step_s: f64, early: bool, reserve_blocks: u32) -> bool {
        let id = urgency.id;
        let need = self.blocks.host_slots(id);
        let due = urgency.slack <= step_s;
        let plentiful = self.blocks.free_device() >= need + reserve_blocks;
        if !(if early { plentiful } else { due }) {
            return true;
        }
        let bytes = u64::from(need) * self.config.block_bytes;
        let budget = &ctx.budget;
        // A request larger than a whole step's budget may still go alone when it is due (or
        // it could never return) or when the step computes nothing (the link is idle anyway).
        let alone = budget.used(Direction::In) == 0;
        let idle = ctx.plan.scheduled.is_empty();
        if !(budget.fits(Direction::In, bytes) || ((due || idle) && alone)) {
            return !due;
        }
        let free = self.blocks.free_device();
        if free < need && due {
            self.make_room(ctx, u64::from(need - free), urgency, step_s);
        }
        (self.blocks.free_device() >= need && self.rotate_in(ctx, id)) || !due
    }

    /// Evicts the running requests with the most slack until `short` blocks are free or on
    /// their way. True when blocks were freed right away (worth retrying now).
    fn make_room(&mut self, ctx: &mut StepCtx, short: u64, requester: &Urgency, step_s: f64) -> bool {
        if requester.deferred_class() {
            return false;
        }
        let credit = ctx.release_credit.min(short);
        ctx.release_credit -= credit;
        let short = short - credit;
        let victims = self.rotation_victims(ctx, requester.id, step_s);
        let planned = victims.into_iter().map(|v| (v.id, Some(v.eviction)));
        let (mut freed_now, mut short) = self.evict_until(ctx, short, planned, Walk::ForRequester, step_s);
        if short > 0 && self.needs_parking(requester, step_s) {
            // No running request has slack for a round trip: park decodes with late gaps to
            // spend (see `parking_candidates`).
            let parked = self.parking_candidates(ctx, requester.id).into_iter().map(|id| (id, None));
            let (freed, left) = self.evict_until(ctx, short, parked, Walk::ForRequester, step_s);
            freed_now |= freed;
            short = left;
        }
        let running = self.requests.get(&requester.id).is_some_and(|r| r.phase == Phase::Running);
        if short > 0 && running {
            let newer = self.newer_candidates(ctx, requester.id).into_iter().map(|id| (id, None));
            freed_now |= self.evict_until(ctx, short, newer, Walk::ForRequesterUnderOverload, step_s).0;
        }
        freed_now
    }

    /// Walks `candidates` in order, evicting each as `walk` says, until `short` blocks are free
    /// or on their way. A candidate's eviction is the one planned with it, or (None) the cheaper
    /// one when its turn comes: the host's room shrinks as the walk swaps others out. Returns
    /// whether blocks were freed right away and how many are still short.
    fn evict_until(
        &mut self,
        ctx: &mut StepCtx,
        mut short: u64,
        candidates: impl IntoIterator<Item = (u64, Option<Eviction>)>,
        walk: Walk,
        step_s: f64,
    ) -> (bool, u64) {
        let mut freed_now = false;
        for (id, planned) in candidates {
            if short == 0 {
                break;
            }
            let eviction = planned.unwrap_or_else(|| self.cheaper_eviction(id, step_s));
            let how = match (walk, Evict::from(eviction)) {
                (Walk::Reserve, Evict::Recompute) => continue,
                (Walk::ForRequesterUnderOverload, Evict::RotateOut) if !self.swap_fits_now(ctx, id) => Evict::Recompute,
                (_, how) => how,
            };
            let claimed = if walk == Walk::Reserve { 0 } else { short };
            if let Some((freed, now)) = self.evict(ctx, id, how, claimed) {
                freed_now |= now;
                short = short.saturating_sub(freed);
            }
        }
        (freed_now, short)
    }

    /// Evicts `id` the given way: a swap-out within this step's byte budget, or a recompute
    /// preemption. Of the blocks a swap-out frees when its copy ends, `claimed` are the
    /// requester's and the rest are credited to later requesters this step. Returns the blocks
    /// freed or on their way and whether they are free right away; None when the swap-out does
    /// not fit the budget.
    fn evict(&mut self, ctx: &mut StepCtx, id: u64, how: Evict, claimed: u64) -> Option<(u64, bool)> {
        match how {
            Evict::Recompute => {
                let freed = self.preempt_for_recompute(ctx, id);
                Some((freed, freed > 0))
            }
            Evict::RotateOut => {
                let bytes = u64::from(self.blocks.private_device_blocks(id)) * self.config.block_bytes;
                if !ctx.budget.fits(Direction::Out, bytes) {
                    return None;
                }
                let moved = self.rotate_out(ctx, id);
                ctx.release_credit += moved.saturating_sub(claimed);
                Some((moved, false))
            }
        }
    }

    /// Under overload every running request is late, so none has slack for a round trip and
    /// the walks above find no victim. Without a fallback, a running request that needs one
    /// more block waits until someone finishes while its blocks sit idle: steps shrink to the
    /// few requests that still fit, and the run crawls. The requests admitted after the
    /// requester are evicted instead, newest first, as the reactive policies do: the order is
    /// total and stable, so the oldest always progresses and two requests never evict each
    /// other in turn. Only running requests may do this: a rotated one returning by evicting a
    /// newer one would push that one out in turn, a wave of copies every step.
    fn newer_candidates(&self, ctx: &StepCtx, requester: u64) -> Vec<u64> {
        let Some(requester_seq) = self.requests.get(&requester).map(|r| r.seq) else { return Vec::new() };
        let candidates = self.eviction_candidates(ctx, requester);
        candidates.into_iter().rev().filter(|id| self.requests[id].seq > requester_seq).collect()
    }

    /// Running requests that could leave the device now: not the requester, not in this step,
    /// holding private blocks, and not swapped in within the cool-down (no thrashing).
    fn eviction_candidates(&self, ctx: &StepCtx, requester: u64) -> Vec<u64> {
        let cooldown = self.config.rotation_cooldown_steps;
        let recent = |id: &u64| self.requests[id].swapped_in_step.is_some_and(|s| s + cooldown > self.step_id);
        self.running_by_seq()
            .into_iter()
            .filter(|id| *id != requester && self.evictable(ctx, *id))
            .filter(|id| self.blocks.private_device_blocks(*id) > 0 && !recent(id))
            .collect()
    }

    /// Decodes that may be parked on host, best first, for a prompt about to miss its
    /// first-token deadline when no running request has slack for a round trip: eviction
    /// candidates with tokens left and with two late gaps or more to spare (one for the
    /// parking, one for the unforeseen) — most to spare first, then newest. Their next gap will
    /// be late (the objective holds for a percentile of gaps); they come back, parked, with the
    /// blocks punctual requests leave.
    fn parking_candidates(&self, ctx: &StepCtx, requester: u64) -> Vec<u64> {
        let share = self.config.tbt_late_share();
        let mut candidates: Vec<(u32, u64, u64)> = self
            .eviction_candidates(ctx, requester)
            .into_iter()
            .filter(|id| self.is_running_decode(*id))
            .filter_map(|id| {
                let r = &self.requests[&id];
                let spare = r.late_gaps_left(share);
                let worth = r.tokens_left() >= self.config.min_rotation_tokens_left;
                (spare > 1 && worth).then_some((spare, r.seq, id))
            })
            .collect();
        candidates.sort_by(|a, b| b.0.cmp(&a.0).then(b.1.cmp(&a.1)));
        candidates.into_iter().map(|(_, _, id)| id).collect()
    }

    /// A swap-out keeps the rotation limits: it fits this step's byte budget and the request
    /// has enough tokens left to be worth the round trip. Otherwise it is recomputed.
    fn swap_fits_now(&self, ctx: &StepCtx, id: u64) -> bool {
        let bytes = u64::from(self.blocks.private_device_blocks(id)) * self.config.block_bytes;
        let worth = self.requests[&id].tokens_left() >= self.config.min_rotation_tokens_left;
        worth && ctx.budget.fits(Direction::Out, bytes)
    }

    /// Eviction candidates that may be rotated out now, most slack first: with enough tokens
    /// left to be worth the round trip, able to risk a late gap should the return fail, and
    /// with more slack than the round trip takes (so they return on time).
    fn rotation_victims(&self, ctx: &StepCtx, requester: u64, step_s: f64) -> Vec<Victim> {
        let mut victims: Vec<Victim> = self
            .eviction_candidates(ctx, requester)
            .into_iter()
            .filter_map(|id| {
                let r = &self.requests[&id];
                let eviction = self.cheaper_eviction(id, step_s);
                let round_trip = eviction.round_trip_s();
                let worth = r.tokens_left() >= self.config.min_rotation_tokens_left
                    && f64::from(r.tokens_left()) * step_s >= round_trip
                    && r.may_risk_a_late_gap(self.config.tbt_late_share());
                let slack = self.urgency(id, ctx.now, step_s).slack;
                (worth && slack > round_trip).then_some(Victim { id, slack, eviction })
            })
            .collect();
        victims.sort_by(|a, b| b.slack.total_cmp(&a.slack).then(b.id.cmp(&a.id)));
        victims
    }

    /// Free blocks to keep for arrivals expected during one swap-out latency.
    fn arrival_reserve(&self, arrivals: &ArrivalEstimator, now: f64, step_s: f64) -> u32 {
        if self.blocks.free_host() == 0 {
            return 0;
        }
        let latency = 2.0 * step_s + self.cost.transfer_overhead_s;
        let expected = arrivals.expected_blocks(now, latency).ceil();
        let cap = self.config.num_device_blocks / 4;
        (expected as u32).min(cap)
    }

    /// Proactive rotation: when free blocks (plus those already on their way) fall below the
    /// reserve, swap out requests with slack to spare so arrivals start prefill at once.
    fn keep_reserve(&mut self, ctx: &mut StepCtx, step_s: f64, reserve_blocks: u32) {
        let have = u64::from(self.blocks.free_device()) + ctx.release_credit;
        let short = u64::from(reserve_blocks).saturating_sub(have);
        if short == 0 {
            return;
        }
        let victims = self.rotation_victims(ctx, u64::MAX, step_s);
        let planned = victims.into_iter().map(|v| (v.id, Some(v.eviction)));
        self.evict_until(ctx, short, planned, Walk::Reserve, step_s);
    }
}
