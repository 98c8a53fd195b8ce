//! Fitting the linear step-cost model (`CostModel`'s four step terms) to timed steps: the one
//! fit the shard's warm-up and the simulator's derived profiles both use (through the Python
//! extension).
//!
//! Non-negative least squares on *relative* error: each step weighs by 1/time, so a fit that
//! is 10% off on a 50 ms step counts as much as 10% off on a 2 s one. Plain least squares lets
//! the largest shapes decide, and small steps — most of a serving run — come out several times
//! too slow. With four terms the non-negative solution is found exactly by solving every
//! subset of active terms and keeping the best admissible one.
//!
//! [`fit_token_curve`] fits the same samples with the step's token count priced by a curve
//! through [`TokenCurve::KNOTS`] instead of one slope (`CostModel::token_curve`).

use nalgebra::{DMatrix, DVector};

use crate::cost_model::{StepShape, TokenCurve};

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

/// Fits a [`TokenCurve`] to `(shape, seconds)` samples by least squares on relative error
/// (as [`fit_step_cost`]): a value per knot of each curve, from the first up to the first knot
/// at or above the samples' largest count, and a non-negative context term. A curve's value
/// is linear in its knots' values (a count between two knots weighs on both, by its
/// distance), so one solve finds them all. Gives [`TokenCurve::NONE`] when the samples span
/// fewer than two token knots or leave a knot without a sample near it (between its
/// neighbours). Every value is kept non-negative by solving with that constraint (a knot or
/// the context term that noise would drive below 0 is fitted at 0 and the rest re-solved).
pub fn fit_token_curve(samples: &[(StepShape, f64)]) -> TokenCurve {
    let tokens = |shape: &StepShape| shape.prefill_tokens + shape.decode_requests;
    let samples: Vec<_> = samples
        .iter()
        .filter(|(shape, seconds)| seconds.is_finite() && *seconds > 0.0 && tokens(shape) > 0)
        .collect();
    let knots = &TokenCurve::KNOTS[..];
    // Knots 0..count cover every count up to `largest`.
    let knots_for = |largest: u64| {
        if largest == 0 {
            return Some(0);
        }
        knots.iter().position(|&knot| knot >= largest).map(|last| last + 1)
    };
    let (Some(token_count), Some(decode_count)) = (
        knots_for(samples.iter().map(|(shape, _)| tokens(shape)).max().unwrap_or(0)),
        knots_for(samples.iter().map(|(shape, _)| shape.decode_requests).max().unwrap_or(0)),
    ) else {
        return TokenCurve::NONE;
    };
    if token_count < 2 {
        return TokenCurve::NONE;
    }
    let width = token_count + decode_count + 1;
    // The hat weights of `count` over knots 0..n, written at `offset` (count 0: none).
    let hat = |features: &mut [f64], offset: usize, count: u64| {
        let Some(i) = knots.iter().position(|&knot| knot >= count) else { return };
        if count == 0 {
            return;
        }
        if i == 0 || knots[i] == count {
            features[offset + i] = 1.0;
        } else {
            let t = (count - knots[i - 1]) as f64 / (knots[i] - knots[i - 1]) as f64;
            features[offset + i - 1] = 1.0 - t;
            features[offset + i] = t;
        }
    };
    let weighted = DMatrix::from_fn(samples.len(), width, |r, c| {
        let (shape, seconds) = samples[r];
        let mut features = vec![0.0; width];
        hat(&mut features, 0, tokens(shape));
        hat(&mut features, token_count, shape.decode_requests);
        features[width - 1] = shape.context_tokens as f64;
        features[c] / seconds
    });
    // Every knot needs a sample that weighs on it; a context column of zeros is left out.
    let norms: Vec<f64> = weighted.column_iter().map(|column| column.norm()).collect();
    if norms[..width - 1].iter().any(|&norm| !(norm > 0.0 && norm.is_finite())) {
        return TokenCurve::NONE;
    }
    let columns: Vec<usize> = (0..width).filter(|&c| c < width - 1 || norms[c] > 0.0).collect();
    let ones = DVector::from_element(samples.len(), 1.0);
    let Some(solution) = non_negative_least_squares(&weighted.select_columns(&columns), &ones) else {
        return TokenCurve::NONE;
    };
    let mut coefficients = vec![0.0; width];
    for (&column, &value) in columns.iter().zip(solution.iter()) {
        coefficients[column] = value;
    }
    TokenCurve::new(&coefficients[..token_count], &coefficients[token_count..width - 1], coefficients[width - 1])
        .unwrap_or(TokenCurve::NONE)
}

