//! Request builders shared by the engine's unit tests.
use std::time::Instant;

use super::api::{GenerationRequest, SamplingParams, SpanContext};

pub(crate) fn greedy_request(prompt_token_ids: Vec<u32>, max_new_tokens: u32) -> GenerationRequest {
    GenerationRequest {
        prompt_token_ids,
        sampling: SamplingParams::greedy(),
        max_new_tokens,
        ignore_eos: false,
        prompt_logprobs: false,
        prompt_top_n: None,
        top_n_tokens: 0,
        slo: None,
        priority: 0,
        arrival: Instant::now(),
        span_context: SpanContext::empty_context(),
        constraint: None,
        adapter: None,
    }
}
