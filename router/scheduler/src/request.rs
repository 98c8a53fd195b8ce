//! A request as the scheduler sees it: the immutable spec from the engine, and the mutable
//! per-request state (phase, tokens, progress, timing) that the scheduler alone owns.

use crate::config::Slo;

/// What the engine submits.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestSpec {
    /// Unique among the requests the scheduler currently knows.
    pub id: u64,
    pub prompt_token_ids: Vec<u32>,
    /// Generation limit; the engine calls `finish` at EOS or at this length.
    pub max_new_tokens: u32,
    /// Objectives; the scheduler's `default_slo` when absent.
    pub slo: Option<Slo>,
    /// Arrival time, seconds on the engine's clock.
    pub arrival: f64,
    /// Priority class: lower is served first (vLLM's convention); 0 by default. Under memory
    /// pressure higher numbers leave the device first; under overload lower numbers keep
    /// their objectives.
    pub priority: i32,
    /// KV namespace: the LoRA adapter the request runs with (0: the base model). Cached prefix
    /// blocks are shared only within one namespace.
    pub kv_namespace: u64,
    /// Its prompt's logprobs are asked for: every prompt position is computed, so it takes no
    /// cached prefix (its blocks are still offered to later requests).
    pub scores_prompt: bool,
}

/// Where a request's KV is. Transfers in flight are phases of their own: their blocks belong
/// to the transfer until the shard acknowledges it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Phase {
    /// No KV anywhere (new, or preempted for recompute).
    Waiting,
    /// KV on device: prefilling or decoding.
    Running,
    /// Private blocks being copied to host.
    RotatingOut,
    /// KV (private part) on host.
    Rotated,
    /// Host blocks being copied back to device.
    RotatingIn,
}

impl Phase {
    /// Its name in reports (the simulator's step log).
    pub(crate) fn name(self) -> &'static str {
        match self {
            Phase::Waiting => "waiting",
            Phase::Running => "running",
            Phase::RotatingOut => "rotating_out",
            Phase::Rotated => "rotated",
            Phase::RotatingIn => "rotating_in",
        }
    }
}

/// The scheduler's mutable view of one request.
#[derive(Debug, Clone)]
pub(crate) struct RequestState {
    pub(crate) id: u64,
    /// Admission order, for "oldest"/"newest" decisions independent of clock ties.
    pub(crate) seq: u64,
    /// Prompt followed by every sampled token.
    pub(crate) tokens: Vec<u32>,
    pub(crate) prompt_len: u32,
    pub(crate) max_new_tokens: u32,
    pub(crate) slo: Slo,
    pub(crate) arrival: f64,
    pub(crate) priority: i32,
    pub(crate) kv_namespace: u64,
    /// Its prompt's logprobs are asked for (`RequestSpec::scores_prompt`).
    pub(crate) scores_prompt: bool,
    pub(crate) phase: Phase,
    /// Positions whose KV is (or, once planned steps finish, will be) in the request's blocks.
    pub(crate) num_computed: u32,
    /// Planned steps of this request whose results have not come back yet.
    pub(crate) pending_steps: u32,
    /// Tokens that planned steps sample and whose results have not come back yet: positions
    /// past `tokens` whose token only the shard knows. A later step may compute such a position
    /// (one step in flight): its input is the token the shard sampled and kept.
    pub(crate) placeholders: u32,
    /// Never scheduled past a placeholder: its next step needs the previous result in the
    /// router (a grammar's mask).
    pub(crate) waits_for_results: bool,
    /// Whether the shard has been sent the prompt (first scheduled).
    pub(crate) sent: bool,
    pub(crate) last_token_at: Option<f64>,
    /// Gaps between its tokens that exceeded its TBT objective so far.
    pub(crate) late_gaps: u32,
    /// Step in which the latest rotation in was issued (rotation cool-down).
    pub(crate) rotated_in_step: Option<u64>,
    /// Rotated back in and no token computed since: it may not be rotated out again until it
    /// has one (a return that buys nothing is a round trip wasted, and one evicted again at
    /// once can thrash).
    pub(crate) returned_without_token: bool,
    /// Rotated out (or dropped for recompute) since its previous token: a late gap then is the
    /// rotation's (`StepFeedback::late_rotation_gaps`).
    pub(crate) rotated_since_token: bool,
    /// Finished or cancelled while a transfer was in flight: removed at acknowledgement.
    pub(crate) doomed: bool,
    /// Its first token came past its objective, or a gap past its stall bound: whatever
    /// happens now, it does not meet its objectives (the step-time cap stops guarding its stall
    /// bound, `step_cap.rs`).
    pub(crate) objectives_lost: bool,
}

