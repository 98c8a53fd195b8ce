//! Transfers out and in, and their acknowledgement, over the block manager's tables.
//!
//! Table slots flip to their destination when a transfer is issued, and the transfer keeps the
//! source blocks referenced until the shard acknowledges the copy: a transfer out's device sources
//! stay allocated (and out of the prefix cache) so nobody writes them mid-copy; a transfer in's
//! host sources stay owned so no other transfer out overwrites them mid-copy.

use super::block_manager::{BlockManager, InFlight, Slot, TransferDone};
use crate::cost_model::Direction;
use crate::plan::Transfer;

impl BlockManager {
    /// Moves the request's private device blocks to host, `computed` positions of its KV written
    /// by the time the copy runs. Blocks the host holds a mirror of flip to it without a copy;
    /// the transfer copies the rest. Every moved device block stays held until acknowledgement
    /// (a compute ordered before the copy may still read it). `None` (and no change) when it has
    /// nothing private or the host pool lacks room.
    pub(crate) fn transfer_out(&mut self, id: u64, computed: u32) -> Option<Transfer> {
        let (private, mirrored) = self.out_slots(id)?;
        let mut released = Vec::new();
        // Mirrors first, so that a copy below giving up mirrors cannot take one of these.
        for (i, host_block, pending) in mirrored {
            if pending {
                // The copy in that read it hands it to the table instead of keeping it as a mirror.
                let returning = self.transfers.values_mut().filter(|t| t.request == id && t.direction == Direction::In);
                for transfer in returning {
                    if let Some(at) = transfer.keep_as_mirror.iter().position(|(slot, _)| *slot == i) {
                        transfer.keep_as_mirror.remove(at);
                        transfer.taken_by_table.push(host_block);
                    }
                }
            } else {
                self.mirrored -= 1;
            }
            let table = self.tables.get_mut(&id)?;
            table.mirrors.remove(&i);
            let Slot::Device(block) = table.slots[i] else { unreachable!("private slots are on device") };
            table.slots[i] = Slot::Host(host_block);
            released.push(block);
        }
        let (mut src, mut dst) = (Vec::new(), Vec::new());
        for &i in &private {
            let Some(Slot::Device(block)) = self.tables.get(&id).map(|t| t.slots[i]) else { continue };
            let host_block = self.take_host_block()?;
            self.tables.get_mut(&id)?.slots[i] = Slot::Host(host_block);
            released.push(block);
            src.push(block);
            dst.push(host_block);
        }
        self.tables.get_mut(&id)?.sealed = (computed / self.block_size) as usize;
        for block in &released {
            // The table's reference passes to the transfer; released at acknowledgement.
            self.device.set_in_flight(*block, true);
        }
        let transfer_id = self.take_transfer_id();
        let in_flight = InFlight {
            request: id,
            direction: Direction::Out,
            device_blocks: released,
            host_blocks: dst.clone(),
            keep_as_mirror: Vec::new(),
            taken_by_table: Vec::new(),
        };
        self.transfers.insert(transfer_id, in_flight);
        Some(Transfer { id: transfer_id, request_id: id, src_blocks: src, dst_blocks: dst })
    }

    /// Whether `transfer_out` would issue a transfer now (the request has private device blocks
    /// and the host room for those it must copy).
    pub(crate) fn can_transfer_out(&self, id: u64) -> bool {
        self.out_slots(id).is_some()
    }

    /// A transfer out's slots: the private ones, and of those the ones a host block already
    /// mirrors (slot, host block, pending: the source of a copy in still in flight). `None` when
    /// nothing is private or the host lacks room for the copies.
    fn out_slots(&self, id: u64) -> Option<(Vec<usize>, Vec<(usize, u32, bool)>)> {
        let table = self.tables.get(&id)?;
        let private: Vec<usize> = table
            .slots
            .iter()
            .enumerate()
            .filter(|(_, s)| matches!(s, Slot::Device(b) if self.device.ref_count(*b) == 1))
            .map(|(i, _)| i)
            .collect();
        let mirrored: Vec<(usize, u32, bool)> =
            private.iter().filter_map(|&i| self.mirror_of(id, table, i).map(|(b, pending)| (i, b, pending))).collect();
        let to_copy = (private.len() - mirrored.len()) as u32;
        // Its own settled mirrors are used, not given up, so they are no room for the copies.
        let own_settled = mirrored.iter().filter(|(_, _, pending)| !pending).count() as u32;
        if private.is_empty() || to_copy > self.host.num_free() + self.mirrored - own_settled {
            return None;
        }
        Some((private, mirrored))
    }

