//! SuperInfer's router: everything about requests. Module map:
//! - `pb`: the generated shard protocol (`proto/shard.proto`).
//! - `python`: the pyo3 shim that the `superinfer` package calls.

pub mod pb {
    tonic::include_proto!("superinfer.shard.v1");
}

mod python;
