//! Building one step, shared by every policy: the token and request budgets, scheduling a
//! chunk, admitting a waiting request (prefix hits first), preempting, rotating out and in,
//! and sealing the plan.

use std::collections::{BTreeMap, BTreeSet};

use crate::byte_budget::ByteBudget;
use crate::config::SchedulerConfig;
use crate::cost_model::{CostModel, Direction, StepShape};
use crate::kv::BlockManager;
use crate::plan::{ScheduledEntry, StepPlan};
use crate::request::{Phase, RequestState};
use crate::scheduler::{Core, PendingStep, PlannedEntry};

/// Whether a request got its share of the step, and if not, what it lacked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fit {
    Scheduled,
    /// The token or request budget is spent (or the request has nothing to compute).
    NoBudget,
    /// This many more free device blocks are needed.
    NoBlocks(u64),
}

/// The step being built.
pub(crate) struct StepCtx {
    pub(crate) now: f64,
    pub(crate) plan: StepPlan,
    pub(crate) tokens_left: u32,
    pub(crate) requests_left: u32,
    /// Tokens held back for decodes not yet placed (prefill chunks may not use them).
    pub(crate) decode_reserve: u32,
    /// Most prefill tokens the next chunk may take (RotaSched's step-time cap; u32::MAX: no cap).
    pub(crate) prefill_token_cap: u32,
    pub(crate) scheduled: BTreeSet<u64>,
    pub(crate) entries: Vec<PlannedEntry>,
    pub(crate) shape: StepShape,
    /// Per-direction transfer budget (unlimited for the reactive policies).
    pub(crate) budget: ByteBudget,
    /// Blocks that in-flight transfers out will free and that no request has counted on yet.
    pub(crate) release_credit: u64,
}

impl Core {
    pub(crate) fn new_ctx(&mut self, now: f64) -> StepCtx {
        self.step_id += 1;
        StepCtx {
            now,
            plan: StepPlan { step_id: self.step_id, ..StepPlan::default() },
            tokens_left: self.config.max_batch_tokens,
            requests_left: self.config.max_batch_requests,
            decode_reserve: 0,
            prefill_token_cap: u32::MAX,
            scheduled: BTreeSet::new(),
            entries: Vec::new(),
            shape: StepShape::default(),
            budget: ByteBudget::unlimited(),
            release_credit: u64::from(self.blocks.pending_release()),
        }
    }
    /// Orders decodes before prefill chunks, fills in what the engine needs, and remembers the
    /// step so its results can be applied.
    pub(crate) fn seal(&mut self, mut ctx: StepCtx) -> crate::plan::StepPlan {
        let is_decode = |e: &ScheduledEntry| e.num_new_tokens == 1 && e.num_computed_tokens > 0;
        let (decodes, prefills): (Vec<_>, Vec<_>) =
            ctx.plan.scheduled.drain(..).partition(|e| is_decode(e));
        ctx.plan.scheduled = decodes.into_iter().chain(prefills).collect();
        let mut sampling: Vec<u64> = ctx.entries.iter().filter(|e| e.samples).map(|e| e.id).collect();
        sampling.sort_unstable();
        ctx.plan.sampling = sampling;
        ctx.plan.input_from_shard.sort_unstable();
        let plan = &ctx.plan;
        self.counters.rotations_in_computed += plan.rotate_in.iter().filter(|t| plan.computes(t.request_id)).count() as u64;
        self.counters.rotations_out_after_compute +=
            plan.rotate_out.iter().filter(|t| plan.computes(t.request_id)).count() as u64;
        ctx.plan.predicted_step_s = self.cost.predict_step(ctx.shape);
        if ctx.budget.is_limited() {
            ctx.plan.rotate_out_budget_bytes = Some(ctx.budget.limit(Direction::Out));
            ctx.plan.rotate_in_budget_bytes = Some(ctx.budget.limit(Direction::In));
        }
        if !ctx.entries.is_empty() {
            let alone = self.pending.is_empty();
            let pending = PendingStep { entries: ctx.entries, shape: ctx.shape, planned_at: ctx.now, alone };
            self.pending.insert(ctx.plan.step_id, pending);
        }
        ctx.plan
    }
}

