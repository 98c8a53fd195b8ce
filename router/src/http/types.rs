//! TGI's request and response bodies, field for field (TGI's clients parse these), plus the
//! `slo` and `ignore_eos` extensions.
use serde::{Deserialize, Deserializer, Serialize};
use utoipa::ToSchema;

/// Reads `null` as the type's default (TGI's Python client sends `"stop": null` and friends).
pub(crate) fn null_as_default<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

/// Per-request latency objectives (milliseconds).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct SloParameters {
    pub ttft_ms: f64,
    pub tbt_ms: f64,
    /// The longest gap between two tokens allowed at all (the stall bound), at least
    /// `tbt_ms`; absent: `DEFAULT_STALL_FACTOR` times `tbt_ms`.
    #[serde(default)]
    pub max_stall_ms: Option<f64>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct GenerateParameters {
    #[serde(default)]
    pub best_of: Option<usize>,
    #[serde(default)]
    pub temperature: Option<f32>,
    #[serde(default)]
    pub repetition_penalty: Option<f32>,
    #[serde(default)]
    pub frequency_penalty: Option<f32>,
    #[serde(default)]
    pub top_k: Option<i32>,
    #[serde(default)]
    pub top_p: Option<f32>,
    #[serde(default)]
    pub typical_p: Option<f32>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub do_sample: bool,
    #[serde(default)]
    pub max_new_tokens: Option<u32>,
    #[serde(default)]
    pub return_full_text: Option<bool>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub stop: Vec<String>,
    #[serde(default)]
    pub truncate: Option<usize>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub watermark: bool,
    #[serde(default, deserialize_with = "null_as_default")]
    pub details: bool,
    #[serde(default, deserialize_with = "null_as_default")]
    pub decoder_input_details: bool,
    #[serde(default)]
    pub seed: Option<u64>,
    #[serde(default)]
    pub top_n_tokens: Option<u32>,
    /// Constrained decoding is not supported; any value is rejected with 422.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub grammar: Option<serde_json::Value>,
    /// The LoRA adapter to run with (one of `--lora-adapters`); absent, empty or the served
    /// model's id: the base model. An adapter the server did not load is a 422.
    #[serde(default)]
    pub adapter_id: Option<String>,
    /// (token id, bias): OpenAI's `logit_bias`, set by the OpenAI routes.
    #[serde(skip)]
    pub logit_bias: Vec<(u32, f32)>,
    /// Leave a matched stop sequence out of the text (OpenAI's routes, unless
    /// `include_stop_str_in_output`); TGI's keep it.
    #[serde(skip)]
    pub trim_stop_sequences: bool,
    /// Keep special tokens' text in the output (vLLM's `skip_special_tokens: false`, set by the
    /// OpenAI routes); the end-of-sequence token that ends the generation stays out.
    #[serde(skip)]
    pub keep_special_tokens: bool,
    /// Special tokens whose text stays while the others are skipped: the tags a chat route's
    /// tool-call or reasoning parser reads, where the tokenizer has them as special tokens.
    #[serde(skip)]
    pub kept_special_tokens: Vec<u32>,
    /// Token ids that end the generation when sampled, kept in the text (vLLM's
    /// `stop_token_ids`, set by the OpenAI routes).
    #[serde(skip)]
    pub stop_token_ids: Vec<u32>,
    /// The generation may not end (EOS, stop tokens, stop sequences) before this many tokens
    /// (vLLM's `min_tokens`, set by the OpenAI routes).
    #[serde(skip)]
    pub min_tokens: u32,
    /// Tokens below min_p × the most likely one's probability are left out (vLLM's `min_p`,
    /// 0 to 1, set by the OpenAI routes).
    #[serde(skip)]
    pub min_p: Option<f32>,
    /// Only these tokens may be chosen (vLLM's `allowed_token_ids`, set by the OpenAI routes);
    /// `Some(empty)` is a 422.
    #[serde(skip)]
    pub allowed_token_ids: Option<Vec<u32>>,
    /// Words that may not be generated (vLLM's `bad_words`, set by the OpenAI routes).
    #[serde(skip)]
    pub bad_words: Vec<String>,
    /// Subtracted from the logit of each token generated at least once (OpenAI's
    /// `presence_penalty`, -2 to 2, set by the OpenAI routes).
    #[serde(skip)]
    pub presence_penalty: Option<f32>,
    /// vLLM's `prompt_logprobs` (set by the OpenAI routes): every prompt token's logprob and
    /// rank, with this many alternatives at each position (0 to `--max-top-n-tokens`; vLLM's
    /// -1, the whole vocabulary, is refused).
    #[serde(skip)]
    pub prompt_logprobs: Option<i64>,
    /// The reply may reason before its grammar holds (set by the chat route; it takes effect under
    /// `--reasoning-parser` where the model's reasoning tags are tokens, `AppState::reasoning_tokens`).
    #[serde(skip)]
    pub reasoning_first: bool,
    #[serde(default)]
    pub slo: Option<SloParameters>,
    /// Priority class: lower is served first (vLLM's convention); 0 when absent.
    #[serde(default)]
    pub priority: Option<i64>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub ignore_eos: bool,
}

