//! KV-cache events: every change to the set of device blocks a prompt lookup can find, in the
//! order the device pool made it. A consumer that applies them in order holds exactly the
//! prefix cache's findable set (the engine publishes them in vLLM's format for KV-aware
//! routers).
//!
//! Only the device pool is a prefix cache: host blocks hold a rotated request's private KV and
//! no other request's lookup ever finds them, so they are never announced. A cached block
//! whose content is being copied out is not findable while the copy runs (`DevicePool::lookup`),
//! so it is announced removed when the copy starts and stored again at acknowledgement.

/// One change to the findable set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvCacheEvent {
    /// Full blocks that became findable, a chain: each block's parent is the one before it, the
    /// first's is `parent` (`None`: the first block of a prompt). `token_ids` holds every block's
    /// tokens, one block size each.
    Stored { block_hashes: Vec<u64>, parent: Option<u64>, token_ids: Vec<u32>, kv_namespace: u64 },
    /// Blocks no longer findable (evicted, or their content is being copied out).
    Removed { block_hashes: Vec<u64> },
    /// Nothing is findable any more (the shard restarted empty).
    AllCleared,
}

/// The events not yet taken, recorded only once enabled (nobody drains them otherwise).
#[derive(Debug, Default)]
pub(crate) struct EventLog {
    enabled: bool,
    events: Vec<KvCacheEvent>,
}

impl EventLog {
    pub(crate) fn enable(&mut self) {
        self.enabled = true;
    }

    pub(crate) fn take(&mut self) -> Vec<KvCacheEvent> {
        std::mem::take(&mut self.events)
    }

    /// One block became findable; it extends the previous event when that one ends in its parent.
    pub(crate) fn stored(&mut self, hash: u64, parent: Option<u64>, tokens: &[u32], kv_namespace: u64) {
        if !self.enabled {
            return;
        }
        if let Some(KvCacheEvent::Stored { block_hashes, token_ids, kv_namespace: namespace, .. }) =
            self.events.last_mut()
        {
            if *namespace == kv_namespace && parent.is_some() && block_hashes.last().copied() == parent {
                block_hashes.push(hash);
                token_ids.extend_from_slice(tokens);
                return;
            }
        }
        self.events.push(KvCacheEvent::Stored {
            block_hashes: vec![hash],
            parent,
            token_ids: tokens.to_vec(),
            kv_namespace,
        });
    }

    pub(crate) fn removed(&mut self, hash: u64) {
        if !self.enabled {
            return;
        }
        if let Some(KvCacheEvent::Removed { block_hashes }) = self.events.last_mut() {
            block_hashes.push(hash);
            return;
        }
        self.events.push(KvCacheEvent::Removed { block_hashes: vec![hash] });
    }

    pub(crate) fn cleared(&mut self) {
        if self.enabled {
            self.events.push(KvCacheEvent::AllCleared);
        }
    }
}
