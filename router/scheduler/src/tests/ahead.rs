//! One step in flight: the engine plans step N+1 before step N's results come back. A request
//! that step N samples for may then be scheduled on a placeholder — the position of the token
//! only the shard knows yet — and the outputs must be the ones the synchronous loop produces.

use std::collections::{BTreeMap, VecDeque};

use super::driver::{config, spec};
use crate::config::PolicyKind;
use crate::plan::{StepPlan, StepResults};
use crate::scheduler::Scheduler;

/// The fake model: a request's token at a position depends on nothing else, as greedy decoding
/// of a fixed prompt does.
fn token_at(id: u64, position: usize) -> u32 {
    ((id as usize * 7919 + position * 104_729) % 997) as u32
}

/// Ends a request like an EOS would.
fn is_eos(token: u32) -> bool {
    token % 11 == 0
}

/// The fake shard: every request's tokens as it knows them (prompt and everything it sampled),
/// and the step that sampled each request's last token.
#[derive(Default)]
struct FakeShard {
    tokens: BTreeMap<u64, Vec<u32>>,
    sampled_in: BTreeMap<u64, u64>,
    last_step: u64,
}

impl FakeShard {
    /// Runs `plan` (sent while `previous` was outstanding), checking what the shard checks:
    /// an entry's input comes from the shard exactly when its last input token is the one the
    /// step before it sampled.
    fn run(&mut self, plan: &StepPlan, previous: Option<u64>) -> Vec<(u64, u32)> {
        if let Some(previous) = previous {
            assert_eq!(previous, self.last_step, "a step runs right after the one outstanding when it was planned");
        }
        let mut sampled = Vec::new();
        for entry in &plan.scheduled {
            let tokens = &self.tokens[&entry.id];
            let end = entry.end_position() as usize;
            assert!(end <= tokens.len(), "request {} computes past what the shard knows", entry.id);
            let last_from_previous = previous.is_some()
                && self.sampled_in.get(&entry.id) == previous.as_ref()
                && end == tokens.len();
            let from_shard = plan.input_from_shard.binary_search(&entry.id).is_ok();
            assert_eq!(from_shard, last_from_previous, "request {}: input_from_shard", entry.id);
            assert_eq!(plan.sampling.binary_search(&entry.id).is_ok(), end == tokens.len());
        }
        for &id in &plan.sampling {
            let tokens = self.tokens.get_mut(&id).unwrap();
            let token = token_at(id, tokens.len());
            tokens.push(token);
            self.sampled_in.insert(id, plan.step_id);
            sampled.push((id, token));
        }
        self.last_step = plan.step_id;
        sampled
    }
}

/// Serves `requests` (id, prompt, max_new_tokens) with `depth` steps outstanding at most;
/// returns what each request streamed and how many tokens the shard sampled beyond that.
fn serve(policy: PolicyKind, device_blocks: u32, requests: &[(u64, u32, u32)], depth: usize, grammar: &[u64])
    -> (BTreeMap<u64, Vec<u32>>, BTreeMap<u64, usize>) {
    let mut s = Scheduler::new(config(policy, device_blocks)).unwrap();
    let mut shard = FakeShard::default();
    let mut streamed: BTreeMap<u64, Vec<u32>> = BTreeMap::new();
    let mut active: BTreeMap<u64, u32> = BTreeMap::new();
    for &(id, prompt, max_new) in requests {
        let request = spec(id, prompt, max_new, 0.0);
        shard.tokens.insert(id, request.prompt_token_ids.clone());
        s.add(request, 0.0).unwrap();
        if grammar.contains(&id) {
            s.wait_for_results(id);
        }
        active.insert(id, max_new);
        streamed.insert(id, Vec::new());
    }
    // Each plan with the step still outstanding when it was planned (the engine's
    // `previous_step_id`).
    let mut in_flight: VecDeque<(StepPlan, Option<u64>)> = VecDeque::new();
    let mut now = 0.0;
    for _ in 0..5000 {
        while in_flight.len() < depth {
            let plan = s.plan(now);
            s.check_invariants().unwrap();
            if std::env::var("AHEAD_DEBUG").is_ok() {
                eprintln!("{policy} depth {depth}: {:?} sampling {:?} ahead {:?}", plan.scheduled.iter().map(|e| (e.id, e.num_computed_tokens, e.num_new_tokens)).collect::<Vec<_>>(), plan.sampling, plan.input_from_shard);
            }
            if plan.is_empty() {
                break;
            }
            let previous = in_flight.back().map(|(p, _)| p.step_id);
            in_flight.push_back((plan, previous));
        }
        let Some((plan, previous)) = in_flight.pop_front() else {
            if !s.has_work() {
                break;
            }
            continue;
        };
        let sampled = shard.run(&plan, previous);
        now += 0.01;
        let acks = plan.rotate_out.iter().chain(&plan.rotate_in).map(|t| t.id).collect();
        let results = StepResults { step_id: plan.step_id, sampled: sampled.clone(), completed_transfers: acks, step_time_s: Some(0.01) };
        s.complete(&results, now);
        s.check_invariants().unwrap();
        for (id, token) in sampled {
            let Some(&max_new) = active.get(&id) else { continue }; // a token past a stop: dropped
            let out = streamed.get_mut(&id).unwrap();
            out.push(token);
            if is_eos(token) || out.len() as u32 >= max_new {
                active.remove(&id);
                s.finish(id);
                s.check_invariants().unwrap();
            }
        }
    }
    assert!(active.is_empty() && in_flight.is_empty() && !s.has_work(), "everything finished: {active:?}");
    let stats = s.stats();
    assert_eq!(stats.device_blocks_used, 0, "every block back");
    let prompt_len: BTreeMap<u64, usize> = requests.iter().map(|&(id, prompt, _)| (id, prompt as usize)).collect();
    let extra = shard.tokens.iter().map(|(id, tokens)| (*id, tokens.len() - prompt_len[id] - streamed[id].len())).collect();
    (streamed, extra)
}

