//! The model's tokenizer (built from the `tokenizer.json` the shard sends), shared read-only by
//! every request. Encoding runs on tokio's blocking pool so that long prompts never stall the
//! async executor.
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use tokenizers::decoders::DecoderWrapper;
use tokenizers::models::ModelWrapper;
use tokenizers::SplitDelimiterBehavior;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TokenizerError {
    #[error("the model's tokenizer.json cannot be loaded: {0}")]
    Load(String),
    #[error("tokenization failed: {0}")]
    Encode(String),
    #[error("detokenization failed: {0}")]
    Decode(String),
    #[error("the tokenizer worker stopped: {0}")]
    Worker(String),
}

/// A tokenized text: ids and each token's byte span in the text.
#[derive(Debug, Clone, PartialEq)]
pub struct Encoded {
    pub ids: Vec<u32>,
    pub offsets: Vec<(usize, usize)>,
}

#[derive(Clone)]
pub struct Tokenizer {
    inner: Arc<tokenizers::Tokenizer>,
    special_ids: Arc<HashSet<u32>>,
    /// Tokens added to the vocabulary (special or not): their entry is their text as written.
    added_ids: Arc<HashSet<u32>>,
    /// For a byte-level BPE vocabulary, the byte each character of an entry stands for.
    byte_alphabet: Option<Arc<HashMap<char, u8>>>,
    /// A token that decodes to its own entry, as (id, text): what another token says after it
    /// is that token's text in running text (`in_context`).
    anchor: Option<(u32, Arc<str>)>,
    max_bytes_per_token: Option<usize>,
}

impl Tokenizer {
    pub fn from_json(json: &str) -> Result<Self, TokenizerError> {
        let inner: tokenizers::Tokenizer = json
            .parse()
            .map_err(|error: tokenizers::Error| TokenizerError::Load(error.to_string()))?;
        let added = inner.get_added_tokens_decoder();
        let special_ids = added.iter().filter(|(_, token)| token.special).map(|(&id, _)| id).collect();
        let added_ids = added.keys().copied().collect();
        let byte_alphabet = inner.get_decoder().is_some_and(decodes_byte_level).then(|| Arc::new(byte_level_alphabet()));
        let max_bytes_per_token = max_bytes_per_token(&inner);
        let anchor = ["a", "e", "t", "x"].into_iter().find_map(|entry| {
            let id = inner.token_to_id(entry)?;
            (inner.decode(&[id], false).ok()? == entry).then(|| (id, Arc::from(entry)))
        });
        Ok(Self {
            inner: Arc::new(inner),
            special_ids: Arc::new(special_ids),
            added_ids: Arc::new(added_ids),
            byte_alphabet,
            anchor,
            max_bytes_per_token,
        })
    }

    /// The most bytes of input text one token can stand for, when this tokenizer guarantees a
    /// bound (see `max_bytes_per_token`); computed once at start-up. A prompt longer than
    /// `max_input_tokens` times this cannot fit, which validation tells without tokenizing.
    pub fn max_bytes_per_token(&self) -> Option<usize> {
        self.max_bytes_per_token
    }

    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Encoded, TokenizerError> {
        let encoding = self
            .inner
            .encode(text, add_special_tokens)
            .map_err(|error| TokenizerError::Encode(error.to_string()))?;
        Ok(Encoded {
            ids: encoding.get_ids().to_vec(),
            offsets: encoding.get_offsets().to_vec(),
        })
    }

    /// `encode` on the blocking pool.
    #[tracing::instrument(skip_all, fields(characters = text.len()))]
    pub async fn encode_off_executor(
        &self,
        text: String,
        add_special_tokens: bool,
    ) -> Result<Encoded, TokenizerError> {
        let tokenizer = self.clone();
        tokio::task::spawn_blocking(move || tokenizer.encode(&text, add_special_tokens))
            .await
            .map_err(|error| TokenizerError::Worker(error.to_string()))?
    }

    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, TokenizerError> {
        self.inner
            .decode(ids, skip_special_tokens)
            .map_err(|error| TokenizerError::Decode(error.to_string()))
    }

    /// One token on its own, special tokens included (the `text` of TGI's token objects).
    pub fn token_text(&self, id: u32) -> String {
        self.decode(&[id], false).unwrap_or_default()
    }

