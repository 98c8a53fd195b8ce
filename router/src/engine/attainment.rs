//! SLO attainment of one request: when its tokens were produced, and whether that met its
//! objectives. The definitions are the benchmark's (server/superinfer/bench/metrics.py), so the
//! server's counters and a benchmark report agree: TTFT is met when the first token came within
//! `ttft` of arrival; TBT is met when the 90th percentile (linear interpolation, as numpy) of
//! the gaps between consecutive tokens is within `tbt` — a request with one token has no gap
//! and meets it.
use std::time::Instant;

use superinfer_scheduler::Slo;

/// Percentile of a request's gaps held against its TBT objective.
pub(crate) const TBT_PERCENTILE: f64 = 90.0;

/// When a request's tokens were produced (as the engine saw them, after the step returned).
#[derive(Debug, Default, Clone)]
pub(crate) struct TokenTimes {
    first: Option<Instant>,
    last: Option<Instant>,
    /// Seconds between consecutive tokens.
    gaps: Vec<f64>,
}

/// Whether a finished request met each of its objectives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Attainment {
    pub ttft_met: bool,
    pub tbt_met: bool,
}

impl TokenTimes {
    pub fn record(&mut self, now: Instant) {
        if let Some(last) = self.last {
            self.gaps.push(now.saturating_duration_since(last).as_secs_f64());
        }
        self.first.get_or_insert(now);
        self.last = Some(now);
    }

    /// Judges the request against `slo`; `None` when it produced no token (it did not finish).
    pub fn attainment(&self, arrival: Instant, slo: Slo) -> Option<Attainment> {
        let first = self.first?;
        let ttft = first.saturating_duration_since(arrival);
        let tbt = percentile(&self.gaps, TBT_PERCENTILE).unwrap_or(0.0);
        Some(Attainment {
            // Compared as seconds: an objective of any size (validation bounds it, the
            // simulator may not) must not panic a Duration conversion.
            ttft_met: ttft.as_secs_f64() <= slo.ttft_s,
            tbt_met: tbt <= slo.tbt_s,
        })
    }
}

/// The `p`-th percentile of `values` with linear interpolation between closest ranks (numpy's
/// default); `None` when empty.
pub(crate) fn percentile(values: &[f64], p: f64) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = (p / 100.0).clamp(0.0, 1.0) * (sorted.len() - 1) as f64;
    let below = rank.floor() as usize;
    let above = rank.ceil() as usize;
    Some(sorted[below] + (sorted[above] - sorted[below]) * (rank - below as f64))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const SLO: Slo = Slo { ttft_s: 0.5, tbt_s: 0.1 };

    fn times(arrival: Instant, offsets_ms: &[u64]) -> TokenTimes {
        let mut times = TokenTimes::default();
        for &ms in offsets_ms {
            times.record(arrival + Duration::from_millis(ms));
        }
        times
    }

    #[test]
    fn percentile_interpolates_like_numpy() {
        // numpy.percentile([1, 2, 3, 4, 10], 90) == 7.6; [5] -> 5; [1, 3] p90 -> 2.8.
        assert!((percentile(&[4.0, 1.0, 10.0, 3.0, 2.0], 90.0).unwrap() - 7.6).abs() < 1e-12);
        assert_eq!(percentile(&[5.0], 90.0), Some(5.0));
        assert!((percentile(&[1.0, 3.0], 90.0).unwrap() - 2.8).abs() < 1e-12);
        assert_eq!(percentile(&[], 90.0), None);
    }

    #[test]
    fn no_token_means_no_verdict() {
        assert_eq!(TokenTimes::default().attainment(Instant::now(), SLO), None);
    }

    #[test]
    fn ttft_is_measured_from_arrival() {
        let arrival = Instant::now();
        let on_time = times(arrival, &[400]).attainment(arrival, SLO).unwrap();
        let late = times(arrival, &[600]).attainment(arrival, SLO).unwrap();
        assert!(on_time.ttft_met && !late.ttft_met);
        // One token: no gap, TBT met.
        assert!(on_time.tbt_met && late.tbt_met);
    }

    #[test]
    fn an_objective_too_large_for_a_duration_is_simply_met() {
        let arrival = Instant::now();
        let huge = Slo { ttft_s: 1e27, tbt_s: 1e27 };
        let verdict = times(arrival, &[100, 200]).attainment(arrival, huge).unwrap();
        assert!(verdict.ttft_met && verdict.tbt_met);
        let nan = Slo { ttft_s: f64::NAN, tbt_s: 0.1 };
        assert!(!times(arrival, &[100]).attainment(arrival, nan).unwrap().ttft_met);
    }

    #[test]
    fn one_slow_gap_in_ten_is_tolerated_two_are_not() {
        let arrival = Instant::now();
        // Ten gaps of 50 ms, one of them 400 ms: p90 interpolates to 0.9*50+0.1*400 = 85 ms.
        let one_slow: Vec<u64> = [0, 50, 100, 150, 200, 250, 300, 350, 400, 450, 850].to_vec();
        assert!(times(arrival, &one_slow).attainment(arrival, SLO).unwrap().tbt_met);
        // Two slow gaps: p90 is 400 ms.
        let two_slow: Vec<u64> = [0, 50, 100, 150, 200, 250, 300, 350, 400, 800, 1200].to_vec();
        let verdict = times(arrival, &two_slow).attainment(arrival, SLO).unwrap();
        assert!(!verdict.tbt_met);
        assert!(verdict.ttft_met);
    }
}
