//! vLLM's Prometheus series, beside this server's own: routers, endpoint pickers and
//! autoscalers written for vLLM (vllm-router, the Gateway API Inference Extension, KEDA and HPA
//! recipes) read these names, so they see a replica's load and cache here unchanged. Names,
//! types and meanings follow vLLM's V1 engine; the mapping where this server differs:
//! - a preemption is a request leaving the device, rotated out to host memory or preempted for
//!   recomputation (vLLM counts both kinds of its own preemption the same way);
//! - KV-cache usage is the share of the device pool that requests hold; free blocks that still
//!   hold a reusable prefix count as free, as in vLLM;
//! - `finished_reason` is `stop` (EOS or a complete grammar), `length` or `abort` (the client
//!   went away);
//! - `vllm:lora_requests_info`'s running adapters are those of requests that have started
//!   (rotated out ones included: their adapter stays loaded), waiting ones those of requests not
//!   started yet, and `max_lora` the adapters served, all of which can run in one step.
use std::time::Duration;

use superinfer_scheduler::SchedulerStats;

use super::api::FinishReason;
use crate::metrics::{
    VLLM_E2E_HISTOGRAM as E2E_HISTOGRAM, VLLM_ITL_HISTOGRAM as ITL_HISTOGRAM, VLLM_QUEUE_HISTOGRAM as QUEUE_HISTOGRAM,
    VLLM_TPOT_HISTOGRAM as TPOT_HISTOGRAM, VLLM_TTFT_HISTOGRAM as TTFT_HISTOGRAM,
};

/// Describes the series and starts the counters at 0 (a counter that appears only when it first
/// moves has no rate until then).
pub(crate) fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_gauge!("vllm:num_requests_running", Unit::Count, "Requests in the model's batch (KV cache on the device)");
    describe_gauge!("vllm:num_requests_waiting", Unit::Count, "Requests waiting to be scheduled");
    describe_gauge!("vllm:kv_cache_usage_perc", "KV-cache usage: 1 means the device pool is full");
    describe_gauge!("vllm:lora_requests_info", "The LoRA adapters of running and waiting requests (labels); the value is when they were recorded (seconds since the epoch)");
    describe_gauge!("vllm:gpu_cache_usage_perc", "KV-cache usage (vLLM's older name of vllm:kv_cache_usage_perc)");
    // Counters carry `_total` in their names, as prometheus_client exposes vLLM's.
    describe_counter!("vllm:num_preemptions_total", Unit::Count, "Requests that left the device (rotated out or recomputed)");
    describe_counter!("vllm:prefix_cache_queries_total", Unit::Count, "Prompt tokens looked up in the prefix cache");
    describe_counter!("vllm:prefix_cache_hits_total", Unit::Count, "Prompt tokens found in the prefix cache");
    describe_counter!("vllm:prompt_tokens_total", Unit::Count, "Prompt tokens of finished requests");
    describe_counter!("vllm:generation_tokens_total", Unit::Count, "Generated tokens of finished requests");
    describe_counter!("vllm:request_success_total", Unit::Count, "Finished requests, by finished_reason");
    describe_histogram!(TTFT_HISTOGRAM, Unit::Seconds, "Time to first token");
    describe_histogram!(ITL_HISTOGRAM, Unit::Seconds, "Time between consecutive tokens");
    describe_histogram!(TPOT_HISTOGRAM, Unit::Seconds, "Time between consecutive tokens (older name)");
    describe_histogram!(E2E_HISTOGRAM, Unit::Seconds, "Arrival to the last token");
    describe_histogram!(QUEUE_HISTOGRAM, Unit::Seconds, "Arrival to the first step");
    for counter in ["vllm:num_preemptions_total", "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
        "vllm:prompt_tokens_total", "vllm:generation_tokens_total"]
    {
        metrics::counter!(counter).increment(0);
    }
    for reason in ["stop", "length", "abort"] {
        metrics::counter!("vllm:request_success_total", "finished_reason" => reason).increment(0);
    }
}

