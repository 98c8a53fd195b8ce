//! Request validation: pure functions from the client's parameters to what the engine runs,
//! with TGI's rules, limits and messages (every message is shown to clients behind the
//! "Input validation error: " prefix that `HttpError` adds). Owns no state.
mod error;
#[cfg(test)]
mod tests;

pub use error::ValidationError;

use crate::engine::api::{SamplingParams, Slo};
use crate::grammar::GrammarSpec;
use crate::http::types::{GenerateParameters, SloParameters};

/// Longest stop sequence, in bytes. The stop matcher rescans the last `longest` bytes of the
/// output on every token, so a long sequence costs every token of the request; 1 KiB is far
/// above any real stop string.
pub const MAX_STOP_SEQUENCE_BYTES: usize = 1024;

/// Longest latency objective, in milliseconds (one hour). The engine turns objectives into
/// `Duration`s and deadlines; an hour is beyond any objective worth scheduling for and keeps
/// every deadline representable.
pub const MAX_SLO_MS: f64 = 3_600_000.0;

/// Server limits the rules check against (from the CLI, via `HttpConfig`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ValidationLimits {
    pub max_best_of: usize,
    pub max_stop_sequences: usize,
    pub max_top_n_tokens: u32,
    pub max_input_tokens: usize,
    pub max_total_tokens: usize,
}

/// Parameters that passed every rule that does not need the token count.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidParameters {
    pub sampling: SamplingParams,
    pub best_of: usize,
    /// `None`: as many as `max_total_tokens` leaves room for (decided once the prompt is
    /// tokenized, by `validate_length`).
    pub max_new_tokens: Option<u32>,
    pub stop: Vec<String>,
    /// Leave a matched stop sequence out of the output (OpenAI's routes).
    pub trim_stop_sequences: bool,
    /// Special tokens' text stays in the output (but the ending EOS's).
    pub keep_special_tokens: bool,
    /// While the others are skipped, these special tokens' text stays.
    pub kept_special_tokens: Vec<u32>,
    /// Sampling one of these ends the generation (`stop_sequence`).
    pub stop_token_ids: Vec<u32>,
    pub truncate: Option<usize>,
    pub top_n_tokens: u32,
    /// vLLM's `prompt_logprobs`: the prompt's logprobs with this many alternatives each.
    pub prompt_top_n: Option<u32>,
    pub details: bool,
    pub decoder_input_details: bool,
    pub return_full_text: bool,
    pub ignore_eos: bool,
    pub slo: Option<Slo>,
    /// Priority class (lower first; 0 when the request names none).
    pub priority: i32,
    /// The grammar the output must follow, parsed; the HTTP layer compiles it.
    pub grammar: Option<GrammarSpec>,
    /// The grammar holds only after the reply's reasoning (`GenerateParameters::reasoning_first`).
    pub reasoning_first: bool,
}

