//! The per-step transfer budget: under RotaSched each direction may move what its bandwidth
//! carries while the step computes, so rotation hides behind compute instead of stalling it;
//! the reactive policies plan with an unlimited one. On a
//! full-duplex link the directions are budgeted separately; otherwise they share the step's
//! time.

use crate::cost_model::{CostModel, Direction};

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ByteBudget {
    duplex: bool,
    limit_out: u64,
    limit_in: u64,
    used_out: u64,
    used_in: u64,
}

impl ByteBudget {
    /// No limit: the reactive policies move what they must.
    pub(crate) fn unlimited() -> Self {
        ByteBudget { duplex: true, limit_out: u64::MAX, limit_in: u64::MAX, used_out: 0, used_in: 0 }
    }

    /// Whether the step's transfers are limited (reported with the plan).
    pub(crate) fn is_limited(&self) -> bool {
        self.limit_out != u64::MAX || self.limit_in != u64::MAX
    }

    pub(crate) fn new(cost: &CostModel, step_s: f64) -> Self {
        ByteBudget {
            duplex: cost.duplex,
            limit_out: cost.byte_budget(step_s, Direction::Out),
            limit_in: cost.byte_budget(step_s, Direction::In),
            used_out: 0,
            used_in: 0,
        }
    }

    pub(crate) fn limit(&self, direction: Direction) -> u64 {
        match direction {
            Direction::Out => self.limit_out,
            Direction::In => self.limit_in,
        }
    }

    pub(crate) fn used(&self, direction: Direction) -> u64 {
        match direction {
            Direction::Out => self.used_out,
            Direction::In => self.used_in,
        }
    }

    /// Fraction of the step's transfer time already spent (half-duplex: both directions).
    fn shared_fraction(&self) -> f64 {
        let frac = |used: u64, limit: u64| if limit == 0 { 1.0 } else { used as f64 / limit as f64 };
        frac(self.used_out, self.limit_out) + frac(self.used_in, self.limit_in)
    }

    pub(crate) fn fits(&self, direction: Direction, bytes: u64) -> bool {
        let limit = self.limit(direction);
        if self.used(direction).saturating_add(bytes) > limit {
            return false;
        }
        if self.duplex {
            return true;
        }
        let extra = if limit == 0 { 1.0 } else { bytes as f64 / limit as f64 };
        self.shared_fraction() + extra <= 1.0 + 1e-9
    }

    pub(crate) fn take(&mut self, direction: Direction, bytes: u64) {
        match direction {
            Direction::Out => self.used_out = self.used_out.saturating_add(bytes),
            Direction::In => self.used_in = self.used_in.saturating_add(bytes),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(duplex: bool) -> CostModel {
        CostModel {
            swap_out_bytes_per_s: 1000.0,
            swap_in_bytes_per_s: 1000.0,
            transfer_overhead_s: 0.0,
            duplex,
            ..CostModel::default()
        }
    }

    #[test]
    fn duplex_budgets_directions_separately() {
        let mut budget = ByteBudget::new(&model(true), 1.0);
        assert!(budget.fits(Direction::Out, 1000));
        budget.take(Direction::Out, 1000);
        assert!(!budget.fits(Direction::Out, 1));
        assert!(budget.fits(Direction::In, 1000));
    }

    #[test]
    fn half_duplex_shares_the_step() {
        let mut budget = ByteBudget::new(&model(false), 1.0);
        budget.take(Direction::Out, 600);
        assert!(!budget.fits(Direction::In, 500));
        assert!(budget.fits(Direction::In, 400));
    }
}
