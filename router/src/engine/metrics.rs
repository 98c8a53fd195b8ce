//! The engine's metrics (the `metrics` facade; start-up installs the Prometheus recorder, the
//! HTTP layer serves /metrics). Names are the stable public contract of dashboards
//! (docs/metrics.md); the `tgi_*` series are TGI's names for what TGI measures, so TGI's
//! dashboard reads this server too.
use std::time::Duration;

use superinfer_scheduler::{SchedulerStats, StepPlan};

use superinfer_scheduler::attainment::Attainment;
use crate::metrics::{
    BATCH_SIZE_HISTOGRAM, BATCH_TOKENS_HISTOGRAM, GRAMMAR_MASK_HISTOGRAM, GRAMMAR_STEP_MASK_HISTOGRAM, ITL_HISTOGRAM, LAG_HISTOGRAM, TGI_BATCH_NEXT_SIZE_HISTOGRAM,
    TTFT_HISTOGRAM,
};
use crate::pb;

/// Describes the engine's series, and starts its counters at 0: a counter that appears only
/// when it first moves has no rate until then, and a ratio of two (met / (met + missed)) has
/// no value while either is missing.
pub(crate) fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    for counter in ATTAINMENT_COUNTERS.iter().flatten().chain(&["superinfer_admission_refused_total", "superinfer_queue_timeouts_total"]) {
        metrics::counter!(*counter, "priority" => "0").increment(0);
    }
    for counter in ["superinfer_engine_failures_total", "superinfer_steps_total"] {
        metrics::counter!(counter).increment(0);
    }
    describe_gauge!("superinfer_kv_device_blocks_free", "Free device KV blocks");
    describe_gauge!("superinfer_kv_device_blocks_used", "Device KV blocks held by requests");
    describe_gauge!("superinfer_kv_device_blocks_cached", "Free device KV blocks holding a reusable prefix");
    describe_gauge!("superinfer_kv_host_blocks_free", "Free host KV blocks");
    describe_gauge!("superinfer_kv_host_blocks_used", "Host KV blocks held by rotated-out requests");
    describe_gauge!("superinfer_kv_host_blocks_mirrored",
        "Host KV blocks keeping a copy of a returned request's sealed blocks (counted free; given up when a copy out needs room)");
    describe_gauge!("superinfer_queue_size", "Requests waiting for device KV blocks");
    describe_gauge!("superinfer_running_requests", "Requests with their KV cache on the device");
    describe_gauge!("superinfer_rotated_requests", "Requests with their KV cache in host memory");
    describe_gauge!("superinfer_engine_requests", "Requests the engine holds (any phase)");
    describe_histogram!(BATCH_SIZE_HISTOGRAM, Unit::Count, "Requests computed per step");
    describe_histogram!(GRAMMAR_MASK_HISTOGRAM, Unit::Seconds,
        "Time to compute one constrained request's allowed-token mask for one step");
    describe_histogram!(GRAMMAR_STEP_MASK_HISTOGRAM, Unit::Seconds,
        "Time an engine turn spent computing the masks of every constrained request of its step");
    describe_histogram!(BATCH_TOKENS_HISTOGRAM, Unit::Count, "Tokens computed per step");
    describe_histogram!(TTFT_HISTOGRAM, Unit::Seconds,
        "Time from a request's arrival to its first token, when the step that produced it returned");
    describe_histogram!(ITL_HISTOGRAM, Unit::Seconds,
        "Time between consecutive tokens of one request, when the steps that produced them returned");
    describe_gauge!("tgi_queue_size", Unit::Count, "Requests waiting for device KV blocks");
    describe_gauge!("tgi_batch_current_size", Unit::Count, "Requests with their KV cache on the device");
    describe_gauge!("tgi_batch_current_max_tokens", Unit::Count,
        "KV positions the latest step's requests hold (prompt and generated tokens)");
    describe_histogram!(TGI_BATCH_NEXT_SIZE_HISTOGRAM, Unit::Count, "Requests a step starts (admitted for the first time)");
    describe_histogram!("tgi_batch_inference_duration", Unit::Seconds,
        "Step round trip, by method (prefill: the step computes a prompt; decode: only decodes)");
    describe_histogram!("tgi_batch_forward_duration", Unit::Seconds, "Model forward pass per step, by method");
    describe_counter!("tgi_batch_inference_success", Unit::Count, "Steps the shard completed, by method");
    describe_histogram!("superinfer_step_duration", Unit::Seconds, "Step RPC round trip");
    describe_counter!("superinfer_step_model_microseconds_total", Unit::Microseconds,
        "Step time the warm-up cost model predicts (before online correction), summed over steps");
    describe_counter!("superinfer_step_shard_microseconds_total", Unit::Microseconds,
        "Step time the shard measured, summed over the same steps (ratio: how far load moves the model)");
    describe_histogram!("superinfer_forward_duration", Unit::Seconds, "Model forward pass per step");
    describe_histogram!("superinfer_sampling_duration", Unit::Seconds,
        "Sampling per step on the shard (grammar masks, penalties, warpers, logprobs)");
    describe_histogram!("superinfer_step_overhead_duration", Unit::Seconds, "Step round trip minus the shard's own time");
    describe_histogram!("superinfer_engine_turn_duration", Unit::Seconds,
        "Engine time between back-to-back steps (commands, plan, request building, postprocessing)");
    describe_counter!("superinfer_steps_total", "Steps executed");
    describe_counter!("superinfer_rotations_out_total", "Requests rotated out to host memory (rotasched or the swap policy)");
    describe_counter!("superinfer_rotations_in_total", "Requests brought back to the device");
    describe_counter!("superinfer_rotations_in_computed_total",
        "Returns computed in the step that copies them back (of superinfer_rotations_in_total)");
    describe_counter!("superinfer_rotations_out_after_compute_total",
        "Rotations out of a request computing in the same step, copied after that compute (of superinfer_rotations_out_total)");
    describe_counter!("superinfer_recomputes_total", "Requests preempted for recomputation");
    describe_counter!("superinfer_engine_failures_total", "Shard failures seen by the engine");
    describe_counter!("superinfer_prefix_cache_queried_tokens_total",
        "Prompt tokens looked up in the prefix cache at admission");
    describe_counter!("superinfer_prefix_cache_hit_tokens_total",
        "Prompt tokens whose KV the prefix cache held at admission (not computed again)");
    describe_counter!("superinfer_kv_bytes_out_total", Unit::Bytes, "KV cache bytes copied from device to host");
    describe_counter!("superinfer_kv_bytes_in_total", Unit::Bytes, "KV cache bytes copied from host to device");
    describe_counter!("superinfer_kv_blocks_out_mirrored_total",
        "KV blocks rotated out without a copy: the host kept an identical copy from their last rotation in");
    describe_histogram!(LAG_HISTOGRAM, Unit::Seconds,
        "Virtual lag of each produced token: production time minus its deadline (positive: late)");
    describe_counter!("superinfer_slo_ttft_met_total", "Finished requests whose first token met the TTFT objective");
    describe_counter!("superinfer_slo_ttft_missed_total", "Finished requests whose first token missed the TTFT objective");
    describe_counter!("superinfer_slo_tbt_met_total",
        "Finished requests whose gaps between tokens met the TBT objective at the configured percentile (--tbt-slo-percentile)");
    describe_counter!("superinfer_slo_tbt_missed_total",
        "Finished requests whose gaps between tokens missed the TBT objective at the configured percentile (--tbt-slo-percentile)");
    describe_counter!("superinfer_slo_stall_met_total", "Finished requests none of whose gaps between tokens exceeded their stall bound");
    describe_counter!("superinfer_slo_stall_missed_total", "Finished requests with a gap between tokens above their stall bound");
    describe_counter!("superinfer_slo_joint_met_total", "Finished requests that met both their TTFT and TBT objectives (goodput)");
    describe_counter!("superinfer_slo_joint_missed_total", "Finished requests that missed their TTFT or TBT objective");
    describe_gauge!("superinfer_slo_joint_attainment_recent",
        "Share of the requests finished in the last minute that met both their TTFT and TBT objectives (1 when none finished)");
    describe_counter!("superinfer_admission_refused_total",
        "Requests refused with 429 because their first token was predicted past its objective (--admission slo)");
    describe_gauge!("superinfer_lora_adapters_loaded", "LoRA adapters served now");
    describe_counter!("superinfer_lora_adapter_evictions_total",
        "LoRA adapters --lora-resolver-dir loaded that --max-loras took out of service to make room for another");
    metrics::counter!("superinfer_lora_adapter_evictions_total").increment(0);
    describe_counter!("superinfer_queue_timeouts_total",
        "Queued requests failed because they waited past their first-token deadline by more than --queue-timeout-ms");
}

