//! fcfs (TGI v3): admit in arrival order, reserving every block the request can ever need;
//! stop at the first request that does not fit; never preempt.

use crate::scheduler::Core;
use crate::step::{Fit, StepCtx};

impl Core {
    pub(crate) fn plan_fcfs(&mut self, ctx: &mut StepCtx) {
        let running = self.running_by_seq();
        for decodes in [true, false] {
            for id in &running {
                if self.requests[id].is_decode() == decodes {
                    // Tables already cover the worst case, so this never lacks blocks.
                    self.schedule_running(ctx, *id, 0);
                }
            }
        }
        let queue: Vec<u64> = self.waiting.iter().copied().collect();
        for id in queue {
            let worst_case = self.requests[&id].max_kv_tokens();
            if self.admit(ctx, id, worst_case) != Fit::Scheduled {
                break;
            }
        }
    }
}
