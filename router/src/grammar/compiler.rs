//! The grammar compiler: llguidance's `ParserFactory` over the model's tokenizer, built once at
//! start-up and shared (read-only) by every request. Compiling a JSON schema can take
//! milliseconds, so callers run it off the async executor.
use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use serde_json::Value;

use super::constraint::TokenConstraint;
use super::token_env::token_env;
use super::unlisted::{close_listed_objects, UnlistedProperties};
use super::{GrammarError, GrammarSpec};
use crate::tokenizer::Tokenizer;

#[derive(Clone)]
pub struct GrammarCompiler {
    factory: Arc<ParserFactory>,
    unlisted: UnlistedProperties,
}

impl std::fmt::Debug for GrammarCompiler {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("GrammarCompiler").field("vocab_size", &self.vocab_size()).finish()
    }
}

impl GrammarCompiler {
    /// `tokenizer_json` and `tokenizer` describe the same tokenizer (the shard's `Info`);
    /// `model_vocab_size` is the width of the model's logits.
    pub fn new(
        tokenizer_json: &str,
        tokenizer: Tokenizer,
        eos_token_ids: &[u32],
        model_vocab_size: u32,
    ) -> Result<Self, GrammarError> {
        let env = token_env(tokenizer_json, tokenizer, eos_token_ids, model_vocab_size)?;
        let mut factory = ParserFactory::new_simple(&env).map_err(|error| GrammarError::Unavailable(error.to_string()))?;
        // Compile errors reach the client; nothing goes to stderr.
        factory.quiet();
        Ok(Self { factory: Arc::new(factory), unlisted: UnlistedProperties::default() })
    }

    /// How JSON schemas' objects treat the properties they do not list (closed by default).
    pub fn with_unlisted_properties(self, unlisted: UnlistedProperties) -> Self {
        Self { unlisted, ..self }
    }

    /// Tokens the masks cover (the tokenizer's vocabulary, at most the model's).
    pub fn vocab_size(&self) -> usize {
        self.factory.tok_env().tok_trie().vocab_size()
    }

    /// A fresh matcher for `spec`, or llguidance's reason it cannot compile.
    pub fn compile(&self, spec: &GrammarSpec) -> Result<TokenConstraint, GrammarError> {
        let grammar = match spec {
            GrammarSpec::JsonSchema(schema) => {
                let schema = match self.unlisted {
                    UnlistedProperties::Forbid => close_listed_objects(schema.clone()),
                    UnlistedProperties::Allow => schema.clone(),
                };
                TopLevelGrammar::from_json_schema(compact(schema))
            }
            GrammarSpec::Regex(regex) => TopLevelGrammar::from_regex(regex),
        };
        let parser = self.factory.create_parser(grammar).map_err(|error| GrammarError::Compile(error.to_string()))?;
        let matcher = Matcher::new(Ok(parser));
        match matcher.get_error() {
            Some(error) => Err(GrammarError::Compile(error)),
            None => Ok(TokenConstraint::new(matcher)),
        }
    }
}

/// JSON without optional whitespace (`{"a":1,"b":[2,3]}`), unless the schema chooses its own
/// layout with llguidance's `x-guidance` options: a small model given room for whitespace may
/// spend its whole budget on it, and a value that cannot grow ends the generation at once.
fn compact(mut schema: Value) -> Value {
    if let Value::Object(object) = &mut schema {
        object
            .entry("x-guidance")
            .or_insert_with(|| serde_json::json!({"whitespace_flexible": false}));
    }
    schema
}

#[cfg(test)]
pub(crate) mod tests {
    use serde_json::json;

    use super::*;
    use crate::tokenizer::tests::smollm2;

    /// The compiler over the SmolLM2 tokenizer (EOS `<|im_end|>` and `<|endoftext|>`), built once
    /// per test binary.
    pub(crate) fn smollm2_compiler() -> GrammarCompiler {
        static FIXTURE: std::sync::OnceLock<GrammarCompiler> = std::sync::OnceLock::new();
        FIXTURE
            .get_or_init(|| {
                let json = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/smollm2_tokenizer.json"))
                    .expect("fixture tokenizer.json");
                GrammarCompiler::new(&json, smollm2(), &[2, 0], 49152).expect("the SmolLM2 tokenizer supports grammars")
            })
            .clone()
    }

    /// The compiler over a thinking model's tokenizer (`tokenizer::tests::thinking_json`).
    pub(crate) fn thinking_compiler() -> GrammarCompiler {
        let json = crate::tokenizer::tests::thinking_json();
        let tokenizer = crate::tokenizer::Tokenizer::from_json(&json).unwrap();
        GrammarCompiler::new(&json, tokenizer, &[2, 0], 49154).expect("the tokenizer supports grammars")
    }

    #[test]
    fn schemas_and_regexes_compile() {
        let compiler = smollm2_compiler();
        assert_eq!(compiler.vocab_size(), 49152);
        for spec in [
            GrammarSpec::JsonSchema(json!({"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]})),
            GrammarSpec::JsonSchema(json!({"$defs": {"n": {"type": "integer"}}, "type": "array", "items": {"$ref": "#/$defs/n"}})),
            GrammarSpec::JsonSchema(json!({"anyOf": [{"type": "string", "format": "date"}, {"enum": [1, 2]}]})),
            GrammarSpec::Regex("[0-9]{3}-[a-z]+".into()),
        ] {
            assert!(compiler.compile(&spec).is_ok(), "{spec:?}");
        }
    }

    #[test]
    fn what_llguidance_cannot_compile_is_a_compile_error_with_its_message() {
        let compiler = smollm2_compiler();
        for (spec, expected) in [
            (GrammarSpec::JsonSchema(json!({"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}, "required": ["a"]})), "missing"),
            (GrammarSpec::JsonSchema(json!({"type": "integer", "minimum": 5, "maximum": 1})), "nsatisfiable"),
            (GrammarSpec::JsonSchema(json!({"type": "frobnicate"})), "frobnicate"),
            (GrammarSpec::Regex("a(b".into()), "regex"),
        ] {
            match compiler.compile(&spec) {
                Err(GrammarError::Compile(message)) => assert!(message.contains(expected), "{spec:?}: {message}"),
                other => panic!("{spec:?} compiled: {:?}", other.map(|_| ())),
            }
        }
    }

    #[test]
    fn a_tokenizer_without_a_byte_view_or_eos_disables_grammars() {
        let json = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/smollm2_tokenizer.json")).unwrap();
        assert!(matches!(GrammarCompiler::new(&json, smollm2(), &[], 49152), Err(GrammarError::Unavailable(_))));
        let word_level = r#"{"version":"1.0","added_tokens":[],"decoder":null,"model":{"type":"WordLevel","vocab":{"a":0},"unk_token":"a"}}"#;
        assert!(matches!(GrammarCompiler::new(word_level, smollm2(), &[0], 1), Err(GrammarError::Unavailable(_))));
    }
}