/// The attainment counters, (met, missed) per objective: TTFT, TBT (stall bound included),
/// the stall bound alone, and both objectives together.
const ATTAINMENT_COUNTERS: [[&str; 2]; 4] = [
    ["superinfer_slo_ttft_met_total", "superinfer_slo_ttft_missed_total"],
    ["superinfer_slo_tbt_met_total", "superinfer_slo_tbt_missed_total"],
    ["superinfer_slo_stall_met_total", "superinfer_slo_stall_missed_total"],
    ["superinfer_slo_joint_met_total", "superinfer_slo_joint_missed_total"],
];

/// `correction`: the scheduler's online factor already in `plan.predicted_step_s`.
pub(crate) fn record_step(plan: &StepPlan, round_trip: Duration, timings: Option<&pb::StepTimings>, correction: f64) {
    metrics::counter!("superinfer_steps_total").increment(1);
    metrics::histogram!(BATCH_SIZE_HISTOGRAM).record(plan.scheduled.len() as f64);
    metrics::histogram!(BATCH_TOKENS_HISTOGRAM).record(plan.num_batched_tokens() as f64);
    metrics::histogram!("superinfer_step_duration").record(round_trip.as_secs_f64());
    if let Some(timings) = timings {
        if !plan.scheduled.is_empty() && correction > 0.0 {
            metrics::counter!("superinfer_step_model_microseconds_total")
                .increment((plan.predicted_step_s / correction * 1e6) as u64);
            metrics::counter!("superinfer_step_shard_microseconds_total").increment(timings.total_ns / 1000);
        }
        metrics::histogram!("superinfer_forward_duration").record(timings.forward_ns as f64 * 1e-9);
        metrics::histogram!("superinfer_sampling_duration").record(timings.sampling_ns as f64 * 1e-9);
        let overhead = round_trip.as_secs_f64() - timings.total_ns as f64 * 1e-9;
        metrics::histogram!("superinfer_step_overhead_duration").record(overhead.max(0.0));
    }
    record_tgi_step(plan, round_trip, timings);
}

