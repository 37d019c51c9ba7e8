//! Every outcome carries its record, and the rules the retry loop keeps for it (the jitter's
//! previous wait, readiness bounds, keys, deposits, the `Attempt` extension), under paused
//! time.
#![allow(clippy::disallowed_methods)] // tokio's paused clock and sleeps, or real time

use crate::common;
use tower::ServiceExt;

use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use common::{Mock, Reply, get, request};
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use tower::{BoxError, Layer, Service};
use tower_http_retry::classify::RetryReason;
use tower_http_retry::{
    Attempt, AttemptKind, AttemptOutcome, AttemptTimedOut, Backoff, DeadlineExceeded,
    IdempotencyKey, Jitter, ReplayBody, RetryBudget, RetryError, RetryInfo, RetryLayer,
    RetryPolicy, ServiceNotReady, StopReason,
};

fn quick(attempts: u32) -> RetryPolicy {
    RetryPolicy::default().max_attempts(attempts).backoff(
        Backoff::exponential(Duration::from_millis(10), Duration::from_millis(10))
            .jitter(Jitter::None),
    )
}

fn refused() -> Reply {
    Reply::error(|| io::Error::from(io::ErrorKind::ConnectionRefused))
}

#[tokio::test(start_paused = true)]
async fn a_failed_request_carries_its_record_and_the_last_error() {
    let mock = Mock::new([refused(), refused(), refused()]);
    let error = RetryLayer::new()
        .policy(quick(3))
        .layer(mock.clone())
        .oneshot(get("http://h/"))
        .await
        .unwrap_err();
    let error = error.downcast::<RetryError>().expect("a RetryError");
    let info = error.info().clone();
    assert_eq!((info.attempts(), info.stop()), (3, StopReason::MaxAttempts));
    assert_eq!(info.retries().len(), 2);
    assert!(
        info.retries()
            .iter()
            .all(|r| r.reason == RetryReason::Connect)
    );
    assert_eq!(info.total_wait(), Duration::from_millis(20));
    // The source is the inner error unchanged, also through `std::error::Error::source`.
    let source = std::error::Error::source(&*error).unwrap();
    assert_eq!(
        source.downcast_ref::<io::Error>().unwrap().kind(),
        io::ErrorKind::ConnectionRefused
    );
    let last = error.into_source();
    assert!(last.is::<io::Error>());
    assert_eq!(mock.calls(), 3);
}

#[tokio::test(start_paused = true)]
async fn a_second_layer_classifies_through_the_first() {
    let mock =
        Mock::new((0..4).map(|_| Reply::error(|| io::Error::from(io::ErrorKind::ConnectionReset))));
    let inner = RetryLayer::new().policy(quick(2)).layer(mock.clone());
    let outer = RetryLayer::new().policy(quick(2)).layer(inner);
    let error = outer.oneshot(get("http://h/")).await.unwrap_err();
    // The outer layer saw the inner one's RetryError, walked to the reset and retried it.
    assert_eq!(mock.calls(), 4);
    let outer_error = error.downcast_ref::<RetryError>().unwrap();
    assert_eq!(outer_error.info().attempts(), 2);
    assert_eq!(
        outer_error.info().retries()[0].reason,
        RetryReason::ConnectionClosed
    );
    let inner_error = outer_error.get_ref().downcast_ref::<RetryError>().unwrap();
    assert_eq!(inner_error.info().attempts(), 2);
}

#[tokio::test(start_paused = true)]
async fn the_caller_gets_the_record_of_a_request_sent_once_too() {
    let mock = Mock::new([refused()]);
    let mut req = get("http://h/");
    req.extensions_mut().insert(RetryPolicy::never());
    let error = RetryLayer::new()
        .layer(mock)
        .oneshot(req)
        .await
        .unwrap_err();
    let error = error.downcast_ref::<RetryError>().unwrap();
    assert_eq!(
        (error.info().attempts(), error.info().stop()),
        (1, StopReason::Disabled)
    );
}

