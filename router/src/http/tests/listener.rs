//! The accept loop over real sockets (port 0) with a trivial app: idle and half-sent
//! connections and stalled bodies are cut off on time without blocking others, the connection
//! cap closes extra connections at once, and shutdown lets a request in flight finish.
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use axum::routing::{get, post};
use axum::Router;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::http::{serve, App, ConnectionLimits, ConnectionTimeouts};

struct Server {
    address: SocketAddr,
    shutdown: CancellationToken,
    serving: JoinHandle<std::io::Result<()>>,
}

async fn start(max_connections: usize, header_timeout: Duration, idle_timeout: Duration) -> Server {
    let routes = Router::new()
        .route("/", get(|| async { "ok" }))
        .route("/echo", post(|body: String| async move { body }))
        .route(
        "/slow",
        get(|| async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            "slow"
        }),
    );
    let app = App {
        routes,
        connections: ConnectionLimits {
            max_connections,
            timeouts: ConnectionTimeouts {
                header_timeout,
                idle_timeout,
            },
            drain_timeout: Duration::from_secs(2),
        },
    };
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    let serving = tokio::spawn(serve(listener, app, shutdown.clone()));
    Server {
        address,
        shutdown,
        serving,
    }
}

/// `GET path` on its own connection; the whole response as text.
async fn get_text(address: SocketAddr, path: &str) -> String {
    let mut stream = TcpStream::connect(address).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut response))
        .await
        .expect("the response came in time")
        .unwrap();
    String::from_utf8(response).unwrap()
}

/// Whether the server closed `stream` within `within` (EOF or reset, without a response).
async fn closed_within(stream: &mut TcpStream, within: Duration) -> bool {
    let mut buffer = [0u8; 256];
    match tokio::time::timeout(within, stream.read(&mut buffer)).await {
        Ok(Ok(0)) | Ok(Err(_)) => true,
        Ok(Ok(_)) | Err(_) => false,
    }
}

#[tokio::test]
async fn idle_and_half_sent_connections_close_on_time_and_block_no_one() {
    let header_timeout = Duration::from_millis(500);
    let server = start(1000, header_timeout, Duration::from_secs(30)).await;
    let opened = Instant::now();
    let mut idle = Vec::new();
    for index in 0..200 {
        let mut stream = TcpStream::connect(server.address).await.unwrap();
        // Silent, a partial HTTP/1 request line, a partial HTTP/2 preface.
        let partial: &[u8] = match index % 3 {
            0 => b"",
            1 => b"GET / HTTP/1.1\r\nHost: te",
            _ => b"PRI * HTTP/2.0\r\n",
        };
        stream.write_all(partial).await.unwrap();
        idle.push(stream);
    }
    let response = get_text(server.address, "/").await;
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(response.ends_with("ok"), "{response}");
    assert!(opened.elapsed() < header_timeout, "the request waited for the idle ones");
    for (index, stream) in idle.iter_mut().enumerate() {
        assert!(
            closed_within(stream, Duration::from_secs(3)).await,
            "idle connection {index} is still open"
        );
    }
    assert!(opened.elapsed() >= header_timeout);
    server.shutdown.cancel();
    server.serving.await.unwrap().unwrap();
}

#[tokio::test]
async fn a_stalled_request_body_fails_the_request_on_time() {
    let server = start(10, Duration::from_millis(300), Duration::from_secs(30)).await;
    let mut stream = TcpStream::connect(server.address).await.unwrap();
    let sent = Instant::now();
    stream
        .write_all(b"POST /echo HTTP/1.1\r\nHost: test\r\nContent-Length: 100\r\n\r\nonly ten b")
        .await
        .unwrap();
    let mut response = Vec::new();
    tokio::time::timeout(Duration::from_secs(3), stream.read_to_end(&mut response))
        .await
        .expect("the server gave up on the body in time")
        .unwrap();
    let response = String::from_utf8_lossy(&response);
    assert!(response.starts_with("HTTP/1.1 4"), "{response}");
    assert!(sent.elapsed() >= Duration::from_millis(300));
    server.shutdown.cancel();
}

#[tokio::test]
async fn a_kept_alive_connection_is_closed_once_idle() {
    let server = start(10, Duration::from_millis(300), Duration::from_millis(300)).await;
    let mut stream = TcpStream::connect(server.address).await.unwrap();
    stream
        .write_all(b"GET / HTTP/1.1\r\nHost: test\r\n\r\n")
        .await
        .unwrap();
    let mut buffer = [0u8; 1024];
    let read = stream.read(&mut buffer).await.unwrap();
    assert!(buffer[..read].starts_with(b"HTTP/1.1 200"));
    assert!(closed_within(&mut stream, Duration::from_secs(3)).await);
    server.shutdown.cancel();
}

#[tokio::test]
async fn connections_past_the_cap_are_closed_at_once_and_counted() {
    let metrics = crate::metrics::install_recorder().unwrap();
    let server = start(2, Duration::from_secs(10), Duration::from_secs(10)).await;
    let held: Vec<TcpStream> = vec![
        TcpStream::connect(server.address).await.unwrap(),
        TcpStream::connect(server.address).await.unwrap(),
    ];
    // Let the loop accept both before the next one arrives.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut extra = TcpStream::connect(server.address).await.unwrap();
    assert!(closed_within(&mut extra, Duration::from_secs(1)).await);
    let rendered = crate::metrics::render(&metrics);
    assert!(
        rendered.contains("superinfer_http_connections_refused"),
        "{rendered}"
    );
    // A closed connection gives its place back.
    drop(held);
    let mut response = String::new();
    for _ in 0..100 {
        response = get_text(server.address, "/").await;
        if !response.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(response.starts_with("HTTP/1.1 200"), "{response:?}");
    server.shutdown.cancel();
}

#[tokio::test]
async fn shutdown_stops_accepting_and_lets_a_request_in_flight_finish() {
    let server = start(10, Duration::from_secs(5), Duration::from_secs(5)).await;
    let address = server.address;
    let slow = tokio::spawn(async move { get_text(address, "/slow").await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    server.shutdown.cancel();
    let response = slow.await.unwrap();
    assert!(response.ends_with("slow"), "{response}");
    tokio::time::timeout(Duration::from_secs(5), server.serving)
        .await
        .expect("serve returned after the drain")
        .unwrap()
        .unwrap();
    assert!(TcpStream::connect(address).await.is_err());
}
