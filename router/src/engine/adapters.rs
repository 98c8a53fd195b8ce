//! The LoRA adapters the server serves, by the ids requests name them with, and their slots.
//! The shard's `Info` gives those of `--lora-adapters` (slot k + 1 for the k-th); adapters
//! loaded later (`/v1/load_lora_adapter`) get the next slot after the largest ever given, so a
//! slot names one adapter for the server's whole life. The slot is the adapter's KV namespace
//! too: prefix-cache blocks of an adapter unloaded and loaded again (perhaps other weights under
//! the same id) are never reused.
//!
//! Loading is two-phase: `reserve` takes the id and a slot (a second load of the same id waits
//! for no one: it is refused), `commit` makes it visible to requests once the shard installed
//! it, `abandon` gives the id back when it could not. `remove` takes an id away from new
//! requests at once; the engine unloads the slot from the shard once no request it holds uses it.
use std::collections::{HashMap, HashSet};
use std::sync::RwLock;

use super::api::AdapterRef;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdapterChange {
    #[error("The lora adapter '{0}' has already been loaded.")]
    AlreadyLoaded(String),
    #[error("The lora adapter '{0}' is being loaded.")]
    Loading(String),
    #[error("The lora adapter '{0}' cannot be found.")]
    NotFound(String),
}

#[derive(Debug, Default)]
struct Registry {
    /// Served now, in the order they were loaded.
    loaded: Vec<AdapterRef>,
    /// Every slot ever given -> its id (for the KV events of blocks that outlive an unload).
    names: HashMap<u64, String>,
    /// Ids being loaded (reserved, not committed).
    loading: HashSet<String>,
    /// The largest slot given so far.
    last_slot: u64,
}

#[derive(Debug, Default)]
pub struct AdapterRegistry {
    state: RwLock<Registry>,
}

impl AdapterRegistry {
    /// The adapters the shard loaded at start: (id, slot).
    pub fn new(startup: impl IntoIterator<Item = (String, u64)>) -> Self {
        let mut registry = Registry::default();
        for (id, slot) in startup {
            registry.names.insert(slot, id.clone());
            registry.last_slot = registry.last_slot.max(slot);
            registry.loaded.push(AdapterRef { id, namespace: slot });
        }
        Self { state: RwLock::new(registry) }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Registry> {
        // A panic while holding the lock left consistent data (every change is one assignment).
        self.state.read().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Registry> {
        self.state.write().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The adapter served under `id`, if any.
    pub fn get(&self, id: &str) -> Option<AdapterRef> {
        self.read().loaded.iter().find(|adapter| adapter.id == id).cloned()
    }

    /// The ids served now, in the order they were loaded.
    pub fn ids(&self) -> Vec<String> {
        self.read().loaded.iter().map(|adapter| adapter.id.clone()).collect()
    }

    /// How many adapters are served now.
    pub fn count(&self) -> usize {
        self.read().loaded.len()
    }

    /// The id the adapter in `slot` has (or had).
    pub fn name_of(&self, slot: u64) -> Option<String> {
        self.read().names.get(&slot).cloned()
    }

    /// Takes `id` for a load and gives it a new slot. `replace`: an adapter served under `id`
    /// may be replaced (it stays served until `commit`).
    pub fn reserve(&self, id: &str, replace: bool) -> Result<u64, AdapterChange> {
        let mut registry = self.write();
        if registry.loading.contains(id) {
            return Err(AdapterChange::Loading(id.to_string()));
        }
        if !replace && registry.loaded.iter().any(|adapter| adapter.id == id) {
            return Err(AdapterChange::AlreadyLoaded(id.to_string()));
        }
        registry.loading.insert(id.to_string());
        registry.last_slot += 1;
        Ok(registry.last_slot)
    }

    /// `id`, reserved, is installed in `slot`: requests may name it. Returns the adapter it
    /// replaces, if one was served under `id`.
    pub fn commit(&self, id: &str, slot: u64) -> Option<AdapterRef> {
        let mut registry = self.write();
        registry.loading.remove(id);
        registry.names.insert(slot, id.to_string());
        let fresh = AdapterRef { id: id.to_string(), namespace: slot };
        match registry.loaded.iter_mut().find(|adapter| adapter.id == id) {
            Some(served) => Some(std::mem::replace(served, fresh)),
            None => {
                registry.loaded.push(fresh);
                None
            }
        }
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
            .position(|adapter| adapter.id == id)
            .ok_or_else(|| AdapterChange::NotFound(id.to_string()))?;
        Ok(registry.loaded.remove(position))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn registry() -> AdapterRegistry {
        AdapterRegistry::new([("sql".to_string(), 1), ("chat".to_string(), 2)])
    }

    #[test]
    fn startup_adapters_are_served_in_their_slots() {
        let adapters = registry();
        assert_eq!(adapters.ids(), ["sql", "chat"]);
        assert_eq!(adapters.get("chat"), Some(AdapterRef { id: "chat".to_string(), namespace: 2 }));
        assert_eq!(adapters.get("other"), None);
    }

    #[test]
    fn a_slot_is_never_given_twice_even_after_an_unload() {
        let adapters = registry();
        let slot = adapters.reserve("math", false).unwrap();
        assert_eq!(slot, 3);
        // Not served until the shard installed it.
        assert_eq!(adapters.get("math"), None);
        assert_eq!(adapters.commit("math", slot), None);
        assert_eq!(adapters.get("math").unwrap().namespace, 3);
        assert_eq!(adapters.remove("math").unwrap().namespace, 3);
        assert_eq!(adapters.get("math"), None);
        assert_eq!(adapters.remove("math"), Err(AdapterChange::NotFound("math".to_string())));
        // Loaded again: a new slot, the old one still named for the blocks it left.
        let again = adapters.reserve("math", false).unwrap();
        assert_eq!(again, 4);
        adapters.commit("math", again);
        assert_eq!(adapters.name_of(3).as_deref(), Some("math"));
        assert_eq!(adapters.ids(), ["sql", "chat", "math"]);
    }

    #[test]
    fn a_load_of_an_id_served_or_being_loaded_is_refused_unless_it_replaces() {
        let adapters = registry();
        assert_eq!(adapters.reserve("sql", false), Err(AdapterChange::AlreadyLoaded("sql".to_string())));
        let slot = adapters.reserve("sql", true).unwrap();
        assert_eq!(adapters.reserve("sql", true), Err(AdapterChange::Loading("sql".to_string())));
        // Served from its old slot until the new one is installed, then replaced in place.
        assert_eq!(adapters.get("sql").unwrap().namespace, 1);
        let replaced = adapters.commit("sql", slot).unwrap();
        assert_eq!(replaced.namespace, 1);
        assert_eq!(adapters.get("sql").unwrap().namespace, slot);
        assert_eq!(adapters.ids(), ["sql", "chat"]);
        // A failed load gives the id back.
        let slot = adapters.reserve("math", false).unwrap();
        adapters.abandon("math");
        assert_eq!(adapters.get("math"), None);
        assert!(adapters.reserve("math", false).unwrap() > slot);
    }
}
