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
    let running = step.running_by_rank();
    for decodes in [true, false] {
        for id in &running {
            let request = &step.requests()[id];
            if request.phase == Phase::Running && request.is_decode() == decodes {
                schedule_or_preempt(step, ctx, *id, swap);
            }
        }
    }
    if swap && !rotate_in_oldest(step, ctx, keep_growth) {
        return;
    }
    if !ctx.plan.preempted_for_recompute.is_empty() {
        return;
    }
    for id in step.waiting_by_priority() {
        if keep_growth && !admission_keeps_growth(step, id) {
            break;
        }
        if step.admit(ctx, id, 0) != Fit::Scheduled {
            break;
        }
    }
}

fn schedule_or_preempt(step: &mut StepBuilder, ctx: &mut StepCtx, id: u64, swap: bool) {
    loop {
        let Fit::NoBlocks(short) = step.schedule_running(ctx, id, 0) else { return };
        if swap && ctx.release_credit >= short {
            // Transfers out already issued will free enough once acknowledged: wait.
            ctx.release_credit -= short;
            return;
        }
        let Some(victim) = newest_evictable(step, ctx) else { return };
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

fn newest_evictable(step: &StepBuilder, ctx: &StepCtx) -> Option<u64> {
    let running = step.running_by_rank();
    running.into_iter().rev().find(|id| step.evictable(ctx, *id))
}

/// Brings rotated requests back oldest first while they fit (`keep_growth`: while the running
/// requests can still grow through the step that computes the returned one's next token, as for
/// an admission); true when none is left out (only then may new requests be admitted).
fn rotate_in_oldest(step: &mut StepBuilder, ctx: &mut StepCtx, keep_growth: bool) -> bool {
    for id in step.rotated_by_rank() {
        if keep_growth && !return_keeps_growth(step, id) {
            return false;
        }
        if !step.rotate_in(ctx, id) {
            return false;
        }
    }
    !step.requests().values().any(|r| r.phase == Phase::RotatingOut)
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
    let probe = step.blocks().probe_prefix(request.kv_namespace, &request.tokens);
    let cached = u64::from(probe.hit_blocks) * u64::from(step.blocks().block_size());
    let prompt = request.tokens.len() as u64;
    let steps = prompt.saturating_sub(cached).div_ceil(u64::from(step.config().max_batch_tokens.max(1))) + 1;
    let first_decode = (prompt + 1).min(request.max_kv_tokens()).max(prompt);
    growth_deficit(step, step.blocks().new_blocks_to_admit(&probe, first_decode), steps)
}

#[cfg(test)]
mod tests {
    use super::admission_keeps_growth;
    use crate::config::{PolicyKind, SchedulerConfig};
    use crate::plan::StepResults;
    use crate::request::RequestSpec;
    use crate::scheduler::Scheduler;
    use crate::step::StepBuilder;

    fn spec(id: u64, first_token: u32, prompt_len: u32) -> RequestSpec {
        let prompt_token_ids = (first_token..first_token + prompt_len).collect();
        RequestSpec { id, prompt_token_ids, max_new_tokens: 8, slo: None, arrival: 0.0, priority: 0, kv_namespace: 0 }
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
}
