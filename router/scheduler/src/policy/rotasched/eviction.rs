//! Eviction: making room on device for a request that lacks blocks, by rotating out or
//! recomputing the running requests that can best afford it. One walk (`evict_until`) serves
//! every caller; `Walk` says how each kind of caller overrides the cost model's choice.

use super::urgency::{Eviction, Urgency};
use super::Planner;
use crate::cost_model::Direction;
use crate::request::Phase;
use crate::step::StepCtx;

pub(super) struct Victim {
    pub(super) id: u64,
    priority: i32,
    slack: f64,
    pub(super) eviction: Eviction,
}

/// How a request leaves the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Evict {
    /// Rotated out to host (within this step's byte budget); its blocks free when the copy ends.
    RotateOut,
    /// Dropped and recomputed later; its blocks free at once.
    Recompute,
}

impl From<Eviction> for Evict {
    fn from(eviction: Eviction) -> Self {
        match eviction {
            Eviction::RotateOut { .. } => Evict::RotateOut,
            Eviction::Recompute { .. } => Evict::Recompute,
        }
    }
}

/// One walk over eviction candidates: each leaves as the cost model says, except as the walk's
/// rule overrides, until enough blocks are free or on their way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Walk {
    /// For a requester: a rotation out that does not fit this step's byte budget is skipped, and the
    /// requester claims what is freed (only the excess is credited to later ones).
    ForRequester,
    /// Under overload, for a running requester: a rotation out that does not fit, or is not worth a
    /// round trip, becomes a recompute, so the oldest request always progresses.
    ForRequesterUnderOverload,
    /// The proactive reserve: rotations out only (a recompute loses work for no one in particular),
    /// all of them credited as free-to-be.
    Reserve,
    /// For a requester of a higher priority class, over the lower classes' running requests: a
    /// rotation out that does not fit this step's byte budget, or is not worth a round trip,
    /// becomes a recompute, so the higher class never waits on the lower one's memory.
    ForHigherClass,
}

impl Planner<'_, '_> {
    /// Evicts the running requests with the most slack until `short` blocks are free or on
    /// their way. True when blocks were freed right away (worth retrying now).
    pub(super) fn make_room(&mut self, ctx: &mut StepCtx, short: u64, requester: &Urgency) -> bool {
        // A late or parked requester evicts only a lower class; a punctual one first the
        // requests with slack, then a lower class, then (below) those that may park or are newer.
        let deferred = requester.deferred_class();
        let lower = self.lower_class_candidates(ctx, requester.id);
        if deferred && lower.is_empty() {
            return false;
        }
        let credit = ctx.release_credit.min(short);
        ctx.release_credit -= credit;
        let (mut freed_now, mut short) = (false, short - credit);
        if !deferred {
            let victims = self.rotation_victims(ctx, requester.id);
            let planned = victims.into_iter().map(|v| (v.id, Some(v.eviction)));
            (freed_now, short) = self.evict_until(ctx, short, planned, Walk::ForRequester);
        }
        if short > 0 && !lower.is_empty() {
            // A lower class yields its blocks whatever its own slack: under memory pressure the
            // higher class keeps its objectives.
            let lower = lower.into_iter().map(|id| (id, None));
            let (freed, left) = self.evict_until(ctx, short, lower, Walk::ForHigherClass);
            freed_now |= freed;
            short = left;
        }
        if deferred {
            return freed_now;
        }
        if short > 0 && self.needs_parking(requester) {
            // No running request has slack for a round trip: park decodes with late gaps to
            // spend (see `parking_candidates`).
            let parked = self.parking_candidates(ctx, requester.id).into_iter().map(|id| (id, None));
            let (freed, left) = self.evict_until(ctx, short, parked, Walk::ForRequester);
            freed_now |= freed;
            short = left;
        }
        let running = self.requests().get(&requester.id).is_some_and(|r| r.phase == Phase::Running);
        if short > 0 && running {
            let newer = self.newer_candidates(ctx, requester.id).into_iter().map(|id| (id, None));
            freed_now |= self.evict_until(ctx, short, newer, Walk::ForRequesterUnderOverload).0;
        }
        freed_now
    }

    /// Walks `candidates` in order, evicting each as `walk` says, until `short` blocks are free
    /// or on their way. A candidate's eviction is the one planned with it, or (None) the cheaper
    /// one when its turn comes: the host's room shrinks as the walk rotates others out. Returns
    /// whether blocks were freed right away and how many are still short.
    pub(super) fn evict_until(
        &mut self,
        ctx: &mut StepCtx,
        mut short: u64,
        candidates: impl IntoIterator<Item = (u64, Option<Eviction>)>,
        walk: Walk,
    ) -> (bool, u64) {
        let mut freed_now = false;
        for (id, planned) in candidates {
            if short == 0 {
                break;
            }
            let eviction = planned.unwrap_or_else(|| self.cheaper_eviction(id, self.step_s));
            let how = match (walk, Evict::from(eviction)) {
                (Walk::Reserve, Evict::Recompute) => continue,
                (Walk::ForRequesterUnderOverload | Walk::ForHigherClass, Evict::RotateOut)
                    if !self.rotate_out_fits_now(ctx, id) =>
                {
                    Evict::Recompute
                }
                (_, how) => how,
            };
            let claimed = if walk == Walk::Reserve { 0 } else { short };
            if let Some((freed, now)) = self.evict(ctx, id, how, claimed) {
                freed_now |= now;
                short = short.saturating_sub(freed);
                if walk == Walk::ForRequesterUnderOverload && how == Evict::RotateOut {
                    self.overload_victims.push(id);
                }
            }
        }
        (freed_now, short)
    }

