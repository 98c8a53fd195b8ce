//! SLO admission: what a new request's first token would take if it were admitted now, from
//! the cost model and the queue ahead of it. The engine publishes an [`AdmissionView`] of the
//! scheduler after each turn; the HTTP layer asks it about each request as it arrives, so a
//! request that cannot meet its first-token objective is refused at once (`--admission slo`)
//! and a router in front can send it elsewhere. The same view serves the simulator.
//!
//! The prediction has two parts and takes the later:
//! - **Compute.** The prefill tokens ahead of the request (waiting and part-computed prompts of
//!   its priority class or higher) plus its own, cut into steps beside the running decodes
//!   (each step takes what `max_batch_tokens` leaves them), each priced by the cost model.
//! - **Memory.** The blocks those prompts need beyond the free ones come from running requests
//!   finishing: each frees its blocks after its tokens left at the decode step time. The
//!   request's own prefill starts once enough have finished. The running requests keep growing
//!   meanwhile: the blocks they need for the steps until the request's first token are not free
//!   for it (every policy gives a running request its next block before a new prompt its
//!   first; a prediction that counted them admitted requests that then pushed running ones
//!   out — stalls of 6–7 s among the admitted, docs/benchmarks.md). What RotaSched could free by
//!   rotating running requests out is not counted: under the overload admission is for, few
//!   running requests have the slack to be rotated, so counting their blocks as free is
//!   optimistic (with them counted, 35% of the requests admitted at 1.5 req/s on the CPU met
//!   their first-token objective; docs/benchmarks.md, "SLO admission").

use crate::cost_model::{CostModel, StepShape};
use crate::request::Phase;
use crate::scheduler::Core;

/// A request ahead in the queue.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Queued {
    priority: i32,
    /// Prefill tokens still to compute.
    tokens: u64,
    /// Device blocks it needs that it does not hold.
    blocks: u64,
}

/// The scheduler's state as admission needs it, detached from the scheduler.
#[derive(Debug, Clone, PartialEq)]
pub struct AdmissionView {
    cost: CostModel,
    block_size: u64,
    max_batch_tokens: u64,
    /// Running decodes and the positions they attend (every step the prefill shares).
    decodes: u64,
    context_tokens: u64,
    queued: Vec<Queued>,
    /// Device blocks free now, plus what rotating running requests out can free (RotaSched).
    free_blocks: u64,
    /// Running requests by when they finish (seconds from now) with the blocks they free.
    finishing: Vec<(f64, u64)>,
    /// Running requests as they grow: (positions now, positions at their generation limit,
    /// device blocks held).
    growing: Vec<(u64, u64, u64)>,
    /// One step of the running decodes alone.
    decode_s: f64,
}

impl Default for AdmissionView {
    /// An idle server: nothing queued, nothing running, memory plentiful.
    fn default() -> Self {
        AdmissionView {
            cost: CostModel::default(),
            block_size: 16,
            max_batch_tokens: 2048,
            decodes: 0,
            context_tokens: 0,
            queued: Vec::new(),
            free_blocks: u64::MAX,
            finishing: Vec::new(),
            growing: Vec::new(),
            decode_s: 0.0,
        }
    }
}

impl AdmissionView {
    /// Predicted seconds from now to the first token of a request with a prompt of
    /// `prompt_tokens` in class `priority`, with `in_transit_tokens` more prompt tokens
    /// already admitted but not yet in this view.
    pub fn predict_ttft(&self, prompt_tokens: u64, priority: i32, in_transit_tokens: u64) -> f64 {
        let ahead = self.queued.iter().filter(|q| q.priority <= priority);
        let (tokens_ahead, blocks_ahead) = ahead.fold((in_transit_tokens, 0), |(t, b), q| (t + q.tokens, b + q.blocks));
        let blocks_in_transit = in_transit_tokens.div_ceil(self.block_size);
        let own_blocks = (prompt_tokens + 1).div_ceil(self.block_size);
        let compute_s = self.prefill_s(tokens_ahead + prompt_tokens);
        let growth = self.growth_blocks(compute_s);
        let short = (blocks_ahead + blocks_in_transit + own_blocks + growth).saturating_sub(self.free_blocks);
        if short == 0 {
            return compute_s;
        }
        let mut freed = 0;
        let mut wait_s = self.finishing.last().map_or(0.0, |(at, _)| *at);
        for (at, blocks) in &self.finishing {
            freed += blocks;
            if freed >= short {
                wait_s = *at;
                break;
            }
        }
        compute_s.max(wait_s + self.prefill_s(prompt_tokens))
    }

