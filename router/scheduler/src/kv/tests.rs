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
    let out = m.transfer_out(2, 12).expect("host has room");
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
    let out = m.transfer_out(1, 5).unwrap();
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
    assert_eq!(m.transfer_out(1, 9), None, "no host pool");
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

/// Rotates `id` out and straight back (both acknowledged); returns (blocks copied out, blocks
/// copied in).
fn round_trip(m: &mut BlockManager, id: u64, computed: u32) -> (usize, usize) {
    let out = m.transfer_out(id, computed).expect("host has room");
    m.ack(out.id).unwrap();
    m.check().unwrap();
    let back = m.transfer_in(id).expect("device has room");
    m.ack(back.id).unwrap();
    m.check().unwrap();
    (out.src_blocks.len(), back.src_blocks.len())
}

#[test]
fn a_returned_request_keeps_host_mirrors_of_its_sealed_blocks_and_copies_only_the_rest_out() {
    let mut m = BlockManager::new(4, 8, 8, false);
    compute(&mut m, 1, &(0..10).collect::<Vec<u32>>()); // 3 blocks, 2 full
    assert_eq!(round_trip(&mut m, 1, 10), (3, 3));
    assert_eq!(m.host_mirrors(), 2, "the two full blocks stay on host");
    assert_eq!(m.free_host(), 8, "mirrors count as free host blocks");
    assert_eq!(m.blocks_to_copy_out(1), 1);
    // Decodes write positions 10..13: block 2 fills, block 3 is new.
    assert!(m.grow(1, 13));
    assert_eq!(m.blocks_to_copy_out(1), 2);
    let out = m.transfer_out(1, 13).unwrap();
    assert_eq!(out.src_blocks.len(), 2, "only the blocks written since cross the link");
    assert_eq!(m.host_mirrors(), 0, "the mirrors became the request's host slots");
    let freed_at_ack = m.free_device() + 4;
    m.ack(out.id).unwrap();
    assert_eq!(m.free_device(), freed_at_ack, "mirrored device blocks are freed at the acknowledgement too");
    let back = m.transfer_in(1).unwrap();
    assert_eq!(back.src_blocks.len(), 4, "a return copies the whole table");
    m.ack(back.id).unwrap();
    assert_eq!(m.host_mirrors(), 3, "13 positions seal three blocks");
    m.release(1);
    assert_eq!((m.free_device(), m.free_host(), m.host_mirrors()), (8, 8, 0));
    m.check().unwrap();
}

#[test]
fn mirrors_are_held_only_after_the_copy_in_lands() {
    let mut m = BlockManager::new(4, 8, 8, false);
    compute(&mut m, 1, &(0..8).collect::<Vec<u32>>());
    let out = m.transfer_out(1, 8).unwrap();
    m.ack(out.id).unwrap();
    let back = m.transfer_in(1).unwrap();
    assert_eq!(m.host_mirrors(), 0, "the sources are the transfer's until acknowledged");
    assert_eq!(m.free_host(), 6);
    m.check().unwrap();
    m.ack(back.id).unwrap();
    assert_eq!((m.host_mirrors(), m.free_host()), (2, 8));
    m.check().unwrap();
}

#[test]
fn a_copy_out_short_of_free_host_blocks_takes_another_requests_mirrors() {
    let mut m = BlockManager::new(4, 8, 4, false);
    compute(&mut m, 1, &(0..8).collect::<Vec<u32>>());
    round_trip(&mut m, 1, 8);
    assert_eq!(m.host_mirrors(), 2);
    compute(&mut m, 2, &(0..16).collect::<Vec<u32>>()[..12]);
    // Request 2 needs 3 host blocks: 2 free and one of request 1's mirrors.
    assert_eq!(m.free_host(), 4);
    let out = m.transfer_out(2, 12).expect("mirrors give way");
    assert_eq!(out.src_blocks.len(), 3);
    assert_eq!(m.host_mirrors(), 1);
    m.check().unwrap();
    m.ack(out.id).unwrap();
    // Request 1 would now copy the block whose mirror went and reuse the other: two blocks,
    // and the host has only that mirror left.
    assert_eq!(m.blocks_to_copy_out(1), 1);
    assert_eq!(m.free_host(), 1);
    assert_eq!(m.transfer_out(1, 8), None, "no free block for the copy");
    m.check().unwrap();
    let back = m.transfer_in(2).unwrap();
    assert_eq!(back.src_blocks.len(), 3);
    m.ack(back.id).unwrap();
    let out = m.transfer_out(1, 8).expect("the return freed host blocks");
    assert_eq!(out.src_blocks.len(), 1);
    m.ack(out.id).unwrap();
    m.check().unwrap();
}

