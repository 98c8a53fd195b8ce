//! Time-sharing under overload (`RotaSchedSettings::time_share`). When the running requests
//! cannot all grow, the device is shared out by next-token deadline instead of served as swap
//! serves it: every step computes the requests whose next token is due first, and a request
//! moves between device and host without a step lost either way — one brought back computes in
//! the step that brings it (`StepBuilder::rotate_in_and_compute`: the shard runs that compute
//! after the copy in), and one the next step will not compute leaves after computing in this
//! one (`StepBuilder::rotate_out_after_compute`: the copy out after the compute, acknowledged in
//! the step's reply), so its blocks are free for the next step's returns.
//!
//! Deadlines: a punctual prompt's first-token deadline, a punctual decode's TBT deadline, and a
//! request already lost (past its first-token deadline, or its objectives lost) paced at a share
//! of its stall bound, so none stalls past it; a lost prompt waits until no punctual one of its
//! class or a higher one does. A punctual decode off the device whose token would be late even
//! brought back at once sits out that late gap at the same pace while its objective allows one
//! more (`sits_out`), rather than pushing a request still on time out, late in its turn. Prompts
//! are admitted while the demand for the device of the admitted requests of their class and the
//! higher ones — the blocks each holds times the share
//! of steps it must compute in to keep its pace — fits the pool: a lower class yields its blocks.
//! That share is priced on the steps as they come while time-sharing (`Cadence`: the copies a
//! shared device makes lengthen them), with a margin (`CADENCE_MARGIN`) — not on a step estimate
//! that prices every waiting prompt's prefill in, which made the share of every request 1 as soon
//! as a queue formed, so no prompt was admitted past what fitted without sharing.
//!
//! KV moves only when a deadline needs it: a lost request off the device takes the place of one
//! on it only a couple of decode steps before it is due (`LOST_RETURN_STEPS`; judged on the
//! decodes' step, not on an estimate the waiting prompts lengthen), and a request made to leave
//! for a return or an admission the prediction missed computes in this step first, since its
//! blocks are free only at the step's acknowledgement either way. Every block a request idle on
//! the device holds, or a copy out holds without a compute, is a row the step does not decode.

use std::collections::BTreeMap;

use super::{reactive, urgency};
use crate::request::{Phase, RequestState};
use crate::step::{Fit, StepBuilder, StepCtx};

/// A prompt counts as lost this long before its first-token deadline: admitted later, its
/// prefill step would end past it.
const PROMPT_LEAD_S: f64 = 0.15;
/// A punctual decode must compute within this share of its TBT objective on average (the rest
/// is the margin for the steps a prefill lengthens).
const TBT_SHARE: f64 = 0.9;
/// A lost request computes at least once per this share of its stall bound: far enough inside
/// it that a step's variation, a queue of returns and the prefill steps never push a gap past the
/// bound, and short enough that its gaps do not set the 99th percentile of all gaps.
const LOST_PACE_SHARE: f64 = 0.4;
/// How many decode steps before its deadline a lost request off the device may take the place
/// of one on it: until then it comes after everyone on the device, so a lost request brought
/// back stays while no one is due instead of leaving after its one token (a copy each way per
/// token), and the lost rotate only when one's pace requires it.
const LOST_RETURN_STEPS: f64 = 2.0;

/// The demand of a request is priced at this many of the steps measured while time-sharing
/// (`Cadence`). The device is not packed to the share each request needs: every step computes
/// every request it holds, earlier than its pace requires, and the blocks left when the next
/// request does not fit compute no one; admitting a prompt adds copies that lengthen the steps
/// after it. Measured on the simulated suite's Azure and chat workloads (docs/benchmarks.md,
/// "Time-sharing prices demand on its measured steps"): 1 admits more than the device then
/// serves at pace (first tokens won, their gaps late), 1.25 and 2 admit less than 1.5 and lead by
/// less.
const CADENCE_MARGIN: f64 = 1.5;

/// How often steps come while the device is time-shared: the interval between consecutive
/// time-shared plans, an exponential moving average (the scheduler's `ema_alpha`). An interval
/// counts only when a step's results came in between the two plans (a pipelined plan follows its
/// predecessor at once) and both plans time-shared (the first of an overload follows a step of
/// another mode, or an idle wait). RotaSched's own state: it survives a recovery, as what is
/// learnt of the machine does.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Cadence {
    interval_s: Option<f64>,
    /// When the previous plan was made, if it time-shared.
    last_plan: Option<f64>,
    /// Results applied since the previous plan.
    results: u32,
    alpha: f64,
}

