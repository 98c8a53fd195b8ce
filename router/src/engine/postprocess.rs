//! Applies a `StepResponse`: sampled tokens advance their requests' grammars and become events
//! on the requests' streams (and samples of the time-to-first-token and inter-token latency
//! histograms), EOS, a complete grammar and `max_new_tokens` end requests, and the scheduler
//! gets the results it needs.
use std::time::Instant;

use superinfer_scheduler::{ScheduledEntry, StepResults};

use super::active::ActiveRequests;
use crate::grammar::Advance;
use super::api::{EngineError, EngineEvent, FinishReason, GeneratedToken, PromptLogprob, TokenLogprob};
use super::{metrics, vllm_metrics};
use crate::pb;

/// What the engine must do after a step besides informing the scheduler.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct StepOutcome {
    pub results: StepResults,
    /// Requests that reached EOS or their token limit (their final event is sent).
    pub finished: Vec<(u64, FinishReason)>,
    /// Requests whose client went away while their events were being sent.
    pub disconnected: Vec<u64>,
    /// Requests the shard failed on their own this step (their `Failed` event is sent).
    pub failed: Vec<u64>,
}

/// A prompt's logprobs come back chunk by chunk, in position order: the logprobs of a chunk
/// that starts at position c follow the c before it. A request preempted for recompute computes
/// its prompt again from position 0, so what it had gathered is dropped first, not doubled.
/// Call it with a step's scheduled entries before applying that step's reply.
pub(crate) fn align_prompt_logprobs(scheduled: &[ScheduledEntry], requests: &mut ActiveRequests) {
    for entry in scheduled {
        if let Some(active) = requests.get_mut(entry.id) {
            active.prompt_logprobs.truncate(entry.num_computed_tokens as usize);
        }
    }
}

pub(crate) fn apply_step_response(
    response: pb::StepResponse,
    requests: &mut ActiveRequests,
    eos_token_ids: &[u32],
    now: Instant,
) -> StepOutcome {
    let step_time_s = response.timings.map(|timings| timings.total_ns as f64 * 1e-9);
    let mut outcome = StepOutcome {
        results: StepResults {
            step_id: response.step_id,
            sampled: Vec::new(),
            completed_transfers: response.completed_transfers,
            step_time_s,
        },
        ..StepOutcome::default()
    };
    for output in response.outputs {
        let id = output.request_id;
        let Some(active) = requests.get_mut(id) else { continue };
        if !output.error.is_empty() {
            tracing::warn!(id, error = %output.error, "the shard failed the request");
            active.send(EngineEvent::Failed(EngineError::Request(output.error)));
            outcome.failed.push(id);
            continue;
        }
        // One list of alternatives and one rank per logprob (no alternatives without a
        // `prompt_top_n` or `top_n_tokens`).
        let mut tops = output.prompt_top_tokens.into_iter();
        let mut ranks = output.prompt_ranks.into_iter();
        active.prompt_logprobs.extend(output.prompt_logprobs.into_iter().map(|logprob| PromptLogprob {
            logprob,
            rank: ranks.next().unwrap_or_default(),
            top_tokens: tops.next().map(|top| top.tokens.into_iter().map(token_logprob).collect()).unwrap_or_default(),
        }));
        let Some(sampled) = output.token else { continue };
        outcome.results.sampled.push((id, sampled.id));
        let is_eos = eos_token_ids.contains(&sampled.id);
        // An EOS ends the request anyway; the grammar only judges the tokens before it.
        let grammar = if is_eos { Ok(Advance::Continue) } else { active.advance_grammar(sampled.id) };
        let grammar_complete = match grammar {
            Ok(advance) => advance == Advance::Complete,
            Err(error) => {
                tracing::warn!(id, %error, "the sampled token left the request's grammar");
                active.send(EngineEvent::Failed(EngineError::Request(error.to_string())));
                outcome.failed.push(id);
                continue;
            }
        };
        let mut connected = true;
        if active.generated_tokens == 0 && active.request.prompt_logprobs {
            let logprobs = std::mem::take(&mut active.prompt_logprobs);
            connected &= active.send(EngineEvent::PromptLogprobs(logprobs));
        }
        active.generated_tokens += 1;
        match active.token_times.record(now) {
            Some(gap_s) => {
                metrics::record_token_gap(gap_s);
                vllm_metrics::record_token_gap(gap_s);
            }
            None => {
                let ttft = now.saturating_duration_since(active.request.arrival);
                metrics::record_first_token(ttft);
                vllm_metrics::record_first_token(ttft);
            }
        }
        connected &= active.send(EngineEvent::Token(generated_token(sampled, is_eos, grammar_complete)));
        if let Some(reason) = active.finish_reason(is_eos, grammar_complete) {
            active.send(EngineEvent::Finished { reason, timings: active.timings(now) });
            outcome.finished.push((id, reason));
        } else if !connected {
            outcome.disconnected.push(id);
        }
    }
    outcome
}

