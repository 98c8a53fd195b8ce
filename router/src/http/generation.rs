//! One running generation as the HTTP layer sees it: reads the engine's events, detokenizes
//! incrementally, applies stop sequences, and assembles TGI's token objects and details. When
//! a stop sequence matches, the engine stream is dropped at once so the engine frees the
//! request's KV blocks.
use std::time::Instant;

use super::request::ValidRequest;
use super::stop::StopMatcher;
use super::types::{FinishReason, PrefillToken, Token};
use crate::detokenizer::IncrementalDecoder;
use crate::engine::api::{self, EngineEvent, GeneratedToken};
use crate::engine::RequestStream;
use crate::error::HttpError;
use crate::tokenizer::Tokenizer;

/// When things happened to the request (for TGI's x-*-time headers and the metrics).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timings {
    pub arrival: Instant,
    pub validated: Instant,
    pub first_scheduled: Instant,
    pub finished: Instant,
}

/// Everything about a generation once it has ended.
#[derive(Debug, Clone)]
pub(crate) struct GenerationOutput {
    /// Decoded without special tokens, cut after a matched stop sequence.
    pub generated_text: String,
    pub finish_reason: FinishReason,
    pub generated_tokens: u32,
    /// The sampling seed; `None` for greedy requests (TGI reports none then).
    pub seed: Option<u64>,
    pub prefill: Vec<PrefillToken>,
    /// The most likely tokens at each prompt position after the first (with prompt logprobs
    /// and `top_n_tokens`): OpenAI's `echo` lists them.
    pub prefill_top_tokens: Vec<Vec<Token>>,
    pub tokens: Vec<Token>,
    pub top_tokens: Vec<Vec<Token>>,
    pub input_length: u32,
    /// Prompt tokens served from the prefix cache (OpenAI's `cached_tokens`).
    pub cached_tokens: u32,
    pub timings: Timings,
}

impl GenerationOutput {
    pub fn mean_logprob(&self) -> f32 {
        let sum: f32 = self.tokens.iter().map(|token| token.logprob).sum();
        sum / self.tokens.len().max(1) as f32
    }
}

#[derive(Debug, Clone)]
pub(crate) enum GenerationEvent {
    /// A generated token; `text` is the text it releases (may be empty mid-character). The
    /// last token carries the whole output in `end`, so that streams can put TGI's
    /// `generated_text` and `details` on the last token's event without holding tokens back.
    Token {
        index: u32,
        token: Token,
        top_tokens: Vec<Token>,
        text: String,
        end: Option<Box<GenerationOutput>>,
    },
    /// The engine ended the generation without a final token (nothing was generated); `text`
    /// is what of the output no token event released (text held back as the possible start of
    /// a stop sequence, the decoder's last bytes).
    End { output: Box<GenerationOutput>, text: String },
}

pub(crate) struct Generation {
    stream: Option<RequestStream>,
    tokenizer: Tokenizer,
    decoder: IncrementalDecoder,
    stop: StopMatcher,
    stop_token_ids: Vec<u32>,
    /// Special tokens' text is output (vLLM's `skip_special_tokens: false`), but for the EOS
    /// that ends the generation.
    keep_special_tokens: bool,
    /// Neither stop sequences nor stop tokens end the generation before this many tokens
    /// (vLLM's `min_tokens`; the shard holds back EOS and stop tokens until then).
    min_tokens: u32,
    prompt_ids: Vec<u32>,
    max_new_tokens: u32,
    ignore_eos: bool,
    text: String,
    /// Bytes of `text` already handed out in token events.
    released: usize,
    tokens: Vec<Token>,
    top_tokens: Vec<Vec<Token>>,
    prefill_logprobs: Option<Vec<api::PromptLogprob>>,
    cached_tokens: u32,
    seed: Option<u64>,
    timings: Timings,
    first_event: Option<Instant>,
    /// Set once the generation has ended; the next call yields `End`.
    finish: Option<(FinishReason, Option<api::RequestTimings>)>,
    ended: bool,
}

impl Generation {
    pub fn new(
        stream: RequestStream,
        request: &ValidRequest,
        tokenizer: Tokenizer,
        seed: u64,
    ) -> Self {
        let sampling = request.parameters.sampling.do_sample;
        Self {
            stream: Some(stream),
            decoder: IncrementalDecoder::new(&request.prompt_ids, !request.parameters.keep_special_tokens)
                .keeping(&request.parameters.kept_special_tokens),
            keep_special_tokens: request.parameters.keep_special_tokens,
            tokenizer,
            stop: StopMatcher::new(&request.parameters.stop).trimming(request.parameters.trim_stop_sequences),
            stop_token_ids: request.parameters.stop_token_ids.clone(),
            min_tokens: request.parameters.sampling.min_tokens,
            prompt_ids: request.prompt_ids.clone(),
            max_new_tokens: request.max_new_tokens,
            ignore_eos: request.parameters.ignore_eos,
            text: String::new(),
            released: 0,
            tokens: Vec::new(),
            top_tokens: Vec::new(),
            prefill_logprobs: None,
            cached_tokens: 0,
            seed: sampling.then_some(seed),
            timings: Timings {
                arrival: request.arrival,
                validated: request.validated,
                first_scheduled: request.validated,
                finished: request.validated,
            },
            first_event: None,
            finish: None,
            ended: false,
        }
    }

