//! SuperInfer's router: everything about requests. Module map:
//! - `pb`: the generated shard protocol (`proto/shard.proto`).
//! - `engine`: the step loop that drives the scheduler and the shard; `engine::api` is the
//!   request-level interface the HTTP layer uses.
//! - `python`: the pyo3 shim that the `superinfer` package calls.

pub mod pb {
    tonic::include_proto!("superinfer.shard.v1");
}

pub mod engine;
mod python;
