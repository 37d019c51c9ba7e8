//! Real transports for the tests that depend on how they read, hold and drop a body or
//! report a failure: hyper HTTP/1 and HTTP/2 servers, an `h2` server that sends chosen
//! RST_STREAM and GOAWAY frames, a raw-frame HTTP/2 server for a GOAWAY that names an
//! earlier stream, real hyper-util clients, and a runner that repeats a case on both tokio
//! runtimes, awaited directly and from spawned tasks.
#![allow(clippy::disallowed_methods)] // tokio's paused clock and sleeps, or real time

use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, Response};
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio::time::Sleep;
use tower_http_retry::ReplayBody;

/// The HTTP version a case runs over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proto {
    H1,
    H2,
}

/// One step of a [`Script`] body.
#[derive(Debug, Clone)]
pub enum Step {
    Data(&'static [u8]),
    /// Nothing to send for a while: the transport holds the body, pending.
    Wait(Duration),
    Trailers(&'static str, &'static str),
}

/// A streaming request body played from a list of steps. Like most streams (a
/// `StreamBody`, a channel) it knows neither its size nor that it has ended until it is
/// polled once more; only an empty script says it is empty.
#[derive(Debug)]
pub struct Script {
    steps: VecDeque<Step>,
    sleep: Option<Pin<Box<Sleep>>>,
    empty: bool,
}

impl Script {
    pub fn new(steps: &[Step]) -> Self {
        Self {
            steps: steps.iter().cloned().collect(),
            sleep: None,
            empty: steps.is_empty(),
        }
    }

    pub fn empty() -> Self {
        Self::new(&[])
    }

    /// The data bytes the script sends, all of them.
    pub fn bytes(steps: &[Step]) -> Bytes {
        let mut all = Vec::new();
        for step in steps {
            if let Step::Data(data) = step {
                all.extend_from_slice(data);
            }
        }
        Bytes::from(all)
    }
}

impl Body for Script {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        loop {
            let step = match self.steps.front() {
                None => return Poll::Ready(None),
                Some(step) => step.clone(),
            };
            match step {
                Step::Wait(wait) => {
                    let sleep = self
                        .sleep
                        .get_or_insert_with(|| Box::pin(tokio::time::sleep(wait)));
                    ready!(sleep.as_mut().poll(cx));
                    self.sleep = None;
                    self.steps.pop_front();
                }
                Step::Data(data) => {
                    self.steps.pop_front();
                    return Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(data)))));
                }
                Step::Trailers(name, value) => {
                    self.steps.pop_front();
                    let mut trailers = HeaderMap::new();
                    trailers.insert(
                        http::HeaderName::from_static(name),
                        http::HeaderValue::from_static(value),
                    );
                    return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.empty
    }

    fn size_hint(&self) -> SizeHint {
        match self.empty {
            true => SizeHint::with_exact(0),
            false => SizeHint::default(),
        }
    }
}

pub type TransportClient = Client<HttpConnector, ReplayBody<Script>>;

/// A real hyper-util client; over HTTP/2 it speaks prior-knowledge cleartext HTTP/2.
pub fn client(proto: Proto) -> TransportClient {
    Client::builder(TokioExecutor::new())
        .http2_only(proto == Proto::H2)
        .build_http()
}

/// A request as a server saw it in full.
#[derive(Debug, Clone)]
pub struct Applied {
    pub method: http::Method,
    pub path: String,
    pub headers: HeaderMap,
    pub body: Bytes,
    pub trailers: Option<HeaderMap>,
}

/// What every server here records: requests read in full, and requests seen at all.
#[derive(Clone, Default)]
pub struct Log {
    applied: Arc<Mutex<Vec<Applied>>>,
    seen: Arc<AtomicUsize>,
}

impl Log {
    pub fn applied(&self) -> Vec<Applied> {
        self.applied.lock().unwrap().clone()
    }

    pub fn seen(&self) -> usize {
        self.seen.load(Ordering::SeqCst)
    }

    /// Counts one more request and returns how many came before it.
    pub fn next(&self) -> usize {
        self.seen.fetch_add(1, Ordering::SeqCst)
    }

