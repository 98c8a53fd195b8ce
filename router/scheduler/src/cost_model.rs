//! Step-time and transfer-time model (the shard's `CostModel` message), refined online.
//!
//! step ≈ step_base_s + per_prefill_token_s·prefill_tokens + per_decode_request_s·decodes
//!        + per_context_token_s·context_tokens;  transfer ≈ transfer_overhead_s + bytes / bw.
//! With a measured [`TokenCurve`] the first two terms become the curve at the step's token
//! count (prefill tokens + decodes), with the curve's own per-decode and per-context terms:
//! a dense layer's cost is not linear in its rows (on the CPU MKL's GEMM changes path at 4
//! rows, on a GPU a captured decode graph runs at its padded bucket), and one slope per
//! token cannot follow that.
//! Online refinement keeps one multiplicative correction (an EMA of measured / predicted):
//! the warm-up fit gets the shape right, while load, thermal state and co-tenants move the
//! scale, and a single factor cannot be destabilised by collinear features the way a per-term
//! online regression can.

use crate::error::SchedulerError;

/// Direction of a KV transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Direction {
    /// Device -> host.
    Out,
    /// Host -> device.
    In,
}

/// What one step computes, the input of [`CostModel::predict_step`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StepShape {
    pub prefill_tokens: u64,
    pub decode_requests: u64,
    /// Context positions attended, summed over the scheduled requests.
    pub context_tokens: u64,
}

/// Values at the first `len` of [`TokenCurve::KNOTS`], linear in between and from an
/// implicit 0 at count 0, and past the last knot extended along the last segment (never
/// downwards). Between knots a larger count may cost less: on a 2-vCPU AMD EPYC a step of
/// 4 rows runs faster than one of 3 (MKL's GEMM takes another path from 4
/// rows), and a model that forbade that would price every 4–16-token step as a 3-token one.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Knots {
    values: [f64; TokenCurve::KNOTS.len()],
    len: usize,
}

impl Knots {
    const EMPTY: Knots = Knots { values: [0.0; TokenCurve::KNOTS.len()], len: 0 };

    fn new(values: &[f64]) -> Result<Self, SchedulerError> {
        if values.len() > TokenCurve::KNOTS.len() {
            return Err(SchedulerError::InvalidConfig(format!(
                "a token curve has at most {} knots, got {}",
                TokenCurve::KNOTS.len(),
                values.len()
            )));
        }
        if values.iter().any(|t| !t.is_finite() || *t < 0.0) {
            return Err(SchedulerError::InvalidConfig("token curve times must be finite and >= 0".into()));
        }
        let mut knots = Self::EMPTY;
        knots.values[..values.len()].copy_from_slice(values);
        knots.len = values.len();
        Ok(knots)
    }

    pub fn values(&self) -> &[f64] {
        &self.values[..self.len]
    }

    /// The value at `count` (0 with no knots).
    pub fn at(&self, count: u64) -> f64 {
        let (mut x0, mut y0) = (0.0, 0.0_f64);
        for (&knot, &value) in TokenCurve::KNOTS.iter().zip(self.values()) {
            let x1 = knot as f64;
            if count <= knot {
                return y0 + (value - y0) * (count as f64 - x0) / (x1 - x0);
            }
            (x0, y0) = (x1, value);
        }
        y0 + self.tail_slope() * (count as f64 - x0)
    }

    /// The slope past the last knot: the last segment's, never negative (one knot: through 0).
    fn tail_slope(&self) -> f64 {
        let (knots, values) = (&TokenCurve::KNOTS, self.values());
        match values.len() {
            0 => 0.0,
            1 => values[0] / knots[0] as f64,
            n => ((values[n - 1] - values[n - 2]) / (knots[n - 1] - knots[n - 2]) as f64).max(0.0),
        }
    }

    /// The last knot's count (0 with no knots): past it the curve never goes down.
    fn last_knot(&self) -> u64 {
        self.len.checked_sub(1).map_or(0, |last| TokenCurve::KNOTS[last])
    }
}

/// Step time measured at warm-up as two curves over [`TokenCurve::KNOTS`] and a context term:
/// `tokens` at the step's token count (prefill tokens + decodes: the dense layers' rows),
/// `decodes` at its number of decode requests (what they add beyond their tokens: mostly the
/// LM head's sampled rows), and `per_context_token_s` per attended position. Neither curve
/// need be linear: on the CPU MKL's GEMM changes path at 4 rows, on a GPU a captured decode
/// graph runs at its padded batch size.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenCurve {
    pub tokens: Knots,
    pub decodes: Knots,
    pub per_context_token_s: f64,
}

