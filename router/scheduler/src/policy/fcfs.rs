//! fcfs (TGI v3): admit in arrival order (by priority class first), reserving every block the
//! request can ever need; stop at the first request that does not fit; never preempt.

use crate::scheduler::Core;
use crate::step::{Fit, StepCtx};

impl Core {
    pub(crate) fn plan_fcfs(&mut self, ctx: &mut StepCtx) {
        let running = self.running_by_rank();
        for decodes in [true, false] {
            for id in &running {
                if self.requests[id].is_decode() == decodes {
                    // Tables already cover the worst case, so this never lacks blocks.
                    self.schedule_running(ctx, *id, 0);
                }
            }
        }
        for id in self.waiting_by_priority() {
            let worst_case = self.requests[&id].max_kv_tokens();
            if self.admit(ctx, id, worst_case) != Fit::Scheduled {
                break;
            }
        }
    }
}
