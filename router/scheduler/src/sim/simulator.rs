//! The discrete-event loop: drives the real `Scheduler` exactly as the engine does (add at
//! arrival, plan, execute, complete, finish), but the step's duration comes from the simulated
//! machine — its forward pass plus what `Charges` adds: a fixed cost per step, the share of
//! its transfers' link time that stalls it, and (optionally) the planning's own wall time —
//! and the clock jumps from event to event. Nothing here is random: unless planning is
//! charged, the same config gives the same report.

use std::collections::BTreeMap;
use std::time::Instant;

use crate::cost_model::Direction;
use crate::plan::{StepPlan, StepResults};
use crate::request::RequestSpec;
use crate::scheduler::Scheduler;
use crate::sim::config::{SimConfig, SimError};
use crate::sim::link::Link;
use crate::sim::report::{summarize_gaps, RequestOutcome, SimReport, StepRecord, Timeline};
use crate::sim::timing::step_shape;

/// Plans that change state without computing (rotations, preemptions) are re-planned at the same
/// instant at most this many times in a row before the clock moves to the next event.
const MAX_IDLE_REPLANS: u32 = 8;
/// Synthetic token ids stay within a typical vocabulary.
const VOCAB: u64 = 32_000;

/// Runs one simulation to the end of its workload (or `max_sim_time_s`).
pub fn simulate(config: &SimConfig) -> Result<SimReport, SimError> {
    config.validate()?;
    let mut scheduler = Scheduler::new(config.scheduler.clone())?;
    let mut simulation = Simulation::new(config);
    simulation.run(&mut scheduler);
    Ok(simulation.into_report(&scheduler))
}

/// splitmix64: a well-mixed token id per (request, position), so prompts differ.
fn synthetic_token(request: u64, position: u64) -> u32 {
    let mut z = request.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ position.wrapping_add(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    ((z ^ (z >> 31)) % VOCAB) as u32
}

struct Simulation<'a> {
    config: &'a SimConfig,
    link: Link,
    now: f64,
    next_arrival: usize,
    live: BTreeMap<u64, Timeline>,
    outcomes: Vec<Option<RequestOutcome>>,
    all_gaps: Vec<f32>,
    steps: u64,
    stalled: bool,
    last_token: f64,
    charged_per_step_s: f64,
    charged_transfer_stall_s: f64,
    charged_planning_s: f64,
    step_log: Vec<StepRecord>,
}

impl<'a> Simulation<'a> {
    fn new(config: &'a SimConfig) -> Self {
        Simulation {
            config,
            link: Link::new(config.link, config.scheduler.block_bytes),
            now: config.requests.first().map_or(0.0, |r| r.arrival),
            next_arrival: 0,
            live: BTreeMap::new(),
            outcomes: vec![None; config.requests.len()],
            all_gaps: Vec::new(),
            steps: 0,
            stalled: false,
            last_token: 0.0,
            charged_per_step_s: 0.0,
            charged_transfer_stall_s: 0.0,
            charged_planning_s: 0.0,
            step_log: Vec::new(),
        }
    }

    fn admit_arrivals(&mut self, scheduler: &mut Scheduler) {
        let requests = &self.config.requests;
        while self.next_arrival < requests.len() && requests[self.next_arrival].arrival <= self.now {
            let index = self.next_arrival;
            let request = &requests[index];
            let id = index as u64;
            let spec = RequestSpec {
                id,
                prompt_token_ids: (0..u64::from(request.prompt_tokens))
                    .map(|p| synthetic_token(id, p))
                    .collect(),
                max_new_tokens: request.max_new_tokens,
                slo: request.slo,
                arrival: request.arrival,
                priority: request.priority,
                kv_namespace: 0,
                scores_prompt: false,
            };
            match scheduler.add(spec, self.now) {
                Ok(()) => {
                    self.live
                        .insert(id, Timeline::new(request.arrival, request.max_new_tokens, request.priority));
                }
                Err(error) => {
                    self.outcomes[index] = Some(rejected(id, request.arrival, request.priority, error.to_string()))
                }
            }
            self.next_arrival += 1;
        }
    }

