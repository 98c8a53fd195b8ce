//! The simulated transfer link: transfers in one direction run one after another; the two
//! directions run side by side when the link is duplex and share one queue when it is not.
//! Owns the transfers in flight until the loop reports them complete to the scheduler.

use crate::cost_model::Direction;
use crate::plan::Transfer;
use crate::sim::timing::LinkModel;

pub struct Link {
    model: LinkModel,
    block_bytes: u64,
    /// When each queue is next free: [out, in]; both entries move together when not duplex.
    free_at: [f64; 2],
    /// (finish time, transfer id), in issue order.
    in_flight: Vec<(f64, u64)>,
    pub bytes_out: u64,
    pub bytes_in: u64,
}

impl Link {
    pub fn new(model: LinkModel, block_bytes: u64) -> Self {
        Link {
            model,
            block_bytes,
            free_at: [0.0; 2],
            in_flight: Vec::new(),
            bytes_out: 0,
            bytes_in: 0,
        }
    }

    /// How long the link takes to carry `transfer` alone.
    pub fn seconds(&self, transfer: &Transfer, direction: Direction) -> f64 {
        let bytes = self.block_bytes * transfer.src_blocks.len() as u64;
        let bandwidth = match direction {
            Direction::Out => self.model.out_bytes_per_s,
            Direction::In => self.model.in_bytes_per_s,
        };
        self.model.overhead_s + bytes as f64 / bandwidth
    }

    /// Queues a transfer issued at `now` (the start of the step that carries it); returns when
    /// it finishes.
    pub fn issue(&mut self, transfer: &Transfer, direction: Direction, now: f64) -> f64 {
        let bytes = self.block_bytes * transfer.src_blocks.len() as u64;
        let queue = match direction {
            Direction::Out => 0,
            Direction::In => 1,
        };
        let start = now.max(self.free_at[queue]);
        let finish = start + self.seconds(transfer, direction);
        if self.model.duplex {
            self.free_at[queue] = finish;
        } else {
            self.free_at = [finish; 2];
        }
        match direction {
            Direction::Out => self.bytes_out += bytes,
            Direction::In => self.bytes_in += bytes,
        }
        self.in_flight.push((finish, transfer.id));
        finish
    }

    /// Ids of the transfers finished by `time`, removed from flight, in issue order.
    pub fn take_completed(&mut self, time: f64) -> Vec<u64> {
        let mut done = Vec::new();
        self.in_flight.retain(|&(finish, id)| {
            if finish <= time {
                done.push(id);
                false
            } else {
                true
            }
        });
        done
    }

    /// When the next transfer in flight finishes.
    pub fn next_completion(&self) -> Option<f64> {
        self.in_flight
            .iter()
            .map(|&(finish, _)| finish)
            .min_by(f64::total_cmp)
    }

    #[cfg(test)]
    pub fn is_idle(&self) -> bool {
        self.in_flight.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn transfer(id: u64, blocks: u32) -> Transfer {
        Transfer {
            id,
            request_id: id,
            src_blocks: (0..blocks).collect(),
            dst_blocks: (0..blocks).collect(),
        }
    }

    fn model(duplex: bool) -> LinkModel {
        LinkModel {
            out_bytes_per_s: 100.0,
            in_bytes_per_s: 50.0,
            overhead_s: 0.0,
            duplex,
        }
    }

    #[test]
    fn duplex_directions_overlap_and_simplex_ones_queue() {
        let mut link = Link::new(model(true), 100);
        link.issue(&transfer(1, 1), Direction::Out, 0.0); // 1 s
        link.issue(&transfer(2, 1), Direction::In, 0.0); // 2 s, in parallel
        assert_eq!(link.take_completed(1.0), vec![1]);
        assert_eq!(link.next_completion(), Some(2.0));
        let mut simplex = Link::new(model(false), 100);
        simplex.issue(&transfer(1, 1), Direction::Out, 0.0);
        simplex.issue(&transfer(2, 1), Direction::In, 0.0); // waits for the first: ends at 3 s
        assert_eq!(simplex.take_completed(2.9), vec![1]);
        assert_eq!(simplex.take_completed(3.0), vec![2]);
        assert!(simplex.is_idle());
        assert_eq!(simplex.bytes_out + simplex.bytes_in, 200);
    }
}