impl RequestState {
    /// The tokens a cached prefix is looked up for: none when every prompt position must be
    /// computed (its logprobs are asked for), else all of them.
    pub(crate) fn prefix_lookup(&self) -> &[u32] {
        if self.scores_prompt {
            &[]
        } else {
            &self.tokens
        }
    }

    pub(crate) fn new(spec: RequestSpec, seq: u64, default_slo: Slo) -> Self {
        RequestState {
            id: spec.id,
            seq,
            prompt_len: spec.prompt_token_ids.len() as u32,
            tokens: spec.prompt_token_ids,
            max_new_tokens: spec.max_new_tokens,
            slo: spec.slo.unwrap_or(default_slo),
            arrival: spec.arrival,
            priority: spec.priority,
            kv_namespace: spec.kv_namespace,
            scores_prompt: spec.scores_prompt,
            phase: Phase::Waiting,
            num_computed: 0,
            pending_steps: 0,
            placeholders: 0,
            waits_for_results: false,
            sent: false,
            last_token_at: None,
            late_gaps: 0,
            rotated_in_step: None,
            returned_without_token: false,
            rotated_since_token: false,
            doomed: false,
            objectives_lost: false,
        }
    }

    /// Positions the request will have once its planned steps come back: known tokens and
    /// placeholders.
    pub(crate) fn num_positions(&self) -> u32 {
        self.tokens.len() as u32 + self.placeholders
    }

    /// Tokens generated, placeholders included (they count against `max_new_tokens`).
    pub(crate) fn generated(&self) -> u32 {
        self.num_positions() - self.prompt_len
    }

    /// Positions (known tokens or a placeholder) whose KV is not computed yet (1 = a decode).
    pub(crate) fn uncomputed(&self) -> u32 {
        self.num_positions() - self.num_computed
    }

    /// Whether the generation limit is reached (the engine will call `finish`).
    pub(crate) fn exhausted(&self) -> bool {
        self.generated() >= self.max_new_tokens
    }

    /// Whether a step can compute something for it now (phase aside).
    pub(crate) fn has_work(&self) -> bool {
        !self.doomed
            && !self.exhausted()
            && self.uncomputed() > 0
            && !(self.waits_for_results && self.placeholders > 0)
    }

    pub(crate) fn is_decode(&self) -> bool {
        self.generated() > 0 && self.uncomputed() == 1
    }

    pub(crate) fn tokens_left(&self) -> u32 {
        self.max_new_tokens.saturating_sub(self.generated())
    }

    /// Most KV positions it can ever hold: the last sampled token is never computed.
    pub(crate) fn max_kv_tokens(&self) -> u64 {
        u64::from(self.prompt_len) + u64::from(self.max_new_tokens) - 1
    }

    /// Late gaps it may still have while its TBT objective holds for the (1 − `share`)
    /// quantile of its gaps, counted over the gaps its generation limit allows.
    pub(crate) fn late_gaps_left(&self, share: f64) -> u32 {
        let gaps = self.max_new_tokens.saturating_sub(1);
        ((f64::from(gaps) * share).floor() as u32).saturating_sub(self.late_gaps)
    }

    /// Whether it may take a risk of one more late gap: a rotation's return can still fail
    /// under load (its blocks taken by more urgent requests). True while one more late gap
    /// keeps its objective, or, with no allowance at all, while it has never been late.
    pub(crate) fn may_risk_a_late_gap(&self, share: f64) -> bool {
        self.late_gaps_left(share) > 0 || self.late_gaps == 0
    }

    /// Deadline of its next token: first token by arrival + ttft, later ones by tbt.
    pub(crate) fn next_deadline(&self) -> f64 {
        self.deadline_after(self.last_token_at)
    }

    /// Its next token's deadline had its last token come at `last` (None: none yet).
    pub(crate) fn deadline_after(&self, last: Option<f64>) -> f64 {
        match last {
            None => self.arrival + self.slo.ttft_s,
            Some(t) => t + self.slo.tbt_s,
        }
    }

    /// Late for longer than `starve_s` (past `next_deadline`): a request that has waited that
    /// long is served in its turn again, however late it already is, so none waits without
    /// bound. RotaSched's own mode and its overload mode both starve by this clock.
    pub(crate) fn starved(&self, now: f64, starve_s: f64) -> bool {
        now - self.next_deadline() > starve_s
    }

    /// The latest its next token may come without breaking the stall bound (None before the
    /// first token: the first-token objective governs that one).
    pub(crate) fn stall_deadline(&self) -> Option<f64> {
        self.last_token_at.map(|t| t + self.slo.max_stall_s)
    }

    /// The order in which priority classes yield: lower priority numbers and older requests
    /// first. Total, so two requests never evict each other in turn.
    pub(crate) fn rank(&self) -> (i32, u64) {
        (self.priority, self.seq)
    }
}
