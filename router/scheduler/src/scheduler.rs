//! The scheduler: a `Core` that owns every request's state, the block manager and the
//! counters, and a `Policy` that owns its own state and decides each step (`policy/`);
//! `complete` applies what came back and tells the policy (`StepFeedback`).

use std::collections::{BTreeMap, VecDeque};

use crate::admission::AdmissionView;
use crate::config::SchedulerConfig;
use crate::cost_model::{CostModel, StepShape};
use crate::error::SchedulerError;
use crate::kv::{BlockManager, KvCacheEvent};
use crate::plan::{StepPlan, StepResults};
use crate::policy::{Policy, StepFeedback, TimingSample};
use crate::stats::SchedulerStats;
use crate::request::{Phase, RequestSpec, RequestState};

/// Lag samples kept between two `take_lag_samples` calls; older ones are dropped.
const MAX_LAG_SAMPLES: usize = 1 << 16;

/// What a planned step did to one request, replayed when its results arrive.
#[derive(Debug, Clone)]
pub(crate) struct PlannedEntry {
    pub(crate) id: u64,
    /// The step reaches the end of the known tokens, so a sampled token is expected.
    pub(crate) samples: bool,
}

#[derive(Debug, Clone, Default)]
pub(crate) struct PendingStep {
    pub(crate) entries: Vec<PlannedEntry>,
    pub(crate) shape: StepShape,
    /// When it was planned, and whether no other step was in flight then (its plan-to-results
    /// time is then its own: `StepTiming::overhead_s`).
    pub(crate) planned_at: f64,
    pub(crate) alone: bool,
}

#[derive(Debug, Clone, Default)]
pub(crate) struct Counters {
    pub(crate) rotations_out: u64,
    pub(crate) rotations_in: u64,
    /// Of those, the returns computed in the step that copies them in, and the rotations out
    /// of a request computing in the same step (the copy runs after that compute).
    pub(crate) rotations_in_computed: u64,
    pub(crate) rotations_out_after_compute: u64,
    pub(crate) bytes_out: u64,
    pub(crate) bytes_in: u64,
    /// Blocks rotated out without a copy: the host held a mirror of them.
    pub(crate) blocks_out_mirrored: u64,
    pub(crate) recomputes: u64,
    pub(crate) prefix_hit_tokens: u64,
    pub(crate) prefix_queried_tokens: u64,
    pub(crate) finished: u64,
    pub(crate) cancelled: u64,
    /// Queued requests ended by the queue time-out (`expire_queued`).
    pub(crate) expired: u64,
}

/// The scheduling state machine: a core every policy shares (requests, blocks, queue,
/// counters, cost model) and the policy, which owns its own state. Drive it with `add`,
/// `plan`, `complete`, `finish`, `cancel`; it never reads a clock — every call takes `now`
/// (seconds) from the caller.
#[derive(Debug)]
pub struct Scheduler {
    pub(crate) core: Core,
    policy: Policy,
}

/// What every policy plans over.
#[derive(Debug)]
pub(crate) struct Core {
    pub(crate) config: SchedulerConfig,
    pub(crate) cost: CostModel,
    pub(crate) blocks: BlockManager,
    pub(crate) requests: BTreeMap<u64, RequestState>,
    /// Requests in `Phase::Waiting`, in service order (preempted ones go back to the front).
    pub(crate) waiting: VecDeque<u64>,
    pub(crate) step_id: u64,
    pub(crate) next_seq: u64,
    pub(crate) pending: BTreeMap<u64, PendingStep>,
    pub(crate) counters: Counters,
    pub(crate) lag_samples: Vec<f64>,
}

impl Scheduler {
    pub fn new(config: SchedulerConfig) -> Result<Self, SchedulerError> {
        let policy = Policy::new(&config);
        Ok(Scheduler { core: Core::new(config)?, policy })
    }

    pub fn config(&self) -> &SchedulerConfig {
        &self.core.config
    }

