//! The cloneable handle to the engine task and the per-request event stream. The engine task
//! owns all scheduling state; the handle only sends it commands, so nothing on the hot path
//! takes a lock.
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot, watch};

use super::adapters::{AdapterChange, AdapterRegistry, Reservation, Residency};
use super::admission::AdmissionGate;
use super::api::{AdapterRef, EngineError, EngineEvent, GenerationRequest};
use crate::client::ClientError;

/// What the engine task receives from handles and streams.
#[derive(Debug)]
pub(crate) enum Command {
    /// `admitted_tokens`: the prompt tokens the admission gate counts in transit until the
    /// engine's next view holds them (0 without SLO admission).
    Submit { id: u64, request: GenerationRequest, events: mpsc::UnboundedSender<EngineEvent>, admitted_tokens: u64 },
    /// The stream was dropped before its request finished.
    Cancel { id: u64 },
    /// Answered once the engine knows whether the shard is alive.
    Health { reply: oneshot::Sender<Result<(), EngineError>> },
    /// Stop admitting; answered once no request is left in the engine.
    Drain { reply: oneshot::Sender<()> },
    /// Install a LoRA adapter on the shard (`AdapterRegistry::reserve` gave the slot); answered
    /// with the shard's reply.
    LoadAdapter { id: String, source: String, slot: u64, reply: oneshot::Sender<Result<(), ClientError>> },
    /// The adapter in `slot` is served no more: refuse requests that still name it, and unload
    /// it from the shard once no request held uses it.
    RetireAdapter { slot: u64 },
}

/// Why a run-time adapter load or unload did not happen.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AdapterError {
    #[error(transparent)]
    Change(#[from] AdapterChange),
    /// The shard cannot serve it (its files, its targets, its shapes): the shard's reason.
    #[error("the lora adapter '{id}' cannot be loaded: {reason}")]
    Refused { id: String, reason: String },
    /// The shard failed, or the engine cannot reach it now.
    #[error("the lora adapter '{id}' was not loaded: {error}")]
    Engine { id: String, error: EngineError },
}

/// The engine's externally visible state, published by the engine task. The failure model
/// (docs/architecture.md): `Recovering` is transient and ends in `Running` once the shard
/// answers and has been reset; `Failed` is final and makes the process exit non-zero.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum EngineStatus {
    Running,
    /// The shard failed (the message says how); new requests are refused until it answers.
    Recovering(String),
    /// Shutting down: requests in flight finish, new ones are refused.
    Draining,
    /// The engine cannot serve again; the process is exiting.
    Failed(String),
}

impl EngineStatus {
    /// Why a new request cannot be taken now, if it cannot.
    pub(crate) fn refusal(&self) -> Option<EngineError> {
        match self {
            EngineStatus::Running => None,
            EngineStatus::Recovering(message) => Some(EngineError::Unavailable(message.clone())),
            EngineStatus::Draining => Some(EngineError::Draining),
            EngineStatus::Failed(message) => Some(EngineError::Shard(message.clone())),
        }
    }
}

/// The requests the engine holds, by where their KV is; published by the engine task after
/// every turn (a router in front balances on it: `/get_load`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EngineLoad {
    /// Requests with their KV on device.
    pub running: u32,
    /// Requests without device KV, waiting for (re)admission.
    pub waiting: u32,
    /// Requests with their KV on host (rotated out), transfers included.
    pub rotated: u32,
}

impl EngineLoad {
    /// Every request the engine holds (the three phases are disjoint).
    pub fn requests(&self) -> u32 {
        self.running + self.waiting + self.rotated
    }
}

/// Cloneable access to the engine. Cheap to clone; every clone talks to the same task.
#[derive(Clone)]
pub struct EngineHandle {
    commands: mpsc::UnboundedSender<Command>,
    status: watch::Receiver<EngineStatus>,
    load: watch::Receiver<EngineLoad>,
    next_id: Arc<AtomicU64>,
    /// `--admission slo`; None admits everything (TGI).
    admission: Option<Arc<AdmissionGate>>,
    adapters: Arc<AdapterRegistry>,
}

