//! The engine: owns the scheduler and the shard client, and runs the step loop.
pub mod api;
