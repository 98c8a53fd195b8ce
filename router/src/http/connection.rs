//! One client connection: HTTP/1 or HTTP/2 (hyper-util's auto builder), with every wait on
//! the client bounded in time. A connection is closed when it
//! - sends no request within `header_timeout` of connecting: hyper's HTTP/1 header timeout only
//!   starts once the first byte arrives (the auto builder first reads bytes to tell HTTP/2's
//!   preface from HTTP/1), so a silent client or a trickled preface is bounded here;
//! - is slow to send a request head (HTTP/1: hyper's `header_read_timeout`, which also starts
//!   when a kept-alive connection waits for its next request, so it bounds that idle wait too);
//! - stalls a request body for `header_timeout` between two pieces of it (the request fails
//!   with 422 and its connection closes);
//! - has no request in flight for `idle_timeout` after its last one ended (HTTP/2 in
//!   practice, whose clients keep connections open; HTTP/2 keep-alive pings find dead peers).
//!
//! Owns the connection's activity record: requests in flight and when the last one ended.
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes, HttpBody};
use axum::response::Response;
use axum::Router;
use hyper::body::{Frame, Incoming, SizeHint};
use hyper_util::rt::{TokioExecutor, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::time::Instant;
use tower::ServiceExt;
use tower_http::timeout::TimeoutBody;

/// How long each wait on a client may last (from the CLI, via `HttpConfig`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionTimeouts {
    /// Time to send a request head: after connecting, and (HTTP/1) after the previous response;
    /// also the longest pause within a request body.
    pub header_timeout: Duration,
    /// Time a connection may stay open with no request in flight after its last request.
    pub idle_timeout: Duration,
}

/// HTTP/2 keep-alive: a ping after this much silence; no answer within as long closes the
/// connection (a peer that vanished without a FIN would otherwise hold it until TCP gives up).
const HTTP2_KEEP_ALIVE: Duration = Duration::from_secs(20);

/// The protocol settings every connection is served with.
pub(crate) fn builder(timeouts: &ConnectionTimeouts) -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(timeouts.header_timeout)
        .keep_alive(true);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(HTTP2_KEEP_ALIVE)
        .keep_alive_timeout(HTTP2_KEEP_ALIVE);
    builder
}

#[derive(Debug)]
struct ActivityState {
    in_flight: usize,
    /// When the last request's response ended; `None` before the first request.
    last_end: Option<Instant>,
}

/// What the connection's watchdog needs to know. Shared by the connection's requests (HTTP/2
/// runs them on their own tasks); the lock is per connection and held for a few instructions.
#[derive(Debug)]
pub(crate) struct Activity {
    opened: Instant,
    timeouts: ConnectionTimeouts,
    state: Mutex<ActivityState>,
}

impl Activity {
    pub fn new(timeouts: ConnectionTimeouts) -> Arc<Self> {
        Arc::new(Self {
            opened: Instant::now(),
            timeouts,
            state: Mutex::new(ActivityState {
                in_flight: 0,
                last_end: None,
            }),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, ActivityState> {
        // The state stays consistent whatever panicked while holding it (two plain writes).
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A request started; its guard ends it when dropped (with the response body).
    fn begin(self: &Arc<Self>) -> RequestGuard {
        self.state().in_flight += 1;
        RequestGuard {
            activity: self.clone(),
        }
    }

    /// When the connection must close unless a request starts first; `None` while one runs.
    fn deadline(&self) -> Option<Instant> {
        let state = self.state();
        if state.in_flight > 0 {
            return None;
        }
        Some(match state.last_end {
            None => self.opened + self.timeouts.header_timeout,
            Some(end) => end + self.timeouts.idle_timeout,
        })
    }

    /// Resolves when the connection has gone past its deadline without a request.
    pub async fn expired(&self) {
        loop {
            match self.deadline() {
                Some(deadline) if Instant::now() >= deadline => return,
                Some(deadline) => tokio::time::sleep_until(deadline).await,
                // Checked again later: the deadline moves only once the requests end.
                None => tokio::time::sleep(self.timeouts.header_timeout).await,
            }
        }
    }
}

struct RequestGuard {
    activity: Arc<Activity>,
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        let mut state = self.activity.state();
        state.in_flight = state.in_flight.saturating_sub(1);
        state.last_end = Some(Instant::now());
    }
}

/// A response body that holds its request's guard, so that a streamed response (SSE) counts
/// as in flight until its last byte is written or the client leaves.
struct TrackedBody {
    body: Body,
    _guard: RequestGuard,
}

impl HttpBody for TrackedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// The app as one connection's hyper service, recording each request in the activity.
#[derive(Clone)]
pub(crate) struct TrackedApp {
    pub app: Router,
    pub activity: Arc<Activity>,
}

impl hyper::service::Service<hyper::Request<Incoming>> for TrackedApp {
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn call(&self, request: hyper::Request<Incoming>) -> Self::Future {
        let guard = self.activity.begin();
        let app = self.app.clone();
        let body_timeout = self.activity.timeouts.header_timeout;
        let request = request.map(|body| Body::new(TimeoutBody::new(body_timeout, body)));
        Box::pin(async move {
            let response = app.oneshot(request).await?;
            Ok(response.map(|body| {
                Body::new(TrackedBody {
                    body,
                    _guard: guard,
                })
            }))
        })
    }
}
