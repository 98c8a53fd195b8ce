//! Scripted RotaSched scenarios with a fake clock.

use super::driver::{burst, config, spec, with_slo, with_stall, Driver, BLOCK_BYTES};
use crate::config::{PolicyKind, SchedulerConfig};


/// Prefill expensive enough that rotating out (1 ms per block each way) beats recomputing.
fn rotation_friendly(device_blocks: u32) -> SchedulerConfig {
    let mut cfg = config(PolicyKind::RotaSched, device_blocks);
    cfg.cost_model.per_prefill_token_s = 0.002;
    cfg
}

/// Steps until a plan rotates something out; returns that plan's victims.
fn first_rotation(d: &mut Driver) -> Vec<u64> {
    for _ in 0..20 {
        let plan = d.step();
        let mut victims: Vec<u64> = plan.rotate_out.iter().map(|t| t.request_id).collect();
        victims.extend(plan.preempted_for_recompute.iter().copied());
        if !victims.is_empty() {
            return victims;
        }
    }
    panic!("nothing was rotated out");
}

#[test]
fn rotates_out_the_request_with_most_slack_and_brings_it_back() {
    let mut d = Driver::new(rotation_friendly(14));
    d.add(with_slo(spec(1, 15, 40, 0.0), 1.0, 0.1));
    d.add(with_slo(spec(2, 15, 40, 0.0), 1.0, 0.5));
    d.step();
    d.step();
    // 8 blocks held, 6 free; request 3 needs 7 for its prompt.
    d.add(with_slo(spec(3, 26, 4, d.now), 1.0, 0.1));
    assert_eq!(first_rotation(&mut d), vec![2], "request 2 has the most slack");
    assert_eq!(d.plans.last().unwrap().rotate_out.len(), 1, "rotating out beats recomputing here");
    let admitted = (0..5).map(|_| d.step()).position(|p| p.first_scheduled.contains(&3));
    assert!(admitted.is_some(), "the arrival is admitted once the transfer out is acknowledged");
    d.run_to_completion(400);
    let returned = d.plans.iter().any(|p| p.rotate_in.iter().any(|t| t.request_id == 2));
    assert!(returned, "the rotated request comes back");
    // ... before its 0.5 s TBT deadline: no gap between its tokens exceeds it (10 ms steps).
    let widest = sampled_at(&d, 2).windows(2).map(|w| w[1] - w[0]).max().unwrap();
    assert!(widest as f64 * d.step_s <= 0.5, "widest gap {widest} steps");
    assert_eq!(d.finished.len(), 3);
    d.assert_all_free();
}

#[test]
fn victims_over_the_byte_budget_are_skipped_not_stopped_at() {
    let mut cfg = config(PolicyKind::RotaSched, 15);
    cfg.max_batch_tokens = 8;
    cfg.cost_model.per_prefill_token_s = 0.02;
    // A step with an 8-token chunk takes ~170 ms: ~6 blocks per direction at 40 kB/s; a block
    // costs 50 ms round trip against 80 ms to recompute its 4 tokens.
    cfg.cost_model.swap_out_bytes_per_s = 4e4;
    cfg.cost_model.swap_in_bytes_per_s = 4e4;
    let mut d = Driver::new(cfg);
    d.add(with_slo(spec(1, 36, 20, 0.0), 1.0, 5.0)); // most slack, 10 blocks: over budget
    d.add(with_slo(spec(2, 11, 20, 0.0), 1.0, 2.0)); // less slack, 4 blocks: fits
    for _ in 0..8 {
        d.step();
    }
    assert!(d.plans.iter().all(|p| p.rotate_out.is_empty()), "decode steps have no budget");
    d.add(with_slo(spec(3, 8, 2, d.now), 5.0, 0.1));
    let victims = first_rotation(&mut d);
    assert_eq!(victims, vec![2]);
    assert_eq!(d.plans.last().unwrap().rotate_out.len(), 1);
    d.run_to_completion(600);
    assert!(d.plans.iter().all(|p| p.rotate_out.iter().all(|t| t.request_id != 1)));
    for plan in &d.plans {
        let out: u64 = plan.rotate_out.iter().map(|t| t.src_blocks.len() as u64 * BLOCK_BYTES).sum();
        assert!(out <= plan.rotate_out_budget_bytes.unwrap(), "step {} moved {out} bytes out", plan.step_id);
        let into: u64 = plan.rotate_in.iter().map(|t| t.src_blocks.len() as u64 * BLOCK_BYTES).sum();
        assert!(into <= plan.rotate_in_budget_bytes.unwrap() || plan.rotate_in.len() == 1);
    }
    assert_eq!(d.finished.len(), 3);
    d.assert_all_free();
}