impl EngineHandle {
    pub(crate) fn new(
        commands: mpsc::UnboundedSender<Command>,
        status: watch::Receiver<EngineStatus>,
        load: watch::Receiver<EngineLoad>,
        admission: Option<Arc<AdmissionGate>>,
        adapters: Arc<AdapterRegistry>,
    ) -> Self {
        Self { commands, status, load, next_id: Arc::new(AtomicU64::new(1)), admission, adapters }
    }

    /// The LoRA adapters served now.
    pub fn adapters(&self) -> &AdapterRegistry {
        &self.adapters
    }

    /// Loads LoRA adapter `id` from `source` (a local directory in PEFT's format, or a hub id)
    /// while the server serves (vLLM's `/v1/load_lora_adapter`): requests may name it once this
    /// returns Ok, with the adapter (held: not evicted while the reference lives). `replace`: an
    /// adapter served under `id` is replaced (requests already running with it finish with it;
    /// vLLM's `load_inplace`). `residency`: whether `--max-loras` may evict it later. Past
    /// `--max-loras`, an idle evictable adapter is unloaded to make room (as `unload_adapter`).
    pub async fn load_adapter(&self, id: &str, source: &str, replace: bool, residency: Residency) -> Result<AdapterRef, AdapterError> {
        let engine_error = |error: EngineError| AdapterError::Engine { id: id.to_string(), error };
        if let Some(refusal) = self.status.borrow().refusal() {
            return Err(engine_error(refusal));
        }
        let Reservation { slot, evicted } = self.adapters.reserve(id, replace, residency)?;
        if let Some(evicted) = evicted {
            let _ = self.commands.send(Command::RetireAdapter { slot: evicted.namespace });
            tracing::info!(adapter_id = evicted.id, slot = evicted.namespace, max_loras = ?self.adapters.max(),
                "LoRA adapter evicted, least recently named, to make room for another");
        }
        let (reply, answer) = oneshot::channel();
        let command = Command::LoadAdapter { id: id.to_string(), source: source.to_string(), slot, reply };
        let installed = match self.commands.send(command) {
            Ok(()) => answer.await.ok(),
            Err(_) => None,
        };
        let Some(installed) = installed else {
            self.adapters.abandon(id);
            return Err(engine_error(EngineError::Stopped));
        };
        match installed {
            Ok(()) => {
                let (adapter, replaced) = self.adapters.commit(id, slot);
                if let Some(replaced) = replaced {
                    let _ = self.commands.send(Command::RetireAdapter { slot: replaced.namespace });
                }
                tracing::info!(adapter_id = id, source, slot, "LoRA adapter loaded");
                Ok(adapter)
            }
            Err(error) => {
                self.adapters.abandon(id);
                if !matches!(error, ClientError::InvalidPlan(_)) {
                    // The shard may have installed it before the failure: it goes with the slot.
                    let _ = self.commands.send(Command::RetireAdapter { slot });
                }
                Err(match error {
                    ClientError::InvalidPlan(reason) => AdapterError::Refused { id: id.to_string(), reason },
                    other => engine_error(EngineError::Shard(other.to_string())),
                })
            }
        }
    }

    /// Stops serving LoRA adapter `id` (vLLM's `/v1/unload_lora_adapter`): new requests naming
    /// it are refused at once; those running with it finish with it, and the shard frees it then.
    pub fn unload_adapter(&self, id: &str) -> Result<(), AdapterError> {
        let removed = self.adapters.remove(id)?;
        let _ = self.commands.send(Command::RetireAdapter { slot: removed.namespace });
        tracing::info!(adapter_id = id, slot = removed.namespace, "LoRA adapter unloaded");
        Ok(())
    }

    /// The requests the engine held after its last turn.
    pub fn load(&self) -> EngineLoad {
        *self.load.borrow()
    }

