//! The model's tokenizer (built from the `tokenizer.json` the shard sends), shared read-only by
//! every request. Encoding runs on tokio's blocking pool so that long prompts never stall the
//! async executor.
use std::collections::HashSet;
use std::sync::Arc;

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
}

impl Tokenizer {
    pub fn from_json(json: &str) -> Result<Self, TokenizerError> {
        let inner: tokenizers::Tokenizer = json
            .parse()
            .map_err(|error: tokenizers::Error| TokenizerError::Load(error.to_string()))?;
        let special_ids = inner
            .get_added_tokens_decoder()
            .into_iter()
            .filter(|(_, token)| token.special)
            .map(|(id, _)| id)
            .collect();
        Ok(Self {
            inner: Arc::new(inner),
            special_ids: Arc::new(special_ids),
        })
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

    pub fn is_special(&self, id: u32) -> bool {
        self.special_ids.contains(&id)
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
