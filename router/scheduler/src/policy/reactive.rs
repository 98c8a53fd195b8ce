//! recompute (vLLM V1, SGLang) and swap (vLLM V0): blocks on demand; when a running request
//! needs a block and none is free, the newest running request of the lowest priority class is
//! preempted (vLLM's priority scheduling). recompute drops its KV (it returns to the front of
//! the queue); swap copies it to host and brings it back, highest class and oldest first, before
//! any new request is admitted. The queue is served by priority class, then in order.

use crate::request::Phase;
use crate::step::{Fit, StepBuilder, StepCtx};

/// `keep_growth`: admit a request only if the running ones can still grow through its
/// prefill and first token (RotaSched's overload mode; the baselines admit while it fits).
pub(super) fn plan(step: &mut StepBuilder, ctx: &mut StepCtx, swap: bool, keep_growth: bool) {
    plan_with(step, ctx, swap, keep_growth, None)
}

/// As `plan`; with `lost_yield` (RotaSched's overload mode, its `late_starvation_s`), the
/// requests that can no longer meet their objectives yield to those that still can
/// (`yields`): a prompt that can still make its first token is admitted before one that
/// cannot, a request rotated out that can still meet its objectives comes back before one that
/// cannot (`return_order`), and on a shortage the newest running request that cannot (and holds
/// no more blocks than the newest) is pushed out before the newest of all. Swap's order, which
/// admits and preempts by arrival, spends the memory on requests already lost while fresh
/// prompts queue behind them and miss too.
pub(super) fn plan_with(step: &mut StepBuilder, ctx: &mut StepCtx, swap: bool, keep_growth: bool, lost_yield: Option<f64>) {
    let running = step.running_by_rank();
    for decodes in [true, false] {
        for id in &running {
            let request = &step.requests()[id];
            if request.phase == Phase::Running && request.is_decode() == decodes {
                schedule_or_preempt(step, ctx, *id, swap, lost_yield);
            }
        }
    }
    if swap && !rotate_in_oldest(step, ctx, keep_growth, lost_yield) {
        return;
    }
    if !ctx.plan.preempted_for_recompute.is_empty() {
        return;
    }
    let mut waiting = step.waiting_by_priority();
    if let Some(starve_s) = lost_yield {
        // Stable: queue order within each class and within the punctual and the lost.
        waiting.sort_by_key(|id| (step.requests()[id].priority, yields(step, *id, ctx.now, starve_s)));
    }
    for id in waiting {
        if keep_growth && !admission_keeps_growth(step, id) {
            break;
        }
        if step.admit(ctx, id, 0) != Fit::Scheduled {
            break;
        }
    }
}

/// Whether `id` yields to the requests that can still meet their objectives: it can no longer
/// meet its own — its first token came late or a gap broke its stall bound
/// (`objectives_lost`), or it still waits for a first token past its deadline — and it has
/// not starved (`RequestState::starved`: late by `starve_s` or more, the clock RotaSched's own
/// mode starves by). A starved request is served in its turn again, so none waits without bound.
pub(super) fn yields(step: &StepBuilder, id: u64, now: f64, starve_s: f64) -> bool {
    let r = &step.requests()[&id];
    let lost = r.objectives_lost || (r.last_token_at.is_none() && now > r.next_deadline());
    lost && !r.starved(now, starve_s)
}

fn schedule_or_preempt(step: &mut StepBuilder, ctx: &mut StepCtx, id: u64, swap: bool, lost_yield: Option<f64>) {
    loop {
        let Fit::NoBlocks(short) = step.schedule_running(ctx, id, 0) else { return };
        if swap && ctx.release_credit >= short {
            // Transfers out already issued will free enough once acknowledged: wait.
            ctx.release_credit -= short;
            return;
        }
        let Some(victim) = newest_evictable(step, ctx, lost_yield) else { return };
        let moved = if swap { step.rotate_out(ctx, victim) } else { 0 };
        if moved > 0 {
            ctx.release_credit += moved;
        } else {
            step.preempt_for_recompute(ctx, victim);
        }
        if victim == id {
            return;
        }
    }
}

