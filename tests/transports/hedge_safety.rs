//! Which requests are hedged, and when the hedge goes, over real hyper HTTP/1 and HTTP/2
//! servers and real hyper-util clients on 127.0.0.1, on both runtimes, awaited and spawned:
//!
//! - a DELETE, and a PUT with `If-Match`, are sent once under a hedging policy; under one
//!   that assumes its requests idempotent they are hedged, and the hedge, finding the first
//!   attempt's work already done, gets a 404 (a 412) that wins over the first attempt's
//!   success: why hedging a write is left to the route's owner;
//! - a hedge goes at its delay while the first attempt is still connecting, before its
//!   transport read a byte of the body, when the body's size is known to fit the replay
//!   cap (an exact length, or an upper bound), and the server gets that body once, whole.
#![allow(clippy::disallowed_methods)] // tokio's paused clock and sleeps, or real time

use crate::common;
use tower::ServiceExt;

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use common::transport::{
    Proto, Script, Server, Step, TransportClient, apply, hyper_server, on_every_runtime, read_all,
    repeat, status,
};
use http::header::{ETAG, IF_MATCH};
use http::{Method, Request, Response, Uri};
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tower::{BoxError, Layer, Service};
use tower_http_retry::{
    Attempt, AttemptOutcome, Hedging, ReplayBody, RetryInfo, RetryLayer, RetryPolicy,
};

/// Runs of each case in each of the four ways (two runtimes, awaited and spawned).
const RUNS: usize = 12;
/// A hung case fails rather than blocking the suite.
const LIMIT: Duration = Duration::from_secs(60);
/// When the hedge goes.
const HEDGE_AFTER: Duration = Duration::from_millis(50);
/// How long the server takes to answer a write it applied.
const SLOW_ANSWER: Duration = Duration::from_millis(300);
/// How long the stalled connection takes.
const STALL: Duration = Duration::from_secs(2);

/// A hedging policy: a second attempt after 50 ms without an answer.
fn hedging() -> RetryPolicy {
    RetryPolicy::default()
        .max_attempts(2)
        .hedge(Hedging::after(HEDGE_AFTER))
}

fn info<B>(response: &Response<B>) -> RetryInfo {
    response.extensions().get::<RetryInfo>().cloned().unwrap()
}

fn io_error(error: hyper::Error) -> std::io::Error {
    std::io::Error::other(error.to_string())
}

/// The server's item and document, and the document's ETags.
const ITEM: &str = "/items/1";
const DOC: &str = "/doc";
const V1: &str = "\"v1\"";
const V2: &str = "\"v2\"";
const NEW_DOC: &[Step] = &[Step::Data(b"{\"title\":\"second version\"}")];

/// A server holding the item `ITEM` and the document `DOC` (ETag `V1`). A DELETE of the
/// item removes it at once and answers 204 after `SLOW_ANSWER`; once it is gone, a DELETE
/// answers 404 at once. A PUT of the document whose `If-Match` names its ETag updates it at
/// once (ETag `V2`) and answers 200 after `SLOW_ANSWER`; any other PUT answers 412 at once.
/// A GET of `/ping` answers 200. Every request is read in full and recorded before it is
/// applied.
async fn resource_server(proto: Proto) -> Server {
    let item = Arc::new(AtomicBool::new(true));
    let etag = Arc::new(Mutex::new(V1));
    hyper_server(proto, move |req: Request<Incoming>, _, log| {
        let (item, etag) = (Arc::clone(&item), Arc::clone(&etag));
        async move {
            let (parts, body) = req.into_parts();
            let applied = read_all(&parts, body).await.map_err(io_error)?;
            log.record(applied);
            match (&parts.method, parts.uri.path()) {
                (&Method::DELETE, ITEM) => {
                    if !item.swap(false, Ordering::SeqCst) {
                        return Ok(status(404));
                    }
                    tokio::time::sleep(SLOW_ANSWER).await;
                    Ok(Response::builder()
                        .status(204)
                        .body(Full::new(Bytes::new()))
                        .unwrap())
                }
                (&Method::PUT, DOC) => {
                    let updated = {
                        let mut etag = etag.lock().unwrap();
                        let matches = parts
                            .headers
                            .get(IF_MATCH)
                            .is_some_and(|value| value == *etag);
                        if matches {
                            *etag = V2;
                        }
                        matches
                    };
                    if !updated {
                        return Ok(status(412));
                    }
                    tokio::time::sleep(SLOW_ANSWER).await;
                    let mut response = status(200);
                    response
                        .headers_mut()
                        .insert(ETAG, http::HeaderValue::from_static(V2));
                    Ok(response)
                }
                (&Method::GET, "/ping") => Ok(status(200)),
                _ => Ok(status(405)),
            }
        }
    })
    .await
}