/// Checks every token-count-independent rule, in TGI's order. `random_seed` is used when the
/// request samples without a seed (passed in so that this stays a pure function).
pub fn validate_parameters(
    parameters: &GenerateParameters,
    limits: &ValidationLimits,
    random_seed: u64,
) -> Result<ValidParameters, ValidationError> {
    let grammar = parameters
        .grammar
        .as_ref()
        .map(GrammarSpec::from_tgi)
        .transpose()
        .map_err(ValidationError::InvalidGrammar)?;
    if parameters.watermark {
        return Err(ValidationError::Watermark);
    }
    let best_of = validate_best_of(parameters, limits)?;
    let mut sampling = validate_sampling(parameters)?;
    if parameters.max_new_tokens == Some(0) {
        return Err(ValidationError::NegativeMaxNewTokens);
    }
    if let Some(max) = parameters.max_new_tokens.filter(|&max| parameters.min_tokens > max) {
        return Err(ValidationError::MinTokens(parameters.min_tokens, max));
    }
    validate_stop(&parameters.stop, limits)?;
    sampling.seed = match parameters.seed {
        Some(_) if best_of > 1 => return Err(ValidationError::BestOfSeed),
        Some(seed) => seed,
        None => random_seed,
    };
    let top_n_tokens = parameters.top_n_tokens.unwrap_or(0);
    if top_n_tokens > limits.max_top_n_tokens {
        return Err(ValidationError::TopNTokens(
            limits.max_top_n_tokens,
            top_n_tokens,
        ));
    }
    let prompt_top_n = match parameters.prompt_logprobs {
        None => None,
        Some(k) => match u32::try_from(k).ok().filter(|&k| k <= limits.max_top_n_tokens) {
            Some(k) => Some(k),
            None => return Err(ValidationError::PromptLogprobs(limits.max_top_n_tokens, k)),
        },
    };
    let truncate = match parameters.truncate {
        Some(value) if value == 0 || value > limits.max_input_tokens => {
            return Err(ValidationError::Truncate(limits.max_input_tokens, value))
        }
        other => other,
    };
    let slo = parameters.slo.as_ref().map(validate_slo).transpose()?;
    let priority = validate_priority(parameters.priority)?;
    Ok(ValidParameters {
        sampling,
        best_of,
        max_new_tokens: parameters.max_new_tokens,
        stop: parameters.stop.clone(),
        trim_stop_sequences: parameters.trim_stop_sequences,
        keep_special_tokens: parameters.keep_special_tokens,
        kept_special_tokens: parameters.kept_special_tokens.clone(),
        stop_token_ids: parameters.stop_token_ids.clone(),
        truncate,
        top_n_tokens,
        prompt_top_n,
        details: parameters.details,
        decoder_input_details: parameters.decoder_input_details,
        return_full_text: parameters.return_full_text.unwrap_or(false),
        ignore_eos: parameters.ignore_eos,
        slo,
        priority,
        grammar,
        reasoning_first: parameters.reasoning_first,
    })
}

/// Priority classes the server takes: any integer of this magnitude (vLLM takes any integer;
/// the bound keeps the class a 32-bit label).
pub const MAX_PRIORITY: i64 = 1_000_000;

fn validate_priority(priority: Option<i64>) -> Result<i32, ValidationError> {
    match priority {
        None => Ok(0),
        Some(p) if (-MAX_PRIORITY..=MAX_PRIORITY).contains(&p) => Ok(p as i32),
        Some(p) => Err(ValidationError::Priority(-MAX_PRIORITY, MAX_PRIORITY, p)),
    }
}

/// The sampling values, in TGI's order of checks (the seed is decided by the caller).
/// OpenAI's range: -100 (the token is banned in effect) to 100 (it is all but certain).
fn validate_logit_bias(bias: &[(u32, f32)]) -> Result<Vec<(u32, f32)>, ValidationError> {
    if let Some(&(id, value)) = bias.iter().find(|(_, value)| !(-100.0..=100.0).contains(value)) {
        return Err(ValidationError::LogitBias(id, value));
    }
    let mut bias = bias.to_vec();
    bias.sort_by_key(|&(id, _)| id);
    Ok(bias)
}

