//! The shared body of hedged requests: hedged PUTs of a
//! streaming body of many small chunks arriving over time, through a real hyper-util
//! client, against real hyper HTTP/1 and HTTP/2 servers on 127.0.0.1 that record every body
//! they read whole. Every body a server read whole must be the caller's body exactly
//! (trailers too): a truncated body that looks complete would show here.
//!
//! Cases: every attempt read whole and answered slowly (hedges race over the shared body);
//! the first attempt answered 503 at once while the server keeps reading its body (its
//! transport still reads the shared body after its answer); a small replay cap passed
//! mid-way (the attempt that reads past it goes on alone, the others are cut off); trailers.
//!
//! Then the edges: the caller's body failing while an attempt no longer in flight (answered
//! early) reads it ends the request, the hedge in flight dropped (over a scripted service,
//! and over real transports); an attempt no longer in flight whose transport still reads
//! the body when another reads past the cap waits, never sending a truncated body; under
//! `max_attempts(1)` the throttle does not hear the caller's own body failure; a TLS alert
//! under hyper is final.
#![allow(clippy::disallowed_methods)] // tokio's paused clock and sleeps, or real time

use crate::common;
use tower::ServiceExt;

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use common::transport::{
    Applied, Log, Proto, Script, Step, hyper_server, on_every_runtime, read_all, repeat, status,
};
use http::{Method, Request, Response, Uri};
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpStream;
use tokio::time::Sleep;
use tower::{BoxError, Layer, Service};
use tower_http_retry::{
    Attempt, Hedging, ReplayBody, RetryInfo, RetryLayer, RetryPolicy, StopReason, Throttle,
};

/// Runs of each case in each of the four ways (two runtimes, awaited and spawned).
const RUNS: usize = 25;
/// All the runs of one way.
const LIMIT: Duration = Duration::from_secs(120);
/// One request.
const RUN_LIMIT: Duration = Duration::from_secs(10);

/// The body's bytes: a pattern that does not repeat at a chunk's length.
const TOTAL: usize = 4000;
static BODY: [u8; TOTAL] = pattern();

const fn pattern() -> [u8; TOTAL] {
    let mut out = [0u8; TOTAL];
    let mut i = 0;
    while i < TOTAL {
        out[i] = (i % 251) as u8;
        i += 1;
    }
    out
}

/// `BODY` in chunks of 1 to 97 bytes, a 1 ms pause after every fourth: some 80 chunks
/// over some 20 ms, while hedges go every 5 ms.
fn steps(trailers: bool) -> Vec<Step> {
    let mut steps = Vec::new();
    let (mut at, mut n) = (0, 0);
    while at < TOTAL {
        let len = (1 + (n * 37) % 97).min(TOTAL - at);
        steps.push(Step::Data(&BODY[at..at + len]));
        at += len;
        n += 1;
        if n % 4 == 0 {
            steps.push(Step::Wait(Duration::from_millis(1)));
        }
    }
    if trailers {
        steps.push(Step::Trailers("x-checksum", "c0ffee"));
    }
    steps
}

fn policy() -> RetryPolicy {
    RetryPolicy::default()
        .max_attempts(3)
        .assume_idempotent(true)
        .hedge(Hedging::after(Duration::from_millis(5)))
}

fn nodelay() -> HttpConnector {
    let mut http = HttpConnector::new();
    http.set_nodelay(true);
    http
}

fn client<B>(proto: Proto) -> Client<HttpConnector, ReplayBody<B>>
where
    B: Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<BoxError>,
{
    Client::builder(TokioExecutor::new())
        .http2_only(proto == Proto::H2)
        .build(nodelay())
}

/// What the server does with request `index` (across connections).
#[derive(Debug, Clone, Copy)]
enum Behave {
    /// Read the body whole, record it, answer 200 after this many ms.
    Apply(u64),
    /// Answer 503 at once, and go on reading the body in a task of its own, recording it
    /// if it comes whole.
    Early503,
}

