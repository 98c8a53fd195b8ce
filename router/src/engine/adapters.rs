//! The LoRA adapters the server serves, by the ids requests name them with, and their slots.
//! The shard's `Info` gives those of `--lora-adapters` (slot k + 1 for the k-th); adapters
//! loaded later (`/v1/load_lora_adapter`, `--lora-resolver-dir`) get the next slot after the
//! largest ever given, so a slot names one adapter for the server's whole life. The slot is the
//! adapter's KV namespace too: prefix-cache blocks of an adapter unloaded and loaded again
//! (perhaps other weights under the same id) are never reused.
//!
//! Loading is two-phase: `reserve` takes the id and a slot (a second load of the same id waits
//! for no one: it is refused), `commit` makes it visible to requests once the shard installed
//! it, `abandon` gives the id back when it could not. `remove` takes an id away from new
//! requests at once; the engine unloads the slot from the shard once no request it holds uses it.
//!
//! `--max-loras N` bounds the adapters served and being loaded. A load past it evicts the
//! least recently named adapter the resolver loaded (it can load it again) that no request
//! holds; with none such, the load is refused (`AdapterChange::Full` when there is no adapter the
//! resolver loaded, `Busy` when requests hold each: the resolver then waits for one to end). A request holds its
//! adapter from the moment it names it (`get`) to its end: every `AdapterRef` clone counts.
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use super::api::AdapterRef;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdapterChange {
    #[error("The lora adapter '{0}' has already been loaded.")]
    AlreadyLoaded(String),
    #[error("The lora adapter '{0}' is being loaded.")]
    Loading(String),
    #[error("The lora adapter '{0}' cannot be found.")]
    NotFound(String),
    #[error("The server serves its most lora adapters at once (--max-loras {0}), none of which it can evict; unload one first.")]
    Full(usize),
    #[error("The server serves its most lora adapters at once (--max-loras {0}), and requests hold each it could evict.")]
    Busy(usize),
}

/// How an adapter came to be served: only those the resolver loaded are evicted, since only
/// they come back by themselves when a request names them again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Residency {
    /// `--lora-adapters` and `/v1/load_lora_adapter`: served until unloaded.
    Pinned,
    /// `--lora-resolver-dir`: may be evicted under `--max-loras`.
    Evictable,
}

#[derive(Debug)]
struct Served {
    adapter: AdapterRef,
    residency: Residency,
    /// When a request last named it (a tick of `AdapterRegistry::clock`).
    named: AtomicU64,
}

impl Served {
    /// No request holds it: the only count of its hold is this entry's own.
    fn idle(&self) -> bool {
        Arc::strong_count(&self.adapter.held) == 1
    }
}

#[derive(Debug, Default)]
struct Registry {
    /// Served now, in the order they were loaded.
    loaded: Vec<Served>,
    /// Every slot ever given -> its id (for the KV events of blocks that outlive an unload).
    names: HashMap<u64, String>,
    /// Ids being loaded (reserved, not committed), and how they will be served.
    loading: HashMap<String, Residency>,
    /// The largest slot given so far.
    last_slot: u64,
}

/// A load's slot, and the adapter evicted to make room for it (the engine retires its slot).
#[derive(Debug, PartialEq, Eq)]
pub struct Reservation {
    pub slot: u64,
    pub evicted: Option<AdapterRef>,
}

#[derive(Debug, Default)]
pub struct AdapterRegistry {
    state: RwLock<Registry>,
    /// `--max-loras`: the most adapters served and being loaded at once; None, no bound.
    max: Option<usize>,
    /// Ticks once per `get`: the order in which adapters were last named.
    clock: AtomicU64,
}

impl AdapterRegistry {
    /// The adapters the shard loaded at start: (id, slot).
    pub fn new(startup: impl IntoIterator<Item = (String, u64)>) -> Self {
        Self::bounded(startup, None)
    }

