//! KV-cache events against the block manager: a subscriber that only applies the events must
//! hold exactly the set of blocks a prompt lookup finds, through stores, hits, evictions,
//! rotations out and in, and a reset — and must find the same prefix for any prompt.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::driver::{config, Driver};
use crate::config::PolicyKind;
use crate::kv::{BlockManager, KvCacheEvent};
use crate::request::RequestSpec;

/// What a router's index rebuilds from the events alone.
#[derive(Default)]
struct Subscriber {
    block_size: usize,
    /// hash -> (parent, namespace, tokens) of every findable block.
    findable: BTreeMap<u64, (Option<u64>, u64, Vec<u32>)>,
    /// Every hash ever stored: a store must name a known parent (the index drops others).
    anchors: BTreeSet<u64>,
}

impl Subscriber {
    fn new(block_size: u32) -> Self {
        Subscriber { block_size: block_size as usize, ..Subscriber::default() }
    }

    fn apply(&mut self, events: Vec<KvCacheEvent>) {
        for event in events {
            match event {
                KvCacheEvent::Stored { block_hashes, parent, token_ids, kv_namespace } => {
                    assert_eq!(token_ids.len(), block_hashes.len() * self.block_size, "whole blocks only");
                    if let Some(parent) = parent {
                        assert!(self.anchors.contains(&parent), "stored under an unknown parent {parent:#x}");
                    }
                    let mut parent = parent;
                    for (hash, tokens) in block_hashes.iter().zip(token_ids.chunks(self.block_size)) {
                        let previous = self.findable.insert(*hash, (parent, kv_namespace, tokens.to_vec()));
                        assert!(previous.is_none(), "block {hash:#x} stored twice without a removal");
                        self.anchors.insert(*hash);
                        parent = Some(*hash);
                    }
                }
                KvCacheEvent::Removed { block_hashes } => {
                    for hash in block_hashes {
                        assert!(self.findable.remove(&hash).is_some(), "block {hash:#x} removed but not stored");
                    }
                }
                KvCacheEvent::AllCleared => self.findable.clear(),
            }
        }
    }

    /// Full blocks of `tokens[..len-1]` the index matches, walking from the root by parent and
    /// block tokens as a router does (it never sees the engine's hash function).
    fn matched_blocks(&self, namespace: u64, tokens: &[u32]) -> u32 {
        let by_edge: HashMap<(Option<u64>, u64, &[u32]), u64> = self
            .findable
            .iter()
            .map(|(hash, (parent, ns, block))| ((*parent, *ns, block.as_slice()), *hash))
            .collect();
        let mut parent = None;
        let mut matched = 0;
        for block in tokens[..tokens.len() - 1].chunks_exact(self.block_size) {
            match by_edge.get(&(parent, namespace, block)) {
                Some(hash) => {
                    parent = Some(*hash);
                    matched += 1;
                }
                None => break,
            }
        }
        matched
    }
}

/// A small deterministic generator (tests must replay the same operations).
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

/// Prompts over a few shared prefixes (so blocks are hit and shared), a private tail each.
fn prompt(rng: &mut Lcg, block_size: u32) -> Vec<u32> {
    let prefix = rng.below(4) as u32;
    let shared_blocks = 1 + rng.below(3) as u32;
    let mut tokens: Vec<u32> = (0..shared_blocks * block_size).map(|i| prefix * 100 + i).collect();
    let tail = 1 + rng.below(u64::from(2 * block_size)) as u32;
    tokens.extend((0..tail).map(|_| 1000 + rng.below(5) as u32));
    tokens
}

/// `namespaces`: those a prompt is probed in (retired ones included: nothing is found there).
fn assert_same(manager: &BlockManager, subscriber: &Subscriber, rng: &mut Lcg, step: usize, namespaces: &[u64]) {
    let rebuilt: BTreeSet<u64> = subscriber.findable.keys().copied().collect();
    assert_eq!(rebuilt, manager.findable_prefixes(), "findable sets differ after operation {step}");
    for _ in 0..4 {
        let namespace = namespaces[rng.below(namespaces.len() as u64) as usize];
        let tokens = prompt(rng, manager.block_size());
        let probe = manager.probe_prefix(namespace, &tokens);
        assert_eq!(subscriber.matched_blocks(namespace, &tokens), probe.hit_blocks, "prefix of {tokens:?}");
    }
}

