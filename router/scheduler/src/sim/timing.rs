//! The simulated hardware: how long a step really takes (which the scheduler only predicts
//! through its own `CostModel`) and how long a transfer takes on the link.

use crate::cost_model::{CostModel, StepShape};
use crate::plan::StepPlan;

/// A roofline step: compute-bound or memory-bound, whichever is slower, plus a fixed launch
/// overhead. Weights are read once per step; every attended context token's KV is read once.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Roofline {
    pub overhead_s: f64,
    /// Dense FLOPs per processed token (≈ 2 × active parameters).
    pub flops_per_token: f64,
    /// Attention FLOPs per attended context position per step (≈ 4 × layers × hidden).
    pub flops_per_context_token: f64,
    /// Sustained FLOP/s (peak × achievable efficiency).
    pub flops_per_s: f64,
    /// Bytes of weights read every step (active experts only for a mixture of experts).
    pub weight_bytes: f64,
    /// KV bytes read per attended context position.
    pub kv_bytes_per_context_token: f64,
    /// Sustained memory bandwidth, bytes/s.
    pub memory_bytes_per_s: f64,
}

/// The true step time of the simulated machine.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum StepTimeModel {
    /// The cost model the shard measures at warm-up (its token curve, else its linear terms),
    /// taken as the truth (its `correction` is ignored: that is the scheduler's belief, not
    /// the machine). The JSON kind keeps its name, "linear".
    Linear(CostModel),
    Roofline(Roofline),
}

impl StepTimeModel {
    pub fn step_time(&self, shape: StepShape) -> f64 {
        match self {
            StepTimeModel::Linear(model) => model.predict_step_uncorrected(shape),
            StepTimeModel::Roofline(r) => {
                let tokens = (shape.prefill_tokens + shape.decode_requests) as f64;
                let context = shape.context_tokens as f64;
                let compute =
                    (r.flops_per_token * tokens + r.flops_per_context_token * context) / r.flops_per_s;
                let memory = (r.weight_bytes + r.kv_bytes_per_context_token * context) / r.memory_bytes_per_s;
                r.overhead_s + compute.max(memory)
            }
        }
    }
}

/// The device ⇄ host link.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinkModel {
    pub out_bytes_per_s: f64,
    pub in_bytes_per_s: f64,
    /// Fixed cost of each transfer (one request's blocks in one direction).
    pub overhead_s: f64,
    /// Both directions at full speed at once; otherwise they share one queue.
    pub duplex: bool,
}

/// What a plan computes. A one-token entry past position 0 is a decode; everything else is a
/// prefill chunk (a one-token final prefill chunk is costed as a decode, a negligible error).
pub fn step_shape(plan: &StepPlan) -> StepShape {
    let mut shape = StepShape::default();
    for entry in &plan.scheduled {
        if entry.num_new_tokens == 1 && entry.num_computed_tokens > 0 {
            shape.decode_requests += 1;
        } else {
            shape.prefill_tokens += u64::from(entry.num_new_tokens);
        }
        shape.context_tokens += u64::from(entry.end_position());
    }
    shape
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roofline_takes_the_slower_bound() {
        let r = Roofline {
            overhead_s: 0.001,
            flops_per_token: 1e6,
            flops_per_context_token: 0.0,
            flops_per_s: 1e12,
            weight_bytes: 1e9,
            kv_bytes_per_context_token: 0.0,
            memory_bytes_per_s: 1e12,
        };
        let model = StepTimeModel::Roofline(r);
        // One decode: memory-bound (1 ms of weights) beats 1 µs of compute.
        let decode = StepShape {
            prefill_tokens: 0,
            decode_requests: 1,
            context_tokens: 10,
        };
        assert!((model.step_time(decode) - 0.002).abs() < 1e-12);
        // 4096 prefill tokens: 4.096 ms of compute beats 1 ms of weights.
        let prefill = StepShape {
            prefill_tokens: 4096,
            decode_requests: 0,
            context_tokens: 4096,
        };
        assert!((model.step_time(prefill) - 0.005096).abs() < 1e-12);
    }
}