#[test]
fn a_hopeless_request_does_not_displace_a_punctual_one() {
    let mut d = Driver::new(config(PolicyKind::RotaSched, 8));
    // Both need 5 of 8 blocks; only one fits. The hopeless one arrived first.
    d.add(with_slo(spec(1, 20, 4, 0.0), 0.000_1, 0.1));
    d.add(with_slo(spec(2, 20, 4, 0.0), 1.0, 0.1));
    let plan = d.step();
    assert_eq!(plan.first_scheduled, vec![2]);
    assert!(plan.rotate_out.is_empty() && plan.preempted_for_recompute.is_empty());
    d.run_to_completion(200);
    assert!(d.finished.contains(&1), "the late request is still served");
    // fcfs, for contrast, serves the hopeless one first.
    let mut f = Driver::new(config(PolicyKind::Fcfs, 8));
    f.add(with_slo(spec(1, 20, 4, 0.0), 0.000_1, 0.1));
    f.add(with_slo(spec(2, 20, 4, 0.0), 1.0, 0.1));
    assert_eq!(f.step().first_scheduled, vec![1]);
}

#[test]
fn late_requests_are_served_in_arrival_order_after_punctual_ones() {
    let mut d = Driver::new(config(PolicyKind::RotaSched, 64));
    d.add(with_slo(spec(1, 30, 2, 0.0), 0.000_1, 0.1));
    d.add(with_slo(spec(2, 30, 2, 0.0), 0.000_1, 0.1));
    d.add(with_slo(spec(3, 30, 2, 0.0), 1.0, 0.1));
    let plan = d.step();
    let order: Vec<(u64, u32)> = plan.scheduled.iter().map(|e| (e.id, e.num_new_tokens)).collect();
    // Budget 64: the punctual one, the oldest late one, then what is left for the next.
    assert_eq!(order, vec![(3, 30), (1, 30), (2, 4)]);
}

#[test]
fn nothing_starves_under_sustained_overload() {
    let mut cfg = config(PolicyKind::RotaSched, 24);
    cfg.rotasched.late_starvation_s = 0.5;
    let mut d = Driver::new(cfg);
    for i in 0..150u64 {
        if i % 2 == 0 {
            let ttft = if i % 6 == 0 { 0.000_1 } else { 0.3 };
            d.add(with_slo(spec(i, 6 + (i % 5) as u32 * 3, 3 + (i % 4) as u32, d.now), ttft, 0.1));
        }
        d.step();
    }
    d.run_to_completion(2000);
    assert_eq!(d.finished.len(), 75);
    d.assert_all_free();
}

#[test]
fn keeps_a_reserve_for_steady_arrivals() {
    let mut d = Driver::new(rotation_friendly(36));
    d.add(with_slo(spec(100, 30, 100, 0.0), 1.0, 5.0));
    d.add(with_slo(spec(101, 30, 100, 0.0), 1.0, 5.0));
    d.add(with_slo(spec(102, 30, 100, 0.0), 1.0, 5.0));
    for i in 0..40u64 {
        // One short request per step: the estimated rate is 100/s.
        d.add(with_slo(spec(i, 4, 1, d.now), 1.0, 0.1));
        d.step();
    }
    let stats = d.scheduler.stats();
    assert!(stats.reserve_blocks > 0, "{stats:?}");
    assert!(stats.rotations_out > 0, "long requests with slack were rotated out proactively");
}

