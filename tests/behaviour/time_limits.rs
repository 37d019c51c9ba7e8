//! Retry-After, the overall deadline and per-attempt timeouts, under paused time.
#![allow(clippy::disallowed_methods)] // tokio's paused clock and sleeps, or real time

use crate::common;
use tower::ServiceExt;

use std::time::{Duration, SystemTime};

use common::{Mock, Reply, get};
use http::StatusCode;
use tokio::time::Instant;
use tower::Layer;
use tower_http_retry::classify::RetryReason;
use tower_http_retry::{
    AttemptTimedOut, Backoff, DeadlineExceeded, Jitter, RetryError, RetryInfo, RetryLayer,
    RetryPolicy, StopReason,
};

const MS: Duration = Duration::from_millis(1);

/// No jitter: retry n waits exactly base * 2^n.
fn policy(base_ms: u64) -> RetryPolicy {
    RetryPolicy::default().backoff(
        Backoff::exponential(Duration::from_millis(base_ms), Duration::from_secs(60))
            .jitter(Jitter::None),
    )
}

fn layer(policy: RetryPolicy) -> RetryLayer {
    RetryLayer::new().policy(policy)
}

fn info<B>(response: &http::Response<B>) -> RetryInfo {
    response.extensions().get::<RetryInfo>().cloned().unwrap()
}

fn with_retry_after(code: u16, value: &str) -> Reply {
    Reply::Headers(code, vec![("retry-after", value.to_string())])
}

#[tokio::test(start_paused = true)]
async fn retry_after_is_a_floor_over_the_backoff() {
    // Backoff 200 ms, hint 2 s: the hint wins.
    let mock = Mock::new([with_retry_after(503, "2")]);
    let start = Instant::now();
    let response = layer(policy(100))
        .layer(mock.clone())
        .oneshot(get("http://h/"))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(start.elapsed(), 2000 * MS);
    let first = info(&response);
    assert_eq!(first.retries()[0].wait, 2000 * MS);
    assert_eq!(
        first.retries()[0].hint,
        Some(tower_http_retry::hints::HintSource::RetryAfter)
    );

    // Backoff 2 s, hint 1 s: the backoff wins.
    let mock = Mock::new([with_retry_after(429, "1")]);
    let start = Instant::now();
    let response = layer(policy(1000))
        .layer(mock)
        .oneshot(get("http://h/"))
        .await
        .unwrap();
    assert_eq!(start.elapsed(), 2000 * MS);
    assert_ne!(
        info(&response).retries()[0].hint,
        Some(tower_http_retry::hints::HintSource::RetryAfter)
    );
}

#[tokio::test(start_paused = true)]
async fn a_hint_above_the_cap_returns_at_once() {
    let mock = Mock::new([with_retry_after(503, "120")]);
    let start = Instant::now();
    let response = layer(policy(100))
        .layer(mock.clone())
        .oneshot(get("http://h/"))
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(response.headers()["retry-after"], "120");
    assert_eq!(start.elapsed(), Duration::ZERO, "no pointless sleep");
    assert_eq!(mock.calls(), 1);
    let record = info(&response);
    assert_eq!(
        (record.attempts(), record.stop()),
        (1, StopReason::HintTooLong)
    );

    // A higher cap lets the same hint through.
    let mock = Mock::new([with_retry_after(503, "120")]);
    let start = Instant::now();
    let response = layer(policy(100).max_retry_after(Duration::from_secs(300)))
        .layer(mock)
        .oneshot(get("http://h/"))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(start.elapsed(), Duration::from_secs(120));
}

#[tokio::test(start_paused = true)]
async fn an_http_date_is_measured_against_the_date_header_not_the_local_clock() {
    // The server's clock is an hour behind ours: against our clock the date is long past.
    let server_now = SystemTime::now() - Duration::from_secs(3600);
    let date = httpdate::fmt_http_date(server_now);
    let retry_at = httpdate::fmt_http_date(server_now + Duration::from_secs(3));
    let mock = Mock::new([Reply::Headers(
        503,
        vec![("retry-after", retry_at), ("date", date)],
    )]);
    let start = Instant::now();
    let response = layer(policy(100))
        .layer(mock)
        .oneshot(get("http://h/"))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    // Whole seconds on the wire: the hint is exactly 3 s.
    assert_eq!(start.elapsed(), Duration::from_secs(3));
}

