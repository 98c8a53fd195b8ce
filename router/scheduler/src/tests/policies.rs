//! Scripted scenarios for fcfs, recompute and swap, plus the budgets, prefix caching and
//! request validation that every policy shares.

use super::driver::{config, spec, Driver};
use crate::config::PolicyKind;
use crate::error::SchedulerError;
use crate::plan::StepResults;
use crate::request::RequestSpec;
use crate::scheduler::Scheduler;

#[test]
fn fcfs_never_preempts_and_blocks_head_of_line() {
    // 12 blocks of 4 tokens. Request 1 reserves 8 (20 + 12 - 1 tokens), 2 needs 8 too and
    // must wait; 3 would fit but may not pass 2.
    let mut d = Driver::new(config(PolicyKind::Fcfs, 12));
    d.add(spec(1, 20, 12, 0.0));
    d.add(spec(2, 20, 12, 0.0));
    d.add(spec(3, 4, 2, 0.0));
    let first = d.step();
    assert_eq!(first.first_scheduled, vec![1]);
    assert_eq!(first.scheduled[0].block_table.len(), 8, "worst case reserved up front");
    while d.scheduler.has_work() {
        let plan = d.step();
        assert!(plan.preempted_for_recompute.is_empty() && plan.rotate_out.is_empty());
        if !d.finished.contains(&1) {
            assert!(plan.first_scheduled.is_empty(), "nothing passes the blocked head");
        }
        assert!(d.plans.len() < 200);
    }
    assert_eq!(d.finished.len(), 3);
    d.assert_all_free();
}

#[test]
fn recompute_preempts_the_newest_running_request() {
    // 9 blocks: three 8-token prompts take 2 blocks each, then decodes grow until one must go.
    let mut d = Driver::new(config(PolicyKind::Recompute, 9));
    for id in 1..=3 {
        d.add(spec(id, 8, 12, 0.0));
    }
    let mut preempted = Vec::new();
    while d.scheduler.has_work() && d.plans.len() < 300 {
        let plan = d.step();
        preempted.extend(plan.preempted_for_recompute.iter().copied());
        assert!(plan.rotate_out.is_empty());
    }
    assert_eq!(preempted.first(), Some(&3), "the newest goes first");
    assert!(d.scheduler.stats().recomputes >= 1);
    // The victim restarts from position 0 (or a prefix hit), covering its generated tokens.
    let restart = d.plans.iter().flat_map(|p| &p.scheduled).filter(|e| e.id == 3).find(|e| {
        e.num_new_tokens > 1 && d.plans.iter().any(|p| p.preempted_for_recompute.contains(&3))
    });
    assert!(restart.is_some());
    assert_eq!(d.finished.len(), 3);
    d.assert_all_free();
}

#[test]
fn swap_rotates_the_newest_out_and_brings_it_back_first() {
    let mut d = Driver::new(config(PolicyKind::Swap, 9));
    d.ack_delay = 1;
    for id in 1..=3 {
        d.add(spec(id, 8, 12, 0.0));
    }
    let (mut outs, mut ins) = (Vec::new(), Vec::new());
    let mut first_in_candidates = Vec::new();
    while d.scheduler.has_work() && d.plans.len() < 300 {
        let plan = d.step();
        outs.extend(plan.rotate_out.iter().map(|t| t.request_id));
        if ins.is_empty() && !plan.rotate_in.is_empty() {
            first_in_candidates = outs.clone();
        }
        ins.extend(plan.rotate_in.iter().map(|t| t.request_id));
        if outs.len() == 1 && ins.is_empty() && !d.scheduler.core.requests.contains_key(&4) {
            d.add(spec(4, 4, 4, d.now));
        }
        if plan.first_scheduled.contains(&4) {
            assert_eq!(outs.len(), ins.len(), "rotated requests come back before admissions");
        }
    }
    assert_eq!(outs.first(), Some(&3));
    assert_eq!(ins.first(), first_in_candidates.iter().min(), "the oldest rotated request comes back first");
    assert!(ins.contains(&3));
    assert_eq!(d.scheduler.stats().recomputes, 0);
    assert_eq!(d.finished.len(), 4);
    d.assert_all_free();
}