fn validate_sampling(parameters: &GenerateParameters) -> Result<SamplingParams, ValidationError> {
    for (name, value) in [
        ("temperature", parameters.temperature),
        ("repetition_penalty", parameters.repetition_penalty),
        ("frequency_penalty", parameters.frequency_penalty),
        ("presence_penalty", parameters.presence_penalty),
        ("top_p", parameters.top_p),
        ("typical_p", parameters.typical_p),
        ("min_p", parameters.min_p),
    ] {
        // NaN cannot come from JSON, but the range rules below would let +inf through.
        if value.is_some_and(|value| !value.is_finite()) {
            return Err(ValidationError::NotFinite(name));
        }
    }
    let temperature = parameters.temperature.unwrap_or(1.0);
    if !(temperature > 0.0) {
        return Err(ValidationError::Temperature);
    }
    let repetition_penalty = parameters.repetition_penalty.unwrap_or(1.0);
    if !(repetition_penalty > 0.0) {
        return Err(ValidationError::RepetitionPenalty);
    }
    let frequency_penalty = parameters.frequency_penalty.unwrap_or(0.0);
    if !(-2.0..=2.0).contains(&frequency_penalty) {
        return Err(ValidationError::FrequencyPenalty);
    }
    let top_p = open_unit_interval(parameters.top_p, ValidationError::TopP)?;
    let typical_p = open_unit_interval(parameters.typical_p, ValidationError::TypicalP)?;
    let presence_penalty = parameters.presence_penalty.unwrap_or(0.0);
    if !(-2.0..=2.0).contains(&presence_penalty) {
        return Err(ValidationError::PresencePenalty);
    }
    let min_p = parameters.min_p.unwrap_or(0.0);
    if !(0.0..=1.0).contains(&min_p) {
        return Err(ValidationError::MinP);
    }
    let allowed_token_ids = match &parameters.allowed_token_ids {
        Some(ids) if ids.is_empty() => return Err(ValidationError::AllowedTokenIds),
        Some(ids) => {
            let mut ids = ids.clone();
            ids.sort_unstable();
            ids.dedup();
            ids
        }
        None => Vec::new(),
    };
    if parameters.bad_words.iter().any(|word| word.trim().is_empty()) {
        return Err(ValidationError::BadWords);
    }
    let top_k = match parameters.top_k {
        Some(value) if value <= 0 => return Err(ValidationError::TopK),
        Some(value) => value as u32,
        None => 0,
    };
    // TGI samples whenever a warper is set, even without `do_sample`.
    let do_sample =
        parameters.do_sample || temperature != 1.0 || top_k > 0 || top_p < 1.0 || typical_p < 1.0;
    Ok(SamplingParams {
        do_sample,
        temperature,
        top_k,
        top_p,
        typical_p,
        min_p,
        repetition_penalty,
        frequency_penalty,
        presence_penalty,
        seed: 0,
        logit_bias: validate_logit_bias(&parameters.logit_bias)?,
        min_tokens: parameters.min_tokens,
        // The HTTP layer, which knows the model's EOS, names them (`with_end_tokens`).
        end_token_ids: Vec::new(),
        allowed_token_ids,
        // The HTTP layer, which has the tokenizer, tokenizes them (`bad_word_ids`).
        bad_words: Vec::new(),
    })
}

fn validate_best_of(
    parameters: &GenerateParameters,
    limits: &ValidationLimits,
) -> Result<usize, ValidationError> {
    let best_of = parameters.best_of.unwrap_or(1);
    if best_of == 0 || best_of > limits.max_best_of {
        return Err(ValidationError::BestOf(limits.max_best_of, best_of));
    }
    let sampling = parameters.do_sample
        || parameters.temperature.is_some()
        || parameters.top_k.is_some()
        || parameters.top_p.is_some()
        || parameters.typical_p.is_some();
    if best_of > 1 && !sampling {
        return Err(ValidationError::BestOfSampling);
    }
    Ok(best_of)
}

/// `top_p` and `typical_p` must lie strictly inside (0, 1); absent means 1.0 (no restriction).
fn open_unit_interval(value: Option<f32>, error: ValidationError) -> Result<f32, ValidationError> {
    match value {
        Some(value) if !(value > 0.0 && value < 1.0) => Err(error),
        Some(value) => Ok(value),
        None => Ok(1.0),
    }
}

/// The count rule first (TGI's), then each sequence's length. Empty sequences are allowed:
/// the stop matcher ignores them.
fn validate_stop(stop: &[String], limits: &ValidationLimits) -> Result<(), ValidationError> {
    if stop.len() > limits.max_stop_sequences {
        return Err(ValidationError::StopSequence(
            limits.max_stop_sequences,
            stop.len(),
        ));
    }
    match stop.iter().map(String::len).max() {
        Some(longest) if longest > MAX_STOP_SEQUENCE_BYTES => Err(
            ValidationError::StopSequenceLength(MAX_STOP_SEQUENCE_BYTES, longest),
        ),
        _ => Ok(()),
    }
}