    fn next_event(&self) -> Option<f64> {
        let arrival = self.config.requests.get(self.next_arrival).map(|r| r.arrival);
        match (arrival, self.link.next_completion()) {
            (Some(a), Some(t)) => Some(a.min(t)),
            (a, t) => a.or(t),
        }
    }

    fn run(&mut self, scheduler: &mut Scheduler) {
        let mut idle_replans = 0;
        loop {
            self.admit_arrivals(scheduler);
            if self.now > self.config.max_sim_time_s {
                break;
            }
            if !scheduler.has_work() {
                match self.next_event() {
                    Some(t) => self.now = self.now.max(t),
                    None => break,
                }
                continue;
            }
            let charges = self.config.charges;
            let started = Instant::now();
            let plan = scheduler.plan(self.now);
            if charges.planning {
                // The plan is ready, and its transfers start, once planning is done.
                let planning_s = started.elapsed().as_secs_f64();
                self.charged_planning_s += planning_s;
                self.now += planning_s;
            }
            let mut link_s = 0.0;
            // A request brought back computes in the step that brings it (`StepBuilder::rotate_in`):
            // the step's compute waits for its copy in.
            let mut compute_from = self.now;
            for (transfers, direction) in [(&plan.rotate_out, Direction::Out), (&plan.rotate_in, Direction::In)] {
                for transfer in transfers {
                    if direction == Direction::Out && plan.computes(transfer.request_id) {
                        // Leaves after computing in this step: issued once the compute is done.
                        continue;
                    }
                    link_s += self.link.seconds(transfer, direction);
                    let finish = self.link.issue(transfer, direction, self.now);
                    if direction == Direction::In && plan.computes(transfer.request_id) {
                        compute_from = compute_from.max(finish);
                    }
                }
            }
            let stall_s = charges.transfer_stall * link_s;
            if self.config.step_log {
                self.step_log.push(step_record(self.now, &plan, scheduler));
            }
            if !plan.scheduled.is_empty() {
                idle_replans = 0;
                self.execute(scheduler, &plan, charges.per_step_s + stall_s + (compute_from - self.now));
                self.charged_per_step_s += charges.per_step_s;
                self.charged_transfer_stall_s += stall_s;
                continue;
            }
            // A step that computes nothing still goes to the shard and back.
            self.now += charges.per_step_s;
            self.charged_per_step_s += charges.per_step_s;
            // Nothing to compute: re-plan at once if the plan changed something, otherwise
            // wait for the next transfer or arrival.
            let wait_until = if !plan.is_empty() && idle_replans < MAX_IDLE_REPLANS {
                idle_replans += 1;
                Some(self.now)
            } else {
                idle_replans = 0;
                self.next_event()
            };
            let Some(time) = wait_until else {
                self.stalled = true;
                break;
            };
            self.now = self.now.max(time);
            let results = StepResults {
                step_id: plan.step_id,
                completed_transfers: self.link.take_completed(self.now),
                ..StepResults::default()
            };
            scheduler.complete(&results, self.now);
        }
    }

