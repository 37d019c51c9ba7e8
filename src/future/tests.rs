// The driver by hand: a response future polled with a no-op waker under paused time, its
// state read from `Debug` after every step, over services whose answers are scripted.

use super::*;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::Waker;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use tower::Layer;

use crate::{Backoff, Jitter, RetryLayer, RetryPolicy, StopReason};

/// Answers with the scripted statuses (then 200), ready only while `ready` is set.
#[derive(Clone, Default)]
struct Script {
    statuses: Arc<Mutex<VecDeque<u16>>>,
    calls: Arc<AtomicUsize>,
    not_ready: Arc<std::sync::atomic::AtomicBool>,
}

impl Script {
    fn new(statuses: &[u16]) -> Self {
        let script = Script::default();
        script.statuses.lock().unwrap().extend(statuses);
        script
    }
}

impl Service<Request<ReplayBody<Full<Bytes>>>> for Script {
    type Response = Response<()>;
    type Error = BoxError;
    type Future = std::future::Ready<Result<Response<()>, BoxError>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        match self.not_ready.load(Ordering::SeqCst) {
            true => Poll::Pending,
            false => Poll::Ready(Ok(())),
        }
    }

    fn call(&mut self, _: Request<ReplayBody<Full<Bytes>>>) -> Self::Future {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let status = self.statuses.lock().unwrap().pop_front().unwrap_or(200);
        std::future::ready(Ok(Response::builder().status(status).body(()).unwrap()))
    }
}

fn state<F, S, B, R>(future: &ResponseFuture<F, S, B, R>) -> String {
    let debug = format!("{future:?}");
    let start = debug
        .find("state: \"")
        .expect("the state is in the Debug output")
        + 8;
    debug[start..].split('"').next().unwrap().to_string()
}

fn poll<F: Future + Unpin>(future: &mut F) -> Poll<F::Output> {
    Pin::new(future).poll(&mut Context::from_waker(Waker::noop()))
}

fn get() -> Request<Full<Bytes>> {
    Request::get("http://h/")
        .body(Full::new(Bytes::new()))
        .unwrap()
}

fn policy() -> RetryPolicy {
    RetryPolicy::default().backoff(
        Backoff::exponential(Duration::from_millis(100), Duration::from_secs(10))
            .jitter(Jitter::None),
    )
}

