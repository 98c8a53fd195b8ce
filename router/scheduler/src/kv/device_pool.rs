//! Device KV blocks: reference counts, the LRU free list and the prefix-cache registry.
//!
//! A block with a non-zero count is owned (by request tables and/or an in-flight transfer out) and
//! never allocatable. A block at zero is free; if it still holds a cached full block it stays
//! findable by its prefix hash until allocation evicts it. Allocation takes never-cached blocks
//! first, then the least recently released cached one.
//!
//! Every change to what `lookup` can find is recorded in its event log (`events`).
//!
//! A retired namespace (a LoRA adapter unloaded or replaced: its slot is never served again)
//! has no findable block: `retire` forgets its cached blocks at once, the free ones going to the
//! front of the free list, and `register` caches none of the blocks its last requests compute.

use std::collections::{BTreeSet, HashMap, HashSet};

use super::events::{EventLog, KvCacheEvent};
use super::prefix_hash::chain_root;

/// What a cached block holds, compared on lookup so hash collisions cannot alias KV.
#[derive(Debug, Clone, PartialEq, Eq)]
struct CachedKey {
    hash: u64,
    parent: u64,
    tokens: Vec<u32>,
    /// The KV namespace of the chain (`prefix_hash::chain_root`), for the events.
    namespace: u64,
}

impl CachedKey {
    /// The parent as the events name it: none for a chain's first block.
    fn event_parent(&self) -> Option<u64> {
        (self.parent != chain_root(self.namespace)).then_some(self.parent)
    }
}

#[derive(Debug)]
pub(crate) struct DevicePool {
    ref_counts: Vec<u32>,
    /// Source of an unacknowledged transfer out: its content is being read by a copy, so it is
    /// neither allocatable nor handed out as a prefix hit.
    in_flight: Vec<bool>,
    cached: Vec<Option<CachedKey>>,
    /// hash -> block. Only looked up, never iterated, so its order cannot leak into plans.
    registry: HashMap<u64, u32>,
    /// (release tick, block): tick 0 for never-cached blocks so they go first.
    free: BTreeSet<(u64, u32)>,
    free_tick: Vec<u64>,
    tick: u64,
    events: EventLog,
    /// KV namespaces no request will be given again (`retire`).
    retired: HashSet<u64>,
}

impl DevicePool {
    pub(crate) fn new(num_blocks: u32) -> Self {
        let n = num_blocks as usize;
        DevicePool {
            ref_counts: vec![0; n],
            in_flight: vec![false; n],
            cached: vec![None; n],
            registry: HashMap::new(),
            free: (0..num_blocks).map(|b| (0, b)).collect(),
            free_tick: vec![0; n],
            tick: 0,
            events: EventLog::default(),
            retired: HashSet::new(),
        }
    }

    pub(crate) fn num_blocks(&self) -> u32 {
        self.ref_counts.len() as u32
    }

    pub(crate) fn num_free(&self) -> u32 {
        self.free.len() as u32
    }

    pub(crate) fn num_free_cached(&self) -> u32 {
        self.free.iter().filter(|(tick, _)| *tick > 0).count() as u32
    }

    pub(crate) fn num_in_flight(&self) -> u32 {
        self.in_flight.iter().filter(|f| **f).count() as u32
    }

    pub(crate) fn ref_count(&self, block: u32) -> u32 {
        self.ref_counts[block as usize]
    }

    pub(crate) fn is_in_flight(&self, block: u32) -> bool {
        self.in_flight[block as usize]
    }

    /// A cached block is not findable while its content is copied out: it leaves the findable
    /// set when the copy starts and comes back when it ends.
    pub(crate) fn set_in_flight(&mut self, block: u32, in_flight: bool) {
        let i = block as usize;
        if self.in_flight[i] != in_flight {
            if let Some(key) = &self.cached[i] {
                if in_flight {
                    self.events.removed(key.hash);
                } else {
                    self.events.stored(key.hash, key.event_parent(), &key.tokens, key.namespace);
                }
            }
        }
        self.in_flight[i] = in_flight;
    }

    /// Starts recording the findable set's changes (`take_events`).
    pub(crate) fn enable_events(&mut self) {
        self.events.enable();
    }

    pub(crate) fn take_events(&mut self) -> Vec<KvCacheEvent> {
        self.events.take()
    }

    /// A fresh pool of the same size whose log goes on from this one's, with everything cleared.
    pub(crate) fn cleared(&mut self) -> DevicePool {
        let mut fresh = DevicePool::new(self.num_blocks());
        fresh.events = std::mem::take(&mut self.events);
        fresh.events.cleared();
        fresh.retired = std::mem::take(&mut self.retired);
        fresh
    }

