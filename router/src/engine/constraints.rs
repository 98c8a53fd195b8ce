//! The grammar side of a step: before it, the allowed-token mask of every constrained request
//! the step samples for (timed: per request and per step, `superinfer_grammar_mask_seconds`
//! and `superinfer_grammar_step_mask_seconds`). After it, `ActiveRequest::advance_grammar`
//! feeds each sampled token to its request's matcher.
use std::collections::HashMap;
use std::time::Instant;

use super::active::ActiveRequests;
use super::metrics;

/// The masks of the constrained requests among `sampling` (the ids the step samples for), by
/// id. A matcher that fails gets an empty-set mask, so the shard fails that request alone.
pub(crate) fn allowed_tokens(sampling: &[u64], requests: &mut ActiveRequests) -> HashMap<u64, Vec<u8>> {
    let mut masks = HashMap::new();
    let started = Instant::now();
    for &id in sampling {
        let Some(constraint) = requests.get_mut(id).and_then(|active| active.constraint.as_mut()) else { continue };
        let one = Instant::now();
        let mask = constraint.allowed_tokens().unwrap_or_else(|error| {
            tracing::warn!(id, %error, "the request's grammar failed; it allows no token");
            Vec::from([0])
        });
        metrics::record_grammar_mask(one.elapsed());
        masks.insert(id, mask);
    }
    if !masks.is_empty() {
        metrics::record_grammar_step_masks(started.elapsed());
    }
    masks
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::active::ActiveRequest;
    use crate::engine::testing::greedy_request;
    use crate::grammar::compiler::tests::smollm2_compiler;
    use crate::grammar::GrammarSpec;

    #[test]
    fn only_constrained_requests_that_sample_get_a_mask() {
        let mut requests = ActiveRequests::default();
        for id in [1, 2, 3] {
            let (events, _stream) = tokio::sync::mpsc::unbounded_channel();
            let mut request = greedy_request(vec![5], 4);
            if id != 2 {
                request.constraint = Some(smollm2_compiler().compile(&GrammarSpec::Regex("[ab]".into())).unwrap());
            }
            requests.insert(id, ActiveRequest::new(request, events));
        }
        // 3 is constrained but only prefills this step.
        let masks = allowed_tokens(&[1, 2], &mut requests);
        assert_eq!(masks.keys().copied().collect::<Vec<_>>(), vec![1]);
        assert_eq!(masks[&1].len(), 49152 / 8);
        let allowed = masks[&1].iter().map(|byte| byte.count_ones()).sum::<u32>();
        assert!((2..10).contains(&allowed), "{allowed}");
    }
}
