//! Step-time and transfer-time model (the shard's `CostModel` message), refined online.
//!
//! step ≈ step_base_s + per_prefill_token_s·prefill_tokens + per_decode_request_s·decodes
//!        + per_context_token_s·context_tokens;  transfer ≈ transfer_overhead_s + bytes / bw.
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
        if !(self.correction.is_finite() && self.correction > 0.0) {
            return Err(SchedulerError::InvalidConfig("cost model correction must be > 0".into()));
        }
        Ok(())
    }

    /// Predicted wall time of one step of this shape, in seconds.
    pub fn predict_step(&self, shape: StepShape) -> f64 {
        self.predict_step_uncorrected(shape) * self.correction
    }

    /// The linear formula alone, as the warm-up fitted it (no online correction).
    pub fn predict_step_uncorrected(&self, shape: StepShape) -> f64 {
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
