//! Incremental detokenization: turns generated token ids into text as they arrive, such that
//! the pieces concatenate to exactly the decode of the whole sequence. A byte-level BPE token
//! can hold part of a multi-byte UTF-8 character; decoding it alone yields U+FFFD, so text is
//! only released once the decode of the pending tokens no longer ends in U+FFFD. Decoding
//! starts a few tokens before the unread ones (the prefix/read-offset technique of TGI and
//! vLLM) so that tokenizers whose decoders depend on neighbouring tokens (leading-space
//! handling in SentencePiece) produce the same text as a whole-sequence decode.
use crate::tokenizer::{Tokenizer, TokenizerError};

/// How many prompt tokens are kept as decoding context before the first generated token.
const CONTEXT_TOKENS: usize = 5;

/// The per-request decoding state: all ids seen so far and two offsets into them.
#[derive(Debug, Clone)]
pub struct IncrementalDecoder {
    ids: Vec<u32>,
    /// Start of the window that is decoded each time (text before it was released long ago).
    prefix_offset: usize,
    /// Start of the ids whose text has not been released yet.
    read_offset: usize,
    skip_special_tokens: bool,
    /// Special tokens whose text stays while the others are skipped (a tool-call or reasoning
    /// format's tags, which its parser reads).
    kept_special_tokens: Vec<u32>,
}

impl IncrementalDecoder {
    /// `prompt_ids`: the prompt, whose last tokens serve as decoding context only.
    pub fn new(prompt_ids: &[u32], skip_special_tokens: bool) -> Self {
        let context = &prompt_ids[prompt_ids.len().saturating_sub(CONTEXT_TOKENS)..];
        Self {
            ids: context.to_vec(),
            prefix_offset: 0,
            read_offset: context.len(),
            skip_special_tokens,
            kept_special_tokens: Vec::new(),
        }
    }

    /// While skipping special tokens, these stay.
    pub fn keeping(mut self, special_tokens: &[u32]) -> Self {
        self.kept_special_tokens = special_tokens.to_vec();
        self
    }

    /// `ids` as decoded: special tokens skipped unless kept (the tokenizer skips them id by id,
    /// so leaving them out of the ids decodes the same).
    fn decode(&self, tokenizer: &Tokenizer, ids: &[u32]) -> Result<String, TokenizerError> {
        if !self.skip_special_tokens || self.kept_special_tokens.is_empty() {
            return tokenizer.decode(ids, self.skip_special_tokens);
        }
        let shown: Vec<u32> = ids
            .iter()
            .copied()
            .filter(|id| !tokenizer.is_special(*id) || self.kept_special_tokens.contains(id))
            .collect();
        tokenizer.decode(&shown, false)
    }

    /// Adds one token; returns the text it completes (empty while a character is incomplete).
    pub fn push(&mut self, tokenizer: &Tokenizer, id: u32) -> Result<String, TokenizerError> {
        self.ids.push(id);
        let (prefix_text, new_text) = self.decode_window(tokenizer)?;
        if new_text.len() > prefix_text.len() && !new_text.ends_with('\u{FFFD}') {
            Ok(self.take_after(&prefix_text, &new_text))
        } else {
            Ok(String::new())
        }
    }

    /// The text up to the read offset, and the text including every held-back token, both
    /// decoded from the prefix offset (so merges at the boundary decode as in the whole).
    fn decode_window(&self, tokenizer: &Tokenizer) -> Result<(String, String), TokenizerError> {
        let prefix_text = self.decode(tokenizer, &self.ids[self.prefix_offset..self.read_offset])?;
        let new_text = self.decode(tokenizer, &self.ids[self.prefix_offset..])?;
        Ok((prefix_text, new_text))
    }

    /// Emits what `new_text` adds to `prefix_text` and moves the window past it.
    fn take_after(&mut self, prefix_text: &str, new_text: &str) -> String {
        self.prefix_offset = self.read_offset;
        self.read_offset = self.ids.len();
        new_text.get(prefix_text.len()..).unwrap_or_default().to_string()
    }