/// Long generations with relaxed objectives hold the memory when a burst of short,
/// interactive requests arrives. RotaSched rotates the long ones out and meets the burst's
/// TTFT; the baselines make the burst wait for memory. (Time here is 10 ms per step and
/// rotation is free; `machine.rs` runs the same burst on a clock that follows the steps' and
/// the link's time.)
#[test]
fn rotation_meets_a_burst_ttft_that_baselines_miss() {
    let ttft_met = |policy: PolicyKind| {
        let mut cfg = rotation_friendly(40);
        cfg.policy = policy;
        let mut d = Driver::new(cfg);
        burst(&mut d, 0.1);
        let start = d.plans.len();
        d.run_to_completion(2000);
        let met = (10..20u64).filter(|id| {
            let first = d.plans[start..].iter().position(|p| p.sampling.contains(id)).unwrap();
            (first + 1) as f64 * d.step_s <= 0.1 + 1e-9
        });
        met.count()
    };
    let (rotasched, recompute, fcfs) =
        (ttft_met(PolicyKind::RotaSched), ttft_met(PolicyKind::Recompute), ttft_met(PolicyKind::Fcfs));
    assert!(rotasched >= 8, "rotasched met {rotasched}/10");
    assert!(rotasched > recompute && rotasched > fcfs, "{rotasched} vs {recompute}, {fcfs}");
}

#[test]
fn a_hopeless_arrival_does_not_take_the_block_a_relaxed_decode_needs() {
    let mut d = Driver::new(config(PolicyKind::RotaSched, 8));
    d.add(with_slo(spec(1, 7, 10, 0.0), 1.0, 5.0)); // relaxed: a rotation candidate
    d.add(with_slo(spec(2, 16, 3, 0.0), 1.0, 0.1)); // 5 blocks by step 2: 1 left
    d.step();
    d.step();
    d.add(with_slo(spec(3, 3, 2, 0.0), 0.000_1, 0.1)); // hopeless from the start
    let plan = d.step();
    let relaxed = plan.scheduled.iter().find(|e| e.id == 1).expect("the decode runs");
    assert_eq!((relaxed.num_computed_tokens, relaxed.block_table.len()), (8, 3));
    assert!(!plan.first_scheduled.contains(&3), "the late request waits for free blocks");
    d.run_to_completion(200);
    assert!(d.finished.contains(&3));
    d.assert_all_free();
}

/// Two requests decoding under a 50 ms TBT objective in 1 ms-per-prefill-token steps, and a
/// 60-token prompt arriving with the given TTFT objective. Returns the plans after it arrived.
fn prompt_beside_decodes(ttft_s: f64) -> (Driver, Vec<crate::plan::StepPlan>) {
    let mut cfg = config(PolicyKind::RotaSched, 64);
    cfg.cost_model.per_prefill_token_s = 0.001;
    let mut d = Driver::new(cfg);
    d.add(with_slo(spec(1, 4, 40, 0.0), 1.0, 0.05));
    d.add(with_slo(spec(2, 4, 40, 0.0), 1.0, 0.05));
    for _ in 0..3 {
        d.step();
    }
    d.add(with_slo(spec(3, 60, 4, d.now), ttft_s, 0.05));
    let plans = (0..6).map(|_| d.step()).collect();
    (d, plans)
}

fn chunk_of(plan: &crate::plan::StepPlan, id: u64) -> u32 {
    plan.scheduled.iter().filter(|e| e.id == id).map(|e| e.num_new_tokens).sum()
}