    /// New blocks the running requests need over `seconds` of steps (and one more step), within
    /// their generation limits.
    fn growth_blocks(&self, seconds: f64) -> u64 {
        if self.growing.is_empty() || self.decode_s <= 0.0 {
            return 0;
        }
        let steps = (seconds / self.decode_s).ceil() as u64 + 1;
        self.growing
            .iter()
            .map(|&(positions, limit, held)| (positions + steps).min(limit).div_ceil(self.block_size).saturating_sub(held))
            .sum()
    }

    /// Seconds to prefill `tokens` in steps beside the running decodes.
    fn prefill_s(&self, tokens: u64) -> f64 {
        let room = self.max_batch_tokens.saturating_sub(self.decodes).max(1);
        let mut left = tokens.max(1);
        let mut seconds = 0.0;
        let mut context = self.context_tokens;
        while left > 0 {
            let chunk = left.min(room);
            context += chunk;
            let shape = StepShape { prefill_tokens: chunk, decode_requests: self.decodes, context_tokens: context };
            seconds += self.cost.predict_step(shape);
            left -= chunk;
        }
        seconds
    }
}

impl Core {
    /// The admission view of the current state (see the module).
    pub(crate) fn admission_view(&self) -> AdmissionView {
        let mut view = AdmissionView {
            cost: self.cost,
            block_size: u64::from(self.config.block_size),
            max_batch_tokens: u64::from(self.config.max_batch_tokens),
            free_blocks: u64::from(self.blocks.free_device()),
            ..AdmissionView::default()
        };
        let mut decode_shape = StepShape::default();
        let mut running = Vec::new();
        for r in self.requests.values().filter(|r| !r.doomed) {
            match r.phase {
                Phase::Running if r.is_decode() || !r.has_work() => {
                    decode_shape.decode_requests += 1;
                    decode_shape.context_tokens += u64::from(r.num_computed) + 1;
                    running.push(r);
                }
                Phase::Running | Phase::Waiting => {
                    let prompt_end = u64::from(r.prompt_len.max(r.num_positions()));
                    let target = prompt_end + 1;
                    view.queued.push(Queued {
                        priority: r.priority,
                        tokens: u64::from(r.uncomputed()),
                        blocks: self.blocks.new_blocks_needed(r.id, target),
                    });
                    if r.phase == Phase::Running {
                        running.push(r);
                    }
                }
                Phase::Rotated | Phase::RotatingOut | Phase::RotatingIn => view.queued.push(Queued {
                    priority: r.priority,
                    tokens: 0,
                    blocks: u64::from(self.blocks.host_slots(r.id)),
                }),
            }
        }
        view.decodes = decode_shape.decode_requests;
        view.context_tokens = decode_shape.context_tokens;
        let decode_s = self.cost.predict_step(decode_shape);
        view.decode_s = decode_s;
        view.growing = running
            .iter()
            .filter(|r| r.has_work())
            .map(|r| (u64::from(r.num_positions()), r.max_kv_tokens(), self.blocks.slots(r.id).len() as u64))
            .collect();
        view.finishing = running
            .iter()
            .map(|r| {
                let blocks = u64::from(self.blocks.private_device_blocks(r.id));
                (f64::from(r.tokens_left()) * decode_s, blocks)
            })
            .collect();
        view.finishing.sort_by(|a, b| a.0.total_cmp(&b.0));
        view
    }

    /// Waiting requests that never produced a token and whose first-token deadline passed more
    /// than `timeout_s` before `now`: removed (counted as expired) and returned, oldest first.
    pub(crate) fn expire_queued(&mut self, now: f64, timeout_s: f64) -> Vec<u64> {
        let expired: Vec<u64> = self
            .requests
            .values()
            .filter(|r| r.phase == Phase::Waiting && !r.doomed && r.last_token_at.is_none() && r.pending_steps == 0)
            .filter(|r| now - r.next_deadline() > timeout_s)
            .map(|r| r.id)
            .collect();
        for id in &expired {
            self.waiting.retain(|w| w != id);
            self.blocks.release(*id);
            self.requests.remove(id);
            self.counters.expired += 1;
        }
        self.debug_check("expire_queued");
        expired
    }
}

#[cfg(test)]
mod tests {
    use crate::config::{PolicyKind, SchedulerConfig};
    use crate::cost_model::CostModel;
    use crate::plan::StepResults;
    use crate::request::RequestSpec;
    use crate::scheduler::Scheduler;

