//! `superinfer._router.simulate(config_json) -> str`: the pyo3 entry point of the simulator
//! (`superinfer_scheduler::sim`). Parses the JSON config (requests column-wise, scheduler
//! fields optional over `SchedulerConfig::default()`), runs the simulation with the GIL
//! released, and answers JSON (per-request outcomes column-wise).

use std::time::Instant;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use serde::Deserialize;
use serde_json::{json, Value};
use superinfer_scheduler::sim::{self, Charges, LinkModel, Roofline, SimConfig, SimReport, SimRequest, StepTimeModel};
use superinfer_scheduler::{CostModel, PolicyKind, RotaSchedSettings, SchedulerConfig, SchedulerStats, Slo, TokenCurve};

#[derive(Deserialize)]
struct SloJson {
    ttft_s: f64,
    tbt_s: f64,
    #[serde(default)]
    max_stall_s: Option<f64>,
}

/// `TokenCurve`, as the shard's warm-up report writes it (absent or empty: no curve).
#[derive(Deserialize, Default)]
#[serde(default)]
struct TokenCurveJson {
    tokens_s: Vec<f64>,
    decodes_s: Vec<f64>,
    per_context_token_s: f64,
}

#[derive(Deserialize)]
struct CostJson {
    step_base_s: f64,
    per_prefill_token_s: f64,
    per_decode_request_s: f64,
    per_context_token_s: f64,
    swap_out_bytes_per_s: f64,
    swap_in_bytes_per_s: f64,
    transfer_overhead_s: f64,
    duplex: bool,
    #[serde(default)]
    token_curve: TokenCurveJson,
}

impl TryFrom<CostJson> for CostModel {
    type Error = String;

    fn try_from(c: CostJson) -> Result<Self, String> {
        let curve = &c.token_curve;
        let token_curve = TokenCurve::new(&curve.tokens_s, &curve.decodes_s, curve.per_context_token_s)
            .map_err(|e| format!("cost model: {e}"))?;
        Ok(CostModel {
            step_base_s: c.step_base_s,
            per_prefill_token_s: c.per_prefill_token_s,
            per_decode_request_s: c.per_decode_request_s,
            per_context_token_s: c.per_context_token_s,
            swap_out_bytes_per_s: c.swap_out_bytes_per_s,
            swap_in_bytes_per_s: c.swap_in_bytes_per_s,
            transfer_overhead_s: c.transfer_overhead_s,
            duplex: c.duplex,
            token_curve,
            correction: 1.0,
        })
    }
}

#[derive(Deserialize)]
struct SchedulerJson {
    policy: String,
    cost_model: CostJson,
    block_size: Option<u32>,
    num_device_blocks: Option<u32>,
    num_host_blocks: Option<u32>,
    block_bytes: Option<u64>,
    max_batch_tokens: Option<u32>,
    max_batch_requests: Option<u32>,
    prefix_caching: Option<bool>,
    default_slo: Option<SloJson>,
    /// RotaSched's time-sharing under overload (`RotaSchedSettings::time_share`; absent: its
    /// default).
    time_share: Option<bool>,
}

#[derive(Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
enum StepTimeJson {
    Linear(CostJson),
    Roofline {
        overhead_s: f64,
        flops_per_token: f64,
        flops_per_context_token: f64,
        flops_per_s: f64,
        weight_bytes: f64,
        kv_bytes_per_context_token: f64,
        memory_bytes_per_s: f64,
    },
}

/// `Charges`: what a step costs beyond its forward; every field optional (default 0 / false).
#[derive(Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
struct ChargesJson {
    per_step_s: f64,
    transfer_stall: f64,
    planning: bool,
}

#[derive(Deserialize)]
struct LinkJson {
    out_bytes_per_s: f64,
    in_bytes_per_s: f64,
    overhead_s: f64,
    duplex: bool,
}

/// Column-wise: one entry per request in each list (the objectives lists are optional).
#[derive(Deserialize)]
struct RequestsJson {
    arrival: Vec<f64>,
    prompt_tokens: Vec<u32>,
    max_new_tokens: Vec<u32>,
    ttft_s: Option<Vec<f64>>,
    tbt_s: Option<Vec<f64>>,
    max_stall_s: Option<Vec<f64>>,
    /// Priority classes (absent: 0 for every request).
    priority: Option<Vec<i32>>,
}

#[derive(Deserialize)]
struct ConfigJson {
    scheduler: SchedulerJson,
    step_time: StepTimeJson,
    link: LinkJson,
    #[serde(default)]
    charges: ChargesJson,
    requests: RequestsJson,
    #[serde(default = "default_percentile")]
    tbt_percentile: f64,
    #[serde(default = "default_max_time")]
    max_sim_time_s: f64,
    #[serde(default = "default_gap_samples")]
    gap_samples: usize,
    /// Answer every planned step too (`SimConfig::step_log`).
    #[serde(default)]
    step_log: bool,
}

fn default_percentile() -> f64 {
    90.0
}
fn default_max_time() -> f64 {
    1e7
}
fn default_gap_samples() -> usize {
    2000
}

