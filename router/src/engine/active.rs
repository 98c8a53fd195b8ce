//! The engine's per-request bookkeeping: where to send a request's events, what it asked for,
//! and how far it got. The scheduler owns everything about blocks and positions; this owns
//! everything about the client.
use std::collections::HashMap;
use std::time::Instant;

use tokio::sync::mpsc;

use super::api::{EngineEvent, FinishReason, GenerationRequest, PromptLogprob, RequestTimings, SpanContext, TokenConstraint};
use super::attainment::TokenTimes;
use crate::grammar::{Advance, GrammarError};

pub(crate) struct ActiveRequest {
    pub request: GenerationRequest,
    pub events: mpsc::UnboundedSender<EngineEvent>,
    /// Whether the shard knows the request (its `NewRequest` was sent), so it must be forgotten.
    pub sent_to_shard: bool,
    pub generated_tokens: u32,
    /// Prompt logprobs gathered over the prefill chunks, sent with the first token.
    pub prompt_logprobs: Vec<PromptLogprob>,
    pub first_scheduled: Option<Instant>,
    /// When each token was produced, for the SLO attainment counters.
    pub token_times: TokenTimes,
    /// The request's grammar, advanced by every token it sampled (and by nothing else: a
    /// recompute or a rotation replays no token through it).
    pub constraint: Option<TokenConstraint>,
}

impl ActiveRequest {
    pub fn new(mut request: GenerationRequest, events: mpsc::UnboundedSender<EngineEvent>) -> Self {
        Self {
            constraint: request.constraint.take(),
            request,
            events,
            sent_to_shard: false,
            generated_tokens: 0,
            prompt_logprobs: Vec::new(),
            first_scheduled: None,
            token_times: TokenTimes::default(),
        }
    }

    /// Why the request ends after its latest token, if it does (`grammar_complete`: its
    /// grammar allows nothing more).
    pub fn finish_reason(&self, last_token_is_eos: bool, grammar_complete: bool) -> Option<FinishReason> {
        if (last_token_is_eos && !self.request.ignore_eos) || grammar_complete {
            Some(FinishReason::EosToken)
        } else if self.generated_tokens >= self.request.max_new_tokens {
            Some(FinishReason::Length)
        } else {
            None
        }
    }

    /// Feeds a sampled token to the request's grammar, if it has one.
    pub fn advance_grammar(&mut self, token: u32) -> Result<Advance, GrammarError> {
        match self.constraint.as_mut() {
            Some(constraint) => constraint.advance(token),
            None => Ok(Advance::Continue),
        }
    }

    pub fn timings(&self, now: Instant) -> RequestTimings {
        RequestTimings { first_scheduled: self.first_scheduled.unwrap_or(now), finished: now }
    }

    /// The span that submitted the request, which the steps serving it link to
    /// (`step_trace`); invalid when traces are off.
    pub fn span_context(&self) -> &SpanContext {
        &self.request.span_context
    }

    /// Sends an event; false when the client has gone (its stream was dropped).
    pub fn send(&self, event: EngineEvent) -> bool {
        self.events.send(event).is_ok()
    }
}

/// Every request the engine has accepted and not yet finished, by id.
#[derive(Default)]
pub(crate) struct ActiveRequests {
    by_id: HashMap<u64, ActiveRequest>,
}

impl ActiveRequests {
    pub fn insert(&mut self, id: u64, request: ActiveRequest) {
        self.by_id.insert(id, request);
    }

    /// Whether any request decodes under a grammar (its next mask needs its last token).
    pub fn any_constrained(&self) -> bool {
        self.by_id.values().any(|request| request.constraint.is_some())
    }

    pub fn get(&self, id: u64) -> Option<&ActiveRequest> {
        self.by_id.get(&id)
    }

    pub fn get_mut(&mut self, id: u64) -> Option<&mut ActiveRequest> {
        self.by_id.get_mut(&id)
    }

    pub fn remove(&mut self, id: u64) -> Option<ActiveRequest> {
        self.by_id.remove(&id)
    }

    pub fn iter_mut(&mut self) -> impl Iterator<Item = (u64, &mut ActiveRequest)> + '_ {
        self.by_id.iter_mut().map(|(&id, request)| (id, request))
    }

    pub fn values(&self) -> impl Iterator<Item = &ActiveRequest> + '_ {
        self.by_id.values()
    }

    /// The adapter slots the requests run with (one per request with an adapter).
    pub fn adapter_slots(&self) -> impl Iterator<Item = u64> + '_ {
        self.values().filter_map(|active| active.request.adapter.as_ref().map(|adapter| adapter.namespace))
    }

    pub fn ids(&self) -> impl Iterator<Item = u64> + '_ {
        self.by_id.keys().copied()
    }

    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    pub fn drain(&mut self) -> impl Iterator<Item = (u64, ActiveRequest)> + '_ {
        self.by_id.drain()
    }
}
