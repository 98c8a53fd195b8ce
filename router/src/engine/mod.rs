//! The engine: owns the scheduler and the shard client, and runs the step loop.
//! - `api`: request-level types shared with the HTTP layer.
//! - `handle`: `EngineHandle` (cloneable commands) and `RequestStream` (events; drop cancels).
//! - `model_info`: what the shard told us about the model and its KV pools.
pub mod api;
mod handle;
mod model_info;

pub use handle::{EngineHandle, RequestStream};
pub(crate) use handle::{Command, EngineStatus};
pub use model_info::ModelInfo;