#[tokio::test(start_paused = true)]
async fn a_retry_goes_through_waiting_and_readying_to_its_attempt() {
    let script = Script::new(&[503]);
    let mut client = RetryLayer::new().policy(policy()).layer(script.clone());
    let mut future = Box::pin(Service::call(&mut client, get()));
    assert_eq!(state(&future), "attempt");
    // The 503 is decided: a wait of 200 ms before the retry.
    assert!(poll(&mut future).is_pending());
    assert_eq!(state(&future), "waiting");
    assert_eq!(script.calls.load(Ordering::SeqCst), 1);
    // The wait is over, but the retry's service is not ready yet.
    script.not_ready.store(true, Ordering::SeqCst);
    tokio::time::advance(Duration::from_millis(200)).await;
    assert!(poll(&mut future).is_pending());
    assert_eq!(state(&future), "readying");
    // Ready: the retry is sent, answers 200, and the future is done.
    script.not_ready.store(false, Ordering::SeqCst);
    let response = match poll(&mut future) {
        Poll::Ready(result) => result.unwrap(),
        Poll::Pending => panic!("the retry's answer was ready"),
    };
    assert_eq!(state(&future), "done");
    assert_eq!(response.status(), 200);
    let info = response.extensions().get::<RetryInfo>().unwrap();
    assert_eq!((info.attempts(), info.stop()), (2, StopReason::Final));
    assert_eq!(script.calls.load(Ordering::SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn a_zero_wait_goes_straight_to_readiness_and_a_success_ends_in_place() {
    let script = Script::new(&[503]);
    let zero = RetryPolicy::default()
        .backoff(Backoff::exponential(Duration::ZERO, Duration::ZERO).jitter(Jitter::None));
    let mut client = RetryLayer::new().policy(zero).layer(script.clone());
    let mut future = Box::pin(Service::call(&mut client, get()));
    // One poll: the 503, no wait, the retry's service ready at once, the 200.
    let Poll::Ready(result) = poll(&mut future) else {
        panic!("nothing to wait for");
    };
    assert_eq!(result.unwrap().status(), 200);
    assert_eq!(state(&future), "done");
    assert_eq!(script.calls.load(Ordering::SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn a_request_sent_once_is_its_one_attempt() {
    let script = Script::new(&[503]);
    let mut client = RetryLayer::new()
        .policy(RetryPolicy::never())
        .layer(script.clone());
    let mut future = Box::pin(Service::call(&mut client, get()));
    assert_eq!(state(&future), "attempt");
    let Poll::Ready(result) = poll(&mut future) else {
        panic!("the answer was ready");
    };
    let response = result.unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(
        response.extensions().get::<RetryInfo>().unwrap().stop(),
        StopReason::Disabled
    );
    assert_eq!(state(&future), "done");
}

#[tokio::test(start_paused = true)]
#[should_panic(expected = "polled after completion")]
async fn polling_after_the_end_panics() {
    let mut client = RetryLayer::new().layer(Script::new(&[]));
    let mut future = Box::pin(Service::call(&mut client, get()));
    assert!(poll(&mut future).is_ready());
    let _ = poll(&mut future);
}

#[tokio::test(start_paused = true)]
async fn the_timer_is_set_reset_and_cleared() {
    let mut timer: Timer = None;
    let clock = Clock::default();
    let now = clock.now();
    let mut cx = Context::from_waker(Waker::noop());
    assert!(!fired(&mut timer, &mut cx), "no timer, nothing fires");
    arm(&mut timer, Some(now + Duration::from_secs(1)), &clock);
    assert!(!fired(&mut timer, &mut cx));
    // Moved earlier, in place: the same allocation.
    let at = timer.as_ref().map(|sleep| &**sleep as *const Sleep);
    arm(&mut timer, Some(now), &clock);
    assert_eq!(timer.as_ref().map(|sleep| &**sleep as *const Sleep), at);
    assert!(fired(&mut timer, &mut cx));
    arm(&mut timer, None, &clock);
    assert!(timer.is_none());
    assert!(!fired(&mut timer, &mut cx));
    arm(&mut timer, None, &clock);
    assert!(timer.is_none());
}

// Gates asked before the first attempt, and gates that count what is in flight, through the
// test-only `Pacer` kind (no public kind does either yet).

use crate::gate::pacer::Pacer;
use http::Method;
use tower::ServiceExt;

/// A service that must be readied before each call (as a concurrency limit's slot), and
/// whose answers never come when `stall` is set.
#[derive(Clone, Default)]
struct Reserving {
    readied: bool,
    calls: Arc<AtomicUsize>,
    stall: bool,
}

impl Service<Request<ReplayBody<Full<Bytes>>>> for Reserving {
    type Response = Response<()>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<()>, BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.readied = true;
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<ReplayBody<Full<Bytes>>>) -> Self::Future {
        assert!(
            std::mem::take(&mut self.readied),
            "called without poll_ready"
        );
        self.calls.fetch_add(1, Ordering::SeqCst);
        match self.stall {
            true => Box::pin(std::future::pending()),
            false => Box::pin(std::future::ready(Ok(Response::new(())))),
        }
    }
}

fn paced(pacer: &Pacer) -> RetryPolicy {
    policy().gate(pacer.clone())
}

fn outcome<T>(poll: Poll<Result<T, BoxError>>) -> Result<T, BoxError> {
    match poll {
        Poll::Ready(result) => result,
        Poll::Pending => panic!("the request was to end here"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_first_attempt_a_gate_paces_waits_with_the_service_poll_ready_readied() {
    let pacer = Pacer::pacing_first(Duration::from_millis(300), 5);
    let inner = Reserving::default();
    let mut client = RetryLayer::new().policy(paced(&pacer)).layer(inner.clone());
    client.ready().await.unwrap();
    let mut future = Box::pin(client.call(get()));
    assert_eq!(state(&future), "admitting");
    assert_eq!(pacer.permits(), 4, "the first attempt took its permit");
    // The request is in flight; its attempt is not.
    assert_eq!(pacer.flight(), (1, 0, 0));
    assert!(poll(&mut future).is_pending());
    tokio::time::advance(Duration::from_millis(299)).await;
    assert!(poll(&mut future).is_pending());
    assert_eq!(
        inner.calls.load(Ordering::SeqCst),
        0,
        "not sent during the wait"
    );
    // The wait ends: the held service (readied, else `call` panics) sends it.
    tokio::time::advance(Duration::from_millis(1)).await;
    let response = outcome(poll(&mut future)).unwrap();
    assert_eq!(inner.calls.load(Ordering::SeqCst), 1);
    let info = response.extensions().get::<RetryInfo>().unwrap();
    assert_eq!((info.attempts(), info.stop()), (1, StopReason::Final));
    assert_eq!(pacer.flight(), (0, 0, 1));
    assert_eq!(pacer.permits(), 4, "a sent attempt keeps what it took");
    // The clone left in the layer's place is readied and called as any service is.
    client.ready().await.unwrap();
    let mut next = Box::pin(client.call(get()));
    tokio::time::advance(Duration::from_millis(300)).await;
    assert!(outcome(poll(&mut next)).is_ok());
    assert_eq!(inner.calls.load(Ordering::SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn a_first_attempt_admitted_without_a_wait_is_sent_at_once() {
    let pacer = Pacer::pacing_first(Duration::ZERO, 1);
    let inner = Reserving::default();
    let mut client = RetryLayer::new().policy(paced(&pacer)).layer(inner.clone());
    client.ready().await.unwrap();
    let mut future = Box::pin(client.call(get()));
    assert_eq!(state(&future), "attempt");
    assert_eq!(inner.calls.load(Ordering::SeqCst), 1);
    assert_eq!(pacer.flight(), (1, 1, 1));
    assert!(outcome(poll(&mut future)).is_ok());
    assert_eq!((pacer.permits(), pacer.flight()), (0, (0, 0, 1)));
}

#[tokio::test(start_paused = true)]
async fn a_first_attempt_a_gate_refuses_is_never_sent_and_the_record_says_why() {
    let pacer = Pacer::pacing_first(Duration::ZERO, 0);
    let inner = Reserving::default();
    // Sent once or retried, and under a POST sent once, the refusal is the same.
    for (policy, method) in [
        (paced(&pacer), Method::GET),
        (paced(&pacer), Method::POST),
        (paced(&pacer).max_attempts(1), Method::GET),
    ] {
        let mut client = RetryLayer::new().policy(policy).layer(inner.clone());
        client.ready().await.unwrap();
        let mut request = get();
        *request.method_mut() = method;
        let mut future = Box::pin(client.call(request));
        assert_eq!(state(&future), "refused");
        let error = outcome(poll(&mut future)).unwrap_err();
        let error = error.downcast::<RetryError>().unwrap();
        let info = error.info();
        assert_eq!(
            (info.attempts(), info.stop(), info.returned()),
            (0, StopReason::Throttled, None)
        );
        assert_eq!(info.outcomes().count(), 0);
        assert_eq!(info.to_string(), "no attempt sent; stopped: throttled");
        assert!(
            error.get_ref().is::<LocallyRefused>(),
            "{}",
            error.get_ref()
        );
        assert!(error.get_ref().to_string().starts_with("request not sent"));
    }
    assert_eq!(inner.calls.load(Ordering::SeqCst), 0);
    assert_eq!(pacer.flight(), (0, 0, 0));
    // `never()` is not asked: it is sent.
    let mut client = RetryLayer::new()
        .policy(paced(&pacer).max_attempts(3))
        .route(crate::RouteMatch::any(), RetryPolicy::never())
        .layer(inner.clone());
    client.ready().await.unwrap();
    let mut future = Box::pin(client.call(get()));
    assert!(outcome(poll(&mut future)).is_ok());
    assert_eq!(inner.calls.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn a_wait_the_deadline_leaves_no_time_for_fails_at_once_and_gives_back() {
    let pacer = Pacer::pacing_first(Duration::from_secs(5), 3);
    let inner = Reserving::default();
    let policy = paced(&pacer).deadline(Duration::from_secs(1));
    let mut client = RetryLayer::new().policy(policy).layer(inner.clone());
    client.ready().await.unwrap();
    let mut future = Box::pin(client.call(get()));
    let error = outcome(poll(&mut future)).unwrap_err();
    let error = error.downcast::<RetryError>().unwrap();
    assert_eq!(
        (error.info().attempts(), error.info().stop()),
        (0, StopReason::Deadline)
    );
    let deadline = error.get_ref().downcast_ref::<crate::DeadlineExceeded>();
    assert!(deadline.is_some(), "{error}");
    assert_eq!(
        (pacer.permits(), inner.calls.load(Ordering::SeqCst)),
        (3, 0)
    );
}

#[tokio::test(start_paused = true)]
async fn a_request_dropped_during_its_wait_gives_back_and_ends() {
    let pacer = Pacer::pacing_first(Duration::from_secs(1), 3);
    let inner = Reserving::default();
    let mut client = RetryLayer::new().policy(paced(&pacer)).layer(inner.clone());
    client.ready().await.unwrap();
    let mut future = Box::pin(client.call(get()));
    assert!(poll(&mut future).is_pending());
    assert_eq!((pacer.permits(), pacer.flight()), (2, (1, 0, 0)));
    drop(future);
    assert_eq!((pacer.permits(), pacer.flight()), (3, (0, 0, 0)));
    assert_eq!(inner.calls.load(Ordering::SeqCst), 0);
}

#[tokio::test(start_paused = true)]
async fn every_attempt_and_request_in_flight_is_ended_whatever_ends_it() {
    let pacer = Pacer::new(Duration::ZERO, 100);
    // A retry: the first attempt ends before the retry starts.
    let script = Script::new(&[503]);
    let mut client = RetryLayer::new()
        .policy(paced(&pacer))
        .layer(script.clone());
    let mut future = Box::pin(Service::call(&mut client, get()));
    assert_eq!(pacer.flight(), (1, 1, 1));
    assert!(poll(&mut future).is_pending());
    assert_eq!(state(&future), "waiting");
    assert_eq!(pacer.flight(), (1, 0, 1));
    tokio::time::advance(Duration::from_millis(200)).await;
    assert!(outcome(poll(&mut future)).is_ok());
    assert_eq!(pacer.flight(), (0, 0, 2));
    drop(future);

    // Dropped by its caller with an attempt out, sent once or retryable.
    let stall = Reserving {
        stall: true,
        ..Reserving::default()
    };
    for (started, policy) in [(3, paced(&pacer)), (4, paced(&pacer).max_attempts(1))] {
        let mut client = RetryLayer::new().policy(policy).layer(stall.clone());
        client.ready().await.unwrap();
        let mut future = Box::pin(client.call(get()));
        assert!(poll(&mut future).is_pending());
        assert_eq!(pacer.flight(), (1, 1, started));
        drop(future);
        assert_eq!(pacer.flight(), (0, 0, started));
    }

    // The deadline passes with the attempt out.
    let policy = paced(&pacer).deadline(Duration::from_secs(1));
    let mut client = RetryLayer::new().policy(policy).layer(stall.clone());
    client.ready().await.unwrap();
    let mut future = Box::pin(client.call(get()));
    assert!(poll(&mut future).is_pending());
    tokio::time::advance(Duration::from_secs(1)).await;
    assert!(outcome(poll(&mut future)).is_err());
    assert_eq!(pacer.flight(), (0, 0, 5));

    // Hedged: each hedge starts; the attempts still out end with the request.
    let hedging = paced(&pacer)
        .max_attempts(3)
        .hedge(crate::Hedging::after(Duration::from_millis(100)));
    let mut client = RetryLayer::new().policy(hedging).layer(stall.clone());
    client.ready().await.unwrap();
    let mut future = Box::pin(client.call(get()));
    assert!(poll(&mut future).is_pending());
    assert_eq!(pacer.flight(), (1, 1, 6));
    for out in [2, 3] {
        tokio::time::advance(Duration::from_millis(100)).await;
        assert!(poll(&mut future).is_pending());
        assert_eq!(pacer.flight(), (1, out, 5 + out as u64));
    }
    drop(future);
    assert_eq!(pacer.flight(), (0, 0, 8));

    // `never()`: still a request in flight, and its one attempt.
    let mut client = RetryLayer::new()
        .policy(RetryPolicy::never().gate(pacer.clone()))
        .layer(stall.clone());
    client.ready().await.unwrap();
    let future = Box::pin(client.call(get()));
    assert_eq!(pacer.flight(), (1, 1, 9));
    drop(future);
    assert_eq!(pacer.flight(), (0, 0, 9));
}