/// The server of a case: `plan(index)` says what to do with each request.
async fn server(proto: Proto, plan: fn(usize) -> Behave) -> common::transport::Server {
    hyper_server(
        proto,
        move |req: Request<Incoming>, index, log: Log| async move {
            match plan(index) {
                Behave::Apply(ms) => {
                    let (parts, body) = req.into_parts();
                    let applied = read_all(&parts, body)
                        .await
                        .map_err(|e| std::io::Error::other(e.to_string()))?;
                    log.record(applied);
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                    Ok(status(200))
                }
                Behave::Early503 => {
                    let (parts, body) = req.into_parts();
                    tokio::spawn(async move {
                        if let Ok(applied) = read_all(&parts, body).await {
                            log.record(applied);
                        }
                    });
                    Ok(status(503))
                }
            }
        },
    )
    .await
}

/// Every body the server read whole is the caller's, trailers included; returns how many.
fn check_whole(context: &str, applied: &[Applied], trailers: bool) -> usize {
    for (i, a) in applied.iter().enumerate() {
        assert!(
            a.body[..] == BODY[..],
            "{context}: body {i} read whole is {} bytes, not the caller's {TOTAL}{}",
            a.body.len(),
            match a.body.len() < TOTAL && BODY.starts_with(&a.body) {
                true => " (a truncated body that looked complete)",
                false => "",
            }
        );
        let got = a.trailers.as_ref().and_then(|t| t.get("x-checksum"));
        match trailers {
            true => assert_eq!(
                got.map(|v| v.as_bytes()),
                Some(&b"c0ffee"[..]),
                "{context}: body {i} lost its trailers"
            ),
            false => assert!(got.is_none(), "{context}: trailers from nowhere"),
        }
    }
    applied.len()
}

/// The caller's body: a [`Script`], with its exact length known or not.
struct Caller {
    script: Script,
    exact: Option<u64>,
}