#[test]
fn prefill_chunks_are_cut_so_the_step_ends_before_the_next_token_is_due() {
    let (mut d, plans) = prompt_beside_decodes(5.0);
    // Uncut, the prompt would take 60 of the 62 free tokens: a 70 ms step against 50 ms.
    for plan in &plans {
        assert!(plan.predicted_step_s <= 0.05 + 1e-9, "a {:.3} s step makes decodes late", plan.predicted_step_s);
        assert!(plan.sampling.contains(&1) && plan.sampling.contains(&2), "decodes keep going");
    }
    let chunks: Vec<u32> = plans.iter().map(|p| chunk_of(p, 3)).collect();
    assert!(chunks[0] > 0 && chunks[0] < 60, "the prompt starts at once, in part: {chunks:?}");
    assert_eq!(chunks[0] + chunks[1], 60, "and is done in the next step: {chunks:?}");
    d.run_to_completion(200);
    assert_eq!(d.finished.len(), 3);
    d.assert_all_free();
}

#[test]
fn a_prompt_more_urgent_than_every_decode_is_not_cut() {
    // Its prefill takes 70 ms and its first token is due in 75: it cannot wait out even one
    // 10 ms decode step, while the decodes lose 20 ms of a 50 ms objective.
    let (_, plans) = prompt_beside_decodes(0.075);
    assert_eq!(chunk_of(&plans[0], 3), 60);
}

/// Two requests decoding 40 tokens under a 50 ms TBT objective at p90 (each may spend 3 late
/// gaps; stall bound 250 ms), 1 ms per prefill token, `max_batch_tokens` per step.
fn decodes_with_late_gaps_to_spend(max_batch_tokens: u32) -> Driver {
    let mut cfg = config(PolicyKind::RotaSched, 256);
    cfg.max_batch_tokens = max_batch_tokens;
    cfg.cost_model.per_prefill_token_s = 0.001;
    cfg.tbt_percentile = 90.0;
    let mut d = Driver::new(cfg);
    d.add(with_slo(spec(1, 4, 40, 0.0), 1.0, 0.05));
    d.add(with_slo(spec(2, 4, 40, 0.0), 1.0, 0.05));
    for _ in 0..3 {
        d.step();
    }
    d
}

#[test]
fn a_decode_with_a_late_gap_to_spend_does_not_bound_the_step() {
    let mut d = decodes_with_late_gaps_to_spend(64);
    d.add(with_slo(spec(3, 60, 4, d.now), 5.0, 0.05));
    let plan = d.step();
    assert_eq!(chunk_of(&plan, 3), 60, "the whole prompt goes at once");
    assert!(plan.predicted_step_s > 0.05);
    // Once their late gaps are spent, the decodes bound the step again.
    for id in [1, 2] {
        d.scheduler.core.requests.get_mut(&id).unwrap().late_gaps = 3;
    }
    d.add(with_slo(spec(4, 60, 4, d.now), 5.0, 0.05));
    let plan = d.step();
    assert!(chunk_of(&plan, 4) < 60 && plan.predicted_step_s <= 0.05 + 1e-9);
}

/// A decode with a late gap to spend may take a long step, but not one past its stall bound
/// (here the default, 5 x its 50 ms objective): a 400-token prompt (0.4 s of prefill) is cut so
/// the step ends by then — unless the decodes' objectives are lost already (a first token late,
/// a gap past the bound), when cutting it would cost the prompt time for nothing.
#[test]
fn a_step_beside_decodes_with_late_gaps_to_spend_ends_by_their_stall_bound() {
    let run = |objectives_lost: bool| {
        let mut d = decodes_with_late_gaps_to_spend(512);
        for id in [1, 2] {
            d.scheduler.core.requests.get_mut(&id).unwrap().objectives_lost = objectives_lost;
        }
        d.add(with_slo(spec(3, 400, 4, d.now), 5.0, 0.05));
        let plan = d.step();
        (chunk_of(&plan, 3), plan.predicted_step_s)
    };
    let (chunk, step_s) = run(false);
    assert!(chunk < 400 && step_s <= 0.25 + 1e-9, "chunk {chunk}, step {step_s} s");
    assert!(chunk > 60, "the late gap is still spent: the chunk is not cut to the TBT objective ({chunk})");
    assert_eq!(run(true).0, 400, "decodes past their objectives do not cut the prompt");
}

