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
    let now = Instant::now();
    let mut cx = Context::from_waker(Waker::noop());
    assert!(!fired(&mut timer, &mut cx), "no timer, nothing fires");
    arm(&mut timer, Some(now + Duration::from_secs(1)));
    assert!(!fired(&mut timer, &mut cx));
    // Moved earlier, in place: the same allocation.
    let at = timer.as_ref().map(|sleep| &**sleep as *const Sleep);
    arm(&mut timer, Some(now));
    assert_eq!(timer.as_ref().map(|sleep| &**sleep as *const Sleep), at);
    assert!(fired(&mut timer, &mut cx));
    arm(&mut timer, None);
    assert!(timer.is_none());
    assert!(!fired(&mut timer, &mut cx));
    arm(&mut timer, None);
    assert!(timer.is_none());
}