/// Decorrelated jitter draws from [b, 3p] with p the wait actually slept, a
/// Retry-After included.
#[tokio::test(start_paused = true)]
async fn decorrelated_jitter_grows_from_the_wait_actually_slept() {
    let mut longest = Duration::ZERO;
    for seed in 0..20 {
        let mock = Mock::new([
            Reply::Headers(503, vec![("retry-after", "10".to_string())]),
            Reply::Status(503),
            Reply::Status(200),
        ]);
        let policy = RetryPolicy::default()
            .max_attempts(3)
            .max_retry_after(Duration::from_secs(60))
            .backoff(
                Backoff::exponential(Duration::from_millis(100), Duration::from_secs(30))
                    .jitter(Jitter::Decorrelated),
            )
            .rng_seed(seed);
        let response = RetryLayer::new()
            .policy(policy)
            .layer(mock)
            .oneshot(get("http://h/"))
            .await
            .unwrap();
        let info = response.extensions().get::<RetryInfo>().unwrap();
        assert_eq!(info.retries()[0].wait, Duration::from_secs(10));
        let second = info.retries()[1].wait;
        assert!(
            second >= Duration::from_millis(100) && second <= Duration::from_secs(30),
            "{second:?}"
        );
        longest = longest.max(second);
    }
    // Drawn from [0.1 s, 30 s]: twenty draws all under a second would be a 1-in-10^30
    // event; drawn from the previous backoff (at most 300 ms) they never pass 900 ms.
    assert!(
        longest > Duration::from_secs(1),
        "longest second wait {longest:?}"
    );
}

/// Requests under `never()`, `max_attempts(1)` and CONNECT deposit too.
#[tokio::test(start_paused = true)]
async fn requests_that_are_never_retried_still_deposit() {
    let budget = RetryBudget::builder()
        .ratio(0.5)
        .min_per_sec(0.0)
        .max_tokens(10.0)
        .build();
    while tower::retry::budget::Budget::withdraw(&budget) {}
    let before = budget.tokens();
    let layer = RetryLayer::new().policy(RetryPolicy::new().gate(budget.clone()));
    let mut never = get("http://h/");
    never.extensions_mut().insert(RetryPolicy::never());
    let mut single = get("http://h/");
    single
        .extensions_mut()
        .insert(RetryPolicy::default().max_attempts(1));
    let connect = Request::builder()
        .method(Method::CONNECT)
        .uri("h:443")
        .body(Full::new(Bytes::new()))
        .unwrap();
    for req in [never, single, connect] {
        let mock = Mock::statuses(&[200]);
        layer.clone().layer(mock).oneshot(req).await.unwrap();
    }
    assert!(
        (budget.tokens() - before - 1.5).abs() < 1e-9,
        "{} -> {}",
        before,
        budget.tokens()
    );
}

/// Whether a key is stamped depends on the key configuration alone.
#[tokio::test(start_paused = true)]
async fn a_post_gets_its_key_whether_retries_are_on_or_not() {
    for policy in [
        RetryPolicy::never(),
        RetryPolicy::default().max_attempts(1),
        RetryPolicy::default(),
    ] {
        let mock = Mock::statuses(&[200]);
        let mut req = request(Method::POST, "http://h/orders", b"{}");
        req.extensions_mut().insert(policy.clone());
        let response = RetryLayer::new()
            .policy(RetryPolicy::new().idempotency_key(IdempotencyKey::default()))
            .layer(mock.clone())
            .oneshot(req)
            .await
            .unwrap();
        let sent = mock.seen()[0].headers.get("idempotency-key").cloned();
        assert!(sent.is_some(), "{policy:?}");
        assert_eq!(
            response
                .extensions()
                .get::<RetryInfo>()
                .unwrap()
                .idempotency_key(),
            sent.as_ref()
        );
    }
}

/// A service that is ready for its first call only, and then never again: it stays pending
/// (without waking anyone), so a retry can only end by a limit, or, when `breaks`, its
/// `poll_ready` fails.
#[derive(Clone, Default)]
struct ReadyOnce {
    calls: Arc<AtomicUsize>,
    breaks: bool,
}

impl Service<Request<ReplayBody<Full<Bytes>>>> for ReadyOnce {
    type Response = Response<Full<Bytes>>;
    type Error = BoxError;
    type Future = std::future::Ready<Result<Self::Response, BoxError>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        match (self.calls.load(Ordering::SeqCst), self.breaks) {
            (0, _) => Poll::Ready(Ok(())),
            (_, true) => Poll::Ready(Err(io::Error::other("pool closed").into())),
            (_, false) => Poll::Pending,
        }
    }

    fn call(&mut self, _: Request<ReplayBody<Full<Bytes>>>) -> Self::Future {
        self.calls.fetch_add(1, Ordering::SeqCst);
        std::future::ready(Ok(Response::builder()
            .status(503)
            .body(Full::default())
            .unwrap()))
    }
}

