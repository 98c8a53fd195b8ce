//! The single owner of every KV block: per-request block tables over both pools, and the
//! transfers in flight between them.
//!
//! Ownership: a device block's reference count equals the number of tables naming it plus one
//! while an unacknowledged transfer out reads it; a host block belongs to one table or to one
//! unacknowledged transfer in. Freeing is therefore always "drop a reference", and a block whose
//! copy is in flight cannot be allocated because its transfer still holds it.
//!
//! Prefix sharing under rotation: rotating out moves only the request's *private* device blocks
//! (reference count 1). Blocks shared with other requests stay on device, still referenced by
//! the rotated request's table: moving them would free nothing (the others keep them) and
//! would cost bandwidth twice. Rotating in brings back exactly the host slots.
//!
//! Host mirrors: a block whose positions were all computed when it last went out never changes
//! again (KV is append-only), so when it comes back its host block stays with the table as a
//! mirror — an identical copy. The next rotation out flips a mirrored slot back to its host
//! block without copying; only the blocks written since (the last, partly filled one and any
//! new ones) cross the link. A rotation round trip of a decoding request therefore copies the
//! whole table in but about one block out. Mirrors are a cache: they count as free host
//! blocks and are given up whenever a copy out needs room (`take_host_block`).

use std::collections::BTreeMap;

use super::device_pool::DevicePool;
use super::events::KvCacheEvent;
use super::host_pool::HostPool;
use super::prefix_hash::{chain_root, extend_chain};
use crate::cost_model::Direction;

/// Where one block-sized span of a request's KV lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Slot {
    Device(u32),
    Host(u32),
}

/// Result of looking a prompt up in the prefix cache without taking anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct PrefixProbe {
    pub(crate) hit_blocks: u32,
    /// Hits that are currently free (cached, unreferenced): taking them uses up free blocks.
    pub(crate) hits_on_free: u32,
}

/// An acknowledged transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TransferDone {
    pub(crate) request: u64,
    pub(crate) direction: Direction,
}

#[derive(Debug, Default)]
pub(super) struct Table {
    pub(super) slots: Vec<Slot>,
    /// Prefix-hash chain of the request's full blocks computed so far, from `root`.
    pub(super) hashes: Vec<u64>,
    /// The chain's start: the request's KV namespace (`prefix_hash::chain_root`).
    pub(super) root: u64,
    /// That namespace (0: the base model), named in the prefix cache's events.
    pub(super) namespace: u64,
    /// Slot index → host block holding an identical copy of that device slot's KV.
    pub(super) mirrors: BTreeMap<usize, u32>,
    /// Leading slots whose positions were all computed at the last transfer out: they come
    /// back as mirrored slots.
    pub(super) sealed: usize,
}

#[derive(Debug)]
pub(super) struct InFlight {
    pub(super) request: u64,
    pub(super) direction: Direction,
    /// Out: every device block freed at acknowledgement (copied or mirrored); In: the
    /// destinations.
    pub(super) device_blocks: Vec<u32>,
    /// Out: the copies' destinations; In: the sources.
    pub(super) host_blocks: Vec<u32>,
    /// In: the sources kept as mirrors at acknowledgement, by slot index.
    pub(super) keep_as_mirror: Vec<(usize, u32)>,
    /// In: sources a transfer out issued before this acknowledgement took as the table's host
    /// slots (the request left again in the step that brought it back): the table owns them.
    pub(super) taken_by_table: Vec<u32>,
}

#[derive(Debug)]
pub(crate) struct BlockManager {
    pub(super) block_size: u32,
    pub(super) prefix_caching: bool,
    pub(super) device: DevicePool,
    pub(super) host: HostPool,
    pub(super) tables: BTreeMap<u64, Table>,
    pub(super) transfers: BTreeMap<u64, InFlight>,
    pub(super) next_transfer_id: u64,
    /// Host mirrors across all tables.
    pub(super) mirrored: u32,
}

