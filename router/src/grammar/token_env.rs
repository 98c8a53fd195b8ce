//! llguidance's view of the model's tokenizer: a `TokTrie` over every token's bytes and the
//! router's own tokenizer for turning bytes into tokens. The bytes come from the model's
//! `tokenizer.json` through llguidance's own reader (byte-level BPE, and byte-fallback
//! tokenizers with a metaspace), so no second tokenizer library is loaded.
use std::sync::Arc;

use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};

use super::GrammarError;
use crate::tokenizer::Tokenizer;

pub(super) struct RouterTokenEnv {
    trie: TokTrie,
    tokenizer: Tokenizer,
}

impl TokenizerEnv for RouterTokenEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, bytes: &[u8]) -> Vec<TokenId> {
        // Text is tokenized as the model would see it; bytes that are not UTF-8 (a token's
        // partial character) can only be matched greedily against the trie.
        match std::str::from_utf8(bytes).ok().and_then(|text| self.tokenizer.encode(text, false).ok()) {
            Some(encoded) => encoded.ids,
            None => self.trie.greedy_tokenize(bytes),
        }
    }
}

/// Builds the environment. `model_vocab_size` is the model's (maybe padded) vocabulary: tokens
/// the tokenizer knows beyond it can never be sampled, so the trie stops there.
pub(super) fn token_env(
    tokenizer_json: &str,
    tokenizer: Tokenizer,
    eos_token_ids: &[u32],
    model_vocab_size: u32,
) -> Result<TokEnv, GrammarError> {
    let unavailable = |why: String| GrammarError::Unavailable(why);
    let json: serde_json::Value = serde_json::from_str(tokenizer_json).map_err(|error| unavailable(error.to_string()))?;
    // The reader asserts on a few malformed vocabularies instead of returning an error.
    let mut words = std::panic::catch_unwind(|| llguidance::token_bytes_from_tokenizer_json(&json))
        .map_err(|_| unavailable("the tokenizer's vocabulary cannot be read as bytes".into()))?
        .map_err(|error| unavailable(error.to_string()))?;
    if model_vocab_size > 0 {
        words.truncate(model_vocab_size as usize);
    }
    let vocab_size = words.len() as u32;
    let eos: Vec<TokenId> = eos_token_ids.iter().copied().filter(|&id| id < vocab_size).collect();
    let Some(&first_eos) = eos.first() else {
        return Err(unavailable("the model has no end-of-sequence token in its vocabulary".into()));
    };
    let trie = TokTrie::from(&TokRxInfo::new(vocab_size, first_eos), &words).with_eos_tokens(&eos);
    Ok(Arc::new(RouterTokenEnv { trie, tokenizer }))
}