/// TGI's batch series. TGI runs prefill and decode as separate calls; here one step may mix
/// both, so a step that computes a prompt counts as `prefill` (it decides the first token's
/// latency) and one that only decodes as `decode`. Steps that only move KV are not batches.
fn record_tgi_step(plan: &StepPlan, round_trip: Duration, timings: Option<&pb::StepTimings>) {
    if plan.scheduled.is_empty() {
        return;
    }
    let method = step_method(plan);
    let held_tokens: u64 = plan.scheduled.iter().map(|entry| u64::from(entry.end_position())).sum();
    metrics::gauge!("tgi_batch_current_max_tokens").set(held_tokens as f64);
    if !plan.first_scheduled.is_empty() {
        metrics::histogram!(TGI_BATCH_NEXT_SIZE_HISTOGRAM).record(plan.first_scheduled.len() as f64);
    }
    metrics::counter!("tgi_batch_inference_success", "method" => method).increment(1);
    metrics::histogram!("tgi_batch_inference_duration", "method" => method).record(round_trip.as_secs_f64());
    if let Some(timings) = timings {
        metrics::histogram!("tgi_batch_forward_duration", "method" => method).record(timings.forward_ns as f64 * 1e-9);
    }
}

/// `prefill` when the step starts a request or computes more than one position of one (a
/// prompt chunk), else `decode`.
fn step_method(plan: &StepPlan) -> &'static str {
    let computes_prompt =
        !plan.first_scheduled.is_empty() || plan.scheduled.iter().any(|entry| entry.num_new_tokens > 1);
    if computes_prompt {
        "prefill"
    } else {
        "decode"
    }
}

/// One constrained request's mask took `elapsed`.
pub(crate) fn record_grammar_mask(elapsed: Duration) {
    metrics::histogram!(GRAMMAR_MASK_HISTOGRAM).record(elapsed.as_secs_f64());
}

/// Every mask of one step took `elapsed` together.
pub(crate) fn record_grammar_step_masks(elapsed: Duration) {
    metrics::histogram!(GRAMMAR_STEP_MASK_HISTOGRAM).record(elapsed.as_secs_f64());
}

/// A request's first token was produced `since_arrival` after the HTTP layer received it.
pub(crate) fn record_first_token(since_arrival: Duration) {
    metrics::histogram!(TTFT_HISTOGRAM).record(since_arrival.as_secs_f64());
}