    /// Runs one step on the simulated machine: its forward pass and `charged_s` more.
    fn execute(&mut self, scheduler: &mut Scheduler, plan: &StepPlan, charged_s: f64) {
        let mut duration = self.config.step_time.step_time(step_shape(plan)) + charged_s;
        // Copies out of requests computed in this step start after the compute; the step's
        // results wait for them, so their blocks are free for the next step.
        let computed_at = self.now + duration;
        for transfer in plan.rotate_out.iter().filter(|t| plan.computes(t.request_id)) {
            let finish = self.link.issue(transfer, Direction::Out, computed_at);
            duration = duration.max(finish - self.now);
        }
        let end = self.now + duration;
        let results = StepResults {
            step_id: plan.step_id,
            sampled: plan
                .sampling
                .iter()
                .map(|&id| (id, synthetic_token(id, u64::MAX - self.steps)))
                .collect(),
            completed_transfers: self.link.take_completed(end),
            step_time_s: Some(duration),
        };
        scheduler.complete(&results, end);
        self.now = end;
        self.steps += 1;
        for &id in &plan.sampling {
            let done = self.live.get_mut(&id).is_some_and(|timeline| timeline.token(end));
            self.last_token = end;
            if done {
                scheduler.finish(id);
                if let Some(timeline) = self.live.remove(&id) {
                    let outcome = timeline.close(id, true, self.config.scheduler.tbt_percentile, &mut self.all_gaps);
                    self.outcomes[id as usize] = Some(outcome);
                }
            }
        }
    }

    fn into_report(mut self, scheduler: &Scheduler) -> SimReport {
        let percentile = self.config.scheduler.tbt_percentile;
        for (id, timeline) in std::mem::take(&mut self.live) {
            self.outcomes[id as usize] = Some(timeline.close(id, false, percentile, &mut self.all_gaps));
        }
        let requests = &self.config.requests;
        let outcomes: Vec<RequestOutcome> = self
            .outcomes
            .into_iter()
            .enumerate()
            .map(|(i, o)| {
                o.unwrap_or_else(|| {
                    rejected(
                        i as u64,
                        requests[i].arrival,
                        requests[i].priority,
                        "never arrived before the simulation ended".into(),
                    )
                })
            })
            .collect();
        let (gap_stats, gap_quantiles) = summarize_gaps(&mut self.all_gaps, self.config.gap_samples);
        let first = requests.first().map_or(0.0, |r| r.arrival);
        SimReport {
            outcomes,
            gap_stats,
            gap_quantiles,
            makespan_s: (self.last_token - first).max(0.0),
            steps: self.steps,
            stalled: self.stalled,
            bytes_out: self.link.bytes_out,
            bytes_in: self.link.bytes_in,
            scheduler: scheduler.stats(),
            charged_per_step_s: self.charged_per_step_s,
            charged_transfer_stall_s: self.charged_transfer_stall_s,
            charged_planning_s: self.charged_planning_s,
            step_log: self.step_log,
        }
    }
}

/// The step log's record of `plan`, planned at `now`.
fn step_record(now: f64, plan: &StepPlan, scheduler: &Scheduler) -> StepRecord {
    let ids = |transfers: &[crate::plan::Transfer]| transfers.iter().map(|t| t.request_id).collect();
    let requests: Vec<_> = scheduler.core.requests.values().map(|r| (r.id, r.phase.name(), r.objectives_lost)).collect();
    let kv = &scheduler.core.blocks;
    let blocks = requests
        .iter()
        .map(|&(id, _, _)| {
            let slots = if kv.has_table(id) { kv.slots(id) } else { &[] };
            let device = slots.iter().filter(|s| matches!(s, crate::kv::Slot::Device(_))).count();
            (device as u32, slots.len() as u32)
        })
        .collect();
    StepRecord {
        time: now,
        scheduled: plan.scheduled.iter().map(|e| e.id).collect(),
        rotate_out: ids(&plan.rotate_out),
        rotate_in: ids(&plan.rotate_in),
        recomputed: plan.preempted_for_recompute.clone(),
        free_device_blocks: scheduler.core.blocks.free_device(),
        requests,
        blocks,
    }
}

fn rejected(id: u64, arrival: f64, priority: i32, error: String) -> RequestOutcome {
    RequestOutcome {
        id,
        arrival,
        finished: false,
        output_tokens: 0,
        ttft_s: None,
        e2e_s: None,
        tbt_s: None,
        max_gap_s: None,
        priority,
        error: Some(error),
    }
}
