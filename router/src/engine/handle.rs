//! The cloneable handle to the engine task and the per-request event stream. The engine task
//! owns all scheduling state; the handle only sends it commands, so nothing on the hot path
//! takes a lock.
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot, watch};

use super::api::{EngineError, EngineEvent, GenerationRequest};

/// What the engine task receives from handles and streams.
#[derive(Debug)]
pub(crate) enum Command {
    Submit { id: u64, request: GenerationRequest, events: mpsc::UnboundedSender<EngineEvent> },
    /// The stream was dropped before its request finished.
    Cancel { id: u64 },
    /// Answered once the engine knows whether the shard is alive.
    Health { reply: oneshot::Sender<Result<(), EngineError>> },
}

/// The engine's externally visible state, published by the engine task.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum EngineStatus {
    Running,
    /// The shard failed; every later request fails with this message.
    Failed(String),
}

/// Cloneable access to the engine. Cheap to clone; every clone talks to the same task.
#[derive(Clone)]
pub struct EngineHandle {
    commands: mpsc::UnboundedSender<Command>,
    status: watch::Receiver<EngineStatus>,
    next_id: Arc<AtomicU64>,
}

impl EngineHandle {
    pub(crate) fn new(
        commands: mpsc::UnboundedSender<Command>,
        status: watch::Receiver<EngineStatus>,
    ) -> Self {
        Self { commands, status, next_id: Arc::new(AtomicU64::new(1)) }
    }

    /// Queues a request. The returned stream yields its events; dropping it cancels the request.
    pub fn submit(&self, request: GenerationRequest) -> Result<RequestStream, EngineError> {
        if let EngineStatus::Failed(message) = &*self.status.borrow() {
            return Err(EngineError::Shard(message.clone()));
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (events, receiver) = mpsc::unbounded_channel();
        self.commands
            .send(Command::Submit { id, request, events })
            .map_err(|_| EngineError::Stopped)?;
        Ok(RequestStream { id, events: receiver, commands: self.commands.clone(), done: false })
    }

    /// Ok when the engine runs and its shard answers; the shard's error otherwise.
    pub async fn health(&self) -> Result<(), EngineError> {
        if let EngineStatus::Failed(message) = &*self.status.borrow() {
            return Err(EngineError::Shard(message.clone()));
        }
        let (reply, answer) = oneshot::channel();
        self.commands.send(Command::Health { reply }).map_err(|_| EngineError::Stopped)?;
        answer.await.map_err(|_| EngineError::Stopped)?
    }
}

/// The events of one request, in order, ending with `Finished` or `Failed`.
/// Dropping the stream before that cancels the request; the engine frees its KV blocks before
/// its next step.
pub struct RequestStream {
    id: u64,
    events: mpsc::UnboundedReceiver<EngineEvent>,
    commands: mpsc::UnboundedSender<Command>,
    done: bool,
}

impl RequestStream {
    /// The engine's id for this request (for logs and traces).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The next event; `None` after the final one.
    pub async fn recv(&mut self) -> Option<EngineEvent> {
        if self.done {
            return None;
        }
        let event = self.events.recv().await;
        match &event {
            Some(EngineEvent::Finished { .. }) | Some(EngineEvent::Failed(_)) | None => self.done = true,
            _ => {}
        }
        event
    }
}

impl Drop for RequestStream {
    fn drop(&mut self) {
        if !self.done {
            // The engine may already have stopped; then there is nothing left to free.
            let _ = self.commands.send(Command::Cancel { id: self.id });
        }
    }
}
