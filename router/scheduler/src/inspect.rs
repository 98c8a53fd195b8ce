//! Read-only views of the scheduler: the /metrics snapshot and the invariant check that debug
//! builds run after every call.

use crate::kv::Slot;
use crate::request::Phase;
use crate::scheduler::Core;
use crate::stats::SchedulerStats;

impl Core {
    pub(crate) fn stats(&self) -> SchedulerStats {
        let count = |phase: Phase| self.requests.values().filter(|r| r.phase == phase).count() as u32;
        let c = &self.counters;
        let free_device = self.blocks.free_device();
        let free_host = self.blocks.free_host();
        SchedulerStats {
            steps: self.step_id,
            device_blocks_total: self.blocks.num_device_blocks(),
            device_blocks_free: free_device,
            device_blocks_used: self.blocks.num_device_blocks() - free_device,
            device_blocks_cached: self.blocks.free_device_cached(),
            device_blocks_in_flight: self.blocks.device_in_flight(),
            host_blocks_total: self.blocks.num_host_blocks(),
            host_blocks_free: free_host,
            host_blocks_used: self.blocks.num_host_blocks() - free_host,
            waiting: count(Phase::Waiting),
            running: count(Phase::Running),
            rotated: count(Phase::Rotated) + count(Phase::RotatingOut) + count(Phase::RotatingIn),
            rotating_out: count(Phase::RotatingOut),
            rotating_in: count(Phase::RotatingIn),
            rotations_out: c.rotations_out,
            rotations_in: c.rotations_in,
            rotations_in_computed: c.rotations_in_computed,
            rotations_out_after_compute: c.rotations_out_after_compute,
            bytes_out: c.bytes_out,
            bytes_in: c.bytes_in,
            blocks_out_mirrored: c.blocks_out_mirrored,
            host_blocks_mirrored: self.blocks.host_mirrors(),
            recomputes: c.recomputes,
            prefix_cache_hit_tokens: c.prefix_hit_tokens,
            prefix_cache_queried_tokens: c.prefix_queried_tokens,
            finished: c.finished,
            cancelled: c.cancelled,
            expired: c.expired,
            recent_lag_samples: self.lag_samples.len() as u32,
            cost_correction: self.cost.correction,
            // The policy's own (`SchedulingPolicy::stats` fills them in).
            step_time_deviation: 0.0,
            step_overhead_s: 0.0,
            chunk_step_ratio: 0.0,
            chunk_step_deviation: 0.0,
            reserve_blocks: 0,
        }
    }

    /// Checks every block-ownership and request-state invariant: no block owned twice, none
    /// leaked, reference counts consistent, in-flight blocks held by their transfer only, each
    /// phase matching where the request's blocks are.
    pub(crate) fn check_invariants(&self) -> Result<(), String> {
        self.blocks.check()?;
        let queued: Vec<u64> = self.waiting.iter().copied().collect();
        let mut sorted = queued.clone();
        sorted.sort_unstable();
        sorted.dedup();
        if sorted.len() != queued.len() {
            return Err("a request is queued twice".into());
        }
        for id in &queued {
            match self.requests.get(id) {
                Some(r) if r.phase == Phase::Waiting && !r.doomed => {}
                _ => return Err(format!("queued request {id} is not waiting")),
            }
        }
        for (id, request) in &self.requests {
            self.check_request(*id, request, sorted.binary_search(id).is_ok())?;
        }
        Ok(())
    }

    fn check_request(&self, id: u64, r: &crate::request::RequestState, queued: bool) -> Result<(), String> {
        let in_flight = self.blocks.has_transfer_for(id);
        let slots = self.blocks.slots(id);
        if r.num_computed > r.num_positions() {
            return Err(format!("request {id} computed beyond its tokens and placeholders"));
        }
        // Placeholders are tokens planned steps sample: at most one per pending step, only on
        // device (or leaving it after that step's compute), never for a request that waits for its results; and a position past the
        // known tokens is computed only on top of the oldest placeholder (one step ahead).
        if r.placeholders > r.pending_steps {
            return Err(format!("request {id} has {} placeholders but {} pending steps", r.placeholders, r.pending_steps));
        }
        if r.placeholders > 0 && !matches!(r.phase, Phase::Running | Phase::RotatingIn | Phase::RotatingOut) && !r.doomed {
            return Err(format!("request {id} has placeholders in phase {:?}", r.phase));
        }
        if r.num_computed as usize > r.tokens.len() && r.placeholders == 0 {
            return Err(format!("request {id} computed past its known tokens without a placeholder"));
        }
        if r.waits_for_results && r.num_computed as usize > r.tokens.len() {
            return Err(format!("request {id} waits for its results but was scheduled past them"));
        }
        let bs = self.blocks.block_size() as usize;
        let ok = match r.phase {
            Phase::Waiting => queued && !self.blocks.has_table(id) && r.num_computed == 0,
            Phase::Running => {
                !in_flight
                    && slots.iter().all(|s| matches!(s, Slot::Device(_)))
                    && slots.len() * bs >= r.num_computed as usize
            }
            Phase::RotatingOut | Phase::RotatingIn => in_flight,
            Phase::Rotated => !in_flight && slots.iter().any(|s| matches!(s, Slot::Host(_))),
        };
        if r.doomed && !in_flight {
            return Err(format!("request {id} is doomed without a transfer in flight"));
        }
        if !ok || (queued && r.phase != Phase::Waiting) {
            return Err(format!("request {id} in phase {:?} has inconsistent blocks", r.phase));
        }
        Ok(())
    }
}
