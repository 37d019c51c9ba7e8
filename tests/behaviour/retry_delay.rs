//! `RetryInfo::retry_delay`: the time a request spent with no attempt in flight, measured
//! as attempts start and end (backoff, a retry's readiness, a hedge's gap), not the waits
//! the layer decided.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use tokio::time::Sleep;
use tower::{BoxError, Layer, Service, ServiceExt};
use tower_http_retry::{
    AttemptKind, Backoff, Hedging, Jitter, ReplayBody, RetryError, RetryInfo, RetryLayer,
    RetryPolicy,
};

use crate::common::{Mock, Reply, get, response};

const URI: &str = "http://api.test/v1/items";

fn fixed(attempts: u32, wait_ms: u64) -> RetryPolicy {
    let wait = Duration::from_millis(wait_ms);
    RetryPolicy::new()
        .no_gates()
        .max_attempts(attempts)
        .backoff(Backoff::exponential(wait, wait).jitter(Jitter::None))
}

fn hedges(info: &RetryInfo) -> usize {
    info.retries()
        .iter()
        .filter(|retry| retry.kind == AttemptKind::Hedge)
        .count()
}

fn info<B>(response: &Response<B>) -> &RetryInfo {
    response.extensions().get::<RetryInfo>().unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_request_answered_at_once_has_none() {
    let client = RetryLayer::new()
        .policy(fixed(3, 100))
        .layer(Mock::statuses(&[200]));
    let response = client.oneshot(get(URI)).await.unwrap();
    assert_eq!(info(&response).retry_delay(), Duration::ZERO);
}

/// The backoff between attempts is time with nothing in flight; the attempts' own time
/// (a slow 503) is not.
#[tokio::test(start_paused = true)]
async fn the_waits_between_attempts_count_and_the_attempts_do_not() {
    let slow_503 = Reply::Slow(Duration::from_millis(40), Box::new(Reply::Status(503)));
    // The second attempt is the slow one: its time lies between two waits.
    let mock = Mock::new([Reply::Status(503), slow_503]);
    let client = RetryLayer::new().policy(fixed(3, 100)).layer(mock);
    let response = client.oneshot(get(URI)).await.unwrap();
    let info = info(&response);
    assert_eq!(info.attempts(), 3);
    assert_eq!(info.total_wait(), Duration::from_millis(200));
    assert_eq!(info.retry_delay(), Duration::from_millis(200));
}

/// A service that, after its first call, takes `ready_ms` to get ready (each clone for
/// itself), then answers 503 on its first call and 200 after.
struct SlowReady {
    calls: Arc<AtomicUsize>,
    ready_ms: u64,
    sleep: Option<Pin<Box<Sleep>>>,
}

impl Clone for SlowReady {
    fn clone(&self) -> Self {
        Self {
            calls: Arc::clone(&self.calls),
            ready_ms: self.ready_ms,
            sleep: None,
        }
    }
}

impl Service<Request<ReplayBody<Full<Bytes>>>> for SlowReady {
    type Response = Response<Full<Bytes>>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        if self.calls.load(Ordering::SeqCst) == 0 {
            return Poll::Ready(Ok(()));
        }
        let ready_ms = self.ready_ms;
        let sleep = self
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(Duration::from_millis(ready_ms))));
        sleep.as_mut().poll(cx).map(Ok)
    }

    fn call(&mut self, _: Request<ReplayBody<Full<Bytes>>>) -> Self::Future {
        let first = self.calls.fetch_add(1, Ordering::SeqCst) == 0;
        let status = if first { 503 } else { 200 };
        Box::pin(async move { Ok(response(status, &[])) })
    }
}

/// The time a retry's service takes to get ready counts, beside the backoff, though the
/// layer decided no wait for it.
#[tokio::test(start_paused = true)]
async fn a_retrys_readiness_counts() {
    let service = SlowReady {
        calls: Arc::default(),
        ready_ms: 50,
        sleep: None,
    };
    let client = RetryLayer::new().policy(fixed(3, 100)).layer(service);
    let response = client.oneshot(get(URI)).await.unwrap();
    let info = info(&response);
    assert_eq!(response.status(), 200);
    assert_eq!(info.total_wait(), Duration::from_millis(100));
    assert_eq!(info.retry_delay(), Duration::from_millis(150));
}

/// A hedge sent while the first attempt is still out overlaps it: no time without an
/// attempt in flight.
#[tokio::test(start_paused = true)]
async fn a_hedges_overlap_is_no_delay() {
    let slow = Reply::Slow(Duration::from_secs(5), Box::new(Reply::Status(200)));
    let policy = fixed(2, 100).hedge(Hedging::after(Duration::from_millis(100)));
    let client = RetryLayer::new().policy(policy).layer(Mock::new([slow]));
    let response = client.oneshot(get(URI)).await.unwrap();
    let info = info(&response);
    assert_eq!(hedges(info), 1);
    assert_eq!(info.returned(), Some(2));
    assert_eq!(info.retry_delay(), Duration::ZERO);
}

/// A hedged request's first attempt fails and the server asks for a second's pause: the
/// hedge waits it out with nothing in flight, and that second counts.
#[tokio::test(start_paused = true)]
async fn a_hedges_gap_counts() {
    let paused = Reply::Slow(
        Duration::from_millis(30),
        Box::new(Reply::Headers(503, vec![("retry-after", "1".to_owned())])),
    );
    let policy = fixed(2, 100).hedge(Hedging::after(Duration::from_secs(10)));
    // The hedge takes 50 ms: in flight, so not counted.
    let hedge = Reply::Slow(Duration::from_millis(50), Box::new(Reply::Status(200)));
    let client = RetryLayer::new()
        .policy(policy)
        .layer(Mock::new([paused, hedge]));
    let response = client.oneshot(get(URI)).await.unwrap();
    let info = info(&response);
    assert_eq!(response.status(), 200);
    assert_eq!(hedges(info), 1);
    assert_eq!(info.retry_delay(), Duration::from_secs(1));
}

/// A request that ends with no attempt in flight (its last retry's service never got
/// ready before the deadline) counts that time to its end, in the error's record.
#[tokio::test(start_paused = true)]
async fn a_request_ending_between_attempts_counts_to_its_end() {
    let service = SlowReady {
        calls: Arc::default(),
        ready_ms: 10_000,
        sleep: None,
    };
    let policy = fixed(3, 100).deadline(Duration::from_secs(1));
    let client = RetryLayer::new().policy(policy).layer(service);
    let error = client.oneshot(get(URI)).await.unwrap_err();
    let error = error.downcast::<RetryError>().unwrap();
    // The first attempt answers at once; from then to the deadline nothing is in flight.
    assert_eq!(error.info().retry_delay(), Duration::from_secs(1));
}
