//! The one gRPC client of the shard (`proto/shard.proto`), over a unix socket. It maps gRPC
//! statuses to `ClientError` once, so the engine reasons about failures, not status codes, and
//! sends the calling span's trace context (`traceparent`) with Step, Health and Reset, so the
//! shard's spans join the router's trace.
use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};
use tonic::{Code, Status};
use tower::service_fn;

use crate::pb;
use crate::pb::shard_client::ShardClient as GrpcClient;
use crate::trace_context;

/// `Info` carries the whole `tokenizer.json`, which can exceed tonic's 4 MiB default.
const MAX_MESSAGE_BYTES: usize = 256 * 1024 * 1024;
/// Pause between connection attempts while the shard starts.
const CONNECT_RETRY: Duration = Duration::from_millis(200);
/// A liveness probe that takes longer than this counts as a failure.
const HEALTH_TIMEOUT: Duration = Duration::from_secs(10);
/// A Reset waits behind a Step the shard may still be running; longer than this is a failure.
const RESET_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, thiserror::Error, PartialEq)]
pub enum ClientError {
    #[error("cannot reach the shard at {path}: {message}")]
    Connect { path: PathBuf, message: String },
    #[error("the shard is unavailable: {0}")]
    Unavailable(String),
    /// The shard validated the plan and refused it whole; its state is unchanged.
    #[error("the shard rejected the step plan: {0}")]
    InvalidPlan(String),
    #[error("the shard did not answer within {0:?}")]
    Timeout(Duration),
    #[error("shard error ({code}): {message}")]
    Shard { code: String, message: String },
    /// The shard has lost its warm-up state (FAILED_PRECONDITION): it cannot serve again.
    #[error("the shard is not in a state to serve: {0}")]
    Precondition(String),
}

impl ClientError {
    /// Whether waiting and asking again can help. A shard that lost its warm-up (or that we
    /// never reached) cannot come back by itself.
    pub fn is_transient(&self) -> bool {
        !matches!(self, ClientError::Precondition(_) | ClientError::Connect { .. })
    }
}

impl From<Status> for ClientError {
    fn from(status: Status) -> Self {
        let message = status.message().to_string();
        match status.code() {
            Code::Unavailable | Code::Cancelled => ClientError::Unavailable(message),
            Code::InvalidArgument => ClientError::InvalidPlan(message),
            Code::DeadlineExceeded => ClientError::Timeout(Duration::ZERO),
            Code::FailedPrecondition => ClientError::Precondition(message),
            code => ClientError::Shard { code: format!("{code:?}"), message },
        }
    }
}

/// Cheap to clone: clones share one HTTP/2 connection.
#[derive(Debug, Clone)]
pub struct ShardClient {
    inner: GrpcClient<Channel>,
}