#[test]
fn chunked_prefill_respects_token_and_request_budgets() {
    for policy in PolicyKind::ALL {
        let mut cfg = config(policy, 64);
        cfg.max_batch_tokens = 10;
        cfg.max_batch_requests = 3;
        let mut d = Driver::new(cfg);
        d.add(spec(1, 25, 3, 0.0));
        for id in 2..=5 {
            d.add(spec(id, 3, 3, 0.0));
        }
        let first = d.step();
        assert_eq!(first.scheduled[0].num_new_tokens, 10, "{policy}: a 10-token chunk");
        d.run_to_completion(100);
        for plan in &d.plans {
            let decodes_then_prefills = plan
                .scheduled
                .windows(2)
                .all(|w| !(w[0].num_new_tokens > 1 && w[1].num_new_tokens == 1 && w[1].num_computed_tokens > 0));
            assert!(decodes_then_prefills, "{policy}: decodes come first");
        }
        assert_eq!(d.finished.len(), 5);
        d.assert_all_free();
    }
}

#[test]
fn prefix_cache_hits_full_blocks_but_leaves_a_token_to_compute() {
    for policy in PolicyKind::ALL {
        let mut d = Driver::new(config(policy, 32));
        let mut shared = spec(1, 12, 2, 0.0);
        d.add(shared.clone());
        d.step();
        shared.id = 2;
        d.add(shared.clone());
        let plan = d.step();
        let entry = plan.scheduled.iter().find(|e| e.id == 2).expect("second scheduled");
        // 12 tokens = 3 full blocks, but the last token must be computed: 2 blocks hit.
        assert_eq!(entry.num_computed_tokens, 8, "{policy}");
        assert_eq!(entry.num_new_tokens, 4);
        let first = d.plans[0].scheduled[0].block_table.clone();
        assert_eq!(entry.block_table[..2], first[..2], "{policy}: shares the cached blocks");
        assert_ne!(entry.block_table[2], first[2]);
        assert_eq!(d.scheduler.stats().prefix_cache_hit_tokens, 8);
        d.run_to_completion(50);
        d.assert_all_free();
        assert!(d.scheduler.stats().device_blocks_cached > 0, "cached blocks stay reusable");
    }
}

#[test]
fn a_request_scoring_its_prompt_takes_no_cached_prefix() {
    // Its prompt's logprobs are asked for: every position is computed, though the cache holds
    // its prefix; a later request without them still takes the prefix.
    for policy in PolicyKind::ALL {
        let mut d = Driver::new(config(policy, 32));
        d.add(spec(1, 12, 2, 0.0));
        d.step();
        d.add(RequestSpec { id: 2, scores_prompt: true, ..spec(1, 12, 2, 0.0) });
        let plan = d.step();
        let entry = plan.scheduled.iter().find(|e| e.id == 2).expect("scoring request scheduled");
        assert_eq!((entry.num_computed_tokens, entry.num_new_tokens), (0, 12), "{policy}");
        assert_eq!(d.scheduler.stats().prefix_cache_hit_tokens, 0, "{policy}");
        d.add(RequestSpec { id: 3, ..spec(1, 12, 2, 0.0) });
        let plan = d.step();
        let entry = plan.scheduled.iter().find(|e| e.id == 3).expect("third scheduled");
        assert_eq!(entry.num_computed_tokens, 8, "{policy}");
        d.run_to_completion(50);
        d.assert_all_free();
    }
}

#[test]
fn choices_of_one_prompt_admitted_together_compute_it_once() {
    // n > 1: the choices arrive together; the first computes the prompt and the others take its
    // full blocks in the same step (the shard writes a step's K/V before any attention reads).
    for policy in PolicyKind::ALL {
        let mut d = Driver::new(config(policy, 32));
        let choice = |id| RequestSpec { id, ..spec(1, 13, 2, 0.0) };
        for id in 1..=4 {
            d.add(choice(id));
        }
        let plan = d.step();
        assert_eq!(plan.scheduled.len(), 4, "{policy}: every choice in the first step");
        let first = plan.scheduled.iter().find(|e| e.id == 1).expect("first choice scheduled");
        assert_eq!((first.num_computed_tokens, first.num_new_tokens), (0, 13), "{policy}");
        for entry in plan.scheduled.iter().filter(|e| e.id != 1) {
            // 13 tokens: 3 full blocks shared, the 13th position computed by each choice.
            assert_eq!((entry.num_computed_tokens, entry.num_new_tokens), (12, 1), "{policy}: choice {}", entry.id);
            assert_eq!(entry.block_table[..3], first.block_table[..3], "{policy}: shares the prompt's blocks");
            assert_ne!(entry.block_table[3], first.block_table[3], "{policy}: its own last block");
        }
        let stats = d.scheduler.stats();
        assert_eq!(stats.prefix_cache_hit_tokens, 3 * 12, "{policy}");
        assert_eq!(stats.device_blocks_used, 3 + 4, "{policy}: the prompt's blocks once, a last block each");
        d.run_to_completion(50);
        assert_eq!(d.finished.len(), 4);
        d.assert_all_free();
    }
}

