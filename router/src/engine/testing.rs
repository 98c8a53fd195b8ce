//! Request builders shared by the engine's unit tests.
use std::time::Instant;

use super::api::{GenerationRequest, SamplingParams};

pub(crate) fn greedy_request(prompt_token_ids: Vec<u32>, max_new_tokens: u32) -> GenerationRequest {
    GenerationRequest {
        prompt_token_ids,
        sampling: SamplingParams {
            do_sample: false,
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            typical_p: 1.0,
            repetition_penalty: 1.0,
            frequency_penalty: 0.0,
            seed: 0,
        },
        max_new_tokens,
        ignore_eos: false,
        prompt_logprobs: false,
        top_n_tokens: 0,
        slo: None,
        arrival: Instant::now(),
    }
}
