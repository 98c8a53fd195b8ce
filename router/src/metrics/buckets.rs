//! Histogram buckets, derived from the server's limits. Prometheus only knows a histogram's
//! buckets, so they decide what a dashboard can read from it: `histogram_quantile` interpolates
//! linearly inside a bucket and cannot see past the last finite one. Latencies therefore get
//! fine buckets around their objective (where "met or missed" is decided) and reach the longest
//! value the limits allow; token counts reach the longest sequence the server accepts. Every
//! histogram the router records is in `histogram_buckets`, so none is exported as a summary.
use metrics_exporter_prometheus::Matcher;

use super::{
    BATCH_SIZE_HISTOGRAM, BATCH_TOKENS_HISTOGRAM, GRAMMAR_MASK_HISTOGRAM, GRAMMAR_STEP_MASK_HISTOGRAM, ITL_HISTOGRAM, LAG_BUCKETS, LAG_HISTOGRAM, PREFIXES,
    TGI_BATCH_NEXT_SIZE_HISTOGRAM, TTFT_HISTOGRAM, VLLM_E2E_HISTOGRAM, VLLM_ITL_HISTOGRAM, VLLM_QUEUE_HISTOGRAM,
    VLLM_TPOT_HISTOGRAM, VLLM_TTFT_HISTOGRAM,
};

/// The limits the buckets are derived from; `server::start_engine` fills them from the flags
/// and what the shard reported, before anything is recorded.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MetricLimits {
    /// The server's default time-to-first-token objective, in seconds.
    pub ttft_objective_s: f64,
    /// The server's default time-between-tokens objective, in seconds.
    pub tbt_objective_s: f64,
    /// The longest a step may take before it fails (its deadline), in seconds.
    pub step_deadline_s: f64,
    /// Longest prompt + generation, in tokens.
    pub max_total_tokens: u32,
    /// Most tokens one step computes.
    pub max_batch_tokens: u32,
    /// Most requests one step computes.
    pub max_batch_requests: u32,
}

impl Default for MetricLimits {
    /// The router's flag defaults, with TGI's default `max_total_tokens` and the longest
    /// default step deadline (for apps built without `server::run`, i.e. tests).
    fn default() -> Self {
        Self {
            ttft_objective_s: 2.0,
            tbt_objective_s: 0.2,
            step_deadline_s: 600.0,
            max_total_tokens: 2048,
            max_batch_tokens: 2048,
            max_batch_requests: 256,
        }
    }
}

impl MetricLimits {
    /// The longest first token the limits allow: the longest prompt prefilled chunk by chunk,
    /// every step running up to its deadline. (Time in the queue has no bound; it lands in the
    /// +Inf bucket.)
    pub fn ttft_ceiling_s(&self) -> f64 {
        let prefill_steps = self.max_total_tokens.max(1).div_ceil(self.max_batch_tokens.max(1));
        self.step_deadline_s * f64::from(prefill_steps)
    }

    /// The longest request the limits allow: at most one step per token, each up to its
    /// deadline.
    pub fn request_ceiling_s(&self) -> f64 {
        self.step_deadline_s * f64::from(self.max_total_tokens.max(1))
    }
}

/// Multiples of an objective that get a bucket: 10% steps where a request turns from met to
/// missed, coarser below (fast is fast) and above (late is late).
const OBJECTIVE_MULTIPLES: [f64; 23] = [
    0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2, 1.3, 1.5, 1.75, 2.0, 2.5,
    3.0, 4.0, 5.0,
];

/// TGI's duration buckets: 35 geometric steps (×1.5) from 150 µs to about 146 s.
const TGI_DURATION_BUCKETS: usize = 35;