/// The scheduler's state after a step, and what moved since the previous one.
pub(crate) fn record_scheduler(stats: &SchedulerStats, previous: &SchedulerStats) {
    metrics::gauge!("vllm:num_requests_running").set(f64::from(stats.running));
    metrics::gauge!("vllm:num_requests_waiting").set(f64::from(stats.waiting));
    let usage = kv_cache_usage(stats);
    metrics::gauge!("vllm:kv_cache_usage_perc").set(usage);
    metrics::gauge!("vllm:gpu_cache_usage_perc").set(usage);
    let delta = |now: u64, before: u64| now.saturating_sub(before);
    let left_device = delta(stats.rotations_out, previous.rotations_out) + delta(stats.recomputes, previous.recomputes);
    metrics::counter!("vllm:num_preemptions_total").increment(left_device);
    metrics::counter!("vllm:prefix_cache_queries_total")
        .increment(delta(stats.prefix_cache_queried_tokens, previous.prefix_cache_queried_tokens));
    metrics::counter!("vllm:prefix_cache_hits_total").increment(delta(stats.prefix_cache_hit_tokens, previous.prefix_cache_hit_tokens));
}

/// vLLM's `vllm:lora_requests_info`: a series whose labels list the adapters of the requests
/// running and waiting (comma-separated, sorted) and `max_lora`, valued with the time it was
/// recorded; as with vLLM's, a reader takes the series with the latest value.
pub(crate) fn record_lora_info(running: &str, waiting: &str, max_lora: usize) {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_secs_f64();
    metrics::gauge!("vllm:lora_requests_info", "running_lora_adapters" => running.to_string(),
        "waiting_lora_adapters" => waiting.to_string(), "max_lora" => max_lora.to_string())
    .set(now);
}

/// Device blocks held by requests over the whole device pool (0 when the pool is empty).
pub(crate) fn kv_cache_usage(stats: &SchedulerStats) -> f64 {
    if stats.device_blocks_total == 0 {
        0.0
    } else {
        f64::from(stats.device_blocks_used) / f64::from(stats.device_blocks_total)
    }
}

pub(crate) fn record_first_token(since_arrival: Duration) {
    metrics::histogram!(TTFT_HISTOGRAM).record(since_arrival.as_secs_f64());
}

pub(crate) fn record_token_gap(gap_s: f64) {
    metrics::histogram!(ITL_HISTOGRAM).record(gap_s);
    metrics::histogram!(TPOT_HISTOGRAM).record(gap_s);
}

/// A request that generated to its end.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Finished {
    pub reason: FinishReason,
    pub end_to_end: Duration,
    /// Arrival to its first step; `None` if it never ran (it cannot finish then, but a
    /// request's record is read defensively).
    pub queued: Option<Duration>,
    pub prompt_tokens: u32,
    pub generated_tokens: u32,
}

pub(crate) fn record_finished(finished: &Finished) {
    let reason = match finished.reason {
        FinishReason::Length => "length",
        FinishReason::EosToken => "stop",
    };
    metrics::counter!("vllm:request_success_total", "finished_reason" => reason).increment(1);
    metrics::counter!("vllm:prompt_tokens_total").increment(u64::from(finished.prompt_tokens));
    metrics::counter!("vllm:generation_tokens_total").increment(u64::from(finished.generated_tokens));
    metrics::histogram!(E2E_HISTOGRAM).record(finished.end_to_end.as_secs_f64());
    if let Some(queued) = finished.queued {
        metrics::histogram!(QUEUE_HISTOGRAM).record(queued.as_secs_f64());
    }
}

