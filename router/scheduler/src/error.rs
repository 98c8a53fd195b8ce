//! The scheduler layer's one error type. The router maps it to HTTP status in one place.

use thiserror::Error;

#[derive(Debug, Clone, PartialEq, Error)]
pub enum SchedulerError {
    /// The configuration cannot drive a scheduler (zero-sized pools, zero budgets...).
    #[error("invalid scheduler configuration: {0}")]
    InvalidConfig(String),
    /// The request is malformed (empty prompt, zero max_new_tokens).
    #[error("invalid request {id}: {reason}")]
    InvalidRequest { id: u64, reason: String },
    /// The request needs more KV blocks than the whole device pool, so it could never run.
    #[error(
        "request {id} needs {needed_blocks} KV blocks ({tokens} tokens) but the device pool \
         holds only {device_blocks}"
    )]
    TooLarge { id: u64, tokens: u64, needed_blocks: u64, device_blocks: u32 },
    /// A request with this id is already known to the scheduler.
    #[error("request id {0} is already in use")]
    DuplicateId(u64),
    /// An unknown policy name was given (expected fcfs, recompute, swap or rotasched).
    #[error("unknown scheduling policy {0:?} (expected fcfs, recompute, swap or rotasched)")]
    UnknownPolicy(String),
}