#[test]
fn a_position_written_again_drops_the_mirror_of_its_block() {
    let mut m = BlockManager::new(4, 8, 8, false);
    compute(&mut m, 1, &(0..8).collect::<Vec<u32>>());
    round_trip(&mut m, 1, 8);
    assert_eq!(m.host_mirrors(), 2);
    m.forget_mirrors_from(1, 7);
    assert_eq!((m.host_mirrors(), m.free_host()), (1, 8));
    assert_eq!(m.blocks_to_copy_out(1), 1);
    m.check().unwrap();
    // Sealed blocks shrank with it: the block is copied out and comes back unmirrored...
    let (copied_out, _) = round_trip(&mut m, 1, 7);
    assert_eq!(copied_out, 1);
    assert_eq!(m.host_mirrors(), 1, "position 7 not computed: block 1 is not sealed");
    m.check().unwrap();
}

#[test]
fn leaving_in_the_step_that_brings_it_back_copies_only_the_unsealed_blocks() {
    // Time-sharing: a copy in, a compute and a copy out in one step, both copies in flight.
    let mut m = BlockManager::new(4, 8, 8, false);
    compute(&mut m, 1, &(0..10).collect::<Vec<u32>>());
    let out = m.transfer_out(1, 10).unwrap();
    m.ack(out.id).unwrap();
    let back = m.transfer_in(1).unwrap();
    assert!(m.grow(1, 11)); // the step's decode writes position 10
    assert_eq!(m.blocks_to_copy_out(1), 1, "the copy in's sources of the two sealed blocks serve");
    let again = m.transfer_out(1, 11).unwrap();
    assert_eq!(again.src_blocks.len(), 1);
    m.check().unwrap();
    // The sources stay the table's when the copy in is acknowledged (and are not mirrors).
    m.ack(back.id).unwrap();
    assert_eq!((m.host_mirrors(), m.free_host()), (0, 5));
    m.check().unwrap();
    m.ack(again.id).unwrap();
    assert_eq!(m.free_device(), 8);
    m.check().unwrap();
    let home = m.transfer_in(1).unwrap();
    assert_eq!(home.src_blocks.len(), 3);
    m.ack(home.id).unwrap();
    assert_eq!(m.host_mirrors(), 2);
    let last = m.transfer_out(1, 11).unwrap();
    assert_eq!(last.src_blocks.len(), 1, "nothing written: still the unsealed block only");
    m.ack(last.id).unwrap();
    m.check().unwrap();
    m.release(1);
    assert_eq!((m.free_device(), m.free_host()), (8, 8));
    m.check().unwrap();
}