/// A request whose client went away before it finished.
pub(crate) fn record_aborted() {
    metrics::counter!("vllm:request_success_total", "finished_reason" => "abort").increment(1);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::{prometheus_builder, MetricLimits};

    fn rendered(record: impl FnOnce()) -> String {
        let recorder = prometheus_builder(&MetricLimits::default()).expect("valid buckets").build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, record);
        handle.render()
    }

    fn value(text: &str, series: &str) -> Option<f64> {
        text.lines().find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')).and_then(|value| value.parse().ok())
    }

    #[test]
    fn vllms_names_carry_the_engines_state_as_vllm_means_it() {
        let first = SchedulerStats { running: 3, waiting: 2, device_blocks_total: 40, device_blocks_used: 10,
            device_blocks_free: 30, rotations_out: 2, recomputes: 1, prefix_cache_queried_tokens: 64,
            prefix_cache_hit_tokens: 32, ..Default::default() };
        let second = SchedulerStats { running: 4, waiting: 0, device_blocks_total: 40, device_blocks_used: 30,
            device_blocks_free: 10, rotations_out: 3, recomputes: 1, prefix_cache_queried_tokens: 96,
            prefix_cache_hit_tokens: 48, ..Default::default() };
        let text = rendered(|| {
            describe();
            record_scheduler(&first, &SchedulerStats::default());
            record_scheduler(&second, &first);
            record_first_token(Duration::from_millis(300));
            record_token_gap(0.05);
            record_finished(&Finished { reason: FinishReason::EosToken, end_to_end: Duration::from_secs(2),
                queued: Some(Duration::from_millis(10)), prompt_tokens: 7, generated_tokens: 5 });
            record_finished(&Finished { reason: FinishReason::Length, end_to_end: Duration::from_secs(1),
                queued: None, prompt_tokens: 3, generated_tokens: 2 });
            record_aborted();
            record_lora_info("chat,sql", "", 3);
        });
        // Colons are part of vLLM's names and survive the exposition.
        assert_eq!(value(&text, "vllm:num_requests_running"), Some(4.0), "{text}");
        let lora = text.lines().find(|line| line.starts_with("vllm:lora_requests_info{")).expect("the LoRA series");
        for label in ["running_lora_adapters=\"chat,sql\"", "waiting_lora_adapters=\"\"", "max_lora=\"3\""] {
            assert!(lora.contains(label), "{lora}");
        }
        let recorded: f64 = lora.rsplit(' ').next().unwrap().parse().unwrap();
        assert!(recorded > 1.7e9, "a time, in seconds since the epoch: {lora}");
        assert_eq!(value(&text, "vllm:num_requests_waiting"), Some(0.0));
        assert_eq!(value(&text, "vllm:kv_cache_usage_perc"), Some(0.75));
        assert_eq!(value(&text, "vllm:gpu_cache_usage_perc"), Some(0.75));
        assert_eq!(value(&text, "vllm:num_preemptions_total"), Some(4.0), "{text}");
        assert_eq!(value(&text, "vllm:prefix_cache_queries_total"), Some(96.0));
        assert_eq!(value(&text, "vllm:prefix_cache_hits_total"), Some(48.0));
        assert_eq!(value(&text, "vllm:prompt_tokens_total"), Some(10.0));
        assert_eq!(value(&text, "vllm:generation_tokens_total"), Some(7.0));
        for (reason, count) in [("stop", 1.0), ("length", 1.0), ("abort", 1.0)] {
            assert_eq!(value(&text, &format!("vllm:request_success_total{{finished_reason=\"{reason}\"}}")), Some(count));
        }
        assert_eq!(value(&text, "vllm:time_to_first_token_seconds_count"), Some(1.0));
        assert_eq!(value(&text, "vllm:inter_token_latency_seconds_count"), Some(1.0));
        assert_eq!(value(&text, "vllm:time_per_output_token_seconds_count"), Some(1.0));
        assert_eq!(value(&text, "vllm:e2e_request_latency_seconds_count"), Some(2.0));
        assert_eq!(value(&text, "vllm:request_queue_time_seconds_count"), Some(1.0));
        assert!(!text.contains("quantile="), "every histogram has buckets: {text}");
    }
}
