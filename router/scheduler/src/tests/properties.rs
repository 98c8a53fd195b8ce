//! Random interleavings of add / plan / complete (acks possibly late) / finish / cancel, for
//! every policy: the invariants hold after every call (debug builds check them inside the
//! scheduler), the fake shard's ordering checks hold on every plan, and nothing leaks once
//! everything is finished.

use proptest::prelude::*;

use super::driver::{config, spec, Driver};
use crate::config::{PolicyKind, Slo};

#[derive(Debug, Clone)]
enum Op {
    Add { prompt_len: u32, max_new: u32, shared_prefix: bool, tight_slo: bool },
    Step,
    Finish(usize),
    Cancel(usize),
    Wait,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (1u32..24, 1u32..12, any::<bool>(), any::<bool>()).prop_map(|(p, m, s, t)| Op::Add {
            prompt_len: p,
            max_new: m,
            shared_prefix: s,
            tight_slo: t,
        }),
        6 => Just(Op::Step),
        1 => any::<usize>().prop_map(Op::Finish),
        1 => any::<usize>().prop_map(Op::Cancel),
        1 => Just(Op::Wait),
    ]
}

fn run(policy: PolicyKind, device_blocks: u32, host_blocks: u32, ack_delay: u64, caching: bool, ops: &[Op]) {
    let mut cfg = config(policy, device_blocks);
    cfg.prefix_caching = caching;
    cfg.num_host_blocks = host_blocks;
    cfg.max_batch_tokens = 16;
    cfg.max_batch_requests = 6;
    let mut d = Driver::new(cfg);
    d.ack_delay = ack_delay;
    let mut next_id = 0u64;
    for op in ops {
        match op {
            Op::Add { prompt_len, max_new, shared_prefix, tight_slo } => {
                let mut s = spec(next_id, *prompt_len, *max_new, d.now);
                if *shared_prefix {
                    for (i, t) in s.prompt_token_ids.iter_mut().enumerate().take(8) {
                        *t = 7 + i as u32;
                    }
                }
                if *tight_slo {
                    s.slo = Some(Slo::new(0.02, 0.015));
                }
                next_id += 1;
                // Requests that can never fit are rejected; that is part of the contract.
                let _ = d.scheduler.add(s, d.now);
            }
            Op::Step => {
                d.step();
            }
            Op::Finish(pick) | Op::Cancel(pick) => {
                let ids: Vec<u64> = d.scheduler.core.requests.keys().copied().collect();
                if !ids.is_empty() {
                    let id = ids[pick % ids.len()];
                    if matches!(op, Op::Finish(_)) {
                        d.scheduler.finish(id);
                    } else {
                        d.scheduler.cancel(id);
                    }
                }
            }
            Op::Wait => d.now += 0.05,
        }
        d.scheduler.check_invariants().expect("invariants");
    }
    d.run_to_completion(3000);
    d.assert_all_free();
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn fcfs_holds_invariants(ops in prop::collection::vec(op(), 1..120), delay in 0u64..3, caching in any::<bool>()) {
        run(PolicyKind::Fcfs, 12, 16, delay, caching, &ops);
    }

    #[test]
    fn recompute_holds_invariants(ops in prop::collection::vec(op(), 1..120), delay in 0u64..3, caching in any::<bool>()) {
        run(PolicyKind::Recompute, 10, 16, delay, caching, &ops);
    }

    #[test]
    fn swap_holds_invariants(ops in prop::collection::vec(op(), 1..120), delay in 0u64..3, host in 0u32..20, caching in any::<bool>()) {
        run(PolicyKind::Swap, 10, host, delay, caching, &ops);
    }

    #[test]
    fn rotasched_holds_invariants(ops in prop::collection::vec(op(), 1..120), delay in 0u64..3, host in 0u32..20, caching in any::<bool>()) {
        run(PolicyKind::RotaSched, 10, host, delay, caching, &ops);
    }
}
