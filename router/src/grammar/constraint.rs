//! One request's grammar matcher: the tokens it allows next, packed as the Step's
//! `allowed_tokens` bitmask, and its advance on each sampled token. Owned by the engine with
//! its request.
use llguidance::Matcher;

use super::GrammarError;

/// What the matcher says after a sampled token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Advance {
    /// More tokens may follow.
    Continue,
    /// The grammar is complete and allows nothing more: the request ends here.
    Complete,
}

#[derive(Clone)]
pub struct TokenConstraint {
    matcher: Matcher,
}

impl std::fmt::Debug for TokenConstraint {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("TokenConstraint").field("stopped", &self.matcher.is_stopped()).finish()
    }
}

impl TokenConstraint {
    pub(super) fn new(matcher: Matcher) -> Self {
        Self { matcher }
    }

    /// The tokens allowed next as a bitmask over the vocabulary: token t is bit t % 8 of byte
    /// t / 8 (`ScheduledRequest.allowed_tokens`); EOS is set when the grammar may end here.
    pub fn allowed_tokens(&mut self) -> Result<Vec<u8>, GrammarError> {
        let vocab_size = self.matcher.tok_env().map_err(matcher_error)?.tok_trie().vocab_size();
        let mask = self.matcher.compute_mask().map_err(matcher_error)?;
        Ok(pack(mask.as_slice(), vocab_size))
    }

    /// Feeds one sampled token.
    pub fn advance(&mut self, token: u32) -> Result<Advance, GrammarError> {
        self.matcher.consume_token(token).map_err(matcher_error)?;
        Ok(if self.matcher.is_stopped() { Advance::Complete } else { Advance::Continue })
    }
}

fn matcher_error(error: impl std::fmt::Display) -> GrammarError {
    GrammarError::Matcher(error.to_string())
}