impl BlockManager {
    pub(crate) fn new(block_size: u32, device_blocks: u32, host_blocks: u32, prefix_caching: bool) -> Self {
        BlockManager {
            block_size,
            prefix_caching,
            device: DevicePool::new(device_blocks),
            host: HostPool::new(host_blocks),
            tables: BTreeMap::new(),
            transfers: BTreeMap::new(),
            next_transfer_id: 1,
            mirrored: 0,
        }
    }

    pub(crate) fn block_size(&self) -> u32 {
        self.block_size
    }

    /// Records every change to the prefix cache's findable set from now on (`take_kv_events`).
    pub(crate) fn enable_kv_events(&mut self) {
        self.device.enable_events();
    }

    /// The changes recorded since the previous call, in order.
    pub(crate) fn take_kv_events(&mut self) -> Vec<KvCacheEvent> {
        self.device.take_events()
    }

    /// Forgets every table and transfer and frees every block (the shard restarted empty);
    /// the event log goes on, with everything cleared.
    pub(crate) fn clear(&mut self) {
        self.device = self.device.cleared();
        self.host = HostPool::new(self.host.num_blocks());
        self.tables.clear();
        self.transfers.clear();
        self.next_transfer_id = 1;
        self.mirrored = 0;
    }

    /// KV `namespace` is served no more (`DevicePool::retire`); returns the blocks forgotten.
    pub(crate) fn retire_namespace(&mut self, namespace: u64) -> u32 {
        self.device.retire(namespace)
    }

    /// The hashes a prompt lookup can find now.
    #[cfg(test)]
    pub(crate) fn findable_prefixes(&self) -> std::collections::BTreeSet<u64> {
        self.device.findable()
    }

    /// Blocks needed to hold `tokens` positions.
    pub(crate) fn blocks_for(&self, tokens: u64) -> u64 {
        tokens.div_ceil(u64::from(self.block_size))
    }

    pub(crate) fn num_device_blocks(&self) -> u32 {
        self.device.num_blocks()
    }

    pub(crate) fn num_host_blocks(&self) -> u32 {
        self.host.num_blocks()
    }

    pub(crate) fn free_device(&self) -> u32 {
        self.device.num_free()
    }

    pub(crate) fn free_device_cached(&self) -> u32 {
        self.device.num_free_cached()
    }

    /// Host blocks a transfer out can take: the free ones and the mirrors it may give up.
    pub(crate) fn free_host(&self) -> u32 {
        self.host.num_free() + self.mirrored
    }

    /// Host mirrors held (included in `free_host`).
    pub(crate) fn host_mirrors(&self) -> u32 {
        self.mirrored
    }

    pub(crate) fn device_in_flight(&self) -> u32 {
        self.device.num_in_flight()
    }

    pub(crate) fn has_table(&self, id: u64) -> bool {
        self.tables.contains_key(&id)
    }

    pub(crate) fn slots(&self, id: u64) -> &[Slot] {
        self.tables.get(&id).map_or(&[], |t| &t.slots)
    }

    /// Device blocks that become free once every in-flight transfer out is acknowledged.
    pub(crate) fn pending_release(&self) -> u32 {
        let out = self.transfers.values().filter(|t| t.direction == Direction::Out);
        out.flat_map(|t| &t.device_blocks).filter(|b| self.device.ref_count(**b) == 1).count() as u32
    }

    pub(crate) fn has_transfer_for(&self, id: u64) -> bool {
        self.transfers.values().any(|t| t.request == id)
    }

    /// How much of `tokens` the cache holds for KV namespace `namespace` (a LoRA adapter; 0:
    /// the base model). At least one token is always left to compute (the shard must run the
    /// last position to sample), so only full blocks of `tokens[..len-1]` count.
    pub(crate) fn probe_prefix(&self, namespace: u64, tokens: &[u32]) -> PrefixProbe {
        let mut probe = PrefixProbe::default();
        if !self.prefix_caching || tokens.is_empty() {
            return probe;
        }
        let root = chain_root(namespace);
        let mut hashes = Vec::new();
        extend_chain(&mut hashes, root, tokens, tokens.len() - 1, self.block_size as usize);
        for block in self.matching_blocks(root, tokens, &hashes) {
            probe.hit_blocks += 1;
            probe.hits_on_free += u32::from(self.device.is_free(block));
        }
        probe
    }

