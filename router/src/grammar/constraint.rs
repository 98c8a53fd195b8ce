//! One request's grammar matcher: the tokens it allows next, packed as the Step's
//! `allowed_tokens` bitmask, and its advance on each sampled token. Owned by the engine with
//! its request. A thinking model's chat reply may reason first (`after_reasoning`): the
//! grammar then holds from the token after `</think>`, as vLLM's structured outputs do under a
//! reasoning parser.
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

/// A thinking model's reasoning tags as the model's tokens (each tag one token), for a grammar
/// that holds only after the reasoning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReasoningTokens {
    /// `<think>`: where the prompt left no block open, the reply's first token may be this
    /// (it then reasons) or one the grammar allows.
    pub open: u32,
    /// `</think>`: the grammar holds from the next token.
    pub close: u32,
}

/// Where a reply that may reason first stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    /// The first token: the opening tag, or the answer's first token under the grammar.
    Opening,
    /// Any token, until the closing tag.
    Reasoning,
    /// Under the grammar.
    Answer,
}

#[derive(Clone)]
pub struct TokenConstraint {
    matcher: Matcher,
    /// The reasoning before the grammar holds, and how far the reply got (`None`: the grammar
    /// holds from the first token).
    reasoning: Option<(ReasoningTokens, Part)>,
}

impl std::fmt::Debug for TokenConstraint {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("TokenConstraint")
            .field("stopped", &self.matcher.is_stopped())
            .field("reasoning", &self.reasoning)
            .finish()
    }
}

impl TokenConstraint {
    pub(super) fn new(matcher: Matcher) -> Self {
        Self { matcher, reasoning: None }
    }

    /// The same grammar, holding only after the reply's reasoning: until `tokens.close` is
    /// sampled any token may follow (end of sequence included: a reply cut short in its
    /// reasoning has no answer); the closing tag itself is not the grammar's. `open_in_prompt`:
    /// the prompt opened the block, so the reply reasons from its first token; otherwise the
    /// first token opens it or starts the answer.
    pub fn after_reasoning(mut self, tokens: ReasoningTokens, open_in_prompt: bool) -> Self {
        let part = if open_in_prompt { Part::Reasoning } else { Part::Opening };
        self.reasoning = Some((tokens, part));
        self
    }

    /// The tokens allowed next as a bitmask over the vocabulary: token t is bit t % 8 of byte
    /// t / 8 (`ScheduledRequest.allowed_tokens`); EOS is set when the grammar may end here.
    /// `None` while the reply reasons: any token may follow, and no mask is computed.
    pub fn allowed_tokens(&mut self) -> Result<Option<Vec<u8>>, GrammarError> {
        let open = match self.reasoning {
            Some((_, Part::Reasoning)) => return Ok(None),
            Some((tokens, Part::Opening)) => Some(tokens.open),
            _ => None,
        };
        let vocab_size = self.matcher.tok_env().map_err(matcher_error)?.tok_trie().vocab_size();
        let mask = self.matcher.compute_mask().map_err(matcher_error)?;
        let mut packed = pack(mask.as_slice(), vocab_size);
        if let Some(open) = open {
            if let Some(byte) = packed.get_mut(open as usize / 8) {
                *byte |= 1 << (open % 8);
            }
        }
        Ok(Some(packed))
    }

    /// Feeds one sampled token.
    pub fn advance(&mut self, token: u32) -> Result<Advance, GrammarError> {
        if let Some((tokens, part)) = &mut self.reasoning {
            match *part {
                Part::Opening if token == tokens.open => {
                    *part = Part::Reasoning;
                    return Ok(Advance::Continue);
                }
                Part::Opening => *part = Part::Answer,
                Part::Reasoning => {
                    if token == tokens.close {
                        *part = Part::Answer;
                    }
                    return Ok(Advance::Continue);
                }
                Part::Answer => {}
            }
        }
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
        let mask = constraint.allowed_tokens().unwrap().unwrap();
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
        assert_eq!(allowed_ids(&constraint.allowed_tokens().unwrap().unwrap()), bang);
        assert_eq!(constraint.advance(bang[0]), Ok(Advance::Complete));
    }

