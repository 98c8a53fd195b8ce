//! From a parsed body to a `ValidRequest`: parameter rules, a bound on the prompt's bytes,
//! tokenization off the executor, truncation and length rules. Also the concurrency permit
//! that a request holds until its response ends: everything that costs CPU time (template
//! rendering, tokenizing, generating) runs under it.
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::state::AppState;
use super::types::GenerateParameters;
use crate::engine::api::{AdapterRef, GenerationRequest, TokenConstraint};
use crate::grammar::{GrammarError, GrammarSpec};
use crate::error::HttpError;
use crate::tokenizer::Tokenizer;
use crate::trace_context;
use crate::validation::{self, ValidParameters};

/// A request that passed validation and is ready for the engine.
#[derive(Debug, Clone)]
pub(crate) struct ValidRequest {
    pub inputs: String,
    pub prompt_ids: Vec<u32>,
    pub parameters: ValidParameters,
    pub max_new_tokens: u32,
    /// When the HTTP layer received the request.
    pub arrival: Instant,
    /// When validation and tokenization finished.
    pub validated: Instant,
    /// The compiled grammar, fresh; each engine request gets its own copy.
    pub constraint: Option<TokenConstraint>,
    /// The LoRA adapter asked for; `None`: the base model.
    pub adapter: Option<AdapterRef>,
}

impl ValidRequest {
    /// The engine's request; `seed` overrides the validated one (best_of candidates). Call it
    /// in the span that submits the request: the steps serving it link to that span.
    pub fn engine_request(&self, seed: Option<u64>) -> GenerationRequest {
        let mut sampling = self.parameters.sampling.clone();
        if let Some(seed) = seed {
            sampling.seed = seed;
        }
        GenerationRequest {
            prompt_token_ids: self.prompt_ids.clone(),
            sampling,
            max_new_tokens: self.max_new_tokens,
            ignore_eos: self.parameters.ignore_eos,
            prompt_logprobs: self.parameters.decoder_input_details || self.parameters.prompt_top_n.is_some(),
            // One list of alternatives serves both: an echo's (`top_n_tokens`) and vLLM's
            // `prompt_logprobs`, each cut to its own count when answered.
            prompt_top_n: self.parameters.prompt_top_n.map(|k| match self.parameters.decoder_input_details {
                true => k.max(self.parameters.top_n_tokens),
                false => k,
            }),
            top_n_tokens: self.parameters.top_n_tokens,
            slo: self.parameters.slo,
            priority: self.parameters.priority,
            arrival: self.arrival,
            span_context: trace_context::span_context(&tracing::Span::current()),
            constraint: self.constraint.clone(),
            adapter: self.adapter.clone(),
        }
    }
}

/// Takes a concurrency permit without waiting: a full server answers 429 at once (TGI).
pub(crate) fn acquire_permit(permits: &Arc<Semaphore>) -> Result<OwnedSemaphorePermit, HttpError> {
    permits
        .clone()
        .try_acquire_owned()
        .map_err(|_| HttpError::Overloaded)
}

/// Validates parameters, tokenizes `inputs`, applies `truncate` and the length rules.
#[tracing::instrument(skip_all, fields(characters = inputs.len()))]
pub(crate) async fn validate_request(
    state: &AppState,
    inputs: String,
    parameters: &GenerateParameters,
    add_special_tokens: bool,
    arrival: Instant,
) -> Result<ValidRequest, HttpError> {
    let (adapter, parameters) = checked_parameters(state, parameters).await?;
    if inputs.is_empty() {
        return Err(validation::ValidationError::EmptyInput.into());
    }
    if parameters.truncate.is_none() {
        let bytes_per_token = state.tokenizer.max_bytes_per_token();
        validation::validate_prompt_bytes(inputs.len(), bytes_per_token, &state.limits)?;
    }
    let encoded = state
        .tokenizer
        .encode_off_executor(inputs.clone(), add_special_tokens)
        .await
        .map_err(|error| HttpError::Tokenizer(error.to_string()))?;
    validated(state, inputs, encoded.ids, parameters, adapter, arrival).await
}

/// Validates a prompt given as token ids (OpenAI's completions take them): used as given, no
/// special token added; each must be one of the model's. Its text is their decoding.
#[tracing::instrument(skip_all, fields(tokens = ids.len()))]
pub(crate) async fn validate_token_prompt(
    state: &AppState,
    ids: Vec<u32>,
    parameters: &GenerateParameters,
    arrival: Instant,
) -> Result<ValidRequest, HttpError> {
    let (adapter, parameters) = checked_parameters(state, parameters).await?;
    if ids.is_empty() {
        return Err(validation::ValidationError::EmptyInput.into());
    }
    in_vocabulary(state, ids.iter().copied())?;
    let inputs = state
        .tokenizer
        .decode(&ids, false)
        .map_err(|error| HttpError::Tokenizer(error.to_string()))?;
    validated(state, inputs, ids, parameters, adapter, arrival).await
}