impl Body for Caller {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Pin::new(&mut self.script).poll_frame(cx)
    }

    fn size_hint(&self) -> SizeHint {
        match self.exact {
            Some(len) => SizeHint::with_exact(len),
            None => SizeHint::default(),
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Case {
    proto: Proto,
    plan: fn(usize) -> Behave,
    trailers: bool,
    /// The body says its exact length (hyper then sends `Content-Length` and stops there).
    exact: bool,
    cap: usize,
    /// The status the caller must get, when only one is right.
    expect: Option<u16>,
}

/// Over all the runs of a case: requests, attempts sent, bodies the servers read whole.
#[derive(Default)]
struct Tally {
    runs: AtomicUsize,
    attempts: AtomicUsize,
    whole: AtomicUsize,
}

async fn run_case(case: Case, run: usize, tally: Arc<Tally>) {
    let context = format!("{case:?} run {run}");
    let server = server(case.proto, case.plan).await;
    let mut req = Request::builder()
        .method(Method::PUT)
        .uri(server.url("/doc"))
        .body(Caller {
            script: Script::new(&steps(case.trailers)),
            exact: case.exact.then_some(TOTAL as u64),
        })
        .unwrap();
    if case.trailers {
        req.headers_mut()
            .insert(http::header::TRAILER, "x-checksum".parse().unwrap());
    }
    let layer = RetryLayer::new()
        .policy(RetryPolicy::new().no_gates())
        .policy(policy())
        .max_replay_bytes(case.cap);
    let svc = layer.layer(client::<Caller>(case.proto));
    let result = tokio::time::timeout(RUN_LIMIT, svc.oneshot(req))
        .await
        .unwrap_or_else(|_| panic!("{context}: no answer within {RUN_LIMIT:?}"));
    let response = result.unwrap_or_else(|e| panic!("{context}: {e}"));
    let info = response.extensions().get::<RetryInfo>().cloned().unwrap();
    let code = response.status().as_u16();
    response.into_body().collect().await.unwrap();
    if let Some(expect) = case.expect {
        assert_eq!(code, expect, "{context}: {info:?}");
    }
    // Give the early-answered attempts' transports a moment to finish their bodies.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let whole = check_whole(&context, &server.log.applied(), case.trailers);
    tally.runs.fetch_add(1, Ordering::SeqCst);
    tally
        .attempts
        .fetch_add(info.attempts() as usize, Ordering::SeqCst);
    tally.whole.fetch_add(whole, Ordering::SeqCst);
    if code == 200 {
        assert!(whole >= 1, "{context}: 200 without a whole body: {info:?}");
    }
}

fn run(case: Case) {
    let tally = Arc::new(Tally::default());
    on_every_runtime(LIMIT, |mode| {
        let tally = Arc::clone(&tally);
        repeat(mode, RUNS, move |run| {
            run_case(case, run, Arc::clone(&tally))
        })
    });
    let (runs, attempts, whole) = (
        tally.runs.load(Ordering::SeqCst),
        tally.attempts.load(Ordering::SeqCst),
        tally.whole.load(Ordering::SeqCst),
    );
    use std::io::Write as _;
    let _ = writeln!(
        std::io::stderr(),
        "{:?} trailers={} exact={} cap={}: {runs} runs, {attempts} attempts, {whole} bodies read whole",
        case.proto,
        case.trailers,
        case.exact,
        case.cap
    );
    // Not vacuous: hedges went, and more than one attempt sent the body whole.
    assert!(attempts > runs, "{case:?}: no hedge in {runs} runs");
    assert!(
        whole > runs / 2,
        "{case:?}: {whole} whole bodies in {runs} runs"
    );
}

fn all_apply(_: usize) -> Behave {
    Behave::Apply(30)
}

fn first_early(index: usize) -> Behave {
    match index {
        0 => Behave::Early503,
        _ => Behave::Apply(20),
    }
}

fn every_early_but_last(index: usize) -> Behave {
    match index {
        0 | 1 => Behave::Early503,
        _ => Behave::Apply(5),
    }
}

const BIG_CAP: usize = 64 * 1024;
/// Passed a quarter of the way through the body.
const SMALL_CAP: usize = 1000;

#[test]
fn hedges_racing_over_a_shared_streaming_body_each_send_it_whole() {
    for proto in [Proto::H1, Proto::H2] {
        for trailers in [false, true] {
            run(Case {
                proto,
                plan: all_apply,
                trailers,
                exact: false,
                cap: BIG_CAP,
                expect: Some(200),
            });
        }
        // An exact length: Content-Length, no trailers (hyper's HTTP/1 sends none then).
        run(Case {
            proto,
            plan: all_apply,
            trailers: false,
            exact: true,
            cap: BIG_CAP,
            expect: Some(200),
        });
    }
}

#[test]
fn early_answers_while_the_transport_still_reads_the_shared_body() {
    for proto in [Proto::H1, Proto::H2] {
        for trailers in [false, true] {
            for plan in [first_early as fn(usize) -> Behave, every_early_but_last] {
                run(Case {
                    proto,
                    plan,
                    trailers,
                    exact: false,
                    cap: BIG_CAP,
                    expect: Some(200),
                });
            }
        }
        run(Case {
            proto,
            plan: first_early,
            trailers: false,
            exact: true,
            cap: BIG_CAP,
            expect: Some(200),
        });
    }
}

#[test]
fn a_shared_body_passing_a_small_cap_mid_way_is_never_truncated() {
    for proto in [Proto::H1, Proto::H2] {
        for trailers in [false, true] {
            run(Case {
                proto,
                plan: all_apply,
                trailers,
                exact: false,
                cap: SMALL_CAP,
                expect: Some(200),
            });
            // The attempt answered early may be the one that reads past the cap: the
            // caller then gets its 503 (the others cut off), else the 200.
            run(Case {
                proto,
                plan: first_early,
                trailers,
                exact: false,
                cap: SMALL_CAP,
                expect: None,
            });
        }
    }
}

// ---------------------------------------------------------------------------------------
// The edges.

/// A body that sends "a" at once, then fails after `after`.
struct FailsLater {
    sent: bool,
    after: Duration,
    sleep: Option<Pin<Box<Sleep>>>,
}

impl FailsLater {
    fn new(after: Duration) -> Self {
        Self {
            sent: false,
            after,
            sleep: None,
        }
    }
}

impl Body for FailsLater {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        if !self.sent {
            self.sent = true;
            return Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"a")))));
        }
        let after = self.after;
        let sleep = self
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(after)));
        ready!(sleep.as_mut().poll(cx));
        Poll::Ready(Some(Err(std::io::Error::other(
            "the caller's upload broke",
        ))))
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

type Answer = Pin<Box<dyn Future<Output = Result<Response<Full<Bytes>>, BoxError>> + Send>>;

