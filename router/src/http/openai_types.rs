//! Bodies of the OpenAI-compatible routes, and their mapping to TGI's generation parameters
//! (TGI's own mapping: `temperature == 0` is greedy, `top_logprobs` becomes `top_n_tokens`).
//! `presence_penalty` is OpenAI's (subtracted from each token already generated), not TGI's
//! `repetition_penalty = x + 2`, which turned the OpenAI default of 0 into a heavy penalty.
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::types::{null_as_default, FinishReason, GenerateParameters, SloParameters};
use crate::grammar::{GrammarSpec, StructuredOutputs};
use crate::validation::ValidationError;

pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|elapsed| elapsed.as_secs())
        .unwrap_or(0)
}

/// `stop` may be one string or a list.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum StopSequences {
    One(String),
    Many(Vec<String>),
}

impl StopSequences {
    fn into_vec(self) -> Vec<String> {
        match self {
            StopSequences::One(stop) => vec![stop],
            StopSequences::Many(stops) => stops,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct StreamOptions {
    #[serde(default, deserialize_with = "null_as_default")]
    pub include_usage: bool,
    /// vLLM's: with `include_usage`, every chunk also carries its choice's usage so far.
    #[serde(default, deserialize_with = "null_as_default")]
    pub continuous_usage_stats: bool,
}

/// Where a stream reports usage.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct UsageReports {
    /// A last chunk with the request's usage (`include_usage`).
    pub at_end: bool,
    /// Each chunk with its choice's usage so far (vLLM's `continuous_usage_stats`).
    pub every_chunk: bool,
}

impl UsageReports {
    pub fn of(options: Option<&StreamOptions>) -> Self {
        let at_end = options.is_some_and(|options| options.include_usage);
        Self { at_end, every_chunk: at_end && options.is_some_and(|options| options.continuous_usage_stats) }
    }
}

/// Sampling fields the chat and completion requests share.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct OpenAiSampling {
    #[serde(default)]
    pub max_tokens: Option<u32>,
    #[serde(default)]
    pub max_completion_tokens: Option<u32>,
    #[serde(default)]
    pub temperature: Option<f32>,
    #[serde(default)]
    pub top_p: Option<f32>,
    #[serde(default)]
    pub seed: Option<u64>,
    #[serde(default)]
    pub stop: Option<StopSequences>,
    #[serde(default)]
    pub frequency_penalty: Option<f32>,
    #[serde(default)]
    pub presence_penalty: Option<f32>,
    #[serde(default)]
    pub repetition_penalty: Option<f32>,
    #[serde(default)]
    pub n: Option<u32>,
    /// Token id (as a string) -> bias added to its logit, -100 to 100.
    #[serde(default)]
    pub logit_bias: Option<std::collections::HashMap<String, f32>>,
    #[serde(default)]
    pub slo: Option<SloParameters>,
    /// Priority class: lower is served first (vLLM's top-level `priority`); 0 when absent.
    #[serde(default)]
    pub priority: Option<i64>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub ignore_eos: bool,
    /// `{"type": "text" | "json_object"}`, `{"type": "json_schema", "json_schema": {"name",
    /// "schema", "strict"}}`, or TGI's `{"type": "json" | "regex", "value"}`.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub response_format: Option<serde_json::Value>,
    /// Token ids that end the generation when sampled (vLLM's); their text stays.
    #[serde(default)]
    pub stop_token_ids: Option<Vec<u32>>,
    /// vLLM's `min_tokens`: the generation may not end (EOS, stop tokens, stop sequences)
    /// before this many tokens; at most `max_tokens`.
    #[serde(default)]
    pub min_tokens: Option<u32>,
    /// Keep a matched stop sequence at the end of the text (vLLM's); OpenAI leaves it out.
    #[serde(default, deserialize_with = "null_as_default")]
    pub include_stop_str_in_output: bool,
    /// vLLM's `skip_special_tokens` (default true): false keeps special tokens' text in the
    /// output, but for the end-of-sequence token that ends it.
    #[serde(default)]
    pub skip_special_tokens: Option<bool>,
    /// vLLM's `top_k`: the k most likely tokens; -1 or 0 for all of them.
    #[serde(default)]
    pub top_k: Option<i32>,
    /// vLLM's `min_p`: tokens less likely than this share of the most likely one are left out
    /// (0 to 1; 0, the default, leaves none out).
    #[serde(default)]
    pub min_p: Option<f32>,
    /// vLLM's `allowed_token_ids`: only these tokens may be chosen.
    #[serde(default)]
    pub allowed_token_ids: Option<Vec<u32>>,
    /// vLLM's `bad_words`: words that may not be generated (the last token of each is left out
    /// where the reply would complete it).
    #[serde(default)]
    pub bad_words: Option<Vec<String>>,
    /// vLLM's `prompt_logprobs`: every prompt token's logprob and rank, with this many
    /// alternatives at each position (the first has none: `null`); not with `stream`.
    #[serde(default)]
    pub prompt_logprobs: Option<i64>,
    /// vLLM's `truncate_prompt_tokens`: keep only the prompt's last k tokens (TGI's
    /// `truncate`); -1 keeps as many as `--max-input-tokens` allows.
    #[serde(default)]
    pub truncate_prompt_tokens: Option<i64>,
    /// vLLM's structured outputs: `{"json": schema} | {"regex": …} | {"choice": […]} |
    /// {"json_object": true}`.
    #[serde(default)]
    pub structured_outputs: Option<StructuredOutputs>,
    /// vLLM's older spellings of `structured_outputs`.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub guided_json: Option<serde_json::Value>,
    #[serde(default)]
    pub guided_regex: Option<String>,
    #[serde(default)]
    pub guided_choice: Option<Vec<String>>,
}

impl OpenAiSampling {
    /// The one constraint on the output: `response_format`, or vLLM's structured outputs.
    fn grammar(&self) -> Result<Option<GrammarSpec>, ValidationError> {
        let invalid = ValidationError::InvalidGrammar;
        let mut outputs = self.structured_outputs.clone().unwrap_or_default();
        let guided = [self.guided_json.is_some(), self.guided_regex.is_some(), self.guided_choice.is_some()];
        if guided.contains(&true) && self.structured_outputs.is_some() {
            return Err(invalid("give `structured_outputs` or the `guided_*` fields, not both".into()));
        }
        outputs.json = outputs.json.or(self.guided_json.clone());
        outputs.regex = outputs.regex.or(self.guided_regex.clone());
        outputs.choice = outputs.choice.or(self.guided_choice.clone());
        let structured = GrammarSpec::from_structured_outputs(&outputs).map_err(invalid)?;
        let format = match &self.response_format {
            Some(format) => GrammarSpec::from_response_format(format).map_err(invalid)?,
            None => None,
        };
        match (format, structured) {
            (Some(_), Some(_)) => Err(invalid("give `response_format` or structured outputs, not both".into())),
            (format, structured) => Ok(format.or(structured)),
        }
    }