fn token_logprob(top: pb::TokenLogprob) -> TokenLogprob {
    TokenLogprob { id: top.id, logprob: top.logprob }
}

fn generated_token(sampled: pb::SampledToken, is_eos: bool, completes_grammar: bool) -> GeneratedToken {
    GeneratedToken {
        id: sampled.id,
        logprob: sampled.logprob,
        top_tokens: sampled.top_tokens.into_iter().map(token_logprob).collect(),
        is_eos,
        completes_grammar,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::engine::active::ActiveRequest;
    use crate::engine::testing::greedy_request;

    fn output(request_id: u64, token: Option<u32>, prompt_logprobs: Vec<f32>) -> pb::RequestOutput {
        pb::RequestOutput {
            request_id,
            token: token.map(|id| pb::SampledToken { id, logprob: -0.5, top_tokens: vec![] }),
            prompt_logprobs,
            prompt_top_tokens: vec![],
            prompt_ranks: vec![],
            error: String::new(),
        }
    }

    #[test]
    fn tokens_become_events_and_limits_finish_requests() {
        let mut requests = ActiveRequests::default();
        let (events_a, mut stream_a) = tokio::sync::mpsc::unbounded_channel();
        let (events_b, mut stream_b) = tokio::sync::mpsc::unbounded_channel();
        requests.insert(1, ActiveRequest::new(greedy_request(vec![5, 6], 1), events_a));
        requests.insert(2, ActiveRequest::new(greedy_request(vec![5, 6, 7], 8), events_b));
        let response = pb::StepResponse {
            step_id: 9,
            outputs: vec![output(1, Some(40), vec![]), output(2, Some(0), vec![])],
            completed_transfers: vec![3],
            timings: Some(pb::StepTimings { total_ns: 2_000_000, ..Default::default() }),
        };
        let outcome = apply_step_response(response, &mut requests, &[0], Instant::now());
        assert_eq!(outcome.results.sampled, vec![(1, 40), (2, 0)]);
        assert_eq!(outcome.results.completed_transfers, vec![3]);
        assert_eq!(outcome.results.step_time_s, Some(0.002));
        assert_eq!(outcome.finished, vec![(1, FinishReason::Length), (2, FinishReason::EosToken)]);
        assert!(matches!(stream_a.try_recv(), Ok(EngineEvent::Token(t)) if t.id == 40 && !t.is_eos));
        assert!(matches!(stream_a.try_recv(), Ok(EngineEvent::Finished { reason: FinishReason::Length, .. })));
        assert!(matches!(stream_b.try_recv(), Ok(EngineEvent::Token(t)) if t.is_eos));
    }

    #[test]
    fn token_times_are_stamped_with_the_step_reply() {
        let mut requests = ActiveRequests::default();
        let (events, _stream) = tokio::sync::mpsc::unbounded_channel();
        let request = greedy_request(vec![5, 6], 8);
        let arrival = request.arrival;
        requests.insert(5, ActiveRequest::new(request, events));
        let slo = superinfer_scheduler::Slo::new(1.0, 0.05);
        let reply = || pb::StepResponse { outputs: vec![output(5, Some(7), vec![])], ..Default::default() };
        // A prefill chunk without a token stamps nothing.
        let chunk = pb::StepResponse { outputs: vec![output(5, None, vec![])], ..Default::default() };
        apply_step_response(chunk, &mut requests, &[0], arrival);
        assert_eq!(requests.get(5).unwrap().token_times.attainment(arrival, slo, 90.0), None);
        apply_step_response(reply(), &mut requests, &[0], arrival + Duration::from_millis(200));
        apply_step_response(reply(), &mut requests, &[0], arrival + Duration::from_millis(400));
        let verdict = requests.get(5).unwrap().token_times.attainment(arrival, slo, 90.0).unwrap();
        assert!(verdict.ttft_met && !verdict.tbt_met, "{verdict:?}");
    }

    #[test]
    fn prompt_logprobs_arrive_before_the_first_token_across_chunks() {
        let mut requests = ActiveRequests::default();
        let (events, mut stream) = tokio::sync::mpsc::unbounded_channel();
        let mut request = greedy_request(vec![5, 6, 7, 8], 4);
        request.prompt_logprobs = true;
        requests.insert(3, ActiveRequest::new(request, events));
        let chunk = pb::StepResponse { outputs: vec![output(3, None, vec![-1.0, -2.0])], ..Default::default() };
        let outcome = apply_step_response(chunk, &mut requests, &[0], Instant::now());
        assert!(outcome.results.sampled.is_empty());
        assert!(stream.try_recv().is_err());
        let last = pb::StepResponse { outputs: vec![output(3, Some(9), vec![-3.0])], ..Default::default() };
        apply_step_response(last, &mut requests, &[0], Instant::now());
        let logprobs = |l: &[PromptLogprob]| l.iter().map(|p| p.logprob).collect::<Vec<_>>();
        assert!(matches!(stream.try_recv(), Ok(EngineEvent::PromptLogprobs(l)) if logprobs(&l) == vec![-1.0, -2.0, -3.0]));
        assert!(matches!(stream.try_recv(), Ok(EngineEvent::Token(t)) if t.id == 9));
    }

    #[test]
    fn prompt_logprobs_carry_their_positions_alternatives_and_ranks() {
        let mut requests = ActiveRequests::default();
        let (events, mut stream) = tokio::sync::mpsc::unbounded_channel();
        let mut request = greedy_request(vec![5, 6, 7], 4);
        request.prompt_logprobs = true;
        request.top_n_tokens = 1;
        requests.insert(3, ActiveRequest::new(request, events));
        let mut chunk = output(3, Some(9), vec![-1.0, -2.0]);
        let top = |id, logprob| pb::TopTokens { tokens: vec![pb::TokenLogprob { id, logprob }] };
        chunk.prompt_top_tokens = vec![top(6, -1.0), top(4, -0.5)];
        chunk.prompt_ranks = vec![1, 2];
        apply_step_response(pb::StepResponse { outputs: vec![chunk], ..Default::default() }, &mut requests, &[0], Instant::now());
        let Ok(EngineEvent::PromptLogprobs(logprobs)) = stream.try_recv() else { panic!("no prompt logprobs") };
        assert_eq!(
            logprobs,
            vec![
                PromptLogprob { logprob: -1.0, rank: 1, top_tokens: vec![TokenLogprob { id: 6, logprob: -1.0 }] },
                PromptLogprob { logprob: -2.0, rank: 2, top_tokens: vec![TokenLogprob { id: 4, logprob: -0.5 }] },
            ]
        );
    }

    #[test]
    fn a_prompt_computed_again_from_the_start_keeps_one_logprob_per_position() {
        let mut requests = ActiveRequests::default();
        let (events, mut stream) = tokio::sync::mpsc::unbounded_channel();
        let mut request = greedy_request(vec![5, 6, 7, 8, 9], 4);
        request.prompt_logprobs = true;
        requests.insert(3, ActiveRequest::new(request, events));
        let entry = |computed, new| ScheduledEntry { id: 3, num_computed_tokens: computed, num_new_tokens: new, block_table: vec![0] };
        // A first chunk of 3 positions, then a recompute from 0 (the whole prompt), then the
        // first token: 4 logprobs, those of the second pass.
        align_prompt_logprobs(&[entry(0, 3)], &mut requests);
        apply_step_response(pb::StepResponse { outputs: vec![output(3, None, vec![-1.0, -2.0, -3.0])], ..Default::default() }, &mut requests, &[0], Instant::now());
        align_prompt_logprobs(&[entry(0, 5)], &mut requests);
        let again = output(3, Some(9), vec![-1.5, -2.5, -3.5, -4.5]);
        apply_step_response(pb::StepResponse { outputs: vec![again], ..Default::default() }, &mut requests, &[0], Instant::now());
        let Ok(EngineEvent::PromptLogprobs(logprobs)) = stream.try_recv() else { panic!("no prompt logprobs") };
        assert_eq!(logprobs.iter().map(|p| p.logprob).collect::<Vec<_>>(), vec![-1.5, -2.5, -3.5, -4.5]);
        // Chunks that follow each other keep what came before.
        let mut requests = ActiveRequests::default();
        let (events, mut stream) = tokio::sync::mpsc::unbounded_channel();
        let mut request = greedy_request(vec![5, 6, 7, 8, 9], 4);
        request.prompt_logprobs = true;
        requests.insert(3, ActiveRequest::new(request, events));
        align_prompt_logprobs(&[entry(0, 3)], &mut requests);
        apply_step_response(pb::StepResponse { outputs: vec![output(3, None, vec![-1.0, -2.0, -3.0])], ..Default::default() }, &mut requests, &[0], Instant::now());
        align_prompt_logprobs(&[entry(3, 2)], &mut requests);
        apply_step_response(pb::StepResponse { outputs: vec![output(3, Some(9), vec![-4.0])], ..Default::default() }, &mut requests, &[0], Instant::now());
        let Ok(EngineEvent::PromptLogprobs(logprobs)) = stream.try_recv() else { panic!("no prompt logprobs") };
        assert_eq!(logprobs.len(), 4);
    }

    #[test]
    fn a_request_the_shard_failed_fails_alone() {
        let mut requests = ActiveRequests::default();
        let (events_a, mut stream_a) = tokio::sync::mpsc::unbounded_channel();
        let (events_b, mut stream_b) = tokio::sync::mpsc::unbounded_channel();
        requests.insert(1, ActiveRequest::new(greedy_request(vec![5], 8), events_a));
        requests.insert(2, ActiveRequest::new(greedy_request(vec![6], 8), events_b));
        let mut bad = output(1, None, vec![]);
        bad.error = "sampling failed".into();
        let response = pb::StepResponse { outputs: vec![bad, output(2, Some(7), vec![])], ..Default::default() };
        let outcome = apply_step_response(response, &mut requests, &[0], Instant::now());
        assert_eq!(outcome.failed, vec![1]);
        assert_eq!(outcome.results.sampled, vec![(2, 7)]);
        assert!(matches!(stream_a.try_recv(), Ok(EngineEvent::Failed(EngineError::Request(m))) if m == "sampling failed"));
        assert!(matches!(stream_b.try_recv(), Ok(EngineEvent::Token(t)) if t.id == 7));
    }

    #[test]
    fn a_grammar_advances_with_each_token_and_ends_or_fails_its_request() {
        use crate::grammar::compiler::tests::smollm2_compiler;
        use crate::grammar::GrammarSpec;
        let tokenizer = crate::tokenizer::tests::smollm2();
        let digit = |text: &str| tokenizer.encode(text, false).unwrap().ids[0];
        let mut requests = ActiveRequests::default();
        let (events_a, mut stream_a) = tokio::sync::mpsc::unbounded_channel();
        let (events_b, mut stream_b) = tokio::sync::mpsc::unbounded_channel();
        for (id, events) in [(1, events_a), (2, events_b)] {
            let mut request = greedy_request(vec![5], 8);
            request.constraint = Some(smollm2_compiler().compile(&GrammarSpec::Regex("[0-9]{2}".into())).unwrap());
            requests.insert(id, ActiveRequest::new(request, events));
        }
        let step = |a: u32, b: u32| pb::StepResponse { outputs: vec![output(1, Some(a), vec![]), output(2, Some(b), vec![])], ..Default::default() };
        let first = apply_step_response(step(digit("4"), digit("x")), &mut requests, &[0], Instant::now());
        // A token the grammar does not allow fails its request alone.
        assert_eq!(first.failed, vec![2]);
        assert!(matches!(stream_b.try_recv(), Ok(EngineEvent::Failed(EngineError::Request(_)))));
        assert!(matches!(stream_a.try_recv(), Ok(EngineEvent::Token(t)) if !t.completes_grammar));
        requests.remove(2);
        // The second digit completes the grammar: the request ends without waiting for EOS.
        let second = pb::StepResponse { outputs: vec![output(1, Some(digit("2")), vec![])], ..Default::default() };
        let outcome = apply_step_response(second, &mut requests, &[0], Instant::now());
        assert_eq!(outcome.finished, vec![(1, FinishReason::EosToken)]);
        assert!(matches!(stream_a.try_recv(), Ok(EngineEvent::Token(t)) if t.completes_grammar && !t.is_eos));
        assert!(matches!(stream_a.try_recv(), Ok(EngineEvent::Finished { reason: FinishReason::EosToken, .. })));
    }

    #[test]
    fn a_dropped_stream_is_reported_as_disconnected() {
        let mut requests = ActiveRequests::default();
        let (events, stream) = tokio::sync::mpsc::unbounded_channel();
        requests.insert(4, ActiveRequest::new(greedy_request(vec![1], 8), events));
        drop(stream);
        let response = pb::StepResponse { outputs: vec![output(4, Some(3), vec![])], ..Default::default() };
        let outcome = apply_step_response(response, &mut requests, &[0], Instant::now());
        assert_eq!(outcome.disconnected, vec![4]);
        assert!(outcome.finished.is_empty());
    }
}
