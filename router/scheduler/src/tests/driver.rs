//! A fake shard and engine: executes plans (sampling deterministic tokens), acknowledges
//! transfers after a chosen delay or when a simulated link has carried them (`Timing`),
//! finishes requests at their length limit, and asserts the ordering rules on every plan.

use std::collections::{BTreeMap, BTreeSet};

use crate::config::{PolicyKind, RotaSchedSettings, SchedulerConfig, Slo};
use crate::cost_model::CostModel;
use crate::plan::{StepPlan, StepResults};
use crate::request::RequestSpec;
use crate::scheduler::Scheduler;
use crate::sim::link::Link;
use crate::sim::{step_shape, LinkModel};
use crate::step::{StepBuilder, StepCtx};
use crate::cost_model::Direction;

pub(crate) const BLOCK_BYTES: u64 = 1000;

/// Small pools and a cost model with round numbers: 10 ms steps, 1 ms per block transferred.
pub(crate) fn config(policy: PolicyKind, device_blocks: u32) -> SchedulerConfig {
    SchedulerConfig {
        block_size: 4,
        num_device_blocks: device_blocks,
        num_host_blocks: 64,
        block_bytes: BLOCK_BYTES,
        max_batch_tokens: 64,
        max_batch_requests: 16,
        policy,
        default_slo: Slo::new(1.0, 0.1),
        cost_model: CostModel {
            step_base_s: 0.01,
            per_prefill_token_s: 0.0001,
            per_decode_request_s: 0.0001,
            per_context_token_s: 0.0,
            swap_out_bytes_per_s: 1e6,
            swap_in_bytes_per_s: 1e6,
            transfer_overhead_s: 0.0,
            duplex: true,
            correction: 1.0,
            ..CostModel::default()
        },
        prefix_caching: true,
        ema_alpha: 0.2,
        rotasched: RotaSchedSettings {
            rotation_cooldown_steps: 4,
            min_rotation_tokens_left: 2,
            late_starvation_s: 10.0,
            // Scenarios of a few requests: rotation is allowed whatever the gaps so far (the
            // budget has its own test).
            rotation_late_gap_share: 1.0,
            // The overload served as swap serves it, which most scenarios here were written
            // for; the time-sharing ones set it.
            time_share: false,
        },
        tbt_percentile: 100.0,
    }
}

pub(crate) fn with_slo(mut spec: RequestSpec, ttft_s: f64, tbt_s: f64) -> RequestSpec {
    spec.slo = Some(Slo::new(ttft_s, tbt_s));
    spec
}

/// The spec with its stall bound set (its objectives must be set already).
pub(crate) fn with_stall(mut spec: RequestSpec, max_stall_s: f64) -> RequestSpec {
    spec.slo = spec.slo.map(|slo| slo.with_max_stall(Some(max_stall_s)));
    spec
}

/// The burst scenario: three long generations with relaxed objectives (5 s, 1 s) hold the
/// memory for 20 steps, then ten short interactive requests (ids 10..20) arrive at once with
/// `ttft_s` for both objectives. Returns their arrival time.
pub(crate) fn burst(d: &mut Driver, ttft_s: f64) -> f64 {
    for id in 0..3 {
        d.add(with_slo(spec(id, 40, 60, 0.0), 5.0, 1.0));
    }
    while d.plans.len() < 20 {
        d.step();
    }
    let arrival = d.now;
    for id in 10..20 {
        d.add(with_slo(spec(id, 8, 4, arrival), ttft_s, ttft_s));
    }
    arrival
}

pub(crate) fn spec(id: u64, prompt_len: u32, max_new_tokens: u32, arrival: f64) -> RequestSpec {
    RequestSpec {
        id,
        prompt_token_ids: (0..prompt_len).map(|i| (id as u32 * 1000 + i) % 50_000).collect(),
        max_new_tokens,
        slo: None,
        arrival,
        priority: 0,
        kv_namespace: 0,
        scores_prompt: false,
    }
}

/// How the fake machine times a step and its transfers.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Timing {
    /// Every step advances the clock by `Driver::step_s` and reports the cost model's own
    /// prediction as measured; a transfer is acknowledged `Driver::ack_delay` steps after the
    /// step that issued it. Tests steer the scheduler through its configuration alone.
    Scripted,
    /// A machine the scheduler does not know exactly: a step takes `step_factor` × its
    /// prediction (the clock advances by that, and it is reported as measured, so the online
    /// correction runs); a transfer takes the link's time — its bytes over the direction's
    /// bandwidth plus the overhead, queued behind earlier ones (one queue when not duplex) —
    /// and is acknowledged with the first step that ends after it lands. A step that computes
    /// nothing takes `idle_step_s`. Steps stray from `step_factor` by ± `jitter` (alternately,
    /// by step id), a step holding a prefill chunk beside decodes takes `mixed_factor` times
    /// more (a CPU's chunk attending its prompt's computed prefix), and each step takes
    /// `overhead_s` more on the clock than it reports as measured (the router's and the RPC's
    /// share of a real step).
    Machine { step_factor: f64, idle_step_s: f64, jitter: f64, mixed_factor: f64, overhead_s: f64 },
}

