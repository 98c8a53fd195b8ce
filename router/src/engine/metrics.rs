//! The engine's metrics (the `metrics` facade; the HTTP layer installs the Prometheus
//! recorder and serves /metrics). Names are the stable public contract of dashboards.
use std::time::Duration;

use superinfer_scheduler::{SchedulerStats, StepPlan};

use crate::pb;

pub(crate) fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_gauge!("superinfer_kv_device_blocks_free", "Free device KV blocks");
    describe_gauge!("superinfer_kv_device_blocks_used", "Device KV blocks held by requests");
    describe_gauge!("superinfer_kv_device_blocks_cached", "Free device KV blocks holding a reusable prefix");
    describe_gauge!("superinfer_kv_host_blocks_free", "Free host KV blocks");
    describe_gauge!("superinfer_kv_host_blocks_used", "Host KV blocks held by rotated-out requests");
    describe_gauge!("superinfer_queue_size", "Requests waiting for device KV blocks");
    describe_gauge!("superinfer_running_requests", "Requests with their KV cache on the device");
    describe_gauge!("superinfer_rotated_requests", "Requests with their KV cache in host memory");
    describe_gauge!("superinfer_engine_requests", "Requests the engine holds (any phase)");
    describe_histogram!("superinfer_batch_size", "Requests computed per step");
    describe_histogram!("superinfer_batch_tokens", "Tokens computed per step");
    describe_histogram!("superinfer_step_duration", Unit::Seconds, "Step RPC round trip");
    describe_histogram!("superinfer_forward_duration", Unit::Seconds, "Model forward pass per step");
    describe_histogram!("superinfer_step_overhead_duration", Unit::Seconds, "Step round trip minus the shard's own time");
    describe_histogram!("superinfer_engine_turn_duration", Unit::Seconds,
        "Engine time between back-to-back steps (commands, plan, request building, postprocessing)");
    describe_counter!("superinfer_steps_total", "Steps executed");
    describe_counter!("superinfer_rotations_out_total", "Requests rotated or swapped out to host memory");
    describe_counter!("superinfer_rotations_in_total", "Requests brought back to the device");
    describe_counter!("superinfer_recomputes_total", "Requests preempted for recomputation");
    describe_counter!("superinfer_engine_failures_total", "Shard failures seen by the engine");
}

pub(crate) fn record_step(plan: &StepPlan, round_trip: Duration, timings: Option<&pb::StepTimings>) {
    metrics::counter!("superinfer_steps_total").increment(1);
    metrics::histogram!("superinfer_batch_size").record(plan.scheduled.len() as f64);
    metrics::histogram!("superinfer_batch_tokens").record(plan.num_batched_tokens() as f64);
    metrics::histogram!("superinfer_step_duration").record(round_trip.as_secs_f64());
    if let Some(timings) = timings {
        metrics::histogram!("superinfer_forward_duration").record(timings.forward_ns as f64 * 1e-9);
        let overhead = round_trip.as_secs_f64() - timings.total_ns as f64 * 1e-9;
        metrics::histogram!("superinfer_step_overhead_duration").record(overhead.max(0.0));
    }
}

pub(crate) fn record_turn(between_steps: Duration) {
    metrics::histogram!("superinfer_engine_turn_duration").record(between_steps.as_secs_f64());
}

/// Publishes the scheduler's gauges; counters advance by the difference to `previous`.
pub(crate) fn record_scheduler(stats: &SchedulerStats, previous: &SchedulerStats, requests: usize) {
    metrics::gauge!("superinfer_kv_device_blocks_free").set(f64::from(stats.device_blocks_free));
    metrics::gauge!("superinfer_kv_device_blocks_used").set(f64::from(stats.device_blocks_used));
    metrics::gauge!("superinfer_kv_device_blocks_cached").set(f64::from(stats.device_blocks_cached));
    metrics::gauge!("superinfer_kv_host_blocks_free").set(f64::from(stats.host_blocks_free));
    metrics::gauge!("superinfer_kv_host_blocks_used").set(f64::from(stats.host_blocks_used));
    metrics::gauge!("superinfer_queue_size").set(f64::from(stats.waiting));
    metrics::gauge!("superinfer_running_requests").set(f64::from(stats.running));
    metrics::gauge!("superinfer_rotated_requests").set(f64::from(stats.rotated));
    metrics::gauge!("superinfer_engine_requests").set(requests as f64);
    let delta = |now: u64, before: u64| now.saturating_sub(before);
    metrics::counter!("superinfer_rotations_out_total").increment(delta(stats.rotations_out, previous.rotations_out));
    metrics::counter!("superinfer_rotations_in_total").increment(delta(stats.rotations_in, previous.rotations_in));
    metrics::counter!("superinfer_recomputes_total").increment(delta(stats.recomputes, previous.recomputes));
}