    /// The next event; `None` after `End`. An engine failure ends the generation with an error.
    pub async fn next(&mut self) -> Option<Result<GenerationEvent, HttpError>> {
        if self.ended {
            return None;
        }
        loop {
            if let Some((reason, engine_timings)) = self.finish {
                self.ended = true;
                return Some(self.end(reason, engine_timings).map(|output| {
                    let text = output.generated_text.get(self.released..).unwrap_or_default().to_string();
                    GenerationEvent::End { output, text }
                }));
            }
            let Some(stream) = self.stream.as_mut() else {
                self.ended = true;
                return Some(Err(HttpError::Incomplete));
            };
            let event = stream.recv().await;
            self.first_event.get_or_insert_with(Instant::now);
            match event {
                Some(EngineEvent::Token(token)) => {
                    let result = self.on_token_event(token).await;
                    self.ended |= result.is_err();
                    return Some(result);
                }
                Some(other) => {
                    if let Err(error) = self.on_end_event(other) {
                        self.ended = true;
                        return Some(Err(error));
                    }
                }
                None => {
                    self.ended = true;
                    return Some(Err(HttpError::Incomplete));
                }
            }
        }
    }

    /// A token; when it is the last one, waits for the engine's end event (sent with it) and
    /// attaches the output.
    async fn on_token_event(
        &mut self,
        token: GeneratedToken,
    ) -> Result<GenerationEvent, HttpError> {
        let last_by_engine = (token.is_eos && !self.ignore_eos)
            || token.completes_grammar
            || self.tokens.len() + 1 >= self.max_new_tokens as usize;
        let mut event = self.on_token(token)?;
        if self.finish.is_none() && last_by_engine {
            while self.finish.is_none() {
                let stream = self.stream.as_mut().ok_or(HttpError::Incomplete)?;
                match stream.recv().await {
                    Some(EngineEvent::Token(_)) | None => return Err(HttpError::Incomplete),
                    Some(other) => self.on_end_event(other)?,
                }
            }
        }
        if let Some((reason, engine_timings)) = self.finish.take() {
            self.ended = true;
            let output = self.end(reason, engine_timings)?;
            if let GenerationEvent::Token { text, end, .. } = &mut event {
                text.push_str(output.generated_text.get(self.released..).unwrap_or_default());
                *end = Some(output);
            }
        }
        Ok(event)
    }

    /// Records `Finished`, prompt logprobs or the first scheduling's cached tokens; a failure
    /// becomes the generation's error.
    fn on_end_event(&mut self, event: EngineEvent) -> Result<(), HttpError> {
        match event {
            EngineEvent::Scheduled { cached_tokens } => self.cached_tokens = cached_tokens,
            EngineEvent::PromptLogprobs(logprobs) => self.prefill_logprobs = Some(logprobs),
            EngineEvent::Finished { reason, timings } => {
                let reason = match reason {
                    api::FinishReason::Length => FinishReason::Length,
                    api::FinishReason::EosToken => FinishReason::EosToken,
                };
                self.finish = Some((reason, Some(timings)));
            }
            EngineEvent::Failed(error) => return Err(error.into()),
            EngineEvent::Token(_) => return Err(HttpError::Incomplete),
        }
        Ok(())
    }

