//! Typed scheduler configuration, parsed once at the edge and passed down.

use std::fmt;
use std::str::FromStr;

use crate::cost_model::CostModel;
use crate::error::SchedulerError;

/// Which scheduling policy drives the step plans.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum PolicyKind {
    /// TGI v3: arrival order, worst-case reservation, head-of-line, never preempts.
    Fcfs,
    /// vLLM V1 / SGLang: blocks on demand; on shortage the newest running request is dropped
    /// and re-prefilled later.
    Recompute,
    /// vLLM V0: blocks on demand; on shortage the newest running request is rotated out to host
    /// and brought back when blocks free up.
    Swap,
    /// SLO-aware: least slack first, proactive rotation under a per-step byte budget.
    #[default]
    RotaSched,
}

impl PolicyKind {
    pub const ALL: [PolicyKind; 4] =
        [PolicyKind::Fcfs, PolicyKind::Recompute, PolicyKind::Swap, PolicyKind::RotaSched];

    pub fn as_str(self) -> &'static str {
        match self {
            PolicyKind::Fcfs => "fcfs",
            PolicyKind::Recompute => "recompute",
            PolicyKind::Swap => "swap",
            PolicyKind::RotaSched => "rotasched",
        }
    }
}

impl fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for PolicyKind {
    type Err = SchedulerError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "fcfs" => Ok(PolicyKind::Fcfs),
            "recompute" => Ok(PolicyKind::Recompute),
            "swap" => Ok(PolicyKind::Swap),
            "rotasched" => Ok(PolicyKind::RotaSched),
            _ => Err(SchedulerError::UnknownPolicy(s.to_string())),
        }
    }
}

/// The stall bound a request gets when it names none: this many times its TBT objective.
///
/// Why 5: at the default TBT objective (200 ms) it is one second, the limit beyond which a
/// reader notices that a stream has stopped rather than slowed (the usual response-time
/// limits put an uninterrupted flow of thought at about one second). It leaves a rotation's
/// round trip and a step or two of room above the TBT objective, so RotaSched can still park a
/// decode for one gap, while no gap may last the seconds a parked request used to wait.
pub const DEFAULT_STALL_FACTOR: f64 = 5.0;

// The defaults every front end uses — the router's flags, `SchedulerConfig::default` (the
// simulator's base), and Python's benchmark and simulator through
// `_router.scheduler_defaults()` — defined here once.
/// Time-to-first-token objective of a request that names none.
pub const DEFAULT_TTFT_S: f64 = 2.0;
/// Time-between-tokens objective of a request that names none.
pub const DEFAULT_TBT_S: f64 = 0.2;
/// Percentile of a request's gaps its TBT objective holds for.
pub const DEFAULT_TBT_PERCENTILE: f64 = 90.0;
/// Most tokens (prefill chunks and decodes) in one step.
pub const DEFAULT_MAX_BATCH_TOKENS: u32 = 2048;
/// Most requests in one step.
pub const DEFAULT_MAX_BATCH_REQUESTS: u32 = 256;

/// A request's latency objectives, in seconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Slo {
    /// Time to first token, measured from arrival.
    pub ttft_s: f64,
    /// Time between tokens, measured from the previous token; held for the configured
    /// percentile of a request's gaps (`SchedulerConfig::tbt_percentile`).
    pub tbt_s: f64,
    /// Largest gap between two tokens allowed at all (the stall bound), at least `tbt_s`. A
    /// request meets its TBT objective only when no gap exceeds it; RotaSched plans a parked
    /// request's return by it.
    pub max_stall_s: f64,
}

impl Slo {
    /// Objectives with the default stall bound (`DEFAULT_STALL_FACTOR` times `tbt_s`).
    pub const fn new(ttft_s: f64, tbt_s: f64) -> Self {
        Slo { ttft_s, tbt_s, max_stall_s: DEFAULT_STALL_FACTOR * tbt_s }
    }

    /// The same objectives with the given stall bound (`None` keeps the default).
    pub fn with_max_stall(self, max_stall_s: Option<f64>) -> Self {
        Slo { max_stall_s: max_stall_s.unwrap_or(self.max_stall_s), ..self }
    }

    /// Why these objectives cannot be used, if they cannot.
    pub fn check(&self) -> Result<(), String> {
        if !(self.ttft_s > 0.0 && self.tbt_s > 0.0) {
            return Err("slo times must be > 0".into());
        }
        if !(self.max_stall_s >= self.tbt_s) {
            return Err(format!(
                "the stall bound ({} s) must be at least the TBT objective ({} s)",
                self.max_stall_s, self.tbt_s
            ));
        }
        Ok(())
    }
}

impl Default for Slo {
    fn default() -> Self {
        Slo::new(DEFAULT_TTFT_S, DEFAULT_TBT_S)
    }
}