    /// Takes a free block (evicting its cached content if any) with one reference.
    pub(crate) fn allocate(&mut self) -> Option<u32> {
        let (tick, block) = self.free.pop_first()?;
        debug_assert_eq!(tick, self.free_tick[block as usize]);
        if let Some(key) = self.cached[block as usize].take() {
            self.registry.remove(&key.hash);
            self.events.removed(key.hash);
        }
        self.ref_counts[block as usize] = 1;
        Some(block)
    }

    pub(crate) fn incref(&mut self, block: u32) {
        let i = block as usize;
        if self.ref_counts[i] == 0 {
            self.free.remove(&(self.free_tick[i], block));
        }
        self.ref_counts[i] += 1;
    }

    /// Drops one reference; at zero the block becomes free (still findable if cached).
    pub(crate) fn decref(&mut self, block: u32) {
        let i = block as usize;
        self.ref_counts[i] = self.ref_counts[i].saturating_sub(1);
        if self.ref_counts[i] == 0 {
            self.free_tick[i] = if self.cached[i].is_some() {
                self.tick += 1;
                self.tick
            } else {
                0
            };
            self.free.insert((self.free_tick[i], block));
        }
    }

    /// The cached block holding exactly this prefix, if any and not in flight.
    pub(crate) fn lookup(&self, hash: u64, parent: u64, tokens: &[u32]) -> Option<u32> {
        let block = *self.registry.get(&hash)?;
        let key = self.cached[block as usize].as_ref()?;
        let matches = key.parent == parent && key.tokens == tokens;
        (matches && !self.in_flight[block as usize]).then_some(block)
    }

    /// Records that `block` (owned, fully computed) holds this prefix of a chain in KV
    /// `namespace`. The first block to register a prefix keeps it; a duplicate stays uncached.
    pub(crate) fn register(&mut self, block: u32, hash: u64, parent: u64, namespace: u64, tokens: &[u32]) {
        let i = block as usize;
        if self.cached[i].is_some() || self.registry.contains_key(&hash) || self.retired.contains(&namespace) {
            return;
        }
        self.registry.insert(hash, block);
        let key = CachedKey { hash, parent, tokens: tokens.to_vec(), namespace };
        if !self.in_flight[i] {
            self.events.stored(hash, key.event_parent(), tokens, namespace);
        }
        self.cached[i] = Some(key);
    }

    /// No request will run in KV `namespace` again (its LoRA adapter was unloaded or replaced;
    /// the base model's, 0, is never retired): its cached blocks stop being findable, and the
    /// free ones are allocated before any block that still caches a prefix. Blocks its last
    /// requests hold stay theirs, uncached. Returns how many blocks were forgotten.
    pub(crate) fn retire(&mut self, namespace: u64) -> u32 {
        if namespace == 0 || !self.retired.insert(namespace) {
            return 0;
        }
        let mut forgotten = 0;
        for i in 0..self.cached.len() {
            let Some(key) = self.cached[i].take_if(|key| key.namespace == namespace) else { continue };
            self.registry.remove(&key.hash);
            // One being copied out was announced removed when its copy started.
            if !self.in_flight[i] {
                self.events.removed(key.hash);
            }
            if self.ref_counts[i] == 0 {
                let block = i as u32;
                self.free.remove(&(self.free_tick[i], block));
                self.free_tick[i] = 0;
                self.free.insert((0, block));
            }
            forgotten += 1;
        }
        forgotten
    }

    /// The hashes `lookup` can find now: cached blocks not being copied out.
    #[cfg(test)]
    pub(crate) fn findable(&self) -> std::collections::BTreeSet<u64> {
        let findable = |(hash, block): (&u64, &u32)| (!self.in_flight[*block as usize]).then_some(*hash);
        self.registry.iter().filter_map(findable).collect()
    }

    pub(crate) fn is_free(&self, block: u32) -> bool {
        self.ref_counts[block as usize] == 0
    }