    /// The cost model as refined so far.
    pub fn cost_model(&self) -> &CostModel {
        &self.core.cost
    }

    /// Queues a request. Rejects malformed requests, ids already held, and requests whose
    /// prompt plus max_new_tokens needs more blocks than the whole device pool.
    pub fn add(&mut self, request: RequestSpec, now: f64) -> Result<(), SchedulerError> {
        let prompt_blocks = self.core.add(request)?;
        self.policy.on_arrival(now, prompt_blocks, self.core.config.ema_alpha);
        Ok(())
    }

    /// Marks a request that must not be scheduled past a token the router has not seen (a
    /// grammar's next mask needs it): with one step in flight it waits for its result.
    /// Unknown ids are ignored.
    pub fn wait_for_results(&mut self, id: u64) {
        if let Some(request) = self.core.requests.get_mut(&id) {
            request.waits_for_results = true;
        }
    }

    /// Decides the next step: what to compute, what to move, whom to preempt (see `policy`).
    pub fn plan(&mut self, now: f64) -> StepPlan {
        self.policy.plan(&mut self.core, now)
    }

    /// Applies one step's results (see `Core::complete`).
    pub fn complete(&mut self, results: &StepResults, now: f64) {
        let feedback = self.core.complete(results, now);
        self.policy.on_results(&feedback);
    }

    /// The engine decided the request is done (EOS, length, stop sequence); frees its blocks
    /// (at acknowledgement if a transfer of its blocks is in flight). Unknown ids are ignored.
    pub fn finish(&mut self, id: u64) {
        self.core.finish(id);
    }

    /// The client went away; like `finish`, counted separately.
    pub fn cancel(&mut self, id: u64) {
        self.core.cancel(id);
    }

    /// What admission needs to predict a new request's first-token time (`admission`).
    pub fn admission_view(&self) -> AdmissionView {
        self.core.admission_view()
    }

    /// Ends the queued requests (no token yet, no KV) whose first-token deadline passed more
    /// than `timeout_s` before `now`; returns their ids. The engine fails them.
    pub fn expire_queued(&mut self, now: f64, timeout_s: f64) -> Vec<u64> {
        self.core.expire_queued(now, timeout_s)
    }

    /// Forgets every request and frees every block (the shard restarted empty), keeping what
    /// was learnt about the machine and the load: the cost model and its correction, the
    /// cumulative counters, and the policy's own state (RotaSched's step timing, arrival
    /// estimate, rotation budget and time-shared step interval; `on_reset` tells it the steps in
    /// flight will not report). The engine re-adds
    /// the requests it still holds.
    pub fn reset(&mut self) {
        let core = &mut self.core;
        core.blocks.clear();
        core.requests.clear();
        core.waiting.clear();
        core.pending.clear();
        core.lag_samples.clear();
        core.debug_check("reset");
        self.policy.on_reset();
    }

    /// No request will be added in KV `namespace` again (its LoRA adapter was unloaded, or
    /// replaced in a new slot): its cached prefix blocks are forgotten (announced removed) and
    /// freed first, and the blocks its remaining requests compute are not cached. A reset keeps
    /// this. Returns how many blocks were forgotten.
    pub fn retire_kv_namespace(&mut self, namespace: u64) -> u32 {
        self.core.blocks.retire_namespace(namespace)
    }

    /// Records the prefix cache's changes from now on, for `take_kv_events`.
    pub fn enable_kv_events(&mut self) {
        self.core.blocks.enable_kv_events();
    }

    /// The prefix cache's changes since the previous call, in order (none unless enabled):
    /// applied in order they give exactly the set of blocks a prompt lookup can find.
    pub fn take_kv_events(&mut self) -> Vec<KvCacheEvent> {
        self.core.blocks.take_kv_events()
    }