    /// The text of tokens still held back at the end of the generation (an incomplete
    /// character decodes to U+FFFD, as in a whole-sequence decode).
    pub fn flush(&mut self, tokenizer: &Tokenizer) -> Result<String, TokenizerError> {
        if self.read_offset == self.ids.len() {
            return Ok(String::new());
        }
        let (prefix_text, new_text) = self.decode_window(tokenizer)?;
        Ok(self.take_after(&prefix_text, &new_text))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::tests::smollm2;

    fn stream(tokenizer: &Tokenizer, prompt: &[u32], generated: &[u32]) -> Vec<String> {
        let mut decoder = IncrementalDecoder::new(prompt, true);
        let mut pieces: Vec<String> = generated
            .iter()
            .map(|&id| decoder.push(tokenizer, id).unwrap())
            .collect();
        pieces.push(decoder.flush(tokenizer).unwrap());
        pieces
    }

    #[test]
    fn multi_byte_characters_are_held_until_complete() {
        let tokenizer = smollm2();
        let generated = tokenizer.encode("héllo 日本語 🤗", false).unwrap().ids;
        let pieces = stream(&tokenizer, &[], &generated);
        assert!(
            pieces.iter().all(|piece| !piece.contains('\u{FFFD}')),
            "{pieces:?}"
        );
        // Some tokens carry only part of a character and release nothing on their own.
        assert!(pieces[..generated.len()].iter().any(String::is_empty));
        assert_eq!(pieces.concat(), "héllo 日本語 🤗");
    }

    #[test]
    fn streamed_text_equals_whole_decode() {
        let tokenizer = smollm2();
        let prompt = tokenizer
            .encode("<|im_start|>user\nSay something<|im_end|>\n", false)
            .unwrap()
            .ids;
        let texts = [
            "Plain ASCII text, with  double spaces and\nnewlines.",
            "Ünïcödé — “quotes” … and emoji 🚀🔥 mixed with 中文字符 and कुछ हिंदी.",
            "  leading spaces and trailing ones  ",
            "code: fn main() { println!(\"{}\", 1 + 2); }\t<tab>",
        ];
        for text in texts {
            let generated = tokenizer.encode(text, false).unwrap().ids;
            let whole = tokenizer.decode(&generated, true).unwrap();
            assert_eq!(stream(&tokenizer, &prompt, &generated).concat(), whole);
            assert_eq!(whole, text);
        }
    }

    #[test]
    fn special_tokens_are_skipped_when_asked() {
        let tokenizer = smollm2();
        let mut generated = tokenizer.encode("Hi there", false).unwrap().ids;
        generated.push(2); // <|im_end|>
        assert_eq!(stream(&tokenizer, &[], &generated).concat(), "Hi there");
    }

    /// Kept special tokens stay in the text while the others are skipped, streamed as whole.
    #[test]
    fn kept_special_tokens_stay_while_the_others_are_skipped() {
        let tokenizer = smollm2();
        let text = "A<gh_stars>B<issue_start>C 日本<gh_stars><|im_end|>";
        let generated = tokenizer.encode(text, false).unwrap().ids;
        assert!(generated.contains(&7) && generated.contains(&8), "{generated:?}");
        let mut decoder = IncrementalDecoder::new(&[], true).keeping(&[7]);
        let mut pieces: Vec<String> = generated.iter().map(|&id| decoder.push(&tokenizer, id).unwrap()).collect();
        pieces.push(decoder.flush(&tokenizer).unwrap());
        assert_eq!(pieces.concat(), "A<gh_stars>BC 日本<gh_stars>");
        // Not skipping, everything stays, kept or not.
        let mut decoder = IncrementalDecoder::new(&[], false).keeping(&[7]);
        let whole: String = generated.iter().map(|&id| decoder.push(&tokenizer, id).unwrap()).collect();
        assert_eq!(whole, text);
    }

    #[test]
    fn an_incomplete_character_at_the_end_is_flushed_as_whole_decode_does() {
        let tokenizer = smollm2();
        let ids = tokenizer.encode("日", false).unwrap().ids;
        assert!(ids.len() > 1, "the fixture splits this character: {ids:?}");
        let cut = &ids[..ids.len() - 1];
        let pieces = stream(&tokenizer, &[], cut);
        assert_eq!(pieces.concat(), tokenizer.decode(cut, true).unwrap());
    }

    /// A SentencePiece-style tokenizer: a word's leading space is a "▁" that the decoder drops
    /// at the start of the decoded text, so a token decoded alone loses its space.
    fn metaspace() -> Tokenizer {
        let json = r#"{"version":"1.0","truncation":null,"padding":null,"added_tokens":[],
            "normalizer":null,"post_processor":null,
            "pre_tokenizer":{"type":"Metaspace","replacement":"\u2581","prepend_scheme":"always","split":true},
            "decoder":{"type":"Metaspace","replacement":"\u2581","prepend_scheme":"always","split":true},
            "model":{"type":"WordLevel","vocab":{"\u2581Hello":0,"\u2581world":1,"\u2581again":2,"[UNK]":3},
                     "unk_token":"[UNK]"}}"#;
        Tokenizer::from_json(json).unwrap()
    }

    #[test]
    fn prompt_context_keeps_the_leading_space_of_sentencepiece_tokens() {
        let tokenizer = metaspace();
        assert_eq!(tokenizer.decode(&[1], true).unwrap(), "world");
        let pieces = stream(&tokenizer, &[0], &[1, 2]);
        assert_eq!(pieces.concat(), " world again");
        let whole = tokenizer.decode(&[0, 1, 2], true).unwrap();
        let prompt = tokenizer.decode(&[0], true).unwrap();
        assert_eq!(pieces.concat(), whole[prompt.len()..]);
    }
}
