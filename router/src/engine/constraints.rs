//! The grammar side of a step: before it, the allowed-token mask of every constrained request
//! the step samples for (timed: per request and per step, `superinfer_grammar_mask_seconds`
//! and `superinfer_grammar_step_mask_seconds`). After it, `ActiveRequest::advance_grammar`
//! feeds each sampled token to its request's matcher.
use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::active::ActiveRequests;
use super::metrics;
use crate::grammar::TokenConstraint;

/// The masks of the constrained requests among `sampling` (the ids the step samples for), by
/// id; a reply still reasoning before its grammar holds has none. A matcher that fails gets
/// an empty-set mask, so the shard fails that request alone.
/// The requests' matchers are independent, so they run on up to `available_parallelism`
/// threads: with 32 constrained streams the step waits for the slowest share, not the sum.
pub(crate) fn allowed_tokens(sampling: &[u64], requests: &mut ActiveRequests) -> HashMap<u64, Vec<u8>> {
    let started = Instant::now();
    let mut constrained: Vec<(u64, &mut TokenConstraint)> = requests
        .iter_mut()
        .filter(|(id, _)| sampling.binary_search(id).is_ok())
        .filter_map(|(id, active)| active.constraint.as_mut().map(|constraint| (id, constraint)))
        .collect();
    if constrained.is_empty() {
        return HashMap::new();
    }
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(MAX_MASK_THREADS);
    let share = constrained.len().div_ceil(threads);
    let computed: Vec<(u64, Option<Vec<u8>>, Duration)> = if threads == 1 || constrained.len() == 1 {
        constrained.iter_mut().map(|(id, constraint)| mask_of(*id, constraint)).collect()
    } else {
        std::thread::scope(|scope| {
            let workers: Vec<_> = constrained
                .chunks_mut(share)
                .map(|chunk| scope.spawn(move || chunk.iter_mut().map(|(id, constraint)| mask_of(*id, constraint)).collect::<Vec<_>>()))
                .collect();
            // A worker that panicked leaves its requests without a mask: they get the
            // empty-set mask below and fail alone.
            workers.into_iter().filter_map(|worker| worker.join().ok()).flatten().collect()
        })
    };
    let mut computed: HashMap<u64, (Option<Vec<u8>>, Duration)> =
        computed.into_iter().map(|(id, mask, elapsed)| (id, (mask, elapsed))).collect();
    let mut masks: HashMap<u64, Vec<u8>> = HashMap::with_capacity(constrained.len());
    for (id, _) in &constrained {
        match computed.remove(id) {
            Some((Some(mask), elapsed)) => {
                metrics::record_grammar_mask(elapsed);
                masks.insert(*id, mask);
            }
            // Still reasoning: no mask.
            Some((None, _)) => {}
            None => {
                masks.insert(*id, Vec::from([0]));
            }
        }
    }
    metrics::record_grammar_step_masks(started.elapsed());
    masks
}

/// Most threads one step's masks use (beyond this, thread start-up outweighs the split).
const MAX_MASK_THREADS: usize = 8;

fn mask_of(id: u64, constraint: &mut TokenConstraint) -> (u64, Option<Vec<u8>>, Duration) {
    let started = Instant::now();
    let mask = constraint.allowed_tokens().unwrap_or_else(|error| {
        tracing::warn!(id, %error, "the request's grammar failed; it allows no token");
        Some(Vec::from([0]))
    });
    (id, mask, started.elapsed())
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