pub(crate) struct Driver {
    pub(crate) scheduler: Scheduler,
    pub(crate) now: f64,
    pub(crate) step_s: f64,
    /// Steps a transfer waits before its acknowledgement (0 = with its own step's results).
    pub(crate) ack_delay: u64,
    /// transfer id -> (step at which it is acknowledged, is a transfer in, request)
    unacked: BTreeMap<u64, (u64, bool, u64)>,
    /// Device blocks read by unacknowledged transfers out / written by unacknowledged transfers in.
    busy_blocks: BTreeMap<u64, Vec<u32>>,
    /// Host blocks written by unacknowledged transfers out / read by unacknowledged transfers in.
    busy_host: BTreeMap<u64, Vec<u32>>,
    /// request -> step of its latest rotation in.
    rotated_in_at: BTreeMap<u64, u64>,
    /// When each request's latest rotation in was issued.
    returned_at: BTreeMap<u64, f64>,
    pub(crate) plans: Vec<StepPlan>,
    pub(crate) finished: BTreeSet<u64>,
    /// Whether to finish requests that reach their length limit (the engine's job).
    pub(crate) auto_finish: bool,
    pub(crate) timing: Timing,
    /// The link under `Timing::Machine` (its model given to `on_machine`).
    link: Option<Link>,
    /// request -> clock time at the end of each step that sampled a token for it.
    pub(crate) token_times: BTreeMap<u64, Vec<f64>>,
}

impl Driver {
    pub(crate) fn new(config: SchedulerConfig) -> Self {
        Driver {
            scheduler: Scheduler::new(config).expect("valid test config"),
            now: 0.0,
            step_s: 0.01,
            ack_delay: 0,
            unacked: BTreeMap::new(),
            busy_blocks: BTreeMap::new(),
            busy_host: BTreeMap::new(),
            rotated_in_at: BTreeMap::new(),
            returned_at: BTreeMap::new(),
            plans: Vec::new(),
            finished: BTreeSet::new(),
            auto_finish: true,
            timing: Timing::Scripted,
            link: None,
            token_times: BTreeMap::new(),
        }
    }

    /// A driver whose steps and transfers take a simulated machine's time (`Timing::Machine`).
    pub(crate) fn on_machine(config: SchedulerConfig, step_factor: f64, link: LinkModel) -> Self {
        let block_bytes = config.block_bytes;
        let mut driver = Driver::new(config);
        driver.timing = Timing::Machine { step_factor, idle_step_s: 0.001, jitter: 0.0, mixed_factor: 1.0, overhead_s: 0.0 };
        driver.link = Some(Link::new(link, block_bytes));
        driver
    }

    pub(crate) fn add(&mut self, spec: RequestSpec) {
        self.scheduler.add(spec, self.now).expect("request accepted");
    }

    /// Steps until every request of `ids` has sampled a token.
    pub(crate) fn step_to_first_tokens(&mut self, ids: &[u64]) {
        while ids.iter().any(|id| self.scheduler.core.requests[id].generated() < 1) {
            self.step();
        }
    }

    /// Builds a step by hand (`act` on a step builder of the scheduler's state), then executes it.
    pub(crate) fn by_hand(&mut self, act: impl FnOnce(&mut StepBuilder, &mut StepCtx)) {
        let core = &mut self.scheduler.core;
        let mut ctx = core.new_ctx(self.now);
        act(&mut StepBuilder::new(core), &mut ctx);
        let plan = core.seal(ctx);
        self.execute(plan);
    }

    /// One plan/execute/complete round; returns the plan.
    pub(crate) fn step(&mut self) -> StepPlan {
        let plan = self.scheduler.plan(self.now);
        self.execute(plan)
    }