/// Without a deadline, waiting for a retry's service to become ready is bounded by the
/// attempt timeout. When it runs out, nothing more is sent and the caller is told so: not
/// "attempt 1 timed out" (attempt 1 got its 503 in time), but that the retry's service was
/// not ready, with the record of the retry the 503 asked for.
#[tokio::test(start_paused = true)]
async fn readiness_is_bounded_by_the_attempt_timeout_without_a_deadline() {
    let inner = ReadyOnce::default();
    let policy = quick(3).attempt_timeout(Duration::from_secs(2));
    let start = tokio::time::Instant::now();
    let error = RetryLayer::new()
        .policy(policy)
        .layer(inner.clone())
        .oneshot(get("http://h/"))
        .await
        .unwrap_err();
    assert_eq!(
        start.elapsed(),
        Duration::from_millis(10) + Duration::from_secs(2)
    );
    let error = error.downcast_ref::<RetryError>().unwrap();
    let not_ready = error
        .get_ref()
        .downcast_ref::<ServiceNotReady>()
        .unwrap_or_else(|| panic!("not a ServiceNotReady: {error}"));
    assert_eq!(not_ready.timeout(), Duration::from_secs(2));
    // The retry that was not sent: attempt 2, the record's last.
    assert_eq!(error.info().attempts() + 1, 2);
    assert!(!error.get_ref().is::<AttemptTimedOut>(), "{error}");
    let info = error.info();
    assert_eq!(info.stop(), StopReason::ServiceNotReady);
    assert_eq!(
        (info.attempts(), inner.calls.load(Ordering::SeqCst)),
        (1, 1)
    );
    let reasons: Vec<_> = info.retries().iter().map(|r| r.reason).collect();
    assert_eq!(
        reasons,
        [RetryReason::Status(StatusCode::SERVICE_UNAVAILABLE)]
    );
}

/// With a deadline, the same wait is bounded by the deadline, and running out of it is the
/// deadline's doing.
#[tokio::test(start_paused = true)]
async fn readiness_is_bounded_by_the_deadline_when_there_is_one() {
    let inner = ReadyOnce::default();
    let policy = quick(3)
        .attempt_timeout(Duration::from_secs(2))
        .deadline(Duration::from_secs(5));
    let start = tokio::time::Instant::now();
    let error = RetryLayer::new()
        .policy(policy)
        .layer(inner.clone())
        .oneshot(get("http://h/"))
        .await
        .unwrap_err();
    assert_eq!(start.elapsed(), Duration::from_secs(5));
    let error = error.downcast_ref::<RetryError>().unwrap();
    assert!(error.get_ref().is::<DeadlineExceeded>(), "{error}");
    assert_eq!(error.info().stop(), StopReason::Deadline);
    assert_eq!(error.info().retries().len(), 1);
    assert_eq!(inner.calls.load(Ordering::SeqCst), 1);
}

/// Every retry's request carries an `Attempt`; the first carries none.
#[tokio::test(start_paused = true)]
async fn retries_carry_their_attempt_number() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&seen);
    let inner = tower::service_fn(move |req: Request<ReplayBody<Full<Bytes>>>| {
        log.lock()
            .unwrap()
            .push(req.extensions().get::<Attempt>().copied());
        let status = if log.lock().unwrap().len() < 3 {
            503
        } else {
            200
        };
        async move { Ok::<_, BoxError>(Response::builder().status(status).body(()).unwrap()) }
    });
    let response = RetryLayer::new()
        .policy(quick(3))
        .layer(inner)
        .oneshot(get("http://h/"))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let seen = seen.lock().unwrap().clone();
    assert_eq!(
        seen,
        [
            None,
            Some(Attempt::new(2, 1, None, AttemptKind::Retry)),
            Some(Attempt::new(3, 2, None, AttemptKind::Retry)),
        ]
    );
    assert_eq!(seen[2].unwrap().number - 1, 2);
}

/// A service that fails to get ready with an error a client module recognised: the caller
/// gets the module's own error, as from a call.
#[derive(Clone)]
struct BrokenReady;

