//! Test doubles: a scripted mock service, and a hyper server on 127.0.0.1.
#![allow(dead_code)]
#![allow(clippy::disallowed_methods)] // tokio's paused clock and sleeps, or real time

pub mod cut_proxy;
pub mod files;
pub mod manual;
pub mod nginx;
pub mod server;
pub mod transport;

use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Full, StreamBody};
use tokio::time::Instant;
use tower::{BoxError, Service};
use tower_http_retry::ReplayBody;

/// A test whose server (nginx, Python's grpcio) is not installed: under `CI=true` it fails;
/// elsewhere it says so on the terminal and the caller returns early. The line is written
/// to the process's stderr directly: libtest captures `eprintln!` (and shows it only for a
/// failed test), so a skip said that way would pass unseen as `ok`.
pub fn missing(test: &str, what: &str, install: &str) {
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{what} is required under CI=true ({install})");
    }
    use std::io::Write as _;
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED {test}: {what} not found ({install}, or run .ci/run)"
    );
}

/// The mock's response future.
pub type Answer = Pin<Box<dyn Future<Output = Result<Response<Full<Bytes>>, BoxError>> + Send>>;

/// What the mock does for one call.
pub enum Reply {
    Status(u16),
    Headers(u16, Vec<(&'static str, String)>),
    Error(Box<dyn Fn() -> BoxError + Send + Sync>),
    /// Answer after a delay (paused time makes it instant in tests).
    Slow(Duration, Box<Reply>),
}

impl Reply {
    pub fn error<E, F>(f: F) -> Self
    where
        F: Fn() -> E + Send + Sync + 'static,
        E: Into<BoxError>,
    {
        Reply::Error(Box::new(move || f().into()))
    }
}

/// One request as the mock saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: Method,
    pub headers: HeaderMap,
    pub body: Bytes,
    pub trailers: Option<HeaderMap>,
    pub at: Instant,
}

#[derive(Default)]
struct State {
    script: Mutex<VecDeque<Reply>>,
    seen: Mutex<Vec<Seen>>,
    calls: AtomicUsize,
    /// How many more times `poll_ready` answers `Pending` (after the first call).
    not_ready: AtomicUsize,
    ready_polls: AtomicUsize,
    skip_body: AtomicBool,
}

/// A scripted service: answers each call with the next `Reply` (200 once the script runs
/// out), after reading the whole request body, and records what it saw.
#[derive(Clone, Default)]
pub struct Mock {
    state: Arc<State>,
}

impl Mock {
    pub fn new(script: impl IntoIterator<Item = Reply>) -> Self {
        let mock = Mock::default();
        mock.state.script.lock().unwrap().extend(script);
        mock
    }

    pub fn statuses(codes: &[u16]) -> Self {
        Self::new(codes.iter().map(|&c| Reply::Status(c)))
    }

    pub fn calls(&self) -> usize {
        self.state.calls.load(Ordering::SeqCst)
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.state.seen.lock().unwrap().clone()
    }

    /// After the first call, `poll_ready` answers `Pending` this many times before `Ready`.
    pub fn not_ready_for(&self, polls: usize) {
        self.state.not_ready.store(polls, Ordering::SeqCst);
    }

    pub fn ready_polls(&self) -> usize {
        self.state.ready_polls.load(Ordering::SeqCst)
    }

    /// Answer without reading the request body.
    pub fn skip_body(&self) {
        self.state.skip_body.store(true, Ordering::SeqCst);
    }
}

impl<B> Service<Request<ReplayBody<B>>> for Mock
where
    B: Body + Unpin + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    type Response = Response<Full<Bytes>>;
    type Error = BoxError;
    type Future = Answer;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.state.ready_polls.fetch_add(1, Ordering::SeqCst);
        let left = self.state.not_ready.load(Ordering::SeqCst);
        if self.calls() > 0 && left > 0 {
            self.state.not_ready.store(left - 1, Ordering::SeqCst);
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<ReplayBody<B>>) -> Self::Future {
        let state = Arc::clone(&self.state);
        state.calls.fetch_add(1, Ordering::SeqCst);
        let reply = state.script.lock().unwrap().pop_front();
        Box::pin(async move {
            let (parts, body) = request.into_parts();
            let (bytes, trailers) = if state.skip_body.load(Ordering::SeqCst) {
                drop(body);
                (Bytes::new(), None)
            } else {
                let collected = body.collect().await.map_err(Into::into)?;
                let trailers = collected.trailers().cloned();
                (collected.to_bytes(), trailers)
            };
            state.seen.lock().unwrap().push(Seen {
                method: parts.method,
                headers: parts.headers,
                body: bytes,
                trailers,
                at: Instant::now(),
            });
            answer(reply.unwrap_or(Reply::Status(200))).await
        })
    }
}

fn answer(reply: Reply) -> Answer {
    Box::pin(async move {
        match reply {
            Reply::Status(code) => Ok(response(code, &[])),
            Reply::Headers(code, headers) => Ok(response(code, &headers)),
            Reply::Error(make) => Err(make()),
            Reply::Slow(delay, reply) => {
                tokio::time::sleep(delay).await;
                answer(*reply).await
            }
        }
    })
}

pub fn response(code: u16, headers: &[(&'static str, String)]) -> Response<Full<Bytes>> {
    let mut builder = Response::builder().status(StatusCode::from_u16(code).unwrap());
    for (name, value) in headers {
        builder = builder.header(*name, value);
    }
    builder
        .body(Full::new(Bytes::from(format!("status {code}"))))
        .unwrap()
}

pub fn get(uri: &str) -> Request<Full<Bytes>> {
    Request::get(uri).body(Full::new(Bytes::new())).unwrap()
}

pub fn request(method: Method, uri: &str, body: &'static [u8]) -> Request<Full<Bytes>> {
    Request::builder()
        .method(method)
        .uri(uri)
        .body(Full::new(Bytes::from_static(body)))
        .unwrap()
}

pub type ChunkStream =
    StreamBody<futures_util::stream::Iter<std::vec::IntoIter<Result<Frame<Bytes>, Infallible>>>>;

/// A streaming body of `chunks`, with no size hint.
pub fn stream(chunks: Vec<Bytes>) -> ChunkStream {
    StreamBody::new(futures_util::stream::iter(
        chunks
            .into_iter()
            .map(|c| Ok(Frame::data(c)))
            .collect::<Vec<_>>(),
    ))
}

/// Polls `future` once, from inside a task, and says whether it finished.
pub async fn poll_once<F: Future + Unpin>(future: &mut F) -> Poll<F::Output> {
    std::future::poll_fn(|cx| Poll::Ready(Pin::new(&mut *future).poll(cx))).await
}

/// The last error inside the layer's `RetryError` (or the error itself if it is none).
pub fn last(error: &tower::BoxError) -> &(dyn std::error::Error + Send + Sync + 'static) {
    match error.downcast_ref::<tower_http_retry::RetryError>() {
        Some(retry) => retry.get_ref(),
        None => &**error,
    }
}
