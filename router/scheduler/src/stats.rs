//! Counters and gauges the router exports on /metrics.

/// A snapshot of the scheduler's state and its cumulative counters.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SchedulerStats {
    pub steps: u64,
    pub device_blocks_total: u32,
    pub device_blocks_free: u32,
    pub device_blocks_used: u32,
    /// Free device blocks that still hold a reusable cached prefix.
    pub device_blocks_cached: u32,
    /// Device blocks held by an unacknowledged transfer.
    pub device_blocks_in_flight: u32,
    pub host_blocks_total: u32,
    pub host_blocks_free: u32,
    pub host_blocks_used: u32,
    /// Requests without device KV, waiting for (re)admission.
    pub waiting: u32,
    /// Requests with their KV on device.
    pub running: u32,
    /// Requests with their KV on host (rotated out), transfers included.
    pub rotated: u32,
    pub rotating_out: u32,
    pub rotating_in: u32,
    pub rotations_out: u64,
    pub rotations_in: u64,
    /// Returns computed in the step that copies them in (of `rotations_in`).
    pub rotations_in_computed: u64,
    /// Rotations out of a request that computes in the same step, the copy after the compute
    /// (of `rotations_out`).
    pub rotations_out_after_compute: u64,
    pub bytes_out: u64,
    pub bytes_in: u64,
    /// Blocks rotated out without a copy, the host holding an identical copy from their last
    /// rotation in (a mirror).
    pub blocks_out_mirrored: u64,
    /// Host blocks now holding mirrors (counted free: given up when a copy out needs room).
    pub host_blocks_mirrored: u32,
    pub recomputes: u64,
    pub prefix_cache_hit_tokens: u64,
    pub prefix_cache_queried_tokens: u64,
    pub finished: u64,
    pub cancelled: u64,
    /// Queued requests ended by the queue time-out.
    pub expired: u64,
    /// Lag (now - deadline, seconds) of each token produced since the last call to
    /// `Scheduler::take_lag_samples`; positive means late.
    pub recent_lag_samples: u32,
    /// Cost-model correction factor (measured / predicted step time).
    pub cost_correction: f64,
    /// RotaSched's step timing (`StepTiming`; 0 under the other policies, which plan no step to
    /// a deadline): how far steps stray from the corrected prediction (mean absolute deviation,
    /// relative), over steps without a prefill chunk beside decodes.
    pub step_time_deviation: f64,
    /// The same over steps with one, from their own ratio (0 before the first).
    pub chunk_step_deviation: f64,
    /// Seconds a step takes from plan to results beyond its compute.
    pub step_overhead_s: f64,
    /// Measured over predicted time of steps holding a prefill chunk beside decodes (0 before
    /// the first).
    pub chunk_step_ratio: f64,
    /// Free device blocks RotaSched currently keeps in reserve for arrivals.
    pub reserve_blocks: u32,
}