/// The narrow API a policy builds a step through: read access to the requests, the blocks, the
/// cost model and the configuration, the orders policies serve in, and the few operations that
/// change state — schedule a running request's chunk, admit, preempt for recompute, rotate out
/// and in. A policy never reaches the scheduler's `Core` itself: what it may do to a step is
/// what this type offers, and its own reasoning (order, victims, parking) stays in its module.
pub(crate) struct StepBuilder<'a> {
    core: &'a mut Core,
}

impl<'a> StepBuilder<'a> {
    pub(crate) fn new(core: &'a mut Core) -> Self {
        StepBuilder { core }
    }

    pub(crate) fn requests(&self) -> &BTreeMap<u64, RequestState> {
        &self.core.requests
    }

    pub(crate) fn blocks(&self) -> &BlockManager {
        &self.core.blocks
    }

    pub(crate) fn cost(&self) -> &CostModel {
        &self.core.cost
    }

    pub(crate) fn config(&self) -> &SchedulerConfig {
        &self.core.config
    }

    /// The step being built.
    pub(crate) fn step_id(&self) -> u64 {
        self.core.step_id
    }

    /// Running requests (KV on device, acknowledged) by priority class, then admission order.
    pub(crate) fn running_by_rank(&self) -> Vec<u64> {
        self.by_rank(Phase::Running)
    }

    /// Requests rotated out (copy acknowledged) by priority class, then admission order: the
    /// order swap brings them back in.
    pub(crate) fn rotated_by_rank(&self) -> Vec<u64> {
        self.by_rank(Phase::Rotated)
    }

    /// The requests in `phase` (not doomed) by priority class, then admission order.
    fn by_rank(&self, phase: Phase) -> Vec<u64> {
        let mut requests: Vec<((i32, u64), u64)> = self
            .core
            .requests
            .values()
            .filter(|r| r.phase == phase && !r.doomed)
            .map(|r| (r.rank(), r.id))
            .collect();
        requests.sort_unstable();
        requests.into_iter().map(|(_, id)| id).collect()
    }

    /// The waiting queue by priority class, in queue order within a class (preempted requests
    /// are at the front of theirs).
    pub(crate) fn waiting_by_priority(&self) -> Vec<u64> {
        let mut queue: Vec<u64> = self.core.waiting.iter().copied().collect();
        queue.sort_by_key(|id| self.core.requests[id].priority);
        queue
    }

    /// Tokens this request may compute now under the budgets (0 = none).
    fn chunk_for(&self, ctx: &StepCtx, id: u64) -> u32 {
        let request = &self.core.requests[&id];
        if ctx.requests_left == 0 || ctx.scheduled.contains(&id) || !request.has_work() {
            return 0;
        }
        let available = if request.is_decode() {
            ctx.tokens_left
        } else {
            ctx.tokens_left.saturating_sub(ctx.decode_reserve).min(ctx.prefill_token_cap)
        };
        request.uncomputed().min(available)
    }

    /// Schedules a running request's next chunk, growing its table to `reserve_tokens`
    /// positions at least (fcfs reserves the worst case; others pass 0).
    pub(crate) fn schedule_running(&mut self, ctx: &mut StepCtx, id: u64, reserve_tokens: u64) -> Fit {
        let chunk = self.chunk_for(ctx, id);
        if chunk == 0 {
            return Fit::NoBudget;
        }
        let computed = self.core.requests[&id].num_computed;
        let target = (u64::from(computed) + u64::from(chunk)).max(reserve_tokens);
        if !self.core.blocks.grow(id, target) {
            let needed = self.core.blocks.new_blocks_needed(id, target);
            return Fit::NoBlocks(needed - u64::from(self.core.blocks.free_device()).min(needed));
        }
        self.push_entry(ctx, id, chunk);
        Fit::Scheduled
    }

