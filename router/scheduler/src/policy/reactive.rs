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
    if swap && !rotate_in_oldest(step, ctx) {
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

/// Brings rotated requests back oldest first while they fit; true when none is left out
/// (only then may new requests be admitted).
fn rotate_in_oldest(step: &mut StepBuilder, ctx: &mut StepCtx) -> bool {
    let mut rotated: Vec<((i32, u64), u64)> = step
        .requests()
        .values()
        .filter(|r| r.phase == Phase::Rotated && !r.doomed)
        .map(|r| (r.rank(), r.id))
        .collect();
    rotated.sort_unstable();
    for (_, id) in rotated {
        if !step.rotate_in(ctx, id) {
            return false;
        }
    }
    !step.requests().values().any(|r| r.phase == Phase::RotatingOut)
}

/// New device blocks the running requests need to compute `steps` more positions each
/// (their prompt's rest first), within their generation limit.
fn growth_blocks(step: &StepBuilder, steps: u64) -> u64 {
    step.requests()
        .values()
        .filter(|r| r.phase == Phase::Running && !r.doomed && r.has_work())
        .map(|r| {
            let target = (u64::from(r.num_positions()) + steps).min(r.max_kv_tokens());
            step.blocks().new_blocks_needed(r.id, target)
        })
        .sum()
}

/// Whether admitting `id` leaves the blocks the running requests need while its prompt is
/// computed and its first token sampled, and the block of its own first decode: an
/// admission that does not would push one of them (or itself) out at once.
pub(super) fn admission_keeps_growth(step: &StepBuilder, id: u64) -> bool {
    let request = &step.requests()[&id];
    let probe = step.blocks().probe_prefix(request.kv_namespace, &request.tokens);
    let cached = u64::from(probe.hit_blocks) * u64::from(step.blocks().block_size());
    let prompt = request.tokens.len() as u64;
    let steps = prompt.saturating_sub(cached).div_ceil(u64::from(step.config().max_batch_tokens.max(1))) + 1;
    let first_decode = (prompt + 1).min(request.max_kv_tokens()).max(prompt);
    let own = step.blocks().new_blocks_to_admit(&probe, first_decode);
    own + growth_blocks(step, steps) <= u64::from(step.blocks().free_device())
}
