//! Host KV blocks. Each belongs to exactly one request (host copies are never shared), so a
//! free list is all the state there is.

use std::collections::BTreeSet;

#[derive(Debug)]
pub(crate) struct HostPool {
    num_blocks: u32,
    free: BTreeSet<u32>,
}

impl HostPool {
    pub(crate) fn new(num_blocks: u32) -> Self {
        HostPool { num_blocks, free: (0..num_blocks).collect() }
    }

    pub(crate) fn num_blocks(&self) -> u32 {
        self.num_blocks
    }

    pub(crate) fn num_free(&self) -> u32 {
        self.free.len() as u32
    }

    pub(crate) fn allocate(&mut self) -> Option<u32> {
        self.free.pop_first()
    }

    pub(crate) fn release(&mut self, block: u32) {
        let fresh = self.free.insert(block);
        debug_assert!(fresh, "host block {block} released twice");
    }

    pub(crate) fn is_free(&self, block: u32) -> bool {
        self.free.contains(&block)
    }
}