    pub fn record(&self, applied: Applied) {
        self.applied.lock().unwrap().push(applied);
    }
}

/// A server task, aborted when dropped.
pub struct Server {
    pub addr: SocketAddr,
    pub log: Log,
    task: JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Server {
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }
}

/// Reads a hyper body to its end, trailers included.
pub async fn read_all(
    parts: &http::request::Parts,
    body: Incoming,
) -> Result<Applied, hyper::Error> {
    let collected = body.collect().await?;
    let trailers = collected.trailers().cloned();
    Ok(Applied {
        method: parts.method.clone(),
        path: parts.uri.path().to_string(),
        headers: parts.headers.clone(),
        body: collected.to_bytes(),
        trailers,
    })
}

pub fn status(code: u16) -> Response<Full<Bytes>> {
    Response::builder()
        .status(code)
        .body(Full::new(Bytes::from(format!("status {code}"))))
        .unwrap()
}

/// A hyper server (HTTP/1 or prior-knowledge HTTP/2) on 127.0.0.1. `handler` gets the
/// request, its index and the log; an `Err` makes hyper drop the connection (HTTP/1) or
/// reset the stream (HTTP/2) without an answer.
pub async fn hyper_server<F, Fut>(proto: Proto, handler: F) -> Server
where
    F: Fn(Request<Incoming>, usize, Log) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<Response<Full<Bytes>>, std::io::Error>> + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let log = Log::default();
    let server_log = log.clone();
    let task = tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            serve_hyper(proto, stream, handler.clone(), server_log.clone());
        }
    });
    Server { addr, log, task }
}

fn serve_hyper<F, Fut>(proto: Proto, stream: TcpStream, handler: F, log: Log)
where
    F: Fn(Request<Incoming>, usize, Log) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<Response<Full<Bytes>>, std::io::Error>> + Send + 'static,
{
    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
        let index = log.next();
        handler(req, index, log.clone())
    });
    let io = TokioIo::new(stream);
    tokio::spawn(async move {
        let _ = match proto {
            Proto::H1 => {
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(io, service)
                    .await
            }
            Proto::H2 => {
                hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(io, service)
                    .await
            }
        };
    });
}

/// The usual handler: read the request in full, record it, answer `code`.
pub async fn apply(
    req: Request<Incoming>,
    log: &Log,
    code: u16,
) -> Result<Response<Full<Bytes>>, std::io::Error> {
    let (parts, body) = req.into_parts();
    let applied = read_all(&parts, body)
        .await
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    log.record(applied);
    Ok(status(code))
}

/// What the `h2` server does with one stream.
pub enum H2Action {
    /// Read the body in full, record it, answer with this status.
    Apply(u16),
    /// Read one data frame, then RST_STREAM with this reason.
    ResetAfterFirstChunk(h2::Reason),
    /// Read the body in full and record it, then close the connection with GOAWAY naming
    /// this stream as the last one processed, without an answer.
    ApplyThenGoAway,
    /// Read the body in full and record it, then drop the connection without a word.
    ApplyThenDrop,
    /// RST_STREAM(REFUSED_STREAM) as soon as the request's headers are in, reading
    /// nothing: the stream is refused before any of it is processed.
    Refuse,
    /// Read the body in full and record it, then answer as a gRPC server would: 200,
    /// `content-type: application/grpc`, the request's bytes echoed (a gRPC request's
    /// message frames are a valid reply), trailers with `grpc-status: 0`.
    GrpcEcho,
}

/// A server on the `h2` crate's server side, for frames hyper's server never sends on its
/// own. `plan(index)` says what to do with the request of that index (across connections).
pub async fn h2_server<P>(plan: P) -> Server
where
    P: Fn(usize) -> H2Action + Clone + Send + Sync + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let log = Log::default();
    let server_log = log.clone();
    let task = tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(h2_connection(stream, plan.clone(), server_log.clone()));
        }
    });
    Server { addr, log, task }
}

enum Close {
    GoAway,
    Drop,
}

