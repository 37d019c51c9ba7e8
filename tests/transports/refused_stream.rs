//! A stream refused with `RST_STREAM(REFUSED_STREAM)` before the server read any of its
//! body, over a real HTTP/2 connection on 127.0.0.1: the retry must carry the body exactly
//! once, every chunk in order. The case comes from linkerd2 issue 15649, where a chunk the
//! refused attempt had already taken from the caller's body was recorded for the replay and
//! read again by the retry, so the server got the first chunk twice.
//!
//! The server is the `h2` crate's, so that it can refuse the first stream at a chosen moment
//! without reading a single DATA frame of it: as soon as its headers are in, or once the
//! client's first chunks have arrived (h2 counts the bytes it received and holds unread).
//! It reads every later stream whole, recording each DATA frame, and answers 200. The
//! request bodies are `StreamBody`s fed through a channel, some chunks after a delay, so
//! the transport holds a body that knows neither its length nor its end. Each case sends a
//! keyless POST (a refused stream proves the server never processed it) and a PUT, on both
//! runtimes, awaited directly and from spawned tasks, `RUNS` times each way.
#![allow(clippy::disallowed_methods)] // tokio's paused clock and sleeps, or real time

use crate::common;
use tower::ServiceExt;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use common::transport::{on_every_runtime, repeat};
use http::{Method, Request, Response};
use http_body::Frame;
use http_body_util::StreamBody;
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;
use tower::{BoxError, Layer};
use tower_http_retry::classify::RetryReason;
use tower_http_retry::{
    Backoff, Jitter, ReplayBody, RetryInfo, RetryLayer, RetryPolicy, StopReason,
};

/// Each case runs this many times in each of the four ways.
const RUNS: usize = 20;
/// One runtime and mode, all its runs: a hang fails the test instead of blocking the suite.
const LIMIT: Duration = Duration::from_secs(60);
/// One request, its retry included.
const RUN_LIMIT: Duration = Duration::from_secs(10);
/// How long the server waits for the client's first chunks on the stream it refuses.
const ARRIVAL_LIMIT: Duration = Duration::from_secs(5);

/// The chunks of a request body as they come out of a channel.
struct Feed(mpsc::UnboundedReceiver<Bytes>);

impl futures_util::Stream for Feed {
    type Item = Result<Frame<Bytes>, Infallible>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.0
            .poll_recv(cx)
            .map(|chunk| chunk.map(|data| Ok(Frame::data(data))))
    }
}

type Upload = StreamBody<Feed>;

/// A streaming body of `schedule`'s chunks, each after its delay in milliseconds. The
/// chunks without a delay at the head of it are in the channel before the body is first
/// polled; a task sends the others, and the body ends when that task is done. No size hint:
/// the transport learns the end only by polling once more.
fn upload(schedule: &'static [(u64, &'static [u8])]) -> Upload {
    let (tx, rx) = mpsc::unbounded_channel();
    let ready = schedule.iter().take_while(|(delay, _)| *delay == 0).count();
    for (_, chunk) in &schedule[..ready] {
        tx.send(Bytes::from_static(chunk)).unwrap();
    }
    tokio::spawn(async move {
        for &(delay, chunk) in &schedule[ready..] {
            tokio::time::sleep(Duration::from_millis(delay)).await;
            // The body was dropped (the request is over): nothing more to send.
            if tx.send(Bytes::from_static(chunk)).is_err() {
                return;
            }
        }
    });
    StreamBody::new(Feed(rx))
}

