//! The scheduler crate's definitions that the Python side calls instead of keeping copies:
//! the percentile and the attainment verdict (the benchmark), the step-cost fit (the shard's
//! warm-up and the simulator's derived profiles) and the simulated machine's step time (the
//! simulator's profiles). Thin pyo3 shims over `superinfer_scheduler`.
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use superinfer_scheduler::attainment;
use superinfer_scheduler::cost_fit::{fit_step_cost as fit, fit_token_curve};
use superinfer_scheduler::{Slo, StepShape, TokenCurve};

use crate::simulate::parse_step_time;

/// The `p`-th percentile of `values` (linear interpolation, as numpy); `None` when empty.
#[pyfunction]
pub fn percentile(values: Vec<f64>, p: f64) -> Option<f64> {
    attainment::percentile(&values, p)
}

/// `(ttft_met, tbt_met)` of a request with first token after `ttft_s`, TBT `tbt_s` (its
/// gaps' percentile) and longest gap `max_gap_s` against objectives in seconds (`tbt_met`
/// holds the stall bound too; `max_stall_s` None: the default multiple of `tbt_slo_s`).
#[pyfunction]
#[pyo3(signature = (ttft_s, tbt_s, max_gap_s, ttft_slo_s, tbt_slo_s, max_stall_s=None))]
pub fn meets(ttft_s: f64, tbt_s: f64, max_gap_s: f64, ttft_slo_s: f64, tbt_slo_s: f64, max_stall_s: Option<f64>) -> (bool, bool) {
    let slo = Slo::new(ttft_slo_s, tbt_slo_s).with_max_stall(max_stall_s);
    let verdict = attainment::meets(ttft_s, tbt_s, max_gap_s, slo);
    (verdict.ttft_met, verdict.tbt_met)
}

/// The stall bound a request gets by default: this many times its TBT objective.
#[pyfunction]
pub fn default_stall_factor() -> f64 {
    superinfer_scheduler::DEFAULT_STALL_FACTOR
}

/// The scheduler's defaults, as the router's flags take them: the policies (the baselines
/// first, the default last), the objectives of a request that names none (ms), the TBT
/// percentile, the stall factor, the step's limits and whether RotaSched time-shares under
/// overload. Python's benchmark and simulator read them here rather than keeping copies.
#[pyfunction]
pub fn scheduler_defaults(py: Python<'_>) -> PyResult<Bound<'_, pyo3::types::PyDict>> {
    use superinfer_scheduler as s;
    let defaults = pyo3::types::PyDict::new(py);
    let policies: Vec<&str> = s::PolicyKind::ALL.iter().map(|kind| kind.as_str()).collect();
    defaults.set_item("policies", policies)?;
    defaults.set_item("default_policy", s::PolicyKind::default().as_str())?;
    defaults.set_item("ttft_slo_ms", s::DEFAULT_TTFT_S * 1e3)?;
    defaults.set_item("tbt_slo_ms", s::DEFAULT_TBT_S * 1e3)?;
    defaults.set_item("tbt_percentile", s::DEFAULT_TBT_PERCENTILE)?;
    defaults.set_item("stall_factor", s::DEFAULT_STALL_FACTOR)?;
    defaults.set_item("max_batch_tokens", s::DEFAULT_MAX_BATCH_TOKENS)?;
    defaults.set_item("max_batch_requests", s::DEFAULT_MAX_BATCH_REQUESTS)?;
    defaults.set_item("time_share", s::RotaSchedSettings::default().time_share)?;
    Ok(defaults)
}

fn shape((prefill_tokens, decode_requests, context_tokens): (u64, u64, u64)) -> StepShape {
    StepShape { prefill_tokens, decode_requests, context_tokens }
}

/// Fits `(step_base_s, per_prefill_token_s, per_decode_request_s, per_context_token_s)` to
/// steps of `shapes` — `(prefill tokens, decode requests, context tokens)` — that took
/// `seconds` (`superinfer_scheduler::cost_fit`).
#[pyfunction]
pub fn fit_step_cost(shapes: Vec<(u64, u64, u64)>, seconds: Vec<f64>) -> PyResult<(f64, f64, f64, f64)> {
    if shapes.len() != seconds.len() {
        return Err(PyValueError::new_err(format!("{} shapes but {} times", shapes.len(), seconds.len())));
    }
    let samples: Vec<_> = shapes.into_iter().map(shape).zip(seconds).collect();
    let [base, prefill, decode, context] = fit(&samples);
    Ok((base, prefill, decode, context))
}

/// The token counts a step-time curve is measured at (`TokenCurve::KNOTS`): the warm-up
/// times steps of these sizes.
#[pyfunction]
pub fn token_curve_knots() -> Vec<u64> {
    TokenCurve::KNOTS.to_vec()
}

/// Fits the token curve — `(tokens_s, decodes_s, per_context_token_s)`, `tokens_s` empty
/// when the steps leave a knot unmeasured — to steps of `shapes` that took `seconds`
/// (`superinfer_scheduler::cost_fit::fit_token_curve`).
#[pyfunction]
pub fn fit_step_curve(shapes: Vec<(u64, u64, u64)>, seconds: Vec<f64>) -> PyResult<(Vec<f64>, Vec<f64>, f64)> {
    if shapes.len() != seconds.len() {
        return Err(PyValueError::new_err(format!("{} shapes but {} times", shapes.len(), seconds.len())));
    }
    let samples: Vec<_> = shapes.into_iter().map(shape).zip(seconds).collect();
    let curve = fit_token_curve(&samples);
    Ok((curve.tokens.values().to_vec(), curve.decodes.values().to_vec(), curve.per_context_token_s))
}

/// Seconds a simulated machine (`{"kind": "linear" | "roofline", …}`, as `simulate` takes
/// it) needs for each step of `shapes`.
#[pyfunction]
pub fn step_time(step_time_json: &str, shapes: Vec<(u64, u64, u64)>) -> PyResult<Vec<f64>> {
    let model = parse_step_time(step_time_json).map_err(PyValueError::new_err)?;
    Ok(shapes.into_iter().map(|s| model.step_time(shape(s))).collect())
}