    /// Queues a request. The returned stream yields its events; dropping it cancels the request.
    /// With SLO admission, a request predicted to miss its first-token objective is refused
    /// here (`EngineError::SloUnreachable`).
    pub fn submit(&self, request: GenerationRequest) -> Result<RequestStream, EngineError> {
        if let Some(refusal) = self.status.borrow().refusal() {
            return Err(refusal);
        }
        let admitted_tokens = match &self.admission {
            Some(gate) => {
                let prompt = request.prompt_token_ids.len() as u64;
                gate.admit(prompt, request.priority, request.slo, request.arrival).inspect_err(|_| {
                    super::metrics::record_admission_refused(request.priority);
                })?
            }
            None => 0,
        };
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (events, receiver) = mpsc::unbounded_channel();
        self.commands
            .send(Command::Submit { id, request, events, admitted_tokens })
            .map_err(|_| EngineError::Stopped)?;
        Ok(RequestStream { id, events: receiver, commands: self.commands.clone(), done: false })
    }

    /// Ok when the engine runs and its shard answers; the shard's error otherwise.
    pub async fn health(&self) -> Result<(), EngineError> {
        if let Some(refusal) = self.status.borrow().refusal() {
            return Err(refusal);
        }
        let (reply, answer) = oneshot::channel();
        self.commands.send(Command::Health { reply }).map_err(|_| EngineError::Stopped)?;
        answer.await.map_err(|_| EngineError::Stopped)?
    }

    /// Stops admitting requests (they get `Draining`) and returns once every request in
    /// flight has ended, or at once if the engine has stopped.
    pub async fn drain(&self) {
        let (reply, answer) = oneshot::channel();
        if self.commands.send(Command::Drain { reply }).is_ok() {
            let _ = answer.await;
        }
    }

    /// Resolves when the engine can no longer serve: it gave up on the shard, or its task
    /// ended (a panic, or shutdown). The message says why; the process should exit.
    pub async fn stopped(&self) -> String {
        let mut status = self.status.clone();
        let failed = status.wait_for(|status| matches!(status, EngineStatus::Failed(_))).await;
        match failed.as_deref() {
            Ok(EngineStatus::Failed(message)) => message.clone(),
            Ok(other) => format!("{other:?}"),
            Err(_) => "the engine task ended".to_string(),
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn handle() -> (EngineHandle, mpsc::UnboundedReceiver<Command>, watch::Sender<EngineStatus>) {
        let (commands, receiver) = mpsc::unbounded_channel();
        let (status_tx, status) = watch::channel(EngineStatus::Running);
        let (_, load) = watch::channel(EngineLoad::default());
        (EngineHandle::new(commands, status, load, None, Arc::default()), receiver, status_tx)
    }

    #[tokio::test]
    async fn a_panicking_engine_task_is_seen_as_stopped() {
        let (engine, commands, status) = handle();
        let task = tokio::spawn(async move {
            let _owned = (commands, status);
            panic!("a bug in the engine");
        });
        assert!(task.await.is_err());
        let reason = tokio::time::timeout(std::time::Duration::from_secs(5), engine.stopped()).await;
        assert_eq!(reason.expect("stopped resolves"), "the engine task ended");
        assert!(matches!(engine.submit(crate::engine::testing::greedy_request(vec![1], 1)), Err(EngineError::Stopped)));
    }

    #[tokio::test]
    async fn each_status_refuses_new_requests_its_own_way() {
        let (engine, _commands, status) = handle();
        assert!(engine.submit(crate::engine::testing::greedy_request(vec![1], 1)).is_ok());
        status.send_replace(EngineStatus::Recovering("step timed out".into()));
        assert!(matches!(engine.health().await, Err(EngineError::Unavailable(_))));
        status.send_replace(EngineStatus::Draining);
        assert!(matches!(engine.submit(crate::engine::testing::greedy_request(vec![1], 1)), Err(EngineError::Draining)));
        status.send_replace(EngineStatus::Failed("gave up".into()));
        assert!(matches!(engine.health().await, Err(EngineError::Shard(_))));
        assert_eq!(engine.stopped().await, "gave up");
    }
}