    /// Internal consistency of the pool alone (ownership is checked by the block manager).
    pub(crate) fn check(&self) -> Result<(), String> {
        for (tick, block) in &self.free {
            let i = *block as usize;
            if self.ref_counts[i] != 0 {
                return Err(format!("device block {block} is free with refcount {}", self.ref_counts[i]));
            }
            if self.free_tick[i] != *tick {
                return Err(format!("device block {block} free tick mismatch"));
            }
            if self.in_flight[i] {
                return Err(format!("device block {block} is free while in flight"));
            }
        }
        let owned = self.ref_counts.iter().filter(|r| **r > 0).count();
        if owned + self.free.len() != self.ref_counts.len() {
            return Err(format!(
                "device pool: {owned} owned + {} free != {}",
                self.free.len(),
                self.ref_counts.len()
            ));
        }
        for (hash, block) in &self.registry {
            match &self.cached[*block as usize] {
                Some(key) if key.hash == *hash => {}
                _ => return Err(format!("prefix registry entry {hash:#x} -> {block} is stale")),
            }
        }
        if let Some(key) = self.cached.iter().flatten().find(|key| self.retired.contains(&key.namespace)) {
            return Err(format!("block {:#x} is cached in retired namespace {}", key.hash, key.namespace));
        }
        let cached = self.cached.iter().filter(|c| c.is_some()).count();
        if cached != self.registry.len() {
            return Err(format!("{cached} cached blocks but {} registry entries", self.registry.len()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocation_prefers_uncached_then_lru() {
        let mut pool = DevicePool::new(3);
        let a = pool.allocate().unwrap();
        let b = pool.allocate().unwrap();
        pool.register(a, 11, 0, 0, &[1]);
        pool.register(b, 22, 0, 0, &[2]);
        pool.decref(a);
        pool.decref(b);
        assert_eq!(pool.num_free_cached(), 2);
        // The never-cached block goes first, then `a` (released before `b`).
        let c = pool.allocate().unwrap();
        assert!(c != a && c != b);
        assert_eq!(pool.allocate(), Some(a));
        assert_eq!(pool.lookup(11, 0, &[1]), None, "evicted on reuse");
        assert_eq!(pool.lookup(22, 0, &[2]), Some(b));
        assert_eq!(pool.lookup(22, 0, &[3]), None, "tokens are compared");
        pool.check().unwrap();
    }

    #[test]
    fn hit_on_free_cached_block_revives_it() {
        let mut pool = DevicePool::new(2);
        let a = pool.allocate().unwrap();
        pool.register(a, 5, 0, 0, &[7, 8]);
        pool.decref(a);
        assert_eq!(pool.num_free(), 2);
        let hit = pool.lookup(5, 0, &[7, 8]).unwrap();
        pool.incref(hit);
        assert_eq!(pool.num_free(), 1);
        assert_eq!(pool.ref_count(a), 1);
        pool.set_in_flight(a, true);
        assert_eq!(pool.lookup(5, 0, &[7, 8]), None, "in-flight blocks are not handed out");
        pool.set_in_flight(a, false);
        pool.check().unwrap();
    }

    /// A retired namespace's cached blocks are forgotten at once and announced removed (one being
    /// copied out was announced when its copy started), the free ones are allocated before any
    /// block caching another namespace's prefix, one still held stays its holder's, and nothing
    /// of the namespace is cached again. Other namespaces keep theirs.
    #[test]
    fn a_retired_namespace_is_forgotten_and_its_free_blocks_go_first() {
        let mut pool = DevicePool::new(5);
        pool.enable_events();
        let blocks: Vec<u32> = (0..4).map(|_| pool.allocate().unwrap()).collect();
        pool.register(blocks[0], 10, 0, 0, &[1]);
        pool.register(blocks[1], 11, 0, 1, &[1]);
        pool.register(blocks[2], 12, 0, 1, &[2]);
        pool.register(blocks[3], 13, 0, 1, &[3]);
        pool.decref(blocks[0]);
        pool.decref(blocks[1]);
        pool.set_in_flight(blocks[3], true);
        pool.take_events();
        assert_eq!(pool.retire(1), 3);
        assert_eq!(pool.take_events(), [KvCacheEvent::Removed { block_hashes: vec![11, 12] }]);
        for (hash, tokens) in [(11, [1]), (12, [2]), (13, [3])] {
            assert_eq!(pool.lookup(hash, 0, &tokens), None);
        }
        assert_eq!(pool.lookup(10, 0, &[1]), Some(blocks[0]));
        assert_eq!(pool.retire(1), 0, "retired once");
        assert_eq!(pool.retire(0), 0, "the base model's namespace is never retired");
        // The copy out ends: still not findable, nothing announced.
        pool.set_in_flight(blocks[3], false);
        assert!(pool.take_events().is_empty());
        assert_eq!(pool.ref_count(blocks[2]), 1, "held by its request");
        assert_eq!(pool.num_free_cached(), 1);
        // The never-cached block and the retired one go before the base model's cached block.
        let first = [pool.allocate().unwrap(), pool.allocate().unwrap()];
        assert!(first.contains(&blocks[1]) && !first.contains(&blocks[0]), "{first:?}");
        assert_eq!(pool.lookup(10, 0, &[1]), Some(blocks[0]));
        // A block its last request computes is not cached.
        pool.register(blocks[2], 14, 0, 1, &[4]);
        assert_eq!(pool.lookup(14, 0, &[4]), None);
        assert!(pool.take_events().is_empty());
        pool.check().unwrap();
        // A reset keeps what was retired.
        let mut fresh = pool.cleared();
        let block = fresh.allocate().unwrap();
        fresh.register(block, 15, 0, 1, &[5]);
        assert_eq!(fresh.lookup(15, 0, &[5]), None);
    }
}