#[test]
fn late_gaps_are_counted_from_the_deadlines() {
    let mut d = Driver::new(config(PolicyKind::RotaSched, 64));
    d.add(with_slo(spec(1, 4, 10, 0.0), 1.0, 0.015));
    d.step();
    d.step(); // 10 ms steps: on time
    assert_eq!(d.scheduler.core.requests[&1].late_gaps, 0);
    d.step_s = 0.02; // slower than the 15 ms objective
    d.step();
    d.step();
    assert_eq!(d.scheduler.core.requests[&1].late_gaps, 2);
}

/// Steps (plan indices) at which `id` sampled a token.
fn sampled_at(d: &Driver, id: u64) -> Vec<usize> {
    d.plans.iter().enumerate().filter(|(_, p)| p.sampling.contains(&id)).map(|(i, _)| i).collect()
}

/// Two decodes with objectives too tight for a round trip hold the memory when a prompt
/// about to miss its first-token deadline arrives. With late gaps to spare (the objective
/// holds for 90% of gaps), one of them is parked on host so the prompt starts at once; it
/// comes back when blocks free up, having spent no more late gaps than it may.
#[test]
fn a_prompt_about_to_miss_its_first_token_parks_a_decode_with_late_gaps_to_spare() {
    let mut cfg = rotation_friendly(12);
    cfg.tbt_percentile = 90.0;
    let mut d = Driver::new(cfg);
    // 40 tokens: 39 gaps, 3 of which may be late; a stall bound the round trip fits in.
    d.add(with_stall(with_slo(spec(1, 8, 40, 0.0), 1.0, 0.015), 0.5));
    d.add(with_stall(with_slo(spec(2, 8, 40, 0.0), 1.0, 0.015), 0.5));
    for _ in 0..9 {
        d.step();
    }
    assert!(d.plans.iter().all(|p| p.rotate_out.is_empty()), "no slack for a round trip: nothing rotates");
    // 8 blocks held, 4 free; the prompt needs 7 and is due in 30 ms (3 steps).
    let arrival = d.now;
    let start = d.plans.len();
    // Its prefill is predicted at 58 ms: 17 ms of slack, less than two steps.
    d.add(with_slo(spec(3, 24, 4, arrival), 0.075, 0.015));
    let plan = d.step();
    let parked: Vec<u64> = plan.rotate_out.iter().map(|t| t.request_id).collect();
    assert_eq!(parked, vec![2], "the newest of the equally spare decodes is parked");
    for _ in 0..3 {
        d.step();
    }
    let first = *sampled_at(&d, 3).first().expect("the prompt ran");
    assert!(first - start < 3, "first token after {} steps", first - start + 1);
    d.run_to_completion(400);
    assert!(d.plans.iter().any(|p| p.rotate_in.iter().any(|t| t.request_id == 2)), "the parked decode returns");
    for id in [1, 2] {
        let at = sampled_at(&d, id);
        let late = at.windows(2).filter(|w| (w[1] - w[0]) as f64 * d.step_s > 0.015 + 1e-9).count();
        assert!(late <= 3, "request {id}: {late} late gaps");
    }
    assert_eq!(d.finished.len(), 3);
    d.assert_all_free();
}

/// A rotation's return can fail under load, so a request that has already been late (with
/// no late gaps to spend) is not rotated again, however much slack its next token has.
#[test]
fn a_request_already_late_is_not_rotated_out_again() {
    let rotations = |clock_jump: f64| {
        // Both decodes fit to their end (6 blocks each), leaving too few for the arrival.
        let mut d = Driver::new(rotation_friendly(14));
        d.add(with_slo(spec(1, 15, 8, 0.0), 1.0, 0.5));
        d.add(with_slo(spec(2, 15, 8, 0.0), 1.0, 0.5));
        d.step();
        d.step();
        // The shard stalls: both next tokens come after their 0.5 s deadline.
        d.now += clock_jump;
        d.step();
        d.add(with_slo(spec(3, 26, 4, d.now), 1.0, 0.1));
        (0..20).map(|_| d.step().rotate_out.len()).sum::<usize>()
    };
    assert!(rotations(0.0) > 0, "punctual decodes with slack make room");
    assert_eq!(rotations(1.0), 0, "late ones are not put at risk again");
}

