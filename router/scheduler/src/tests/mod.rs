//! Scenario and property tests of the whole scheduler, driven through a fake shard that checks
//! the ordering rules of `proto/shard.proto` on every plan.

mod ahead;
pub(crate) mod driver;
mod kv_events;
mod machine;
mod policies;
mod properties;
mod rotasched;
