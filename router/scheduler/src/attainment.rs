//! How a finished request is judged against its objectives — the one definition that the
//! engine's /metrics counters, the simulator's report and the benchmark (through the Python
//! extension) share. TTFT is met when the first token came within the objective of arrival;
//! TBT is met when the configured percentile of the gaps between consecutive tokens is within
//! the objective (a request with one token has no gap and meets it). Percentiles interpolate
//! linearly between order statistics, as numpy's default does.

use crate::config::Slo;

/// Whether a finished request met each of its objectives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attainment {
    pub ttft_met: bool,
    pub tbt_met: bool,
}

/// Judges a request that produced its first token `ttft_s` after arrival, with `gaps_s`
/// between consecutive tokens, against `slo` at the `tbt_percentile`-th percentile of its gaps.
pub fn judge(ttft_s: f64, gaps_s: &[f64], slo: Slo, tbt_percentile: f64) -> Attainment {
    meets(ttft_s, percentile(gaps_s, tbt_percentile).unwrap_or(0.0), slo)
}

/// The verdict for a request whose TTFT and TBT (its gaps' percentile) are already known.
pub fn meets(ttft_s: f64, tbt_s: f64, slo: Slo) -> Attainment {
    // Compared as plain seconds: an objective of any size must not overflow a conversion.
    Attainment { ttft_met: ttft_s <= slo.ttft_s, tbt_met: tbt_s <= slo.tbt_s }
}

/// The `p`-th percentile (0..=100) of `values`, linearly interpolated; `None` when empty.
pub fn percentile(values: &[f64], p: f64) -> Option<f64> {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    percentile_sorted(&sorted, p)
}

/// As [`percentile`], for values already sorted ascending.
pub fn percentile_sorted(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let position = p.clamp(0.0, 100.0) / 100.0 * (sorted.len() - 1) as f64;
    let low = position.floor() as usize;
    let high = position.ceil() as usize;
    Some(sorted[low] + (sorted[high] - sorted[low]) * (position - low as f64))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SLO: Slo = Slo { ttft_s: 0.5, tbt_s: 0.1 };

    #[test]
    fn percentiles_match_numpy() {
        // numpy.percentile([1, 2, 3, 4, 10], 90) == 7.6; [5] -> 5; [1, 3] p90 -> 2.8.
        assert!((percentile(&[4.0, 1.0, 10.0, 3.0, 2.0], 90.0).unwrap() - 7.6).abs() < 1e-12);
        assert_eq!(percentile(&[5.0], 90.0), Some(5.0));
        assert!((percentile(&[1.0, 3.0], 90.0).unwrap() - 2.8).abs() < 1e-12);
        let values: Vec<f64> = (1..=10).map(f64::from).collect();
        assert_eq!(percentile_sorted(&values, 50.0), Some(5.5));
        assert!((percentile_sorted(&values, 99.0).unwrap() - 9.91).abs() < 1e-12);
        assert_eq!(percentile(&[], 90.0), None);
    }

    #[test]
    fn ttft_is_met_within_the_objective_and_one_token_meets_tbt() {
        assert_eq!(judge(0.4, &[], SLO, 90.0), Attainment { ttft_met: true, tbt_met: true });
        assert!(!judge(0.6, &[], SLO, 90.0).ttft_met);
        assert!(judge(0.1, &[0.05; 3], Slo { ttft_s: 1e27, tbt_s: 1e27 }, 90.0).ttft_met);
        assert!(!judge(0.1, &[], Slo { ttft_s: f64::NAN, tbt_s: 0.1 }, 90.0).ttft_met);
    }

    #[test]
    fn the_tbt_verdict_follows_the_configured_percentile() {
        // Ten gaps of 50 ms, one of 400 ms: p90 interpolates to 85 ms (met), p95 to 242.5 ms
        // (missed) — the same request, judged at the percentile the server is configured for.
        let mut gaps = vec![0.05; 9];
        gaps.push(0.4);
        assert!(judge(0.1, &gaps, SLO, 90.0).tbt_met);
        assert!(!judge(0.1, &gaps, SLO, 95.0).tbt_met);
        assert!(judge(0.1, &gaps, SLO, 50.0).tbt_met);
    }
}