/// The largest gap between `id`'s tokens, in seconds.
fn max_gap(d: &Driver, id: u64) -> f64 {
    d.token_times[&id].windows(2).map(|w| w[1] - w[0]).fold(0.0, f64::max)
}

/// Two decodes of 12 tokens (11 gaps, 2 of which may be late at the 80th percentile; 5 blocks
/// each, all held after 9 steps) with the given stall bound (None: the default), then a prompt
/// about to miss its first token. Returns whether a decode was parked for it and the decodes'
/// longest gap.
fn parking_scenario(stall_s: Option<f64>, rotation_late_gap_share: f64) -> (bool, f64) {
    let mut cfg = rotation_friendly(12);
    cfg.tbt_percentile = 80.0;
    cfg.rotasched.rotation_late_gap_share = rotation_late_gap_share;
    let mut d = Driver::new(cfg);
    for id in [1, 2] {
        let slo = with_slo(spec(id, 8, 12, 0.0), 1.0, 0.015);
        d.add(stall_s.map_or(slo.clone(), |stall| with_stall(slo, stall)));
    }
    for _ in 0..9 {
        d.step();
    }
    d.add(with_slo(spec(3, 24, 4, d.now), 0.075, 0.015));
    let parked = !d.step().rotate_out.is_empty();
    d.run_to_completion(400);
    d.assert_all_free();
    (parked, max_gap(&d, 1).max(max_gap(&d, 2)))
}

/// The stall bound decides: with the default bound (5 x 15 ms) a round trip cannot come back in
/// time, so neither decode is parked and no gap breaks it; with a bound of 0.5 s one is parked
/// for the prompt.
#[test]
fn a_decode_is_parked_only_when_it_can_return_within_its_stall_bound() {
    let (parked, gap) = parking_scenario(None, 1.0);
    assert!(!parked && gap <= 0.075 + 1e-9, "parked: {parked}, longest gap {gap} s");
    let (parked, gap) = parking_scenario(Some(0.5), 1.0);
    assert!(parked && gap <= 0.5, "parked: {parked}, longest gap {gap} s");
}

/// Decodes parked for a stream of urgent prompts come back within their stall bound and one
/// step (the mechanism, a parked request turning punctual as its bound nears, is tested in
/// `urgency`).
#[test]
fn a_parked_decode_returns_within_its_stall_bound_while_prompts_keep_arriving() {
    let mut cfg = rotation_friendly(12);
    cfg.tbt_percentile = 90.0;
    let mut d = Driver::new(cfg);
    let stall_s = 0.3;
    d.add(with_stall(with_slo(spec(1, 8, 36, 0.0), 10.0, 0.015), stall_s));
    d.add(with_stall(with_slo(spec(2, 8, 36, 0.0), 10.0, 0.015), stall_s));
    for _ in 0..9 {
        d.step();
    }
    // A stream of urgent prompts, one every three steps, each holding blocks for a while.
    let mut parked = false;
    for i in 0..40u64 {
        if i % 3 == 0 {
            d.add(with_slo(spec(100 + i, 24, 12, d.now), 0.075, 0.05));
        }
        parked |= d.step().rotate_out.iter().any(|t| t.request_id <= 2);
    }
    d.run_to_completion(2000);
    assert!(parked, "a decode was parked for a prompt");
    for id in [1, 2] {
        let gap = max_gap(&d, id);
        assert!(gap <= stall_s + d.step_s + 1e-9, "request {id}: a gap of {gap} s");
    }
    d.assert_all_free();
}