/// The newest running request that may leave now (with `lost_yield`, the newest that yields
/// first).
fn newest_evictable(step: &StepBuilder, ctx: &StepCtx, lost_yield: Option<f64>) -> Option<u64> {
    let running = step.running_by_rank();
    let newest = running.iter().rev().find(|id| step.evictable(ctx, **id)).copied()?;
    let Some(starve_s) = lost_yield else { return Some(newest) };
    // No larger than the newest: a lost request holding more waits longer for memory to return.
    let held = |id: u64| step.blocks().private_device_blocks(id);
    let lost = running.iter().rev().find(|id| {
        step.evictable(ctx, **id) && yields(step, **id, ctx.now, starve_s) && held(**id) <= held(newest)
    });
    Some(lost.copied().unwrap_or(newest))
}

/// Brings rotated requests back oldest first while they fit (`keep_growth`: while the running
/// requests can still grow through the step that computes the returned one's next token, as for
/// an admission; with `lost_yield`, those that yield after those that do not); true when none
/// is left out (only then may new requests be admitted).
fn rotate_in_oldest(step: &mut StepBuilder, ctx: &mut StepCtx, keep_growth: bool, lost_yield: Option<f64>) -> bool {
    for id in return_order(step, ctx.now, lost_yield) {
        if keep_growth && !return_keeps_growth(step, id) {
            return false;
        }
        if !step.rotate_in(ctx, id) {
            return false;
        }
    }
    !step.requests().values().any(|r| r.phase == Phase::RotatingOut)
}

/// The requests rotated out in the order they come back: by priority class, then oldest first;
/// with `lost_yield`, those that yield (`yields`) after those that do not, a return being
/// memory spent as an admission is.
pub(super) fn return_order(step: &StepBuilder, now: f64, lost_yield: Option<f64>) -> Vec<u64> {
    let mut rotated = step.rotated_by_rank();
    if let Some(starve_s) = lost_yield {
        // Stable: rank order within the punctual and the lost (classes are strict either way:
        // yielding only reorders within a class).
        rotated.sort_by_key(|id| (step.requests()[id].priority, yields(step, *id, now, starve_s)));
    }
    rotated
}

/// New device blocks the running requests need to compute `steps` more positions each
/// (their prompt's rest first), within their generation limit.
pub(super) fn growth_blocks(step: &StepBuilder, steps: u64) -> u64 {
    step.requests()
        .values()
        .filter(|r| r.phase == Phase::Running && !r.doomed && r.has_work())
        .map(|r| {
            let target = (u64::from(r.num_positions()) + steps).min(r.max_kv_tokens());
            step.blocks().new_blocks_needed(r.id, target)
        })
        .sum()
}

/// New device blocks missing for `own` of them and the running requests' growth through
/// `steps` more positions each (0: they all fit in the free blocks).
pub(super) fn growth_deficit(step: &StepBuilder, own: u64, steps: u64) -> u64 {
    (own + growth_blocks(step, steps)).saturating_sub(u64::from(step.blocks().free_device()))
}

/// Whether bringing rotated `id` back leaves the blocks the running requests need for their
/// next tokens, and the block of its own next one: a return that does not would push one of them
/// (or itself) out before it computes.
fn return_keeps_growth(step: &StepBuilder, id: u64) -> bool {
    growth_deficit(step, return_blocks(step, id, 1), 1) == 0
}

/// Device blocks rotated `id` holds once back and `steps` positions further (within its
/// generation limit): its host blocks, or more.
pub(super) fn return_blocks(step: &StepBuilder, id: u64, steps: u64) -> u64 {
    let request = &step.requests()[&id];
    let held = u64::from(step.blocks().host_slots(id));
    let then = (u64::from(request.num_positions()) + steps).min(request.max_kv_tokens());
    held.max(then.div_ceil(u64::from(step.blocks().block_size())))
}

/// Whether admitting `id` leaves the blocks the running requests need while its prompt is
/// computed and its first token sampled, and the block of its own first decode: an
/// admission that does not would push one of them (or itself) out at once.
pub(super) fn admission_keeps_growth(step: &StepBuilder, id: u64) -> bool {
    admission_deficit(step, id) == 0
}