/// A scripted transport: the first attempt is answered 503 at once while a task of its own
/// goes on reading its body (as hyper's connection task does after an early answer); every
/// later attempt starts reading its body after `later_after`, and is answered 200 once
/// its body is in.
#[derive(Clone)]
struct EarlyThenSlow {
    calls: Arc<AtomicUsize>,
    later_after: Duration,
    /// What became of the first attempt's body, once its reader is done.
    first_body: Arc<Mutex<Option<Result<usize, String>>>>,
}

impl<B> Service<Request<ReplayBody<B>>> for EarlyThenSlow
where
    B: Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<BoxError> + std::fmt::Display,
{
    type Response = Response<Full<Bytes>>;
    type Error = BoxError;
    type Future = Answer;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<ReplayBody<B>>) -> Answer {
        let body = request.into_body();
        if self.calls.fetch_add(1, Ordering::SeqCst) == 0 {
            let first_body = Arc::clone(&self.first_body);
            tokio::spawn(async move {
                let read = match body.collect().await {
                    Ok(collected) => Ok(collected.to_bytes().len()),
                    Err(error) => Err(error.to_string()),
                };
                *first_body.lock().unwrap() = Some(read);
            });
            return Box::pin(async {
                Ok(Response::builder()
                    .status(503)
                    .body(Full::default())
                    .unwrap())
            });
        }
        let wait = self.later_after;
        Box::pin(async move {
            tokio::time::sleep(wait).await;
            body.collect().await.map_err(Into::into)?;
            Ok(Response::new(Full::default()))
        })
    }
}

/// The caller's body fails while the transport of an attempt that was already answered
/// (503, early) reads it. The hedge in flight, which had not yet read that far, cannot go
/// on: the driver drops it, and the request ends with the answer it holds, though neither
/// the policy nor the request has a time limit.
#[tokio::test(start_paused = true)]
async fn a_body_error_read_by_an_answered_attempt_ends_the_request() {
    let service = EarlyThenSlow {
        calls: Arc::default(),
        later_after: Duration::from_millis(50),
        first_body: Arc::default(),
    };
    let layer = RetryLayer::new()
        .policy(RetryPolicy::new().no_gates())
        .policy(
            RetryPolicy::default()
                .max_attempts(2)
                .assume_idempotent(true)
                .hedge(Hedging::after(Duration::from_millis(5))),
        );
    let request = Request::put("http://127.0.0.1/doc")
        .body(FailsLater::new(Duration::from_millis(20)))
        .unwrap();
    let outcome = tokio::time::timeout(
        Duration::from_secs(30),
        layer.layer(service.clone()).oneshot(request),
    )
    .await;
    // The first attempt's reader got the caller's error: the body failed.
    assert!(
        matches!(&*service.first_body.lock().unwrap(), Some(Err(_))),
        "{:?}",
        service.first_body.lock().unwrap()
    );
    assert_eq!(service.calls.load(Ordering::SeqCst), 2);
    let response = outcome
        .expect("the request never ended: the hedge in flight waits for a body that failed")
        .expect("the answer held");
    // The early 503 is what the request got; the hedge was dropped.
    assert_eq!(response.status(), 503);
    let info = response.extensions().get::<RetryInfo>().unwrap();
    assert_eq!(info.stop(), StopReason::BodyNotReplayable, "{info:?}");
    assert_eq!(
        info.outcomes().nth(1),
        Some(tower_http_retry::AttemptOutcome::Cancelled),
        "{info:?}"
    );
}

/// A connector whose every connection is made after `stall`.
#[derive(Clone)]
struct StallLater {
    http: HttpConnector,
    stall: Duration,
}

type Connecting = Pin<Box<dyn Future<Output = Result<TokioIo<TcpStream>, BoxError>> + Send>>;

impl Service<Uri> for StallLater {
    type Response = TokioIo<TcpStream>;
    type Error = BoxError;
    type Future = Connecting;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.http.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let stall = self.stall;
        let mut http = self.http.clone();
        Box::pin(async move {
            tokio::time::sleep(stall).await;
            Ok(http.call(uri).await?)
        })
    }
}

