//! Constrained decoding: a request's grammar (TGI's `grammar`, OpenAI's `response_format`)
//! compiled by llguidance into a per-request matcher that gives the tokens allowed next.
//! - `spec`: what clients may ask for, parsed and checked without compiling.
//! - `token_env`: llguidance's view of the model's tokenizer (each token's bytes, and the
//!   router's own tokenizer for tokenizing), built once at start-up.
//! - `compiler`: the `ParserFactory` over that view, shared by every request; compiles a spec.
//! - `unlisted`: the server's reading of an object schema's unlisted properties (closed by
//!   default), applied to every JSON schema before it is compiled.
//! - `constraint`: one request's matcher: its allowed-token bitmask (the Step's
//!   `allowed_tokens`) and its advance on every sampled token.
//!
//! The HTTP layer compiles a request's grammar during validation (off the async executor); the
//! engine owns each matcher with its request, computes masks for the requests a step samples
//! and advances them with the tokens that come back. A recomputed or rotated request keeps its
//! matcher untouched: only a newly sampled token moves it.
pub(crate) mod compiler;
mod constraint;
mod spec;
mod token_env;
mod unlisted;

pub use compiler::GrammarCompiler;
pub use constraint::{Advance, ReasoningTokens, TokenConstraint};
pub use spec::{GrammarSpec, ResponseFormat, StructuredOutputs};
pub use unlisted::UnlistedProperties;

/// Why a grammar cannot be served. Each is the request's own failure (422 at validation, or
/// the request alone fails while generating).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum GrammarError {
    /// The model's tokenizer gives llguidance no byte view of its tokens (decided at start-up).
    #[error("grammars are not available for this model's tokenizer: {0}")]
    Unavailable(String),
    /// The server was started with `--disable-grammar-support`.
    #[error("disabled by --disable-grammar-support")]
    Disabled,
    /// llguidance could not compile the schema or regex; its message.
    #[error("{0}")]
    Compile(String),
    /// The matcher failed while generating (a token outside the grammar, an internal limit).
    #[error("the grammar failed while generating: {0}")]
    Matcher(String),
}