fn scheduler_config(s: SchedulerJson) -> Result<SchedulerConfig, String> {
    let defaults = SchedulerConfig::default();
    Ok(SchedulerConfig {
        policy: s.policy.parse::<PolicyKind>().map_err(|e| e.to_string())?,
        cost_model: s.cost_model.try_into()?,
        block_size: s.block_size.unwrap_or(defaults.block_size),
        num_device_blocks: s.num_device_blocks.unwrap_or(defaults.num_device_blocks),
        num_host_blocks: s.num_host_blocks.unwrap_or(defaults.num_host_blocks),
        block_bytes: s.block_bytes.unwrap_or(defaults.block_bytes),
        max_batch_tokens: s.max_batch_tokens.unwrap_or(defaults.max_batch_tokens),
        max_batch_requests: s.max_batch_requests.unwrap_or(defaults.max_batch_requests),
        prefix_caching: s.prefix_caching.unwrap_or(defaults.prefix_caching),
        default_slo: s
            .default_slo
            .map_or(defaults.default_slo, |d| Slo::new(d.ttft_s, d.tbt_s).with_max_stall(d.max_stall_s)),
        rotasched: RotaSchedSettings { time_share: s.time_share.unwrap_or(defaults.rotasched.time_share), ..defaults.rotasched },
        ..defaults
    })
}

fn requests(r: RequestsJson) -> Result<Vec<SimRequest>, String> {
    let n = r.arrival.len();
    let same = |len: Option<usize>| len.is_none_or(|l| l == n);
    if r.prompt_tokens.len() != n
        || r.max_new_tokens.len() != n
        || !same(r.ttft_s.as_ref().map(Vec::len))
        || !same(r.tbt_s.as_ref().map(Vec::len))
        || !same(r.max_stall_s.as_ref().map(Vec::len))
        || !same(r.priority.as_ref().map(Vec::len))
    {
        return Err("requests: every column must have one entry per request".into());
    }
    let slo = |i: usize| match (&r.ttft_s, &r.tbt_s) {
        (Some(ttft), Some(tbt)) => {
            Some(Slo::new(ttft[i], tbt[i]).with_max_stall(r.max_stall_s.as_ref().map(|stall| stall[i])))
        }
        _ => None,
    };
    Ok((0..n)
        .map(|i| SimRequest {
            arrival: r.arrival[i],
            prompt_tokens: r.prompt_tokens[i],
            max_new_tokens: r.max_new_tokens[i],
            slo: slo(i),
            priority: r.priority.as_ref().map_or(0, |p| p[i]),
        })
        .collect())
}

/// A simulated machine's step time as the JSON describes it (`{"kind": "linear" | "roofline", …}`).
pub(crate) fn parse_step_time(step_time_json: &str) -> Result<StepTimeModel, String> {
    let parsed: StepTimeJson = serde_json::from_str(step_time_json).map_err(|e| format!("step time model: {e}"))?;
    step_time_model(parsed)
}

fn step_time_model(step_time: StepTimeJson) -> Result<StepTimeModel, String> {
    Ok(match step_time {
        StepTimeJson::Linear(cost) => StepTimeModel::Linear(cost.try_into()?),
        StepTimeJson::Roofline {
            overhead_s,
            flops_per_token,
            flops_per_context_token,
            flops_per_s,
            weight_bytes,
            kv_bytes_per_context_token,
            memory_bytes_per_s,
        } => StepTimeModel::Roofline(Roofline {
            overhead_s,
            flops_per_token,
            flops_per_context_token,
            flops_per_s,
            weight_bytes,
            kv_bytes_per_context_token,
            memory_bytes_per_s,
        }),
    })
}

fn parse(config_json: &str) -> Result<SimConfig, String> {
    let c: ConfigJson = serde_json::from_str(config_json).map_err(|e| format!("simulation config: {e}"))?;
    let step_time = step_time_model(c.step_time)?;
    let link = LinkModel {
        out_bytes_per_s: c.link.out_bytes_per_s,
        in_bytes_per_s: c.link.in_bytes_per_s,
        overhead_s: c.link.overhead_s,
        duplex: c.link.duplex,
    };
    // The percentile a request's TBT is judged at is the one RotaSched plans for.
    let scheduler = SchedulerConfig { tbt_percentile: c.tbt_percentile, ..scheduler_config(c.scheduler)? };
    Ok(SimConfig {
        scheduler,
        step_time,
        link,
        charges: Charges {
            per_step_s: c.charges.per_step_s,
            transfer_stall: c.charges.transfer_stall,
            planning: c.charges.planning,
        },
        requests: requests(c.requests)?,
        max_sim_time_s: c.max_sim_time_s,
        gap_samples: c.gap_samples,
        step_log: c.step_log,
    })
}