    /// The id of the token whose vocabulary entry is exactly `text` (an added token's content),
    /// if there is one.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.inner.token_to_id(text)
    }

    /// The vocabulary's entry for `id` as written there (`Ġworld` in a byte-level vocabulary,
    /// `▁world` in SentencePiece's), `None` outside the vocabulary.
    pub fn vocabulary_entry(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    pub fn is_special(&self, id: u32) -> bool {
        self.special_ids.contains(&id)
    }

    /// The ids of those of `texts` that are each one special token (decoding skips them unless
    /// told to keep them).
    pub fn special_ids_of(&self, texts: &[&str]) -> Vec<u32> {
        texts.iter().filter_map(|text| self.token_id(text).filter(|id| self.is_special(*id))).collect()
    }

    /// The bytes one token stands for, which may be part of a UTF-8 character (a byte-level
    /// token of an emoji): read from the vocabulary entry for a byte-level BPE (GPT-2's
    /// alphabet) or a byte-fallback entry (`<0xE2>`); otherwise the token's text in running
    /// text (`in_context`: a SentencePiece `▁world` is ` world`, whose space a decoder strips
    /// from a text's first token). `None` for an id outside the vocabulary.
    pub fn token_bytes(&self, id: u32) -> Option<Vec<u8>> {
        let entry = self.inner.id_to_token(id)?;
        if self.added_ids.contains(&id) {
            return Some(entry.into_bytes());
        }
        if let Some(alphabet) = &self.byte_alphabet {
            if let Some(bytes) = entry.chars().map(|c| alphabet.get(&c).copied()).collect() {
                return Some(bytes);
            }
        }
        if let Some(byte) = fallback_byte(&entry) {
            return Some(vec![byte]);
        }
        Some(self.in_context(id).unwrap_or_else(|| self.token_text(id)).into_bytes())
    }

    /// A token's text after another (the anchor's, taken off), when it decodes so.
    fn in_context(&self, id: u32) -> Option<String> {
        let (anchor, text) = self.anchor.as_ref()?;
        let both = self.decode(&[*anchor, id], false).ok()?;
        both.strip_prefix(&**text).map(str::to_string)
    }
}

/// Whether the decoder maps a byte-level alphabet back to bytes (alone or in a sequence).
fn decodes_byte_level(decoder: &DecoderWrapper) -> bool {
    match decoder {
        DecoderWrapper::ByteLevel(_) => true,
        DecoderWrapper::Sequence(sequence) => sequence.get_decoders().iter().any(decodes_byte_level),
        _ => false,
    }
}

/// GPT-2's byte-level alphabet, inverted: the 188 printable bytes stand for themselves, every
/// other byte for the character 256 + its rank among them.
fn byte_level_alphabet() -> HashMap<char, u8> {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut alphabet = HashMap::with_capacity(256);
    let mut next = 256u32;
    for byte in 0..=255u8 {
        let c = if printable(byte) {
            char::from(byte)
        } else {
            next += 1;
            char::from_u32(next - 1).unwrap_or(char::REPLACEMENT_CHARACTER)
        };
        alphabet.insert(c, byte);
    }
    alphabet
}

/// A SentencePiece byte-fallback entry, `<0xNN>`.
fn fallback_byte(entry: &str) -> Option<u8> {
    let hex = entry.strip_prefix("<0x")?.strip_suffix('>')?;
    (hex.len() == 2).then(|| u8::from_str_radix(hex, 16).ok()).flatten()
}

/// The longest vocabulary entry in bytes, when no token can stand for more input bytes than its
/// entry has: a BPE model that never emits an unknown token for a span it cannot split (no unk
/// token, or byte fallback), no normalizer (NFKC maps a 4-byte character to 1 byte, accent
/// stripping removes characters), and pre-tokenizers that drop no text (BERT's and the
/// whitespace splitters drop spaces). Byte-level alphabets and SentencePiece's "▁" only make
/// an entry longer than the text it covers. `None` otherwise: then only tokenizing can tell.
fn max_bytes_per_token(tokenizer: &tokenizers::Tokenizer) -> Option<usize> {
    let ModelWrapper::BPE(bpe) = tokenizer.get_model() else {
        return None;
    };
    if (bpe.unk_token.is_some() && !bpe.byte_fallback) || tokenizer.get_normalizer().is_some() {
        return None;
    }
    if !tokenizer.get_pre_tokenizer().is_none_or(keeps_all_text) {
        return None;
    }
    tokenizer
        .get_vocab(true)
        .keys()
        .map(String::len)
        .max()
        .filter(|&longest| longest > 0)
}