#[test]
fn rejects_requests_that_can_never_fit_and_bad_input() {
    let mut s = Scheduler::new(config(PolicyKind::RotaSched, 4)).unwrap();
    let err = s.add(spec(1, 14, 4, 0.0), 0.0).unwrap_err();
    assert!(matches!(err, SchedulerError::TooLarge { needed_blocks: 5, device_blocks: 4, .. }));
    assert!(err.to_string().contains("needs 5 KV blocks"));
    s.add(spec(2, 13, 4, 0.0), 0.0).expect("16 positions fit exactly");
    assert_eq!(s.add(spec(2, 1, 1, 0.0), 0.0), Err(SchedulerError::DuplicateId(2)));
    assert!(s.add(spec(3, 0, 1, 0.0), 0.0).is_err());
    assert!(s.add(spec(4, 1, 0, 0.0), 0.0).is_err());
    assert!("bogus".parse::<PolicyKind>().is_err());
    assert_eq!("RotaSched".parse::<PolicyKind>(), Ok(PolicyKind::RotaSched));
    let mut bad = config(PolicyKind::Fcfs, 4);
    bad.block_size = 0;
    assert!(Scheduler::new(bad).is_err());
}

#[test]
fn cancel_during_rotation_out_is_deferred_until_the_ack() {
    let mut d = Driver::new(config(PolicyKind::Swap, 9));
    d.ack_delay = 3;
    for id in 1..=3 {
        d.add(spec(id, 8, 12, 0.0));
    }
    let out = loop {
        let plan = d.step();
        if let Some(t) = plan.rotate_out.first() {
            break t.clone();
        }
        assert!(d.plans.len() < 50, "no rotation out happened");
    };
    d.scheduler.cancel(out.request_id);
    let before = d.scheduler.stats();
    assert_eq!(before.device_blocks_in_flight as usize, out.src_blocks.len());
    assert_eq!(before.cancelled, 1);
    // The copy still runs: its blocks are neither free nor handed to anyone.
    d.step();
    d.scheduler.check_invariants().unwrap();
    d.run_to_completion(300);
    d.assert_all_free();
}

#[test]
fn missing_sample_recomputes_the_last_position() {
    let mut s = Scheduler::new(config(PolicyKind::Recompute, 16)).unwrap();
    s.add(spec(1, 5, 3, 0.0), 0.0).unwrap();
    let plan = s.plan(0.0);
    assert_eq!(plan.sampling, vec![1]);
    s.complete(&StepResults { step_id: plan.step_id, ..StepResults::default() }, 0.01);
    let again = s.plan(0.01);
    assert_eq!(again.scheduled[0].num_computed_tokens, 4);
    assert_eq!(again.scheduled[0].num_new_tokens, 1);
}

#[test]
fn same_inputs_give_same_plans() {
    let run = || {
        let mut d = Driver::new(config(PolicyKind::RotaSched, 10));
        for id in 0..8 {
            d.add(spec(id, 6 + (id as u32 % 3) * 4, 6, 0.0));
        }
        d.run_to_completion(400);
        d.plans
    };
    assert_eq!(run(), run());
}

/// A reset (the shard restarted empty) frees every block and forgets every request, but keeps
/// the learnt cost-model correction, the step timing and the counters.
#[test]
fn a_reset_forgets_requests_and_blocks_and_keeps_what_was_learnt() {
    let link = crate::sim::LinkModel { out_bytes_per_s: 1e6, in_bytes_per_s: 1e6, overhead_s: 0.0, duplex: true };
    let mut d = Driver::on_machine(config(PolicyKind::RotaSched, 32), 1.3, link);
    for id in 0..4 {
        d.add(spec(id, 12, 20, 0.0));
    }
    for _ in 0..10 {
        d.step();
    }
    let before = d.scheduler.stats();
    assert!(before.device_blocks_free < 32 && (before.cost_correction - 1.0).abs() > 0.05);
    d.scheduler.reset();
    let after = d.scheduler.stats();
    assert_eq!((after.device_blocks_free, after.running, after.waiting), (32, 0, 0));
    assert_eq!(after.cost_correction, before.cost_correction);
    assert_eq!(after.step_time_deviation, before.step_time_deviation);
    assert_eq!(after.steps, before.steps);
    d.scheduler.check_invariants().unwrap();
}