    fn on_token(&mut self, generated: GeneratedToken) -> Result<GenerationEvent, HttpError> {
        let tokenizer = &self.tokenizer;
        let special = tokenizer.is_special(generated.id);
        let ends = generated.is_eos && !self.ignore_eos;
        let mut piece = if ends && self.keep_special_tokens {
            String::new()
        } else {
            self.decoder.push(tokenizer, generated.id).map_err(|error| HttpError::Tokenizer(error.to_string()))?
        };
        let new_from = self.text.len();
        self.text.push_str(&piece);
        let may_stop = self.tokens.len() + 1 >= self.min_tokens as usize;
        if let Some(end) = self.stop.find(&self.text, new_from).filter(|_| may_stop) {
            self.text.truncate(end);
            piece = self.text.get(new_from..).unwrap_or_default().to_string();
            // Dropping the stream cancels the request in the engine, which frees its blocks.
            self.stream = None;
            self.finish = Some((FinishReason::StopSequence, None));
        } else if may_stop && self.stop_token_ids.contains(&generated.id) {
            self.stream = None;
            self.finish = Some((FinishReason::StopSequence, None));
        }
        let token = Token {
            id: generated.id,
            text: if special {
                tokenizer.token_text(generated.id)
            } else {
                piece.clone()
            },
            logprob: generated.logprob,
            special,
        };
        let top_tokens = self.tokens_of(&generated.top_tokens);
        self.tokens.push(token.clone());
        if !top_tokens.is_empty() {
            self.top_tokens.push(top_tokens.clone());
        }
        let index = u32::try_from(self.tokens.len()).unwrap_or(u32::MAX);
        // Text that may be the start of a stop sequence left out of the output waits (the end
        // of the generation releases it).
        let held = if self.finish.is_some() { 0 } else { self.stop.held_back(&self.text) };
        let release_to = (self.text.len() - held).max(self.released);
        let text = self.text.get(self.released..release_to).unwrap_or_default().to_string();
        self.released = release_to;
        Ok(GenerationEvent::Token {
            index,
            token,
            top_tokens,
            text,
            end: None,
        })
    }

    fn end(
        &mut self,
        reason: FinishReason,
        engine_timings: Option<api::RequestTimings>,
    ) -> Result<Box<GenerationOutput>, HttpError> {
        if reason != FinishReason::StopSequence {
            let rest = self
                .decoder
                .flush(&self.tokenizer)
                .map_err(|error| HttpError::Tokenizer(error.to_string()))?;
            self.text.push_str(&rest);
        }
        let mut timings = self.timings;
        match engine_timings {
            Some(engine) => {
                timings.first_scheduled = engine.first_scheduled;
                timings.finished = engine.finished;
            }
            None => {
                timings.first_scheduled = self.first_event.unwrap_or(timings.validated);
                timings.finished = Instant::now();
            }
        }
        Ok(Box::new(GenerationOutput {
            generated_text: self.text.clone(),
            finish_reason: reason,
            generated_tokens: u32::try_from(self.tokens.len()).unwrap_or(u32::MAX),
            seed: self.seed,
            prefill: self.prefill_tokens(),
            prefill_top_tokens: self.prefill_top_tokens(),
            tokens: std::mem::take(&mut self.tokens),
            top_tokens: std::mem::take(&mut self.top_tokens),
            input_length: u32::try_from(self.prompt_ids.len()).unwrap_or(u32::MAX),
            cached_tokens: self.cached_tokens,
            timings,
        }))
    }

    /// Prompt tokens served from the prefix cache (known once the request is first scheduled,
    /// before its first token).
    pub fn cached_tokens(&self) -> u32 {
        self.cached_tokens
    }

    /// Prompt tokens with their logprobs, when the request asked for them (known once the
    /// first token's event is out).
    pub fn prefill_tokens(&self) -> Vec<PrefillToken> {
        let Some(logprobs) = &self.prefill_logprobs else {
            return Vec::new();
        };
        self.prompt_ids
            .iter()
            .enumerate()
            .map(|(position, &id)| {
                // Position 0 has no logprob; position i's is logprobs[i - 1].
                let scored = position.checked_sub(1).and_then(|i| logprobs.get(i));
                PrefillToken {
                    id,
                    text: self.tokenizer.token_text(id),
                    special: self.tokenizer.is_special(id),
                    logprob: scored.map(|prompt| prompt.logprob),
                    rank: scored.map(|prompt| prompt.rank),
                }
            })
            .collect()
    }

    /// The alternatives at prompt positions 1.., when the request asked for them.
    pub fn prefill_top_tokens(&self) -> Vec<Vec<Token>> {
        let logprobs = self.prefill_logprobs.as_deref().unwrap_or_default();
        logprobs.iter().map(|prompt| self.tokens_of(&prompt.top_tokens)).collect()
    }

    fn tokens_of(&self, tops: &[api::TokenLogprob]) -> Vec<Token> {
        tops.iter()
            .map(|top| Token {
                id: top.id,
                text: self.tokenizer.token_text(top.id),
                logprob: top.logprob,
                special: self.tokenizer.is_special(top.id),
            })
            .collect()
    }

    /// Runs to the end and returns the output (non-streaming routes).
    #[tracing::instrument(skip_all, name = "generation")]
    pub async fn collect(mut self) -> Result<GenerationOutput, HttpError> {
        while let Some(event) = self.next().await {
            match event? {
                GenerationEvent::End { output, .. }
                | GenerationEvent::Token {
                    end: Some(output), ..
                } => return Ok(*output),
                GenerationEvent::Token { end: None, .. } => {}
            }
        }
        Err(HttpError::Incomplete)
    }
}