    /// Brings the request's host blocks back into fresh device blocks; those sealed at the
    /// transfer out stay on host as mirrors once the copy is acknowledged. `None` (and no
    /// change) when it has nothing on host or the device pool lacks room.
    pub(crate) fn transfer_in(&mut self, id: u64) -> Option<Transfer> {
        let moved = self.host_slots(id);
        if moved == 0 || moved > self.device.num_free() {
            return None;
        }
        let table = self.tables.get_mut(&id)?;
        let (mut src, mut dst, mut keep) = (Vec::new(), Vec::new(), Vec::new());
        for (i, slot) in table.slots.iter_mut().enumerate() {
            let Slot::Host(host_block) = *slot else { continue };
            let block = self.device.allocate()?;
            *slot = Slot::Device(block);
            src.push(host_block);
            dst.push(block);
            if i < table.sealed {
                keep.push((i, host_block));
            }
        }
        let transfer_id = self.take_transfer_id();
        let in_flight = InFlight {
            request: id,
            direction: Direction::In,
            device_blocks: dst.clone(),
            host_blocks: src.clone(),
            keep_as_mirror: keep,
            taken_by_table: Vec::new(),
        };
        self.transfers.insert(transfer_id, in_flight);
        Some(Transfer { id: transfer_id, request_id: id, src_blocks: src, dst_blocks: dst })
    }

    /// Applies the shard's acknowledgement; unknown or repeated ids are ignored.
    pub(crate) fn ack(&mut self, transfer_id: u64) -> Option<TransferDone> {
        let done = self.transfers.remove(&transfer_id)?;
        match done.direction {
            Direction::Out => {
                for block in &done.device_blocks {
                    self.device.set_in_flight(*block, false);
                    self.device.decref(*block);
                }
            }
            Direction::In => {
                let mut kept = done.taken_by_table.clone();
                if let Some(table) = self.tables.get_mut(&done.request) {
                    for &(i, block) in &done.keep_as_mirror {
                        if matches!(table.slots.get(i), Some(Slot::Device(_))) {
                            table.mirrors.insert(i, block);
                            self.mirrored += 1;
                            kept.push(block);
                        }
                    }
                }
                for block in &done.host_blocks {
                    if !kept.contains(block) {
                        self.host.release(*block);
                    }
                }
            }
        }
        Some(TransferDone { request: done.request, direction: done.direction })
    }

    /// Whether `block` is being written or read by an unacknowledged transfer (a transfer out's
    /// source or a transfer in's destination).
    #[cfg(test)]
    pub(crate) fn device_block_busy(&self, block: u32) -> bool {
        self.device.is_in_flight(block)
            || self.transfers.values().any(|t| {
                t.direction == Direction::In && t.device_blocks.contains(&block)
            })
    }

    /// Every ownership invariant: reference counts equal table mentions plus transfer-out holds,
    /// no host block has two owners, nothing owned is free, nothing is leaked.
    pub(crate) fn check(&self) -> Result<(), String> {
        self.device.check()?;
        let mut device_refs = vec![0u32; self.device.num_blocks() as usize];
        let mut host_owner: Vec<Option<String>> = vec![None; self.host.num_blocks() as usize];
        let mut claim_host = |block: u32, owner: String| -> Result<(), String> {
            let entry = host_owner
                .get_mut(block as usize)
                .ok_or_else(|| format!("host block {block} out of range"))?;
            if let Some(previous) = entry {
                return Err(format!("host block {block} owned by {previous} and {owner}"));
            }
            *entry = Some(owner);
            Ok(())
        };
        for (id, table) in &self.tables {
            for slot in &table.slots {
                match slot {
                    Slot::Device(b) => *device_refs
                        .get_mut(*b as usize)
                        .ok_or_else(|| format!("device block {b} out of range"))? += 1,
                    Slot::Host(b) => claim_host(*b, format!("request {id}"))?,
                }
            }
            for (i, b) in &table.mirrors {
                if !matches!(table.slots.get(*i), Some(Slot::Device(_))) {
                    return Err(format!("request {id}: mirror of slot {i}, which is not on device"));
                }
                claim_host(*b, format!("request {id}'s mirror"))?;
            }
        }
        let mirrors: usize = self.tables.values().map(|t| t.mirrors.len()).sum();
        if mirrors != self.mirrored as usize {
            return Err(format!("{mirrors} mirrors held, {} counted", self.mirrored));
        }
        for (tid, transfer) in &self.transfers {
            match transfer.direction {
                Direction::Out => {
                    for b in &transfer.device_blocks {
                        device_refs[*b as usize] += 1;
                        if !self.device.is_in_flight(*b) {
                            return Err(format!("transfer out {tid} source {b} not marked in flight"));
                        }
                    }
                }
                Direction::In => {
                    // Sources a later transfer out handed to the table are the table's.
                    for b in transfer.host_blocks.iter().filter(|b| !transfer.taken_by_table.contains(b)) {
                        claim_host(*b, format!("transfer in {tid}"))?;
                    }
                }
            }
        }
        for (block, expected) in device_refs.iter().enumerate() {
            let actual = self.device.ref_count(block as u32);
            if actual != *expected {
                return Err(format!("device block {block}: refcount {actual}, owners {expected}"));
            }
        }
        for (block, owner) in host_owner.iter().enumerate() {
            if owner.is_some() == self.host.is_free(block as u32) {
                return Err(format!("host block {block}: owner {owner:?} vs free list disagree"));
            }
        }
        if self.device.num_in_flight() as usize
            != self.transfers.values().filter(|t| t.direction == Direction::Out).map(|t| t.device_blocks.len()).sum::<usize>()
        {
            return Err("in-flight device marks disagree with transfers out".into());
        }
        Ok(())
    }
}
