//! The step-time cap: a step may not outlast the earliest next-token deadline of the running
//! decodes with no late gap left to spend, nor the stall deadline of those with one (of the
//! prompt's class or a higher one: a lower class's decodes never slow a higher class's first
//! token), so prefill chunks are cut to fit — with room for the step's overhead and for its
//! time straying from the prediction (`StepTiming`).

use super::urgency::Urgency;
use super::Planner;
use crate::cost_model::StepShape;
use crate::step::StepCtx;

/// The running decodes' side of the step-time cap.
pub(super) struct DecodeDeadline {
    /// Next-token deadlines of the decodes that cannot spend a late gap: (priority class,
    /// deadline).
    binding: Vec<(i32, f64)>,
    /// Every running decode: (id, positions it attends this step).
    decodes: Vec<(u64, u64)>,
}

impl DecodeDeadline {
    /// The earliest deadline a prompt of class `priority` must leave the step room for: its own
    /// class's and the higher classes' (a lower class's decodes do not slow a higher class's
    /// first token).
    fn at(&self, priority: i32) -> Option<f64> {
        self.binding.iter().filter(|(class, _)| *class <= priority).map(|(_, at)| *at).reduce(f64::min)
    }

    /// The step of the given decodes alone.
    fn shape<'a>(decodes: impl Iterator<Item = &'a (u64, u64)>) -> StepShape {
        decodes.fold(StepShape::default(), |mut shape, (_, context)| {
            shape.decode_requests += 1;
            shape.context_tokens += context;
            shape
        })
    }
}

impl Planner<'_, '_> {
    /// Deadlines of the step, by class: the next-token deadlines of the running decodes that
    /// cannot spend a late gap, and the stall deadlines of those that can and still meet their
    /// objectives (None when no decode binds, or nothing decodes).
    pub(super) fn decode_deadline(&self, order: &[Urgency], now: f64) -> Option<DecodeDeadline> {
        let decodes_alone_s = self.cost().predict_step(self.decodes_alone);
        let mut binding = Vec::new();
        let mut decodes = Vec::new();
        for urgency in order.iter().filter(|u| self.is_running_decode(u.id)) {
            let r = &self.requests()[&urgency.id];
            decodes.push((urgency.id, u64::from(r.num_computed) + 1));
            // A decode with a late gap to spend may take one late gap, but none past its stall
            // bound: a long prefill step beside it would break that bound for every decode. Not
            // once its objectives are lost (`objectives_lost`) or the bound is, even to a step of
            // decodes alone: cutting the prompt would cost it time for nothing (and, under
            // sustained overload, throughput: more, shorter steps).
            let at = if r.late_gaps_left(self.config().tbt_late_share()) == 0 {
                Some(r.next_deadline())
            } else {
                r.stall_deadline().filter(|at| *at > now + decodes_alone_s && !r.objectives_lost)
            };
            if let Some(at) = at {
                binding.push((r.priority, at));
            }
        }
        (!binding.is_empty()).then_some(DecodeDeadline { binding, decodes })
    }

    /// Prefill tokens the next chunk of `urgency` may take so that the step, with every
    /// running decode and the chunks placed so far, ends by the earliest deadline of the decodes
    /// of its class or a higher one. No cap when none of those is binding, or for a punctual
    /// request that would miss its first-token deadline by waiting out one more step of decodes
    /// alone.
    pub(super) fn prefill_token_cap(&self, ctx: &StepCtx, urgency: &Urgency, deadline: Option<&DecodeDeadline>) -> u32 {
        let Some(deadline) = deadline else { return u32::MAX };
        let Some(at) = deadline.at(urgency.priority) else { return u32::MAX };
        let decodes_alone = DecodeDeadline::shape(deadline.decodes.iter());
        if !urgency.late && urgency.slack < self.cost().predict_step(decodes_alone) {
            return u32::MAX;
        }
        // What is placed so far, plus the decodes still to be placed.
        let unplaced = DecodeDeadline::shape(deadline.decodes.iter().filter(|(id, _)| !ctx.scheduled.contains(id)));
        let committed = StepShape {
            prefill_tokens: ctx.shape.prefill_tokens,
            decode_requests: ctx.shape.decode_requests + unplaced.decode_requests,
            context_tokens: ctx.shape.context_tokens + unplaced.context_tokens,
        };
        let computed = u64::from(self.requests()[&urgency.id].num_computed);
        // The step's results must reach the decodes by their deadline: its overhead and a
        // margin for a mixed step running long come off the time left (`StepTiming`).
        let within = self.timing.mixed_step_within(ctx.now, at, self.cost().correction);
        self.cost().prefill_tokens_within(committed, computed, within)
    }
}