    /// Admits a waiting request: takes its cached prefix, reserves blocks and schedules its
    /// first chunk; nothing changes unless all of it fits.
    pub(crate) fn admit(&mut self, ctx: &mut StepCtx, id: u64, reserve_tokens: u64) -> Fit {
        let request = &self.core.requests[&id];
        if ctx.requests_left == 0 || !request.has_work() {
            return Fit::NoBudget;
        }
        let probe = self.core.blocks.probe_prefix(request.kv_namespace, request.prefix_lookup());
        let bs = u64::from(self.core.blocks.block_size());
        let cached_tokens = u64::from(probe.hit_blocks) * bs;
        let available = ctx.tokens_left.saturating_sub(ctx.decode_reserve).min(ctx.prefill_token_cap);
        let chunk = (request.tokens.len() as u64 - cached_tokens).min(u64::from(available));
        if chunk == 0 {
            return Fit::NoBudget;
        }
        let target = (cached_tokens + chunk).max(reserve_tokens);
        let needed = self.core.blocks.new_blocks_to_admit(&probe, target);
        let free = u64::from(self.core.blocks.free_device());
        if needed > free {
            return Fit::NoBlocks(needed - free);
        }
        let lookup = self.core.requests[&id].prefix_lookup().to_vec();
        let covered = self.core.blocks.acquire_prefix(id, self.core.requests[&id].kv_namespace, &lookup);
        let grown = self.core.blocks.grow(id, target);
        debug_assert!(grown, "admission was sized from the probe");
        self.core.counters.prefix_queried_tokens += lookup.len() as u64;
        self.core.counters.prefix_hit_tokens += u64::from(covered);
        self.core.waiting.retain(|w| *w != id);
        let request = self.core.requests.get_mut(&id).expect("admitted request exists");
        request.phase = Phase::Running;
        request.num_computed = covered;
        if !request.sent {
            request.sent = true;
            ctx.plan.first_scheduled.push(id);
        }
        self.push_entry(ctx, id, chunk as u32);
        Fit::Scheduled
    }

    fn push_entry(&mut self, ctx: &mut StepCtx, id: u64, chunk: u32) {
        let block_table = self.core.blocks.device_table(id).unwrap_or_default();
        let request = self.core.requests.get_mut(&id).expect("scheduled request exists");
        let computed = request.num_computed;
        let known = request.tokens.len() as u32;
        let samples = computed + chunk == request.num_positions();
        // Past the known tokens only a placeholder can be: a decode whose input is the token
        // an earlier step, still in flight, sampled on the shard.
        let input_from_shard = computed + chunk > known;
        debug_assert!(!input_from_shard || chunk == 1, "a placeholder is computed alone");
        if request.is_decode() {
            ctx.shape.decode_requests += 1;
        } else {
            ctx.shape.prefill_tokens += u64::from(chunk);
        }
        ctx.shape.context_tokens += u64::from(computed + chunk);
        request.num_computed += chunk;
        request.pending_steps += 1;
        ctx.tokens_left -= chunk;
        ctx.requests_left -= 1;
        ctx.scheduled.insert(id);
        if samples {
            request.placeholders += 1;
        }
        if input_from_shard {
            ctx.plan.input_from_shard.push(id);
        }
        ctx.entries.push(PlannedEntry { id, samples });
        // Published now, not when the results come back: a later step runs after this one, and
        // a request admitted later in this same step reads what this one writes, since every
        // layer writes the whole step's K/V before any attention reads the cache (the Step
        // protocol's contract). So n choices of one prompt, admitted together, compute it once.
        // Only positions whose tokens are known: a placeholder's block is published by a later
        // step, once the token is known.
        self.core.blocks.register_scheduled(id, &request.tokens, (computed + chunk).min(known));
        ctx.plan.scheduled.push(ScheduledEntry {
            id,
            num_computed_tokens: computed,
            num_new_tokens: chunk,
            block_table,
        });
    }

    /// Whether `id` may be preempted or rotated out now: on device, not part of this step, no
    /// step of it still computing (its KV is not final until the results come back).
    pub(crate) fn evictable(&self, ctx: &StepCtx, id: u64) -> bool {
        let request = &self.core.requests[&id];
        request.phase == Phase::Running
            && !request.doomed
            && request.pending_steps == 0
            && !ctx.scheduled.contains(&id)
    }