/// A request's token was produced `gap_s` seconds after its previous one.
pub(crate) fn record_token_gap(gap_s: f64) {
    metrics::histogram!(ITL_HISTOGRAM).record(gap_s);
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
    metrics::gauge!("superinfer_kv_host_blocks_mirrored").set(f64::from(stats.host_blocks_mirrored));
    metrics::gauge!("superinfer_queue_size").set(f64::from(stats.waiting));
    metrics::gauge!("tgi_queue_size").set(f64::from(stats.waiting));
    metrics::gauge!("tgi_batch_current_size").set(f64::from(stats.running));
    if stats.running == 0 {
        // No request on the device: the current batch holds nothing (set per step otherwise).
        metrics::gauge!("tgi_batch_current_max_tokens").set(0.0);
    }
    metrics::gauge!("superinfer_running_requests").set(f64::from(stats.running));
    metrics::gauge!("superinfer_rotated_requests").set(f64::from(stats.rotated));
    metrics::gauge!("superinfer_engine_requests").set(requests as f64);
    let delta = |now: u64, before: u64| now.saturating_sub(before);
    metrics::counter!("superinfer_rotations_out_total").increment(delta(stats.rotations_out, previous.rotations_out));
    metrics::counter!("superinfer_rotations_in_total").increment(delta(stats.rotations_in, previous.rotations_in));
    metrics::counter!("superinfer_rotations_in_computed_total")
        .increment(delta(stats.rotations_in_computed, previous.rotations_in_computed));
    metrics::counter!("superinfer_rotations_out_after_compute_total")
        .increment(delta(stats.rotations_out_after_compute, previous.rotations_out_after_compute));
    metrics::counter!("superinfer_recomputes_total").increment(delta(stats.recomputes, previous.recomputes));
    metrics::counter!("superinfer_kv_bytes_out_total").increment(delta(stats.bytes_out, previous.bytes_out));
    metrics::counter!("superinfer_kv_bytes_in_total").increment(delta(stats.bytes_in, previous.bytes_in));
    metrics::counter!("superinfer_kv_blocks_out_mirrored_total")
        .increment(delta(stats.blocks_out_mirrored, previous.blocks_out_mirrored));
    metrics::counter!("superinfer_prefix_cache_queried_tokens_total")
        .increment(delta(stats.prefix_cache_queried_tokens, previous.prefix_cache_queried_tokens));
    metrics::counter!("superinfer_prefix_cache_hit_tokens_total")
        .increment(delta(stats.prefix_cache_hit_tokens, previous.prefix_cache_hit_tokens));
}

/// Lag samples (seconds, positive: late) the scheduler recorded since the last call.
pub(crate) fn record_lags(samples: &[f64]) {
    let histogram = metrics::histogram!(LAG_HISTOGRAM);
    for &lag in samples {
        histogram.record(lag);
    }
}

/// A finished request's verdict on each of its objectives, labelled by its priority class.
pub(crate) fn record_attainment(attainment: Attainment, priority: i32) {
    let verdicts = [attainment.ttft_met, attainment.tbt_met, attainment.stall_met, attainment.joint()];
    for (met, [met_name, missed_name]) in verdicts.into_iter().zip(ATTAINMENT_COUNTERS) {
        let name = if met { met_name } else { missed_name };
        metrics::counter!(name, "priority" => priority.to_string()).increment(1);
    }
}

/// The share of the last minute's finished requests that met both objectives (1 when none
/// finished): a replica's current attainment, for autoscalers and routers' scorers.
pub(crate) fn record_recent_attainment(share: f64) {
    metrics::gauge!("superinfer_slo_joint_attainment_recent").set(share);
}

/// A request refused by SLO admission.
pub(crate) fn record_admission_refused(priority: i32) {
    metrics::counter!("superinfer_admission_refused_total", "priority" => priority.to_string()).increment(1);
}

/// A queued request failed by the queue time-out.
pub(crate) fn record_queue_timeout(priority: i32) {
    metrics::counter!("superinfer_queue_timeouts_total", "priority" => priority.to_string()).increment(1);
}

#[cfg(test)]
mod tests {
    use superinfer_scheduler::ScheduledEntry;

    use super::*;
    use crate::metrics::{prometheus_builder, request_succeeded, MetricLimits, RequestFigures};