    /// Evicts `id` the given way: a rotation out within this step's byte budget, or a recompute
    /// preemption. Of the blocks a rotation out frees when its copy ends, `claimed` are the
    /// requester's and the rest are credited to later requesters this step. Returns the blocks
    /// freed or on their way and whether they are free right away; None when the rotation out does
    /// not fit the budget.
    fn evict(&mut self, ctx: &mut StepCtx, id: u64, how: Evict, claimed: u64) -> Option<(u64, bool)> {
        match how {
            Evict::Recompute => {
                let freed = self.preempt_for_recompute(ctx, id);
                Some((freed, freed > 0))
            }
            Evict::RotateOut => {
                let bytes = u64::from(self.blocks().private_device_blocks(id)) * self.config().block_bytes;
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
        let Some(requester_rank) = self.requests().get(&requester).map(|r| r.rank()) else { return Vec::new() };
        let mut candidates: Vec<u64> = self
            .eviction_candidates(ctx, requester)
            .into_iter()
            .filter(|id| self.requests()[id].rank() > requester_rank)
            .collect();
        // Lowest class first, newest first within it.
        candidates.sort_by_key(|id| std::cmp::Reverse(self.requests()[id].rank()));
        candidates
    }

    /// Running requests of a lower priority class than the requester's that could leave the
    /// device now, lowest class first and newest first within it (vLLM's order of preemption).
    pub(super) fn lower_class_candidates(&self, ctx: &StepCtx, requester: u64) -> Vec<u64> {
        let Some(priority) = self.requests().get(&requester).map(|r| r.priority) else { return Vec::new() };
        let mut candidates: Vec<u64> = self
            .eviction_candidates(ctx, requester)
            .into_iter()
            .filter(|id| self.requests()[id].priority > priority)
            .collect();
        candidates.sort_by_key(|id| std::cmp::Reverse(self.requests()[id].rank()));
        candidates
    }

    /// Whether a request waiting for its first token, or rotated out, is of a higher class than
    /// a running one: the overload mode, which serves the running requests first, would keep
    /// the higher class waiting on the lower one's memory, so steps are planned instead.
    pub(super) fn priority_inversion(&self) -> bool {
        let requests = self.requests();
        let Some(lowest_running) = requests.values().filter(|r| r.phase == Phase::Running).map(|r| r.priority).max()
        else {
            return false;
        };
        requests.values().any(|r| {
            !r.doomed && matches!(r.phase, Phase::Waiting | Phase::Rotated) && r.priority < lowest_running
        })
    }

    /// Whether `id` may leave the device for a request of priority `requester_priority` (None:
    /// for no request in particular): never for a request of a lower class.
    pub(super) fn yields_to(&self, id: u64, requester_priority: Option<i32>) -> bool {
        requester_priority.is_none_or(|p| self.requests()[&id].priority >= p)
    }

    /// Running requests that could leave the device now: not the requester, not in this step,
    /// holding private blocks, and not rotated in within the cool-down or without a token since
    /// (no thrashing).
    pub(super) fn eviction_candidates(&self, ctx: &StepCtx, requester: u64) -> Vec<u64> {
        let cooldown = self.settings.rotation_cooldown_steps;
        let recent = |id: &u64| {
            let r = &self.requests()[id];
            r.returned_without_token || r.rotated_in_step.is_some_and(|s| s + cooldown > self.step_id())
        };
        self.running_by_rank()
            .into_iter()
            .filter(|id| *id != requester && self.evictable(ctx, *id))
            .filter(|id| self.blocks().private_device_blocks(*id) > 0 && !recent(id))
            .collect()
    }

    /// A rotation out keeps the rotation limits: it fits this step's byte budget and the request
    /// has enough tokens left to be worth the round trip. Otherwise it is recomputed.
    fn rotate_out_fits_now(&self, ctx: &StepCtx, id: u64) -> bool {
        let bytes = u64::from(self.blocks().private_device_blocks(id)) * self.config().block_bytes;
        let worth = self.requests()[&id].tokens_left() >= self.settings.min_rotation_tokens_left;
        worth && ctx.budget.fits(Direction::Out, bytes)
    }

    /// Eviction candidates that may be rotated out now, lowest priority class first and most
    /// slack first within it: with enough tokens left to be worth the round trip, able to risk a
    /// late gap should the return fail, with more slack than the round trip takes (so they
    /// return on time), and not of a higher class than the requester.
    pub(super) fn rotation_victims(&self, ctx: &StepCtx, requester: u64) -> Vec<Victim> {
        if !self.rotation_budget_left {
            return Vec::new();
        }
        let requester_priority = self.requests().get(&requester).map(|r| r.priority);
        let mut victims: Vec<Victim> = self
            .eviction_candidates(ctx, requester)
            .into_iter()
            .filter(|id| self.yields_to(*id, requester_priority))
            .filter_map(|id| {
                let r = &self.requests()[&id];
                let eviction = self.cheaper_eviction(id, self.step_s);
                let round_trip = eviction.round_trip_s();
                let worth = r.tokens_left() >= self.settings.min_rotation_tokens_left
                    && f64::from(r.tokens_left()) * self.step_s >= round_trip
                    && r.may_risk_a_late_gap(self.config().tbt_late_share());
                let slack = self.urgency(id, ctx.now, self.step_s).slack;
                (worth && slack > round_trip).then_some(Victim { id, priority: r.priority, slack, eviction })
            })
            .collect();
        // The lowest class leaves first; within a class, the most slack.
        victims.sort_by(|a, b| b.priority.cmp(&a.priority).then(b.slack.total_cmp(&a.slack)).then(b.id.cmp(&a.id)));
        victims
    }
}