/// The device blocks missing for admitting `id` as `admission_keeps_growth` asks (0: none).
pub(super) fn admission_deficit(step: &StepBuilder, id: u64) -> u64 {
    let request = &step.requests()[&id];
    let probe = step.blocks().probe_prefix(request.kv_namespace, request.prefix_lookup());
    let cached = u64::from(probe.hit_blocks) * u64::from(step.blocks().block_size());
    let prompt = request.tokens.len() as u64;
    let steps = prompt.saturating_sub(cached).div_ceil(u64::from(step.config().max_batch_tokens.max(1))) + 1;
    let first_decode = (prompt + 1).min(request.max_kv_tokens()).max(prompt);
    growth_deficit(step, step.blocks().new_blocks_to_admit(&probe, first_decode), steps)
}

#[cfg(test)]
mod tests {
    use super::{admission_keeps_growth, plan_with};
    use crate::config::{PolicyKind, SchedulerConfig, Slo};
    use crate::plan::StepResults;
    use crate::request::RequestSpec;
    use crate::scheduler::Scheduler;
    use crate::step::StepBuilder;

    fn spec(id: u64, first_token: u32, prompt_len: u32) -> RequestSpec {
        let prompt_token_ids = (first_token..first_token + prompt_len).collect();
        RequestSpec { id, prompt_token_ids, max_new_tokens: 8, slo: None, arrival: 0.0, priority: 0, kv_namespace: 0, scores_prompt: false }
    }

    /// RotaSched's overload mode admits a prompt only while the running requests can still grow
    /// through its prefill and first token and its own first decode has its block. 4-token
    /// blocks, 12 on device: one request runs with 16 tokens computed in 4 blocks (its next token
    /// needs a fifth), 8 are free. A 24-token prompt (7 blocks with its first decode) leaves that
    /// fifth block; a 28-token one (8 blocks) would take it, though its prompt alone fits.
    #[test]
    fn an_admission_must_leave_the_running_requests_room_to_grow() {
        let config = SchedulerConfig {
            block_size: 4,
            num_device_blocks: 12,
            num_host_blocks: 64,
            policy: PolicyKind::Swap,
            ..SchedulerConfig::default()
        };
        let mut s = Scheduler::new(config).unwrap();
        s.add(spec(1, 0, 16), 0.0).unwrap();
        let plan = s.plan(0.0);
        assert_eq!(plan.scheduled.len(), 1);
        s.complete(&StepResults { step_id: plan.step_id, sampled: vec![(1, 7)], completed_transfers: vec![], step_time_s: None }, 0.01);
        s.add(spec(2, 1000, 24), 0.01).unwrap();
        s.add(spec(3, 2000, 28), 0.01).unwrap();
        let step = StepBuilder::new(&mut s.core);
        assert_eq!(step.blocks().free_device(), 8);
        assert!(admission_keeps_growth(&step, 2));
        assert!(!admission_keeps_growth(&step, 3));
    }

    /// 4-token blocks, `blocks` on device, swap's protocol; `requests` (id, arrival, TTFT
    /// objective) of 16-token prompts arrive in turn, the first `running` of them computed to
    /// their first token at 0.01 s.
    fn overloaded(blocks: u32, requests: &[(u64, f64, f64)], running: usize) -> Scheduler {
        let config = SchedulerConfig {
            block_size: 4,
            num_device_blocks: blocks,
            num_host_blocks: 64,
            policy: PolicyKind::Swap,
            ..SchedulerConfig::default()
        };
        let mut s = Scheduler::new(config).unwrap();
        for (i, &(id, arrival, ttft_s)) in requests.iter().enumerate() {
            let prompt_token_ids = (id as u32 * 1000..id as u32 * 1000 + 16).collect();
            let slo = Some(Slo::new(ttft_s, 1.0));
            s.add(RequestSpec { id, prompt_token_ids, max_new_tokens: 8, slo, arrival, priority: 0, kv_namespace: 0, scores_prompt: false }, arrival)
                .unwrap();
            if i + 1 == running {
                let plan = s.plan(0.0);
                assert_eq!(plan.scheduled.len(), running);
                let sampled = plan.scheduled.iter().map(|e| (e.id, 7)).collect();
                s.complete(&StepResults { step_id: plan.step_id, sampled, completed_transfers: vec![], step_time_s: None }, 0.01);
            }
        }
        s
    }