    fn matching_blocks(&self, root: u64, tokens: &[u32], hashes: &[u64]) -> Vec<u32> {
        let bs = self.block_size as usize;
        let mut blocks = Vec::new();
        for (i, hash) in hashes.iter().enumerate() {
            let parent = if i == 0 { root } else { hashes[i - 1] };
            match self.device.lookup(*hash, parent, &tokens[i * bs..(i + 1) * bs]) {
                Some(block) => blocks.push(block),
                None => break,
            }
        }
        blocks
    }

    /// New device blocks an admission with this probe's cached prefix takes to hold
    /// `total_tokens` positions (cached blocks sitting free are taken back from the free list).
    pub(crate) fn new_blocks_to_admit(&self, probe: &PrefixProbe, total_tokens: u64) -> u64 {
        self.blocks_for(total_tokens) - u64::from(probe.hit_blocks) + u64::from(probe.hits_on_free)
    }

    /// Creates the request's table from its cached prefix in `namespace`; returns the tokens it
    /// covers.
    pub(crate) fn acquire_prefix(&mut self, id: u64, namespace: u64, tokens: &[u32]) -> u32 {
        let mut table = Table { root: chain_root(namespace), namespace, ..Table::default() };
        if self.prefix_caching && !tokens.is_empty() {
            extend_chain(&mut table.hashes, table.root, tokens, tokens.len() - 1, self.block_size as usize);
            let hits = self.matching_blocks(table.root, tokens, &table.hashes);
            for block in &hits {
                self.device.incref(*block);
            }
            table.hashes.truncate(hits.len());
            table.slots = hits.into_iter().map(Slot::Device).collect();
        }
        let covered = table.slots.len() as u32 * self.block_size;
        self.tables.insert(id, table);
        covered
    }

    /// New device blocks the table needs to cover `total_tokens` positions.
    pub(crate) fn new_blocks_needed(&self, id: u64, total_tokens: u64) -> u64 {
        let have = self.slots(id).len() as u64;
        self.blocks_for(total_tokens).saturating_sub(have)
    }

    /// Extends the table with device blocks to cover `total_tokens` positions; all or nothing.
    pub(crate) fn grow(&mut self, id: u64, total_tokens: u64) -> bool {
        let needed = self.new_blocks_needed(id, total_tokens);
        if needed > u64::from(self.device.num_free()) {
            return false;
        }
        let Some(table) = self.tables.get_mut(&id) else { return false };
        for _ in 0..needed {
            match self.device.allocate() {
                Some(block) => table.slots.push(Slot::Device(block)),
                None => return false,
            }
        }
        true
    }

    /// The table as device block ids; `None` if any span is on host.
    pub(crate) fn device_table(&self, id: u64) -> Option<Vec<u32>> {
        let slots = self.slots(id);
        slots.iter().map(|s| if let Slot::Device(b) = s { Some(*b) } else { None }).collect()
    }

    /// Publishes the request's full blocks among its first `scheduled` positions to the prefix
    /// cache, once a step that writes their KV is planned: whoever takes them runs in that step
    /// or a later one, and the shard writes a step's K/V before it reads any (see
    /// `Core::push_entry`). A step that fails loses them all: recovery rebuilds the scheduler.
    pub(crate) fn register_scheduled(&mut self, id: u64, tokens: &[u32], scheduled: u32) {
        if !self.prefix_caching {
            return;
        }
        let Some(table) = self.tables.get_mut(&id) else { return };
        let bs = self.block_size as usize;
        let limit = (scheduled as usize).min(table.slots.len() * bs);
        let before = table.hashes.len();
        extend_chain(&mut table.hashes, table.root, tokens, limit, bs);
        for i in before..table.hashes.len() {
            if let Slot::Device(block) = table.slots[i] {
                let parent = if i == 0 { table.root } else { table.hashes[i - 1] };
                self.device.register(block, table.hashes[i], parent, table.namespace, &tokens[i * bs..(i + 1) * bs]);
            }
        }
    }