fn workload() -> Vec<(u64, u32, u32)> {
    (0..12u64).map(|id| (id, 3 + (id as u32 * 5) % 17, 2 + (id as u32 * 7) % 19)).collect()
}

#[test]
fn greedy_outputs_are_the_same_with_one_step_in_flight() {
    for policy in PolicyKind::ALL {
        let (sync, sync_extra) = serve(policy, 64, &workload(), 1, &[]);
        let (ahead, extra) = serve(policy, 64, &workload(), 2, &[]);
        assert_eq!(sync, ahead, "{policy}");
        assert!(sync_extra.values().all(|&n| n == 0), "{policy}: {sync_extra:?}");
        // At most one token past a stop, never streamed; requests that end at their length
        // limit get none (the limit counts placeholders).
        assert!(extra.values().all(|&n| n <= 1), "{policy}: {extra:?}");
        assert!(extra.values().any(|&n| n == 1), "{policy}: some request stopped at an EOS one step late: {ahead:?} {extra:?}");
        for (id, tokens) in &ahead {
            let limit = workload()[*id as usize].2 as usize;
            if tokens.len() == limit && !tokens.last().copied().is_some_and(is_eos) {
                assert_eq!(extra[id], 0, "{policy}: request {id} ended at its limit");
            }
        }
    }
}

#[test]
fn greedy_outputs_are_the_same_under_memory_pressure() {
    // A small pool: preemption, recompute and rotation happen between steps with results pending.
    for policy in PolicyKind::ALL {
        let (sync, _) = serve(policy, 14, &workload(), 1, &[]);
        let (ahead, extra) = serve(policy, 14, &workload(), 2, &[]);
        assert_eq!(sync, ahead, "{policy}");
        assert!(extra.values().all(|&n| n <= 1), "{policy}: {extra:?}");
    }
}

#[test]
fn a_request_that_waits_for_its_results_is_never_scheduled_ahead() {
    let (sync, _) = serve(PolicyKind::RotaSched, 64, &workload(), 1, &[3, 5]);
    let (ahead, extra) = serve(PolicyKind::RotaSched, 64, &workload(), 2, &[3, 5]);
    assert_eq!(sync, ahead);
    assert_eq!((extra[&3], extra[&5]), (0, 0));
}

#[test]
fn a_placeholder_is_scheduled_with_the_step_after_the_one_that_samples_it() {
    let mut s = Scheduler::new(config(PolicyKind::Recompute, 16)).unwrap();
    s.add(spec(1, 5, 3, 0.0), 0.0).unwrap();
    let first = s.plan(0.0);
    assert_eq!((first.sampling.clone(), first.input_from_shard.clone()), (vec![1], vec![]));
    // Step 1 is still computing: step 2 computes position 5, the token step 1 samples.
    let second = s.plan(0.0);
    assert_eq!(second.scheduled[0].num_computed_tokens, 5);
    assert_eq!(second.scheduled[0].num_new_tokens, 1);
    assert_eq!((second.sampling.clone(), second.input_from_shard.clone()), (vec![1], vec![1]));
    s.check_invariants().unwrap();
    // Two placeholders, two pending steps: the third token would be past max_new_tokens = 3
    // only after it; a third step is not planned before the first result.
    s.complete(&StepResults { step_id: first.step_id, sampled: vec![(1, 40)], ..StepResults::default() }, 0.01);
    assert_eq!(s.tokens(1).unwrap().len(), 6);
    let third = s.plan(0.01);
    assert_eq!(third.input_from_shard, vec![1]);
    assert_eq!(third.scheduled[0].num_computed_tokens, 6);
    // max_new_tokens = 3 counts the placeholders: nothing more until a result is back.
    assert!(s.plan(0.01).scheduled.is_empty());
    s.complete(&StepResults { step_id: second.step_id, sampled: vec![(1, 41)], ..StepResults::default() }, 0.02);
    s.complete(&StepResults { step_id: third.step_id, sampled: vec![(1, 42)], ..StepResults::default() }, 0.03);
    assert_eq!(s.tokens(1).unwrap()[5..], [40, 41, 42]);
    s.check_invariants().unwrap();
}

#[test]
fn a_placeholder_is_never_published_to_the_prefix_cache() {
    // Block size 4, prompt of 7: step 1 samples position 7's token; step 2 computes position 7
    // (completing block 1) before that token is known, so block 1 is not published by it.
    let mut s = Scheduler::new(config(PolicyKind::Recompute, 16)).unwrap();
    let request = spec(1, 7, 8, 0.0);
    let mut with_token = request.prompt_token_ids.clone();
    with_token.extend([40, 41]);
    s.add(request, 0.0).unwrap();
    let first = s.plan(0.0);
    let _second = s.plan(0.0);
    assert_eq!(s.core.blocks.probe_prefix(0, &with_token).hit_blocks, 1, "only the prompt's full block");
    s.complete(&StepResults { step_id: first.step_id, sampled: vec![(1, 40)], ..StepResults::default() }, 0.01);
    // Known now: the next plan publishes it with its entry.
    let _third = s.plan(0.01);
    assert_eq!(s.core.blocks.probe_prefix(0, &with_token).hit_blocks, 2);
    s.check_invariants().unwrap();
}