    fn scheduler(policy: PolicyKind, device_blocks: u32) -> Scheduler {
        let config = SchedulerConfig {
            block_size: 16,
            num_device_blocks: device_blocks,
            num_host_blocks: 0,
            max_batch_tokens: 256,
            policy,
            cost_model: CostModel {
                step_base_s: 0.01,
                per_prefill_token_s: 0.001,
                per_decode_request_s: 0.0,
                per_context_token_s: 0.0,
                ..CostModel::default()
            },
            ..SchedulerConfig::default()
        };
        Scheduler::new(config).unwrap()
    }

    fn spec(id: u64, prompt: u32, new_tokens: u32, priority: i32) -> RequestSpec {
        RequestSpec { id, prompt_token_ids: (0..prompt).map(|i| id as u32 * 997 + i).collect(), max_new_tokens: new_tokens, slo: None, arrival: 0.0, priority, kv_namespace: 0, scores_prompt: false }
    }

    #[test]
    fn an_idle_server_predicts_one_prefill() {
        let s = scheduler(PolicyKind::Fcfs, 64);
        let ttft = s.admission_view().predict_ttft(100, 0, 0);
        assert!((ttft - (0.01 + 0.1)).abs() < 1e-9, "{ttft}");
    }

    #[test]
    fn the_queue_ahead_of_its_class_delays_it_and_lower_classes_do_not() {
        let mut s = scheduler(PolicyKind::Fcfs, 1000);
        for id in 0..4 {
            s.add(spec(id, 256, 4, 1), 0.0).unwrap();
        }
        let view = s.admission_view();
        // Four prompts of 256 tokens queued in class 1: a class-1 request waits behind all of
        // them (5 steps of 256 tokens), a class-0 one behind none.
        let behind = view.predict_ttft(256, 1, 0);
        let ahead = view.predict_ttft(256, 0, 0);
        assert!((behind - 5.0 * 0.266).abs() < 1e-9, "{behind}");
        assert!((ahead - 0.266).abs() < 1e-9, "{ahead}");
        // Requests admitted but not yet in the view count too.
        assert!(view.predict_ttft(256, 0, 256) > ahead + 0.2);
    }

    #[test]
    fn a_full_pool_waits_for_running_requests_to_finish() {
        let mut s = scheduler(PolicyKind::Fcfs, 8);
        // One request takes the whole pool (fcfs reserves its worst case: 8 blocks).
        s.add(spec(1, 64, 60, 0), 0.0).unwrap();
        let plan = s.plan(0.0);
        assert_eq!(plan.scheduled.len(), 1);
        let view = s.admission_view();
        let ttft = view.predict_ttft(16, 0, 0);
        // It must wait for the 60 tokens of the running request (after its prefill, 59 decode
        // steps of 10 ms each), then its own prefill.
        assert!(ttft > 0.5, "{ttft}");
    }

    #[test]
    fn the_blocks_running_requests_grow_into_are_not_free_for_a_newcomer() {
        let mut s = scheduler(PolicyKind::Recompute, 6);
        // 32 prompt tokens fill two blocks exactly: its first decode needs a third, and 60
        // tokens to go (10 ms decode steps) will take two more. Four blocks are free.
        s.add(spec(1, 32, 60, 0), 0.0).unwrap();
        let plan = s.plan(0.0);
        assert_eq!(plan.scheduled.len(), 1);
        s.complete(&StepResults { step_id: plan.step_id, sampled: vec![(1, 7)], ..StepResults::default() }, 0.01);
        let view = s.admission_view();
        // A 40-token prompt needs three blocks with its first token: they are free now, and
        // one more is left for the running request's next block.
        let fits = view.predict_ttft(40, 0, 0);
        assert!(fits < 0.1, "{fits}");
        // A 56-token prompt needs all four: it waits for the running request to finish.
        let waits = view.predict_ttft(56, 0, 0);
        assert!(waits > 0.5, "{waits}");
    }

    #[test]
    fn queued_requests_expire_past_their_deadline_and_the_timeout() {
        let mut s = scheduler(PolicyKind::Fcfs, 8);
        s.add(spec(1, 64, 60, 0), 0.0).unwrap();
        s.add(spec(2, 64, 60, 0), 0.0).unwrap();
        s.plan(0.0);
        // The default objective is 2 s to the first token: at 2.5 s with a 1 s time-out the
        // queued request is kept, at 3.5 s it expires; the running one never does.
        assert!(s.expire_queued(2.5, 1.0).is_empty());
        assert_eq!(s.expire_queued(3.5, 1.0), vec![2]);
        assert_eq!(s.num_requests(), 1);
        assert_eq!(s.stats().expired, 1);
    }
}
