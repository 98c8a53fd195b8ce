//! What the scheduler hands the engine each step and what the engine reports back. Mirrors
//! `proto/shard.proto` (`ScheduledRequest`, `Transfer`, `StepResponse`).

/// A batch of block copies in one direction: `src_blocks[i] -> dst_blocks[i]`.
/// In `StepPlan::rotate_out` the sources are device blocks and the destinations host blocks;
/// in `StepPlan::rotate_in` the reverse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transfer {
    /// Scheduler-chosen id, to be echoed back in `StepResults::completed_transfers`.
    pub id: u64,
    /// The request whose KV moves (for logs and traces; the shard does not need it).
    pub request_id: u64,
    pub src_blocks: Vec<u32>,
    pub dst_blocks: Vec<u32>,
}

/// One request's share of a step's forward pass (the proto's `ScheduledRequest`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduledEntry {
    pub id: u64,
    /// Tokens whose KV is already in the request's device blocks; the step computes positions
    /// `num_computed_tokens .. num_computed_tokens + num_new_tokens`.
    pub num_computed_tokens: u32,
    /// A prefill chunk of any length, or 1 for a decode.
    pub num_new_tokens: u32,
    /// The whole device block table in position order; covers at least
    /// `num_computed_tokens + num_new_tokens` positions.
    pub block_table: Vec<u32>,
}

impl ScheduledEntry {
    /// Positions the request's KV covers once this step has run.
    pub fn end_position(&self) -> u32 {
        self.num_computed_tokens + self.num_new_tokens
    }
}

/// One step's complete plan. The engine sends it as one `StepRequest` (plus `forget` and
/// `new_requests`, which it derives from `first_scheduled` and its own finish/cancel calls).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct StepPlan {
    /// Monotonic, starting at 1.
    pub step_id: u64,
    /// Device -> host copies. Their source device blocks are not reused until acknowledged.
    pub rotate_out: Vec<Transfer>,
    /// Host -> device copies. The owning request is scheduled only after acknowledgement.
    pub rotate_in: Vec<Transfer>,
    /// The forward pass: decodes first, then prefill chunks.
    pub scheduled: Vec<ScheduledEntry>,
    /// Requests scheduled for the first time in this plan: the engine sends their prompt
    /// (`NewRequest`) with this step.
    pub first_scheduled: Vec<u64>,
    /// Requests whose device KV was dropped in this plan; they will be re-prefilled from
    /// position 0 later (the shard keeps their token ids, so nothing needs to be re-sent).
    pub preempted_for_recompute: Vec<u64>,
    /// Ids of the scheduled requests whose step reaches the end of their known tokens, so the
    /// shard samples a token for them (sorted).
    pub sampling: Vec<u64>,
    /// Ids of the scheduled requests (sorted) whose last input token is a placeholder: the
    /// token an earlier step samples, whose result had not come back when this step was
    /// planned. The shard feeds them the token it sampled and kept (one step in flight).
    pub input_from_shard: Vec<u64>,
    /// Predicted wall time of this step (cost model), in seconds.
    pub predicted_step_s: f64,
    /// RotaSched's per-direction transfer budget for this step (None: unbudgeted policy).
    pub rotate_out_budget_bytes: Option<u64>,
    pub rotate_in_budget_bytes: Option<u64>,
}

impl StepPlan {
    /// True when the plan neither computes nor moves anything.
    pub fn is_empty(&self) -> bool {
        self.scheduled.is_empty()
            && self.rotate_out.is_empty()
            && self.rotate_in.is_empty()
            && self.preempted_for_recompute.is_empty()
    }

    /// Whether the step computes `id` (a copy out of such a request runs after the compute).
    pub fn computes(&self, id: u64) -> bool {
        self.scheduled.iter().any(|e| e.id == id)
    }

    pub fn num_batched_tokens(&self) -> u64 {
        self.scheduled.iter().map(|e| u64::from(e.num_new_tokens)).sum()
    }
}

/// What came back from the shard for one step.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct StepResults {
    pub step_id: u64,
    /// `(request id, sampled token id)` for every request that sampled this step.
    pub sampled: Vec<(u64, u32)>,
    /// Transfer ids (of this or earlier steps) whose copy has completed.
    pub completed_transfers: Vec<u64>,
    /// Measured wall time of the step, used to refine the cost model.
    pub step_time_s: Option<f64>,
}
