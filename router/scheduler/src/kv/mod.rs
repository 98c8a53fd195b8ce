//! The two-tier KV block manager: which device block and which host block belongs to whom,
//! which blocks a transfer holds, and the prefix cache over full device blocks.
//!
//! - `device_pool`: device blocks — reference counts, LRU free list, prefix-cache registry.
//! - `host_pool`: host blocks — single-owner free list.
//! - `prefix_hash`: the hash chain that names a full block by its whole token prefix.
//! - `events`: the prefix cache's changes, recorded for KV-aware routers.
//! - `block_manager`: per-request block tables and in-flight transfers over both pools; the
//!   single owner of every block.

mod block_manager;
mod device_pool;
mod events;
mod host_pool;
mod prefix_hash;
mod transfers;

#[cfg(test)]
mod tests;

pub(crate) use block_manager::{BlockManager, Slot};
pub use events::KvCacheEvent;