async fn h2_connection<P>(stream: TcpStream, plan: P, log: Log)
where
    P: Fn(usize) -> H2Action + Clone + Send + Sync + 'static,
{
    let Ok(mut conn) = h2::server::handshake(stream).await else {
        return;
    };
    let (close_tx, mut close_rx) = tokio::sync::mpsc::unbounded_channel::<Close>();
    loop {
        tokio::select! {
            accepted = conn.accept() => {
                let Some(Ok((req, respond))) = accepted else { return };
                let action = plan(log.next());
                tokio::spawn(h2_stream(req, respond, action, log.clone(), close_tx.clone()));
            }
            Some(close) = close_rx.recv() => {
                match close {
                    Close::GoAway => {
                        conn.abrupt_shutdown(h2::Reason::NO_ERROR);
                        // Drive the connection until the GOAWAY is out and it closes.
                        while let Some(Ok(_)) = conn.accept().await {}
                    }
                    Close::Drop => {}
                }
                return;
            }
        }
    }
}

async fn h2_read_all(
    parts: &http::request::Parts,
    mut body: h2::RecvStream,
) -> Result<Applied, h2::Error> {
    let mut data = Vec::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk?;
        let _ = body.flow_control().release_capacity(chunk.len());
        data.extend_from_slice(&chunk);
    }
    let trailers = body.trailers().await?;
    Ok(Applied {
        method: parts.method.clone(),
        path: parts.uri.path().to_string(),
        headers: parts.headers.clone(),
        body: Bytes::from(data),
        trailers,
    })
}

async fn h2_stream(
    req: Request<h2::RecvStream>,
    mut respond: h2::server::SendResponse<Bytes>,
    action: H2Action,
    log: Log,
    close: tokio::sync::mpsc::UnboundedSender<Close>,
) {
    let (parts, mut body) = req.into_parts();
    match action {
        H2Action::Refuse => respond.send_reset(h2::Reason::REFUSED_STREAM),
        H2Action::GrpcEcho => {
            let Ok(applied) = h2_read_all(&parts, body).await else {
                return;
            };
            let echo = applied.body.clone();
            log.record(applied);
            let response = Response::builder()
                .status(200)
                .header("content-type", "application/grpc")
                .body(())
                .unwrap();
            if let Ok(mut send) = respond.send_response(response, false) {
                let _ = send.send_data(echo, false);
                let mut trailers = HeaderMap::new();
                trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
                let _ = send.send_trailers(trailers);
            }
        }
        H2Action::ResetAfterFirstChunk(reason) => {
            if let Some(Ok(chunk)) = body.data().await {
                let _ = body.flow_control().release_capacity(chunk.len());
            }
            respond.send_reset(reason);
        }
        H2Action::Apply(code) => {
            let Ok(applied) = h2_read_all(&parts, body).await else {
                return;
            };
            log.record(applied);
            let response = Response::builder().status(code).body(()).unwrap();
            if let Ok(mut send) = respond.send_response(response, false) {
                let _ = send.send_data(Bytes::from(format!("status {code}")), true);
            }
        }
        H2Action::ApplyThenGoAway | H2Action::ApplyThenDrop => {
            let goaway = matches!(action, H2Action::ApplyThenGoAway);
            let Ok(applied) = h2_read_all(&parts, body).await else {
                return;
            };
            log.record(applied);
            let _ = close.send(if goaway { Close::GoAway } else { Close::Drop });
            // Keep the stream open (unanswered) until the connection goes.
            std::future::pending::<()>().await;
        }
    }
}

/// A prior-knowledge HTTP/2 server whose first `raw` connections are answered in raw
/// frames: on the first request it sends GOAWAY(last-stream-id 0, NO_ERROR), that is
/// "this stream was not processed", and closes. With `apply`, it first reads the request's
/// body to its end and records it: a GOAWAY that says less than the server did, which is
/// what hyper's report of a GOAWAY looks like to the stream the server processed last.
/// Later connections go to hyper's HTTP/2 server with `handler`.
pub async fn raw_goaway<F, Fut>(raw: usize, apply: bool, handler: F) -> Server
where
    F: Fn(Request<Incoming>, usize, Log) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<Response<Full<Bytes>>, std::io::Error>> + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let log = Log::default();
    let server_log = log.clone();
    let task = tokio::spawn(async move {
        let mut connections = 0;
        while let Ok((stream, _)) = listener.accept().await {
            connections += 1;
            if connections <= raw {
                let log = server_log.clone();
                tokio::spawn(async move {
                    let _ = answer_with_goaway(stream, apply, &log).await;
                });
            } else {
                serve_hyper(Proto::H2, stream, handler.clone(), server_log.clone());
            }
        }
    });
    Server { addr, log, task }
}

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut out = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