impl Service<Request<ReplayBody<Full<Bytes>>>> for BrokenReady {
    type Response = Response<()>;
    type Error = tower_http_retry::classify::Recognized;
    type Future = std::future::Pending<Result<Response<()>, Self::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        let error = io::Error::from(io::ErrorKind::ConnectionRefused);
        Poll::Ready(Err(tower_http_retry::classify::Recognized::new(
            error,
            Some(RetryReason::Connect),
        )))
    }

    fn call(&mut self, _: Request<ReplayBody<Full<Bytes>>>) -> Self::Future {
        std::future::pending()
    }
}

#[tokio::test]
async fn a_recognised_readiness_error_reaches_the_caller_as_the_modules_own() {
    let error = RetryLayer::new()
        .layer(BrokenReady)
        .oneshot(get("http://h/"))
        .await
        .unwrap_err();
    let io = error
        .downcast_ref::<io::Error>()
        .expect("the module's own error");
    assert_eq!(io.kind(), io::ErrorKind::ConnectionRefused);
}

/// When the retry's service fails to get ready, the caller gets that error as it is, and
/// the record says no attempt's outcome was returned: the retry the 503 asked for was never
/// sent.
#[tokio::test(start_paused = true)]
async fn a_retry_whose_service_fails_to_get_ready_returns_no_attempts_outcome() {
    let service = ReadyOnce {
        breaks: true,
        ..ReadyOnce::default()
    };
    let error = RetryLayer::new()
        .policy(quick(3))
        .layer(service.clone())
        .oneshot(get("http://h/"))
        .await
        .unwrap_err();
    assert_eq!(service.calls.load(Ordering::SeqCst), 1);
    let error = error.downcast::<RetryError>().expect("a RetryError");
    let source = error.get_ref();
    assert_eq!(source.to_string(), "pool closed");
    let info = error.info();
    assert_eq!(info.attempts(), 1);
    assert_eq!(info.stop(), StopReason::ServiceNotReady);
    assert_eq!(info.returned(), None);
    assert_eq!(info.retries().len(), 1);
    assert_eq!(info.retries()[0].outcome, AttemptOutcome::NotSent);
}

/// The record keeps every attempt: what each got, what kind of retry each later one was,
/// why and after how long it was sent, and whose outcome the caller got.
#[tokio::test(start_paused = true)]
async fn the_record_keeps_every_attempt_and_whose_outcome_was_returned() {
    let mock = Mock::new([
        Reply::Status(503),
        Reply::error(|| io::Error::from(io::ErrorKind::ConnectionReset)),
        Reply::Status(200),
    ]);
    let response = RetryLayer::new()
        .policy(quick(3))
        .layer(mock)
        .oneshot(get("http://h/"))
        .await
        .unwrap();
    let info = response.extensions().get::<RetryInfo>().unwrap();
    assert_eq!(info.attempts(), 3);
    let outcomes: Vec<_> = info.outcomes().collect();
    assert_eq!(
        outcomes,
        [
            AttemptOutcome::Response(StatusCode::SERVICE_UNAVAILABLE),
            AttemptOutcome::Error,
            AttemptOutcome::Response(StatusCode::OK),
        ]
    );
    let retries: Vec<_> = info.retries().iter().map(|r| (r.kind, r.reason)).collect();
    assert_eq!(
        retries,
        [
            (
                AttemptKind::Retry,
                RetryReason::Status(StatusCode::SERVICE_UNAVAILABLE)
            ),
            (AttemptKind::Retry, RetryReason::ConnectionClosed),
        ]
    );
    assert_eq!(info.returned(), Some(3));
    assert_eq!(info.stop(), StopReason::Final);
    assert_eq!(
        info.total_wait(),
        info.retries().iter().map(|r| r.wait).sum::<Duration>()
    );

    // A deadline that drops the attempt in flight: that attempt was abandoned, and the
    // caller got the layer's own error, no attempt's outcome.
    let slow = Mock::new([
        Reply::Status(503),
        Reply::Slow(Duration::from_secs(60), Box::new(Reply::Status(200))),
    ]);
    let error = RetryLayer::new()
        .policy(quick(3).deadline(Duration::from_secs(5)))
        .layer(slow)
        .oneshot(get("http://h/"))
        .await
        .unwrap_err();
    let info = error.downcast_ref::<RetryError>().unwrap().info();
    let outcomes: Vec<_> = info.outcomes().collect();
    assert_eq!(
        outcomes,
        [
            AttemptOutcome::Response(StatusCode::SERVICE_UNAVAILABLE),
            AttemptOutcome::Abandoned,
        ]
    );
    assert_eq!((info.returned(), info.stop()), (None, StopReason::Deadline));
}

