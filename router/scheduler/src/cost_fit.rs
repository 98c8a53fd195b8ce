//! Fitting the linear step-cost model (`CostModel`'s four step terms) to timed steps: the one
//! fit the shard's warm-up and the simulator's derived profiles both use (through the Python
//! extension).
//!
//! Non-negative least squares on *relative* error: each step weighs by 1/time, so a fit that
//! is 10% off on a 50 ms step counts as much as 10% off on a 2 s one. Plain least squares lets
//! the largest shapes decide, and small steps — most of a serving run — come out several times
//! too slow. With four terms the non-negative solution is found exactly by solving every
//! subset of active terms and keeping the best admissible one.

use nalgebra::{DMatrix, DVector};

use crate::cost_model::StepShape;

/// `[step_base_s, per_prefill_token_s, per_decode_request_s, per_context_token_s]`.
pub type StepCoefficients = [f64; 4];

/// The features of a step in the order of [`StepCoefficients`].
pub fn features(shape: StepShape) -> [f64; 4] {
    [1.0, shape.prefill_tokens as f64, shape.decode_requests as f64, shape.context_tokens as f64]
}

/// Fits the step terms to `(shape, seconds)` samples; all zero when nothing fits (no sample
/// with a positive, finite time).
pub fn fit_step_cost(samples: &[(StepShape, f64)]) -> StepCoefficients {
    let samples: Vec<_> = samples.iter().filter(|(_, seconds)| seconds.is_finite() && *seconds > 0.0).collect();
    let mut best = ([0.0; 4], f64::INFINITY);
    if samples.is_empty() {
        return best.0;
    }
    // Rows weighted by 1/time: the residuals are relative errors.
    let weighted = DMatrix::from_fn(samples.len(), 4, |row, column| {
        features(samples[row].0)[column] / samples[row].1
    });
    let ones = DVector::from_element(samples.len(), 1.0);
    for mask in 1u8..16 {
        let columns: Vec<usize> = (0..4).filter(|column| mask >> column & 1 == 1).collect();
        let Some(solution) = least_squares(&weighted.select_columns(&columns), &ones) else { continue };
        if solution.iter().any(|&value| value < 0.0) {
            continue;
        }
        let mut coefficients = [0.0; 4];
        for (&column, &value) in columns.iter().zip(solution.iter()) {
            coefficients[column] = value;
        }
        let residual = (&weighted * DVector::from_row_slice(&coefficients) - &ones).norm_squared();
        if residual < best.1 {
            best = (coefficients, residual);
        }
    }
    best.0
}

/// The least-squares solution of `a x ≈ b`, columns scaled to unit norm first (features span
/// ten orders of magnitude); `None` when a column is all zero or the solve fails.
fn least_squares(a: &DMatrix<f64>, b: &DVector<f64>) -> Option<DVector<f64>> {
    let norms: Vec<f64> = a.column_iter().map(|column| column.norm()).collect();
    if norms.iter().any(|&norm| !(norm > 0.0 && norm.is_finite())) {
        return None;
    }
    let scaled = DMatrix::from_fn(a.nrows(), a.ncols(), |row, column| a[(row, column)] / norms[column]);
    let solution = scaled.svd(true, true).solve(b, 1e-12).ok()?;
    Some(DVector::from_iterator(solution.len(), solution.iter().zip(&norms).map(|(value, norm)| value / norm)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shapes() -> Vec<StepShape> {
        let mut shapes = Vec::new();
        for prefill in [64, 256, 512] {
            shapes.push(StepShape { prefill_tokens: prefill, decode_requests: 0, context_tokens: prefill });
        }
        for (decodes, context) in [(1, 64), (1, 512), (8, 32), (8, 256), (16, 128), (32, 64), (16, 512)] {
            shapes.push(StepShape { prefill_tokens: 0, decode_requests: decodes, context_tokens: decodes * context });
        }
        shapes.push(StepShape { prefill_tokens: 128, decode_requests: 8, context_tokens: 128 + 8 * 128 });
        shapes
    }

    fn time(terms: [f64; 4], shape: StepShape) -> f64 {
        features(shape).iter().zip(terms).map(|(x, t)| x * t).sum()
    }

    #[test]
    fn recovers_a_linear_machine_exactly() {
        let truth = [0.05, 0.002, 0.01, 0.0001];
        let samples: Vec<_> = shapes().into_iter().map(|s| (s, time(truth, s))).collect();
        let fitted = fit_step_cost(&samples);
        for (f, t) in fitted.iter().zip(truth) {
            assert!((f - t).abs() <= 1e-6 * t, "{fitted:?}");
        }
    }

    #[test]
    fn terms_are_never_negative() {
        // A machine where more context is cheaper: plain least squares goes negative.
        let samples: Vec<_> = shapes().into_iter().map(|s| (s, time([0.05, 0.002, 0.01, -0.00001], s))).collect();
        assert!(fit_step_cost(&samples).iter().all(|&v| v >= 0.0));
    }

    #[test]
    fn small_steps_stay_accurate_when_large_ones_are_superlinear() {
        // Attention that grows faster than linearly in context: only the largest shapes feel it.
        let truth = |s: StepShape| time([0.05, 0.002, 0.01, 0.0001], s) + 2e-8 * (s.context_tokens as f64).powi(2);
        let samples: Vec<_> = shapes().into_iter().map(|s| (s, truth(s))).collect();
        let fitted = fit_step_cost(&samples);
        let small = StepShape { prefill_tokens: 0, decode_requests: 4, context_tokens: 512 };
        let error = (time(fitted, small) - truth(small)).abs() / truth(small);
        assert!(error < 0.15, "{error}");
    }

    #[test]
    fn nothing_to_fit_gives_zeros() {
        assert_eq!(fit_step_cost(&[]), [0.0; 4]);
        assert_eq!(fit_step_cost(&[(StepShape::default(), f64::NAN)]), [0.0; 4]);
    }
}