impl Cadence {
    /// A time-shared plan at `now`.
    pub(super) fn on_plan(&mut self, now: f64) {
        if let Some(last) = self.last_plan.filter(|_| self.results > 0) {
            let interval = now - last;
            if interval.is_finite() && interval > 0.0 {
                // `alpha` is set: results came in since the previous plan.
                let alpha = self.alpha;
                self.interval_s = Some(self.interval_s.map_or(interval, |old| (1.0 - alpha) * old + alpha * interval));
            }
        }
        self.last_plan = Some(now);
        self.results = 0;
    }

    /// A plan of another mode: the next time-shared plan starts counting afresh.
    pub(super) fn off(&mut self) {
        self.last_plan = None;
    }

    pub(super) fn on_results(&mut self, alpha: f64) {
        self.results += 1;
        self.alpha = alpha;
    }

    /// The step a request's share of the device is priced on: the measured interval with its
    /// margin, or `fallback` before one was measured.
    fn step_s(&self, fallback: f64) -> f64 {
        self.interval_s.map_or(fallback, |interval| CADENCE_MARGIN * interval)
    }

    /// The measured interval between time-shared steps, if any.
    pub(super) fn interval_s(&self) -> Option<f64> {
        self.interval_s
    }
}

/// Past its first-token deadline (or about to be), or its objectives already lost.
fn lost(r: &RequestState, now: f64) -> bool {
    r.objectives_lost || (r.last_token_at.is_none() && now > r.arrival + r.slo.ttft_s - PROMPT_LEAD_S)
}

/// What a request's rank is judged on besides the request itself.
#[derive(Clone, Copy)]
struct Pace {
    /// A step of the decodes on the device, without the prompts waiting: how far ahead of its
    /// deadline a request waiting off the device may take the place of one on it.
    decode_s: f64,
    /// When a token computed from now would come: the measured interval between time-shared
    /// steps (`Cadence`; copies lengthen them), at least the decodes' step.
    step_s: f64,
    /// The share of a request's gaps its TBT objective lets be late.
    late_share: f64,
}

/// Whether a punctual decode off the device sits out a late gap: brought back now, its token
/// would come past its TBT objective anyway, and the objective allows one more late gap. A late
/// gap costs it the same however long it lasts within the stall bound, so it waits as a lost
/// request does (`LOST_PACE_SHARE` of the bound) and leaves the device to the requests still on
/// time, instead of coming back at once and pushing one of them out, late by a step in its turn
/// (with a step longer than half the TBT objective, every request sitting out one step in turn
/// made its gaps late one in two, past any percentile).
fn sits_out(r: &RequestState, judged_at: f64, last: Option<f64>, pace: Pace) -> bool {
    last.is_some_and(|t| {
        !lost(r, judged_at) && judged_at + pace.step_s > t + r.slo.tbt_s && r.late_gaps_left(pace.late_share) > 0
    })
}

/// When its next token is due, had its last token come at `last` (judged at `now`);
/// `sitting_out`: a late gap it sits out (`sits_out`).
fn deadline(r: &RequestState, now: f64, last: Option<f64>, sitting_out: bool) -> f64 {
    match (lost(r, now) || sitting_out, last) {
        (true, None) => f64::INFINITY,
        (true, Some(t)) => t + LOST_PACE_SHARE * r.slo.max_stall_s,
        (false, last) => r.deadline_after(last),
    }
}

/// The order of the planner (and of the next step's prediction): class, then whether it waits
/// off the device, lost or sitting out a late gap, and is not yet due (those come last), then
/// deadline.
fn rank(r: &RequestState, judged_at: f64, last: Option<f64>, pace: Pace, on_device: bool) -> Rank {
    let sitting_out = !on_device && sits_out(r, judged_at, last, pace);
    let at = deadline(r, judged_at, last, sitting_out);
    let idle = !on_device
        && (sitting_out || lost(r, judged_at))
        && at > judged_at + LOST_RETURN_STEPS * pace.decode_s;
    Rank { priority: r.priority, idle, deadline: at, seq: r.seq, sits_out: idle && sitting_out }
}

#[derive(Clone, Copy)]
struct Rank {
    priority: i32,
    idle: bool,
    deadline: f64,
    seq: u64,
    /// Sitting out a late gap and not yet due: it does not come back before, even to blocks
    /// free now (the next step would push a request still on time out for them).
    sits_out: bool,
}

