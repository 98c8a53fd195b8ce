//! fcfs (TGI v3): admit in arrival order (by priority class first), reserving every block the
//! request can ever need; stop at the first request that does not fit; never preempt.

use crate::step::{Fit, StepBuilder, StepCtx};

pub(super) fn plan(step: &mut StepBuilder, ctx: &mut StepCtx) {
    let running = step.running_by_rank();
    for decodes in [true, false] {
        for id in &running {
            if step.requests()[id].is_decode() == decodes {
                // Tables already cover the worst case, so this never lacks blocks.
                step.schedule_running(ctx, *id, 0);
            }
        }
    }
    for id in step.waiting_by_priority() {
        let worst_case = step.requests()[&id].max_kv_tokens();
        if step.admit(ctx, id, worst_case) != Fit::Scheduled {
            break;
        }
    }
}