/// The solution of `a x ≈ b` in least squares with every `x ≥ 0` (Lawson and Hanson's active
/// set method, on columns scaled to unit norm): terms join the solved set while one would
/// lower the residual, and a solve that drives one below 0 steps back to where it reaches 0
/// and drops it. `None` when a column is all zero or a solve fails.
fn non_negative_least_squares(a: &DMatrix<f64>, b: &DVector<f64>) -> Option<DVector<f64>> {
    let n = a.ncols();
    let norms: Vec<f64> = a.column_iter().map(|column| column.norm()).collect();
    if norms.iter().any(|&norm| !(norm > 0.0 && norm.is_finite())) {
        return None;
    }
    let scaled = DMatrix::from_fn(a.nrows(), n, |row, column| a[(row, column)] / norms[column]);
    let tolerance = 1e-10 * scaled.norm().max(1.0) * b.norm().max(1.0);
    // The least-squares solution over the `passive` columns, zeros elsewhere.
    let solve = |passive: &[bool]| -> Option<DVector<f64>> {
        let columns: Vec<usize> = (0..n).filter(|&c| passive[c]).collect();
        let solution = scaled.select_columns(&columns).svd(true, true).solve(b, 1e-12).ok()?;
        let mut full = DVector::zeros(n);
        for (&column, &value) in columns.iter().zip(solution.iter()) {
            full[column] = value;
        }
        Some(full)
    };
    let mut x = DVector::zeros(n);
    let mut passive = vec![false; n];
    for _ in 0..3 * n + 10 {
        let gradient = scaled.transpose() * (b - &scaled * &x);
        let Some(join) = (0..n)
            .filter(|&c| !passive[c] && gradient[c] > tolerance)
            .max_by(|&i, &j| gradient[i].total_cmp(&gradient[j]))
        else {
            break;
        };
        passive[join] = true;
        loop {
            let s = solve(&passive)?;
            if (0..n).all(|c| !passive[c] || s[c] > 0.0) {
                x = s;
                break;
            }
            // Step from x towards s until the first passive term reaches 0, and drop it.
            let step = (0..n)
                .filter(|&c| passive[c] && s[c] <= 0.0)
                .map(|c| x[c] / (x[c] - s[c]))
                .fold(f64::INFINITY, f64::min);
            x += (&s - &x) * step;
            for c in 0..n {
                if passive[c] && x[c] <= tolerance {
                    passive[c] = false;
                    x[c] = 0.0;
                }
            }
            if !passive.iter().any(|&p| p) {
                break;
            }
        }
    }
    Some(DVector::from_iterator(n, x.iter().zip(&norms).map(|(value, norm)| (value / norm).max(0.0))))
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
    use crate::cost_model::CostModel;

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

    /// A machine whose dense layers change kernel at 4 tokens (+40%): a step costs 50 ms up to
    /// 3 tokens, 70 ms from 4, then 1 ms a token beyond 8; 2 ms per decode, 10 µs a position.
    fn cliff(shape: StepShape) -> f64 {
        let n = (shape.prefill_tokens + shape.decode_requests) as f64;
        let dense = if n < 4.0 { 0.050 } else { 0.070 + 0.001 * (n - 8.0).max(0.0) };
        dense + 0.002 * shape.decode_requests as f64 + 1e-5 * shape.context_tokens as f64
    }

    fn ladder() -> Vec<StepShape> {
        let mut shapes = Vec::new();
        for n in TokenCurve::KNOTS.into_iter().filter(|&n| n <= 512) {
            shapes.push(StepShape { prefill_tokens: n, decode_requests: 0, context_tokens: n });
            if n <= 32 {
                shapes.push(StepShape { prefill_tokens: 0, decode_requests: n, context_tokens: n * 32 });
            }
        }
        shapes.push(StepShape { prefill_tokens: 0, decode_requests: 1, context_tokens: 512 });
        shapes.push(StepShape { prefill_tokens: 0, decode_requests: 16, context_tokens: 16 * 512 });
        shapes
    }

    #[test]
    fn the_token_curve_follows_a_kernel_change_the_linear_fit_cannot() {
        let samples: Vec<_> = ladder().into_iter().map(|s| (s, cliff(s))).collect();
        let curve = fit_token_curve(&samples);
        assert_eq!(curve.tokens.values().len(), 16, "token knots 1..=512");
        assert_eq!(curve.decodes.values().len(), 11, "decode knots 1..=32");
        assert!((curve.decodes.at(12) - 0.024).abs() < 1e-6, "{curve:?}");
        assert!((curve.per_context_token_s - 1e-5).abs() < 1e-8, "{curve:?}");
        let with_curve = CostModel { token_curve: curve, ..CostModel::default() };
        let [step_base_s, per_prefill_token_s, per_decode_request_s, per_context_token_s] = fit_step_cost(&samples);
        let linear = CostModel { step_base_s, per_prefill_token_s, per_decode_request_s, per_context_token_s, ..CostModel::default() };
        let mut worst_linear = 0.0_f64;
        for decodes in [3, 4, 5, 6, 8, 12] {
            let shape = StepShape { prefill_tokens: 0, decode_requests: decodes, context_tokens: decodes * 100 };
            let error = |model: &CostModel| (model.predict_step(shape) - cliff(shape)).abs() / cliff(shape);
            assert!(error(&with_curve) < 0.02, "{decodes} decodes: {}", error(&with_curve));
            worst_linear = worst_linear.max(error(&linear));
        }
        assert!(worst_linear > 0.1, "the linear fit was expected to miss the cliff: {worst_linear}");
    }

    #[test]
    fn non_negative_least_squares_fixes_a_negative_term_at_zero_and_refits_the_rest() {
        // Unconstrained: x = (1, -1). With x >= 0: x2 = 0 and x1 minimises (x1 - 1)² + x1².
        let a = DMatrix::from_row_slice(3, 2, &[1.0, 0.0, 0.0, 1.0, 1.0, 1.0]);
        let b = DVector::from_column_slice(&[1.0, -1.0, 0.0]);
        let x = non_negative_least_squares(&a, &b).unwrap();
        assert!((x[0] - 0.5).abs() < 1e-9 && x[1] == 0.0, "{x}");
        // A solution that is non-negative already is the least-squares one.
        let b = DVector::from_column_slice(&[1.0, 2.0, 3.0]);
        let x = non_negative_least_squares(&a, &b).unwrap();
        assert!((x[0] - 1.0).abs() < 1e-9 && (x[1] - 2.0).abs() < 1e-9, "{x}");
    }

    /// A memory-bound machine: a step reads 16 GB of weights and 128 KiB per attended
    /// position at 3.2 TB/s, or computes 16 GFLOP per token at 600 TFLOP/s, whichever is
    /// longer, plus 1.5 ms.
    fn roofline(shape: StepShape) -> f64 {
        let tokens = (shape.prefill_tokens + shape.decode_requests) as f64;
        let memory = (16e9 + 131_072.0 * shape.context_tokens as f64) / 3.2e12;
        0.0015 + memory.max(tokens * 16e9 / 600e12)
    }

    #[test]
    fn the_curve_keeps_the_context_term_of_a_memory_bound_decode() {
        // Shapes as a warm-up times them: decodes at each knot over short contexts, a few
        // batches over long ones, prefills at each knot.
        let mut shapes = Vec::new();
        for n in TokenCurve::KNOTS.into_iter().filter(|&n| n <= 8192) {
            shapes.push(StepShape { prefill_tokens: n, decode_requests: 0, context_tokens: n });
            if n <= 256 {
                shapes.push(StepShape { prefill_tokens: 0, decode_requests: n, context_tokens: n * 32 });
            }
        }
        for (batch, context) in [(1, 2048), (32, 1024), (64, 2048), (256, 256), (256, 2048)] {
            shapes.push(StepShape { prefill_tokens: 0, decode_requests: batch, context_tokens: batch * context });
        }
        let samples: Vec<_> = shapes.iter().map(|&s| (s, roofline(s))).collect();
        let curve = fit_token_curve(&samples);
        assert!(curve.per_context_token_s > 0.0, "{curve:?}");
        let model = CostModel { token_curve: curve, ..CostModel::default() };
        for (batch, context) in [(1, 300), (20, 1500), (100, 1500), (200, 1500), (200, 300)] {
            let shape = StepShape { prefill_tokens: 0, decode_requests: batch, context_tokens: batch * context };
            let error = (model.predict_step(shape) - roofline(shape)).abs() / roofline(shape);
            assert!(error < 0.08, "{batch} decodes over {context}: {error}");
        }
    }

    #[test]
    fn a_knot_without_a_step_near_it_gives_no_curve() {
        // Steps of 1 and 64 tokens only: the knots between them cannot be told apart.
        let samples: Vec<_> = [1, 64]
            .into_iter()
            .map(|n| StepShape { prefill_tokens: n, decode_requests: 0, context_tokens: n })
            .map(|s| (s, cliff(s)))
            .collect();
        assert!(fit_token_curve(&samples).is_none());
        assert!(fit_token_curve(&[]).is_none());
    }

    #[test]
    fn nothing_to_fit_gives_zeros() {
        assert_eq!(fit_step_cost(&[]), [0.0; 4]);
        assert_eq!(fit_step_cost(&[(StepShape::default(), f64::NAN)]), [0.0; 4]);
    }
}