/// A hyper-util client whose connection to `server` is made and idle (a request answered
/// on it), with `TCP_NODELAY` as reqwest sets it. The first attempt then reaches the
/// server whole at once, long before the hedge is due. On a new connection it may not: an
/// HTTP/2 handshake on a loaded machine can outlast the hedge's delay (both attempts then
/// go out on it together, in either order), and without `TCP_NODELAY` the frame that ends
/// a streamed body, written apart from the rest, can wait for the server's delayed ACK,
/// some 40 ms.
async fn warm_client(proto: Proto, server: &Server) -> TransportClient {
    let mut http = HttpConnector::new();
    http.set_nodelay(true);
    let client = Client::builder(TokioExecutor::new())
        .http2_only(proto == Proto::H2)
        .build(http);
    let ping = Request::get(server.url("/ping"))
        .body(ReplayBody::new(Script::empty(), 0))
        .unwrap();
    let response = client.request(ping).await.unwrap();
    assert_eq!(response.status(), 200);
    response.into_body().collect().await.unwrap();
    client
}

/// A write the server applies at once and answers slowly.
#[derive(Debug, Clone, Copy)]
enum Write {
    /// DELETE of the item.
    Delete,
    /// PUT of the document with `If-Match: "v1"`.
    ConditionalPut,
}

impl Write {
    fn request(self, server: &Server) -> Request<Script> {
        match self {
            Write::Delete => Request::delete(server.url(ITEM))
                .body(Script::empty())
                .unwrap(),
            Write::ConditionalPut => Request::put(server.url(DOC))
                .header(IF_MATCH, V1)
                .body(Script::new(NEW_DOC))
                .unwrap(),
        }
    }

    fn method(self) -> Method {
        match self {
            Write::Delete => Method::DELETE,
            Write::ConditionalPut => Method::PUT,
        }
    }

    /// What the first attempt's success answers.
    fn success(self) -> u16 {
        match self {
            Write::Delete => 204,
            Write::ConditionalPut => 200,
        }
    }

    /// What a second copy answers once the first was applied.
    fn conflict(self) -> u16 {
        match self {
            Write::Delete => 404,
            Write::ConditionalPut => 412,
        }
    }
}

/// The copies of `write` the server read and recorded, each checked to be whole.
fn copies(server: &Server, write: Write, context: &str) -> usize {
    let copies: Vec<_> = server
        .log
        .applied()
        .into_iter()
        .filter(|applied| applied.method == write.method())
        .collect();
    let body = match write {
        Write::Delete => Bytes::new(),
        Write::ConditionalPut => Script::bytes(NEW_DOC),
    };
    assert!(
        copies.iter().all(|copy| copy.body == body),
        "{context}: {copies:?}"
    );
    copies.len()
}

