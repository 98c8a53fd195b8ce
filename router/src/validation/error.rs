//! Every validation rule's failure, with TGI's wording (clients match on some of these).

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ValidationError {
    #[error("`best_of` must be > 0 and <= {0}. Given: {1}")]
    BestOf(usize, usize),
    #[error("you must use sampling when `best_of` is > 1")]
    BestOfSampling,
    #[error("`seed` must not be set when `best_of` > 1")]
    BestOfSeed,
    #[error("`best_of` != 1 is not supported when streaming tokens")]
    BestOfStream,
    #[error("`top_n_tokens` must be >= 0 and <= {0}. Given: {1}")]
    TopNTokens(u32, u32),
    #[error("`decoder_input_details` == true is not supported when streaming tokens")]
    PrefillDetailsStream,
    /// JSON numbers beyond f32's range parse as infinities; no rule below holds for them.
    #[error("`{0}` must be a finite number")]
    NotFinite(&'static str),
    #[error("`temperature` must be strictly positive")]
    Temperature,
    #[error("`repetition_penalty` must be strictly positive")]
    RepetitionPenalty,
    #[error("`frequency_penalty` must be >= -2.0 and <= 2.0")]
    FrequencyPenalty,
    #[error("`logit_bias` must be between -100 and 100. Given: {1} for token {0}")]
    LogitBias(u32, f32),
    #[error("`logit_bias` keys must be token ids. Given: {0:?}")]
    LogitBiasKey(String),
    #[error("`top_p` must be > 0.0 and < 1.0")]
    TopP,
    #[error("`top_k` must be strictly positive")]
    TopK,
    #[error("`top_k` must be positive, or -1 or 0 for no limit")]
    OpenAiTopK,
    #[error("`truncate` must be strictly positive and less than {0}. Given: {1}")]
    Truncate(usize, usize),
    #[error("`typical_p` must be > 0.0 and < 1.0")]
    TypicalP,
    #[error("`min_p` must be between 0.0 and 1.0")]
    MinP,
    #[error("`allowed_token_ids` must not be empty")]
    AllowedTokenIds,
    #[error("`bad_words` entries must not be empty")]
    BadWords,
    #[error("`prompt_logprobs` must be >= 0 and <= {0} (the server's --max-top-n-tokens). Given: {1}")]
    PromptLogprobs(u32, i64),
    #[error("`prompt_logprobs` are not available when `stream` is true")]
    PromptLogprobsStream,
    #[error("`truncate_prompt_tokens` must be -1 (the input limit) or at least 1. Given: {0}")]
    TruncatePromptTokens(i64),
    #[error("`max_new_tokens` must be strictly positive")]
    NegativeMaxNewTokens,
    #[error("`min_tokens` must be less than or equal to `max_tokens`={1}. Given: {0}")]
    MinTokens(u32, u32),
    #[error("`inputs` tokens + `max_new_tokens` must be <= {0}. Given: {1} `inputs` tokens and {2} `max_new_tokens`")]
    MaxTotalTokens(usize, usize, u32),
    #[error("`inputs` must have less than {0} tokens. Given: {1}")]
    InputLength(usize, usize),
    /// Found from the prompt's byte length before tokenizing: even if every token were the
    /// vocabulary's longest, the prompt would have more tokens than allowed.
    #[error("`inputs` must have less than {0} tokens. Given: {1} bytes, more than {0} tokens of at most {2} bytes each can hold")]
    InputBytes(usize, usize, usize),
    #[error("`inputs` cannot be empty")]
    EmptyInput,
    #[error("`prompt` must hold at least one prompt")]
    EmptyPromptList,
    #[error("`messages` must hold at least one message")]
    EmptyConversation,
    #[error("`chat_template_kwargs` cannot set `{0}`: the request sets it")]
    TemplateVariable(String),
    #[error("`continue_final_message` and `add_generation_prompt` cannot both be true")]
    ContinueWithGenerationPrompt,
    /// OpenAI's rule: a message's `content` is required unless it is an assistant's tool calls.
    #[error("`messages[{0}]`: {1}")]
    Message(usize, &'static str),
    #[error("`stop` supports up to {0} stop sequences. Given: {1}")]
    StopSequence(usize, usize),
    #[error("each stop sequence must be at most {0} bytes long. Given: {1}")]
    StopSequenceLength(usize, usize),
    /// The grammar is malformed or llguidance cannot compile it (its message).
    #[error("grammar is not valid: {0}")]
    InvalidGrammar(String),
    /// The model's tokenizer gives no byte view of its tokens, so no grammar can be followed.
    #[error("grammar is not supported: {0}")]
    GrammarUnavailable(String),
    #[error("watermark is not supported")]
    Watermark,
    #[error("`slo.{0}` must be a strictly positive number of milliseconds")]
    Slo(&'static str),
    #[error("`slo.{0}` must be at most {1} milliseconds. Given: {2}")]
    SloAboveLimit(&'static str, f64, f64),
    #[error("`slo.max_stall_ms` must be at least `slo.tbt_ms` ({0}). Given: {1}")]
    StallBelowTbt(f64, f64),
    #[error("`priority` must be an integer between {0} and {1}. Given: {2}")]
    Priority(i64, i64, i64),
    #[error("`n` must be between 1 and {0}, and `n` times the prompts at most {0}. Given: {1}")]
    ChoiceCount(usize, usize),
    #[error("`prompt` supports up to {0} prompts. Given: {1}")]
    ClientBatchSize(usize, usize),
    #[error("token id {0} is not in the model's vocabulary of {1} tokens")]
    TokenId(u32, u32),
    #[error("`best_of` greater than 1 is supported with `n` = 1 only. Given: `n` = {0}")]
    BestOfChoices(u32),
    #[error("`instances` must hold between 1 and {0} instances. Given: {1}")]
    InstanceCount(usize, usize),
    #[error("`tools` are not valid: {0}")]
    InvalidTools(String),
    #[error("`{0}` is not supported")]
    Unsupported(&'static str),
    #[error("`{0}` is not supported: {1}")]
    UnsupportedBecause(&'static str, &'static str),
    /// A field of the Responses API that does not read as one (`input`, `text.format`, …).
    #[error("`{0}` is not valid: {1}")]
    Field(&'static str, String),
    #[error("`presence_penalty` must be >= -2.0 and <= 2.0")]
    PresencePenalty,
    /// `adapter_id` names no adapter the server loaded (`--lora-adapters`).
    #[error("adapter `{0}` is not loaded; loaded adapters: {1}")]
    UnknownAdapter(String, String),
    /// A run-time adapter load that does not say what to load (`/v1/load_lora_adapter`).
    #[error("{0}")]
    LoraAdapter(String),
}
