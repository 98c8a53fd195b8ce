//! The engine's metrics (the `metrics` facade; the HTTP layer installs the Prometheus
//! recorder and serves /metrics). Names are the stable public contract of dashboards.
use std::time::Duration;

use superinfer_scheduler::{SchedulerStats, StepPlan};

use super::attainment::Attainment;
use crate::metrics::LAG_HISTOGRAM;
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
    describe_counter!("superinfer_step_model_microseconds_total", Unit::Microseconds,
        "Step time the warm-up cost model predicts (before online correction), summed over steps");
    describe_counter!("superinfer_step_shard_microseconds_total", Unit::Microseconds,
        "Step time the shard measured, summed over the same steps (ratio: how far load moves the model)");
    describe_histogram!("superinfer_forward_duration", Unit::Seconds, "Model forward pass per step");
    describe_histogram!("superinfer_step_overhead_duration", Unit::Seconds, "Step round trip minus the shard's own time");
    describe_histogram!("superinfer_engine_turn_duration", Unit::Seconds,
        "Engine time between back-to-back steps (commands, plan, request building, postprocessing)");
    describe_counter!("superinfer_steps_total", "Steps executed");
    describe_counter!("superinfer_rotations_out_total", "Requests rotated or swapped out to host memory");
    describe_counter!("superinfer_rotations_in_total", "Requests brought back to the device");
    describe_counter!("superinfer_recomputes_total", "Requests preempted for recomputation");
    describe_counter!("superinfer_engine_failures_total", "Shard failures seen by the engine");
    describe_counter!("superinfer_kv_bytes_out_total", Unit::Bytes, "KV cache bytes copied from device to host");
    describe_counter!("superinfer_kv_bytes_in_total", Unit::Bytes, "KV cache bytes copied from host to device");
    describe_histogram!(LAG_HISTOGRAM, Unit::Seconds,
        "Virtual lag of each produced token: production time minus its deadline (positive: late)");
    describe_counter!("superinfer_slo_ttft_met_total", "Finished requests whose first token met the TTFT objective");
    describe_counter!("superinfer_slo_ttft_missed_total", "Finished requests whose first token missed the TTFT objective");
    describe_counter!("superinfer_slo_tbt_met_total",
        "Finished requests whose p90 time between tokens met the TBT objective");
    describe_counter!("superinfer_slo_tbt_missed_total",
        "Finished requests whose p90 time between tokens missed the TBT objective");
}

/// `correction`: the scheduler's online factor already in `plan.predicted_step_s`.
pub(crate) fn record_step(plan: &StepPlan, round_trip: Duration, timings: Option<&pb::StepTimings>, correction: f64) {
    metrics::counter!("superinfer_steps_total").increment(1);
    metrics::histogram!("superinfer_batch_size").record(plan.scheduled.len() as f64);
    metrics::histogram!("superinfer_batch_tokens").record(plan.num_batched_tokens() as f64);
    metrics::histogram!("superinfer_step_duration").record(round_trip.as_secs_f64());
    if let Some(timings) = timings {
        if !plan.scheduled.is_empty() && correction > 0.0 {
            metrics::counter!("superinfer_step_model_microseconds_total")
                .increment((plan.predicted_step_s / correction * 1e6) as u64);
            metrics::counter!("superinfer_step_shard_microseconds_total").increment(timings.total_ns / 1000);
        }
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
    metrics::counter!("superinfer_kv_bytes_out_total").increment(delta(stats.bytes_out, previous.bytes_out));
    metrics::counter!("superinfer_kv_bytes_in_total").increment(delta(stats.bytes_in, previous.bytes_in));
}

/// Lag samples (seconds, positive: late) the scheduler recorded since the last call.
pub(crate) fn record_lags(samples: &[f64]) {
    let histogram = metrics::histogram!(LAG_HISTOGRAM);
    for &lag in samples {
        histogram.record(lag);
    }
}

/// A finished request's verdict on each of its objectives.
pub(crate) fn record_attainment(attainment: Attainment) {
    let ttft = if attainment.ttft_met { "superinfer_slo_ttft_met_total" } else { "superinfer_slo_ttft_missed_total" };
    let tbt = if attainment.tbt_met { "superinfer_slo_tbt_met_total" } else { "superinfer_slo_tbt_missed_total" };
    metrics::counter!(ttft).increment(1);
    metrics::counter!(tbt).increment(1);
}

#[cfg(test)]
mod tests {
    use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};

    use super::*;
    use crate::metrics::LAG_BUCKETS;

    /// Renders what `record` recorded, into a recorder of its own (tests run in parallel).
    fn rendered(record: impl FnOnce()) -> String {
        let recorder = PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Full(LAG_HISTOGRAM.into()), &LAG_BUCKETS)
            .expect("valid buckets")
            .build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, record);
        handle.render()
    }

    fn value(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
            .and_then(|value| value.parse().ok())
    }

    #[test]
    fn transfer_counters_advance_by_the_difference_and_pools_are_gauges() {
        let first = SchedulerStats { bytes_out: 4096, bytes_in: 1024, rotations_out: 2, host_blocks_used: 3, ..Default::default() };
        let second = SchedulerStats { bytes_out: 6144, bytes_in: 5120, rotations_out: 2, rotations_in: 1, host_blocks_used: 1,
            ..Default::default() };
        let text = rendered(|| {
            record_scheduler(&first, &SchedulerStats::default(), 2);
            record_scheduler(&second, &first, 2);
        });
        assert_eq!(value(&text, "superinfer_kv_bytes_out_total"), Some(6144.0));
        assert_eq!(value(&text, "superinfer_kv_bytes_in_total"), Some(5120.0));
        assert_eq!(value(&text, "superinfer_rotations_out_total"), Some(2.0));
        assert_eq!(value(&text, "superinfer_rotations_in_total"), Some(1.0));
        assert_eq!(value(&text, "superinfer_kv_host_blocks_used"), Some(1.0));
    }

    #[test]
    fn lags_fill_a_histogram_that_separates_early_from_late() {
        let text = rendered(|| record_lags(&[-0.3, -0.004, 0.015, 3.0]));
        let bucket = |le: &str| value(&text, &format!("{LAG_HISTOGRAM}_bucket{{le=\"{le}\"}}"));
        assert_eq!(bucket("-0.2"), Some(1.0));
        assert_eq!(bucket("0"), Some(2.0));
        assert_eq!(bucket("0.02"), Some(3.0));
        assert_eq!(bucket("+Inf"), Some(4.0));
        assert_eq!(value(&text, &format!("{LAG_HISTOGRAM}_count")), Some(4.0));
    }

    #[test]
    fn attainment_counts_each_objective_separately() {
        let text = rendered(|| {
            record_attainment(Attainment { ttft_met: true, tbt_met: false });
            record_attainment(Attainment { ttft_met: true, tbt_met: true });
            record_attainment(Attainment { ttft_met: false, tbt_met: true });
        });
        assert_eq!(value(&text, "superinfer_slo_ttft_met_total"), Some(2.0));
        assert_eq!(value(&text, "superinfer_slo_ttft_missed_total"), Some(1.0));
        assert_eq!(value(&text, "superinfer_slo_tbt_met_total"), Some(2.0));
        assert_eq!(value(&text, "superinfer_slo_tbt_missed_total"), Some(1.0));
    }
}
