//! An HTTP/2 connection that breaks with an I/O error under a request: a proxy on
//! 127.0.0.1, in front of hyper's prior-knowledge HTTP/2 server, cuts its first connection
//! in the middle of the frame header of the server's answer (its `HEADERS`) and closes both
//! sides; later connections it forwards whole. The client's h2 reads a few bytes of a frame
//! and then the end of the stream: an I/O error, which hyper hands over without the h2
//! error around it. The server processed the request, so the failure is a connection
//! closed under it, not proof that it was never sent: a GET is retried, a keyless POST is
//! returned after one attempt.
//!
//! Every case runs on both runtimes, awaited directly and from spawned tasks.

use crate::common;
use tower::ServiceExt;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::transport::{
    Proto, Script, Server, apply, client, hyper_server, on_every_runtime, repeat,
};
use http::{Method, Request};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tower::{BoxError, Layer};
use tower_http_retry::classify::RetryReason;
use tower_http_retry::{
    Backoff, Jitter, RetryError, RetryInfo, RetryLayer, RetryPolicy, StopReason,
};

/// Runs of each case in each of the four ways.
const RUNS: usize = 20;
/// A hung case fails rather than blocking the suite.
const LIMIT: Duration = Duration::from_secs(60);
/// The longest a proxied connection is kept.
const CONNECTION_LIMIT: Duration = Duration::from_secs(10);
/// How much of the answer's 9-byte frame header gets through before the cut.
const HEADER_BYTES_SENT: usize = 4;

/// The HTTP/2 frame type the proxy looks for.
const HEADERS: u8 = 0x1;
/// Connections a proxy accepts (a case opens two at most), and reads it makes on one.
const MAX_CONNECTIONS: usize = 8;
const MAX_READS: usize = 1000;

/// A TCP proxy that cuts its first connection inside the server's first `HEADERS` frame.
struct CuttingProxy {
    addr: SocketAddr,
    connections: Arc<AtomicUsize>,
    cuts: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

impl Drop for CuttingProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl CuttingProxy {
    async fn new(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let connections = Arc::new(AtomicUsize::new(0));
        let cuts = Arc::new(AtomicUsize::new(0));
        let (counted, cut) = (connections.clone(), cuts.clone());
        let task = tokio::spawn(async move {
            for _ in 0..MAX_CONNECTIONS {
                let Ok((mut client, _)) = listener.accept().await else {
                    return;
                };
                let first = counted.fetch_add(1, Ordering::SeqCst) == 0;
                let cut = cut.clone();
                tokio::spawn(async move {
                    let Ok(mut server) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    let _ = tokio::time::timeout(CONNECTION_LIMIT, async move {
                        if first {
                            cut_in_the_answer(client, server, &cut).await;
                        } else {
                            let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                        }
                    })
                    .await;
                });
            }
        });
        Self {
            addr,
            connections,
            cuts,
            task,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }
}

/// Forwards the client's bytes whole and the server's frame by frame, until a `HEADERS`
/// frame on a stream comes from the server: of that one only the first
/// [`HEADER_BYTES_SENT`] bytes reach the client, `cuts` is counted, and both connections
/// are closed.
async fn cut_in_the_answer(mut client: TcpStream, mut server: TcpStream, cuts: &AtomicUsize) {
    let mut pending = Vec::new();
    let mut from_server = [0u8; 16 << 10];
    let mut from_client = [0u8; 16 << 10];
    {
        let (mut client_read, mut client_write) = client.split();
        let (mut server_read, mut server_write) = server.split();
        'relay: for _ in 0..MAX_READS {
            // Every whole frame in the buffer is forwarded, unless it is the answer's HEADERS.
            while pending.len() >= 9 {
                let len = (usize::from(pending[0]) << 16)
                    | (usize::from(pending[1]) << 8)
                    | usize::from(pending[2]);
                let stream = u32::from_be_bytes([pending[5], pending[6], pending[7], pending[8]])
                    & 0x7fff_ffff;
                if pending[3] == HEADERS && stream != 0 {
                    if client_write
                        .write_all(&pending[..HEADER_BYTES_SENT])
                        .await
                        .is_ok()
                    {
                        // Counted before the close the client fails on.
                        cuts.fetch_add(1, Ordering::SeqCst);
                    }
                    break 'relay;
                }
                if pending.len() < 9 + len {
                    break;
                }
                if client_write.write_all(&pending[..9 + len]).await.is_err() {
                    break 'relay;
                }
                pending.drain(..9 + len);
            }
            tokio::select! {
                read = server_read.read(&mut from_server) => match read {
                    Ok(0) | Err(_) => break,
                    Ok(n) => pending.extend_from_slice(&from_server[..n]),
                },
                read = client_read.read(&mut from_client) => match read {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if server_write.write_all(&from_client[..n]).await.is_err() {
                            break;
                        }
                    }
                },
            }
        }
    }
    // The server's side is closed at once; the client's after the bytes sent, and once the
    // client has closed its own (what it sends meanwhile is read and dropped, so that no
    // unread bytes turn the close into a reset).
    drop(server);
    let _ = client.shutdown().await;
    for _ in 0..MAX_READS {
        if !matches!(client.read(&mut from_client).await, Ok(1..)) {
            break;
        }
    }
}