/// 32-bit words (token t is bit t % 32 of word t / 32) -> `vocab_size` bits packed in bytes,
/// bits past the vocabulary cleared.
pub(crate) fn pack(words: &[u32], vocab_size: usize) -> Vec<u8> {
    let mut bytes: Vec<u8> = words.iter().flat_map(|word| word.to_le_bytes()).collect();
    bytes.resize(vocab_size.div_ceil(8), 0);
    if !vocab_size.is_multiple_of(8) {
        if let Some(last) = bytes.last_mut() {
            *last &= (1u8 << (vocab_size % 8)) - 1;
        }
    }
    bytes
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::grammar::compiler::tests::smollm2_compiler;
    use crate::grammar::GrammarSpec;
    use crate::tokenizer::tests::smollm2;

    fn allowed_ids(mask: &[u8]) -> Vec<u32> {
        (0..mask.len() * 8).filter(|&t| mask[t / 8] >> (t % 8) & 1 == 1).map(|t| t as u32).collect()
    }

    #[test]
    fn packing_puts_token_t_at_bit_t_mod_8_of_byte_t_div_8() {
        // Tokens 0, 9, 31 and 33 of a 35-token vocabulary; bits past it (34, 35, ...) dropped.
        let words = [1u32 | 1 << 9 | 1 << 31, 1 << 1 | 1 << 2 | 1 << 5];
        let packed = pack(&words, 35);
        assert_eq!(packed.len(), 5);
        assert_eq!(allowed_ids(&packed), vec![0, 9, 31, 33, 34]);
        let packed = pack(&words, 34);
        assert_eq!(allowed_ids(&packed), vec![0, 9, 31, 33]);
        assert_eq!(pack(&[u32::MAX], 16), vec![0xFF, 0xFF]);
    }

    #[test]
    fn a_regex_is_followed_token_by_token_to_its_end() {
        let tokenizer = smollm2();
        let mut constraint = smollm2_compiler().compile(&GrammarSpec::Regex("(yes|no)!".into())).unwrap();
        let mask = constraint.allowed_tokens().unwrap();
        assert_eq!(mask.len(), 49152 / 8);
        let first = allowed_ids(&mask);
        let texts: Vec<String> = first.iter().map(|&id| tokenizer.decode(&[id], false).unwrap()).collect();
        assert!(texts.iter().all(|text| "yes!".starts_with(text.as_str()) || "no!".starts_with(text.as_str())), "{texts:?}");
        let yes = tokenizer.encode("yes", false).unwrap().ids;
        assert!(yes.iter().all(|id| first.contains(id) || yes.len() > 1));
        for &id in &yes {
            assert_eq!(constraint.advance(id), Ok(Advance::Continue));
        }
        let bang = tokenizer.encode("!", false).unwrap().ids;
        assert_eq!(allowed_ids(&constraint.allowed_tokens().unwrap()), bang);
        assert_eq!(constraint.advance(bang[0]), Ok(Advance::Complete));
    }

    #[test]
    fn eos_is_allowed_only_where_the_grammar_may_end() {
        let tokenizer = smollm2();
        let mut constraint = smollm2_compiler().compile(&GrammarSpec::Regex("[0-9]+".into())).unwrap();
        let allows_eos = |mask: &[u8]| allowed_ids(mask).iter().any(|&id| id == 0 || id == 2);
        assert!(!allows_eos(&constraint.allowed_tokens().unwrap()));
        constraint.advance(tokenizer.encode("4", false).unwrap().ids[0]).unwrap();
        let mask = constraint.allowed_tokens().unwrap();
        assert!(allowed_ids(&mask).contains(&0) && allowed_ids(&mask).contains(&2));
        // Another digit is allowed too, but no letter.
        assert!(allowed_ids(&mask).contains(&tokenizer.encode("7", false).unwrap().ids[0]));
        assert!(!allowed_ids(&mask).contains(&tokenizer.encode("a", false).unwrap().ids[0]));
    }

    #[test]
    fn a_token_outside_the_grammar_is_a_matcher_error() {
        let tokenizer = smollm2();
        let mut constraint = smollm2_compiler().compile(&GrammarSpec::JsonSchema(json!({"type": "boolean"}))).unwrap();
        let letter_x = tokenizer.encode("x", false).unwrap().ids[0];
        assert!(matches!(constraint.advance(letter_x), Err(GrammarError::Matcher(_))));
    }

    /// Whether `text` (tokenized) is a prefix the constraint accepts, token by token.
    fn accepts(constraint: &mut TokenConstraint, text: &str) -> bool {
        smollm2().encode(text, false).unwrap().ids.iter().all(|&id| {
            allowed_ids(&constraint.allowed_tokens().unwrap()).contains(&id) && constraint.advance(id).is_ok()
        })
    }

    #[test]
    fn unlisted_properties_are_closed_unless_the_schema_or_the_server_opens_them() {
        use crate::grammar::UnlistedProperties;

        let silent = json!({"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]});
        let open = json!({"type": "object", "properties": {"ok": {"type": "boolean"}}, "additionalProperties": true});
        let closed_by_default = smollm2_compiler();
        let allowing = smollm2_compiler().with_unlisted_properties(UnlistedProperties::Allow);
        let extra_key = r#"{"ok":true,"x""#;
        assert!(!accepts(&mut closed_by_default.compile(&GrammarSpec::JsonSchema(silent.clone())).unwrap(), extra_key));
        assert!(accepts(&mut closed_by_default.compile(&GrammarSpec::JsonSchema(silent.clone())).unwrap(), r#"{"ok":true}"#));
        assert!(accepts(&mut closed_by_default.compile(&GrammarSpec::JsonSchema(open)).unwrap(), extra_key));
        assert!(accepts(&mut allowing.compile(&GrammarSpec::JsonSchema(silent)).unwrap(), extra_key));
    }

    #[test]
    fn compact_json_completes_at_its_last_token() {
        let tokenizer = smollm2();
        let schema = json!({"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": false});
        let mut constraint = smollm2_compiler().compile(&GrammarSpec::JsonSchema(schema)).unwrap();
        let ids = tokenizer.encode(r#"{"ok":true}"#, false).unwrap().ids;
        let (last, init) = ids.split_last().unwrap();
        for &id in init {
            assert!(allowed_ids(&constraint.allowed_tokens().unwrap()).contains(&id));
            assert_eq!(constraint.advance(id), Ok(Advance::Continue));
        }
        assert_eq!(constraint.advance(*last), Ok(Advance::Complete));
    }
}