fn stats_json(s: &SchedulerStats) -> Value {
    json!({
        "steps": s.steps, "rotations_out": s.rotations_out, "rotations_in": s.rotations_in,
        "rotations_in_computed": s.rotations_in_computed, "rotations_out_after_compute": s.rotations_out_after_compute,
        "bytes_out": s.bytes_out, "bytes_in": s.bytes_in, "blocks_out_mirrored": s.blocks_out_mirrored,
        "recomputes": s.recomputes,
        "prefix_cache_hit_tokens": s.prefix_cache_hit_tokens, "finished": s.finished,
        "cancelled": s.cancelled, "cost_correction": s.cost_correction,
    })
}

fn report_json(report: &SimReport, wall_s: f64) -> Value {
    let o = &report.outcomes;
    let g = &report.gap_stats;
    json!({
        "requests": {
            "id": o.iter().map(|x| x.id).collect::<Vec<_>>(),
            "arrival": o.iter().map(|x| x.arrival).collect::<Vec<_>>(),
            "finished": o.iter().map(|x| x.finished).collect::<Vec<_>>(),
            "output_tokens": o.iter().map(|x| x.output_tokens).collect::<Vec<_>>(),
            "ttft_s": o.iter().map(|x| x.ttft_s).collect::<Vec<_>>(),
            "e2e_s": o.iter().map(|x| x.e2e_s).collect::<Vec<_>>(),
            "tbt_s": o.iter().map(|x| x.tbt_s).collect::<Vec<_>>(),
            "max_gap_s": o.iter().map(|x| x.max_gap_s).collect::<Vec<_>>(),
            "priority": o.iter().map(|x| x.priority).collect::<Vec<_>>(),
            "error": o.iter().map(|x| x.error.clone()).collect::<Vec<_>>(),
        },
        "gap_stats": {"count": g.count, "mean": g.mean, "p50": g.p50, "p90": g.p90, "p99": g.p99, "max": g.max},
        "gap_quantiles": report.gap_quantiles,
        "makespan_s": report.makespan_s,
        "steps": report.steps,
        "stalled": report.stalled,
        "bytes_out": report.bytes_out,
        "bytes_in": report.bytes_in,
        "scheduler": stats_json(&report.scheduler),
        "charged": {
            "per_step_s": report.charged_per_step_s,
            "transfer_stall_s": report.charged_transfer_stall_s,
            "planning_s": report.charged_planning_s,
        },
        "wall_s": wall_s,
        "step_log": report.step_log.iter().map(|r| json!({
            "time": r.time, "scheduled": r.scheduled, "rotate_out": r.rotate_out, "rotate_in": r.rotate_in,
            "recomputed": r.recomputed, "free_device_blocks": r.free_device_blocks,
            "requests": r.requests.iter().map(|&(id, phase, lost)| json!([id, phase, lost])).collect::<Vec<_>>(),
            "blocks": r.blocks.iter().map(|&(device, table)| json!([device, table])).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
    })
}

/// Runs one simulation; raises ValueError for a malformed or invalid config.
#[pyfunction]
pub fn simulate(py: Python<'_>, config_json: &str) -> PyResult<String> {
    let config = parse(config_json).map_err(PyValueError::new_err)?;
    let started = Instant::now();
    let report = py
        .detach(|| sim::simulate(&config))
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    Ok(report_json(&report, started.elapsed().as_secs_f64()).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(tbt_percentile: Option<f64>) -> String {
        let cost = json!({"step_base_s": 0.01, "per_prefill_token_s": 1e-5, "per_decode_request_s": 1e-4,
            "per_context_token_s": 1e-7, "swap_out_bytes_per_s": 1e9, "swap_in_bytes_per_s": 1e9,
            "transfer_overhead_s": 1e-5, "duplex": true});
        let mut config = json!({
            "scheduler": {"policy": "rotasched", "cost_model": cost},
            "step_time": {"kind": "linear", "step_base_s": 0.01, "per_prefill_token_s": 1e-5,
                "per_decode_request_s": 1e-4, "per_context_token_s": 1e-7, "swap_out_bytes_per_s": 1e9,
                "swap_in_bytes_per_s": 1e9, "transfer_overhead_s": 1e-5, "duplex": true},
            "link": {"out_bytes_per_s": 1e9, "in_bytes_per_s": 1e9, "overhead_s": 1e-5, "duplex": true},
            "requests": {"arrival": [0.0], "prompt_tokens": [8], "max_new_tokens": [4]},
        });
        if let Some(p) = tbt_percentile {
            config["tbt_percentile"] = json!(p);
        }
        config.to_string()
    }

    #[test]
    fn the_simulated_policy_plans_for_the_percentile_it_is_judged_at() {
        let p95 = parse(&config(Some(95.0))).unwrap();
        assert_eq!(p95.scheduler.tbt_percentile, 95.0);
        assert!((p95.scheduler.tbt_late_share() - 0.05).abs() < 1e-12);
        assert_eq!(parse(&config(None)).unwrap().scheduler.tbt_percentile, 90.0);
        assert!(parse(&config(Some(0.0))).is_ok_and(|c| c.validate().is_err()));
    }
}
