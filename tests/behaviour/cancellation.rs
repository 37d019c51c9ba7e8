//! Dropping a response future sends nothing more, whatever state it is in: an attempt in
//! flight (the first or a retry), the wait before a retry, or the wait for the inner
//! service to be ready again. And the layer spawns no task, ever.
//!
//! Each case has a control: the same future, kept instead of dropped, does send the next
//! attempt. So a count that stays put after the drop shows the drop, not a quiet future.
#![allow(clippy::disallowed_methods)] // tokio's paused clock and sleeps, or real time

use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::Body;
use http_body_util::Full;
use tokio::runtime::Handle;
use tower::{Layer, Service, ServiceExt};
use tower_http_retry::{Backoff, Jitter, ReplayBody, RetryLayer, RetryPolicy};

/// What the probe does with one call.
#[derive(Clone, Copy, Debug)]
enum Answer {
    Status(u16),
    /// Never answers.
    Hang,
}

#[derive(Default)]
struct ProbeState {
    script: Mutex<VecDeque<Answer>>,
    calls: AtomicUsize,
    ready_polls: AtomicUsize,
    /// When false, `poll_ready` answers `Pending` once the first call was made.
    ready: AtomicBool,
    /// Attempt futures not yet dropped.
    in_flight: AtomicUsize,
}

/// A service that counts what reaches it.
#[derive(Clone)]
struct Probe {
    state: Arc<ProbeState>,
}

impl Probe {
    fn new(script: &[Answer]) -> Self {
        let state = ProbeState {
            script: Mutex::new(script.iter().copied().collect()),
            ready: AtomicBool::new(true),
            ..ProbeState::default()
        };
        Self {
            state: Arc::new(state),
        }
    }

    fn calls(&self) -> usize {
        self.state.calls.load(Ordering::SeqCst)
    }

    fn ready_polls(&self) -> usize {
        self.state.ready_polls.load(Ordering::SeqCst)
    }

    fn in_flight(&self) -> usize {
        self.state.in_flight.load(Ordering::SeqCst)
    }

    fn set_ready(&self, ready: bool) {
        self.state.ready.store(ready, Ordering::SeqCst);
    }
}

/// One attempt; counts itself in flight until dropped.
struct Attempt {
    answer: Answer,
    state: Arc<ProbeState>,
    request: Request<ReplayBody<Full<Bytes>>>,
}

impl Drop for Attempt {
    fn drop(&mut self) {
        self.state.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Future for Attempt {
    type Output = Result<Response<Full<Bytes>>, Infallible>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // Send the whole body first, as a transport does: an answer that comes before the
        // body was sent makes the request unsafe to replay.
        let body = self.request.body_mut();
        while !body.is_end_stream() {
            match Pin::new(&mut *body).poll_frame(cx) {
                Poll::Ready(Some(Ok(_))) => {}
                Poll::Ready(Some(Err(never))) => match never {},
                Poll::Ready(None) => break,
                Poll::Pending => return Poll::Pending,
            }
        }
        match self.answer {
            Answer::Hang => Poll::Pending,
            Answer::Status(code) => {
                let response = Response::builder()
                    .status(StatusCode::from_u16(code).expect("a status code"))
                    .body(Full::new(Bytes::new()))
                    .expect("a response");
                Poll::Ready(Ok(response))
            }
        }
    }
}

impl Service<Request<ReplayBody<Full<Bytes>>>> for Probe {
    type Response = Response<Full<Bytes>>;
    type Error = Infallible;
    type Future = Attempt;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.state.ready_polls.fetch_add(1, Ordering::SeqCst);
        if self.calls() > 0 && !self.state.ready.load(Ordering::SeqCst) {
            // The test polls by hand, so no waker needs keeping.
            return Poll::Pending;
        }
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<ReplayBody<Full<Bytes>>>) -> Attempt {
        self.state.calls.fetch_add(1, Ordering::SeqCst);
        self.state.in_flight.fetch_add(1, Ordering::SeqCst);
        let answer = self
            .state
            .script
            .lock()
            .unwrap()
            .pop_front()
            .unwrap_or(Answer::Status(200));
        Attempt {
            answer,
            state: Arc::clone(&self.state),
            request,
        }
    }
}