/// Under the hedging policy as it is, the write is sent once: the caller gets its slow
/// success, and the server sees one copy.
async fn sent_once(proto: Proto, write: Write, run: usize) {
    let server = resource_server(proto).await;
    let context = format!("{proto:?} {write:?} run {run}");
    let started = Instant::now();
    let response = RetryLayer::new()
        .policy(hedging())
        .layer(warm_client(proto, &server).await)
        .oneshot(write.request(&server))
        .await
        .unwrap_or_else(|e| panic!("{context}: {e}"));
    let elapsed = started.elapsed();
    let info = info(&response);
    assert_eq!(
        response.status().as_u16(),
        write.success(),
        "{context}: {info:?}"
    );
    assert_eq!(
        (
            info.attempts(),
            info.retries()
                .iter()
                .filter(|r| r.kind == tower_http_retry::AttemptKind::Hedge)
                .count(),
            info.outcomes().next().unwrap()
        ),
        (1, 0, AttemptOutcome::Response(response.status())),
        "{context}: {info:?}"
    );
    // The answer came after the server's delay: long after a hedge would have gone.
    assert!(
        elapsed >= SLOW_ANSWER,
        "{context}: answered after {elapsed:?}"
    );
    assert_eq!(
        copies(&server, write, &context),
        1,
        "{context}: a second copy"
    );
    if let Write::ConditionalPut = write {
        assert_eq!(
            response.headers().get(ETAG).map(|v| v.as_bytes()),
            Some(V2.as_bytes()),
            "{context}"
        );
    }
}

/// Under a policy that assumes its requests idempotent, the write is hedged at 50 ms; the
/// first copy was applied, so the hedge's conflict comes at once and wins, and the first
/// attempt, still waiting for its success, is cancelled.
async fn hedged_when_assumed(proto: Proto, write: Write, run: usize) {
    let server = resource_server(proto).await;
    let context = format!("{proto:?} {write:?} run {run}");
    let response = RetryLayer::new()
        .policy(hedging().assume_idempotent(true))
        .layer(warm_client(proto, &server).await)
        .oneshot(write.request(&server))
        .await
        .unwrap_or_else(|e| panic!("{context}: {e}"));
    let info = info(&response);
    assert_eq!(
        response.status().as_u16(),
        write.conflict(),
        "{context}: {info:?}"
    );
    assert_eq!(
        (
            info.attempts(),
            info.retries()
                .iter()
                .filter(|r| r.kind == tower_http_retry::AttemptKind::Hedge)
                .count(),
            info.returned(),
            info.outcomes().next().unwrap()
        ),
        (2, 1, Some(2), AttemptOutcome::Cancelled),
        "{context}: {info:?}"
    );
    assert_eq!(
        copies(&server, write, &context),
        2,
        "{context}: not both applied"
    );
}

fn write_case(write: Write) {
    for proto in [Proto::H1, Proto::H2] {
        on_every_runtime(LIMIT, |mode| {
            repeat(mode, RUNS, move |run| async move {
                sent_once(proto, write, run).await;
                hedged_when_assumed(proto, write, run).await;
            })
        });
    }
}

#[test]
fn a_delete_is_hedged_only_under_a_policy_that_assumes_it_idempotent() {
    write_case(Write::Delete);
}

#[test]
fn a_conditional_put_is_hedged_only_under_a_policy_that_assumes_it_idempotent() {
    write_case(Write::ConditionalPut);
}

/// hyper-util's `HttpConnector`, its first connection made only after `stall` (an attempt
/// waiting for it is stuck before its transport polls its body), the others at once.
#[derive(Clone)]
struct StallFirst {
    http: HttpConnector,
    stall: Duration,
    /// Connections asked for.
    asked: Arc<AtomicUsize>,
    /// Connections made.
    made: Arc<AtomicUsize>,
}

impl StallFirst {
    fn new(stall: Duration) -> Self {
        let mut http = HttpConnector::new();
        http.set_nodelay(true);
        Self {
            http,
            stall,
            asked: Arc::default(),
            made: Arc::default(),
        }
    }

    /// Connections asked for and made.
    fn counts(&self) -> (usize, usize) {
        (
            self.asked.load(Ordering::SeqCst),
            self.made.load(Ordering::SeqCst),
        )
    }
}

type Connecting = Pin<Box<dyn Future<Output = Result<TokioIo<TcpStream>, BoxError>> + Send>>;