    /// Drops the request's table: device references are released, host blocks freed. The
    /// caller must not release a request with a transfer in flight (its destinations are
    /// still being written).
    pub(crate) fn release(&mut self, id: u64) {
        let Some(table) = self.tables.remove(&id) else { return };
        for slot in table.slots {
            match slot {
                Slot::Device(block) => self.device.decref(block),
                Slot::Host(block) => self.host.release(block),
            }
        }
        self.mirrored -= table.mirrors.len() as u32;
        for block in table.mirrors.into_values() {
            self.host.release(block);
        }
    }

    /// Device blocks rotating this request out would move (and eventually free).
    pub(crate) fn private_device_blocks(&self, id: u64) -> u32 {
        let private = |s: &&Slot| matches!(s, Slot::Device(b) if self.device.ref_count(*b) == 1);
        self.slots(id).iter().filter(private).count() as u32
    }

    /// Of those, the blocks a rotation out copies: the ones the host holds no mirror of.
    pub(crate) fn blocks_to_copy_out(&self, id: u64) -> u32 {
        let Some(table) = self.tables.get(&id) else { return 0 };
        let copied = |(i, s): &(usize, &Slot)| {
            matches!(s, Slot::Device(b) if self.device.ref_count(*b) == 1) && self.mirror_of(id, table, *i).is_none()
        };
        table.slots.iter().enumerate().filter(copied).count() as u32
    }

    /// The host block holding an identical copy of slot `i`: a mirror, or the source of a copy
    /// in still in flight that will become one (`true`).
    pub(super) fn mirror_of(&self, id: u64, table: &Table, i: usize) -> Option<(u32, bool)> {
        if let Some(block) = table.mirrors.get(&i) {
            return Some((*block, false));
        }
        let returning = self.transfers.values().filter(|t| t.request == id && t.direction == Direction::In);
        returning.flat_map(|t| &t.keep_as_mirror).find(|(slot, _)| *slot == i).map(|(_, block)| (*block, true))
    }

    /// Drops the request's mirrors of the slots holding `position` and after: that KV is about
    /// to be written again (a position recomputed after its token was lost).
    pub(crate) fn forget_mirrors_from(&mut self, id: u64, position: u32) {
        let Some(table) = self.tables.get_mut(&id) else { return };
        let first = (position / self.block_size) as usize;
        let dropped = table.mirrors.split_off(&first);
        table.sealed = table.sealed.min(first);
        // And those a copy in still in flight would leave.
        for transfer in self.transfers.values_mut().filter(|t| t.request == id && t.direction == Direction::In) {
            transfer.keep_as_mirror.retain(|(slot, _)| *slot < first);
        }
        self.mirrored -= dropped.len() as u32;
        for block in dropped.into_values() {
            self.host.release(block);
        }
    }

    /// A host block for a copy out: a free one, or else one a mirror gives up.
    pub(super) fn take_host_block(&mut self) -> Option<u32> {
        if let Some(block) = self.host.allocate() {
            return Some(block);
        }
        let table = self.tables.values_mut().find(|t| !t.mirrors.is_empty())?;
        let (_, block) = table.mirrors.pop_last()?;
        self.mirrored -= 1;
        Some(block)
    }

    pub(crate) fn host_slots(&self, id: u64) -> u32 {
        self.slots(id).iter().filter(|s| matches!(s, Slot::Host(_))).count() as u32
    }

    pub(super) fn take_transfer_id(&mut self) -> u64 {
        let id = self.next_transfer_id;
        self.next_transfer_id += 1;
        id
    }
}
