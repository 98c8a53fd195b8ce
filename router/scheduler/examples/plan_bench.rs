//! Cost of one scheduling decision at serving scale: a closed loop of `concurrency`
//! requests over a 16k-block device pool, driven through plan/complete with every transfer
//! acknowledged at once. Prints microseconds per step for each policy, and the ratio to fcfs
//! measured in the same run: after an unmeasured round, `rounds` rounds each run every policy
//! (the order rotated between rounds); each figure is the median over the rounds with its
//! range, each ratio the median of the per-round ratios.
//!
//! Run: `cargo run --release -p superinfer-scheduler --example plan_bench [concurrency] [rounds]`

use std::time::Instant;

use superinfer_scheduler::{PolicyKind, RequestSpec, Scheduler, SchedulerConfig, StepResults};

const STEPS: u64 = 2000;

fn run(policy: PolicyKind, concurrency: u64) -> f64 {
    let config = SchedulerConfig {
        num_device_blocks: 16_384,
        num_host_blocks: 65_536,
        max_batch_tokens: 8192,
        max_batch_requests: 512,
        policy,
        ..SchedulerConfig::default()
    };
    let mut scheduler = Scheduler::new(config).expect("valid config");
    let mut next_id = 0u64;
    let mut now = 0.0;
    let mut spent = 0.0;
    let mut prompt_lens = std::collections::BTreeMap::new();
    for _ in 0..STEPS {
        while scheduler.num_requests() < concurrency as usize {
            let prompt_len = 256 + (next_id * 37 % 768) as usize;
            prompt_lens.insert(next_id, prompt_len);
            let prompt = (0..prompt_len as u32).map(|t| t + next_id as u32).collect();
            let spec = RequestSpec { id: next_id, prompt_token_ids: prompt, max_new_tokens: 128, slo: None, arrival: now, priority: 0, kv_namespace: 0, scores_prompt: false };
            scheduler.add(spec, now).expect("fits");
            next_id += 1;
        }
        let started = Instant::now();
        let plan = scheduler.plan(now);
        spent += started.elapsed().as_secs_f64();
        let acks = plan.rotate_out.iter().chain(&plan.rotate_in).map(|t| t.id).collect();
        let sampled = plan.sampling.iter().map(|id| (*id, 1)).collect();
        now += 0.02;
        let results = StepResults { step_id: plan.step_id, sampled, completed_transfers: acks, step_time_s: Some(0.02) };
        let started = Instant::now();
        scheduler.complete(&results, now);
        spent += started.elapsed().as_secs_f64();
        let done: Vec<u64> = plan
            .sampling
            .iter()
            .copied()
            .filter(|id| scheduler.tokens(*id).is_some_and(|t| t.len() >= prompt_lens[id] + 128))
            .collect();
        for id in done {
            scheduler.finish(id);
            prompt_lens.remove(&id);
        }
    }
    spent / STEPS as f64 * 1e6
}

/// The median of `values` (sorted in place) and its range.
fn spread(values: &mut [f64]) -> (f64, f64, f64) {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    let median = if n % 2 == 1 { values[n / 2] } else { (values[n / 2 - 1] + values[n / 2]) / 2.0 };
    (median, values[0], values[n - 1])
}

fn main() {
    let mut args = std::env::args().skip(1);
    let concurrency = args.next().and_then(|a| a.parse().ok()).unwrap_or(256);
    let rounds: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(5);
    let policies = PolicyKind::ALL;
    // micros[round][policy]
    let mut micros = Vec::with_capacity(rounds);
    for round in 0..=rounds {
        let mut this = vec![0.0; policies.len()];
        for offset in 0..policies.len() {
            let index = (round + offset) % policies.len();
            this[index] = run(policies[index], concurrency);
        }
        if round > 0 {
            micros.push(this); // round 0 warms caches and the allocator up
        }
    }
    let fcfs = policies.iter().position(|p| *p == PolicyKind::Fcfs).expect("fcfs is a policy");
    println!("{concurrency} concurrent requests, {STEPS} steps, 16384 device blocks; median [min-max] of {rounds} rounds");
    for (index, policy) in policies.iter().enumerate() {
        let (us, us_min, us_max) = spread(&mut micros.iter().map(|r| r[index]).collect::<Vec<_>>());
        let (ratio, r_min, r_max) = spread(&mut micros.iter().map(|r| r[index] / r[fcfs]).collect::<Vec<_>>());
        println!(
            "{:>10}: {us:8.1} us/step [{us_min:.1}-{us_max:.1}]  ({ratio:.2}x fcfs [{r_min:.2}-{r_max:.2}])",
            policy.as_str()
        );
    }
}
