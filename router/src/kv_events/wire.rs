//! The wire format of vLLM's KV-cache events, as vllm-router decodes it: a batch is the
//! MessagePack array `[ts, events, data_parallel_rank]`; each event a map tagged by `type`
//! (`BlockStored`, `BlockRemoved`, `AllBlocksCleared`) with vLLM's field names, every field
//! present (`null` where unset). Block hashes are the block manager's prefix hashes, unsigned
//! integers: a subscriber treats them as opaque names for chaining and removal and matches a
//! request on each block's own tokens (`token_ids`) and LoRA name.
use std::sync::Arc;

use serde::Serialize;
use superinfer_scheduler::KvCacheEvent;

use crate::engine::AdapterRegistry;

/// Where every announced block lives: the device pool is the only prefix cache (host blocks are
/// a rotated request's own and are never announced; see `superinfer_scheduler::KvCacheEvent`).
const MEDIUM: &str = "GPU";
/// The one publisher's rank.
const DATA_PARALLEL_RANK: u32 = 0;
/// Events per batch at most: vllm-router refuses a batch of more than 4,096.
pub(super) const MAX_BATCH_EVENTS: usize = 1024;
/// Block tokens per batch at most, keeping a payload far under vllm-router's 16 MiB.
const MAX_BATCH_TOKENS: usize = 1 << 20;

#[derive(Serialize)]
#[serde(untagged)]
enum WireEvent<'a> {
    Stored(BlockStored<'a>),
    Removed(BlockRemoved<'a>),
    Cleared(AllBlocksCleared),
}

#[derive(Serialize)]
struct BlockStored<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    block_hashes: &'a [u64],
    parent_block_hash: Option<u64>,
    token_ids: &'a [u32],
    block_size: u32,
    lora_id: Option<u64>,
    medium: &'static str,
    lora_name: Option<String>,
}

#[derive(Serialize)]
struct BlockRemoved<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    block_hashes: &'a [u64],
    medium: &'static str,
}

#[derive(Serialize)]
struct AllBlocksCleared {
    #[serde(rename = "type")]
    kind: &'static str,
}

/// What a block's LoRA identity is on the wire: namespace n > 0 is the shard's adapter n.
pub(super) struct Encoder {
    pub(super) block_size: u32,
    /// The adapters by slot (namespace n > 0 is the adapter in slot n, served or no longer).
    pub(super) adapters: Arc<AdapterRegistry>,
}

impl Encoder {
    /// `events` as payloads of whole batches, in order, each within the size limits.
    pub(super) fn batches(&self, events: &[KvCacheEvent], ts: f64) -> Result<Vec<Vec<u8>>, rmp_serde::encode::Error> {
        let mut payloads = Vec::new();
        let mut start = 0;
        while start < events.len() {
            let mut end = start;
            let mut tokens = 0;
            while end < events.len() && end - start < MAX_BATCH_EVENTS && (end == start || tokens < MAX_BATCH_TOKENS) {
                if let KvCacheEvent::Stored { token_ids, .. } = &events[end] {
                    tokens += token_ids.len();
                }
                end += 1;
            }
            let wire: Vec<WireEvent<'_>> = events[start..end].iter().map(|event| self.wire(event)).collect();
            payloads.push(rmp_serde::to_vec_named(&(ts, wire, DATA_PARALLEL_RANK))?);
            start = end;
        }
        Ok(payloads)
    }

