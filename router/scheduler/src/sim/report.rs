//! What a simulation returns, and the recorder that builds it from token times. Percentiles
//! interpolate linearly between order statistics, as numpy's default does, so simulated and
//! measured reports use one definition.

pub use crate::attainment::percentile_sorted;
use crate::stats::SchedulerStats;

/// One request's latencies, in simulated seconds. `None` when it produced no token.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestOutcome {
    pub id: u64,
    pub arrival: f64,
    /// Whether it produced all its tokens (false: rejected, or still unfinished at the end).
    pub finished: bool,
    pub output_tokens: u32,
    pub ttft_s: Option<f64>,
    pub e2e_s: Option<f64>,
    /// The configured percentile of this request's gaps between tokens (0 with one token).
    pub tbt_s: Option<f64>,
    /// Its longest gap between tokens (0 with one token), judged against the stall bound.
    pub max_gap_s: Option<f64>,
    /// Its priority class.
    pub priority: i32,
    /// Why it failed, when it did.
    pub error: Option<String>,
}

/// count, mean and percentiles of every gap between tokens of every finished request.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct GapStats {
    pub count: u64,
    pub mean: Option<f64>,
    pub p50: Option<f64>,
    pub p90: Option<f64>,
    pub p99: Option<f64>,
    pub max: Option<f64>,
}

/// One planned step as the simulator ran it (`SimConfig::step_log`): the simulated time it was
/// planned at, the requests it computed, rotated out, rotated in and dropped for recompute, and
/// every request the scheduler held then, with its phase as the plan left it and whether it can
/// no longer meet its objectives. A plan that computes nothing (only transfers or
/// preemptions) is a record too.
#[derive(Debug, Clone, PartialEq)]
pub struct StepRecord {
    pub time: f64,
    pub scheduled: Vec<u64>,
    pub rotate_out: Vec<u64>,
    pub rotate_in: Vec<u64>,
    pub recomputed: Vec<u64>,
    /// Device blocks free once the step was planned (its allocations made, its departures not
    /// yet released).
    pub free_device_blocks: u32,
    /// (id, phase, objectives lost), by id; phases are `waiting`, `running`, `rotating_out`,
    /// `rotated` and `rotating_in`.
    pub requests: Vec<(u64, &'static str, bool)>,
    /// Per request, in `requests`' order: (device blocks, blocks in its table) — a table
    /// rotated out holds host blocks only.
    pub blocks: Vec<(u32, u32)>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SimReport {
    pub outcomes: Vec<RequestOutcome>,
    pub gap_stats: GapStats,
    /// Evenly spaced quantiles of all gaps (sorted), enough to draw their CDF.
    pub gap_quantiles: Vec<f64>,
    /// Simulated time from the first arrival to the last token.
    pub makespan_s: f64,
    pub steps: u64,
    /// Set when the scheduler stopped making progress with requests still held.
    pub stalled: bool,
    pub bytes_out: u64,
    pub bytes_in: u64,
    /// The scheduler's own counters at the end.
    pub scheduler: SchedulerStats,
    /// Simulated time charged beyond the forward passes (see `Charges`), in seconds: the
    /// per-step cost, the steps' stalls behind transfers, and planning.
    pub charged_per_step_s: f64,
    pub charged_transfer_stall_s: f64,
    pub charged_planning_s: f64,
    /// Every planned step, in order, when `SimConfig::step_log` asked for it (else empty).
    pub step_log: Vec<StepRecord>,
}


/// Per-request token timelines while they run; a finished request folds into an outcome.
pub struct Timeline {
    pub arrival: f64,
    pub max_new_tokens: u32,
    pub priority: i32,
    first_token: Option<f64>,
    last_token: f64,
    tokens: u32,
    gaps: Vec<f64>,
}

impl Timeline {
    pub fn new(arrival: f64, max_new_tokens: u32, priority: i32) -> Self {
        Timeline {
            arrival,
            max_new_tokens,
            priority,
            first_token: None,
            last_token: arrival,
            tokens: 0,
            gaps: Vec::new(),
        }
    }

    /// Records a token at `time`; true when the request has all its tokens.
    pub fn token(&mut self, time: f64) -> bool {
        if self.first_token.is_none() {
            self.first_token = Some(time);
        } else {
            self.gaps.push(time - self.last_token);
        }
        self.last_token = time;
        self.tokens += 1;
        self.tokens >= self.max_new_tokens
    }

    /// The outcome, moving this request's gaps into `all_gaps` (f32: 20 M gaps fit in 80 MB).
    pub fn close(
        mut self,
        id: u64,
        finished: bool,
        tbt_percentile: f64,
        all_gaps: &mut Vec<f32>,
    ) -> RequestOutcome {
        all_gaps.extend(self.gaps.iter().map(|&g| g as f32));
        self.gaps.sort_unstable_by(f64::total_cmp);
        let produced = self.first_token.is_some();
        RequestOutcome {
            id,
            arrival: self.arrival,
            finished,
            output_tokens: self.tokens,
            ttft_s: self.first_token.map(|t| t - self.arrival),
            e2e_s: produced.then(|| self.last_token - self.arrival),
            tbt_s: produced.then(|| percentile_sorted(&self.gaps, tbt_percentile).unwrap_or(0.0)),
            max_gap_s: produced.then(|| self.gaps.last().copied().unwrap_or(0.0)),
            priority: self.priority,
            error: (!finished).then(|| "did not finish before the simulation ended".to_string()),
        }
    }
}

/// Statistics and `samples` evenly spaced quantiles of all gaps (sorts `gaps` in place).
pub fn summarize_gaps(gaps: &mut [f32], samples: usize) -> (GapStats, Vec<f64>) {
    if gaps.is_empty() {
        return (GapStats::default(), Vec::new());
    }
    gaps.sort_unstable_by(f32::total_cmp);
    let sorted: Vec<f64> = gaps.iter().map(|&g| f64::from(g)).collect();
    let mean = sorted.iter().sum::<f64>() / sorted.len() as f64;
    let stats = GapStats {
        count: sorted.len() as u64,
        mean: Some(mean),
        p50: percentile_sorted(&sorted, 50.0),
        p90: percentile_sorted(&sorted, 90.0),
        p99: percentile_sorted(&sorted, 99.0),
        max: sorted.last().copied(),
    };
    let quantiles = match samples {
        0 => Vec::new(),
        1 => vec![sorted[sorted.len() / 2]],
        n => (0..n)
            .filter_map(|i| percentile_sorted(&sorted, 100.0 * i as f64 / (n - 1) as f64))
            .collect(),
    };
    (stats, quantiles)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeline_measures_ttft_gaps_and_end() {
        let mut timeline = Timeline::new(1.0, 3, 0);
        assert!(!timeline.token(1.5));
        assert!(!timeline.token(1.6));
        assert!(timeline.token(1.9));
        let mut all = Vec::new();
        let outcome = timeline.close(4, true, 100.0, &mut all);
        assert!((outcome.ttft_s.unwrap() - 0.5).abs() < 1e-12);
        assert!((outcome.e2e_s.unwrap() - 0.9).abs() < 1e-12);
        assert!((outcome.tbt_s.unwrap() - 0.3).abs() < 1e-12);
        assert!((outcome.max_gap_s.unwrap() - 0.3).abs() < 1e-12);
        assert_eq!(all.len(), 2);
        let (stats, quantiles) = summarize_gaps(&mut all, 3);
        assert_eq!(stats.count, 2);
        assert_eq!(quantiles.len(), 3);
    }
}