type ResponseFut = Pin<Box<dyn Future<Output = Result<Response<Full<Bytes>>, tower::BoxError>>>>;

/// 3 attempts, 5 s per attempt, waits of exactly 2 s then 4 s, no budget.
async fn start(probe: &Probe, body: &'static [u8]) -> ResponseFut {
    let layer = RetryLayer::new()
        .policy(RetryPolicy::new().no_gates())
        .policy(
            RetryPolicy::default()
                .max_attempts(3)
                .attempt_timeout(Duration::from_secs(5))
                .backoff(
                    Backoff::exponential(Duration::from_secs(1), Duration::from_secs(60))
                        .jitter(Jitter::None),
                ),
        );
    let mut service = layer.layer(probe.clone());
    service.ready().await.expect("the probe is ready");
    let request = Request::put("http://127.0.0.1/items/1")
        .body(Full::new(Bytes::from_static(body)))
        .expect("a request");
    Box::pin(service.call(request))
}

/// Polls once, by hand, so the test sees every intermediate state.
fn poll_once(future: &mut ResponseFut) -> Poll<Result<Response<Full<Bytes>>, tower::BoxError>> {
    future
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
}

fn alive_tasks() -> usize {
    Handle::current().metrics().num_alive_tasks()
}

/// Moves paused time on by `by` and lets anything that was woken run.
async fn advance(by: Duration) {
    tokio::time::advance(by).await;
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

/// After a drop: a day passes, and nothing reaches the probe or is left running.
async fn assert_silent_after_drop(probe: &Probe, calls: usize, ready_polls: usize) {
    assert_eq!(
        probe.in_flight(),
        0,
        "the attempt in flight was dropped with the future"
    );
    probe.set_ready(true);
    for _ in 0..24 {
        advance(Duration::from_secs(3_600)).await;
        assert_eq!(probe.calls(), calls, "a call after the future was dropped");
        assert_eq!(
            probe.ready_polls(),
            ready_polls,
            "poll_ready after the drop"
        );
        assert_eq!(alive_tasks(), 0, "a task outlived the future");
    }
}

/// Puts a fresh future into the state under test and returns it with its probe.
async fn in_first_attempt() -> (Probe, ResponseFut) {
    let probe = Probe::new(&[Answer::Hang]);
    let mut future = start(&probe, b"first").await;
    assert!(poll_once(&mut future).is_pending());
    assert_eq!((probe.calls(), probe.in_flight()), (1, 1));
    (probe, future)
}

async fn waiting() -> (Probe, ResponseFut) {
    let probe = Probe::new(&[Answer::Status(503)]);
    let mut future = start(&probe, b"waiting").await;
    assert!(poll_once(&mut future).is_pending());
    // The 503 came back and the attempt is over: the future sleeps 2 s.
    assert_eq!((probe.calls(), probe.in_flight()), (1, 0));
    advance(Duration::from_millis(1_900)).await;
    assert!(poll_once(&mut future).is_pending());
    assert_eq!(probe.calls(), 1, "still waiting at 1.9 s");
    (probe, future)
}

async fn readying() -> (Probe, ResponseFut) {
    let (probe, mut future) = waiting().await;
    probe.set_ready(false);
    let before = probe.ready_polls();
    advance(Duration::from_millis(200)).await;
    assert!(poll_once(&mut future).is_pending());
    assert!(
        probe.ready_polls() > before,
        "the wait is over: readiness was asked for"
    );
    assert_eq!(probe.calls(), 1, "not ready, not called");
    (probe, future)
}

async fn in_retry() -> (Probe, ResponseFut) {
    let probe = Probe::new(&[Answer::Status(503), Answer::Hang]);
    let mut future = start(&probe, b"retry").await;
    assert!(poll_once(&mut future).is_pending());
    advance(Duration::from_millis(2_100)).await;
    assert!(poll_once(&mut future).is_pending());
    assert_eq!(
        (probe.calls(), probe.in_flight()),
        (2, 1),
        "the retry is in flight"
    );
    (probe, future)
}

// ---- the drops ----

#[tokio::test(start_paused = true)]
async fn dropped_during_the_first_attempt() {
    let (probe, future) = in_first_attempt().await;
    assert_eq!(alive_tasks(), 0);
    drop(future);
    assert_silent_after_drop(&probe, 1, probe.ready_polls()).await;
}

#[tokio::test(start_paused = true)]
async fn dropped_while_waiting_to_retry() {
    let (probe, future) = waiting().await;
    assert_eq!(alive_tasks(), 0);
    drop(future);
    assert_silent_after_drop(&probe, 1, probe.ready_polls()).await;
}

#[tokio::test(start_paused = true)]
async fn dropped_while_the_service_is_not_ready() {
    let (probe, future) = readying().await;
    assert_eq!(alive_tasks(), 0);
    drop(future);
    assert_silent_after_drop(&probe, 1, probe.ready_polls()).await;
}

#[tokio::test(start_paused = true)]
async fn dropped_during_a_retry() {
    let (probe, future) = in_retry().await;
    assert_eq!(alive_tasks(), 0);
    drop(future);
    assert_silent_after_drop(&probe, 2, probe.ready_polls()).await;
}

// ---- the controls: kept, the same futures do send the next attempt ----

#[tokio::test(start_paused = true)]
async fn kept_during_the_first_attempt_it_retries_after_the_timeout() {
    let (probe, mut future) = in_first_attempt().await;
    // The attempt times out at 5 s, then the first wait is 2 s.
    advance(Duration::from_secs(5)).await;
    assert!(poll_once(&mut future).is_pending());
    assert_eq!(probe.in_flight(), 0, "the timed-out attempt was dropped");
    advance(Duration::from_secs(2)).await;
    assert!(poll_once(&mut future).is_ready(), "the retry answered 200");
    assert_eq!(probe.calls(), 2);
    assert_eq!(alive_tasks(), 0);
}

#[tokio::test(start_paused = true)]
async fn kept_while_waiting_it_retries() {
    let (probe, mut future) = waiting().await;
    advance(Duration::from_millis(200)).await;
    let response = match poll_once(&mut future) {
        Poll::Ready(result) => result.expect("a response"),
        Poll::Pending => panic!("the retry should have answered"),
    };
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(probe.calls(), 2);
    assert_eq!(alive_tasks(), 0);
}

#[tokio::test(start_paused = true)]
async fn kept_while_not_ready_it_retries_once_ready() {
    let (probe, mut future) = readying().await;
    assert!(poll_once(&mut future).is_pending());
    assert_eq!(probe.calls(), 1);
    probe.set_ready(true);
    assert!(poll_once(&mut future).is_ready());
    assert_eq!(probe.calls(), 2);
    assert_eq!(alive_tasks(), 0);
}

#[tokio::test(start_paused = true)]
async fn kept_during_a_retry_it_retries_again() {
    let (probe, mut future) = in_retry().await;
    // The retry times out at 5 s, then the second wait is 4 s.
    advance(Duration::from_secs(5)).await;
    assert!(poll_once(&mut future).is_pending());
    advance(Duration::from_secs(4)).await;
    assert!(poll_once(&mut future).is_ready());
    assert_eq!(probe.calls(), 3);
}

/// The task count used above does see spawned tasks, so its zeros mean something.
#[tokio::test(start_paused = true)]
async fn the_task_count_sees_a_spawned_task() {
    assert_eq!(alive_tasks(), 0);
    let task = tokio::spawn(async { tokio::time::sleep(Duration::from_secs(1)).await });
    assert_eq!(alive_tasks(), 1);
    task.await.expect("the task ends");
    assert_eq!(alive_tasks(), 0);
}
