//! The publisher task: owns the PUB socket, the replay buffer and the ROUTER socket that serves
//! it, as vLLM's `ZmqEventPublisher` does. The engine hands it each turn's events through a
//! `KvEventSink` and never waits on it.
//!
//! Messages are `[topic, seq, payload]`, `seq` an 8-byte big-endian signed counter from 0 per
//! process: a subscriber that sees a gap (it joined late, or the PUB socket dropped for it)
//! asks the ROUTER socket with `[b"", start_seq]` and is answered `[b"", topic, seq, payload]`
//! for every buffered batch from `start_seq` on, then `[b"", b"", -1, b""]`.
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use superinfer_scheduler::KvCacheEvent;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use zeromq::{PubSocket, RouterSocket, Socket, SocketRecv, SocketSend, ZmqError, ZmqMessage};

use super::config::{bind_address, KvEventsConfig};
use crate::engine::AdapterRegistry;
use super::wire::Encoder;

/// The sequence number that ends a replay.
const END_OF_REPLAY: i64 = -1;

#[derive(Debug, thiserror::Error)]
pub enum KvEventsError {
    #[error("KV events: cannot bind {endpoint}: {source}")]
    Bind { endpoint: String, source: ZmqError },
}

/// The engine's end: each turn's events, in order. Cloneable; sending never waits.
#[derive(Debug, Clone)]
pub struct KvEventSink {
    events: mpsc::UnboundedSender<Vec<KvCacheEvent>>,
}

impl KvEventSink {
    /// Queues a turn's events. The queue is unbounded on purpose: a dropped event would leave
    /// every subscriber's index wrong with no gap to notice. If the publisher has stopped
    /// (shutdown), there is no one left to tell.
    pub fn publish(&self, events: Vec<KvCacheEvent>) {
        let _ = self.events.send(events);
    }
}

/// Binds the sockets (errors surface at start-up) and starts the publisher on `tracker`; it
/// stops when `shutdown` is cancelled or every sink is dropped.
pub async fn start_publisher(
    config: &KvEventsConfig,
    block_size: u32,
    adapters: Arc<AdapterRegistry>,
    tracker: &TaskTracker,
    shutdown: CancellationToken,
) -> Result<KvEventSink, KvEventsError> {
    let mut live = PubSocket::new();
    bind(&mut live, &config.endpoint).await?;
    let replay = match &config.replay_endpoint {
        Some(endpoint) => {
            let mut socket = RouterSocket::new();
            bind(&mut socket, endpoint).await?;
            Some(socket)
        }
        None => None,
    };
    let (events, queue) = mpsc::unbounded_channel();
    let publisher = Publisher {
        encoder: Encoder { block_size, adapters },
        topic: Bytes::from(config.topic.clone().into_bytes()),
        next_seq: 0,
        buffer: VecDeque::new(),
        buffer_steps: config.buffer_steps,
        live,
    };
    tracing::info!(endpoint = %config.endpoint, replay = ?config.replay_endpoint, topic = %config.topic,
        "publishing KV-cache events");
    tracker.spawn(publisher.run(queue, replay, shutdown));
    Ok(KvEventSink { events })
}

async fn bind<S: Socket>(socket: &mut S, endpoint: &str) -> Result<(), KvEventsError> {
    socket
        .bind(&bind_address(endpoint))
        .await
        .map(|_| ())
        .map_err(|source| KvEventsError::Bind { endpoint: endpoint.to_string(), source })
}

struct Publisher {
    encoder: Encoder,
    topic: Bytes,
    next_seq: i64,
    /// The latest `buffer_steps` batches, `(seq, payload)`, oldest first.
    buffer: VecDeque<(i64, Bytes)>,
    buffer_steps: usize,
    live: PubSocket,
}

impl Publisher {
    async fn run(
        mut self,
        mut queue: mpsc::UnboundedReceiver<Vec<KvCacheEvent>>,
        mut replay: Option<RouterSocket>,
        shutdown: CancellationToken,
    ) {
        loop {
            tokio::select! {
                events = queue.recv() => match events {
                    Some(events) => self.publish(&events).await,
                    None => break,
                },
                request = recv(&mut replay) => match request {
                    Ok(request) => {
                        if let Some(socket) = replay.as_mut() {
                            self.answer_replay(socket, request).await;
                        }
                    }
                    // A peer's broken connection; the socket keeps serving the others.
                    Err(error) => tracing::debug!(%error, "KV events replay socket"),
                },
                _ = shutdown.cancelled() => break,
            }
        }
    }

    async fn publish(&mut self, events: &[KvCacheEvent]) {
        let ts = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |since| since.as_secs_f64());
        let payloads = match self.encoder.batches(events, ts) {
            Ok(payloads) => payloads,
            // Plain structs of numbers and strings always encode; were one not to, its
            // sequence numbers are never taken, so subscribers see no gap and no wrong batch.
            Err(error) => {
                tracing::error!(%error, "KV events: a batch did not encode");
                return;
            }
        };
        for payload in payloads {
            let seq = self.next_seq;
            self.next_seq += 1;
            let payload = Bytes::from(payload);
            let message = frames(vec![self.topic.clone(), seq_frame(seq), payload.clone()]);
            if let Err(error) = self.live.send(message).await {
                // Subscribers see the gap and replay the batch from the buffer.
                tracing::warn!(%error, seq, "KV events: a batch was not published");
            }
            if self.buffer.len() == self.buffer_steps {
                self.buffer.pop_front();
            }
            if self.buffer_steps > 0 {
                self.buffer.push_back((seq, payload));
            }
        }
    }

    /// `[peer, b"", start_seq]` → every buffered batch from `start_seq`, then the end marker.
    async fn answer_replay(&self, socket: &mut RouterSocket, request: ZmqMessage) {
        let request = request.into_vec();
        let [peer, _, start] = request.as_slice() else {
            tracing::debug!(frames = request.len(), "KV events: malformed replay request");
            return;
        };
        let Ok(start) = <[u8; 8]>::try_from(start.as_ref()).map(i64::from_be_bytes) else {
            tracing::debug!("KV events: malformed replay start");
            return;
        };
        let empty = Bytes::new();
        let replayed = self.buffer.iter().filter(|(seq, _)| *seq >= start);
        let answers = replayed
            .map(|(seq, payload)| vec![peer.clone(), empty.clone(), self.topic.clone(), seq_frame(*seq), payload.clone()])
            .chain(std::iter::once(vec![peer.clone(), empty.clone(), empty.clone(), seq_frame(END_OF_REPLAY), empty.clone()]));
        for answer in answers {
            if let Err(error) = socket.send(frames(answer)).await {
                tracing::debug!(%error, "KV events: replay answer not delivered");
                return;
            }
        }
    }
}

/// The next replay request, or never when there is no replay socket.
async fn recv(socket: &mut Option<RouterSocket>) -> Result<ZmqMessage, ZmqError> {
    match socket {
        Some(socket) => socket.recv().await,
        None => std::future::pending().await,
    }
}

fn seq_frame(seq: i64) -> Bytes {
    Bytes::copy_from_slice(&seq.to_be_bytes())
}

fn frames(frames: Vec<Bytes>) -> ZmqMessage {
    // Never empty: every caller builds at least three frames.
    ZmqMessage::try_from(frames).unwrap_or_else(|_| ZmqMessage::from(Bytes::new()))
}