/// A model of what each block holds, checked against the block manager through random
/// admissions, computes, rotations (the time-sharing pattern included: out while the copy in
/// is still in flight), acknowledgements in any order, positions computed again, and releases:
/// every rotation out leaves the latest KV of every slot on host, copied or mirrored, and every
/// return brings back the latest.
#[test]
fn mirrors_never_stand_for_stale_kv() {
    use std::collections::BTreeMap;

    struct Lcg(u64);
    impl Lcg {
        fn below(&mut self, n: u64) -> u64 {
            self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (self.0 >> 33) % n
        }
    }
    const BS: u32 = 4;
    #[derive(Default)]
    struct Req {
        computed: u32,
        /// Per slot, the version of its KV the request's computes have written.
        versions: Vec<u64>,
        transfers: Vec<u64>,
    }
    let mut copies = [0usize; 2];
    for seed in 0..300 {
        let mut rng = Lcg(seed);
        let mut m = BlockManager::new(BS, 20, 14, false);
        // What each block holds: (request, slot, version).
        let mut device: BTreeMap<u32, (u64, usize, u64)> = BTreeMap::new();
        let mut host: BTreeMap<u32, (u64, usize, u64)> = BTreeMap::new();
        let mut reqs: BTreeMap<u64, Req> = BTreeMap::new();
        let mut next_version = 1u64;
        // Writes positions [from, to) of `id`: each slot touched gets a new version.
        let mut write = |m: &BlockManager, r: &mut Req, id: u64, from: u32, to: u32, device: &mut BTreeMap<u32, (u64, usize, u64)>| {
            for slot in (from / BS) as usize..=((to - 1) / BS) as usize {
                let Slot::Device(block) = m.slots(id)[slot] else { panic!("computing on host") };
                if r.versions.len() <= slot {
                    r.versions.resize(slot + 1, 0);
                }
                r.versions[slot] = next_version;
                device.insert(block, (id, slot, next_version));
                next_version += 1;
            }
        };
        for _ in 0..400 {
            let id = rng.below(5);
            let on_device = |m: &BlockManager| m.slots(id).iter().all(|s| matches!(s, Slot::Device(_)));
            match rng.below(7) {
                0 if !reqs.contains_key(&id) => {
                    let tokens = 1 + rng.below(10) as u32;
                    m.acquire_prefix(id, 0, &[]);
                    if m.grow(id, u64::from(tokens)) {
                        let mut r = Req::default();
                        write(&m, &mut r, id, 0, tokens, &mut device);
                        r.computed = tokens;
                        reqs.insert(id, r);
                    } else {
                        m.release(id);
                    }
                }
                1 if reqs.get(&id).is_some_and(|r| on_device(&m) && r.transfers.is_empty()) => {
                    // A decode or a chunk; or, now and then, the last position again (its
                    // token lost), which must drop the mirror of its block.
                    let r = reqs.get_mut(&id).unwrap();
                    if rng.below(3) == 0 {
                        let position = r.computed - 1;
                        m.forget_mirrors_from(id, position);
                        write(&m, r, id, position, position + 1, &mut device);
                    } else {
                        let n = 1 + rng.below(3) as u32;
                        if m.grow(id, u64::from(r.computed + n)) {
                            write(&m, r, id, r.computed, r.computed + n, &mut device);
                            r.computed += n;
                        }
                    }
                }
                2 | 3 if reqs.get(&id).is_some_and(|r| r.transfers.is_empty()) => {
                    let r = reqs.get_mut(&id).unwrap();
                    if on_device(&m) {
                        let Some(out) = m.transfer_out(id, r.computed) else { continue };
                        copies[0] += out.src_blocks.len();
                        for (src, dst) in out.src_blocks.iter().zip(&out.dst_blocks) {
                            host.insert(*dst, device[src]);
                        }
                        r.transfers.push(out.id);
                    } else {
                        let Some(back) = m.transfer_in(id) else { continue };
                        copies[1] += back.src_blocks.len();
                        for (src, dst) in back.src_blocks.iter().zip(&back.dst_blocks) {
                            device.insert(*dst, host[src]);
                        }
                        r.transfers.push(back.id);
                        // Time-sharing: compute in the same step and leave again after it,
                        // while the copy in is still unacknowledged.
                        if rng.below(2) == 0 && m.grow(id, u64::from(r.computed + 1)) {
                            write(&m, r, id, r.computed, r.computed + 1, &mut device);
                            r.computed += 1;
                            if let Some(out) = m.transfer_out(id, r.computed) {
                                for (src, dst) in out.src_blocks.iter().zip(&out.dst_blocks) {
                                    host.insert(*dst, device[src]);
                                }
                                r.transfers.push(out.id);
                            }
                        }
                    }
                    // Whatever is on host now must be the latest, copied or mirrored.
                    for (slot, s) in m.slots(id).iter().enumerate() {
                        let (holder, content) = match s {
                            Slot::Host(b) => ("host", host.get(b)),
                            Slot::Device(b) => ("device", device.get(b)),
                        };
                        assert_eq!(content, Some(&(id, slot, r.versions[slot])), "seed {seed}: {holder} slot {slot} of {id} is stale");
                    }
                }
                4 | 5 => {
                    if let Some(r) = reqs.get_mut(&id) {
                        if !r.transfers.is_empty() {
                            let at = rng.below(r.transfers.len() as u64) as usize;
                            m.ack(r.transfers.remove(at)).expect("issued transfer");
                        }
                    }
                }
                6 if reqs.get(&id).is_some_and(|r| r.transfers.is_empty()) => {
                    m.release(id);
                    reqs.remove(&id);
                }
                _ => {}
            }
            m.check().unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        }
    }
    assert!(copies[0] > 0 && copies[1] > copies[0], "returns copied more than rotations out: {copies:?}");
}