/// Under memory pressure the lower class (higher number) is rotated out first, whatever its
/// slack; under overload the higher class keeps its first-token objective.
#[test]
fn priority_classes_decide_who_rotates_out_and_who_is_served_first() {
    let mut d = Driver::new(rotation_friendly(14));
    // Equal requests but for their class: the one with class 1 has less slack, yet it goes.
    let mut low = with_slo(spec(1, 15, 40, 0.0), 1.0, 0.1);
    low.priority = 1;
    d.add(low);
    d.add(with_slo(spec(2, 15, 40, 0.0), 1.0, 0.2));
    d.step();
    d.step();
    d.add(with_slo(spec(3, 26, 4, d.now), 0.05, 0.1));
    assert_eq!(first_rotation(&mut d), vec![1]);
    d.run_to_completion(500);
    d.assert_all_free();

    // Overload: 24 prompts at once, a third of them in class 0, the rest in class 1, in a pool
    // that holds four at a time.
    let first_tokens = |policy: PolicyKind| {
        let mut d = Driver::new(config(policy, 24));
        for id in 0..24u64 {
            let mut request = with_slo(spec(id, 16, 8, 0.0), 0.15, 0.1);
            request.priority = if id % 3 == 2 { 0 } else { 1 };
            d.add(request);
        }
        d.run_to_completion(2000);
        let met = |class: i32| {
            (0..24u64)
                .filter(|id| (if id % 3 == 2 { 0 } else { 1 }) == class)
                .filter(|id| d.token_times[id][0] <= 0.15)
                .count()
        };
        (met(0), met(1))
    };
    for policy in PolicyKind::ALL {
        let (high, low) = first_tokens(policy);
        assert_eq!(high, 8, "{policy}: every class-0 request meets its first token ({low} of class 1)");
    }
}

/// Parking spends late gaps out of a budget: `rotation_late_gap_share` of every gap produced so
/// far. The parking scenario with a budget of 1% and 16 gaps produced parks nothing; with 2 gaps
/// per parking allowed (share 0.5) it parks one.
#[test]
fn parking_is_limited_to_a_share_of_the_gaps_produced() {
    assert!(!parking_scenario(Some(0.5), 0.01).0);
    assert!(parking_scenario(Some(0.5), 0.5).0);
}

/// A higher class never waits on a lower one's memory: with the pool full of class-1 decodes
/// that have no slack for a round trip (so none is a rotation victim, and they cannot all grow:
/// the overload mode), a class-0 prompt is still served within its first-token objective —
/// class-1 decodes are rotated out or recomputed for it. A class-1 newcomer in its place waits.
/// The same whether the overload is time-shared or served as swap serves it.
#[test]
fn a_higher_class_prompt_takes_the_memory_of_lower_class_decodes_under_overload() {
    for time_share in [false, true] {
        higher_class_prompt_under_overload(time_share);
    }
}

fn higher_class_prompt_under_overload(time_share: bool) {
    let first_token_after = |class: i32| {
        let mut cfg = rotation_friendly(16);
        cfg.rotasched.time_share = time_share;
        let mut d = Driver::new(cfg);
        for id in 0..4u64 {
            let mut low = with_slo(spec(id, 8, 40, 0.0), 1.0, 0.015);
            low.priority = 1;
            d.add(low);
        }
        for _ in 0..24 {
            d.step();
        }
        let arrival = d.now;
        let mut newcomer = with_slo(spec(9, 8, 4, arrival), 0.05, 0.1);
        newcomer.priority = class;
        d.add(newcomer);
        d.run_to_completion(2000);
        assert_eq!(d.finished.len(), 5);
        d.assert_all_free();
        d.token_times[&9][0] - arrival
    };
    let high = first_token_after(0);
    assert!(high <= 0.05 + 1e-9, "time_share {time_share}: the class-0 prompt's first token came {high} s after it arrived");
    let same = first_token_after(1);
    assert!(same > 0.05, "time_share {time_share}: a class-1 newcomer waits for the class-1 decodes ({same} s)");
}

