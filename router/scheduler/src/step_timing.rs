//! What the cost model's mean does not say about a step: how far its measured time strays from
//! the prediction, how much slower a step holding a prefill chunk beside decodes runs than
//! predicted, and how long a step takes beyond its compute (planning, the request to the shard
//! and its reply). A plan that must end by a deadline keeps all three as a margin: RotaSched's
//! step-time cap sizes prefill chunks so the step ends by the running decodes' next-token
//! deadline, and a chunk sized to the predicted mean misses it whenever the step runs a little
//! long — on a prompt spread over several capped steps, once per step.

/// Online estimates, each an exponential moving average with the scheduler's `ema_alpha`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepTiming {
    /// Mean absolute deviation of a step's measured / predicted time from the correction,
    /// relative to it (0.05: steps stray 5%), over the steps that are not mixed.
    pub deviation: f64,
    /// The same over mixed steps, from their chunk ratio; None before the first. Their spread
    /// is their own: a chunk after a long computed prefix runs slower than one after a short
    /// one, by more than the ratio's mean tells.
    pub chunk_deviation: Option<f64>,
    /// Measured over uncorrected predicted time of mixed steps (a prefill chunk beside
    /// decodes: the steps the cap sizes); None before the first. The warm-up's curve is timed
    /// on prefill-only and decode-only steps and prices a chunk's attention over the prompt's
    /// computed positions by the context term alone: on a CPU such steps ran 1.07–1.20× the
    /// prediction, more the longer the prefix (`python -m superinfer.shard.cost_check --mixed`),
    /// while decode-only steps, most of a run, hold the correction near 1.
    pub chunk_ratio: Option<f64>,
    /// Seconds from planning a step to applying its results, beyond the shard's measured
    /// compute; learned from steps planned while no other step was in flight (with a step in
    /// flight, the interval also holds the earlier step's compute).
    pub overhead_s: f64,
}

impl StepTiming {
    /// How many deviations of a step's time a deadline-bound plan leaves room for (for
    /// normally distributed errors, the mean absolute deviation is 0.8 σ: two of them cover
    /// about 95% of steps).
    pub const DEVIATIONS: f64 = 2.0;

    /// Folds one step in: `ratio` is its measured over its uncorrected predicted time,
    /// `correction` the cost model's correction before this step, `mixed` whether it held a
    /// prefill chunk beside decodes, `cycle_s` the time from its plan to its results when it
    /// was planned alone (None otherwise). Values that are not finite are ignored.
    pub fn observe(
        &mut self,
        ratio: f64,
        correction: f64,
        mixed: bool,
        measured_s: f64,
        cycle_s: Option<f64>,
        alpha: f64,
    ) {
        let ema = |old: f64, sample: f64| (1.0 - alpha) * old + alpha * sample;
        if ratio.is_finite() && ratio > 0.0 && correction.is_finite() && correction > 0.0 {
            if mixed {
                // The first mixed step is measured against the correction (all that is known).
                let expected = self.chunk_ratio.unwrap_or(correction);
                let stray = ((ratio - expected) / expected).abs().min(1.0);
                self.chunk_deviation =
                    Some(self.chunk_deviation.map_or(stray, |old| ema(old, stray)));
                self.chunk_ratio = Some(self.chunk_ratio.map_or(ratio, |old| ema(old, ratio)));
            } else {
                self.deviation = ema(
                    self.deviation,
                    ((ratio - correction) / correction).abs().min(1.0),
                );
            }
        }
        if let Some(cycle_s) = cycle_s.filter(|c| c.is_finite() && measured_s.is_finite()) {
            self.overhead_s = ema(self.overhead_s, (cycle_s - measured_s).clamp(0.0, 1.0));
        }
    }

    /// The budget to give a prediction made with the cost model's `correction` for a mixed
    /// step planned at `now` whose results are due by `deadline`: the time left, less the
    /// overhead, over the margin for a step running long, rescaled from the correction to the
    /// chunk ratio.
    pub fn mixed_step_within(&self, now: f64, deadline: f64, correction: f64) -> f64 {
        let ratio = self.chunk_ratio.unwrap_or(correction);
        let deviation = self.chunk_deviation.unwrap_or(self.deviation);
        (deadline - now - self.overhead_s) * correction
            / (ratio * (1.0 + Self::DEVIATIONS * deviation))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn learns_the_spread_the_chunk_ratio_and_the_overhead() {
        let mut timing = StepTiming::default();
        // Steps alternately 10% over and under a correction of 1.0, 4 ms of overhead each.
        for k in 0..200 {
            let ratio = if k % 2 == 0 { 1.1 } else { 0.9 };
            timing.observe(
                ratio,
                1.0,
                false,
                0.1 * ratio,
                Some(0.1 * ratio + 0.004),
                0.2,
            );
        }
        assert!((timing.deviation - 0.1).abs() < 1e-6, "{timing:?}");
        assert!((timing.overhead_s - 0.004).abs() < 1e-6, "{timing:?}");
        assert_eq!(timing.chunk_ratio, None);
        // 0.3 s to the deadline: 0.296 s less the overhead, over 1.2 for two deviations.
        assert!((timing.mixed_step_within(10.0, 10.3, 1.0) - 0.296 / 1.2).abs() < 1e-9);
        // Mixed steps run 1.2x: a prediction corrected by 1.0 gets a budget 1.2x smaller.
        for _ in 0..200 {
            timing.observe(1.2, 1.0, true, 0.12, None, 0.2);
        }
        assert!(
            (timing.chunk_ratio.unwrap() - 1.2).abs() < 1e-6,
            "{timing:?}"
        );
        assert!(timing.chunk_deviation.unwrap() < 1e-6, "{timing:?}");
        assert!(
            (timing.deviation - 0.1).abs() < 1e-6,
            "the other steps' spread is kept apart: {timing:?}"
        );
        assert!((timing.mixed_step_within(10.0, 10.3, 1.0) - 0.296 / 1.2).abs() < 1e-6);
        assert!((timing.mixed_step_within(10.0, 10.3, 2.0) - 0.296 / 0.6).abs() < 1e-6);
        // Mixed steps alternately 1.0x and 1.4x: ratio about 1.2, deviation about 1/6.
        for k in 0..400 {
            timing.observe(
                if k % 2 == 0 { 1.0 } else { 1.4 },
                1.0,
                true,
                0.1,
                None,
                0.2,
            );
        }
        let deviation = timing.chunk_deviation.unwrap();
        assert!((0.14..0.2).contains(&deviation), "{timing:?}");
        let ratio = timing.chunk_ratio.unwrap();
        let expected = 0.296 / (ratio * (1.0 + 2.0 * deviation));
        assert!((timing.mixed_step_within(10.0, 10.3, 1.0) - expected).abs() < 1e-9);
    }

    #[test]
    fn a_step_with_another_in_flight_says_nothing_of_the_overhead_and_bad_values_are_ignored() {
        let mut timing = StepTiming::default();
        timing.observe(1.0, 1.0, false, 0.1, None, 0.2);
        timing.observe(f64::NAN, 1.0, true, 0.1, Some(f64::INFINITY), 0.2);
        assert_eq!(timing, StepTiming::default());
        // A cycle shorter than the compute (clocks of two processes) counts as no overhead.
        timing.observe(1.0, 1.0, false, 0.1, Some(0.09), 0.2);
        assert_eq!(timing.overhead_s, 0.0);
        assert_eq!(timing.mixed_step_within(1.0, 1.5, 1.0), 0.5);
    }
}
