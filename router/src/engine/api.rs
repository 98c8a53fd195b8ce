//! The request-level interface between the HTTP layer and the engine. The HTTP layer validates
//! and tokenizes, then hands a `GenerationRequest` to `EngineHandle::submit` and reads
//! `EngineEvent`s from the returned `RequestStream`. Dropping the stream cancels the request
//! (the engine frees its KV blocks within one step): that is how a disconnected client, a
//! matched stop sequence, or a finished `best_of` candidate releases its resources.
//!
//! The engine owns end-of-generation by token count and EOS; stop sequences are text-level
//! and belong to the HTTP layer, which stops reading and drops the stream.

use std::time::Instant;

pub use opentelemetry::trace::SpanContext;
pub use crate::grammar::TokenConstraint;
pub use superinfer_scheduler::Slo;

/// Sampling parameters as the shard applies them (`proto/shard.proto`, `SamplingParameters`).
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    pub do_sample: bool,
    pub temperature: f32,
    /// 0: no top-k restriction.
    pub top_k: u32,
    /// 1.0: no nucleus restriction.
    pub top_p: f32,
    /// 1.0: no typical-p restriction.
    pub typical_p: f32,
    /// 0.0: none; else tokens below min_p × the most likely one's probability are left out.
    pub min_p: f32,
    /// 1.0: none.
    pub repetition_penalty: f32,
    /// 0.0: none.
    pub frequency_penalty: f32,
    /// 0.0: none; subtracted from each token generated at least once.
    pub presence_penalty: f32,
    pub seed: u64,
    /// (token id, bias) added to the logits the choice is made on (OpenAI's `logit_bias`),
    /// by token id.
    pub logit_bias: Vec<(u32, f32)>,
    /// vLLM's `min_tokens`: until this many tokens are generated the shard gives
    /// `end_token_ids` no probability.
    pub min_tokens: u32,
    /// The tokens that would end the generation (the model's EOS unless `ignore_eos`, the
    /// request's stop tokens); empty without `min_tokens`.
    pub end_token_ids: Vec<u32>,
    /// Empty: every token; else only these may be chosen (vLLM's `allowed_token_ids`), sorted.
    pub allowed_token_ids: Vec<u32>,
    /// Token sequences that may not be generated (vLLM's `bad_words`, tokenized): the shard
    /// leaves out the last token of each where the generated tokens end with the rest of it.
    pub bad_words: Vec<Vec<u32>>,
}

impl SamplingParams {
    /// Greedy decoding with no penalties: what `do_sample: false` means.
    pub fn greedy() -> Self {
        Self {
            do_sample: false,
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            typical_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            seed: 0,
            logit_bias: Vec::new(),
            min_tokens: 0,
            end_token_ids: Vec::new(),
            allowed_token_ids: Vec::new(),
            bad_words: Vec::new(),
        }
    }
}

/// A validated, tokenized request.
#[derive(Debug, Clone)]
pub struct GenerationRequest {
    pub prompt_token_ids: Vec<u32>,
    pub sampling: SamplingParams,
    /// Tokens to generate at most; the engine ends the request with `FinishReason::Length`.
    pub max_new_tokens: u32,
    /// Keep generating past EOS tokens (benchmarks reproduce recorded output lengths).
    pub ignore_eos: bool,
    /// Ask for the logprob of every prompt token (TGI's `decoder_input_details`).
    pub prompt_logprobs: bool,
    /// With `prompt_logprobs`: alternatives at each prompt position (vLLM's `prompt_logprobs`);
    /// `None`: `top_n_tokens`.
    pub prompt_top_n: Option<u32>,
    /// Alternatives to report with each generated token.
    pub top_n_tokens: u32,
    /// Objectives (seconds; validation converts the API's milliseconds); `None` takes the
    /// server's defaults (the scheduler's `default_slo`).
    pub slo: Option<Slo>,
    /// Priority class: lower is served first; 0 by default.
    pub priority: i32,
    /// When the HTTP layer received the request (queue time and TTFT are measured from here).
    pub arrival: Instant,
    /// The trace span that submitted the request (the HTTP layer's): every step that computes
    /// or moves the request links to it. Invalid when traces are off.
    pub span_context: SpanContext,
    /// The grammar the output must follow, fresh (no token consumed); the engine takes it and
    /// advances it with every sampled token.
    pub constraint: Option<TokenConstraint>,
    /// The LoRA adapter the request runs with; `None`: the base model.
    pub adapter: Option<AdapterRef>,
}

/// A LoRA adapter the shard loaded: the id requests and the shard name it by, and its slot,
/// which is its KV namespace too (from 1; 0 is the base model's, `adapters::AdapterRegistry`
/// never gives a slot twice): it keeps prefix-cache blocks of different adapters apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdapterRef {
    pub id: String,
    pub namespace: u64,
    /// One count per reference: the registry's own, and one for each request that holds the
    /// adapter, so `--max-loras` evicts none a request holds (`Arc<()>` compares equal).
    pub(crate) held: std::sync::Arc<()>,
}