    #[test]
    fn eos_is_allowed_only_where_the_grammar_may_end() {
        let tokenizer = smollm2();
        let mut constraint = smollm2_compiler().compile(&GrammarSpec::Regex("[0-9]+".into())).unwrap();
        let allows_eos = |mask: &[u8]| allowed_ids(mask).iter().any(|&id| id == 0 || id == 2);
        assert!(!allows_eos(&constraint.allowed_tokens().unwrap().unwrap()));
        constraint.advance(tokenizer.encode("4", false).unwrap().ids[0]).unwrap();
        let mask = constraint.allowed_tokens().unwrap().unwrap();
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
        accepts_with(&smollm2(), constraint, text)
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
            assert!(allowed_ids(&constraint.allowed_tokens().unwrap().unwrap()).contains(&id));
            assert_eq!(constraint.advance(id), Ok(Advance::Continue));
        }
        assert_eq!(constraint.advance(*last), Ok(Advance::Complete));
    }

    /// A reply that reasons first (the prompt opened the block, as DeepSeek-R1's template does):
    /// no mask and any token until `</think>`, which the grammar does not see; then the grammar.
    #[test]
    fn a_reply_reasons_before_its_grammar_holds() {
        use crate::grammar::compiler::tests::thinking_compiler;
        use crate::tokenizer::tests::{END_THINK, THINK};

        let tokenizer = crate::tokenizer::Tokenizer::from_json(&crate::tokenizer::tests::thinking_json()).unwrap();
        let compiler = thinking_compiler();
        let tokens = ReasoningTokens { open: THINK, close: END_THINK };
        let mut constraint = compiler.compile(&GrammarSpec::Regex("(yes|no)!".into())).unwrap().after_reasoning(tokens, true);
        for &id in &tokenizer.encode("Hmm, maybe x.", false).unwrap().ids {
            assert_eq!(constraint.allowed_tokens(), Ok(None));
            assert_eq!(constraint.advance(id), Ok(Advance::Continue));
        }
        assert_eq!(constraint.advance(END_THINK), Ok(Advance::Continue));
        let mask = constraint.allowed_tokens().unwrap().expect("the grammar holds after </think>");
        assert!(!allowed_ids(&mask).contains(&THINK) && !allowed_ids(&mask).contains(&END_THINK));
        let letter_x = tokenizer.encode("x", false).unwrap().ids[0];
        assert!(!allowed_ids(&mask).contains(&letter_x));
        assert!(accepts_with(&tokenizer, &mut constraint, "no"));
        let bang = tokenizer.encode("!", false).unwrap().ids[0];
        assert_eq!(constraint.advance(bang), Ok(Advance::Complete));
    }

    /// Where the prompt left no block open (Qwen 3's replies open their own): the first token may
    /// be `<think>` or one the grammar allows; after a grammar's token there is no reasoning.
    #[test]
    fn a_reply_that_may_open_its_reasoning_chooses_with_its_first_token() {
        use crate::grammar::compiler::tests::thinking_compiler;
        use crate::tokenizer::tests::{END_THINK, THINK};

        let tokenizer = crate::tokenizer::Tokenizer::from_json(&crate::tokenizer::tests::thinking_json()).unwrap();
        let tokens = ReasoningTokens { open: THINK, close: END_THINK };
        let compile = || thinking_compiler().compile(&GrammarSpec::Regex("(yes|no)!".into())).unwrap().after_reasoning(tokens, false);
        let plain = allowed_ids(&thinking_compiler().compile(&GrammarSpec::Regex("(yes|no)!".into())).unwrap().allowed_tokens().unwrap().unwrap());

        let mut thinking = compile();
        let first = allowed_ids(&thinking.allowed_tokens().unwrap().unwrap());
        assert_eq!(first, [plain.clone(), vec![THINK]].concat());
        assert_eq!(thinking.advance(THINK), Ok(Advance::Continue));
        assert_eq!(thinking.allowed_tokens(), Ok(None));
        assert_eq!(thinking.advance(tokenizer.encode("x", false).unwrap().ids[0]), Ok(Advance::Continue));
        assert_eq!(thinking.advance(END_THINK), Ok(Advance::Continue));
        assert!(accepts_with(&tokenizer, &mut thinking, "yes!"));

        let mut answering = compile();
        assert!(accepts_with(&tokenizer, &mut answering, "ye"));
        let next = allowed_ids(&answering.allowed_tokens().unwrap().unwrap());
        assert!(!next.contains(&THINK), "{next:?}");
        assert!(matches!(answering.advance(THINK), Err(GrammarError::Matcher(_))));
    }

    /// Whether `text` (tokenized by `tokenizer`) is a prefix the constraint accepts, token by token.
    fn accepts_with(tokenizer: &crate::tokenizer::Tokenizer, constraint: &mut TokenConstraint, text: &str) -> bool {
        tokenizer.encode(text, false).unwrap().ids.iter().all(|&id| {
            allowed_ids(&constraint.allowed_tokens().unwrap().unwrap()).contains(&id) && constraint.advance(id).is_ok()
        })
    }
}