impl TokenCurve {
    /// The counts the curves are measured at: every count up to 6, then about ×1.5 up to 64,
    /// then doubling (the warm-up times those its batch limits and pool allow).
    pub const KNOTS: [u64; 23] =
        [1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32, 48, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536];

    /// No curve: the linear terms alone.
    pub const NONE: TokenCurve = TokenCurve { tokens: Knots::EMPTY, decodes: Knots::EMPTY, per_context_token_s: 0.0 };

    /// The curves through `tokens_s` and `decodes_s`, the values at the first knots (tokens:
    /// none, for no curve, or at least two).
    pub fn new(tokens_s: &[f64], decodes_s: &[f64], per_context_token_s: f64) -> Result<Self, SchedulerError> {
        if tokens_s.is_empty() {
            return Ok(Self::NONE);
        }
        if tokens_s.len() < 2 {
            return Err(SchedulerError::InvalidConfig("a token curve needs at least 2 knots".into()));
        }
        if !(per_context_token_s.is_finite() && per_context_token_s >= 0.0) {
            return Err(SchedulerError::InvalidConfig("token curve times must be finite and >= 0".into()));
        }
        Ok(TokenCurve { tokens: Knots::new(tokens_s)?, decodes: Knots::new(decodes_s)?, per_context_token_s })
    }

    pub fn is_none(&self) -> bool {
        self.tokens.len == 0
    }

    /// The curves' time for a step of this shape (None for no curve or no tokens).
    pub fn predict(&self, shape: StepShape) -> Option<f64> {
        let tokens = shape.prefill_tokens + shape.decode_requests;
        if self.is_none() || tokens == 0 {
            return None;
        }
        Some(
            self.tokens.at(tokens)
                + self.decodes.at(shape.decode_requests)
                + self.per_context_token_s * shape.context_tokens as f64,
        )
    }
}