impl AdapterRef {
    pub fn new(id: impl Into<String>, namespace: u64) -> Self {
        Self { id: id.into(), namespace, held: std::sync::Arc::new(()) }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    pub id: u32,
    pub logprob: f32,
}

#[derive(Debug, Clone, PartialEq)]
pub struct GeneratedToken {
    pub id: u32,
    pub logprob: f32,
    /// The `top_n_tokens` most likely tokens, most likely first.
    pub top_tokens: Vec<TokenLogprob>,
    /// Whether the token is one of the model's EOS tokens.
    pub is_eos: bool,
    /// Whether the token completes the request's grammar, which then ends the request.
    pub completes_grammar: bool,
}

/// One prompt token's logprob, predicted from the positions before it, its rank there (1: the
/// most likely), and the most likely tokens at its position (most likely first; as many as the
/// request's `prompt_top_n`, or `top_n_tokens`).
#[derive(Debug, Clone, PartialEq)]
pub struct PromptLogprob {
    pub logprob: f32,
    pub rank: u32,
    pub top_tokens: Vec<TokenLogprob>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// `max_new_tokens` reached.
    Length,
    /// An EOS token was generated (and `ignore_eos` is off), or the request's grammar is
    /// complete and allows nothing more (TGI ends such a request with EOS too).
    EosToken,
}

/// Timestamps the engine observed for one request (for TGI's x-*-time headers and metrics).
#[derive(Debug, Clone, Copy)]
pub struct RequestTimings {
    /// First time the request was part of a Step.
    pub first_scheduled: Instant,
    pub finished: Instant,
}

#[derive(Debug, Clone)]
pub enum EngineEvent {
    /// The request was first scheduled: `cached_tokens` of its prompt came from the prefix cache
    /// (their KV was not computed). Sent again if a shard recovery schedules it afresh.
    Scheduled { cached_tokens: u32 },
    /// Logprobs of prompt tokens 1.. (position 0 has none), sent once prefill completes.
    PromptLogprobs(Vec<PromptLogprob>),
    /// One generated token. Sent for every token, including the last one.
    Token(GeneratedToken),
    /// The generation ended; no more events follow.
    Finished { reason: FinishReason, timings: RequestTimings },
    /// The generation failed (e.g. the shard failed); no more events follow.
    Failed(EngineError),
}

#[derive(Debug, Clone, thiserror::Error, PartialEq)]
pub enum EngineError {
    /// The shard failed or disconnected while it held the request; the message is the shard's.
    #[error("shard error: {0}")]
    Shard(String),
    /// The shard failed and the engine is waiting for it to answer again; the request was not
    /// started. Retrying later (or elsewhere) can succeed.
    #[error("the shard is recovering from a failure ({0}); try again shortly")]
    Unavailable(String),
    /// The server is shutting down: requests in flight finish, new ones are refused.
    #[error("the server is shutting down")]
    Draining,
    /// This request failed on its own on the shard (e.g. its next token could not be sampled);
    /// the other requests were unaffected.
    #[error("the request failed on the shard: {0}")]
    Request(String),
    /// The request can never fit into the KV cache (more blocks than the pool has).
    #[error("request needs {needed} KV blocks but the pool has {available}")]
    TooLarge { needed: u32, available: u32 },
    /// The engine is shutting down or has stopped.
    #[error("the engine has stopped")]
    Stopped,
    /// The scheduler refused the request for another reason (e.g. an empty prompt).
    #[error("request refused: {0}")]
    Rejected(String),
    /// `--admission slo`: its first token is predicted too late to meet its objective.
    #[error("the first token is predicted in {predicted_ms} ms, over the {objective_ms} ms objective; retry after {retry_after_s} s or elsewhere")]
    SloUnreachable { predicted_ms: u64, objective_ms: u64, retry_after_s: u64 },
    /// `--queue-timeout-ms`: it waited in the queue past its first-token deadline by more than
    /// the time-out, without starting.
    #[error("the request waited {waited_ms} ms in the queue without starting, past its first-token objective and the queue time-out")]
    QueueTimeout { waited_ms: u64 },
}

impl EngineError {
    /// Seconds after which a retry may succeed here, when known: a refusal during recovery (the
    /// next probe) or by SLO admission (its own estimate). A draining server will not take it
    /// again, and the others fail for the request itself.
    pub fn retry_after_s(&self) -> Option<u64> {
        match self {
            EngineError::Unavailable(_) => Some(super::recovery::recovery_retry_after_s()),
            EngineError::SloUnreachable { retry_after_s, .. } => Some(*retry_after_s),
            _ => None,
        }
    }
}