impl ShardClient {
    /// Connects to the shard's socket and waits until its `Health` answers, retrying until
    /// `timeout` (the shard may still be loading its model).
    pub async fn connect_uds(path: &Path, timeout: Duration) -> Result<Self, ClientError> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let attempt = async {
                let mut client = Self::connect_once(path).await?;
                client.health().await?;
                Ok::<_, ClientError>(client)
            };
            match attempt.await {
                Ok(client) => return Ok(client),
                Err(error) if tokio::time::Instant::now() + CONNECT_RETRY < deadline => {
                    tracing::debug!(%error, "shard not ready yet");
                    tokio::time::sleep(CONNECT_RETRY).await;
                }
                Err(error) => {
                    return Err(ClientError::Connect {
                        path: path.to_path_buf(),
                        message: error.to_string(),
                    })
                }
            }
        }
    }

    async fn connect_once(path: &Path) -> Result<Self, ClientError> {
        let socket = path.to_path_buf();
        // The URI is required by the API but unused: the connector dials the socket.
        let channel = Endpoint::from_static("http://[::]:0")
            .connect_with_connector(service_fn(move |_: Uri| {
                let socket = socket.clone();
                async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(socket).await?)) }
            }))
            .await
            .map_err(|error| ClientError::Connect { path: path.to_path_buf(), message: error.to_string() })?;
        let inner = GrpcClient::new(channel)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES);
        Ok(Self { inner })
    }

    pub async fn info(&mut self) -> Result<pb::InfoResponse, ClientError> {
        Ok(self.inner.info(pb::InfoRequest {}).await?.into_inner())
    }

    /// Ok when the shard ran a tiny operation on its device within `HEALTH_TIMEOUT`.
    pub async fn health(&mut self) -> Result<(), ClientError> {
        match tokio::time::timeout(HEALTH_TIMEOUT, self.inner.health(traced(pb::HealthRequest {}))).await {
            Ok(reply) => reply.map(|_| ()).map_err(ClientError::from),
            Err(_) => Err(ClientError::Timeout(HEALTH_TIMEOUT)),
        }
    }

    pub async fn warmup(
        &mut self,
        max_batch_tokens: u32,
        max_batch_requests: u32,
    ) -> Result<pb::WarmupResponse, ClientError> {
        let request = pb::WarmupRequest { max_batch_tokens, max_batch_requests };
        Ok(self.inner.warmup(request).await?.into_inner())
    }

    /// Runs one step; a reply later than `deadline` is a `Timeout` (the call is abandoned; the
    /// shard may still finish it, which is why recovery sends `Reset` before serving again).
    pub async fn step(&mut self, request: pb::StepRequest, deadline: Duration) -> Result<pb::StepResponse, ClientError> {
        match tokio::time::timeout(deadline, self.inner.step(traced(request))).await {
            Ok(reply) => Ok(reply?.into_inner()),
            Err(_) => Err(ClientError::Timeout(deadline)),
        }
    }

    /// Drops every request on the shard once its current work is done (see `Reset`).
    #[tracing::instrument(name = "shard_reset", skip_all)]
    pub async fn reset(&mut self) -> Result<pb::ResetResponse, ClientError> {
        match tokio::time::timeout(RESET_TIMEOUT, self.inner.reset(traced(pb::ResetRequest {}))).await {
            Ok(reply) => Ok(reply?.into_inner()),
            Err(_) => Err(ClientError::Timeout(RESET_TIMEOUT)),
        }
    }

    /// Reads adapter `adapter_id` from `source` and installs it in `slot`, between steps. A
    /// refusal (an adapter that cannot be served) is `InvalidPlan` with the shard's reason. No
    /// deadline: reading an adapter (downloading it) takes what it takes, and steps go on meanwhile.
    #[tracing::instrument(name = "shard_load_adapter", skip_all, fields(adapter_id, slot))]
    pub async fn load_adapter(&mut self, adapter_id: &str, source: &str, slot: u64) -> Result<(), ClientError> {
        let request = pb::LoadAdapterRequest { adapter_id: adapter_id.to_string(), source: source.to_string(), slot };
        self.inner.load_adapter(traced(request)).await?;
        Ok(())
    }

    /// Removes the adapter in `slot`, between steps.
    #[tracing::instrument(name = "shard_unload_adapter", skip_all, fields(slot))]
    pub async fn unload_adapter(&mut self, slot: u64) -> Result<(), ClientError> {
        match tokio::time::timeout(RESET_TIMEOUT, self.inner.unload_adapter(traced(pb::UnloadAdapterRequest { slot }))).await {
            Ok(reply) => reply.map(|_| ()).map_err(ClientError::from),
            Err(_) => Err(ClientError::Timeout(RESET_TIMEOUT)),
        }
    }
}

/// `message` with the current span's trace context in its metadata (nothing when traces are
/// off or no span is current).
fn traced<T>(message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    trace_context::inject(&tracing::Span::current(), request.metadata_mut());
    request
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_statuses() {
        assert_eq!(
            ClientError::from(Status::invalid_argument("block 7 is free")),
            ClientError::InvalidPlan("block 7 is free".into())
        );
        assert_eq!(
            ClientError::from(Status::unavailable("socket closed")),
            ClientError::Unavailable("socket closed".into())
        );
        assert!(matches!(
            ClientError::from(Status::internal("CUDA error")),
            ClientError::Shard { code, message } if code == "Internal" && message == "CUDA error"
        ));
    }

    #[tokio::test]
    async fn connect_fails_with_the_socket_path_when_nothing_listens() {
        let dir = std::env::temp_dir().join(format!("superinfer-client-test-{}", std::process::id()));
        let path = dir.join("missing.sock");
        let error = ShardClient::connect_uds(&path, Duration::from_millis(300)).await.unwrap_err();
        match error {
            ClientError::Connect { path: reported, .. } => assert_eq!(reported, path),
            other => panic!("unexpected error {other}"),
        }
    }
}
