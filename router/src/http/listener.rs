//! The accept loop of the HTTP API. Open connections are capped: past the cap a new connection
//! is closed at once and counted, so that idle or slow clients (slowloris) cannot exhaust file
//! descriptors or memory; each one is served by `connection`, which bounds its waits. On
//! shutdown the loop stops accepting, open connections finish their requests (hyper-util's
//! `GracefulShutdown`), and whatever is still open after `drain_timeout` is closed.
//! Owns the listener and the connection permits.
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use super::connection::{self, Activity, ConnectionTimeouts, TrackedApp};
use super::App;
use crate::metrics;

/// How many connections and for how long (from the CLI, via `HttpConfig`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Open connections at most.
    pub max_connections: usize,
    pub timeouts: ConnectionTimeouts,
    /// How long shutdown waits for open connections to finish.
    pub drain_timeout: Duration,
}

/// Pause after an accept error that is not one connection's (e.g. out of file descriptors): it
/// passes only as connections close, and retrying at once would spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Serves `app` on `listener` until `shutdown` is cancelled, then drains (see the module doc).
/// Accept errors never end the loop; the result is for the caller's error path.
pub async fn serve(
    listener: TcpListener,
    app: App,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let App { routes, connections } = app;
    let permits = Arc::new(Semaphore::new(connections.max_connections));
    let builder = connection::builder(&connections.timeouts);
    let graceful = GracefulShutdown::new();
    // Cancelled when the drain time is up, or when this future is dropped before: closes the
    // connections still open (their tasks would otherwise outlive the server).
    let force_close = CancellationToken::new();
    let _close_on_drop = force_close.clone().drop_guard();
    loop {
        let stream = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => stream,
                Err(error) => {
                    on_accept_error(error, &shutdown).await;
                    continue;
                }
            },
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            metrics::connection_refused();
            drop(stream);
            continue;
        };
        let activity = Activity::new(connections.timeouts);
        let service = TrackedApp {
            app: routes.clone(),
            activity: activity.clone(),
        };
        // Tokens are written one by one; Nagle's algorithm would hold them back.
        let _ = stream.set_nodelay(true);
        let connection = builder
            .serve_connection(TokioIo::new(stream), service)
            .into_owned();
        let served = graceful.watch(connection);
        let force_close = force_close.clone();
        tokio::spawn(async move {
            let _open = OpenConnection::new(permit);
            tokio::select! {
                result = served => if let Err(error) = result {
                    tracing::debug!(%error, "connection ended with an error");
                },
                () = activity.expired() => tracing::debug!("closing a connection without a request"),
                () = force_close.cancelled() => {}
            }
        });
    }
    drop(listener);
    drain(graceful, connections.drain_timeout).await;
    Ok(())
}

/// Waits for the open connections to finish, at most `timeout`.
async fn drain(graceful: GracefulShutdown, timeout: Duration) {
    let open = graceful.count();
    if open == 0 {
        return;
    }
    tracing::info!(open, "waiting for open connections to finish");
    if tokio::time::timeout(timeout, graceful.shutdown()).await.is_err() {
        tracing::warn!(?timeout, "closing the connections still open after the drain time");
    }
}

async fn on_accept_error(error: std::io::Error, shutdown: &CancellationToken) {
    use std::io::ErrorKind;
    // One client's failure (it reset before we accepted): nothing to wait for.
    if matches!(
        error.kind(),
        ErrorKind::ConnectionAborted | ErrorKind::ConnectionReset | ErrorKind::ConnectionRefused
    ) {
        return;
    }
    tracing::warn!(%error, "accepting a connection failed");
    tokio::select! {
        _ = shutdown.cancelled() => {}
        _ = tokio::time::sleep(ACCEPT_BACKOFF) => {}
    }
}

/// An open connection: holds its permit and the open-connections gauge until dropped.
struct OpenConnection {
    _permit: OwnedSemaphorePermit,
}

impl OpenConnection {
    fn new(permit: OwnedSemaphorePermit) -> Self {
        metrics::connection_opened();
        Self { _permit: permit }
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        metrics::connection_closed();
    }
}