/// The step-time cap cuts a prompt's chunk to keep the decodes of its class and the higher ones
/// on time, never for a lower class: beside a class-1 decode with no late gap to spend, a
/// class-1 prompt is computed in chunks, a class-0 prompt in one step.
#[test]
fn a_lower_class_decode_does_not_cut_a_higher_class_prompt_into_chunks() {
    let chunks = |class: i32| {
        let mut cfg = rotation_friendly(64);
        cfg.max_batch_tokens = 128;
        let mut d = Driver::new(cfg);
        let mut low = with_slo(spec(1, 8, 60, 0.0), 1.0, 0.05);
        low.priority = 1;
        d.add(low);
        for _ in 0..4 {
            d.step();
        }
        // 60 tokens take 130 ms in one step, past the decode's 50 ms objective; plenty of
        // slack for the prompt's own first token.
        let mut prompt = with_slo(spec(9, 60, 4, d.now), 5.0, 1.0);
        prompt.priority = class;
        d.add(prompt);
        d.run_to_completion(500);
        assert_eq!(d.finished.len(), 2);
        d.plans.iter().filter(|p| p.scheduled.iter().any(|e| e.id == 9 && e.num_computed_tokens < 60)).count()
    };
    assert_eq!(chunks(0), 1, "the class-0 prompt is computed in one step");
    assert!(chunks(1) > 1, "the class-1 prompt is cut to keep the class-1 decode on time");
}

/// A prompt for which no running request can make room — the one decode has a tight TBT
/// objective at the 100th percentile (no late gap to risk, so it is neither a rotation victim
/// nor parkable) and is of the same class — waits while admitting it would take the block that
/// decode grows into. 4-token blocks, 12 on device: the decode holds 4 blocks with its next
/// token due in a fifth; the 32-token prompt fits the 8 free blocks, but its prefill and first
/// token would leave the decode none, and the decode would be pushed out at once.
#[test]
fn a_prompt_nobody_can_make_room_for_waits_rather_than_push_a_decode_out() {
    let mut d = Driver::new(rotation_friendly(12));
    d.add(with_slo(spec(1, 15, 8, 0.0), 1.0, 0.015));
    d.step();
    d.step();
    assert_eq!(d.scheduler.stats().device_blocks_free, 8);
    d.add(with_slo(spec(2, 32, 4, d.now), 1.0, 0.05));
    let plan = d.step();
    assert!(!plan.first_scheduled.contains(&2), "the prompt waits for the decode's growth");
    d.run_to_completion(400);
    for plan in &d.plans {
        assert!(plan.rotate_out.is_empty() && plan.preempted_for_recompute.is_empty(), "step {}", plan.step_id);
    }
    let gap = max_gap(&d, 1);
    assert!(gap <= d.step_s + 1e-9, "the decode stalled {gap} s");
    assert_eq!(d.finished.len(), 2);
    d.assert_all_free();
}

/// Under sustained memory overload (the running requests cannot all grow, nobody has slack for a
/// round trip) RotaSched serves steps as swap does, and a request rotated back in keeps the device
/// until it has computed a token: it returns only while the running requests can still grow
/// through its next step, so it is never pushed out again before computing (a round trip that
/// buys nothing but a longer gap).
#[test]
fn under_overload_a_returned_request_computes_before_it_can_be_pushed_out_again() {
    let mut cfg = rotation_friendly(20);
    cfg.rotasched.rotation_late_gap_share = 0.0;
    let mut d = Driver::new(cfg);
    for i in 0..60u64 {
        if i % 3 == 0 {
            d.add(with_slo(spec(i, 10 + (i % 4) as u32 * 4, 14 + (i % 5) as u32 * 3, d.now), 0.05, 0.02));
        }
        d.step();
    }
    d.run_to_completion(3000);
    assert_eq!(d.finished.len(), 20);
    d.assert_all_free();
    let mut returned: std::collections::BTreeSet<u64> = std::collections::BTreeSet::new();
    let mut round_trips = 0;
    for plan in &d.plans {
        for t in &plan.rotate_out {
            assert!(!returned.contains(&t.request_id), "step {}: request {} pushed out again before computing", plan.step_id, t.request_id);
            round_trips += 1;
        }
        for id in &plan.sampling {
            returned.remove(id);
        }
        returned.extend(plan.rotate_in.iter().map(|t| t.request_id));
    }
    assert!(round_trips > 0, "the scenario overloads memory");
}