fn validate_slo(slo: &SloParameters) -> Result<Slo, ValidationError> {
    let stall = slo.max_stall_ms.map(|value| ("max_stall_ms", value));
    for (name, value) in [("ttft_ms", slo.ttft_ms), ("tbt_ms", slo.tbt_ms)].into_iter().chain(stall) {
        if !(value.is_finite() && value > 0.0) {
            return Err(ValidationError::Slo(name));
        }
        if value > MAX_SLO_MS {
            return Err(ValidationError::SloAboveLimit(name, MAX_SLO_MS, value));
        }
    }
    if let Some(stall) = slo.max_stall_ms.filter(|stall| *stall < slo.tbt_ms) {
        return Err(ValidationError::StallBelowTbt(slo.tbt_ms, stall));
    }
    // The API speaks milliseconds; everything past validation, seconds.
    Ok(Slo::new(slo.ttft_ms / 1e3, slo.tbt_ms / 1e3).with_max_stall(slo.max_stall_ms.map(|ms| ms / 1e3)))
}

/// Rules for streamed requests, checked before anything is scheduled. `streams_prompt`: the
/// stream has a place for the prompt's details (an echoed completion's first chunk); TGI's
/// has none.
pub fn validate_stream(parameters: &ValidParameters, streams_prompt: bool) -> Result<(), ValidationError> {
    if parameters.best_of > 1 {
        return Err(ValidationError::BestOfStream);
    }
    if parameters.decoder_input_details && !streams_prompt {
        return Err(ValidationError::PrefillDetailsStream);
    }
    // vLLM's rule: a stream has no place for them (0 asks for none, and is let through).
    if parameters.prompt_top_n.is_some_and(|k| k > 0) {
        return Err(ValidationError::PromptLogprobsStream);
    }
    Ok(())
}

/// Refuses, without tokenizing, a prompt too long to fit even if every token were the
/// vocabulary's longest: `max_bytes_per_token` is the most input bytes one token can stand for
/// (`None` when the tokenizer guarantees no such bound). Only for requests without `truncate`,
/// whose prompts may be longer than the limit.
pub fn validate_prompt_bytes(
    prompt_bytes: usize,
    max_bytes_per_token: Option<usize>,
    limits: &ValidationLimits,
) -> Result<(), ValidationError> {
    let Some(bytes_per_token) = max_bytes_per_token else {
        return Ok(());
    };
    let most_bytes = limits.max_input_tokens.saturating_mul(bytes_per_token);
    if prompt_bytes > most_bytes {
        return Err(ValidationError::InputBytes(
            limits.max_input_tokens,
            prompt_bytes,
            bytes_per_token,
        ));
    }
    Ok(())
}

/// The number of prompt tokens kept: the last `truncate` ones when set.
pub fn truncated_length(input_tokens: usize, truncate: Option<usize>) -> usize {
    truncate.map_or(input_tokens, |keep| input_tokens.min(keep))
}

/// Checks the prompt length and the total length, in TGI's order, and returns the
/// `max_new_tokens` to schedule (what `max_total_tokens` leaves room for when not given).
pub fn validate_length(
    input_length: usize,
    max_new_tokens: Option<u32>,
    limits: &ValidationLimits,
) -> Result<u32, ValidationError> {
    if input_length == 0 {
        return Err(ValidationError::EmptyInput);
    }
    let max_new_tokens = max_new_tokens.unwrap_or_else(|| {
        let room = limits.max_total_tokens.saturating_sub(input_length).max(1);
        u32::try_from(room).unwrap_or(u32::MAX)
    });
    if input_length + max_new_tokens as usize > limits.max_total_tokens {
        return Err(ValidationError::MaxTotalTokens(
            limits.max_total_tokens,
            input_length,
            max_new_tokens,
        ));
    }
    if input_length > limits.max_input_tokens {
        return Err(ValidationError::InputLength(
            limits.max_input_tokens,
            input_length,
        ));
    }
    Ok(max_new_tokens)
}
