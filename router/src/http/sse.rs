//! Server-sent events: a producer task writes events into a bounded channel that the response
//! body drains. The task notices a closed connection (`EventSender::closed`) and returns,
//! dropping its engine stream, which cancels the request in the engine.
//!
//! The response's head waits until the stream opens: its first event, or the producer's
//! `open` once the engine took the request. A refusal before that (the concurrency limit, SLO
//! admission, a draining or recovering engine) answers with its own status (429 or 503, with
//! `Retry-After` when known) instead of 200 and an error event, so a client or a router in
//! front can retry it elsewhere. Other errors stay events of a 200 stream on TGI's routes, as TGI
//! sends them; OpenAI's routes (`ErrorsBeforeOpen::Answered`) answer any error met before the
//! stream opens with its status (a 422 for a bad request), as OpenAI and vLLM do, so a client
//! library raises its error for that status when the request is made.
use std::convert::Infallible;
use std::future::Future;
use std::sync::Mutex;

use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;

use crate::error::HttpError;

/// Events in flight between the producer and the connection; small so that a slow client
/// applies back-pressure instead of buffering a whole generation.
const EVENT_BUFFER: usize = 32;

/// What an error met before the stream opens gets: its own status for refusals only (TGI's
/// streams), or for every error (OpenAI's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ErrorsBeforeOpen {
    RefusalsAnswered,
    Answered,
}

pub(crate) struct EventSender {
    events: mpsc::Sender<Event>,
    errors_before_open: ErrorsBeforeOpen,
    /// Until the stream opens: the head of the response, `None` for the stream's own.
    opening: Mutex<Option<oneshot::Sender<Option<Response>>>>,
}

impl EventSender {
    /// Answers with the stream's head (200); later events follow it. Called once the engine
    /// took the request, so that a refusal after it is an event.
    pub fn open(&self) {
        if let Some(opening) = self.take_opening() {
            let _ = opening.send(None);
        }
    }

    /// The response's head, once: `None` after the stream opened or a refusal answered.
    fn take_opening(&self) -> Option<oneshot::Sender<Option<Response>>> {
        self.opening.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).take()
    }

    /// Ends the stream with `error`: answered with its own status instead of a stream when the
    /// stream has not opened and it is a refusal (`HttpError::is_refusal`) or the route answers
    /// every error so; sent as `event` (the route's error shape) otherwise.
    pub async fn fail<T: Serialize>(&self, error: &HttpError, event: &T) {
        if error.is_refusal() || self.errors_before_open == ErrorsBeforeOpen::Answered {
            if let Some(opening) = self.take_opening() {
                let _ = opening.send(Some(error.response()));
                return;
            }
        }
        self.send_json(event).await;
    }

    /// Sends `data:<json>`; false when the client has gone.
    pub async fn send_json<T: Serialize>(&self, value: &T) -> bool {
        self.open();
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
        self.open();
        self.events.send(Event::default().data(text)).await.is_ok()
    }

    /// Resolves when the client has closed the connection.
    pub async fn closed(&self) {
        self.events.closed().await
    }
}

/// Starts `produce` on its own task and answers, once the stream opens, with the events it
/// sends (status 200), or with the refusal it met before (see the module's comment).
pub(crate) async fn sse_response<F, Fut>(headers: HeaderMap, errors_before_open: ErrorsBeforeOpen, produce: F) -> Response
where
    F: FnOnce(EventSender) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let (events, receiver) = mpsc::channel(EVENT_BUFFER);
    let (opening, opened) = oneshot::channel();
    tokio::spawn(produce(EventSender { events, errors_before_open, opening: Mutex::new(Some(opening)) }));
    // A producer that ends without an event leaves an empty stream.
    if let Ok(Some(refusal)) = opened.await {
        return refusal;
    }
    let stream = ReceiverStream::new(receiver).map(Ok::<Event, Infallible>);
    (headers, Sse::new(stream).keep_alive(KeepAlive::default())).into_response()
}