impl Rank {
    fn cmp(&self, other: &Rank) -> std::cmp::Ordering {
        (self.priority, self.idle)
            .cmp(&(other.priority, other.idle))
            .then(self.deadline.total_cmp(&other.deadline))
            .then(self.seq.cmp(&other.seq))
    }
}

/// The share of steps it must compute in to keep its pace.
fn duty(r: &RequestState, now: f64, step_s: f64) -> f64 {
    let every = if lost(r, now) { LOST_PACE_SHARE * r.slo.max_stall_s } else { TBT_SHARE * r.slo.tbt_s };
    (step_s / every.max(1e-6)).min(1.0)
}

/// Device blocks it holds to compute its next position (`extra` = 1) within its limit.
fn blocks(step: &StepBuilder, r: &RequestState) -> u64 {
    step.blocks().blocks_for((u64::from(r.num_positions()) + 1).min(r.max_kv_tokens()))
}

/// Plans one step under overload: admissions by memory demand, then every request that may
/// compute, earliest deadline first (priority classes strict), then the departures the next
/// step needs. `step_s`, the step estimate, prices demand until the cadence is measured.
pub(super) fn plan(step: &mut StepBuilder, ctx: &mut StepCtx, step_s: f64, cadence: &mut Cadence) {
    let now = ctx.now;
    cadence.on_plan(now);
    let step_s = cadence.step_s(step_s);
    let pool = f64::from(step.blocks().num_device_blocks());
    let admitted = |r: &RequestState| r.phase != Phase::Waiting && !r.doomed && r.has_work();
    // Per class, (requests, demand) of the admitted: a prompt is admitted while the demand of its
    // class and the higher ones fits, since the lower classes' requests yield it their blocks.
    let mut demand: BTreeMap<i32, (usize, f64)> = BTreeMap::new();
    for r in step.requests().values().filter(|r| admitted(r)) {
        let entry = demand.entry(r.priority).or_default();
        *entry = (entry.0 + 1, entry.1 + blocks(step, r) as f64 * duty(r, now, step_s));
    }
    let waiting: Vec<u64> =
        step.waiting_by_priority().into_iter().filter(|id| !ctx.plan.preempted_for_recompute.contains(id)).collect();
    // A lost prompt waits while a punctual one of its class or a higher one does.
    let first_punctual_class =
        waiting.iter().map(|id| &step.requests()[id]).filter(|w| !lost(w, now)).map(|w| w.priority).min();
    let mut admits = Vec::new();
    for &id in &waiting {
        let r = &step.requests()[&id];
        if lost(r, now) && first_punctual_class.is_some_and(|class| class <= r.priority) {
            continue;
        }
        let own = blocks(step, r) as f64 * duty(r, now, step_s);
        let (ahead, ahead_demand) =
            demand.range(..=r.priority).fold((0, 0.0), |(n, d), (_, (count, sum))| (n + count, d + sum));
        if ahead > 0 && ahead_demand + own > pool {
            continue;
        }
        let entry = demand.entry(r.priority).or_default();
        *entry = (entry.0 + 1, entry.1 + own);
        admits.push(id);
    }
    // A return's horizon: the decodes' step (prompts waiting lengthen the step estimate, and
    // a long horizon calls every lost request due at once).
    let decode_s = step.cost().predict_step(urgency::decodes_alone(step));
    let pace = Pace {
        decode_s,
        step_s: cadence.interval_s().map_or(decode_s, |interval| interval.max(decode_s)),
        late_share: step.config().tbt_late_share(),
    };
    let mut candidates: Vec<(Rank, u64)> = step
        .requests()
        .values()
        .filter(|r| !r.doomed && r.has_work() && matches!(r.phase, Phase::Running | Phase::Rotated))
        .map(|r| r.id)
        .chain(admits)
        .map(|id| {
            let r = &step.requests()[&id];
            (rank(r, now, r.last_token_at, pace, r.phase == Phase::Running), id)
        })
        .collect();
    candidates.sort_by(|a, b| a.0.cmp(&b.0));
    let mut leaving = Vec::new();
    for &(rank, id) in &candidates {
        let fit = match step.requests()[&id].phase {
            Phase::Running => step.schedule_running(ctx, id, 0),
            // Sits out only while others compute: on an idle device it pushes no one out.
            Phase::Rotated if rank.sits_out && !ctx.plan.scheduled.is_empty() => continue,
            Phase::Rotated => {
                let need = reactive::return_blocks(step, id, 1);
                let free = u64::from(step.blocks().free_device());
                if need <= free && step.rotate_in_and_compute(ctx, id) {
                    Fit::Scheduled
                } else {
                    Fit::NoBlocks(need.saturating_sub(free).max(1))
                }
            }
            Phase::Waiting => step.admit(ctx, id, 0),
            _ => continue,
        };
        if let Fit::NoBlocks(short) = fit {
            make_room(step, ctx, short, rank, &mut leaving);
        }
    }
    for id in leaving {
        // Blocks held either way until the copy's acknowledgement: computing first costs nothing.
        if step.rotate_out_after_compute(ctx, id) == 0 && step.evictable(ctx, id) {
            step.rotate_out(ctx, id);
        }
    }
    depart(step, ctx, now, pace);
}