impl Service<Uri> for StallFirst {
    type Response = TokioIo<TcpStream>;
    type Error = BoxError;
    type Future = Connecting;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.http.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let stall = match self.asked.fetch_add(1, Ordering::SeqCst) {
            0 => self.stall,
            _ => Duration::ZERO,
        };
        let mut http = self.http.clone();
        let made = Arc::clone(&self.made);
        Box::pin(async move {
            tokio::time::sleep(stall).await;
            let io = http.call(uri).await?;
            made.fetch_add(1, Ordering::SeqCst);
            Ok(io)
        })
    }
}

fn stalled_client<B>(proto: Proto, connector: StallFirst) -> Client<StallFirst, ReplayBody<B>>
where
    B: Body<Data = Bytes, Error = Infallible> + Send + Unpin + 'static,
{
    Client::builder(TokioExecutor::new())
        .http2_only(proto == Proto::H2)
        .build(connector)
}

/// Over HTTP/2 hyper-util's pool shares one connection per host: a hedge through the
/// client whose connection is still being made would wait for it too. So the first
/// attempt (it has no `Attempt` extension) goes through `first`, every later one through
/// `later`.
struct ByAttempt<B> {
    first: Client<StallFirst, ReplayBody<B>>,
    later: Client<StallFirst, ReplayBody<B>>,
}

impl<B> Clone for ByAttempt<B> {
    fn clone(&self) -> Self {
        Self {
            first: self.first.clone(),
            later: self.later.clone(),
        }
    }
}

impl<B> Service<Request<ReplayBody<B>>> for ByAttempt<B>
where
    B: Body<Data = Bytes, Error = Infallible> + Send + Unpin + 'static,
{
    type Response = Response<Incoming>;
    type Error = hyper_util::client::legacy::Error;
    type Future = hyper_util::client::legacy::ResponseFuture;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<ReplayBody<B>>) -> Self::Future {
        match request.extensions().get::<Attempt>() {
            None => self.first.request(request),
            Some(_) => self.later.request(request),
        }
    }
}

/// The largest size the bounded body says it may have.
const BOUND: u64 = 64;
const HELLO: &[u8] = b"hello world";

type Chunks = Pin<Box<dyn futures_util::Stream<Item = Result<Frame<Bytes>, Infallible>> + Send>>;

/// A streaming body of two chunks whose size hint has an upper bound (`BOUND`) and no
/// exact length: a `StreamBody`, which knows nothing of its size, under the hint a body
/// read from a length-limited source gives.
struct Bounded(StreamBody<Chunks>);

impl Bounded {
    fn new() -> Self {
        let chunks = futures_util::stream::unfold(0u8, |step| async move {
            match step {
                0 => Some((Ok(Frame::data(Bytes::from_static(b"hello "))), 1)),
                1 => {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    Some((Ok(Frame::data(Bytes::from_static(b"world"))), 2))
                }
                _ => None,
            }
        });
        Self(StreamBody::new(Box::pin(chunks)))
    }
}

impl Body for Bounded {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Pin::new(&mut self.0).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let mut hint = SizeHint::new();
        hint.set_upper(BOUND);
        hint
    }
}

/// What the stuck request sends.
#[derive(Debug, Clone, Copy)]
enum Sent {
    /// A PUT of a `Full` body: its exact length is known.
    Full,
    /// A PUT of a `Bounded` body: an upper bound is known.
    Bounded,
    /// A GET without a body.
    Get,
}

async fn first_attempt_stuck(proto: Proto, sent: Sent, run: usize) {
    let context = format!("{proto:?} {sent:?} run {run}");
    match sent {
        Sent::Full => {
            let body = Full::new(Bytes::from_static(HELLO));
            stuck(proto, Method::PUT, body, HELLO, context).await
        }
        Sent::Bounded => stuck(proto, Method::PUT, Bounded::new(), HELLO, context).await,
        Sent::Get => {
            let body = Full::new(Bytes::new());
            stuck(proto, Method::GET, body, b"", context).await
        }
    }
}