fn layer(keys: bool) -> RetryLayer {
    let policy = RetryPolicy::default().max_attempts(3).backoff(
        Backoff::exponential(Duration::from_millis(1), Duration::from_millis(4))
            .jitter(Jitter::None),
    );
    let layer = RetryLayer::new().policy(policy);
    if keys {
        layer
    } else {
        layer.policy(RetryPolicy::new().idempotency_key(None))
    }
}

/// A hyper HTTP/2 server that applies every request with a 200, and the proxy before it.
async fn server_behind_a_proxy() -> (Server, CuttingProxy) {
    let server = hyper_server(Proto::H2, |req, _, log| async move {
        apply(req, &log, 200).await
    })
    .await;
    let proxy = CuttingProxy::new(server.addr).await;
    (server, proxy)
}

async fn send(
    layer: RetryLayer,
    method: Method,
    url: String,
) -> Result<http::Response<hyper::body::Incoming>, BoxError> {
    let req = Request::builder()
        .method(method)
        .uri(url)
        .body(Script::empty())
        .unwrap();
    layer.layer(client(Proto::H2)).oneshot(req).await
}

/// The kind of the first I/O error in the chain.
fn io_kind(error: &BoxError) -> Option<std::io::ErrorKind> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&**error);
    while let Some(e) = source {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            return Some(io.kind());
        }
        source = e.source();
    }
    None
}

/// The error and its sources, outermost first.
fn chain(error: &BoxError) -> String {
    let mut out = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        out.push_str(" <- ");
        out.push_str(&e.to_string());
        source = e.source();
    }
    out
}

#[test]
fn h2_connection_cut_mid_frame_before_the_answer_retries_a_get() {
    on_every_runtime(LIMIT, |mode| {
        repeat(mode, RUNS, move |run| async move {
            let context = format!("{mode:?} run {run}");
            let (server, proxy) = server_behind_a_proxy().await;
            let response = send(layer(true), Method::GET, proxy.url("/doc"))
                .await
                .unwrap_or_else(|e| panic!("{context}: failed instead of retrying: {}", chain(&e)));
            let info = response.extensions().get::<RetryInfo>().unwrap().clone();
            assert_eq!(
                (response.status().as_u16(), info.attempts(), info.stop()),
                (200, 2, StopReason::Final),
                "{context}: {info:?}"
            );
            assert_eq!(
                info.retries()[0].reason,
                RetryReason::ConnectionClosed,
                "{context}: {info:?}"
            );
            // The cut was made, and the retry went over a connection of its own.
            assert_eq!(proxy.cuts.load(Ordering::SeqCst), 1, "{context}");
            assert_eq!(proxy.connections.load(Ordering::SeqCst), 2, "{context}");
            assert_eq!(server.log.applied().len(), 2, "{context}");
        })
    });
}

#[test]
fn h2_connection_cut_mid_frame_before_the_answer_does_not_retry_a_keyless_post() {
    on_every_runtime(LIMIT, |mode| {
        repeat(mode, RUNS, move |run| async move {
            let context = format!("{mode:?} run {run}");
            let (server, proxy) = server_behind_a_proxy().await;
            let error = send(layer(false), Method::POST, proxy.url("/orders"))
                .await
                .err()
                .unwrap_or_else(|| panic!("{context}: a keyless POST answered after a cut"));
            let retry = error
                .downcast_ref::<RetryError>()
                .unwrap_or_else(|| panic!("{context}: not a RetryError: {}", chain(&error)));
            assert_eq!(
                (retry.info().attempts(), retry.info().stop()),
                (1, StopReason::NotIdempotent),
                "{context}: {}: {:?}",
                chain(&error),
                retry.info()
            );
            // An end of the stream in the middle of a frame, not a reset.
            let kind = io_kind(&error);
            assert!(
                kind.is_some_and(|kind| kind != std::io::ErrorKind::ConnectionReset),
                "{context}: {kind:?}: {}",
                chain(&error)
            );
            assert_eq!(proxy.cuts.load(Ordering::SeqCst), 1, "{context}");
            assert_eq!(proxy.connections.load(Ordering::SeqCst), 1, "{context}");
            // The server applied it once: the cut came after, on the way back.
            assert_eq!(server.log.applied().len(), 1, "{context}");
        })
    });
}