/// The base model (0) and one LoRA adapter at a time, whose namespace is retired now and then as
/// an unload or an in-place replacement retires it (its requests still live go on computing).
#[test]
fn events_rebuild_the_findable_set_through_hits_evictions_and_rotations() {
    let block_size = 4;
    let mut retirements = 0;
    for seed in 0..40 {
        let mut rng = Lcg(seed);
        let mut manager = BlockManager::new(block_size, 24, 12, true);
        manager.enable_kv_events();
        let mut subscriber = Subscriber::new(block_size);
        // request -> its tokens; requests with a transfer in flight -> transfer id.
        let mut live: BTreeMap<u64, Vec<u32>> = BTreeMap::new();
        let mut in_flight: BTreeMap<u64, u64> = BTreeMap::new();
        let mut counts = [0u32; 6];
        let mut adapter = 1u64;
        for step in 0..300 {
            let id = rng.below(10);
            let op = rng.below(100);
            if op < 40 && !live.contains_key(&id) {
                let tokens = prompt(&mut rng, block_size);
                let namespace = if rng.below(2) == 0 { 0 } else { adapter };
                manager.acquire_prefix(id, namespace, &tokens);
                if manager.grow(id, tokens.len() as u64) {
                    manager.register_scheduled(id, &tokens, tokens.len() as u32);
                    live.insert(id, tokens);
                    counts[0] += 1;
                } else {
                    manager.release(id);
                }
            } else if op < 60 && live.contains_key(&id) && !in_flight.contains_key(&id) {
                manager.release(id);
                live.remove(&id);
                counts[1] += 1;
            } else if op < 75 && live.contains_key(&id) && !in_flight.contains_key(&id) {
                let transfer = if manager.host_slots(id) > 0 { manager.transfer_in(id) } else { manager.transfer_out(id, live[&id].len() as u32) };
                if let Some(transfer) = transfer {
                    in_flight.insert(id, transfer.id);
                    counts[2] += 1;
                }
            } else if op < 95 {
                if let Some(transfer) = in_flight.remove(&id) {
                    manager.ack(transfer).expect("issued transfer");
                    counts[3] += 1;
                }
            } else if op == 98 {
                manager.retire_namespace(adapter);
                adapter += 1;
                counts[5] += 1;
            } else if op == 99 {
                manager.clear();
                live.clear();
                in_flight.clear();
                counts[4] += 1;
            }
            manager.check().unwrap();
            subscriber.apply(manager.take_kv_events());
            assert_same(&manager, &subscriber, &mut rng, step, &[0, adapter, adapter.saturating_sub(1).max(1)]);
            assert!(subscriber.findable.values().all(|(_, ns, _)| *ns == 0 || *ns == adapter), "a retired adapter's block is findable");
        }
        assert!(counts[..4].iter().all(|count| *count > 0), "seed {seed} exercised every operation: {counts:?}");
        retirements += counts[5];
    }
    assert!(retirements >= 40, "adapters retired {retirements} times");
}

#[test]
fn events_follow_the_scheduler_under_rotation() {
    // Swap on a pool of 9 blocks: requests sharing a prompt prefix rotate each other out; each
    // transfer is acknowledged one step after it is issued, so copies are seen in flight.
    let mut driver = Driver::new(config(PolicyKind::Swap, 9));
    driver.ack_delay = 1;
    driver.scheduler.enable_kv_events();
    let mut subscriber = Subscriber::new(driver.scheduler.config().block_size);
    let shared: Vec<u32> = (0..8).collect();
    for id in 0..4u64 {
        let mut tokens = shared.clone();
        tokens.extend([100 + id as u32, 200]);
        let spec = RequestSpec { id, prompt_token_ids: tokens, max_new_tokens: 8, slo: None,
            arrival: 0.0, priority: 0, kv_namespace: 0, scores_prompt: false };
        driver.add(spec);
    }
    for _ in 0..400 {
        if !driver.scheduler.has_work() {
            break;
        }
        driver.step();
        subscriber.apply(driver.scheduler.take_kv_events());
        let rebuilt: BTreeSet<u64> = subscriber.findable.keys().copied().collect();
        assert_eq!(rebuilt, driver.scheduler.core.blocks.findable_prefixes());
    }
    let stats = driver.scheduler.stats();
    assert!(stats.rotations_out > 0 && stats.prefix_cache_hit_tokens > 0, "{stats:?}");
    assert!(!driver.scheduler.has_work());
    // The shared prefix stays findable after everything finished, and a reset clears it.
    assert_eq!(subscriber.matched_blocks(0, &[shared.clone(), vec![7]].concat()), 2);
    driver.scheduler.reset();
    subscriber.apply(driver.scheduler.take_kv_events());
    assert!(subscriber.findable.is_empty());
}

#[test]
fn nothing_is_recorded_unless_enabled() {
    let mut manager = BlockManager::new(4, 8, 8, true);
    manager.acquire_prefix(1, 0, &[1, 2, 3, 4, 5]);
    assert!(manager.grow(1, 5));
    manager.register_scheduled(1, &[1, 2, 3, 4, 5], 5);
    manager.clear();
    assert!(manager.take_kv_events().is_empty());
}
