//! Turns the scheduler's `StepPlan` into the shard's `StepRequest`: the plan's compute and
//! transfers, plus what only the engine knows — which requests to forget and which prompts the
//! shard has not seen yet.
use std::collections::HashMap;
use std::time::Instant;

use superinfer_scheduler::{ScheduledEntry, StepPlan, Transfer};

use super::active::ActiveRequests;
use super::api::{EngineEvent, SamplingParams};
use crate::pb;

/// Builds the Step RPC for `plan`, with the grammar masks (`constraints::allowed_tokens`) of
/// the constrained requests it samples for. Marks the requests whose prompt it sends as known
/// to the shard and stamps their first scheduling time.
pub(crate) fn build_step_request(
    plan: &StepPlan,
    forget: Vec<u64>,
    requests: &mut ActiveRequests,
    mut masks: HashMap<u64, Vec<u8>>,
    now: Instant,
) -> pb::StepRequest {
    let new_requests = plan
        .first_scheduled
        .iter()
        .filter_map(|&id| {
            let active = requests.get_mut(id)?;
            active.sent_to_shard = true;
            active.first_scheduled.get_or_insert(now);
            // Admitted with its cached prefix as computed positions.
            let cached_tokens = plan.scheduled.iter().find(|entry| entry.id == id).map_or(0, |entry| entry.num_computed_tokens);
            active.send(EngineEvent::Scheduled { cached_tokens });
            Some(pb::NewRequest {
                id,
                prompt_token_ids: active.request.prompt_token_ids.clone(),
                parameters: Some(sampling_parameters(&active.request.sampling, active.request.top_n_tokens)),
                prompt_logprobs: active.request.prompt_logprobs,
                prompt_top_n: active.request.prompt_top_n.filter(|_| active.request.prompt_logprobs),
                adapter_id: active.request.adapter.as_ref().map(|adapter| adapter.id.clone()).unwrap_or_default(),
                adapter_slot: active.request.adapter.as_ref().map_or(0, |adapter| adapter.namespace),
            })
        })
        .collect();
    pb::StepRequest {
        step_id: plan.step_id,
        forget,
        new_requests,
        rotate_out: plan.rotate_out.iter().map(transfer).collect(),
        rotate_in: plan.rotate_in.iter().map(transfer).collect(),
        // The engine sets it when another step is still in flight.
        previous_step_id: 0,
        scheduled: plan
            .scheduled
            .iter()
            .map(|entry| {
                let sample = plan.sampling.binary_search(&entry.id).is_ok();
                let allowed_tokens = if sample { masks.remove(&entry.id).unwrap_or_default() } else { Vec::new() };
                let input_from_shard = plan.input_from_shard.binary_search(&entry.id).is_ok();
                scheduled(entry, sample, allowed_tokens, input_from_shard)
            })
            .collect(),
    }
}

fn sampling_parameters(sampling: &SamplingParams, top_n_tokens: u32) -> pb::SamplingParameters {
    pb::SamplingParameters {
        do_sample: sampling.do_sample,
        temperature: sampling.temperature,
        top_k: sampling.top_k,
        top_p: sampling.top_p,
        typical_p: sampling.typical_p,
        min_p: sampling.min_p,
        allowed_token_ids: sampling.allowed_token_ids.clone(),
        bad_words: sampling.bad_words.iter().map(|ids| pb::TokenSequence { ids: ids.clone() }).collect(),
        repetition_penalty: sampling.repetition_penalty,
        frequency_penalty: sampling.frequency_penalty,
        presence_penalty: sampling.presence_penalty,
        seed: sampling.seed,
        top_n_tokens,
        logit_bias: sampling.logit_bias.iter().copied().collect(),
        min_tokens: sampling.min_tokens,
        end_token_ids: sampling.end_token_ids.clone(),
    }
}

fn transfer(transfer: &Transfer) -> pb::Transfer {
    pb::Transfer {
        id: transfer.id,
        src_blocks: transfer.src_blocks.clone(),
        dst_blocks: transfer.dst_blocks.clone(),
    }
}

/// `sample` and `input_from_shard`: the scheduler's decisions (`StepPlan::sampling` and
/// `StepPlan::input_from_shard`, sorted), which the shard checks.
fn scheduled(entry: &ScheduledEntry, sample: bool, allowed_tokens: Vec<u8>, input_from_shard: bool) -> pb::ScheduledRequest {
    pb::ScheduledRequest {
        id: entry.id,
        num_computed_tokens: entry.num_computed_tokens,
        num_new_tokens: entry.num_new_tokens,
        block_table: entry.block_table.clone(),
        sample,
        allowed_tokens,
        input_from_shard,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::active::ActiveRequest;
    use crate::engine::testing::greedy_request;

    #[test]
    fn sends_prompts_once_with_the_plan() {
        let mut requests = ActiveRequests::default();
        let (events, _receiver) = tokio::sync::mpsc::unbounded_channel();
        requests.insert(7, ActiveRequest::new(greedy_request(vec![1, 2, 3], 4), events));
        let plan = StepPlan {
            step_id: 3,
            rotate_out: vec![Transfer { id: 11, request_id: 9, src_blocks: vec![4], dst_blocks: vec![0] }],
            scheduled: vec![
                ScheduledEntry { id: 7, num_computed_tokens: 0, num_new_tokens: 3, block_table: vec![2] },
                ScheduledEntry { id: 8, num_computed_tokens: 0, num_new_tokens: 16, block_table: vec![3] },
            ],
            first_scheduled: vec![7],
            sampling: vec![7],
            input_from_shard: vec![8],
            ..StepPlan::default()
        };
        let now = Instant::now();
        let step = build_step_request(&plan, vec![5], &mut requests, HashMap::from([(7, vec![0b101]), (8, vec![1])]), now);
        assert_eq!(step.step_id, 3);
        assert_eq!(step.forget, vec![5]);
        assert_eq!(step.new_requests.len(), 1);
        assert_eq!(step.new_requests[0].prompt_token_ids, vec![1, 2, 3]);
        assert_eq!(step.rotate_out[0].src_blocks, vec![4]);
        assert_eq!(step.rotate_out[0].dst_blocks, vec![0]);
        assert_eq!(step.scheduled[0].block_table, vec![2]);
        assert_eq!(step.scheduled[0].num_new_tokens, 3);
        // The scheduler's sampling decision travels with each entry.
        assert!(step.scheduled[0].sample && !step.scheduled[1].sample);
        // So does its placeholder decision.
        assert!(!step.scheduled[0].input_from_shard && step.scheduled[1].input_from_shard);
        // A mask travels only with an entry that samples.
        assert_eq!(step.scheduled[0].allowed_tokens, vec![0b101]);
        assert!(step.scheduled[1].allowed_tokens.is_empty());
        let active = requests.get(7).unwrap();
        assert!(active.sent_to_shard);
        assert_eq!(active.first_scheduled, Some(now));

        // The next chunk of the same request carries no prompt.
        let next = StepPlan { step_id: 4, first_scheduled: vec![], ..plan };
        assert!(build_step_request(&next, vec![], &mut requests, HashMap::new(), now).new_requests.is_empty());
    }

    #[test]
    fn skips_requests_cancelled_before_their_first_step() {
        let mut requests = ActiveRequests::default();
        let plan = StepPlan { step_id: 1, first_scheduled: vec![42], ..StepPlan::default() };
        assert!(build_step_request(&plan, vec![], &mut requests, HashMap::new(), Instant::now()).new_requests.is_empty());
    }
}