/// Picks requests idle on the device (not computing this step yet) of the same or a lower class
/// and due after the `requester` (later, or as late and newer: requests computed in the same step
/// share a deadline), latest first, to leave until `short` blocks are on their way:
/// they leave at the end of planning (`leaving`), after computing in this step if they do, since
/// their blocks are free only at the step's acknowledgement either way. Recomputed instead (at
/// once) when the host has no room. The departures (`depart`) normally send such requests off
/// after their last compute in the step before; this is for the returns and admissions they
/// did not foresee.
fn make_room(step: &mut StepBuilder, ctx: &mut StepCtx, short: u64, requester: Rank, leaving: &mut Vec<u64>) {
    let now = ctx.now;
    let short = short.saturating_sub(ctx.release_credit);
    if short == 0 {
        return;
    }
    let nothing_computes = ctx.plan.scheduled.is_empty();
    let mut idle: Vec<(f64, u64, u64)> = step
        .running_by_rank()
        .into_iter()
        .filter(|&id| step.evictable(ctx, id) && !leaving.contains(&id))
        .filter_map(|id| {
            let r = &step.requests()[&id];
            let at = deadline(r, now, r.last_token_at, false);
            let later = at > requester.deadline || (at == requester.deadline && r.seq > requester.seq && nothing_computes);
            (r.last_token_at.is_some() && r.priority >= requester.priority && later).then_some((at, r.seq, id))
        })
        .collect();
    idle.sort_by(|a, b| b.0.total_cmp(&a.0).then(b.1.cmp(&a.1)));
    let mut freed = 0;
    for (_, _, id) in idle {
        if freed >= short {
            break;
        }
        let moved = u64::from(step.blocks().private_device_blocks(id));
        if step.blocks().can_transfer_out(id) {
            freed += moved;
            ctx.release_credit += moved;
            leaving.push(id);
        } else {
            freed += step.preempt_for_recompute(ctx, id);
        }
    }
}

/// The next step, predicted: each request's deadline once this step's tokens are in, and the
/// device filled by class and earliest deadline. When the requests it brings in do not fit
/// beside those on the device, the ones it leaves out go, latest deadline first — after
/// computing in this step, or, idle, at once.
fn depart(step: &mut StepBuilder, ctx: &mut StepCtx, now: f64, pace: Pace) {
    let next = now + step.cost().predict_step(ctx.shape);
    let pool = u64::from(step.blocks().num_device_blocks());
    // (rank, id, on device)
    let mut all: Vec<(Rank, u64, bool)> = step
        .requests()
        .values()
        .filter(|r| !r.doomed && !r.exhausted() && matches!(r.phase, Phase::Running | Phase::RotatingIn | Phase::Rotated))
        .map(|r| {
            let last = if ctx.scheduled.contains(&r.id) && r.placeholders > 0 { Some(next) } else { r.last_token_at };
            let on_device = r.phase != Phase::Rotated;
            (rank(r, next, last, pace, on_device), r.id, on_device)
        })
        .collect();
    all.sort_by(|a, b| a.0.cmp(&b.0));
    let (mut used, mut coming, mut held) = (0u64, 0u64, 0u64);
    let mut left_out = Vec::new();
    for &(rank, id, on_device) in &all {
        let need = blocks(step, &step.requests()[&id]);
        held += if on_device { need } else { 0 };
        if used + need <= pool {
            used += need;
            coming += if on_device { 0 } else { need };
        } else if on_device {
            left_out.push((rank.deadline, id));
        }
    }
    let mut short = coming.saturating_sub(pool.saturating_sub(held));
    left_out.sort_by(|a, b| b.0.total_cmp(&a.0));
    for (_, id) in left_out {
        if short == 0 {
            break;
        }
        let r = &step.requests()[&id];
        if r.last_token_at.is_none() || r.tokens_left() < 2 {
            continue;
        }
        let moved = if ctx.scheduled.contains(&id) {
            step.rotate_out_after_compute(ctx, id)
        } else if step.evictable(ctx, id) {
            step.rotate_out(ctx, id)
        } else {
            0
        };
        short = short.saturating_sub(moved);
    }
}