/// The record as `{}` and `{:#}` write it.
fn shown(info: &RetryInfo) -> (String, String) {
    (info.to_string(), format!("{info:#}"))
}

/// A budget with no token left, that earns too little back (0.01 a request) to pay for a
/// retry.
fn empty_budget() -> RetryBudget {
    let budget = RetryBudget::builder()
        .ratio(0.01)
        .min_per_sec(0.0)
        .max_tokens(1.0)
        .build();
    while tower::retry::budget::Budget::withdraw(&budget) {}
    budget
}

/// The record names each attempt's cause through the layer, the last one's included:
/// three refused connections are three connect errors, stopped at the attempt limit.
#[tokio::test(start_paused = true)]
async fn the_record_names_each_attempts_cause() {
    let error = RetryLayer::new()
        .policy(quick(3))
        .layer(Mock::new([refused(), refused(), refused()]))
        .oneshot(get("http://h/"))
        .await
        .unwrap_err();
    let error = error.downcast::<RetryError>().unwrap();
    assert_eq!(
        shown(error.info()),
        (
            "3 attempts: connect error, connect error, connect error; waited 20 ms (backoff); \
             stopped: max attempts"
                .to_string(),
            "3 attempts: connect error, connect error, connect error; waited 20 ms (backoff); \
             stopped: max attempts\n\
             \x20 attempt 1: connect error\n\
             \x20 attempt 2, after 10 ms (backoff): connect error\n\
             \x20 attempt 3, after 10 ms (backoff): connect error"
                .to_string()
        )
    );
    assert_eq!(
        error.to_string(),
        "connection refused (after 3 attempt(s); stopped: max attempts)"
    );
}

/// A 503 whose `Retry-After` set the wait, then a 200: the wait's source is named.
#[tokio::test(start_paused = true)]
async fn the_record_names_what_set_each_wait() {
    let response = RetryLayer::new()
        .policy(quick(3))
        .layer(Mock::new([
            Reply::Headers(503, vec![("retry-after", "1".to_string())]),
            Reply::Status(200),
        ]))
        .oneshot(get("http://h/"))
        .await
        .unwrap();
    let info = response.extensions().get::<RetryInfo>().unwrap();
    assert_eq!(
        shown(info),
        (
            "2 attempts: 503, 200; waited 1 s (Retry-After); stopped: final".to_string(),
            "2 attempts: 503, 200; waited 1 s (Retry-After); stopped: final\n\
             \x20 attempt 1: 503\n\
             \x20 attempt 2, after 1 s (Retry-After): 200"
                .to_string()
        )
    );
}

/// The budget refused the retry: the one attempt is named by its cause, a connection
/// refused as well as a status.
#[tokio::test(start_paused = true)]
async fn a_budget_refusal_names_the_outcome_it_returned() {
    for (reply, named) in [(Reply::Status(503), "503"), (refused(), "connect error")] {
        let result = RetryLayer::new()
            .policy(quick(3).gate(empty_budget()))
            .layer(Mock::new([reply]))
            .oneshot(get("http://h/"))
            .await;
        let info = match &result {
            Ok(response) => response.extensions().get::<RetryInfo>().unwrap().clone(),
            Err(error) => error.downcast_ref::<RetryError>().unwrap().info().clone(),
        };
        let summary = format!("1 attempt: {named}; stopped: budget exhausted");
        assert_eq!(
            shown(&info),
            (summary.clone(), format!("{summary}\n  attempt 1: {named}"))
        );
    }
}

/// A request sent once under a gate that hears its outcome: the outcome is classified for
/// the gate, and the record names it by the reason; without such a gate nothing classifies
/// it, and the record names the outcome.
#[tokio::test(start_paused = true)]
async fn a_request_sent_once_is_named_by_what_the_layer_knows() {
    let throttle = tower_http_retry::Throttle::builder().build();
    for (policy, named) in [
        (quick(1).gate(throttle), "connect error"),
        (quick(1), "error"),
    ] {
        let error = RetryLayer::new()
            .policy(policy)
            .layer(Mock::new([refused()]))
            .oneshot(get("http://h/"))
            .await
            .unwrap_err();
        let info = error.downcast_ref::<RetryError>().unwrap().info();
        assert_eq!(
            info.to_string(),
            format!("1 attempt: {named}; stopped: disabled")
        );
    }
}
