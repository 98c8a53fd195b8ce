//! When a request's tokens were produced, for its SLO attainment. The verdict itself is the
//! scheduler crate's (`superinfer_scheduler::attainment`), shared with the simulator and the
//! benchmark, at the percentile the server is configured for (`--tbt-slo-percentile`).
use std::collections::VecDeque;
use std::time::{Duration, Instant};

use superinfer_scheduler::attainment::{judge, Attainment};
use superinfer_scheduler::Slo;

/// When a request's tokens were produced (as the engine saw them, after the step returned).
#[derive(Debug, Default, Clone)]
pub(crate) struct TokenTimes {
    first: Option<Instant>,
    last: Option<Instant>,
    /// Seconds between consecutive tokens.
    gaps: Vec<f64>,
}

impl TokenTimes {
    /// Stamps a token produced at `now`; returns its gap since the previous token in seconds
    /// (`None` for the first token), for the inter-token latency histogram.
    pub fn record(&mut self, now: Instant) -> Option<f64> {
        let gap = self.last.map(|last| now.saturating_duration_since(last).as_secs_f64());
        self.gaps.extend(gap);
        self.first.get_or_insert(now);
        self.last = Some(now);
        gap
    }

    /// Judges the request against `slo` at the `tbt_percentile`-th percentile of its gaps;
    /// `None` when it produced no token (it did not finish).
    pub fn attainment(&self, arrival: Instant, slo: Slo, tbt_percentile: f64) -> Option<Attainment> {
        let ttft = self.first?.saturating_duration_since(arrival);
        Some(judge(ttft.as_secs_f64(), &self.gaps, slo, tbt_percentile))
    }
}

/// How far back the recent attainment looks: long enough to hold many requests at a modest
/// rate, short enough for an autoscaler or a router's scorer to see a replica fall behind.
pub(crate) const RECENT_WINDOW: Duration = Duration::from_secs(60);

/// The joint verdicts (TTFT and TBT met) of the requests that finished in the last
/// `RECENT_WINDOW`: a replica's current SLO attainment, which the cumulative counters only give
/// through a Prometheus `rate` over a range.
#[derive(Debug, Default)]
pub(crate) struct RecentAttainment {
    verdicts: VecDeque<(Instant, bool)>,
    met: usize,
}

impl RecentAttainment {
    pub fn record(&mut self, finished: Instant, joint_met: bool) {
        self.verdicts.push_back((finished, joint_met));
        self.met += usize::from(joint_met);
    }

    /// The share of the window's finished requests that met both objectives; 1 when none
    /// finished in it (nothing was missed).
    pub fn share(&mut self, now: Instant) -> f64 {
        while let Some(&(finished, met)) = self.verdicts.front() {
            if now.saturating_duration_since(finished) <= RECENT_WINDOW {
                break;
            }
            self.verdicts.pop_front();
            self.met -= usize::from(met);
        }
        if self.verdicts.is_empty() {
            1.0
        } else {
            self.met as f64 / self.verdicts.len() as f64
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const SLO: Slo = Slo::new(0.5, 0.1);

    fn times(arrival: Instant, offsets_ms: &[u64]) -> TokenTimes {
        let mut times = TokenTimes::default();
        for &ms in offsets_ms {
            times.record(arrival + Duration::from_millis(ms));
        }
        times
    }

    #[test]
    fn recent_attainment_forgets_what_left_the_window() {
        let start = Instant::now();
        let mut recent = RecentAttainment::default();
        assert_eq!(recent.share(start), 1.0);
        recent.record(start, false);
        recent.record(start + Duration::from_secs(30), true);
        recent.record(start + Duration::from_secs(40), true);
        assert!((recent.share(start + Duration::from_secs(45)) - 2.0 / 3.0).abs() < 1e-12);
        assert_eq!(recent.share(start + Duration::from_secs(61)), 1.0);
        assert_eq!(recent.share(start + Duration::from_secs(101)), 1.0);
        recent.record(start + Duration::from_secs(102), false);
        assert_eq!(recent.share(start + Duration::from_secs(102)), 0.0);
    }

    #[test]
    fn no_token_means_no_verdict() {
        assert_eq!(TokenTimes::default().attainment(Instant::now(), SLO, 90.0), None);
    }

    #[test]
    fn ttft_is_measured_from_arrival() {
        let arrival = Instant::now();
        let on_time = times(arrival, &[400]).attainment(arrival, SLO, 90.0).unwrap();
        let late = times(arrival, &[600]).attainment(arrival, SLO, 90.0).unwrap();
        assert!(on_time.ttft_met && !late.ttft_met);
        // One token: no gap, TBT met.
        assert!(on_time.tbt_met && late.tbt_met);
    }

    #[test]
    fn an_objective_too_large_for_a_duration_is_simply_met() {
        let arrival = Instant::now();
        let huge = Slo::new(1e27, 1e27);
        let verdict = times(arrival, &[100, 200]).attainment(arrival, huge, 90.0).unwrap();
        assert!(verdict.ttft_met && verdict.tbt_met);
    }

    #[test]
    fn gaps_are_judged_at_the_configured_percentile() {
        let arrival = Instant::now();
        // Ten gaps of 50 ms, one of them 400 ms: p90 interpolates to 85 ms (met), p95 to
        // 242.5 ms (missed). `--tbt-slo-percentile 95` must judge it missed.
        let one_slow: Vec<u64> = [0, 50, 100, 150, 200, 250, 300, 350, 400, 450, 850].to_vec();
        assert!(times(arrival, &one_slow).attainment(arrival, SLO, 90.0).unwrap().tbt_met);
        assert!(!times(arrival, &one_slow).attainment(arrival, SLO, 95.0).unwrap().tbt_met);
        // Two slow gaps: p90 is 400 ms.
        let two_slow: Vec<u64> = [0, 50, 100, 150, 200, 250, 300, 350, 400, 800, 1200].to_vec();
        let verdict = times(arrival, &two_slow).attainment(arrival, SLO, 90.0).unwrap();
        assert!(!verdict.tbt_met && verdict.ttft_met);
    }
}
