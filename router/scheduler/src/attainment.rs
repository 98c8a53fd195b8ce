//! How a finished request is judged against its objectives — the one definition that the
//! engine's /metrics counters, the simulator's report and the benchmark (through the Python
//! extension) share. TTFT is met when the first token came within the objective of arrival;
//! TBT is met when the configured percentile of the gaps between consecutive tokens is within
//! the objective *and* no gap exceeds the stall bound (a request with one token has no gap and
//! meets it). Percentiles interpolate linearly between order statistics, as numpy's default
//! does.

use crate::config::Slo;

/// Whether a finished request met each of its objectives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attainment {
    pub ttft_met: bool,
    /// The gaps' percentile within the TBT objective and no gap above the stall bound.
    pub tbt_met: bool,
    /// No gap above the stall bound (part of `tbt_met`; reported on its own too).
    pub stall_met: bool,
}

impl Attainment {
    /// Both objectives met (what goodput counts).
    pub fn joint(&self) -> bool {
        self.ttft_met && self.tbt_met
    }
}

/// Judges a request that produced its first token `ttft_s` after arrival, with `gaps_s`
/// between consecutive tokens, against `slo` at the `tbt_percentile`-th percentile of its gaps.
pub fn judge(ttft_s: f64, gaps_s: &[f64], slo: Slo, tbt_percentile: f64) -> Attainment {
    let tbt_s = percentile(gaps_s, tbt_percentile).unwrap_or(0.0);
    let max_gap_s = gaps_s.iter().copied().fold(0.0, f64::max);
    meets(ttft_s, tbt_s, max_gap_s, slo)
}

/// The verdict for a request whose TTFT, TBT (its gaps' percentile) and longest gap are
/// already known.
pub fn meets(ttft_s: f64, tbt_s: f64, max_gap_s: f64, slo: Slo) -> Attainment {
    // Compared as plain seconds: an objective of any size must not overflow a conversion.
    let stall_met = max_gap_s <= slo.max_stall_s;
    Attainment { ttft_met: ttft_s <= slo.ttft_s, tbt_met: tbt_s <= slo.tbt_s && stall_met, stall_met }
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

    const SLO: Slo = Slo { ttft_s: 0.5, tbt_s: 0.1, max_stall_s: 0.5 };

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
        let met = Attainment { ttft_met: true, tbt_met: true, stall_met: true };
        assert_eq!(judge(0.4, &[], SLO, 90.0), met);
        assert!(!judge(0.6, &[], SLO, 90.0).ttft_met);
        assert!(judge(0.1, &[0.05; 3], Slo::new(1e27, 1e27), 90.0).ttft_met);
        assert!(!judge(0.1, &[], Slo::new(f64::NAN, 0.1), 90.0).ttft_met);
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

    #[test]
    fn one_gap_above_the_stall_bound_misses_tbt_whatever_the_percentile() {
        // 99 gaps of 50 ms and one of 600 ms: p90 is 50 ms, but the stream froze for longer
        // than the 500 ms stall bound.
        let mut gaps = vec![0.05; 99];
        gaps.push(0.6);
        let verdict = judge(0.1, &gaps, SLO, 90.0);
        assert!(!verdict.tbt_met && !verdict.stall_met && verdict.ttft_met);
        assert!(!verdict.joint());
        // At the bound exactly it holds.
        gaps[99] = 0.5;
        assert!(judge(0.1, &gaps, SLO, 90.0).tbt_met);
    }

    #[test]
    fn the_default_stall_bound_is_a_multiple_of_the_tbt_objective() {
        let slo = Slo::new(1.0, 0.2);
        assert!((slo.max_stall_s - 1.0).abs() < 1e-12);
        assert_eq!(slo.with_max_stall(Some(0.4)).max_stall_s, 0.4);
        assert!(slo.with_max_stall(Some(0.1)).check().is_err());
        assert!(slo.check().is_ok());
    }
}