/// TGI's quirk: a request without `parameters` samples.
fn default_parameters() -> GenerateParameters {
    GenerateParameters {
        do_sample: true,
        ..GenerateParameters::default()
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct GenerateRequest {
    /// The prompt; also read as `text`, the name vllm-router forwards on its `/generate` (it
    /// drops `inputs`).
    #[serde(alias = "text")]
    pub inputs: String,
    #[serde(default = "default_parameters")]
    pub parameters: GenerateParameters,
}

/// The body of `POST /`: a generate request that chooses streaming itself.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CompatGenerateRequest {
    pub inputs: String,
    #[serde(default = "default_parameters")]
    pub parameters: GenerateParameters,
    #[serde(default, deserialize_with = "null_as_default")]
    pub stream: bool,
}

impl From<CompatGenerateRequest> for GenerateRequest {
    fn from(request: CompatGenerateRequest) -> Self {
        GenerateRequest {
            inputs: request.inputs,
            parameters: request.parameters,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    Length,
    EosToken,
    StopSequence,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Token {
    pub id: u32,
    pub text: String,
    pub logprob: f32,
    pub special: bool,
}

/// A prompt token; the first has no logprob (`null`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct PrefillToken {
    pub id: u32,
    pub text: String,
    pub logprob: Option<f32>,
    /// A special token (a BOS the tokenizer added): not in the prompt's text. Not in TGI's
    /// answer; OpenAI's echoed logprobs skip it in their text offsets.
    #[serde(skip)]
    pub special: bool,
    /// Its rank at its position (1: the most likely; vLLM's `prompt_logprobs` report it); `None`
    /// for the first. Not in TGI's answer.
    #[serde(skip)]
    pub rank: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct BestOfSequence {
    pub generated_text: String,
    pub finish_reason: FinishReason,
    pub generated_tokens: u32,
    pub seed: Option<u64>,
    pub prefill: Vec<PrefillToken>,
    pub tokens: Vec<Token>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub top_tokens: Vec<Vec<Token>>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Details {
    pub finish_reason: FinishReason,
    pub generated_tokens: u32,
    pub seed: Option<u64>,
    pub prefill: Vec<PrefillToken>,
    pub tokens: Vec<Token>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub top_tokens: Vec<Vec<Token>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub best_of_sequences: Option<Vec<BestOfSequence>>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct GenerateResponse {
    pub generated_text: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub details: Option<Details>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct StreamDetails {
    pub finish_reason: FinishReason,
    pub generated_tokens: u32,
    pub seed: Option<u64>,
    pub input_length: u32,
}

/// One `/generate_stream` event; `generated_text` and `details` only on the last.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct StreamResponse {
    pub index: u32,
    pub token: Token,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub top_tokens: Vec<Token>,
    pub generated_text: Option<String>,
    pub details: Option<StreamDetails>,
}

/// One token of `/tokenize`, with its character span in the input.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct SimpleToken {
    pub id: u32,
    pub text: String,
    pub start: usize,
    pub stop: usize,
}

/// `/chat_tokenize`'s answer: the conversation as the chat template wrote it, and its tokens.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ChatTokenizeResponse {
    pub tokenize_response: Vec<SimpleToken>,
    pub templated_text: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Info {
    pub model_id: String,
    pub model_sha: Option<String>,
    pub model_pipeline_tag: Option<String>,
    pub max_concurrent_requests: usize,
    pub max_best_of: usize,
    pub max_stop_sequences: usize,
    pub max_input_tokens: usize,
    pub max_total_tokens: usize,
    pub validation_workers: usize,
    pub max_client_batch_size: usize,
    pub router: String,
    pub version: String,
    pub sha: Option<String>,
    pub docker_label: Option<String>,
    /// Shard processes the model is split over (`--num-shard`, tensor parallelism).
    pub num_shard: u32,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn omitted_parameters_sample_and_explicit_ones_do_not() {
        let bare: GenerateRequest = serde_json::from_value(json!({"inputs": "hi"})).unwrap();
        assert!(bare.parameters.do_sample);
        let explicit: GenerateRequest =
            serde_json::from_value(json!({"inputs": "hi", "parameters": {"max_new_tokens": 3}}))
                .unwrap();
        assert!(!explicit.parameters.do_sample);
        assert_eq!(explicit.parameters.max_new_tokens, Some(3));
    }

    #[test]
    fn python_client_nulls_are_accepted() {
        // The body `text_generation.Client.generate` sends, nulls included.
        let body = json!({"inputs": "x", "stream": false, "parameters": {
            "best_of": null, "details": true, "decoder_input_details": false, "do_sample": false,
            "max_new_tokens": 20, "repetition_penalty": null, "frequency_penalty": null,
            "return_full_text": false, "seed": null, "stop": null, "temperature": null,
            "top_k": null, "top_n_tokens": null, "top_p": null, "truncate": null,
            "typical_p": null, "watermark": false, "grammar": null, "adapter_id": null}});
        let request: CompatGenerateRequest = serde_json::from_value(body).unwrap();
        assert!(request.parameters.stop.is_empty());
        assert!(request.parameters.details);
    }

    #[test]
    fn stream_response_matches_tgi_shape() {
        let event = StreamResponse {
            index: 16,
            token: Token {
                id: 28723,
                text: ".".into(),
                logprob: -0.61,
                special: false,
            },
            top_tokens: vec![],
            generated_text: None,
            details: None,
        };
        let value = serde_json::to_value(&event).unwrap();
        assert_eq!(
            value,
            json!({"index": 16, "token": {"id": 28723, "text": ".", "logprob": -0.61f32,
                   "special": false}, "generated_text": null, "details": null})
        );
        let last = StreamResponse {
            generated_text: Some("a.".into()),
            details: Some(StreamDetails {
                finish_reason: FinishReason::EosToken,
                generated_tokens: 2,
                seed: None,
                input_length: 4,
            }),
            ..event
        };
        let value = serde_json::to_value(&last).unwrap();
        assert_eq!(value["details"]["finish_reason"], "eos_token");
        assert_eq!(value["details"]["input_length"], 4);
        let back: StreamResponse = serde_json::from_value(value).unwrap();
        assert_eq!(back, last);
    }

    #[test]
    fn generate_response_details_round_trip() {
        let response = GenerateResponse {
            generated_text: "ok".into(),
            details: Some(Details {
                finish_reason: FinishReason::StopSequence,
                generated_tokens: 1,
                seed: Some(7),
                prefill: vec![PrefillToken {
                    id: 1,
                    text: "a".into(),
                    logprob: None,
                    special: false,
                    rank: None,
                }],
                tokens: vec![Token {
                    id: 2,
                    text: "ok".into(),
                    logprob: -0.5,
                    special: false,
                }],
                top_tokens: vec![],
                best_of_sequences: None,
            }),
        };
        let value = serde_json::to_value(&response).unwrap();
        assert_eq!(
            value["details"]["prefill"][0]["logprob"],
            serde_json::Value::Null
        );
        assert_eq!(value["details"]["finish_reason"], "stop_sequence");
        assert!(value["details"].get("top_tokens").is_none());
        assert!(value["details"].get("best_of_sequences").is_none());
        assert_eq!(
            serde_json::from_value::<GenerateResponse>(value).unwrap(),
            response
        );
    }
}