impl Default for TokenCurve {
    fn default() -> Self {
        Self::NONE
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CostModel {
    pub step_base_s: f64,
    pub per_prefill_token_s: f64,
    pub per_decode_request_s: f64,
    pub per_context_token_s: f64,
    pub swap_out_bytes_per_s: f64,
    pub swap_in_bytes_per_s: f64,
    pub transfer_overhead_s: f64,
    /// True when both directions at once reach clearly more than one direction alone.
    pub duplex: bool,
    /// The measured step time by token count; when present it prices computing steps in
    /// place of the four linear terms (which still price a step that only moves KV).
    pub token_curve: TokenCurve,
    /// Learned measured/predicted step-time ratio (1.0 = the warm-up fit is exact).
    pub correction: f64,
}

impl Default for CostModel {
    /// A mid-range GPU: 20 ms steps, PCIe-class links in both directions.
    fn default() -> Self {
        CostModel {
            step_base_s: 0.010,
            per_prefill_token_s: 0.000_05,
            per_decode_request_s: 0.000_2,
            per_context_token_s: 0.000_000_5,
            swap_out_bytes_per_s: 12e9,
            swap_in_bytes_per_s: 12e9,
            transfer_overhead_s: 0.000_05,
            duplex: true,
            token_curve: TokenCurve::NONE,
            correction: 1.0,
        }
    }
}

impl CostModel {
    pub fn validate(&self) -> Result<(), SchedulerError> {
        let terms = [
            self.step_base_s,
            self.per_prefill_token_s,
            self.per_decode_request_s,
            self.per_context_token_s,
            self.transfer_overhead_s,
        ];
        if terms.iter().any(|t| !t.is_finite() || *t < 0.0) {
            return Err(SchedulerError::InvalidConfig(
                "cost model times must be finite and >= 0".into(),
            ));
        }
        let bandwidths = [self.swap_out_bytes_per_s, self.swap_in_bytes_per_s];
        if bandwidths.iter().any(|b| !b.is_finite() || *b <= 0.0) {
            return Err(SchedulerError::InvalidConfig("cost model bandwidths must be > 0".into()));
        }
        let curve = &self.token_curve;
        TokenCurve::new(curve.tokens.values(), curve.decodes.values(), curve.per_context_token_s)?;
        if !(self.correction.is_finite() && self.correction > 0.0) {
            return Err(SchedulerError::InvalidConfig("cost model correction must be > 0".into()));
        }
        Ok(())
    }

    /// Predicted wall time of one step of this shape, in seconds.
    pub fn predict_step(&self, shape: StepShape) -> f64 {
        self.predict_step_uncorrected(shape) * self.correction
    }

    /// The fitted formula alone, as the warm-up measured it (no online correction).
    pub fn predict_step_uncorrected(&self, shape: StepShape) -> f64 {
        if let Some(seconds) = self.token_curve.predict(shape) {
            return seconds;
        }
        self.step_base_s
            + self.per_prefill_token_s * shape.prefill_tokens as f64
            + self.per_decode_request_s * shape.decode_requests as f64
            + self.per_context_token_s * shape.context_tokens as f64
    }

    /// Predicted time to prefill `tokens` tokens alone (the price of recomputing them).
    pub fn predict_prefill(&self, tokens: u64) -> f64 {
        self.predict_step(StepShape {
            prefill_tokens: tokens,
            decode_requests: 0,
            context_tokens: tokens,
        })
    }

    /// The most prefill tokens a chunk may add to a step of shape `committed` so that the
    /// step is predicted to take at most `step_s`: 0 when not even one fits, `u32::MAX` when
    /// any size does. The chunk's request has `computed` positions already, so c tokens add c
    /// prefill tokens and `computed + c` attended positions. The prediction is linear in c
    /// between the token curve's knots (and past the last one, where it never goes down), so
    /// the segments are searched from the largest c down, each by bisection.
    pub fn prefill_tokens_within(&self, committed: StepShape, computed: u64, step_s: f64) -> u32 {
        let fits = |tokens: u64| {
            self.predict_step(StepShape {
                prefill_tokens: committed.prefill_tokens + tokens,
                decode_requests: committed.decode_requests,
                context_tokens: committed.context_tokens + computed + tokens,
            }) <= step_s
        };
        // The largest c in [low, high] that fits, given fits(low) and not fits(high), the
        // prediction monotone in between.
        let largest = |mut low: u64, mut high: u64| {
            while high - low > 1 {
                let mid = low + (high - low) / 2;
                if fits(mid) {
                    low = mid;
                } else {
                    high = mid;
                }
            }
            low
        };
        let max = u64::from(u32::MAX);
        let tokens_before = committed.prefill_tokens + committed.decode_requests;
        // Where the prediction's slope in c may change: c = 1 and each knot of the token curve
        // above the committed tokens (none without a curve: linear in c throughout).
        let mut breaks = vec![1u64];
        if !self.token_curve.is_none() {
            let last = self.token_curve.tokens.last_knot();
            breaks.extend(
                TokenCurve::KNOTS
                    .iter()
                    .filter(|&&knot| knot <= last && knot > tokens_before + 1)
                    .map(|&knot| (knot - tokens_before).min(max)),
            );
        }
        // Past the last break the prediction never goes down.
        let top = *breaks.last().expect("c = 1 is a break");
        if fits(top) {
            return if fits(max) { u32::MAX } else { largest(top, max) as u32 };
        }
        // Each segment below is linear: if its lower end fits and its upper end does not, the
        // prediction rises across it.
        for pair in breaks.windows(2).rev() {
            if fits(pair[0]) {
                return largest(pair[0], pair[1]) as u32;
            }
        }
        0
    }

    pub fn bandwidth(&self, direction: Direction) -> f64 {
        match direction {
            Direction::Out => self.swap_out_bytes_per_s,
            Direction::In => self.swap_in_bytes_per_s,
        }
    }

    /// Predicted time of one transfer of `bytes` in `direction`, in seconds.
    pub fn predict_transfer(&self, bytes: u64, direction: Direction) -> f64 {
        self.transfer_overhead_s + bytes as f64 / self.bandwidth(direction)
    }

    /// Bytes `direction` can move while a step of `step_s` seconds computes, so a transfer
    /// hides behind compute instead of stalling it.
    pub fn byte_budget(&self, step_s: f64, direction: Direction) -> u64 {
        let usable = (step_s - self.transfer_overhead_s).max(0.0);
        (usable * self.bandwidth(direction)) as u64
    }

    /// Folds a measured step time into the correction factor (EMA with weight `alpha`).
    /// Measurements that are not finite and positive are ignored.
    pub fn observe_step(&mut self, shape: StepShape, measured_s: f64, alpha: f64) {
        let predicted_raw = self.predict_step_uncorrected(shape);
        if !(measured_s.is_finite() && measured_s > 0.0 && predicted_raw > 0.0) {
            return;
        }
        let ratio = (measured_s / predicted_raw).clamp(0.01, 100.0);
        self.correction = (1.0 - alpha) * self.correction + alpha * ratio;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn predicts_linear_step_time() {
        let model = CostModel {
            step_base_s: 0.01,
            per_prefill_token_s: 0.001,
            per_decode_request_s: 0.002,
            per_context_token_s: 0.0,
            ..CostModel::default()
        };
        let shape = StepShape { prefill_tokens: 10, decode_requests: 5, context_tokens: 0 };
        assert!((model.predict_step(shape) - 0.03).abs() < 1e-12);
    }

    #[test]
    fn correction_converges_to_measured_ratio() {
        let mut model = CostModel::default();
        let shape = StepShape { prefill_tokens: 100, decode_requests: 4, context_tokens: 500 };
        let truth = 3.0 * model.predict_step(shape);
        for _ in 0..100 {
            model.observe_step(shape, truth, 0.2);
        }
        assert!((model.correction - 3.0).abs() < 1e-3, "correction {}", model.correction);
        assert!((model.predict_step(shape) - truth).abs() / truth < 1e-3);
        model.observe_step(shape, f64::NAN, 0.2);
        assert!((model.correction - 3.0).abs() < 1e-3);
    }

    /// 1 ms per decode on top of its token (knots 1 and 2, then extended).
    fn curve(tokens_s: &[f64]) -> CostModel {
        CostModel { token_curve: TokenCurve::new(tokens_s, &[0.001, 0.002], 0.0).unwrap(), ..CostModel::default() }
    }

    #[test]
    fn the_curve_prices_computing_steps_and_the_linear_terms_the_rest() {
        // Knots 1, 2, 3, 4, 5, 6: flat to 3, a jump at 4, then 5 ms a token.
        let model = curve(&[0.040, 0.040, 0.040, 0.060, 0.065, 0.070]);
        let decodes = |n| StepShape { prefill_tokens: 0, decode_requests: n, context_tokens: 0 };
        assert!((model.predict_step(decodes(3)) - 0.043).abs() < 1e-12);
        assert!((model.predict_step(decodes(4)) - 0.064).abs() < 1e-12);
        // Past the last knot along its segment; a prefill has no decode term.
        let prefill = StepShape { prefill_tokens: 8, decode_requests: 0, context_tokens: 8 };
        assert!((model.predict_step(prefill) - 0.080).abs() < 1e-12);
        // A step that only moves KV: the linear base.
        assert!((model.predict_step(StepShape::default()) - model.step_base_s).abs() < 1e-12);
    }

    #[test]
    fn the_curve_is_linear_between_knots_and_may_dip() {
        // Knots 1..=8 (the 7th is 8): 8 tokens measured cheaper than 6 stays cheaper.
        let model = curve(&[0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.03]);
        let tokens = |n| model.token_curve.tokens.at(n);
        assert!((tokens(5) - 0.05).abs() < 1e-12);
        assert!((tokens(7) - 0.045).abs() < 1e-12);
        assert!((tokens(8) - 0.03).abs() < 1e-12);
        // Past the last knot a falling segment is extended flat, a rising one along its slope.
        assert!((tokens(20) - 0.03).abs() < 1e-12);
        let rising = curve(&[0.01, 0.02, 0.03]);
        assert!((rising.token_curve.tokens.at(10) - 0.10).abs() < 1e-12);
        // One knot: extended through 0.
        let one = Knots::new(&[0.002]).unwrap();
        assert!((one.at(3) - 0.006).abs() < 1e-12);
        assert_eq!(Knots::EMPTY.at(5), 0.0);
    }

    #[test]
    fn the_prefill_cap_is_the_largest_chunk_that_fits_where_the_curve_dips() {
        // 3 tokens cost more than 4 (the CI machine's GEMM): 2 tokens fit 52 ms, 3 do not, 4 do.
        let model = curve(&[0.040, 0.040, 0.060, 0.050, 0.055, 0.060]);
        let none = StepShape::default();
        assert_eq!(model.prefill_tokens_within(none, 0, 0.052), 4);
        assert_eq!(model.prefill_tokens_within(none, 0, 0.045), 2);
        assert_eq!(model.prefill_tokens_within(none, 0, 0.039), 0);
        // Against every chunk size, over curves with dips, decodes, context and a correction.
        let curves: [&[f64]; 4] = [
            &[0.040, 0.040, 0.060, 0.050, 0.055, 0.060, 0.058, 0.090, 0.120],
            &[0.010, 0.030, 0.020, 0.025, 0.070, 0.030, 0.040],
            &[0.020, 0.021],
            &[0.050, 0.040, 0.030, 0.020, 0.060, 0.055, 0.070, 0.065, 0.100, 0.090, 0.200, 0.150],
        ];
        for (i, values) in curves.iter().enumerate() {
            let mut model = curve(values);
            model.token_curve.per_context_token_s = 1e-5 * i as f64;
            model.correction = 1.0 + 0.1 * i as f64;
            for committed in [none, StepShape { prefill_tokens: 0, decode_requests: 2, context_tokens: 300 }] {
                for step_ms in [30, 45, 52, 61, 75, 110, 250] {
                    let step_s = f64::from(step_ms) / 1e3;
                    let fits = |c: u64| {
                        model.predict_step(StepShape {
                            prefill_tokens: c,
                            decode_requests: committed.decode_requests,
                            context_tokens: committed.context_tokens + 7 + c,
                        }) <= step_s
                    };
                    let expected = (1..=5_000).rev().find(|&c| fits(c)).unwrap_or(0);
                    assert!(!fits(20_000), "the scan reaches past every fitting size");
                    let cap = model.prefill_tokens_within(committed, 7, step_s);
                    assert_eq!(u64::from(cap), expected, "curve {i}, {committed:?}, {step_ms} ms");
                }
            }
        }
    }

    #[test]
    fn a_curve_needs_two_finite_knots() {
        assert!(TokenCurve::new(&[0.01], &[], 0.0).is_err());
        assert!(TokenCurve::new(&[0.01, f64::NAN], &[], 0.0).is_err());
        assert!(TokenCurve::new(&[0.01, 0.02], &[-1.0], 0.0).is_err());
        assert!(TokenCurve::new(&[], &[], 0.0).unwrap().is_none());
    }

    #[test]
    fn the_prefill_cap_inverts_the_prediction() {
        let linear = CostModel {
            step_base_s: 0.01,
            per_prefill_token_s: 0.001,
            per_decode_request_s: 0.002,
            per_context_token_s: 0.0001,
            ..CostModel::default()
        };
        let committed = StepShape { prefill_tokens: 0, decode_requests: 4, context_tokens: 400 };
        // 0.01 + 0.008 + 0.04 = 58 ms committed; each token adds 1.1 ms, plus 0.1 ms x 50 computed.
        let cap = linear.prefill_tokens_within(committed, 50, 0.100);
        assert_eq!(cap, 33, "(100 - 58 - 5) / 1.1 = 33.6");
        assert_eq!(linear.prefill_tokens_within(committed, 50, 0.058), 0);
        let free = CostModel { per_prefill_token_s: 0.0, per_context_token_s: 0.0, ..linear };
        assert_eq!(free.prefill_tokens_within(committed, 50, 0.100), u32::MAX);
        // With a curve: 3 decodes at 43 ms; a 4th token jumps the step to 60 ms + 3 ms.
        let model = curve(&[0.040, 0.040, 0.040, 0.060, 0.065, 0.070]);
        let three = StepShape { prefill_tokens: 0, decode_requests: 3, context_tokens: 0 };
        assert_eq!(model.prefill_tokens_within(three, 0, 0.0629), 0);
        assert_eq!(model.prefill_tokens_within(three, 0, 0.0631), 1);
        assert_eq!(model.prefill_tokens_within(three, 0, 0.0731), 3);
    }

    #[test]
    fn byte_budget_is_bandwidth_times_step() {
        let model = CostModel {
            swap_out_bytes_per_s: 1000.0,
            swap_in_bytes_per_s: 500.0,
            transfer_overhead_s: 0.0,
            ..CostModel::default()
        };
        assert_eq!(model.byte_budget(2.0, Direction::Out), 2000);
        assert_eq!(model.byte_budget(2.0, Direction::In), 1000);
        assert!((model.predict_transfer(1000, Direction::In) - 2.0).abs() < 1e-12);
    }
}