    /// Executes `plan` (the scheduler's, or one a test built through a `StepBuilder`) and
    /// completes it; returns the plan.
    pub(crate) fn execute(&mut self, plan: StepPlan) -> StepPlan {
        self.check_plan(&plan);
        // Under Timing::Machine a transfer is acknowledged when the link has carried it.
        let ack_step = match self.timing {
            Timing::Scripted => plan.step_id + self.ack_delay,
            Timing::Machine { .. } => u64::MAX,
        };
        if let Some(link) = self.link.as_mut() {
            for t in &plan.rotate_out {
                link.issue(t, Direction::Out, self.now);
            }
            for t in &plan.rotate_in {
                link.issue(t, Direction::In, self.now);
            }
        }
        for t in &plan.rotate_out {
            self.unacked.insert(t.id, (ack_step, false, t.request_id));
            self.busy_blocks.insert(t.id, t.src_blocks.clone());
            self.busy_host.insert(t.id, t.dst_blocks.clone());
        }
        for t in &plan.rotate_in {
            self.unacked.insert(t.id, (ack_step, true, t.request_id));
            self.busy_blocks.insert(t.id, t.dst_blocks.clone());
            self.busy_host.insert(t.id, t.src_blocks.clone());
            self.rotated_in_at.insert(t.request_id, plan.step_id);
            self.returned_at.insert(t.request_id, self.now);
        }
        let sampled = plan
            .sampling
            .iter()
            .map(|id| {
                let known = self.scheduler.tokens(*id).map_or(0, |t| t.len());
                (*id, ((*id as usize * 31 + known) % 997) as u32)
            })
            .collect();
        let (duration, measured) = match self.timing {
            // The model's own prediction: tests steer the cost model through the config, not
            // through drifting measurements.
            Timing::Scripted => (self.step_s, plan.predicted_step_s.max(1e-6)),
            Timing::Machine { idle_step_s, .. } if plan.scheduled.is_empty() => (idle_step_s, idle_step_s),
            Timing::Machine { step_factor, jitter, mixed_factor, overhead_s, .. } => {
                // The machine is the warm-up's model scaled, whatever the scheduler has learnt.
                let model = self.scheduler.config().cost_model;
                let shape = step_shape(&plan);
                let stray = if plan.step_id % 2 == 0 { 1.0 + jitter } else { 1.0 - jitter };
                let kind = if shape.prefill_tokens > 0 && shape.decode_requests > 0 { mixed_factor } else { 1.0 };
                let took = (model.predict_step_uncorrected(shape) * step_factor * stray * kind).max(1e-6);
                (took + overhead_s, took)
            }
        };
        self.now += duration;
        let due: Vec<u64> = match self.link.as_mut() {
            Some(link) => link.take_completed(self.now),
            None => self
                .unacked
                .iter()
                .filter(|(_, (at, _, _))| *at <= plan.step_id)
                .map(|(id, _)| *id)
                .collect(),
        };
        for id in &due {
            self.unacked.remove(id);
            self.busy_blocks.remove(id);
            self.busy_host.remove(id);
        }
        for id in &plan.sampling {
            self.token_times.entry(*id).or_default().push(self.now);
        }
        let results = StepResults {
            step_id: plan.step_id,
            sampled,
            completed_transfers: due,
            step_time_s: Some(measured),
        };
        self.scheduler.complete(&results, self.now);
        if self.auto_finish {
            self.finish_exhausted();
        }
        self.plans.push(plan.clone());
        plan
    }

    fn finish_exhausted(&mut self) {
        let done: Vec<u64> = self
            .scheduler
            .core
            .requests
            .values()
            .filter(|r| r.exhausted() && !r.doomed)
            .map(|r| r.id)
            .collect();
        for id in done {
            self.scheduler.finish(id);
            self.finished.insert(id);
        }
    }