/// Every byte of `schedule`, in order: what the server must receive on the retry.
fn whole(schedule: &[(u64, &'static [u8])]) -> Bytes {
    schedule
        .iter()
        .flat_map(|(_, chunk)| chunk.iter().copied())
        .collect::<Vec<u8>>()
        .into()
}

/// When the server refuses the first stream.
#[derive(Debug, Clone, Copy)]
enum Refusal {
    /// As soon as its headers are in.
    OnHeaders,
    /// Once at least this many bytes of its body have arrived, none of them read.
    Unread(usize),
}

/// What the server did with one stream.
#[derive(Debug, Clone)]
enum Seen {
    /// Refused without reading any of its DATA frames; `unread` bytes of them had arrived.
    Refused { unread: usize },
    /// The client's bytes did not arrive within `ARRIVAL_LIMIT`; refused all the same.
    RefusedLate { unread: usize },
    /// Read whole (every DATA frame, as received) and answered 200.
    Read {
        method: Method,
        keyed: bool,
        frames: Vec<Bytes>,
    },
    /// Reading the body failed.
    Broken(String),
}

/// An `h2` server refusing the first stream it is given (across connections) and reading
/// and answering every later one. Its tasks end when it is dropped.
struct RefusingServer {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<(usize, Seen)>>>,
    task: JoinHandle<()>,
}

impl Drop for RefusingServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl RefusingServer {
    async fn start(refusal: Refusal) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&seen);
        let task = tokio::spawn(async move {
            let streams = Arc::new(AtomicUsize::new(0));
            // Dropped with this task, which aborts every connection's.
            let mut connections = JoinSet::new();
            while let Ok((tcp, _)) = listener.accept().await {
                // The reset goes out at once, not behind an unacknowledged segment.
                let _ = tcp.set_nodelay(true);
                connections.spawn(connection(
                    tcp,
                    refusal,
                    Arc::clone(&streams),
                    Arc::clone(&log),
                ));
            }
        });
        RefusingServer { addr, seen, task }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// The streams seen so far, in the order they arrived.
    fn seen(&self) -> Vec<Seen> {
        let mut seen = self.seen.lock().unwrap().clone();
        seen.sort_by_key(|(index, _)| *index);
        seen.into_iter().map(|(_, seen)| seen).collect()
    }
}

async fn connection(
    tcp: TcpStream,
    refusal: Refusal,
    streams: Arc<AtomicUsize>,
    log: Arc<Mutex<Vec<(usize, Seen)>>>,
) {
    let Ok(mut conn) = h2::server::handshake(tcp).await else {
        return;
    };
    // Dropped when the connection ends, which aborts its streams' tasks.
    let mut tasks = JoinSet::new();
    while let Some(Ok((req, respond))) = conn.accept().await {
        let index = streams.fetch_add(1, Ordering::SeqCst);
        let log = Arc::clone(&log);
        tasks.spawn(async move {
            if index == 0 {
                refuse(req, respond, refusal, &log).await;
            } else {
                read_and_answer(index, req, respond, &log).await;
            }
        });
    }
}

/// Refuses the stream without reading any of its DATA frames: at once, or once `refusal`'s
/// bytes have arrived (h2's count of received bytes not yet released, which reading them
/// would release). The record is written before the reset goes out, so it is there before
/// the client can have retried.
async fn refuse(
    req: Request<h2::RecvStream>,
    mut respond: h2::server::SendResponse<Bytes>,
    refusal: Refusal,
    log: &Mutex<Vec<(usize, Seen)>>,
) {
    let mut body = req.into_body();
    let mut seen = Seen::Refused {
        unread: body.flow_control().used_capacity(),
    };
    if let Refusal::Unread(bytes) = refusal {
        let deadline = Instant::now() + ARRIVAL_LIMIT;
        while body.flow_control().used_capacity() < bytes && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let unread = body.flow_control().used_capacity();
        seen = match unread >= bytes {
            true => Seen::Refused { unread },
            false => Seen::RefusedLate { unread },
        };
    }
    log.lock().unwrap().push((0, seen));
    respond.send_reset(h2::Reason::REFUSED_STREAM);
}

/// Reads the stream whole, each DATA frame kept as it came, records it, answers 200.
async fn read_and_answer(
    index: usize,
    req: Request<h2::RecvStream>,
    mut respond: h2::server::SendResponse<Bytes>,
    log: &Mutex<Vec<(usize, Seen)>>,
) {
    let (parts, mut body) = req.into_parts();
    let mut frames = Vec::new();
    while let Some(frame) = body.data().await {
        match frame {
            Ok(data) => {
                let _ = body.flow_control().release_capacity(data.len());
                frames.push(data);
            }
            Err(error) => {
                log.lock()
                    .unwrap()
                    .push((index, Seen::Broken(error.to_string())));
                return;
            }
        }
    }
    let seen = Seen::Read {
        method: parts.method,
        keyed: parts.headers.contains_key("idempotency-key"),
        frames,
    };
    log.lock().unwrap().push((index, seen));
    let response = Response::builder().status(200).body(()).unwrap();
    if let Ok(mut send) = respond.send_response(response, false) {
        let _ = send.send_data(Bytes::from_static(b"ok"), true);
    }
}

/// A prior-knowledge HTTP/2 hyper-util client under the layer: no idempotency keys, room for
/// a third attempt (so that exactly two is a finding), short backoffs.
async fn send(
    server: &RefusingServer,
    method: Method,
    schedule: &'static [(u64, &'static [u8])],
) -> Result<Response<Incoming>, BoxError> {
    // Without Nagle's algorithm: it would hold each small DATA frame until the previous
    // segment is acknowledged, which the server's delayed ACK puts off by some 40 ms, so the
    // chunks would reach the server together instead of as they come.
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client: Client<HttpConnector, ReplayBody<Upload>> = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build(connector);
    let policy = RetryPolicy::default().max_attempts(3).backoff(
        Backoff::exponential(Duration::from_millis(1), Duration::from_millis(4))
            .jitter(Jitter::None),
    );
    // No keys (the default): the POST may be retried only on a proof it was never seen.
    let layer = RetryLayer::new().policy(policy);
    let req = Request::builder()
        .method(method)
        .uri(server.url("/upload"))
        .body(upload(schedule))
        .unwrap();
    layer.layer(client).oneshot(req).await
}

/// One scenario: when the server refuses the first stream, and how the body streams.
struct Case {
    refusal: Refusal,
    schedule: &'static [(u64, &'static [u8])],
}