#[cfg(test)]
mod tests {
    use super::{rank, Cadence, Pace, LOST_PACE_SHARE, LOST_RETURN_STEPS};
    use crate::config::Slo;
    use crate::request::{RequestSpec, RequestState};

    /// A punctual decode with `generated` tokens of 101 and `late` late gaps so far, its last
    /// token at 10 s; objectives 1 s / 0.1 s (stall bound 0.5 s).
    fn decode(generated: u32, late: u32) -> RequestState {
        let spec = RequestSpec {
            id: 1,
            prompt_token_ids: vec![1; 16],
            max_new_tokens: 101,
            slo: None,
            arrival: 9.0,
            priority: 0,
            kv_namespace: 0,
            scores_prompt: false,
        };
        let mut r = RequestState::new(spec, 1, Slo::new(1.0, 0.1));
        r.tokens.extend(std::iter::repeat(2).take(generated as usize));
        r.num_computed = r.tokens.len() as u32 - 1;
        r.last_token_at = Some(10.0);
        r.late_gaps = late;
        r
    }

    /// Off the device, a decode whose token would be late even brought back at once (a
    /// time-shared step of 0.08 s from 10.05 s is past its 10.1 s deadline) sits out that late
    /// gap at the lost pace, after the requests on the device, while its objective allows one
    /// more late gap (10 of its 100 gaps at the 90th percentile); one still able to be on time,
    /// one whose late gaps are spent, and one on the device keep their TBT deadline.
    #[test]
    fn a_decode_late_anyway_sits_out_its_late_gap_while_its_objective_allows() {
        let pace = Pace { decode_s: 0.02, step_s: 0.08, late_share: 0.1 };
        let late_anyway = rank(&decode(30, 9), 10.05, Some(10.0), pace, false);
        let stall = Slo::new(1.0, 0.1).max_stall_s;
        assert!(late_anyway.sits_out && late_anyway.idle);
        assert!((late_anyway.deadline - (10.0 + LOST_PACE_SHARE * stall)).abs() < 1e-9);
        // Due within its return horizon: back in the order of deadlines.
        let due = rank(&decode(30, 9), 10.0 + LOST_PACE_SHARE * stall - 0.5 * LOST_RETURN_STEPS * 0.02, Some(10.0), pace, false);
        assert!(!due.sits_out && !due.idle);
        for (r, at, on_device) in [(decode(30, 0), 10.01, false), (decode(30, 10), 10.05, false), (decode(30, 0), 10.05, true)] {
            let kept = rank(&r, at, Some(10.0), pace, on_device);
            assert!(!kept.sits_out && !kept.idle && (kept.deadline - 10.1).abs() < 1e-9, "late {}, at {at}", r.late_gaps);
        }
    }

    /// The interval counts only between time-shared plans with a step's results between them:
    /// a pipelined plan (no results yet), the first plan after another mode's, and the first
    /// after a recovery start counting afresh, and what was learnt stays.
    #[test]
    fn cadence_counts_only_intervals_between_time_shared_steps() {
        let mut c = Cadence::default();
        c.on_plan(0.0);
        c.on_plan(0.001); // pipelined: no results in between
        assert_eq!(c.interval_s(), None);
        c.on_results(0.5);
        c.on_plan(0.1);
        assert!((c.interval_s().unwrap() - 0.099).abs() < 1e-9);
        c.on_results(0.5);
        c.on_plan(0.2);
        assert!((c.interval_s().unwrap() - 0.0995).abs() < 1e-9);
        // Another mode's plan (or a recovery) between: the long interval across it is no step's.
        c.off();
        c.on_results(0.5);
        c.on_plan(9.0);
        assert!((c.interval_s().unwrap() - 0.0995).abs() < 1e-9);
        c.on_results(0.5);
        c.on_plan(9.1);
        assert!((c.interval_s().unwrap() - (0.5 * 0.0995 + 0.5 * 0.1)).abs() < 1e-9);
        // Priced with the margin once measured, on the fallback before.
        assert!((c.step_s(1.0) - super::CADENCE_MARGIN * c.interval_s().unwrap()).abs() < 1e-12);
        assert_eq!(Cadence::default().step_s(0.3), 0.3);
    }
}