/// The first attempt waits `STALL` for its connection; the hedge, after 50 ms, gets one at
/// once, sends the whole body, and its answer is returned long before the first attempt
/// could have sent anything. The server gets one request, with the whole body.
async fn stuck<B>(proto: Proto, method: Method, body: B, expected: &[u8], context: String)
where
    B: Body<Data = Bytes, Error = Infallible> + Send + Unpin + 'static,
{
    let server = hyper_server(proto, |req: Request<Incoming>, _, log| async move {
        apply(req, &log, 200).await
    })
    .await;
    let layer = RetryLayer::new().policy(hedging().assume_idempotent(true));
    let request = Request::builder()
        .method(method.clone())
        .uri(server.url(DOC))
        .body(body)
        .unwrap();
    let started = Instant::now();
    let (result, connections) = match proto {
        Proto::H1 => {
            let connector = StallFirst::new(STALL);
            let client = stalled_client::<B>(proto, connector.clone());
            let result = layer.layer(client).oneshot(request).await;
            (result, vec![connector.counts()])
        }
        Proto::H2 => {
            let stalled = StallFirst::new(STALL);
            let fresh = StallFirst::new(Duration::ZERO);
            let inner = ByAttempt {
                first: stalled_client::<B>(proto, stalled.clone()),
                later: stalled_client::<B>(proto, fresh.clone()),
            };
            let result = layer.layer(inner).oneshot(request).await;
            (result, vec![stalled.counts(), fresh.counts()])
        }
    };
    let elapsed = started.elapsed();
    let response: Response<Incoming> = result.unwrap_or_else(|e| panic!("{context}: {e}"));
    let info = info(&response);
    assert_eq!(response.status().as_u16(), 200, "{context}: {info:?}");
    assert!(
        elapsed < Duration::from_secs(1),
        "{context}: answered after {elapsed:?}, not by a hedge at its delay: {info:?}"
    );
    assert_eq!(
        (
            info.retries()
                .iter()
                .filter(|r| r.kind == tower_http_retry::AttemptKind::Hedge)
                .count(),
            info.returned(),
            info.outcomes().next().unwrap()
        ),
        (1, Some(2), AttemptOutcome::Cancelled),
        "{context}: {info:?}"
    );
    let applied = server.log.applied();
    assert_eq!(applied.len(), 1, "{context}: {applied:?}");
    assert_eq!(
        (&applied[0].method, &applied[0].body[..]),
        (&method, expected),
        "{context}"
    );
    // The stalled connection was asked for and never made; the hedge's was made at once.
    let expected_connections = match proto {
        Proto::H1 => vec![(2, 1)],
        Proto::H2 => vec![(1, 0), (1, 1)],
    };
    assert_eq!(connections, expected_connections, "{context}");
}

fn stuck_case(proto: Proto, sent: Sent) {
    on_every_runtime(LIMIT, |mode| {
        repeat(mode, RUNS, move |run| first_attempt_stuck(proto, sent, run))
    });
}

#[test]
fn over_http1_a_full_body_is_hedged_while_the_first_attempt_connects() {
    stuck_case(Proto::H1, Sent::Full);
}

#[test]
fn over_http1_a_bounded_stream_is_hedged_while_the_first_attempt_connects() {
    stuck_case(Proto::H1, Sent::Bounded);
}

#[test]
fn over_http1_a_get_is_hedged_while_the_first_attempt_connects() {
    stuck_case(Proto::H1, Sent::Get);
}

#[test]
fn over_http2_a_full_body_is_hedged_while_the_first_attempt_connects() {
    stuck_case(Proto::H2, Sent::Full);
}

#[test]
fn over_http2_a_bounded_stream_is_hedged_while_the_first_attempt_connects() {
    stuck_case(Proto::H2, Sent::Bounded);
}

#[test]
fn over_http2_a_get_is_hedged_while_the_first_attempt_connects() {
    stuck_case(Proto::H2, Sent::Get);
}