    /// Lag samples (now - deadline of each produced token, seconds; positive = late) recorded
    /// since the previous call, oldest first.
    pub fn take_lag_samples(&mut self) -> Vec<f64> {
        std::mem::take(&mut self.core.lag_samples)
    }

    /// Number of requests the scheduler currently holds (any phase).
    pub fn num_requests(&self) -> usize {
        self.core.requests.len()
    }

    /// Whether any request is still held (the engine loop may sleep when there is none).
    pub fn has_work(&self) -> bool {
        !self.core.requests.is_empty()
    }

    /// Tokens of a request as the scheduler knows them (prompt + sampled).
    pub fn tokens(&self, id: u64) -> Option<&[u32]> {
        self.core.requests.get(&id).map(|r| r.tokens.as_slice())
    }

    /// The /metrics snapshot.
    pub fn stats(&self) -> SchedulerStats {
        self.policy.stats(&self.core)
    }

    /// See `Core::check_invariants`.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.core.check_invariants()
    }
}

impl Core {
    fn new(config: SchedulerConfig) -> Result<Self, SchedulerError> {
        config.validate()?;
        let blocks = BlockManager::new(
            config.block_size,
            config.num_device_blocks,
            config.num_host_blocks,
            config.prefix_caching,
        );
        Ok(Core {
            cost: config.cost_model,
            blocks,
            config,
            requests: BTreeMap::new(),
            waiting: VecDeque::new(),
            step_id: 0,
            next_seq: 0,
            pending: BTreeMap::new(),
            counters: Counters::default(),
            lag_samples: Vec::new(),
        })
    }

    /// Queues a request (see `Scheduler::add`); returns its prompt's size in blocks.
    fn add(&mut self, request: RequestSpec) -> Result<u64, SchedulerError> {
        let id = request.id;
        let invalid = |reason: &str| SchedulerError::InvalidRequest { id, reason: reason.into() };
        if request.prompt_token_ids.is_empty() {
            return Err(invalid("empty prompt"));
        }
        if request.max_new_tokens == 0 {
            return Err(invalid("max_new_tokens must be > 0"));
        }
        if let Some(slo) = request.slo {
            slo.check().map_err(|why| invalid(&why))?;
        }
        if self.requests.contains_key(&id) {
            return Err(SchedulerError::DuplicateId(id));
        }
        let state = RequestState::new(request, self.next_seq, self.config.default_slo);
        let needed_blocks = self.blocks.blocks_for(state.max_kv_tokens());
        if needed_blocks > u64::from(self.config.num_device_blocks) {
            return Err(SchedulerError::TooLarge {
                id,
                tokens: state.max_kv_tokens(),
                needed_blocks,
                device_blocks: self.config.num_device_blocks,
            });
        }
        let prompt_blocks = self.blocks.blocks_for(u64::from(state.prompt_len));
        self.next_seq += 1;
        self.requests.insert(id, state);
        self.waiting.push_back(id);
        self.debug_check("add");
        Ok(prompt_blocks)
    }

    /// Applies one step's results: acknowledged transfers first (they change phases), then
    /// sampled tokens, then the step's measured time (folded into the cost model). Returns what
    /// the policy is told of them.
    fn complete(&mut self, results: &StepResults, now: f64) -> StepFeedback {
        let mut feedback = StepFeedback { alpha: self.config.ema_alpha, ..StepFeedback::default() };
        for transfer_id in &results.completed_transfers {
            self.apply_ack(*transfer_id);
        }
        if let Some(step) = self.pending.remove(&results.step_id) {
            let sampled: BTreeMap<u64, u32> = results.sampled.iter().copied().collect();
            for entry in &step.entries {
                self.apply_entry(entry, sampled.get(&entry.id).copied(), now, &mut feedback);
            }
            if let Some(measured) = results.step_time_s {
                feedback.timing = Some(TimingSample {
                    ratio: measured / self.cost.predict_step_uncorrected(step.shape),
                    correction: self.cost.correction,
                    mixed: step.shape.prefill_tokens > 0 && step.shape.decode_requests > 0,
                    measured_s: measured,
                    cycle_s: step.alone.then_some(now - step.planned_at),
                });
                self.cost.observe_step(step.shape, measured, self.config.ema_alpha);
            }
        }
        self.debug_check("complete");
        feedback
    }