/// Sends `method` with `case`'s body to a fresh server that refuses the first stream, and
/// checks the outcome: 200 after exactly two attempts, the first retry for the refused
/// stream, the refused stream's body never read, and the retry's body every chunk exactly
/// once, in order.
async fn check(case: &Case, method: Method, context: &str) {
    let server = RefusingServer::start(case.refusal).await;
    let result = tokio::time::timeout(RUN_LIMIT, send(&server, method.clone(), case.schedule))
        .await
        .unwrap_or_else(|_| panic!("{context}: no outcome within {RUN_LIMIT:?}"));
    let seen = server.seen();
    let response =
        result.unwrap_or_else(|e| panic!("{context}: failed instead of retrying: {e}; {seen:?}"));
    let info = response
        .extensions()
        .get::<RetryInfo>()
        .cloned()
        .unwrap_or_else(|| panic!("{context}: no RetryInfo in the response"));
    assert_eq!(
        (response.status().as_u16(), info.attempts(), info.stop()),
        (200, 2, StopReason::Final),
        "{context}: {info:?}; {seen:?}"
    );
    assert_eq!(
        info.retries().first().map(|retry| retry.reason),
        Some(RetryReason::RefusedStream),
        "{context}: {info:?}"
    );

    assert_eq!(seen.len(), 2, "{context}: streams seen: {seen:?}");
    match (&seen[0], case.refusal) {
        (Seen::Refused { .. }, Refusal::OnHeaders) => {}
        (Seen::Refused { unread }, Refusal::Unread(bytes)) => {
            assert!(*unread >= bytes, "{context}: {unread} bytes unread")
        }
        (Seen::RefusedLate { unread }, refusal) => panic!(
            "{context}: {refusal:?}, but only {unread} bytes arrived within {ARRIVAL_LIMIT:?}"
        ),
        (other, _) => panic!("{context}: the first stream was not refused: {other:?}"),
    }
    let (retried, keyed, frames) = match &seen[1] {
        Seen::Read {
            method,
            keyed,
            frames,
        } => (method, *keyed, frames),
        Seen::Broken(error) => panic!("{context}: reading the retry's body failed: {error}"),
        other => panic!("{context}: the second stream was not read: {other:?}"),
    };
    assert_eq!(retried, &method, "{context}");
    assert!(!keyed, "{context}: an idempotency key was sent");
    let received: Vec<u8> = frames.iter().flat_map(|f| f.iter().copied()).collect();
    assert_eq!(
        Bytes::from(received),
        whole(case.schedule),
        "{context}: the retry's body is not every chunk once, in order; its DATA frames: \
         {frames:?}; the refused stream: {:?}",
        seen[0]
    );
}

/// Runs `case` for a keyless POST and a PUT, `RUNS` times in each of the four ways.
fn run(name: &'static str, case: &'static Case) {
    on_every_runtime(LIMIT, |mode| {
        repeat(mode, RUNS, move |run| async move {
            for method in [Method::POST, Method::PUT] {
                check(
                    case,
                    method.clone(),
                    &format!("{name}: {method} {mode:?} run {run}"),
                )
                .await;
            }
        })
    });
}

/// Refused as soon as its headers are in, before any of the body was read: the first two
/// chunks are ready when the transport first polls the body, so it has usually taken one or
/// both of them (and the layer recorded them) when the refusal comes; the rest follow.
static ON_HEADERS: Case = Case {
    refusal: Refusal::OnHeaders,
    schedule: &[
        (0, b"chunk-0;"),
        (0, b"chunk-1;"),
        (10, b"chunk-2;"),
        (10, b"chunk-3;"),
        (10, b"chunk-4;"),
    ],
};

/// Refused once the first chunk has arrived at the server, which read none of it; the
/// second chunk comes 20 ms after the first, usually after the refusal.
static FIRST_CHUNK_UNREAD: Case = Case {
    refusal: Refusal::Unread(8),
    schedule: &[
        (0, b"chunk-0;"),
        (20, b"chunk-1;"),
        (5, b"chunk-2;"),
        (5, b"chunk-3;"),
        (5, b"chunk-4;"),
    ],
};

/// Chunks 5 ms apart, refused once two of them have arrived unread (so the client had
/// polled chunk 1 before the refusal), while the transport is taking the next ones.
static MID_STREAM: Case = Case {
    refusal: Refusal::Unread(16),
    schedule: &[
        (0, b"chunk-0;"),
        (5, b"chunk-1;"),
        (5, b"chunk-2;"),
        (5, b"chunk-3;"),
        (5, b"chunk-4;"),
        (5, b"chunk-5;"),
    ],
};

#[test]
fn refused_on_its_headers_the_retry_sends_every_chunk_once() {
    run("refused on its headers", &ON_HEADERS);
}

#[test]
fn refused_with_the_first_chunk_unread_the_retry_sends_every_chunk_once() {
    run("refused with the first chunk unread", &FIRST_CHUNK_UNREAD);
}

#[test]
fn refused_mid_stream_after_chunk_1_the_retry_sends_every_chunk_once() {
    run("refused mid-stream", &MID_STREAM);
}