    /// The ordering rules: no scheduled table holds a block a transfer is reading or writing —
    /// but the blocks its own transfer in of this very step writes (the shard orders that
    /// compute after the copy) —, no request is scheduled while a transfer in of an earlier
    /// step is unacknowledged, every table covers its tokens, and the budgets hold.
    fn check_plan(&self, plan: &StepPlan) {
        let config = self.scheduler.config();
        let bs = config.block_size as usize;
        let mut busy: BTreeSet<u32> = self.busy_blocks.values().flatten().copied().collect();
        // A copy out of a request computed in this step runs after the compute.
        let computing: BTreeSet<u64> = plan.scheduled.iter().map(|e| e.id).collect();
        busy.extend(
            plan.rotate_out.iter().filter(|t| !computing.contains(&t.request_id)).flat_map(|t| t.src_blocks.iter().copied()),
        );
        let returning: BTreeSet<u64> =
            self.unacked.values().filter(|(_, is_in, _)| *is_in).map(|(_, _, r)| *r).collect();
        let mut tokens = 0u64;
        for entry in &plan.scheduled {
            assert!(!returning.contains(&entry.id), "request {} scheduled before its transfer in ack", entry.id);
            let end = (entry.num_computed_tokens + entry.num_new_tokens) as usize;
            assert!(entry.num_new_tokens > 0);
            assert!(entry.block_table.len() * bs >= end, "table of {} does not cover {end}", entry.id);
            let own_in: BTreeSet<u32> = plan
                .rotate_in
                .iter()
                .filter(|t| t.request_id == entry.id)
                .flat_map(|t| t.dst_blocks.iter().copied())
                .collect();
            let others_in: BTreeSet<u32> = plan
                .rotate_in
                .iter()
                .filter(|t| t.request_id != entry.id)
                .flat_map(|t| t.dst_blocks.iter().copied())
                .collect();
            for block in &entry.block_table {
                assert!(!busy.contains(block) && !others_in.contains(block), "block {block} of {} is in flight", entry.id);
                // Its own copy out in this step runs after the compute; it holds the whole table
                // until acknowledged, the blocks with host mirrors (not copied) included.
                let own_out = plan.rotate_out.iter().any(|t| t.request_id == entry.id);
                let held = self.scheduler.core.blocks.device_block_busy(*block) && !own_in.contains(block) && !own_out;
                assert!(!held, "block {block} of {} is held by a transfer", entry.id);
            }
            let known = self.scheduler.tokens(entry.id).map_or(0, |t| t.len());
            assert!(end <= known, "request {} computes beyond its tokens", entry.id);
            tokens += u64::from(entry.num_new_tokens);
        }
        assert!(tokens <= u64::from(config.max_batch_tokens));
        assert!(plan.scheduled.len() <= config.max_batch_requests as usize);
        let ids: BTreeSet<u64> = plan.scheduled.iter().map(|e| e.id).collect();
        assert_eq!(ids.len(), plan.scheduled.len(), "a request scheduled twice in one step");
        let pending_out: Vec<u32> = self.busy_blocks.values().flatten().copied().collect();
        for t in &plan.rotate_in {
            for block in &t.dst_blocks {
                assert!(!pending_out.contains(block), "transfer in into in-flight block {block}");
            }
        }
        let pending_host: BTreeSet<u32> = self.busy_host.values().flatten().copied().collect();
        for t in plan.rotate_out.iter() {
            for block in &t.dst_blocks {
                assert!(!pending_host.contains(block), "transfer out into in-flight host block {block}");
            }
        }
        match config.policy {
            crate::config::PolicyKind::Fcfs => {
                assert!(plan.preempted_for_recompute.is_empty(), "fcfs never preempts");
                assert!(plan.rotate_out.is_empty() && plan.rotate_in.is_empty(), "fcfs never rotates");
            }
            crate::config::PolicyKind::Recompute => {
                assert!(plan.rotate_out.is_empty() && plan.rotate_in.is_empty(), "recompute never rotates");
            }
            _ => {}
        }
        self.check_rotation_rules(plan);
    }

    /// RotaSched's rotation limits: the per-step byte budget (a due rotation in larger than a
    /// whole budget may go alone), the cool-down after a rotation in, the tokens-left floor.
    /// Steps planned in its overload mode report no budget: they are swap's, under swap's rules.
    fn check_rotation_rules(&self, plan: &StepPlan) {
        let config = self.scheduler.config();
        if config.policy != crate::config::PolicyKind::RotaSched || plan.rotate_out_budget_bytes.is_none() {
            return;
        }
        let bytes = |ts: &[crate::plan::Transfer]| -> u64 {
            ts.iter().map(|t| t.src_blocks.len() as u64 * config.block_bytes).sum()
        };
        let (out_limit, in_limit) = (plan.rotate_out_budget_bytes, plan.rotate_in_budget_bytes);
        assert!(bytes(&plan.rotate_out) <= out_limit.expect("rotasched reports its budget"));
        let into = bytes(&plan.rotate_in);
        assert!(into <= in_limit.expect("budget") || plan.rotate_in.len() == 1, "rotate-in budget");
        for t in &plan.rotate_out {
            if let Some(at) = self.rotated_in_at.get(&t.request_id) {
                let since = plan.step_id - at;
                assert!(since >= config.rotasched.rotation_cooldown_steps, "{} rotated {since} steps after returning", t.request_id);
            }
            if let Some(returned) = self.returned_at.get(&t.request_id) {
                let token_since = self.token_times.get(&t.request_id).and_then(|t| t.last()).is_some_and(|at| at > returned);
                assert!(token_since, "{} rotated out again before computing a token since its return", t.request_id);
            }
            let request = &self.scheduler.core.requests[&t.request_id];
            assert!(request.tokens_left() >= config.rotasched.min_rotation_tokens_left);
        }
    }

    /// Steps until every request is finished (or `max_steps` pass); returns the steps taken.
    pub(crate) fn run_to_completion(&mut self, max_steps: usize) -> usize {
        for taken in 0..max_steps {
            if !self.scheduler.has_work() {
                return taken;
            }
            self.step();
        }
        panic!("requests left after {max_steps} steps: {:?}", self.scheduler.stats());
    }

    pub(crate) fn assert_all_free(&self) {
        let stats = self.scheduler.stats();
        assert_eq!(stats.device_blocks_free, stats.device_blocks_total, "device blocks leaked");
        assert_eq!(stats.host_blocks_free, stats.host_blocks_total, "host blocks leaked");
        self.scheduler.check_invariants().expect("invariants");
    }
}