    /// Whether the request asks for a format of its own (which `tools` cannot be combined with).
    pub fn asks_for_format(&self) -> bool {
        self.response_format.is_some()
            || self.structured_outputs.is_some()
            || self.guided_json.is_some()
            || self.guided_regex.is_some()
            || self.guided_choice.is_some()
    }

    /// Choices per prompt (`n`, default 1).
    pub fn choices(&self) -> u32 {
        self.n.unwrap_or(1)
    }

    /// TGI's `truncate` for `truncate_prompt_tokens` (-1: the input limit, `max_input_tokens`);
    /// other values below 1 are a 422, as too large ones are in validation.
    pub fn truncate(&self, max_input_tokens: usize) -> Result<Option<usize>, ValidationError> {
        match self.truncate_prompt_tokens {
            None => Ok(None),
            Some(-1) => Ok(Some(max_input_tokens)),
            Some(k) if k >= 1 => Ok(Some(usize::try_from(k).unwrap_or(usize::MAX))),
            Some(k) => Err(ValidationError::TruncatePromptTokens(k)),
        }
    }

    /// TGI's parameters for this request; `top_n_tokens` from the logprobs options.
    pub fn to_parameters(
        &self,
        top_n_tokens: Option<u32>,
    ) -> Result<GenerateParameters, ValidationError> {
        let grammar = self.grammar()?.map(|spec| spec.to_tgi());
        let top_k = match self.top_k {
            None | Some(-1) | Some(0) => None,
            Some(k) if k > 0 => Some(k),
            Some(_) => return Err(ValidationError::OpenAiTopK),
        };
        // Temperature 0 is greedy, whatever else narrows the sampling (as OpenAI and vLLM).
        let (do_sample, temperature, top_p, top_k) = match self.temperature {
            Some(temperature) if temperature == 0.0 => (false, None, None, None),
            other => (true, other, self.top_p, top_k),
        };
        Ok(GenerateParameters {
            do_sample,
            temperature,
            top_p,
            top_k,
            seed: self.seed,
            max_new_tokens: self.max_tokens.or(self.max_completion_tokens),
            stop: self
                .stop
                .clone()
                .map(StopSequences::into_vec)
                .unwrap_or_default(),
            frequency_penalty: self.frequency_penalty,
            repetition_penalty: self.repetition_penalty,
            presence_penalty: self.presence_penalty,
            prompt_logprobs: self.prompt_logprobs,
            trim_stop_sequences: !self.include_stop_str_in_output,
            keep_special_tokens: self.skip_special_tokens == Some(false),
            stop_token_ids: self.stop_token_ids.clone().unwrap_or_default(),
            min_tokens: self.min_tokens.unwrap_or(0),
            // Checked whatever the temperature; greedy decoding does not read it.
            min_p: self.min_p,
            allowed_token_ids: self.allowed_token_ids.clone(),
            bad_words: self.bad_words.clone().unwrap_or_default(),
            top_n_tokens,
            details: true,
            slo: self.slo.clone(),
            priority: self.priority,
            ignore_eos: self.ignore_eos,
            grammar,
            logit_bias: self
                .logit_bias
                .iter()
                .flatten()
                .map(|(id, bias)| {
                    id.trim().parse::<u32>().map(|id| (id, *bias)).map_err(|_| ValidationError::LogitBiasKey(id.clone()))
                })
                .collect::<Result<_, _>>()?,
            ..GenerateParameters::default()
        })
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum MessageContent {
    Text(String),
    Parts(Vec<ContentPart>),
}

impl MessageContent {
    /// The text of the message; text parts are joined, other parts are not supported.
    pub fn text(&self) -> Result<String, ValidationError> {
        match self {
            MessageContent::Text(text) => Ok(text.clone()),
            MessageContent::Parts(parts) => parts
                .iter()
                .map(|part| match (part.kind.as_str(), &part.text) {
                    ("text", Some(text)) => Ok(text.as_str()),
                    _ => Err(ValidationError::Unsupported("non-text message content")),
                })
                .collect::<Result<Vec<_>, _>>()
                .map(|texts| texts.join("")),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ChatMessage {
    pub role: String,
    /// Required unless the message is an assistant's `tool_calls`.
    #[serde(default)]
    pub content: Option<MessageContent>,
    /// The calls an assistant turn made, sent back with the tools' results (OpenAI's tool loop).
    #[serde(default)]
    pub tool_calls: Option<Vec<ToolCall>>,
    /// The call a `tool` message answers.
    #[serde(default)]
    pub tool_call_id: Option<String>,
    /// An assistant turn's reasoning, as `--reasoning-parser` answered it, sent back with the
    /// conversation: the template gets it (Qwen 3's writes the reasoning of the turns after the
    /// last user message back into the prompt, so a tool loop keeps its thinking).
    #[serde(default)]
    pub reasoning_content: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ChatRequest {
    #[serde(default)]
    pub model: Option<String>,
    pub messages: Vec<ChatMessage>,
    #[serde(flatten)]
    pub sampling: OpenAiSampling,
    #[serde(default, deserialize_with = "null_as_default")]
    pub stream: bool,
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub logprobs: bool,
    #[serde(default)]
    pub top_logprobs: Option<u32>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub tools: Option<serde_json::Value>,
    /// `"auto"` (the default), `"none"`, `"required"` or `{"type": "function", "function":
    /// {"name": …}}`.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub tool_choice: Option<serde_json::Value>,
    /// TGI's instruction put before the tools in the last message.
    #[serde(default)]
    pub tool_prompt: Option<String>,
    /// `false`: at most one call per reply (OpenAI's). Under `--tool-call-parser` the calls a
    /// reply writes after its first are dropped; under TGI's grammar a reply has one anyway.
    #[serde(default)]
    pub parallel_tool_calls: Option<bool>,
    /// End the prompt with the header of the assistant's turn (the default), as vLLM's.
    #[serde(default)]
    pub add_generation_prompt: Option<bool>,
    /// End the prompt inside the last message, for the model to continue it (vLLM's and
    /// transformers'); needs `add_generation_prompt: false`.
    #[serde(default, deserialize_with = "null_as_default")]
    pub continue_final_message: bool,
    /// More variables for the chat template (`{"enable_thinking": false}` for Qwen 3), as vLLM's.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub chat_template_kwargs: Option<serde_json::Map<String, serde_json::Value>>,
    /// vLLM's `echo`: the reply starts with the last message's text where that message is the
    /// reply's own role's (an assistant message continued, or no generation prompt).
    #[serde(default, deserialize_with = "null_as_default")]
    pub echo: bool,
    /// Fields this server does not read: logged (`log_ignored_fields`), the request served.
    #[serde(flatten, skip_serializing)]
    #[schema(ignore)]
    pub ignored: std::collections::BTreeMap<String, serde_json::Value>,
}

/// Logs the fields of a request that the server does not read, as vLLM does, so a client
/// that counts on one (a parameter of another server, a misspelling) finds out why it had no
/// effect.
pub(crate) fn log_ignored_fields(route: &str, ignored: &std::collections::BTreeMap<String, serde_json::Value>) {
    if !ignored.is_empty() {
        let fields: Vec<&str> = ignored.keys().map(String::as_str).collect();
        tracing::warn!(route, ?fields, "the request holds fields this server does not read; they were ignored");
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum Prompt {
    One(String),
    Many(Vec<String>),
    /// One prompt as token ids.
    Tokens(Vec<u32>),
    /// Several prompts as token ids.
    ManyTokens(Vec<Vec<u32>>),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CompletionRequest {
    #[serde(default)]
    pub model: Option<String>,
    pub prompt: Prompt,
    #[serde(flatten)]
    pub sampling: OpenAiSampling,
    #[serde(default, deserialize_with = "null_as_default")]
    pub stream: bool,
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    #[serde(default)]
    pub suffix: Option<String>,
    /// Each choice's text follows its prompt; with `logprobs`, the prompt's tokens come first in
    /// them too (the first without a logprob), as a scoring client (lm-evaluation-harness) reads
    /// them.
    #[serde(default, deserialize_with = "null_as_default")]
    pub echo: bool,
    /// Candidates generated per prompt, the one with the highest mean logprob answered (TGI's
    /// `best_of`, within `--max-best-of`); with `n` = 1 only.
    #[serde(default)]
    pub best_of: Option<u32>,
    /// The legacy API's log-probabilities: each token's, and this many alternatives (0–5).
    #[serde(default)]
    pub logprobs: Option<u32>,
    /// Fields this server does not read: logged (`log_ignored_fields`), the request served.
    #[serde(flatten, skip_serializing)]
    #[schema(ignore)]
    pub ignored: std::collections::BTreeMap<String, serde_json::Value>,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Usage {
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    pub total_tokens: u32,
    /// OpenAI's: how many prompt tokens the prefix cache served. On whole responses and a
    /// stream's usage chunk (known once a choice has ended).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_tokens_details: Option<PromptTokensDetails>,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct PromptTokensDetails {
    pub cached_tokens: u32,
}

impl Usage {
    pub fn new(prompt_tokens: u32, completion_tokens: u32) -> Self {
        Self {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
            prompt_tokens_details: None,
        }
    }

    /// With `cached_tokens` of the prompt served from the prefix cache.
    pub fn with_cached(self, cached_tokens: u32) -> Self {
        Self { prompt_tokens_details: Some(PromptTokensDetails { cached_tokens }), ..self }
    }

    /// This usage and a choice's: the choice's prompt (and its cached part) counts only where
    /// `counts_prompt` (the first choice of its prompt), its generated tokens always.
    pub fn plus(self, choice: Usage, counts_prompt: bool) -> Self {
        let cached = |usage: &Usage| usage.prompt_tokens_details.map_or(0, |details| details.cached_tokens);
        let (prompt, cached_tokens) = match counts_prompt {
            true => (choice.prompt_tokens, cached(&choice)),
            false => (0, 0),
        };
        Usage::new(self.prompt_tokens + prompt, self.completion_tokens + choice.completion_tokens)
            .with_cached(cached(&self) + cached_tokens)
    }
}

/// OpenAI's finish reasons: an EOS token and a stop sequence are both "stop".
pub fn finish_reason(reason: FinishReason) -> String {
    match reason {
        FinishReason::Length => "length".to_string(),
        FinishReason::EosToken | FinishReason::StopSequence => "stop".to_string(),
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TopLogprob {
    pub token: String,
    pub logprob: f32,
    /// The token's UTF-8 bytes, which may be part of a character (`token` then reads
    /// `bytes:\xNN…`).
    #[serde(default)]
    pub bytes: Option<Vec<u8>>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ChatLogprob {
    pub token: String,
    pub logprob: f32,
    /// As `TopLogprob::bytes`.
    #[serde(default)]
    pub bytes: Option<Vec<u8>>,
    pub top_logprobs: Vec<TopLogprob>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ChatLogprobs {
    pub content: Vec<ChatLogprob>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct AssistantMessage {
    pub role: String,
    /// The reply's reasoning (`--reasoning-parser`): absent without one, or when the reply had
    /// no reasoning part.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// Null when the answer is a tool call.
    pub content: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
}

/// One call of a tool: `arguments` is a JSON string, as OpenAI sends it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ToolCall {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub function: FunctionCall,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct FunctionCall {
    pub name: String,
    pub arguments: String,
}

/// A streamed piece of a tool call: the first carries `id`, `type` and the name; the pieces'
/// `arguments` concatenate to the call's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ToolCallChunk {
    pub index: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    pub function: FunctionCallChunk,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct FunctionCallChunk {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub arguments: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ChatChoice {
    pub index: u32,
    pub message: AssistantMessage,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ChatCompletion {
    pub id: String,
    pub object: String,
    pub created: u64,
    pub model: String,
    pub system_fingerprint: String,
    pub choices: Vec<ChatChoice>,
    pub usage: Usage,
    /// vLLM's `prompt_logprobs` (the conversation's, which every choice shares), when asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Vec<Object>>)]
    pub prompt_logprobs: Option<Vec<Option<serde_json::Map<String, serde_json::Value>>>>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Delta {
    pub role: String,
    /// The piece of reasoning this chunk adds (`--reasoning-parser`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// Null in the chunks of a tool call.
    pub content: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallChunk>>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ChatChunkChoice {
    pub index: u32,
    pub delta: Delta,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ChatCompletionChunk {
    pub id: String,
    pub object: String,
    pub created: u64,
    pub model: String,
    pub system_fingerprint: String,
    pub choices: Vec<ChatChunkChoice>,
    pub usage: Option<Usage>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CompletionChoice {
    pub index: u32,
    pub text: String,
    #[schema(value_type = Option<Object>)]
    pub logprobs: Option<serde_json::Value>,
    pub finish_reason: Option<String>,
    /// vLLM's `prompt_logprobs` (its prompt's), when asked; never in a streamed chunk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Vec<Object>>)]
    pub prompt_logprobs: Option<Vec<Option<serde_json::Map<String, serde_json::Value>>>>,
}

/// Both the whole completion and each streamed chunk (`finish_reason` null until the end).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Completion {
    pub id: String,
    pub object: String,
    pub created: u64,
    pub model: String,
    pub system_fingerprint: String,
    pub choices: Vec<CompletionChoice>,
    pub usage: Option<Usage>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Only the fields neither the request nor its sampling reads are ignored ones.
    #[test]
    fn fields_the_server_does_not_read_are_collected() {
        let chat: ChatRequest = serde_json::from_value(json!({
            "messages": [{"role": "user", "content": "Hi"}], "temperature": 0.5, "min_tokens": 2,
            "stream": false, "user": "u-1", "temprature": 0.1})).unwrap();
        assert_eq!(chat.ignored.keys().collect::<Vec<_>>(), ["temprature", "user"]);
        assert_eq!((chat.sampling.temperature, chat.sampling.min_tokens), (Some(0.5), Some(2)));
        let completion: CompletionRequest =
            serde_json::from_value(json!({"prompt": "x", "echo": true, "max_tokens": 3, "logprobs": 1})).unwrap();
        assert!(completion.ignored.is_empty(), "{:?}", completion.ignored);
        // Answers and the schema do not carry them.
        assert!(serde_json::to_value(&chat).unwrap().get("user").is_none());
    }

    /// Temperature 0 is greedy even with `top_p` or `top_k` set (TGI's validation would sample
    /// at temperature 1 within them); vLLM's `top_k` of -1 or 0 is no limit.
    #[test]
    fn temperature_zero_is_greedy_whatever_narrows_sampling() {
        let sampling = |value: serde_json::Value| serde_json::from_value::<OpenAiSampling>(value).unwrap().to_parameters(None);
        let greedy = sampling(json!({"temperature": 0, "top_p": 0.9, "top_k": 5})).unwrap();
        assert_eq!((greedy.do_sample, greedy.temperature, greedy.top_p, greedy.top_k), (false, None, None, None));
        let sampled = sampling(json!({"temperature": 0.5, "top_p": 0.9, "top_k": 5})).unwrap();
        assert_eq!((sampled.do_sample, sampled.top_p, sampled.top_k), (true, Some(0.9), Some(5)));
        for all in [-1, 0] {
            assert_eq!(sampling(json!({"top_k": all})).unwrap().top_k, None);
        }
        assert_eq!(sampling(json!({"top_k": -2})).unwrap_err(), ValidationError::OpenAiTopK);
    }

    #[test]
    fn chat_request_maps_like_tgi() {
        let request: ChatRequest = serde_json::from_value(json!({
            "model": "tgi", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 7, "temperature": 0, "presence_penalty": 0.5, "stop": "\n",
            "stream": true, "stream_options": {"include_usage": true},
            "slo": {"ttft_ms": 100, "tbt_ms": 20}, "ignore_eos": true, "priority": -2}))
        .unwrap();
        let parameters = request.sampling.to_parameters(None).unwrap();
        assert!(!parameters.do_sample);
        assert_eq!(parameters.temperature, None);
        assert_eq!(parameters.max_new_tokens, Some(7));
        assert_eq!((parameters.presence_penalty, parameters.repetition_penalty), (Some(0.5), None));
        assert_eq!(parameters.stop, vec!["\n".to_string()]);
        assert!(parameters.ignore_eos);
        assert_eq!(
            parameters.slo,
            Some(SloParameters {
                ttft_ms: 100.0,
                tbt_ms: 20.0,
                max_stall_ms: None
            })
        );
        assert_eq!(parameters.priority, Some(-2));
        assert!(request.stream_options.unwrap().include_usage);
    }

    #[test]
    fn choices_default_to_one() {
        assert_eq!(OpenAiSampling::default().choices(), 1);
        let sampling = OpenAiSampling { n: Some(3), ..Default::default() };
        assert_eq!(sampling.choices(), 3);
        assert!(sampling.to_parameters(None).is_ok());
    }

    #[test]
    fn message_parts_are_joined_and_images_rejected() {
        let parts: MessageContent = serde_json::from_value(
            json!([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]),
        )
        .unwrap();
        assert_eq!(parts.text().unwrap(), "ab");
        let image: MessageContent =
            serde_json::from_value(json!([{"type": "image_url", "image_url": {"url": "x"}}]))
                .unwrap();
        assert!(image.text().is_err());
    }

    #[test]
    fn chunk_serializes_as_openai() {
        let chunk = ChatCompletionChunk {
            id: "1".into(),
            object: "chat.completion.chunk".into(),
            created: 5,
            model: "m".into(),
            system_fingerprint: "v".into(),
            choices: vec![ChatChunkChoice {
                index: 0,
                delta: Delta {
                    role: "assistant".into(),
                    reasoning_content: None,
                    content: Some("Hi".into()),
                    tool_calls: None,
                },
                logprobs: None,
                finish_reason: None,
            }],
            usage: None,
        };
        let value = serde_json::to_value(&chunk).unwrap();
        assert_eq!(
            value["choices"][0]["delta"],
            json!({"role": "assistant", "content": "Hi"})
        );
        assert_eq!(
            value["choices"][0]["finish_reason"],
            serde_json::Value::Null
        );
        assert_eq!(value["usage"], serde_json::Value::Null);
        assert_eq!(
            serde_json::from_value::<ChatCompletionChunk>(value).unwrap(),
            chunk
        );
        assert_eq!(finish_reason(FinishReason::EosToken), "stop");
        assert_eq!(finish_reason(FinishReason::Length), "length");
    }
}
