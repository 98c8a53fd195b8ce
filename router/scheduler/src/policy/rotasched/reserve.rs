//! The reserve: free device blocks kept for the arrivals expected during one rotation out, and
//! the proactive rotation that keeps it.

use super::eviction::Walk;
use super::Planner;
use crate::arrival_rate::ArrivalEstimator;
use crate::step::{StepBuilder, StepCtx};

/// Free blocks to keep for arrivals expected during one rotation out's latency.
pub(super) fn arrival_reserve(step: &StepBuilder, arrival_rate: &ArrivalEstimator, now: f64, step_s: f64) -> u32 {
    if step.blocks().free_host() == 0 {
        return 0;
    }
    let latency = 2.0 * step_s + step.cost().transfer_overhead_s;
    let expected = arrival_rate.expected_blocks(now, latency).ceil();
    let cap = step.config().num_device_blocks / 4;
    (expected as u32).min(cap)
}

impl Planner<'_, '_> {
    /// Proactive rotation: when free blocks (plus those already on their way) fall below the
    /// reserve, rotate out requests with slack to spare so arrivals start prefill at once.
    pub(super) fn keep_reserve(&mut self, ctx: &mut StepCtx) {
        let reserve_blocks = self.reserve_blocks;
        let have = u64::from(self.blocks().free_device()) + ctx.release_credit;
        let short = u64::from(reserve_blocks).saturating_sub(have);
        if short == 0 {
            return;
        }
        let victims = self.rotation_victims(ctx, u64::MAX);
        let planned = victims.into_iter().map(|v| (v.id, Some(v.eviction)));
        self.evict_until(ctx, short, planned, Walk::Reserve);
    }
}