    /// Renders what `record` recorded, into a recorder of its own (tests run in parallel) with
    /// the server's buckets for `limits`.
    fn rendered_with(limits: &MetricLimits, record: impl FnOnce()) -> String {
        let recorder = prometheus_builder(limits).expect("valid buckets").build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, record);
        handle.render()
    }

    fn rendered(record: impl FnOnce()) -> String {
        rendered_with(&MetricLimits::default(), record)
    }

    fn entry(id: u64, num_computed_tokens: u32, num_new_tokens: u32) -> ScheduledEntry {
        ScheduledEntry { id, num_computed_tokens, num_new_tokens, block_table: vec![0] }
    }

    fn timings() -> pb::StepTimings {
        pb::StepTimings { forward_ns: 3_000_000, total_ns: 4_000_000, ..Default::default() }
    }

    #[test]
    fn every_histogram_is_exported_with_buckets() {
        let plan = StepPlan { scheduled: vec![entry(1, 0, 7)], first_scheduled: vec![1], ..Default::default() };
        let text = rendered(|| {
            record_step(&plan, Duration::from_millis(5), Some(&timings()), 1.0);
            record_turn(Duration::from_micros(300));
            record_lags(&[0.01]);
            record_first_token(Duration::from_millis(120));
            record_token_gap(0.03);
            request_succeeded(&RequestFigures {
                total: Duration::from_millis(200),
                validation: Duration::from_millis(1),
                queue: Duration::from_millis(2),
                inference: Duration::from_millis(190),
                input_length: 7,
                generated_tokens: 3,
                max_new_tokens: 3,
            });
        });
        // A histogram without buckets would be exported as a summary, with quantile lines.
        assert!(!text.contains("quantile="), "{text}");
        let histograms = text.lines().filter(|line| line.starts_with("# TYPE") && line.ends_with(" histogram")).count();
        // Ours: batch size and tokens, step, forward, sampling, overhead, turn, lag, TTFT, gap;
        // TGI's batch size, inference and forward; the 8 request histograms under both prefixes.
        assert_eq!(histograms, 10 + 3 + 16, "{text}");
    }

    #[test]
    fn first_tokens_and_gaps_fill_buckets_around_their_objectives() {
        let limits = MetricLimits { ttft_objective_s: 1.0, tbt_objective_s: 0.1, ..MetricLimits::default() };
        let text = rendered_with(&limits, || {
            record_first_token(Duration::from_millis(950));
            record_first_token(Duration::from_millis(1050));
            for gap_s in [0.085, 0.095, 0.105, 0.4] {
                record_token_gap(gap_s);
            }
        });
        let ttft = |le: &str| value(&text, &format!("{TTFT_HISTOGRAM}_bucket{{le=\"{le}\"}}"));
        assert_eq!(ttft("0.9"), Some(0.0));
        assert_eq!(ttft("1"), Some(1.0));
        assert_eq!(ttft("1.1"), Some(2.0));
        let gap = |le: &str| value(&text, &format!("{ITL_HISTOGRAM}_bucket{{le=\"{le}\"}}"));
        assert_eq!(gap("0.09"), Some(1.0));
        assert_eq!(gap("0.1"), Some(2.0));
        assert_eq!(gap("0.11"), Some(3.0));
        assert_eq!(gap("0.5"), Some(4.0));
        assert_eq!(value(&text, &format!("{ITL_HISTOGRAM}_count")), Some(4.0));
    }

    #[test]
    fn tgi_batch_series_tell_prefill_from_decode() {
        // A prompt chunk beside a decode: prefill. Then two decodes.
        let prefill = StepPlan { scheduled: vec![entry(1, 10, 1), entry(2, 0, 20)], first_scheduled: vec![2],
            ..Default::default() };
        let decode = StepPlan { scheduled: vec![entry(1, 11, 1), entry(2, 20, 1)], ..Default::default() };
        let transfer_only = StepPlan::default();
        let running = SchedulerStats { running: 2, waiting: 3, ..Default::default() };
        let text = rendered(|| {
            record_step(&prefill, Duration::from_millis(8), Some(&timings()), 1.0);
            record_step(&decode, Duration::from_millis(4), Some(&timings()), 1.0);
            record_step(&transfer_only, Duration::from_millis(1), None, 1.0);
            record_scheduler(&running, &SchedulerStats::default(), 5);
        });
        assert_eq!(value(&text, "tgi_batch_inference_success{method=\"prefill\"}"), Some(1.0));
        assert_eq!(value(&text, "tgi_batch_inference_success{method=\"decode\"}"), Some(1.0));
        assert_eq!(value(&text, "tgi_batch_inference_duration_count{method=\"decode\"}"), Some(1.0));
        assert_eq!(value(&text, "tgi_batch_forward_duration_count{method=\"prefill\"}"), Some(1.0));
        assert_eq!(value(&text, "tgi_batch_next_size_count"), Some(1.0));
        // The last batch holds 12 + 21 positions.
        assert_eq!(value(&text, "tgi_batch_current_max_tokens"), Some(33.0));
        assert_eq!(value(&text, "tgi_batch_current_size"), Some(2.0));
        assert_eq!(value(&text, "tgi_queue_size"), Some(3.0));
        let idle = rendered(|| {
            record_step(&decode, Duration::from_millis(4), None, 1.0);
            record_scheduler(&SchedulerStats::default(), &running, 0);
        });
        assert_eq!(value(&idle, "tgi_batch_current_max_tokens"), Some(0.0));
        assert_eq!(value(&idle, "tgi_batch_current_size"), Some(0.0));
    }

    fn value(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
            .and_then(|value| value.parse().ok())
    }

    #[test]
    fn transfer_counters_advance_by_the_difference_and_pools_are_gauges() {
        let first = SchedulerStats { bytes_out: 4096, bytes_in: 1024, rotations_out: 2, host_blocks_used: 3,
            rotations_out_after_compute: 1, prefix_cache_queried_tokens: 40, prefix_cache_hit_tokens: 32, ..Default::default() };
        let second = SchedulerStats { bytes_out: 6144, bytes_in: 5120, rotations_out: 2, rotations_in: 1, host_blocks_used: 1,
            rotations_in_computed: 1, rotations_out_after_compute: 1, prefix_cache_queried_tokens: 50, prefix_cache_hit_tokens: 32,
            blocks_out_mirrored: 3, host_blocks_mirrored: 2, ..Default::default() };
        let text = rendered(|| {
            record_scheduler(&first, &SchedulerStats::default(), 2);
            record_scheduler(&second, &first, 2);
        });
        assert_eq!(value(&text, "superinfer_kv_bytes_out_total"), Some(6144.0));
        assert_eq!(value(&text, "superinfer_kv_bytes_in_total"), Some(5120.0));
        assert_eq!(value(&text, "superinfer_rotations_out_total"), Some(2.0));
        assert_eq!(value(&text, "superinfer_rotations_in_total"), Some(1.0));
        assert_eq!(value(&text, "superinfer_rotations_in_computed_total"), Some(1.0));
        assert_eq!(value(&text, "superinfer_rotations_out_after_compute_total"), Some(1.0));
        assert_eq!(value(&text, "superinfer_kv_host_blocks_used"), Some(1.0));
        assert_eq!(value(&text, "superinfer_kv_host_blocks_mirrored"), Some(2.0));
        assert_eq!(value(&text, "superinfer_kv_blocks_out_mirrored_total"), Some(3.0));
        assert_eq!(value(&text, "superinfer_prefix_cache_queried_tokens_total"), Some(50.0));
        assert_eq!(value(&text, "superinfer_prefix_cache_hit_tokens_total"), Some(32.0));
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
    fn attainment_counts_each_objective_separately_by_priority_class() {
        let verdict = |ttft_met, tbt_met, stall_met| Attainment { ttft_met, tbt_met, stall_met };
        let text = rendered(|| {
            record_attainment(verdict(true, false, false), 0);
            record_attainment(verdict(true, true, true), 0);
            record_attainment(verdict(false, true, true), 0);
            record_attainment(verdict(true, true, true), 2);
        });
        let zero = |name: &str| value(&text, &format!("{name}{{priority=\"0\"}}"));
        assert_eq!(zero("superinfer_slo_ttft_met_total"), Some(2.0));
        assert_eq!(zero("superinfer_slo_ttft_missed_total"), Some(1.0));
        assert_eq!(zero("superinfer_slo_tbt_met_total"), Some(2.0));
        assert_eq!(zero("superinfer_slo_tbt_missed_total"), Some(1.0));
        assert_eq!(zero("superinfer_slo_stall_missed_total"), Some(1.0));
        assert_eq!(zero("superinfer_slo_joint_met_total"), Some(1.0));
        assert_eq!(zero("superinfer_slo_joint_missed_total"), Some(2.0));
        assert_eq!(value(&text, "superinfer_slo_joint_met_total{priority=\"2\"}"), Some(1.0));
    }
}