/// RotaSched's own settings, read by nothing else.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RotaSchedSettings {
    /// A request rotated in during the last this-many steps is not rotated out
    /// again (no thrashing).
    pub rotation_cooldown_steps: u64,
    /// A request with fewer tokens left than this is never rotated out.
    pub min_rotation_tokens_left: u32,
    /// A late request (hopeless first-token deadline) that has been late for longer
    /// than this is served with the punctual ones again, so nothing starves under overload.
    /// 20 s: a request already lost gains nothing by coming sooner within an overload, and each
    /// one served in its turn takes memory from requests that can still meet their objectives;
    /// the price is the lost requests' own wait (`docs/benchmarks.md`, "Lost requests starve
    /// later").
    pub late_starvation_s: f64,
    /// The most gaps between tokens, as a share of every gap produced so far, that
    /// its rotations may have made late — a decode parked for a prompt, or a victim whose return
    /// failed because the blocks it freed were taken. Such a gap lasts up to the stall bound;
    /// while the share is spent RotaSched rotates out only as swap does (a running request short
    /// of blocks evicting newer ones), so at 1% the 99th-percentile gap between tokens — the
    /// figure vLLM's and SGLang's benchmarks report — stays the compute's own.
    pub rotation_late_gap_share: f64,
    /// Under overload, time-share the device by next-token deadline (`timeshare.rs`) instead of
    /// serving as swap does: a request brought back computes in the step that brings it, one
    /// that leaves computes in its last step first, and the requests whose next token is due
    /// first hold the device. On by default: it keeps every gap within the stall bound, where
    /// swap's way leaves the lost requests waiting for seconds, and raises joint attainment; the
    /// price is that it spreads the waiting over more, shorter pauses, which raises the
    /// 99th-percentile gap on chat-shaped workloads (`docs/benchmarks.md`, "Time-sharing by
    /// default").
    pub time_share: bool,
}

impl Default for RotaSchedSettings {
    fn default() -> Self {
        RotaSchedSettings {
            rotation_cooldown_steps: 4,
            min_rotation_tokens_left: 4,
            late_starvation_s: 20.0,
            rotation_late_gap_share: 0.005,
            time_share: true,
        }
    }
}

/// Everything the scheduler needs to know, fixed for its lifetime (the cost model is refined
/// online from measured step times, starting from `cost_model`).
#[derive(Debug, Clone, PartialEq)]
pub struct SchedulerConfig {
    /// Tokens per KV block.
    pub block_size: u32,
    /// Device pool size; block ids 0 .. num_device_blocks-1.
    pub num_device_blocks: u32,
    /// Host pool size; block ids 0 .. num_host_blocks-1 (0 disables rotation).
    pub num_host_blocks: u32,
    /// Bytes of one KV block across all layers (the unit of transfer).
    pub block_bytes: u64,
    /// Most tokens (prefill chunks + decodes) in one step.
    pub max_batch_tokens: u32,
    /// Most requests in one step.
    pub max_batch_requests: u32,
    pub policy: PolicyKind,
    /// Objectives of requests that carry none.
    pub default_slo: Slo,
    /// Initial cost model (from Warmup).
    pub cost_model: CostModel,
    /// Reuse full device blocks whose token prefix matches.
    pub prefix_caching: bool,
    /// Weight of a new measurement in the exponential moving averages (cost-model correction,
    /// arrival rate, prompt size), in (0, 1].
    pub ema_alpha: f64,
    /// RotaSched's own settings (the other policies have none).
    pub rotasched: RotaSchedSettings,
    /// Percentile of each request's gaps between tokens that its TBT objective holds for, in
    /// (0, 100]: attainment is judged at it (`attainment::judge`), and RotaSched plans for it —
    /// the rest of the gaps (`tbt_late_share`) may be late, so a running request with such a
    /// late gap left to spend does not bound the step time; one without does.
    pub tbt_percentile: f64,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            block_size: 16,
            num_device_blocks: 1024,
            num_host_blocks: 4096,
            block_bytes: 1 << 20,
            max_batch_tokens: DEFAULT_MAX_BATCH_TOKENS,
            max_batch_requests: DEFAULT_MAX_BATCH_REQUESTS,
            policy: PolicyKind::RotaSched,
            default_slo: Slo::default(),
            cost_model: CostModel::default(),
            prefix_caching: true,
            ema_alpha: 0.2,
            rotasched: RotaSchedSettings::default(),
            tbt_percentile: DEFAULT_TBT_PERCENTILE,
        }
    }
}

impl SchedulerConfig {
    /// Share of a request's gaps that may exceed its TBT objective (0.1 at the 90th percentile).
    pub fn tbt_late_share(&self) -> f64 {
        1.0 - self.tbt_percentile / 100.0
    }

    /// Rejects configurations that cannot drive a scheduler.
    pub fn validate(&self) -> Result<(), SchedulerError> {
        let fail = |msg: &str| Err(SchedulerError::InvalidConfig(msg.to_string()));
        if self.block_size == 0 {
            return fail("block_size must be > 0");
        }
        if self.num_device_blocks == 0 {
            return fail("num_device_blocks must be > 0");
        }
        if self.max_batch_tokens == 0 || self.max_batch_requests == 0 {
            return fail("max_batch_tokens and max_batch_requests must be > 0");
        }
        if !(self.tbt_percentile > 0.0 && self.tbt_percentile <= 100.0) {
            return fail("tbt_percentile must lie in (0, 100]");
        }
        if !(0.0..=1.0).contains(&self.rotasched.rotation_late_gap_share) {
            return fail("rotasched.rotation_late_gap_share must lie in [0, 1]");
        }
        if !(self.ema_alpha > 0.0 && self.ema_alpha <= 1.0) {
            return fail("ema_alpha must lie in (0, 1]");
        }
        if let Err(why) = self.default_slo.check() {
            return fail(&format!("default_slo: {why}"));
        }
        self.cost_model.validate()
    }
}