/// The first attempt through one client, the later ones through another (over HTTP/2 the
/// pool would put them on the first attempt's connection).
struct ByAttempt<B> {
    first: Client<StallLater, ReplayBody<B>>,
    later: Client<StallLater, ReplayBody<B>>,
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
    B: Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<BoxError>,
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

fn stalled_client<B>(proto: Proto, stall: Duration) -> Client<StallLater, ReplayBody<B>>
where
    B: Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<BoxError>,
{
    let connector = StallLater {
        http: nodelay(),
        stall,
    };
    Client::builder(TokioExecutor::new())
        .http2_only(proto == Proto::H2)
        .build(connector)
}

/// The same over real transports: the server answers the first attempt 503 at once and
/// goes on reading its body (so hyper's client goes on sending it); the hedge's connection
/// is made 200 ms later, after the caller's body failed (at 50 ms) under the first
/// attempt's transport. The request must end (with an error) soon after; it must not wait
/// for ever.
#[test]
fn over_http1_a_body_error_after_an_early_answer_ends_the_request() {
    body_error_after_an_early_answer(Proto::H1);
}

#[test]
fn over_http2_a_body_error_after_an_early_answer_ends_the_request() {
    body_error_after_an_early_answer(Proto::H2);
}

fn body_error_after_an_early_answer(proto: Proto) {
    {
        on_every_runtime(LIMIT, |mode| {
            repeat(mode, 3, move |run| async move {
                let context = format!("{proto:?} {mode:?} run {run}");
                let server = server(proto, first_early).await;
                let inner = ByAttempt::<FailsLater> {
                    first: stalled_client(proto, Duration::ZERO),
                    later: stalled_client(proto, Duration::from_millis(200)),
                };
                let layer = RetryLayer::new()
                    .policy(RetryPolicy::new().no_gates())
                    .policy(
                        RetryPolicy::default()
                            .max_attempts(2)
                            .assume_idempotent(true)
                            .hedge(Hedging::after(Duration::from_millis(5))),
                    );
                let request = Request::put(server.url("/doc"))
                    .body(FailsLater::new(Duration::from_millis(50)))
                    .unwrap();
                let outcome = tokio::time::timeout(
                    Duration::from_secs(5),
                    layer.layer(inner).oneshot(request),
                )
                .await;
                assert!(
                    outcome.is_ok(),
                    "{context}: no end 5 s after the caller's body failed; the server saw {} \
                     requests and read {} whole",
                    server.log.seen(),
                    server.log.applied().len()
                );
            })
        });
    }
}

/// An attempt already answered (503, early) whose transport still reads the shared body
/// when another attempt reads past the cap cannot follow: its body replays the recorded
/// prefix and then waits, and never ends, which would send a truncated body as if whole.
/// (The driver drops only the attempts in flight; over a real connection, a server that
/// answered early and reads on ends such a request by its own body timeout.)
#[tokio::test(start_paused = true)]
async fn an_answered_attempt_that_cannot_follow_a_body_past_the_cap_never_ends_it_early() {
    let service = EarlyThenSlow {
        calls: Arc::default(),
        later_after: Duration::ZERO,
        first_body: Arc::default(),
    };
    // The first attempt's reader takes its time (its connection is slow to drain): the
    // hedge reads past the cap first.
    let slow_first = SlowFirstReader(service.clone());
    let layer = RetryLayer::new()
        .policy(RetryPolicy::new().no_gates())
        .max_replay_bytes(15)
        .policy(
            RetryPolicy::default()
                .max_attempts(2)
                .assume_idempotent(true)
                .hedge(Hedging::after(Duration::from_millis(5))),
        );
    let body = common::transport::Script::new(&[
        Step::Data(b"0123456789"),
        Step::Wait(Duration::from_millis(100)),
        Step::Data(b"0123456789"),
    ]);
    let request = Request::put("http://127.0.0.1/doc").body(body).unwrap();
    let response = layer.layer(slow_first).oneshot(request).await.unwrap();
    assert_eq!(response.status(), 200);
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!(
        service.first_body.lock().unwrap().is_none(),
        "the first attempt's body ended: {:?}",
        service.first_body.lock().unwrap()
    );
}

/// `EarlyThenSlow`, whose first attempt's reader starts 300 ms late.
#[derive(Clone)]
struct SlowFirstReader(EarlyThenSlow);

impl Service<Request<ReplayBody<Script>>> for SlowFirstReader {
    type Response = Response<Full<Bytes>>;
    type Error = BoxError;
    type Future = Answer;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<ReplayBody<Script>>) -> Answer {
        let inner = &self.0;
        if inner.calls.fetch_add(1, Ordering::SeqCst) == 0 {
            let first_body = Arc::clone(&inner.first_body);
            let body = request.into_body();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(300)).await;
                let Ok(collected) = body.collect().await;
                *first_body.lock().unwrap() = Some(Ok(collected.to_bytes().len()));
            });
            return Box::pin(async {
                Ok(Response::builder()
                    .status(503)
                    .body(Full::default())
                    .unwrap())
            });
        }
        Box::pin(async move {
            let Ok(body) = request.into_body().collect().await;
            assert_eq!(&body.to_bytes()[..], b"01234567890123456789");
            Ok(Response::new(Full::default()))
        })
    }
}

