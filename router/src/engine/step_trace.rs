//! What a step's span tells a trace. A step serves many requests, each in a trace of its own,
//! so the step span is a root whose links (not parents) lead to the span that submitted each
//! request it computes or moves; the rotations it starts are events on it, with their bytes.
//! The shard's spans for the step are children of this span (its context travels with the RPC).
use opentelemetry::KeyValue;
use superinfer_scheduler::{StepPlan, Transfer};
use tracing_opentelemetry::OpenTelemetrySpanExt;

use super::active::ActiveRequests;

/// Links `span` to the requests `plan` computes or rotates, and adds an event per rotation.
/// Call before `span` is first entered: links are fixed when it starts.
pub(super) fn annotate_step(span: &tracing::Span, plan: &StepPlan, requests: &ActiveRequests, block_bytes: u64) {
    if span.is_disabled() {
        return;
    }
    let mut served: Vec<u64> = plan.scheduled.iter().map(|entry| entry.id).collect();
    served.extend(plan.rotate_out.iter().chain(&plan.rotate_in).map(|transfer| transfer.request_id));
    served.sort_unstable();
    served.dedup();
    for id in served {
        if let Some(active) = requests.get(id) {
            span.add_link_with_attributes(active.span_context().clone(), vec![KeyValue::new("request_id", id as i64)]);
        }
    }
    for (name, transfers) in [("rotate_out", &plan.rotate_out), ("rotate_in", &plan.rotate_in)] {
        for transfer in transfers {
            span.add_event(name, rotation(transfer, block_bytes));
        }
    }
    for &id in &plan.preempted_for_recompute {
        span.add_event("recompute", vec![KeyValue::new("request_id", id as i64)]);
    }
}

/// One rotation's attributes: whose KV moves, the transfer's id and its size.
fn rotation(transfer: &Transfer, block_bytes: u64) -> Vec<KeyValue> {
    let blocks = transfer.src_blocks.len() as u64;
    vec![
        KeyValue::new("request_id", transfer.request_id as i64),
        KeyValue::new("transfer_id", transfer.id as i64),
        KeyValue::new("blocks", blocks as i64),
        KeyValue::new("bytes", blocks.saturating_mul(block_bytes) as i64),
    ]
}

#[cfg(test)]
mod tests {
    use opentelemetry::trace::{SpanContext, SpanId, TraceFlags, TraceId, TraceState, TracerProvider as _};
    use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
    use superinfer_scheduler::ScheduledEntry;
    use tracing_subscriber::layer::SubscriberExt;

    use super::*;
    use crate::engine::active::ActiveRequest;
    use crate::engine::testing::greedy_request;

    fn request_span(trace: u128, span: u64) -> SpanContext {
        SpanContext::new(
            TraceId::from(trace),
            SpanId::from(span),
            TraceFlags::SAMPLED,
            true,
            TraceState::default(),
        )
    }

    /// The spans `body` ends, as the exporter sees them.
    fn exported(body: impl FnOnce()) -> Vec<SpanData> {
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder().with_simple_exporter(exporter.clone()).build();
        let subscriber =
            tracing_subscriber::registry().with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
        tracing::subscriber::with_default(subscriber, body);
        exporter.get_finished_spans().unwrap()
    }

    fn attribute(attributes: &[KeyValue], key: &str) -> Option<i64> {
        attributes.iter().find(|kv| kv.key.as_str() == key).and_then(|kv| match kv.value {
            opentelemetry::Value::I64(value) => Some(value),
            _ => None,
        })
    }

    #[test]
    fn links_the_requests_served_and_records_rotations_with_bytes() {
        let mut requests = ActiveRequests::default();
        for (id, trace) in [(1, 0xa1), (2, 0xa2), (3, 0xa3)] {
            let mut request = greedy_request(vec![1, 2, 3], 4);
            request.span_context = request_span(trace, 0xb0 + id);
            let (events, _) = tokio::sync::mpsc::unbounded_channel();
            requests.insert(id, ActiveRequest::new(request, events));
        }
        let plan = StepPlan {
            step_id: 5,
            scheduled: vec![
                ScheduledEntry { id: 1, num_computed_tokens: 0, num_new_tokens: 3, block_table: vec![0] },
                ScheduledEntry { id: 2, num_computed_tokens: 3, num_new_tokens: 1, block_table: vec![1] },
            ],
            rotate_out: vec![Transfer { id: 9, request_id: 2, src_blocks: vec![1, 4], dst_blocks: vec![0, 1] }],
            rotate_in: vec![Transfer { id: 10, request_id: 3, src_blocks: vec![7], dst_blocks: vec![5] }],
            ..StepPlan::default()
        };
        let spans = exported(|| {
            let span = tracing::info_span!("step");
            annotate_step(&span, &plan, &requests, 4096);
        });
        let [step] = spans.as_slice() else { panic!("one span expected, got {}", spans.len()) };
        // Request 2 is both computed and rotated out: one link each.
        let linked: Vec<(TraceId, SpanId)> =
            step.links.iter().map(|link| (link.span_context.trace_id(), link.span_context.span_id())).collect();
        assert_eq!(
            linked,
            [(0xa1, 0xb1), (0xa2, 0xb2), (0xa3, 0xb3)].map(|(trace, span)| (TraceId::from(trace), SpanId::from(span)))
        );
        assert_eq!(attribute(&step.links[1].attributes, "request_id"), Some(2));
        let events: Vec<_> = step.events.iter().map(|event| (event.name.as_ref(), &event.attributes)).collect();
        assert_eq!(events.len(), 2);
        assert_eq!(events[0].0, "rotate_out");
        assert_eq!(attribute(events[0].1, "request_id"), Some(2));
        assert_eq!(attribute(events[0].1, "bytes"), Some(2 * 4096));
        assert_eq!(events[1].0, "rotate_in");
        assert_eq!(attribute(events[1].1, "transfer_id"), Some(10));
        assert_eq!(attribute(events[1].1, "bytes"), Some(4096));
    }

    #[test]
    fn requests_without_a_trace_are_not_linked() {
        let mut requests = ActiveRequests::default();
        let (events, _) = tokio::sync::mpsc::unbounded_channel();
        requests.insert(1, ActiveRequest::new(greedy_request(vec![1], 1), events));
        let plan = StepPlan {
            scheduled: vec![ScheduledEntry { id: 1, num_computed_tokens: 0, num_new_tokens: 1, block_table: vec![0] }],
            ..StepPlan::default()
        };
        let spans = exported(|| annotate_step(&tracing::info_span!("step"), &plan, &requests, 4096));
        assert!(spans[0].links.is_empty());
    }
}