/// Buckets of a latency judged against `objective_s`: the objective's multiples, then doubling
/// from ten times the objective until `ceiling_s`, which is the last bucket.
pub fn latency_buckets(objective_s: f64, ceiling_s: f64) -> Vec<f64> {
    let objective = positive_or(objective_s, 1.0);
    let mut buckets: Vec<f64> = OBJECTIVE_MULTIPLES.iter().map(|multiple| multiple * objective).collect();
    extend_by_doubling(&mut buckets, 10.0 * objective, ceiling_s);
    buckets.into_iter().map(tidy).collect()
}

/// Buckets of a duration with no objective (request phases, steps): TGI's, so that TGI's
/// dashboards read the same resolution, then doubling until `ceiling_s`.
pub fn duration_buckets(ceiling_s: f64) -> Vec<f64> {
    let mut buckets: Vec<f64> = (0..TGI_DURATION_BUCKETS).map(|n| 0.00015 * 1.5f64.powi(n as i32)).collect();
    let next = buckets.last().map_or(1.0, |last| 2.0 * last);
    extend_by_doubling(&mut buckets, next, ceiling_s);
    buckets.into_iter().map(tidy).collect()
}

/// Buckets of a mask computation: microseconds to a second, ×1.25 apart (a quantile is off by
/// at most an eighth), far finer than TGI's duration buckets, which start at 150 µs.
pub fn mask_buckets() -> Vec<f64> {
    (0..63).map(|n| tidy(1e-6 * 1.25f64.powi(n))).collect()
}

/// Buckets of a count (tokens, requests) from 1 to `max`: 1, 2, 3, 4, 6, 8, 12, 16, … — two per
/// octave, so a quantile is off by at most a third — ending at `max` itself.
pub fn count_buckets(max: u32) -> Vec<f64> {
    let max = u64::from(max.max(1));
    let mut buckets = Vec::new();
    let mut power = 1u64;
    while buckets.last().is_none_or(|&last| last < max) {
        for candidate in [power, power * 3 / 2] {
            let candidate = candidate.min(max);
            if buckets.last().is_none_or(|&last| candidate > last) {
                buckets.push(candidate);
            }
        }
        power *= 2;
    }
    buckets.into_iter().map(|count| count as f64).collect()
}

/// Every histogram the router records, with its buckets.
pub fn histogram_buckets(limits: &MetricLimits) -> Vec<(Matcher, Vec<f64>)> {
    let token_counts = count_buckets(limits.max_total_tokens);
    let batch_sizes = count_buckets(limits.max_batch_requests);
    let mut table = vec![
        // Request phases, steps, forward passes, engine turns: every `*_duration`.
        (Matcher::Suffix("_duration".into()), duration_buckets(limits.request_ceiling_s())),
        (Matcher::Full(TTFT_HISTOGRAM.into()), latency_buckets(limits.ttft_objective_s, limits.ttft_ceiling_s())),
        // One gap is at most one step when the request is scheduled every step; a longer one
        // (rotated out, parked) is past any objective and lands in +Inf.
        (Matcher::Full(ITL_HISTOGRAM.into()), latency_buckets(limits.tbt_objective_s, limits.step_deadline_s)),
        (Matcher::Full(LAG_HISTOGRAM.into()), LAG_BUCKETS.to_vec()),
        // vLLM's names of the same latencies (engine::vllm_metrics), with the same buckets.
        (Matcher::Full(VLLM_TTFT_HISTOGRAM.into()), latency_buckets(limits.ttft_objective_s, limits.ttft_ceiling_s())),
        (Matcher::Full(VLLM_ITL_HISTOGRAM.into()), latency_buckets(limits.tbt_objective_s, limits.step_deadline_s)),
        (Matcher::Full(VLLM_TPOT_HISTOGRAM.into()), latency_buckets(limits.tbt_objective_s, limits.step_deadline_s)),
        (Matcher::Full(VLLM_E2E_HISTOGRAM.into()), duration_buckets(limits.request_ceiling_s())),
        (Matcher::Full(VLLM_QUEUE_HISTOGRAM.into()), duration_buckets(limits.request_ceiling_s())),
        (Matcher::Full(BATCH_SIZE_HISTOGRAM.into()), batch_sizes.clone()),
        (Matcher::Full(TGI_BATCH_NEXT_SIZE_HISTOGRAM.into()), batch_sizes),
        (Matcher::Full(BATCH_TOKENS_HISTOGRAM.into()), count_buckets(limits.max_batch_tokens)),
        (Matcher::Full(GRAMMAR_MASK_HISTOGRAM.into()), mask_buckets()),
        (Matcher::Full(GRAMMAR_STEP_MASK_HISTOGRAM.into()), mask_buckets()),
    ];
    for prefix in PREFIXES {
        for name in ["request_input_length", "request_generated_tokens", "request_max_new_tokens"] {
            table.push((Matcher::Full(format!("{prefix}_{name}")), token_counts.clone()));
        }
    }
    table
}