    /// Drops the request's device KV; it is re-prefilled from position 0 later (front of the
    /// queue). Returns the device blocks freed now.
    pub(crate) fn preempt_for_recompute(&mut self, ctx: &mut StepCtx, id: u64) -> u64 {
        let before = self.core.blocks.free_device();
        self.core.blocks.release(id);
        let request = self.core.requests.get_mut(&id).expect("preempted request exists");
        request.phase = Phase::Waiting;
        request.num_computed = 0;
        request.rotated_since_token = true;
        self.core.waiting.push_front(id);
        self.core.counters.recomputes += 1;
        ctx.plan.preempted_for_recompute.push(id);
        u64::from(self.core.blocks.free_device() - before)
    }

    /// Starts copying the request's private blocks to host (those the host holds no mirror
    /// of). Returns the device blocks that will be freed at acknowledgement (0 = nothing
    /// issued).
    pub(crate) fn rotate_out(&mut self, ctx: &mut StepCtx, id: u64) -> u64 {
        // Planned computes have already counted their positions: a copy after one sees them.
        let computed = self.core.requests[&id].num_computed;
        let moved = u64::from(self.core.blocks.private_device_blocks(id));
        let Some(transfer) = self.core.blocks.transfer_out(id, computed) else { return 0 };
        let copied = transfer.src_blocks.len() as u64;
        ctx.budget.take(Direction::Out, copied * self.core.config.block_bytes);
        self.core.counters.rotations_out += 1;
        self.core.counters.bytes_out += copied * self.core.config.block_bytes;
        self.core.counters.blocks_out_mirrored += moved - copied;
        let request = self.core.requests.get_mut(&id).expect("rotated request exists");
        request.phase = Phase::RotatingOut;
        request.rotated_since_token = true;
        ctx.plan.rotate_out.push(transfer);
        moved
    }

    /// Copies a request computing in this step to host once that compute is done: it leaves
    /// with its token, and its blocks are free at acknowledgement (the shard orders a copy out
    /// after the compute that writes its blocks). Returns the device blocks freed then (0 =
    /// nothing issued).
    pub(crate) fn rotate_out_after_compute(&mut self, ctx: &mut StepCtx, id: u64) -> u64 {
        let request = &self.core.requests[&id];
        // One brought back in this same step may leave again: the copy in, the compute and the
        // copy out run in that order.
        let on_device = matches!(request.phase, Phase::Running | Phase::RotatingIn);
        if !ctx.scheduled.contains(&id) || request.pending_steps != 1 || !on_device {
            return 0;
        }
        self.rotate_out(ctx, id)
    }

    /// Starts copying the request's host blocks back to device and computes its next chunk in
    /// this same step when the step's budgets and blocks allow: the shard orders that compute
    /// after the copy in (the Step protocol's contract), so the return costs the copy's time,
    /// not a step. False when it does not fit (nothing changes).
    pub(crate) fn rotate_in_and_compute(&mut self, ctx: &mut StepCtx, id: u64) -> bool {
        if !self.rotate_in(ctx, id) {
            return false;
        }
        self.schedule_running(ctx, id, 0);
        true
    }

    /// Starts copying the request's host blocks back to device. False when it does not fit.
    pub(crate) fn rotate_in(&mut self, ctx: &mut StepCtx, id: u64) -> bool {
        let Some(transfer) = self.core.blocks.transfer_in(id) else { return false };
        let bytes = transfer.src_blocks.len() as u64 * self.core.config.block_bytes;
        ctx.budget.take(Direction::In, bytes);
        self.core.counters.rotations_in += 1;
        self.core.counters.bytes_in += bytes;
        let request = self.core.requests.get_mut(&id).expect("returning request exists");
        request.phase = Phase::RotatingIn;
        request.rotated_in_step = Some(self.core.step_id);
        request.returned_without_token = true;
        ctx.plan.rotate_in.push(transfer);
        true
    }
}