/// The adapter a request names and its parameters, checked.
async fn checked_parameters(
    state: &AppState,
    parameters: &GenerateParameters,
) -> Result<(Option<AdapterRef>, ValidParameters), HttpError> {
    let raw = parameters;
    let adapter = state.adapter(parameters.adapter_id.as_deref()).await?;
    let mut parameters =
        validation::validate_parameters(parameters, &state.limits, rand::random::<u64>())?;
    in_vocabulary(state, parameters.sampling.logit_bias.iter().map(|&(id, _)| id))?;
    in_vocabulary(state, parameters.stop_token_ids.iter().copied())?;
    in_vocabulary(state, parameters.sampling.allowed_token_ids.iter().copied())?;
    if !raw.bad_words.is_empty() {
        // Two encodes a word, and a request may name thousands: off the executor, as prompts.
        let (tokenizer, words) = (state.tokenizer.clone(), raw.bad_words.clone());
        parameters.sampling.bad_words = tokio::task::spawn_blocking(move || bad_word_ids(&tokenizer, &words))
            .await
            .map_err(|error| HttpError::Tokenizer(error.to_string()))??;
    }
    if parameters.sampling.min_tokens > 0 {
        parameters.sampling.end_token_ids = end_token_ids(state, &parameters);
    }
    Ok((adapter, parameters))
}

/// Each bad word's tokens as the reply would hold it: at the start of the text and after a
/// space (vLLM's rule), each form once. The spaced form is left out where it is longer: the
/// tokenizer then splits the space off as a token of its own, and banning that sequence would
/// ban a plain space before the word's usual form.
fn bad_word_ids(tokenizer: &Tokenizer, words: &[String]) -> Result<Vec<Vec<u32>>, HttpError> {
    let mut sequences: Vec<Vec<u32>> = Vec::new();
    // A request may name thousands: each form is looked up, not compared with every other.
    let mut seen: std::collections::HashSet<Vec<u32>> = std::collections::HashSet::new();
    for word in words {
        let word = word.trim_start();
        let encode = |text: &str| {
            tokenizer.encode(text, false).map(|encoded| encoded.ids).map_err(|error| HttpError::Tokenizer(error.to_string()))
        };
        let plain = encode(word)?;
        let spaced = encode(&format!(" {word}"))?;
        let forms = if spaced.len() > plain.len() { vec![plain] } else { vec![plain, spaced] };
        for form in forms {
            if !form.is_empty() && seen.insert(form.clone()) {
                sequences.push(form);
            }
        }
    }
    Ok(sequences)
}

/// The tokens that would end a generation with these parameters: the model's EOS (unless
/// `ignore_eos`) and the request's stop tokens, in the vocabulary, each once.
fn end_token_ids(state: &AppState, parameters: &validation::ValidParameters) -> Vec<u32> {
    let eos = if parameters.ignore_eos { &[][..] } else { &state.info.eos_token_ids[..] };
    let mut ids: Vec<u32> = eos.iter().chain(&parameters.stop_token_ids).copied().filter(|&id| id < state.info.vocab_size).collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// Token ids a request names itself (a prompt, a logit bias, stop tokens) must be the model's.
pub(super) fn in_vocabulary(state: &AppState, mut ids: impl Iterator<Item = u32>) -> Result<(), HttpError> {
    let vocab_size = state.info.vocab_size;
    match ids.find(|&id| id >= vocab_size) {
        Some(id) => Err(validation::ValidationError::TokenId(id, vocab_size).into()),
        None => Ok(()),
    }
}

/// The rules both prompt forms share once tokenized: `truncate`, the lengths, the grammar.
async fn validated(
    state: &AppState,
    inputs: String,
    ids: Vec<u32>,
    parameters: ValidParameters,
    adapter: Option<AdapterRef>,
    arrival: Instant,
) -> Result<ValidRequest, HttpError> {
    let keep = validation::truncated_length(ids.len(), parameters.truncate);
    let prompt_ids = ids[ids.len() - keep..].to_vec();
    let max_new_tokens =
        validation::validate_length(prompt_ids.len(), parameters.max_new_tokens, &state.limits)?;
    let constraint = match &parameters.grammar {
        Some(spec) => {
            let constraint = compile_grammar(state, spec.clone()).await?;
            match state.reasoning_tokens.zip(state.config.reasoning_parser).filter(|_| parameters.reasoning_first) {
                Some((tokens, parser)) => Some(constraint.after_reasoning(tokens, parser.open_in_prompt(&inputs))),
                None => Some(constraint),
            }
        }
        None => None,
    };
    Ok(ValidRequest {
        inputs,
        prompt_ids,
        parameters,
        max_new_tokens,
        arrival,
        validated: Instant::now(),
        constraint,
        adapter,
    })
}

/// Compiles a grammar on the blocking pool: a large JSON schema can take milliseconds.
#[tracing::instrument(skip_all)]
async fn compile_grammar(state: &AppState, spec: GrammarSpec) -> Result<TokenConstraint, HttpError> {
    let compiler = state
        .grammar
        .clone()
        .map_err(|error| validation::ValidationError::GrammarUnavailable(error.to_string()))?;
    // A compilation that panicked is this grammar's failure, like one that returned an error.
    let compiled = tokio::task::spawn_blocking(move || compiler.compile(&spec))
        .await
        .map_err(|error| validation::ValidationError::InvalidGrammar(format!("the compiler failed: {error}")))?;
    compiled.map_err(|error| match error {
        GrammarError::Unavailable(why) => validation::ValidationError::GrammarUnavailable(why).into(),
        other => validation::ValidationError::InvalidGrammar(other.to_string()).into(),
    })
}