    fn wire<'a>(&'a self, event: &'a KvCacheEvent) -> WireEvent<'a> {
        match event {
            KvCacheEvent::Stored { block_hashes, parent, token_ids, kv_namespace } => {
                let adapter = if *kv_namespace == 0 { None } else { self.adapters.name_of(*kv_namespace) };
                WireEvent::Stored(BlockStored {
                    kind: "BlockStored",
                    block_hashes,
                    parent_block_hash: *parent,
                    token_ids,
                    block_size: self.block_size,
                    lora_id: adapter.as_ref().map(|_| *kv_namespace),
                    medium: MEDIUM,
                    lora_name: adapter,
                })
            }
            KvCacheEvent::Removed { block_hashes } => {
                WireEvent::Removed(BlockRemoved { kind: "BlockRemoved", block_hashes, medium: MEDIUM })
            }
            KvCacheEvent::AllCleared => WireEvent::Cleared(AllBlocksCleared { kind: "AllBlocksCleared" }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encoder() -> Encoder {
        Encoder { block_size: 2, adapters: Arc::new(AdapterRegistry::new([("sql".to_string(), 1)])) }
    }

    /// A hand-written MessagePack reader for the few shapes used, so the test does not trust
    /// the encoder's own library to read back what it wrote.
    fn expect_bytes(payload: &[u8], expected: &[u8]) {
        assert_eq!(payload, expected, "\n{payload:02x?}\n{expected:02x?}");
    }

    #[test]
    fn a_batch_is_vllms_array_of_tagged_maps() {
        let events = [
            KvCacheEvent::Stored { block_hashes: vec![7], parent: None, token_ids: vec![1, 2], kv_namespace: 0 },
            KvCacheEvent::Removed { block_hashes: vec![7] },
            KvCacheEvent::AllCleared,
        ];
        let payloads = encoder().batches(&events, 1.5).unwrap();
        assert_eq!(payloads.len(), 1);
        let mut expected = vec![0x93, 0xcb];
        expected.extend(1.5f64.to_be_bytes());
        expected.push(0x93);
        // BlockStored: a map of its 8 fields, in vLLM's order.
        expected.push(0x88);
        for (key, value) in [
            ("type", &b"\xabBlockStored"[..]),
            ("block_hashes", b"\x91\x07"),
            ("parent_block_hash", b"\xc0"),
            ("token_ids", b"\x92\x01\x02"),
            ("block_size", b"\x02"),
            ("lora_id", b"\xc0"),
            ("medium", b"\xa3GPU"),
            ("lora_name", b"\xc0"),
        ] {
            expected.push(0xa0 + key.len() as u8);
            expected.extend(key.as_bytes());
            expected.extend(value);
        }
        expected.push(0x83);
        for (key, value) in [("type", &b"\xacBlockRemoved"[..]), ("block_hashes", b"\x91\x07"), ("medium", b"\xa3GPU")] {
            expected.push(0xa0 + key.len() as u8);
            expected.extend(key.as_bytes());
            expected.extend(value);
        }
        expected.extend(b"\x81\xa4type\xb0AllBlocksCleared");
        expected.push(0x00); // data_parallel_rank
        expect_bytes(&payloads[0], &expected);
    }

    #[test]
    fn adapter_blocks_carry_the_adapters_id_and_name() {
        let events = [KvCacheEvent::Stored {
            block_hashes: vec![u64::MAX],
            parent: Some(3),
            token_ids: vec![4, 5],
            kv_namespace: 1,
        }];
        let payload = &encoder().batches(&events, 0.0).unwrap()[0];
        let find = |needle: &[u8]| payload.windows(needle.len()).any(|window| window == needle);
        assert!(find(b"\xa7lora_id\x01"));
        assert!(find(b"\xa9lora_name\xa3sql"));
        assert!(find(b"\xb1parent_block_hash\x03"));
        assert!(find(b"\xacblock_hashes\x91\xcf\xff\xff\xff\xff\xff\xff\xff\xff"), "u64 hashes stay unsigned");
    }

    #[test]
    fn long_runs_are_split_into_bounded_batches() {
        let events: Vec<KvCacheEvent> =
            (0..2500).map(|hash| KvCacheEvent::Removed { block_hashes: vec![hash] }).collect();
        let payloads = encoder().batches(&events, 0.0).unwrap();
        assert_eq!(payloads.len(), 3);
        assert!(encoder().batches(&[], 0.0).unwrap().is_empty());
    }
}
