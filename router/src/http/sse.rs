//! Server-sent events: a producer task writes events into a bounded channel that the response
//! body drains. The task notices a closed connection (`EventSender::closed`) and returns,
//! dropping its engine stream, which cancels the request in the engine.
use std::convert::Infallible;
use std::future::Future;

use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;

/// Events in flight between the producer and the connection; small so that a slow client
/// applies back-pressure instead of buffering a whole generation.
const EVENT_BUFFER: usize = 32;

pub(crate) struct EventSender {
    events: mpsc::Sender<Event>,
}

impl EventSender {
    /// Sends `data:<json>`; false when the client has gone.
    pub async fn send_json<T: Serialize>(&self, value: &T) -> bool {
        match Event::default().json_data(value) {
            Ok(event) => self.events.send(event).await.is_ok(),
            Err(error) => {
                tracing::error!(%error, "an event could not be serialized");
                false
            }
        }
    }

    /// Sends `data:<text>` verbatim (the OpenAI routes' `[DONE]`).
    pub async fn send_text(&self, text: &str) -> bool {
        self.events.send(Event::default().data(text)).await.is_ok()
    }

    /// Resolves when the client has closed the connection.
    pub async fn closed(&self) {
        self.events.closed().await
    }
}

/// Starts `produce` on its own task and answers with the events it sends (status 200).
pub(crate) fn sse_response<F, Fut>(headers: HeaderMap, produce: F) -> Response
where
    F: FnOnce(EventSender) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let (events, receiver) = mpsc::channel(EVENT_BUFFER);
    tokio::spawn(produce(EventSender { events }));
    let stream = ReceiverStream::new(receiver).map(Ok::<Event, Infallible>);
    (headers, Sse::new(stream).keep_alive(KeepAlive::default())).into_response()
}