    fn apply_ack(&mut self, transfer_id: u64) {
        let Some(done) = self.blocks.ack(transfer_id) else { return };
        let Some(request) = self.requests.get_mut(&done.request) else { return };
        if request.doomed {
            self.blocks.release(done.request);
            self.requests.remove(&done.request);
            return;
        }
        request.phase = match request.phase {
            Phase::RotatingOut => Phase::Rotated,
            Phase::RotatingIn => Phase::Running,
            other => other,
        };
    }

    fn apply_entry(&mut self, entry: &PlannedEntry, token: Option<u32>, now: f64, feedback: &mut StepFeedback) {
        let Some(request) = self.requests.get_mut(&entry.id) else { return };
        request.pending_steps = request.pending_steps.saturating_sub(1);
        // Steps come back in order, so this entry's token is the oldest placeholder, at
        // position `tokens.len()` (a later step may be computing that position already).
        let known = request.tokens.len() as u32;
        if entry.samples {
            request.placeholders = request.placeholders.saturating_sub(1);
        }
        if request.doomed || request.phase == Phase::Waiting || !entry.samples {
            return;
        }
        match token {
            Some(token) if request.num_computed >= known => {
                let lag = now - request.next_deadline();
                if request.last_token_at.is_some() {
                    feedback.gaps += 1;
                    if lag > 0.0 {
                        request.late_gaps += 1;
                        feedback.late_rotation_gaps += u64::from(request.rotated_since_token);
                    }
                }
                // A first token past its objective or a gap past the stall bound: the request
                // can no longer meet its objectives (a late gap too many is counted by
                // `late_gaps_left`).
                let stall_broken = request.stall_deadline().is_some_and(|at| now > at);
                request.objectives_lost |= stall_broken || (request.last_token_at.is_none() && lag > 0.0);
                request.rotated_since_token = false;
                request.tokens.push(token);
                request.last_token_at = Some(now);
                request.returned_without_token = false;
                if self.lag_samples.len() >= MAX_LAG_SAMPLES {
                    self.lag_samples.drain(..MAX_LAG_SAMPLES / 2);
                }
                self.lag_samples.push(lag);
            }
            // No token came back: recompute the last position so the next step samples. A
            // later step that already computes the missing token's position is answered by
            // the shard with the request's error (the engine cancels it); until then the
            // position stays planned.
            None if request.num_computed == known => {
                request.num_computed -= 1;
                // That position's KV is written again: a host mirror of its block would go stale.
                self.blocks.forget_mirrors_from(entry.id, request.num_computed);
            }
            _ => {}
        }
    }

    fn finish(&mut self, id: u64) {
        if self.drop_request(id) {
            self.counters.finished += 1;
        }
        self.debug_check("finish");
    }

    fn cancel(&mut self, id: u64) {
        if self.drop_request(id) {
            self.counters.cancelled += 1;
        }
        self.debug_check("cancel");
    }

    fn drop_request(&mut self, id: u64) -> bool {
        let Some(request) = self.requests.get_mut(&id) else { return false };
        if request.doomed {
            return false;
        }
        self.waiting.retain(|w| *w != id);
        if self.blocks.has_transfer_for(id) {
            // The transfer's destinations are still being written: free at acknowledgement.
            request.doomed = true;
        } else {
            self.blocks.release(id);
            self.requests.remove(&id);
        }
        true
    }

    pub(crate) fn debug_check(&self, call: &str) {
        if cfg!(debug_assertions) {
            if let Err(broken) = self.check_invariants() {
                panic!("scheduler invariant broken after {call}: {broken}");
            }
        }
    }
}