fn keeps_all_text(pre_tokenizer: &PreTokenizerWrapper) -> bool {
    match pre_tokenizer {
        PreTokenizerWrapper::ByteLevel(_)
        | PreTokenizerWrapper::Metaspace(_)
        | PreTokenizerWrapper::Digits(_)
        | PreTokenizerWrapper::UnicodeScripts(_) => true,
        PreTokenizerWrapper::Split(split) => split.behavior != SplitDelimiterBehavior::Removed,
        PreTokenizerWrapper::Sequence(sequence) => sequence.as_ref().iter().all(keeps_all_text),
        _ => false,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The SmolLM2-135M-Instruct tokenizer (byte-level BPE), exported from the embedded model.
    pub(crate) fn smollm2() -> Tokenizer {
        // Parsed once per test binary: a 1.5 MB tokenizer.json is slow to parse in debug builds.
        static FIXTURE: std::sync::OnceLock<Tokenizer> = std::sync::OnceLock::new();
        FIXTURE
            .get_or_init(|| {
                let path = concat!(
                    env!("CARGO_MANIFEST_DIR"),
                    "/tests/fixtures/smollm2_tokenizer.json"
                );
                let json = std::fs::read_to_string(path).expect("fixture tokenizer.json");
                Tokenizer::from_json(&json).expect("fixture tokenizer loads")
            })
            .clone()
    }

    /// Ids of the reasoning tags in `thinking_json`.
    pub(crate) const THINK: u32 = 49152;
    pub(crate) const END_THINK: u32 = 49153;

    /// A thinking model's tokenizer: SmolLM2's with `<think>` and `</think>` added as tokens of
    /// their own after its vocabulary (ids `THINK`, `END_THINK`; not special, as Qwen 3's and
    /// DeepSeek-R1's are not, so their text stays in the reply).
    pub(crate) fn thinking_json() -> String {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/smollm2_tokenizer.json");
        let mut json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        for (id, content) in [(THINK, "<think>"), (END_THINK, "</think>")] {
            json["added_tokens"].as_array_mut().unwrap().push(serde_json::json!({"id": id, "content": content,
                "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": false}));
        }
        json.to_string()
    }

    #[test]
    fn added_tags_are_one_token_each() {
        let tokenizer = Tokenizer::from_json(&thinking_json()).unwrap();
        assert_eq!((tokenizer.token_id("<think>"), tokenizer.token_id("</think>")), (Some(THINK), Some(END_THINK)));
        assert_eq!(tokenizer.encode("<think>Hi</think>", false).unwrap().ids.first(), Some(&THINK));
        assert_eq!(tokenizer.decode(&[THINK, END_THINK], true).unwrap(), "<think></think>");
        assert_eq!(smollm2().token_id("</think>"), None);
    }

    #[test]
    fn token_bytes_spell_the_text_even_mid_character() {
        let tokenizer = smollm2();
        let text = "héllo 日本語 🤗 <|im_start|>";
        let ids = tokenizer.encode(text, false).unwrap().ids;
        let bytes: Vec<u8> = ids.iter().flat_map(|&id| tokenizer.token_bytes(id).unwrap()).collect();
        assert_eq!(bytes, text.as_bytes());
        // Some token holds part of a character: its bytes are not text on their own.
        assert!(ids.iter().any(|&id| std::str::from_utf8(&tokenizer.token_bytes(id).unwrap()).is_err()));
        assert_eq!(tokenizer.token_bytes(u32::MAX), None);
    }

    /// A SentencePiece vocabulary (Llama 2's decoder: `▁` to space, byte fallback, and the
    /// text's first space stripped).
    fn sentencepiece() -> Tokenizer {
        let json = serde_json::json!({
            "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
            "normalizer": null, "pre_tokenizer": null, "post_processor": null,
            "decoder": {"type": "Sequence", "decoders": [
                {"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "},
                {"type": "ByteFallback"}, {"type": "Fuse"},
                {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
            "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>", "continuing_subword_prefix": null,
                      "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": true,
                      "vocab": {"<unk>": 0, "<0xE2>": 1, "a": 2, "\u{2581}world": 3, "\u{2581}": 4, "ld": 5},
                      "merges": []},
        });
        Tokenizer::from_json(&json.to_string()).unwrap()
    }

    #[test]
    fn sentencepiece_tokens_keep_their_leading_space() {
        let tokenizer = sentencepiece();
        // On its own the decoder strips the space; in running text it is there.
        assert_eq!(tokenizer.token_text(3), "world");
        assert_eq!(tokenizer.token_bytes(3).unwrap(), b" world");
        assert_eq!(tokenizer.token_bytes(4).unwrap(), b" ");
        assert_eq!(tokenizer.token_bytes(5).unwrap(), b"ld");
        assert_eq!(tokenizer.token_bytes(1).unwrap(), [0xE2]);
    }

    #[test]
    fn byte_fallback_entries_are_their_byte() {
        assert_eq!(fallback_byte("<0xE2>"), Some(0xE2));
        assert_eq!(fallback_byte("<0x0A>"), Some(0x0A));
        assert_eq!(fallback_byte("<0xE>"), None);
        assert_eq!(fallback_byte("<s>"), None);
    }

    #[test]
    fn encodes_like_transformers() {
        // Ids from `AutoTokenizer.from_pretrained(<gguf>)("héllo 日本語 🤗").input_ids`.
        let encoded = smollm2().encode("héllo 日本語 🤗", true).unwrap();
        assert_eq!(
            encoded.ids,
            vec![88, 2756, 31394, 17097, 241, 115, 40993, 179, 120, 248, 15107, 114, 241]
        );
        assert_eq!(encoded.offsets.first(), Some(&(0, 1)));
    }

    #[test]
    fn special_tokens_are_known() {
        let tokenizer = smollm2();
        let im_end = tokenizer.encode("<|im_end|>", false).unwrap().ids;
        assert_eq!(im_end, vec![2]);
        assert!(tokenizer.is_special(2));
        assert!(!tokenizer.is_special(88));
        assert_eq!(tokenizer.token_text(2), "<|im_end|>");
        assert_eq!(tokenizer.decode(&[88, 2], true).unwrap(), "h");
    }

    #[test]
    fn byte_level_bpe_bounds_the_bytes_per_token() {
        let tokenizer = smollm2();
        let longest = tokenizer.max_bytes_per_token().expect("byte-level BPE has a bound");
        // Each token of any text covers at most `longest` bytes of it.
        let text = "héllo 日本語 🤗 ".repeat(20) + &"=".repeat(300) + &" ".repeat(300);
        let encoded = tokenizer.encode(&text, false).unwrap();
        for (start, stop) in encoded.offsets {
            assert!(stop - start <= longest, "a token covers {} bytes", stop - start);
        }
    }

    #[test]
    fn a_normalizer_or_an_unknown_token_gives_no_bound() {
        let word_level = r#"{"version": "1.0", "model": {"type": "WordLevel",
            "vocab": {"[UNK]": 0, "a": 1}, "unk_token": "[UNK]"},
            "pre_tokenizer": {"type": "Whitespace"}}"#;
        assert_eq!(Tokenizer::from_json(word_level).unwrap().max_bytes_per_token(), None);
        let normalized = r#"{"version": "1.0", "normalizer": {"type": "NFKC"},
            "model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": []}}"#;
        assert_eq!(Tokenizer::from_json(normalized).unwrap().max_bytes_per_token(), None);
        let plain = r#"{"version": "1.0",
            "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]}}"#;
        assert_eq!(Tokenizer::from_json(plain).unwrap().max_bytes_per_token(), Some(2));
    }

    #[test]
    fn rejects_a_broken_tokenizer_json() {
        assert!(matches!(
            Tokenizer::from_json("{}"),
            Err(TokenizerError::Load(_))
        ));
    }

    #[tokio::test]
    async fn encodes_off_the_executor() {
        let encoded = smollm2()
            .encode_off_executor("Hello world".into(), true)
            .await
            .unwrap();
        assert_eq!(smollm2().decode(&encoded.ids, true).unwrap(), "Hello world");
    }
}
