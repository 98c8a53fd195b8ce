//! Block-manager tests: sharing, transfers, in-flight protection, all-or-nothing growth.

use super::block_manager::{BlockManager, Slot};

fn device_ids(manager: &BlockManager, id: u64) -> Vec<Option<u32>> {
    let slot = |s: &Slot| if let Slot::Device(b) = s { Some(*b) } else { None };
    manager.slots(id).iter().map(slot).collect()
}

/// Computes `tokens` fully for `id` (table grown, full blocks published).
fn compute(manager: &mut BlockManager, id: u64, tokens: &[u32]) {
    manager.acquire_prefix(id, 0, tokens);
    assert!(manager.grow(id, tokens.len() as u64));
    manager.register_scheduled(id, tokens, tokens.len() as u32);
}

#[test]
fn rotation_moves_private_blocks_only_and_keeps_shared_prefix() {
    let mut m = BlockManager::new(4, 8, 8, true);
    let prompt: Vec<u32> = (0..10).collect();
    compute(&mut m, 1, &prompt);
    // Request 2 shares the two full blocks of request 1's prompt.
    let covered = m.acquire_prefix(2, 0, &prompt);
    assert_eq!(covered, 8);
    assert!(m.grow(2, 12));
    let shared = device_ids(&m, 2)[..2].to_vec();
    assert_eq!(m.private_device_blocks(2), 1);
    let out = m.transfer_out(2).expect("host has room");
    assert_eq!(out.src_blocks.len(), 1, "only the private block moves");
    assert_eq!(device_ids(&m, 2)[..2], shared[..], "shared blocks stay referenced on device");
    let free_before_ack = m.free_device();
    m.ack(out.id).expect("known transfer");
    assert_eq!(m.free_device(), free_before_ack + 1, "freed at acknowledgement, not before");
    let back = m.transfer_in(2).expect("device has room");
    assert_eq!(back.src_blocks, out.dst_blocks);
    m.ack(back.id).unwrap();
    assert_eq!(device_ids(&m, 2)[..2], shared[..]);
    m.check().unwrap();
    m.release(1);
    m.release(2);
    assert_eq!(m.free_device(), 8);
    assert_eq!(m.free_host(), 8);
    m.check().unwrap();
}

#[test]
fn transfer_out_sources_are_neither_allocatable_nor_prefix_hits() {
    let mut m = BlockManager::new(2, 4, 4, true);
    let tokens = vec![1, 2, 3, 4, 5];
    compute(&mut m, 1, &tokens);
    let out = m.transfer_out(1).unwrap();
    assert_eq!(out.src_blocks.len(), 3);
    assert_eq!(m.free_device(), 1);
    assert_eq!(m.probe_prefix(0, &tokens).hit_blocks, 0, "content being copied is not handed out");
    assert!(!m.grow(2, 4), "only one block is free; growth is all or nothing");
    assert!(m.slots(2).is_empty());
    m.ack(out.id).unwrap();
    assert_eq!(m.free_device(), 4);
    // After the ack the blocks are free but still hold their prefix.
    assert_eq!(m.probe_prefix(0, &tokens).hit_blocks, 2);
    assert!(m.ack(out.id).is_none(), "a repeated ack changes nothing");
    m.check().unwrap();
}

#[test]
fn prefix_caching_off_never_shares() {
    let mut m = BlockManager::new(4, 8, 0, false);
    let tokens: Vec<u32> = (0..9).collect();
    compute(&mut m, 1, &tokens);
    assert_eq!(m.acquire_prefix(2, 0, &tokens), 0);
    assert_eq!(m.transfer_out(1), None, "no host pool");
    m.check().unwrap();
}

#[test]
fn prefixes_are_shared_within_a_kv_namespace_only() {
    // The same prompt under two LoRA adapters (namespaces 1 and 2) and the base model (0):
    // its K/V differ, so each namespace finds only its own blocks.
    let mut m = BlockManager::new(4, 16, 0, true);
    let prompt: Vec<u32> = (0..9).collect();
    m.acquire_prefix(1, 1, &prompt);
    assert!(m.grow(1, prompt.len() as u64));
    m.register_scheduled(1, &prompt, prompt.len() as u32);
    assert_eq!(m.probe_prefix(1, &prompt).hit_blocks, 2);
    assert_eq!(m.probe_prefix(0, &prompt).hit_blocks, 0);
    assert_eq!(m.probe_prefix(2, &prompt).hit_blocks, 0);
    assert_eq!(m.acquire_prefix(2, 2, &prompt), 0);
    assert_eq!(m.acquire_prefix(3, 1, &prompt), 8);
    m.check().unwrap();
}