/// The caller's own body failure is not the server's: under `max_attempts(1)` (sent once,
/// its outcome reported to the throttle) as under `max_attempts(2)`, the throttle hears
/// nothing of it, though hyper reports it as a user error that alone would read as a
/// connection failure.
#[test]
fn a_callers_body_failure_is_not_heard_by_the_throttle_whatever_the_attempts() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut lost = Vec::new();
        for attempts in [1, 2] {
            let server = server(Proto::H1, all_apply).await;
            let throttle = Throttle::builder().max_tokens(10.0).token_ratio(0.1).build();
            let layer = RetryLayer::new().policy(
                RetryPolicy::default()
                    .max_attempts(attempts)
                    .no_gates()
                    .gate(throttle.clone()),
            );
            let request = Request::put(server.url("/doc"))
                .body(FailsLater::new(Duration::from_millis(5)))
                .unwrap();
            let result = layer
                .layer(client::<FailsLater>(Proto::H1))
                .oneshot(request)
                .await;
            assert!(result.is_err(), "max_attempts({attempts})");
            lost.push(10.0 - throttle.tokens());
        }
        assert_eq!(
            lost,
            [0.0, 0.0],
            "tokens the throttle lost to the caller's own body failure, under max_attempts(1) and (2)"
        );
    });
}

/// A connection that takes every write, and whose reads fail with `InvalidData` once a
/// request is written: how a TLS stream (rustls, native-tls) reports a fatal alert the
/// server sends after the handshake, e.g. TLS 1.3's client-certificate rejection
/// (`certificate_required`, `bad_certificate`), which the client only reads with the
/// response.
struct AlertAfterRequest {
    written: bool,
    reader: Option<std::task::Waker>,
}

impl tokio::io::AsyncRead for AlertAfterRequest {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        _: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if !self.written {
            self.reader = Some(cx.waker().clone());
            return Poll::Pending;
        }
        Poll::Ready(Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "received fatal alert: CertificateRequired",
        )))
    }
}

impl tokio::io::AsyncWrite for AlertAfterRequest {
    fn poll_write(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.written = true;
        if let Some(reader) = self.reader.take() {
            reader.wake();
        }
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// hyper reports a transport's read error as its own `Kind::Io` error with the `io::Error`
/// as its direct source, whatever the error means. A TLS alert (`InvalidData`) is a
/// refusal, not a broken connection, and repeating the request would get the same
/// refusal: final.
#[tokio::test]
async fn a_tls_alert_under_hyper_is_final() {
    let io = TokioIo::new(AlertAfterRequest {
        written: false,
        reader: None,
    });
    let (mut sender, connection) = hyper::client::conn::http1::handshake(io).await.unwrap();
    let request = Request::get("http://h/")
        .body(http_body_util::Empty::<Bytes>::new())
        .unwrap();
    let (_, response) = tokio::join!(connection, sender.send_request(request));
    let error = response.unwrap_err();
    let cause = std::error::Error::source(&error)
        .and_then(|e| e.downcast_ref::<std::io::Error>())
        .map(std::io::Error::kind);
    assert_eq!(cause, Some(std::io::ErrorKind::InvalidData), "{error:?}");
    use tower_http_retry::classify::{Classification, Classify, DefaultClassifier, Outcome};
    let (head, ()) = Request::new(()).into_parts();
    assert_eq!(
        DefaultClassifier.classify(&head, Outcome::Error(&error)),
        Classification::Done,
        "{error:?}"
    );
}