    /// As `new`, with at most `max` adapters served at once (`--max-loras`).
    pub fn bounded(startup: impl IntoIterator<Item = (String, u64)>, max: Option<usize>) -> Self {
        let mut registry = Registry::default();
        for (id, slot) in startup {
            registry.names.insert(slot, id.clone());
            registry.last_slot = registry.last_slot.max(slot);
            registry.loaded.push(Served { adapter: AdapterRef::new(id, slot), residency: Residency::Pinned, named: AtomicU64::new(0) });
        }
        let registry = Self { state: RwLock::new(registry), max, clock: AtomicU64::new(0) };
        registry.record();
        registry
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Registry> {
        // A panic while holding the lock left consistent data (every change is one assignment).
        self.state.read().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Registry> {
        self.state.write().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn record(&self) {
        metrics::gauge!("superinfer_lora_adapters_loaded").set(self.count() as f64);
    }

    /// The adapter served under `id`, if any; the returned reference holds it (no eviction)
    /// until it and its clones are dropped.
    pub fn get(&self, id: &str) -> Option<AdapterRef> {
        let registry = self.read();
        let served = registry.loaded.iter().find(|served| served.adapter.id == id)?;
        served.named.store(self.clock.fetch_add(1, Ordering::Relaxed) + 1, Ordering::Relaxed);
        Some(served.adapter.clone())
    }

    /// Whether `id` is served now (holds nothing, and does not count as naming it).
    pub fn contains(&self, id: &str) -> bool {
        self.read().loaded.iter().any(|served| served.adapter.id == id)
    }

    /// The ids served now, in the order they were loaded.
    pub fn ids(&self) -> Vec<String> {
        self.read().loaded.iter().map(|served| served.adapter.id.clone()).collect()
    }

    /// How many adapters are served now.
    pub fn count(&self) -> usize {
        self.read().loaded.len()
    }

    /// `--max-loras`, if given.
    pub fn max(&self) -> Option<usize> {
        self.max
    }

    /// The id the adapter in `slot` has (or had).
    pub fn name_of(&self, slot: u64) -> Option<String> {
        self.read().names.get(&slot).cloned()
    }

    /// Takes `id` for a load and gives it a new slot. `replace`: an adapter served under `id`
    /// may be replaced (it stays served until `commit`). Past `--max-loras`, the least recently
    /// named idle evictable adapter stops being served to make room.
    pub fn reserve(&self, id: &str, replace: bool, residency: Residency) -> Result<Reservation, AdapterChange> {
        let mut registry = self.write();
        if registry.loading.contains_key(id) {
            return Err(AdapterChange::Loading(id.to_string()));
        }
        let served = registry.loaded.iter().any(|served| served.adapter.id == id);
        if !replace && served {
            return Err(AdapterChange::AlreadyLoaded(id.to_string()));
        }
        let mut evicted = None;
        if let Some(max) = self.max.filter(|&max| !served && registry.loaded.len() + registry.loading.len() >= max) {
            let evictable = || registry.loaded.iter().enumerate().filter(|(_, served)| served.residency == Residency::Evictable);
            if evictable().next().is_none() {
                return Err(AdapterChange::Full(max));
            }
            let victim = evictable()
                .filter(|(_, served)| served.idle())
                .min_by_key(|(_, served)| served.named.load(Ordering::Relaxed))
                .map(|(position, _)| position)
                .ok_or(AdapterChange::Busy(max))?;
            evicted = Some(registry.loaded.remove(victim).adapter);
            metrics::counter!("superinfer_lora_adapter_evictions_total").increment(1);
        }
        registry.loading.insert(id.to_string(), residency);
        registry.last_slot += 1;
        let slot = registry.last_slot;
        drop(registry);
        if evicted.is_some() {
            self.record();
        }
        Ok(Reservation { slot, evicted })
    }

    /// `id`, reserved, is installed in `slot`: requests may name it. Returns it (held) and the
    /// adapter it replaces, if one was served under `id`.
    pub fn commit(&self, id: &str, slot: u64) -> (AdapterRef, Option<AdapterRef>) {
        let mut registry = self.write();
        let residency = registry.loading.remove(id).unwrap_or(Residency::Pinned);
        registry.names.insert(slot, id.to_string());
        let fresh = Served { adapter: AdapterRef::new(id.to_string(), slot), residency, named: AtomicU64::new(self.clock.load(Ordering::Relaxed)) };
        let held = fresh.adapter.clone();
        let replaced = match registry.loaded.iter_mut().find(|served| served.adapter.id == id) {
            Some(served) => Some(std::mem::replace(served, fresh).adapter),
            None => {
                registry.loaded.push(fresh);
                None
            }
        };
        drop(registry);
        self.record();
        (held, replaced)
    }

    /// `id`, reserved, could not be loaded.
    pub fn abandon(&self, id: &str) {
        self.write().loading.remove(id);
    }

    /// Takes `id` away from new requests.
    pub fn remove(&self, id: &str) -> Result<AdapterRef, AdapterChange> {
        let mut registry = self.write();
        let position = registry
            .loaded
            .iter()
            .position(|served| served.adapter.id == id)
            .ok_or_else(|| AdapterChange::NotFound(id.to_string()))?;
        let removed = registry.loaded.remove(position).adapter;
        drop(registry);
        self.record();
        Ok(removed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn registry() -> AdapterRegistry {
        AdapterRegistry::new([("sql".to_string(), 1), ("chat".to_string(), 2)])
    }

    fn served_slot(adapters: &AdapterRegistry, id: &str) -> Option<u64> {
        adapters.get(id).map(|adapter| adapter.namespace)
    }

    /// Reserves and commits `id`, evictable, returning the slot and what it evicted.
    fn load(adapters: &AdapterRegistry, id: &str) -> Result<(u64, Option<String>), AdapterChange> {
        let Reservation { slot, evicted } = adapters.reserve(id, false, Residency::Evictable)?;
        adapters.commit(id, slot);
        Ok((slot, evicted.map(|adapter| adapter.id)))
    }

    #[test]
    fn startup_adapters_are_served_in_their_slots() {
        let adapters = registry();
        assert_eq!(adapters.ids(), ["sql", "chat"]);
        assert_eq!(served_slot(&adapters, "chat"), Some(2));
        assert_eq!(adapters.get("chat").unwrap(), AdapterRef::new("chat", 2));
        assert_eq!(adapters.get("other"), None);
    }

    #[test]
    fn a_slot_is_never_given_twice_even_after_an_unload() {
        let adapters = registry();
        let Reservation { slot, evicted } = adapters.reserve("math", false, Residency::Pinned).unwrap();
        assert_eq!((slot, evicted), (3, None));
        // Not served until the shard installed it.
        assert_eq!(adapters.get("math"), None);
        let (held, replaced) = adapters.commit("math", slot);
        assert_eq!((held.namespace, replaced), (3, None));
        assert_eq!(served_slot(&adapters, "math"), Some(3));
        assert_eq!(adapters.remove("math").unwrap().namespace, 3);
        assert_eq!(adapters.get("math"), None);
        assert_eq!(adapters.remove("math"), Err(AdapterChange::NotFound("math".to_string())));
        // Loaded again: a new slot, the old one still named for the blocks it left.
        let again = adapters.reserve("math", false, Residency::Pinned).unwrap().slot;
        assert_eq!(again, 4);
        adapters.commit("math", again);
        assert_eq!(adapters.name_of(3).as_deref(), Some("math"));
        assert_eq!(adapters.ids(), ["sql", "chat", "math"]);
    }

    #[test]
    fn a_load_of_an_id_served_or_being_loaded_is_refused_unless_it_replaces() {
        let adapters = registry();
        assert_eq!(adapters.reserve("sql", false, Residency::Pinned), Err(AdapterChange::AlreadyLoaded("sql".to_string())));
        let slot = adapters.reserve("sql", true, Residency::Pinned).unwrap().slot;
        assert_eq!(adapters.reserve("sql", true, Residency::Pinned), Err(AdapterChange::Loading("sql".to_string())));
        // Served from its old slot until the new one is installed, then replaced in place.
        assert_eq!(served_slot(&adapters, "sql"), Some(1));
        let (_, replaced) = adapters.commit("sql", slot);
        assert_eq!(replaced.unwrap().namespace, 1);
        assert_eq!(served_slot(&adapters, "sql"), Some(slot));
        assert_eq!(adapters.ids(), ["sql", "chat"]);
        // A failed load gives the id back.
        let slot = adapters.reserve("math", false, Residency::Pinned).unwrap().slot;
        adapters.abandon("math");
        assert_eq!(adapters.get("math"), None);
        assert!(adapters.reserve("math", false, Residency::Pinned).unwrap().slot > slot);
    }

    #[test]
    fn past_max_loras_the_least_recently_named_idle_resolved_adapter_makes_room() {
        // `sql` is pinned (a start-up adapter); two more fit under --max-loras 3.
        let adapters = AdapterRegistry::bounded([("sql".to_string(), 1)], Some(3));
        assert_eq!(load(&adapters, "a").unwrap().1, None);
        assert_eq!(load(&adapters, "b").unwrap().1, None);
        // `a` named after `b`: `b` is the least recently named, and goes.
        drop(adapters.get("b"));
        drop(adapters.get("a"));
        drop(adapters.get("sql"));
        assert_eq!(load(&adapters, "c").unwrap().1.as_deref(), Some("b"));
        assert_eq!(adapters.ids(), ["sql", "a", "c"]);
        // A request holding `a` keeps it: `c` goes, though named later.
        let held = adapters.get("a").unwrap();
        drop(adapters.get("c"));
        assert_eq!(load(&adapters, "b").unwrap().1.as_deref(), Some("c"));
        // Requests hold every evictable one: the load waits (Busy), and nothing changed.
        let held_b = adapters.get("b").unwrap();
        let clone_of_a = held.clone();
        drop(held);
        assert_eq!(adapters.reserve("d", false, Residency::Evictable), Err(AdapterChange::Busy(3)));
        assert_eq!(adapters.ids(), ["sql", "a", "b"]);
        // Once the last reference to `a` is dropped, it is idle again.
        drop(clone_of_a);
        assert_eq!(load(&adapters, "d").unwrap().1.as_deref(), Some("a"));
        drop(held_b);
        // A replacement takes no more room: nothing is evicted for it.
        let Reservation { evicted, .. } = adapters.reserve("b", true, Residency::Evictable).unwrap();
        assert_eq!(evicted, None);
        // Ids being loaded count: with `b`'s replacement loading, `e` and `f` each evict one.
        assert_eq!(adapters.reserve("e", false, Residency::Evictable).unwrap().evicted.map(|adapter| adapter.id).as_deref(), Some("b"));
        assert_eq!(adapters.reserve("f", false, Residency::Evictable).unwrap().evicted.map(|adapter| adapter.id).as_deref(), Some("d"));
        assert_eq!(adapters.ids(), ["sql"]);
        assert_eq!(adapters.reserve("g", false, Residency::Evictable), Err(AdapterChange::Full(3)));
    }

    #[test]
    fn pinned_adapters_are_never_evicted() {
        let adapters = AdapterRegistry::bounded([("sql".to_string(), 1)], Some(2));
        let slot = adapters.reserve("chat", false, Residency::Pinned).unwrap().slot;
        adapters.commit("chat", slot);
        // Both idle, both pinned: a load past the bound is refused, whatever its own residency.
        assert_eq!(adapters.reserve("math", false, Residency::Evictable), Err(AdapterChange::Full(2)));
        assert_eq!(adapters.reserve("math", false, Residency::Pinned), Err(AdapterChange::Full(2)));
        // Unloading one makes room.
        adapters.remove("chat").unwrap();
        assert_eq!(adapters.reserve("math", false, Residency::Evictable).unwrap().evicted, None);
        // Without a bound nothing is ever evicted.
        let unbounded = registry();
        for id in ["a", "b", "c", "d"] {
            assert_eq!(load(&unbounded, id).unwrap().1, None);
        }
        assert_eq!(unbounded.count(), 6);
    }
}