#[tokio::test(start_paused = true)]
async fn a_malformed_hint_is_ignored() {
    for bad in ["soon", "-1", "1.5", ""] {
        let mock = Mock::new([with_retry_after(503, bad)]);
        let start = Instant::now();
        let response = layer(policy(100))
            .layer(mock)
            .oneshot(get("http://h/"))
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "{bad:?}");
        assert_eq!(start.elapsed(), 200 * MS, "backoff alone for {bad:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_hint_never_makes_a_response_retryable() {
    let mock = Mock::new([with_retry_after(404, "1"), Reply::Status(200)]);
    let response = layer(policy(100))
        .layer(mock.clone())
        .oneshot(get("http://h/"))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    assert_eq!(mock.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn no_wait_starts_that_would_end_after_the_deadline() {
    // Waits 800 ms then 1600 ms; the deadline of 2 s allows only the first.
    let mock = Mock::statuses(&[503, 503, 503]);
    let start = Instant::now();
    let response = layer(policy(400).max_attempts(5).deadline(Duration::from_secs(2)))
        .layer(mock.clone())
        .oneshot(get("http://h/"))
        .await
        .unwrap();
    assert_eq!(response.status(), 503, "the last outcome is returned");
    assert_eq!(start.elapsed(), 800 * MS);
    assert_eq!(mock.calls(), 2);
    assert_eq!(info(&response).stop(), StopReason::Deadline);
}

#[tokio::test(start_paused = true)]
async fn a_hint_that_would_end_after_the_deadline_returns_at_once() {
    let mock = Mock::new([with_retry_after(503, "5")]);
    let start = Instant::now();
    let response = layer(policy(100).deadline(Duration::from_secs(3)))
        .layer(mock.clone())
        .oneshot(get("http://h/"))
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(info(&response).stop(), StopReason::HintTooLong);
}

#[tokio::test(start_paused = true)]
async fn an_attempt_in_flight_at_the_deadline_is_dropped() {
    let mock = Mock::new([slow_200()]);
    let start = Instant::now();
    let err = layer(policy(100).deadline(Duration::from_secs(1)))
        .layer(mock.clone())
        .oneshot(get("http://h/"))
        .await
        .unwrap_err();
    let deadline = common::last(&err)
        .downcast_ref::<DeadlineExceeded>()
        .expect("DeadlineExceeded");
    assert_eq!(deadline.deadline(), Duration::from_secs(1));
    let retry = err.downcast_ref::<RetryError>().expect("the layer's error");
    assert_eq!(retry.info().attempts(), 1);
    assert_eq!(start.elapsed(), Duration::from_secs(1));
    assert_eq!(mock.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_slow_attempt_times_out_and_is_retried() {
    let mock = Mock::new([slow_200()]);
    let start = Instant::now();
    let response = layer(policy(100).attempt_timeout(Duration::from_secs(1)))
        .layer(mock.clone())
        .oneshot(get("http://h/"))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        start.elapsed(),
        1200 * MS,
        "1 s timeout, then a 200 ms wait"
    );
    let record = info(&response);
    assert_eq!(record.retries()[0].reason, RetryReason::Timeout);
    assert_eq!(mock.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn the_last_timeout_is_returned_as_attempt_timed_out() {
    let mock = Mock::new([slow_200(), slow_200()]);
    let err = layer(
        policy(100)
            .max_attempts(2)
            .attempt_timeout(Duration::from_millis(300)),
    )
    .layer(mock.clone())
    .oneshot(get("http://h/"))
    .await
    .unwrap_err();
    let timed_out = common::last(&err)
        .downcast_ref::<AttemptTimedOut>()
        .expect("AttemptTimedOut");
    let retry = err.downcast_ref::<RetryError>().expect("the layer's error");
    assert_eq!(
        (retry.info().returned(), timed_out.timeout()),
        (Some(2), 300 * MS)
    );
}

#[tokio::test(start_paused = true)]
async fn an_attempt_gets_at_most_the_time_left() {
    let mock = Mock::new([slow_200(), slow_200()]);
    let start = Instant::now();
    let err = layer(
        policy(100)
            .attempt_timeout(Duration::from_secs(1))
            .deadline(Duration::from_millis(1500)),
    )
    .layer(mock.clone())
    .oneshot(get("http://h/"))
    .await
    .unwrap_err();
    // 1 s timeout, 200 ms wait, then the second attempt is cut by the deadline at 1.5 s.
    assert!(common::last(&err).is::<DeadlineExceeded>(), "{err}");
    assert_eq!(start.elapsed(), 1500 * MS);
    assert_eq!(mock.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_post_that_timed_out_without_a_key_is_not_retried() {
    let mock = Mock::new([slow_200()]);
    let err = layer(policy(100).attempt_timeout(Duration::from_secs(1)))
        .policy(RetryPolicy::new().idempotency_key(None))
        .layer(mock.clone())
        .oneshot(common::request(http::Method::POST, "http://h/", b"x"))
        .await
        .unwrap_err();
    assert!(common::last(&err).is::<AttemptTimedOut>());
    assert_eq!(mock.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn dropping_the_future_sends_nothing_more() {
    // While waiting.
    let mock = Mock::statuses(&[503, 503]);
    let svc = layer(policy(1000)).layer(mock.clone());
    let mut future = Box::pin(svc.oneshot(get("http://h/")));
    assert!(common::poll_once(&mut future).await.is_pending());
    tokio::time::advance(100 * MS).await;
    assert!(common::poll_once(&mut future).await.is_pending());
    assert_eq!(mock.calls(), 1);
    drop(future);
    tokio::time::advance(Duration::from_secs(60)).await;
    tokio::task::yield_now().await;
    assert_eq!(mock.calls(), 1);

    // During an attempt.
    let mock = Mock::new([Reply::Slow(
        Duration::from_secs(5),
        Box::new(Reply::Status(503)),
    )]);
    let svc = layer(policy(100)).layer(mock.clone());
    let mut future = Box::pin(svc.oneshot(get("http://h/")));
    assert!(common::poll_once(&mut future).await.is_pending());
    drop(future);
    tokio::time::advance(Duration::from_secs(60)).await;
    tokio::task::yield_now().await;
    assert_eq!(mock.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_final_error_at_the_deadline_is_recorded_as_the_deadline() {
    // The inner service's own timer fires with the layer's deadline (as a tonic `Channel`
    // does for the `grpc-timeout` the layer sent): its error comes back unchanged, and the
    // record says the deadline ended the request.
    let timer_error =
        || std::io::Error::new(std::io::ErrorKind::InvalidData, "inner timer expired");
    let mock = Mock::new([Reply::Slow(
        Duration::from_secs(1),
        Box::new(Reply::error(timer_error)),
    )]);
    let err = layer(policy(100).deadline(Duration::from_secs(1)))
        .layer(mock.clone())
        .oneshot(get("http://h/"))
        .await
        .unwrap_err();
    let retry = err
        .downcast_ref::<tower_http_retry::RetryError>()
        .expect("a RetryError");
    assert_eq!(retry.info().stop(), StopReason::Deadline);
    assert_eq!(retry.info().attempts(), 1);
    assert_eq!(common::last(&err).to_string(), "inner timer expired");
    assert_eq!(mock.calls(), 1);

    // The same error before the deadline is final.
    let mock = Mock::new([Reply::Slow(
        Duration::from_millis(500),
        Box::new(Reply::error(timer_error)),
    )]);
    let err = layer(policy(100).deadline(Duration::from_secs(1)))
        .layer(mock)
        .oneshot(get("http://h/"))
        .await
        .unwrap_err();
    let retry = err
        .downcast_ref::<tower_http_retry::RetryError>()
        .expect("a RetryError");
    assert_eq!(retry.info().stop(), StopReason::Final);
}

/// An answer slower than every deadline and attempt timeout here: a 200 after 10 s.
fn slow_200() -> Reply {
    Reply::Slow(Duration::from_secs(10), Box::new(Reply::Status(200)))
}

/// The deadline header on every attempt, as the mock saw it.
fn timeouts(mock: &Mock) -> Vec<String> {
    mock.seen()
        .iter()
        .map(
            |seen| match seen.headers.get_all("x-timeout-ms").iter().count() {
                1 => seen.headers["x-timeout-ms"].to_str().unwrap().to_string(),
                n => format!("{n} values"),
            },
        )
        .collect()
}

#[tokio::test(start_paused = true)]
async fn every_attempt_carries_the_time_it_has() {
    // Waits 400 ms then 800 ms; each attempt has the lesser of what is left of 2 s and
    // its own 1.8 s.
    let mock = Mock::statuses(&[503, 503]);
    let limited = policy(200)
        .deadline(Duration::from_secs(2))
        .attempt_timeout(Duration::from_millis(1800))
        .deadline_header(http::HeaderName::from_static("x-timeout-ms"))
        // A header of its own: `no_hooks` leaves it on.
        .no_hooks();
    let mut request = get("http://h/");
    request
        .headers_mut()
        .insert("x-timeout-ms", http::HeaderValue::from_static("99999"));
    let response = layer(limited)
        .layer(mock.clone())
        .oneshot(request)
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(timeouts(&mock), ["1800", "1600", "800"]);

    // A route that turns it off; a policy without limits writes nothing.
    let mock = Mock::statuses(&[503]);
    let layer = RetryLayer::new()
        .policy(
            policy(1)
                .deadline(Duration::from_secs(2))
                .envoy_deadline_header(),
        )
        .route(
            tower_http_retry::RouteMatch::any().path_prefix("/off"),
            RetryPolicy::new().deadline_header(None),
        )
        .route(
            tower_http_retry::RouteMatch::any().path_prefix("/unbounded"),
            RetryPolicy::new().deadline(None),
        );
    let service = layer.layer(mock.clone());
    service.clone().oneshot(get("http://h/")).await.unwrap();
    service.clone().oneshot(get("http://h/off")).await.unwrap();
    service.oneshot(get("http://h/unbounded")).await.unwrap();
    let seen = mock.seen();
    let envoy = |i: usize| {
        seen[i]
            .headers
            .get("x-envoy-upstream-rq-timeout-ms")
            .cloned()
    };
    assert_eq!(seen.len(), 4);
    assert_eq!(envoy(0).unwrap(), "2000");
    assert_eq!(envoy(1).unwrap(), "1998", "a retry after 2 ms");
    assert_eq!((envoy(2), envoy(3)), (None, None));
}

#[tokio::test(start_paused = true)]
async fn no_attempt_starts_with_less_than_the_floor() {
    // Waits 400 ms then 800 ms; with a 2 s deadline and a 900 ms floor, the second retry
    // would start with 800 ms left: the last outcome is returned, after one retry.
    let mock = Mock::statuses(&[503, 503, 503]);
    let start = Instant::now();
    let response = layer(
        policy(200)
            .max_attempts(5)
            .deadline(Duration::from_secs(2))
            .min_time_left(Duration::from_millis(900)),
    )
    .layer(mock.clone())
    .oneshot(get("http://h/"))
    .await
    .unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!((mock.calls(), start.elapsed()), (2, 400 * MS));
    assert_eq!(info(&response).stop(), StopReason::Deadline);

    // A deadline shorter than the floor: nothing is sent, and the error says why.
    let mock = Mock::statuses(&[]);
    let err = layer(policy(1).min_time_left(Duration::from_millis(50)))
        .layer(mock.clone())
        .oneshot({
            let mut request = get("http://h/");
            request
                .extensions_mut()
                .insert(tower_http_retry::RequestDeadline(
                    (Instant::now() + 30 * MS).into_std(),
                ));
            request
        })
        .await
        .unwrap_err();
    let retry = err.downcast_ref::<RetryError>().expect("the layer's error");
    assert_eq!(
        (retry.info().attempts(), retry.info().stop()),
        (0, StopReason::Deadline)
    );
    assert!(retry.get_ref().is::<DeadlineExceeded>());
    assert!(
        retry.to_string().contains("less than the 50ms floor"),
        "{retry}"
    );
    assert_eq!(mock.calls(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_request_deadline_in_the_extensions_bounds_the_policy_s() {
    // The shorter applies: the request's 300 ms under the policy's 2 s, the policy's 1 s
    // under the request's 5 s.
    for (policy_s, request_ms, expected_ms) in [(2, 300, 300), (1, 5_000, 1_000)] {
        let mock = Mock::new([slow_200()]);
        let start = Instant::now();
        let mut request = get("http://h/");
        request
            .extensions_mut()
            .insert(tower_http_retry::RequestDeadline(
                (start + request_ms * MS).into_std(),
            ));
        let err = layer(policy(1).deadline(Duration::from_secs(policy_s)))
            .layer(mock.clone())
            .oneshot(request)
            .await
            .unwrap_err();
        assert!(common::last(&err).is::<DeadlineExceeded>());
        assert_eq!(start.elapsed(), expected_ms * MS);
    }
}