    /// Under overload, swap admits and preempts by arrival; RotaSched's overload mode lets the
    /// requests that can no longer meet their objectives yield. One request runs in 12 blocks
    /// and room is left for one more prompt: the older one's first-token deadline has passed,
    /// the newer one's has not. Swap's order admits the older; with `lost_yield`, the newer.
    #[test]
    fn under_overload_a_prompt_that_can_still_make_its_first_token_goes_first() {
        let requests = [(1, 0.0, 2.0), (2, 0.0, 0.005), (3, 0.01, 2.0)];
        for (lost_yield, admitted) in [(None, 2), (Some(10.0), 3)] {
            let mut s = overloaded(12, &requests, 1);
            let mut ctx = s.core.new_ctx(0.02);
            plan_with(&mut StepBuilder::new(&mut s.core), &mut ctx, true, true, lost_yield);
            assert_eq!(ctx.plan.first_scheduled, vec![admitted], "lost_yield {lost_yield:?}");
        }
        // A lost prompt that has starved (15 ms past its deadline, more than the 10 ms allowed
        // here) is served in turn again.
        let mut s = overloaded(12, &requests, 1);
        let mut ctx = s.core.new_ctx(0.02);
        plan_with(&mut StepBuilder::new(&mut s.core), &mut ctx, true, true, Some(0.01));
        assert_eq!(ctx.plan.first_scheduled, vec![2]);
    }

    /// 4-token blocks, 16 on device: requests 1–3 (16-token prompts) run to their first token,
    /// 1 and 2 are rotated out and request 4 is admitted into their blocks, leaving room for one
    /// of them to come back. Request 1, the older, can no longer meet its objectives: swap's
    /// order brings it back; with `lost_yield`, request 2 comes back first.
    #[test]
    fn under_overload_a_request_that_can_still_meet_its_objectives_comes_back_before_a_lost_one() {
        use crate::config::PolicyKind;
        use crate::step::Fit;
        use crate::tests::driver::{config, spec, Driver};
        for (lost_yield, back) in [(None, 1), (Some(10.0), 2)] {
            let mut d = Driver::new(config(PolicyKind::Swap, 16));
            for id in 1..=3 {
                d.add(spec(id, 16, 20, d.now));
            }
            d.step_to_first_tokens(&[1, 2, 3]);
            d.by_hand(|step, ctx| assert!(step.rotate_out(ctx, 1) > 0 && step.rotate_out(ctx, 2) > 0));
            d.add(spec(4, 16, 20, d.now));
            d.by_hand(|step, ctx| assert_eq!(step.admit(ctx, 4, 0), Fit::Scheduled));
            let core = &mut d.scheduler.core;
            core.requests.get_mut(&1).unwrap().objectives_lost = true;
            let mut ctx = core.new_ctx(d.now);
            plan_with(&mut StepBuilder::new(core), &mut ctx, true, true, lost_yield);
            let returned: Vec<u64> = ctx.plan.rotate_in.iter().map(|t| t.request_id).collect();
            assert_eq!(returned, vec![back], "lost_yield {lost_yield:?}");
        }
    }

    /// Three running requests fill the 12 blocks and each needs a fifth: swap pushes the newest
    /// out; with `lost_yield`, the newest of those that can no longer meet their objectives.
    #[test]
    fn under_overload_the_requests_already_lost_are_pushed_out_first() {
        let requests = [(1, 0.0, 2.0), (2, 0.0, 2.0), (3, 0.0, 2.0)];
        for (lost_yield, pushed_out) in [(None, 3), (Some(10.0), 2)] {
            let mut s = overloaded(12, &requests, 3);
            s.core.requests.get_mut(&2).unwrap().objectives_lost = true;
            let mut ctx = s.core.new_ctx(0.02);
            plan_with(&mut StepBuilder::new(&mut s.core), &mut ctx, true, true, lost_yield);
            let out: Vec<u64> = ctx.plan.rotate_out.iter().map(|t| t.request_id).collect();
            assert_eq!(out, vec![pushed_out], "lost_yield {lost_yield:?}");
        }
    }
}