async fn answer_with_goaway(mut stream: TcpStream, apply: bool, log: &Log) -> std::io::Result<()> {
    let mut preface = [0u8; 24];
    stream.read_exact(&mut preface).await?;
    assert_eq!(&preface, PREFACE, "not an HTTP/2 prior-knowledge client");
    // Our SETTINGS: none changed.
    stream.write_all(&frame(0x4, 0, 0, &[])).await?;
    let mut body: Option<Vec<u8>> = None;
    // Read frames until the request is in (its HEADERS, or with `apply` its last DATA).
    loop {
        let mut header = [0u8; 9];
        stream.read_exact(&mut header).await?;
        let len =
            (usize::from(header[0]) << 16) | (usize::from(header[1]) << 8) | usize::from(header[2]);
        let (kind, flags) = (header[3], header[4]);
        let end_stream = flags & 0x1 != 0;
        let mut payload = vec![0u8; len];
        stream.read_exact(&mut payload).await?;
        let request_in = match kind {
            // SETTINGS from the client: acknowledge it.
            0x4 if flags & 0x1 == 0 => {
                stream.write_all(&frame(0x4, 0x1, 0, &[])).await?;
                false
            }
            0x1 if body.is_none() => {
                log.next();
                body = Some(Vec::new());
                !apply || end_stream
            }
            // DATA of the request (hyper never pads it).
            0x0 => {
                body.get_or_insert_with(Vec::new)
                    .extend_from_slice(&payload);
                end_stream
            }
            _ => false,
        };
        if request_in {
            break;
        }
    }
    if apply {
        log.record(Applied {
            method: http::Method::POST,
            path: String::from("(raw frames)"),
            headers: HeaderMap::new(),
            body: Bytes::from(body.unwrap_or_default()),
            trailers: None,
        });
    }
    let mut goaway = Vec::new();
    goaway.extend_from_slice(&0u32.to_be_bytes()); // last-stream-id: none processed
    goaway.extend_from_slice(&0u32.to_be_bytes()); // NO_ERROR
    stream.write_all(&frame(0x7, 0, 0, &goaway)).await?;
    stream.flush().await?;
    // Give the client a moment to read it before the close.
    tokio::time::sleep(Duration::from_millis(20)).await;
    Ok(())
}

/// How a case's logical requests are driven.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// One after another, awaited directly by the test's task.
    Direct,
    /// All at once, each in its own `tokio::spawn`ed task.
    Spawned,
}

/// Runs `case(run)` `runs` times in `mode`, propagating the first failure.
pub async fn repeat<F, Fut>(mode: Mode, runs: usize, case: F)
where
    F: Fn(usize) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    match mode {
        Mode::Direct => {
            for run in 0..runs {
                case(run).await;
            }
        }
        Mode::Spawned => {
            let tasks: Vec<_> = (0..runs).map(|run| tokio::spawn(case(run))).collect();
            for task in tasks {
                if let Err(error) = task.await {
                    std::panic::resume_unwind(error.into_panic());
                }
            }
        }
    }
}

/// Runs `body(mode)` on a current-thread and on a multi-thread runtime, each in both
/// modes, each within `limit` (a hung case fails instead of blocking the suite).
pub fn on_every_runtime<F, Fut>(limit: Duration, body: F)
where
    F: Fn(Mode) -> Fut,
    Fut: Future<Output = ()>,
{
    for multi in [false, true] {
        let runtime = if multi {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
        } else {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
        }
        .unwrap();
        for mode in [Mode::Direct, Mode::Spawned] {
            runtime.block_on(async {
                if tokio::time::timeout(limit, body(mode)).await.is_err() {
                    panic!("{mode:?} on the multi-thread={multi} runtime took over {limit:?}");
                }
            });
        }
    }
}
