//! Smoothed arrival rate and prompt size, from which RotaSched sizes its proactive reserve of
//! free device blocks.

#[derive(Debug, Clone, Default)]
pub(crate) struct ArrivalEstimator {
    last_arrival: Option<f64>,
    /// EMA of the gap between arrivals, seconds.
    mean_gap_s: Option<f64>,
    /// EMA of prompt sizes, in blocks.
    mean_prompt_blocks: f64,
}

impl ArrivalEstimator {
    pub(crate) fn observe(&mut self, now: f64, prompt_blocks: f64, alpha: f64) {
        if let Some(last) = self.last_arrival {
            let gap = (now - last).max(0.0);
            self.mean_gap_s = Some(match self.mean_gap_s {
                Some(mean) => (1.0 - alpha) * mean + alpha * gap,
                None => gap,
            });
        }
        self.mean_prompt_blocks = if self.last_arrival.is_none() {
            prompt_blocks
        } else {
            (1.0 - alpha) * self.mean_prompt_blocks + alpha * prompt_blocks
        };
        self.last_arrival = Some(self.last_arrival.map_or(now, |last| last.max(now)));
    }

    /// Arrivals per second. The silence since the last arrival counts as a gap already, so
    /// the rate decays when arrivals stop.
    pub(crate) fn rate(&self, now: f64) -> f64 {
        match (self.mean_gap_s, self.last_arrival) {
            (Some(mean), Some(last)) => {
                let gap = mean.max(now - last).max(1e-6);
                1.0 / gap
            }
            _ => 0.0,
        }
    }

    /// Blocks that arrivals are expected to need within `latency_s`.
    pub(crate) fn expected_blocks(&self, now: f64, latency_s: f64) -> f64 {
        self.rate(now) * self.mean_prompt_blocks * latency_s.max(0.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_tracks_gaps_and_decays_in_silence() {
        let mut arrivals = ArrivalEstimator::default();
        for i in 0..50 {
            arrivals.observe(i as f64 * 0.1, 4.0, 0.2);
        }
        assert!((arrivals.rate(4.9) - 10.0).abs() < 1e-6);
        assert!((arrivals.expected_blocks(4.9, 0.5) - 20.0).abs() < 1e-6);
        assert!(arrivals.rate(14.9) < 0.11, "ten silent seconds");
    }
}
