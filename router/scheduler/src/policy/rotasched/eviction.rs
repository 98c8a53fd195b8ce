//! Eviction: making room on device for a request that lacks blocks, by rotating out or
//! recomputing the running requests that can best afford it. One walk (`evict_until`) serves
//! every caller; `Walk` says how each kind of caller overrides the cost model's choice.

use super::reactive;
use super::urgency::{Eviction, Urgency, STALL_RETURN_STEPS};
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
            let victims = self.victims_back_in_time(ctx, requester.id, short);
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
            let parked = self.parked_back_in_time(ctx, requester.id, short).into_iter().map(|id| (id, None));
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
                let bytes = u64::from(self.blocks().blocks_to_copy_out(id)) * self.config().block_bytes;
                if !ctx.budget.fits(Direction::Out, bytes) {
                    return None;
                }
                let moved = self.rotate_out(ctx, id);
                ctx.release_credit += moved.saturating_sub(claimed);
                Some((moved, false))
            }
        }
    }

    /// Rotation victims (`rotation_victims`) that memory frees up for within their stall bound,
    /// should `requester` take `short` blocks more than are free (`back_within_stall_bound`).
    fn victims_back_in_time(&self, ctx: &StepCtx, requester: u64, short: u64) -> Vec<Victim> {
        self.back_in_time(ctx, requester, short, self.rotation_victims(ctx, requester), |v| v.id)
    }

    /// Parking candidates (`parking_candidates`) that memory frees up for within their stall
    /// bound, should `requester` take `short` blocks more than are free.
    fn parked_back_in_time(&self, ctx: &StepCtx, requester: u64, short: u64) -> Vec<u64> {
        self.back_in_time(ctx, requester, short, self.parking_candidates(ctx, requester), |id| *id)
    }

    /// The `candidates` (request `id` of each) that could leave for `requester` and be back
    /// within their stall bound; the end forecast is built only if there are any.
    fn back_in_time<T>(&self, ctx: &StepCtx, requester: u64, short: u64, mut candidates: Vec<T>, id: impl Fn(&T) -> u64) -> Vec<T> {
        if !candidates.is_empty() {
            let ends = self.end_forecast();
            candidates.retain(|c| self.back_within_stall_bound(&ends, ctx, id(c), requester, short));
        }
        candidates
    }

    /// Whether `requester`, `short` blocks more than are free, may take them: a request of a
    /// lower class could make room, running requests end soon enough
    /// (`ends_free_within_stall_bound`), or a rotation victim or a decode that may park could
    /// make room and come back within its stall bound.
    pub(super) fn can_make_room(&self, ctx: &StepCtx, requester: u64, short: u64) -> bool {
        if !self.lower_class_candidates(ctx, requester).is_empty() {
            return true;
        }
        let ends = self.end_forecast();
        let back = |id: u64| self.back_within_stall_bound(&ends, ctx, id, requester, short);
        self.ends_free_within_stall_bound(&ends, requester, short)
            || self.rotation_victims(ctx, requester).iter().any(|v| back(v.id))
            || self.parking_candidates(ctx, requester).into_iter().any(back)
    }

    /// Whether running requests ending soon free `short` blocks in time for whoever `requester`
    /// pushes out (the newest, itself under overload) to come back within the stall bound, and
    /// the requester may spend the late gap that costs it.
    fn ends_free_within_stall_bound(&self, ends: &EndForecast, requester: u64, short: u64) -> bool {
        let r = &self.requests()[&requester];
        if r.late_gaps_left(self.config().tbt_late_share()) == 0 {
            return false;
        }
        let free_s = ends.free_within(short, &[requester], None);
        free_s.is_some_and(|free_s| free_s + STALL_RETURN_STEPS * self.step_s <= r.slo.max_stall_s)
    }

    /// Whether `id`, leaving the device so that `requester` can take `short` blocks more than are
    /// free, can be back on it before its stall bound breaks (with the steps a return is planned
    /// ahead, `STALL_RETURN_STEPS`): its blocks go to the requester, so the running requests
    /// that end in the meantime — the requester among them, with all it then holds — must free
    /// `short` blocks and what the others grow into over its round trip, with the round trip to
    /// spare. Where nothing ends in time, a request left on host waits for memory past its
    /// bound, and the requests it made room for are pushed out after it (the overload mode).
    fn back_within_stall_bound(&self, ends: &EndForecast, ctx: &StepCtx, id: u64, requester: u64, short: u64) -> bool {
        let Some(stall_deadline) = self.requests()[&id].stall_deadline() else { return true };
        let within = stall_deadline - ctx.now - STALL_RETURN_STEPS * self.step_s;
        let round_trip = self.cheaper_eviction(id, self.step_s).round_trip_s();
        let steps = (round_trip / self.step_s).ceil().max(1.0) as u64;
        let blocks = short + reactive::growth_blocks(self.step, steps);
        let requester_ends = self.requests().get(&requester).map(|r| {
            let held = self.blocks().private_device_blocks(requester) + self.blocks().free_device();
            (r.tokens_left(), u64::from(held) + short)
        });
        let free_s = ends.free_within(blocks, &[id, requester], requester_ends);
        free_s.is_some_and(|free_s| free_s + round_trip <= within)
    }

    /// The running requests by how soon they end, built once per question asked of it.
    pub(super) fn end_forecast(&self) -> EndForecast {
        let mut ending: Vec<(u32, u64, u64)> = self
            .running_by_rank()
            .into_iter()
            .map(|id| (self.requests()[&id].tokens_left(), u64::from(self.blocks().private_device_blocks(id)), id))
            .collect();
        ending.sort_unstable();
        EndForecast { ending, token_s: self.cost().predict_step(self.decodes_alone) }
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
        let bytes = u64::from(self.blocks().blocks_to_copy_out(id)) * self.config().block_bytes;
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

/// When the running requests end and free their blocks: each one's tokens left (its generation
/// limit, an upper bound on its length, so the forecast is late if anything) at the running
/// decodes' step time, with the private device blocks it frees then, soonest first.
pub(super) struct EndForecast {
    /// (tokens left, private device blocks, id), soonest first.
    ending: Vec<(u32, u64, u64)>,
    pub(super) token_s: f64,
}

impl EndForecast {
    /// How long until the requests other than `excluded` — and `also` (tokens left, blocks it
    /// frees then) — that end soonest free `blocks` device blocks between them (None: not
    /// before they all end).
    pub(super) fn free_within(&self, blocks: u64, excluded: &[u64], also: Option<(u32, u64)>) -> Option<f64> {
        if blocks == 0 {
            return Some(0.0);
        }
        let mut ending: Vec<(u32, u64)> =
            self.ending.iter().filter(|e| !excluded.contains(&e.2)).map(|&(tokens, held, _)| (tokens, held)).collect();
        if let Some(extra) = also {
            ending.insert(ending.partition_point(|e| e.0 < extra.0), extra);
        }
        let mut freed = 0;
        for (tokens_left, held) in ending {
            freed += held;
            if freed >= blocks {
                return Some(f64::from(tokens_left) * self.token_s);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::super::Planner;
    use crate::config::{PolicyKind, RotaSchedSettings};
    use crate::step::StepBuilder;
    use crate::step_timing::StepTiming;
    use crate::tests::driver::{config, spec, with_slo, with_stall, Driver};

    /// Two decodes of 16-token prompts (TBT 0.2 s, stall bound 0.5 s; 10 ms steps, 1 ms per
    /// block copied each way) that generate `max_new` tokens each, 3 steps in; then a waiting
    /// prompt, request 3, of 100 tokens too. Returns the rotation victims for the prompt,
    /// whether decode 2 could come back within its stall bound having left for it, and whether
    /// anyone can make room for it, one block short.
    fn room_for_the_prompt(max_new: [u32; 2]) -> (Vec<u64>, bool, bool) {
        let mut cfg = config(PolicyKind::RotaSched, 80);
        cfg.cost_model.per_prefill_token_s = 0.002;
        let mut d = Driver::new(cfg);
        for (id, max_new) in [(1, max_new[0]), (2, max_new[1])] {
            d.add(with_stall(with_slo(spec(id, 16, max_new, 0.0), 1.0, 0.2), 0.5));
        }
        for _ in 0..3 {
            d.step();
        }
        d.add(with_stall(with_slo(spec(3, 12, 100, d.now), 1.0, 0.2), 0.5));
        let core = &mut d.scheduler.core;
        let ctx = core.new_ctx(d.now);
        let mut step = StepBuilder::new(core);
        let planner = Planner::new(&mut step, RotaSchedSettings::default(), 0.01, 0, true, StepTiming::default());
        let victims = planner.rotation_victims(&ctx, 3).iter().map(|v| v.id).collect();
        let back = planner.back_within_stall_bound(&planner.end_forecast(), &ctx, 2, 3, 1);
        (victims, back, planner.can_make_room(&ctx, 3, 1))
    }

    /// A decode with slack for a round trip may leave for a prompt only if memory comes back
    /// for it within its stall bound: the blocks it gives up go to the prompt, so a running
    /// request must end in time to free them (the prompt's own end counts). With the other
    /// decode and the prompt 100 tokens from their end (about a second at 10 ms a step) nothing
    /// frees before the 0.5 s bound: nobody can make room, though both decodes have the slack.
    /// With the other decode 5 tokens from its end, both can.
    #[test]
    fn a_victim_leaves_only_if_memory_comes_back_within_its_stall_bound() {
        let (victims, back, room) = room_for_the_prompt([100, 100]);
        assert_eq!(victims.len(), 2, "both decodes have slack for a round trip");
        assert!(!back && !room, "nothing ends before the bound");
        let (victims, back, room) = room_for_the_prompt([8, 100]);
        assert_eq!(victims.len(), 2);
        assert!(back && room, "request 1 ends in 5 tokens and frees its blocks");
    }
}