/// Appends `start`, `2 × start`, … while below `ceiling`, then `ceiling` itself; nothing when
/// the buckets already reach it.
fn extend_by_doubling(buckets: &mut Vec<f64>, start: f64, ceiling: f64) {
    if !ceiling.is_finite() || buckets.last().is_some_and(|&last| last >= ceiling) {
        return;
    }
    let mut next = positive_or(start, ceiling);
    while next < ceiling {
        if buckets.last().is_none_or(|&last| next > last) {
            buckets.push(next);
        }
        next *= 2.0;
    }
    buckets.push(ceiling);
}

/// `value` to 9 significant digits: a bucket is a label (`le="0.09"`, not
/// `le="0.09000000000000001"`) that dashboards and queries spell out.
fn tidy(value: f64) -> f64 {
    format!("{value:.8e}").parse().unwrap_or(value)
}

fn positive_or(value: f64, fallback: f64) -> f64 {
    if value.is_finite() && value > 0.0 {
        value
    } else {
        fallback
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strictly_increasing(buckets: &[f64]) -> bool {
        buckets.windows(2).all(|pair| pair[0] < pair[1]) && buckets.iter().all(|bucket| bucket.is_finite())
    }

    #[test]
    fn latency_buckets_are_fine_around_the_objective_and_reach_the_ceiling() {
        let buckets = latency_buckets(0.2, 600.0);
        assert!(strictly_increasing(&buckets), "{buckets:?}");
        assert!(buckets.iter().any(|&bucket| (bucket - 0.2).abs() < 1e-12));
        assert_eq!(buckets.last(), Some(&600.0));
        // Between half and 1.3 times the objective no bucket is wider than a tenth of it.
        let near: Vec<f64> = buckets.iter().copied().filter(|&b| (0.1 - 1e-9..=0.26 + 1e-9).contains(&b)).collect();
        assert_eq!(near.len(), 9, "{near:?}");
        assert!(near.windows(2).all(|pair| pair[1] - pair[0] <= 0.02 + 1e-12), "{near:?}");
        // Above five times the objective the buckets double: 2, 4, …, 512, then the ceiling.
        let above: Vec<f64> = buckets.iter().copied().filter(|&b| b > 1.0).collect();
        assert_eq!(above, vec![2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 600.0]);
    }

    #[test]
    fn buckets_print_as_short_labels() {
        let labels: Vec<String> = latency_buckets(0.1, 1.0).iter().map(f64::to_string).collect();
        assert!(labels.contains(&"0.09".to_string()) && labels.contains(&"0.13".to_string()), "{labels:?}");
        assert!(labels.iter().all(|label| label.len() <= 6), "{labels:?}");
        assert_eq!(duration_buckets(1.0)[1].to_string(), "0.000225");
    }

    #[test]
    fn a_ceiling_below_the_objective_multiples_adds_nothing() {
        let buckets = latency_buckets(2.0, 5.0);
        assert_eq!(buckets.len(), OBJECTIVE_MULTIPLES.len());
        assert_eq!(buckets.last(), Some(&10.0));
        // Nonsense limits still give valid buckets (Prometheus rejects an empty or unsorted list).
        for (objective, ceiling) in [(f64::NAN, 1.0), (0.0, f64::INFINITY), (-1.0, -1.0), (1e-9, 1e9)] {
            let buckets = latency_buckets(objective, ceiling);
            assert!(!buckets.is_empty() && strictly_increasing(&buckets), "{objective} {ceiling}: {buckets:?}");
        }
    }

    #[test]
    fn count_buckets_reach_the_limit_itself() {
        assert_eq!(count_buckets(1), vec![1.0]);
        assert_eq!(count_buckets(0), vec![1.0]);
        assert_eq!(count_buckets(10), vec![1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 10.0]);
        assert_eq!(count_buckets(16), vec![1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0]);
        let long_context = count_buckets(131_072);
        assert!(strictly_increasing(&long_context));
        assert_eq!(long_context.last(), Some(&131_072.0));
        assert!(long_context.contains(&1024.0) && long_context.contains(&98_304.0));
        assert_eq!(count_buckets(u32::MAX).last(), Some(&f64::from(u32::MAX)));
    }

    #[test]
    fn duration_buckets_are_tgis_then_reach_the_ceiling() {
        let short = duration_buckets(10.0);
        assert_eq!(short.len(), TGI_DURATION_BUCKETS);
        assert!((short[0] - 0.00015).abs() < 1e-15);
        let long = duration_buckets(2048.0 * 600.0);
        assert!(strictly_increasing(&long));
        assert_eq!(&long[..TGI_DURATION_BUCKETS], &short[..]);
        assert_eq!(long.last(), Some(&(2048.0 * 600.0)));
        assert!(long.len() < TGI_DURATION_BUCKETS + 16, "{}", long.len());
    }

    #[test]
    fn ceilings_come_from_the_step_deadline_and_the_token_limits() {
        let limits = MetricLimits { step_deadline_s: 30.0, max_total_tokens: 8192, max_batch_tokens: 2048,
            ..MetricLimits::default() };
        // Four prefill chunks of 2,048 tokens.
        assert_eq!(limits.ttft_ceiling_s(), 120.0);
        assert_eq!(limits.request_ceiling_s(), 30.0 * 8192.0);
        // One token past four chunks takes a fifth.
        let odd = MetricLimits { max_total_tokens: 8193, ..limits };
        assert_eq!(odd.ttft_ceiling_s(), 150.0);
    }

    #[test]
    fn every_histogram_family_gets_buckets_from_the_limits() {
        let limits = MetricLimits { max_total_tokens: 32_768, max_batch_requests: 64, max_batch_tokens: 4096,
            ..MetricLimits::default() };
        let table = histogram_buckets(&limits);
        let of = |name: &str| {
            table.iter().find(|(matcher, _)| *matcher == Matcher::Full(name.into())).map(|(_, b)| b.clone())
        };
        for prefix in PREFIXES {
            let tokens = of(&format!("{prefix}_request_input_length")).unwrap();
            assert_eq!(tokens.last(), Some(&32_768.0));
        }
        assert_eq!(of(BATCH_SIZE_HISTOGRAM).unwrap().last(), Some(&64.0));
        assert_eq!(of(TGI_BATCH_NEXT_SIZE_HISTOGRAM).unwrap().last(), Some(&64.0));
        assert_eq!(of(BATCH_TOKENS_HISTOGRAM).unwrap().last(), Some(&4096.0));
        assert_eq!(of(TTFT_HISTOGRAM).unwrap().last(), Some(&(600.0 * 8.0)));
        assert_eq!(of(ITL_HISTOGRAM).unwrap().last(), Some(&600.0));
        for (matcher, buckets) in &table {
            assert!(!buckets.is_empty() && strictly_increasing(buckets), "{matcher:?}: {buckets:?}");
        }
    }
}
