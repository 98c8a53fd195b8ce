//! Names a full KV block by its whole token prefix: `hash_i = H(hash_{i-1}, tokens of block i)`.
//! A block's KV depends on every token before it, so two blocks are interchangeable only when
//! their chains match. The device pool also stores each cached block's parent hash and tokens
//! and compares them on lookup, so a 64-bit collision inside one block cannot alias KV.

use std::hash::{DefaultHasher, Hash, Hasher};

/// The chain value before the first block.
pub(crate) const ROOT_HASH: u64 = 0x5eed_b10c_0000_0001;

/// Hash of one full block given its parent's hash. `DefaultHasher::new()` uses fixed keys, so
/// the value is the same in every run of this build (plans must be reproducible).
pub(crate) fn block_hash(parent: u64, tokens: &[u32]) -> u64 {
    let mut hasher = DefaultHasher::new();
    parent.hash(&mut hasher);
    tokens.hash(&mut hasher);
    hasher.finish()
}

/// The chain value before the first block of KV computed in `namespace` (a LoRA adapter; 0:
/// the base model). The same tokens give other K/V under another adapter, so chains of
/// different namespaces never match.
pub(crate) fn chain_root(namespace: u64) -> u64 {
    if namespace == 0 {
        ROOT_HASH
    } else {
        block_hash(ROOT_HASH, &[namespace as u32, (namespace >> 32) as u32])
    }
}

/// Extends `hashes` (the chain from `root` of the first `hashes.len()` full blocks of
/// `tokens`) to cover every full block of `tokens[..limit_tokens]`.
pub(crate) fn extend_chain(hashes: &mut Vec<u64>, root: u64, tokens: &[u32], limit_tokens: usize, block_size: usize) {
    let full_blocks = limit_tokens.min(tokens.len()) / block_size;
    while hashes.len() < full_blocks {
        let index = hashes.len();
        let parent = hashes.last().copied().unwrap_or(root);
        let block = &tokens[index * block_size..(index + 1) * block_size];
        hashes.push(block_hash(parent, block));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_depends_on_whole_prefix() {
        let a: Vec<u32> = (0..8).collect();
        let mut b = a.clone();
        b[0] = 99;
        let (mut ha, mut hb) = (Vec::new(), Vec::new());
        extend_chain(&mut ha, ROOT_HASH, &a, 8, 4);
        extend_chain(&mut hb, ROOT_HASH, &b, 8, 4);
        assert_eq!(ha.len(), 2);
        // Second blocks hold the same tokens but different prefixes.
        assert_eq!(a[4..8], b[4..8]);
        assert_ne!(ha[1], hb[1]);
        let mut again = Vec::new();
        extend_chain(&mut again, ROOT_HASH, &a, 7, 4);
        assert_eq!(again, ha[..1]);
    }
}
