//! Server-directed delays beyond `Retry-After`: the RateLimit fields,
//! `X-RateLimit-Reset`, a classifier's own hint. Exact waits under paused time against a
//! mock, then each header from a real hyper server on 127.0.0.1.

#![allow(clippy::disallowed_methods)] // the real-server case measures real time

use crate::common;
use tower::ServiceExt;

use std::time::{Duration, SystemTime};

use common::server::{respond_with, serve};
use common::{Mock, Reply, get};
use http::{Request, StatusCode};
use tower::Layer;
use tower_http_retry::classify::{
    Classification, Classify, DefaultClassifier, Outcome, RetryReason,
};
use tower_http_retry::hints::{Hint, HintSource};
use tower_http_retry::{Backoff, Jitter, RetryInfo, RetryLayer, RetryPolicy, StopReason};

/// A 10 ms fixed backoff, so that every wait above it is a hint's.
fn layer() -> RetryLayer {
    RetryLayer::new().policy(
        RetryPolicy::default().max_attempts(2).backoff(
            Backoff::exponential(Duration::from_millis(10), Duration::from_millis(10))
                .jitter(Jitter::None),
        ),
    )
}

fn hinted(code: u16, headers: &[(&'static str, &str)]) -> Mock {
    let headers = headers.iter().map(|(k, v)| (*k, v.to_string())).collect();
    Mock::new([Reply::Headers(code, headers), Reply::Status(200)])
}

async fn waits(mock: Mock) -> RetryInfo {
    let start = tokio::time::Instant::now();
    let response = layer().layer(mock).oneshot(get("http://h/")).await.unwrap();
    let info = response.extensions().get::<RetryInfo>().unwrap().clone();
    assert_eq!(
        start.elapsed(),
        info.total_wait(),
        "slept exactly the recorded waits"
    );
    info
}

fn only(info: &RetryInfo) -> (Duration, Option<HintSource>) {
    assert_eq!(info.retries().len(), 1, "{info:?}");
    (info.retries()[0].wait, info.retries()[0].hint)
}

#[tokio::test(start_paused = true)]
async fn a_ratelimit_field_with_nothing_left_is_waited_out() {
    let info = waits(hinted(429, &[("ratelimit", "\"default\";r=0;t=7")])).await;
    assert_eq!(
        only(&info),
        (Duration::from_secs(7), Some(HintSource::RateLimit))
    );
    assert_ne!(
        info.retries()[0].hint,
        Some(tower_http_retry::hints::HintSource::RetryAfter)
    );
}

#[tokio::test(start_paused = true)]
async fn several_policies_wait_for_the_longest_exhausted_one() {
    let value = "\"burst\";r=0;t=3, \"hourly\";r=0;t=9, \"daily\";r=50;t=3000";
    let info = waits(hinted(429, &[("ratelimit", value)])).await;
    assert_eq!(
        only(&info),
        (Duration::from_secs(9), Some(HintSource::RateLimit))
    );
}

#[tokio::test(start_paused = true)]
async fn quota_left_or_a_malformed_field_means_the_backoff_alone() {
    for value in [
        "\"default\";r=5;t=30",
        "\"default\";r=0;t=1.5",
        "default;r=0;t=",
        "(((",
    ] {
        let info = waits(hinted(503, &[("ratelimit", value)])).await;
        assert_eq!(only(&info), (Duration::from_millis(10), None), "{value}");
    }
}

#[tokio::test(start_paused = true)]
async fn x_ratelimit_reset_as_seconds_and_as_a_unix_time() {
    let info = waits(hinted(
        429,
        &[("x-ratelimit-remaining", "0"), ("x-ratelimit-reset", "4")],
    ))
    .await;
    assert_eq!(
        only(&info),
        (Duration::from_secs(4), Some(HintSource::XRateLimitReset))
    );

    // A Unix time, measured against the response's own Date: 6 s after it.
    let date = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    let info = waits(hinted(
        429,
        &[
            ("date", &httpdate::fmt_http_date(date)),
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", "1700000006"),
        ],
    ))
    .await;
    assert_eq!(
        only(&info),
        (Duration::from_secs(6), Some(HintSource::XRateLimitReset))
    );

    // Quota left: no hint.
    let info = waits(hinted(
        429,
        &[("x-ratelimit-remaining", "3"), ("x-ratelimit-reset", "4")],
    ))
    .await;
    assert_eq!(only(&info), (Duration::from_millis(10), None));
}

#[tokio::test(start_paused = true)]
async fn retry_after_takes_precedence_else_the_longest_of_the_others() {
    let info = waits(hinted(
        503,
        &[("retry-after", "2"), ("ratelimit", "\"default\";r=0;t=20")],
    ))
    .await;
    assert_eq!(
        only(&info),
        (Duration::from_secs(2), Some(HintSource::RetryAfter))
    );
    assert_eq!(
        info.retries()[0].hint,
        Some(tower_http_retry::hints::HintSource::RetryAfter)
    );
    let info = waits(hinted(
        503,
        &[
            ("ratelimit", "\"default\";r=0;t=3"),
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", "5"),
        ],
    ))
    .await;
    assert_eq!(
        only(&info),
        (Duration::from_secs(5), Some(HintSource::XRateLimitReset))
    );
}

#[tokio::test(start_paused = true)]
async fn a_hint_on_a_status_that_is_not_retried_changes_nothing() {
    let mock = hinted(400, &[("ratelimit", "\"default\";r=0;t=5")]);
    let response = layer()
        .layer(mock.clone())
        .oneshot(get("http://h/"))
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
    let info = response.extensions().get::<RetryInfo>().unwrap();
    assert_eq!((info.attempts(), info.stop()), (1, StopReason::Final));
    assert_eq!(mock.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn too_long_a_hint_returns_the_response_at_once() {
    let mock = hinted(429, &[("ratelimit", "\"default\";r=0;t=3600")]);
    let start = tokio::time::Instant::now();
    let response = layer()
        .layer(mock.clone())
        .oneshot(get("http://h/"))
        .await
        .unwrap();
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(response.status(), 429);
    let info = response.extensions().get::<RetryInfo>().unwrap();
    assert_eq!(info.stop(), StopReason::HintTooLong);
    assert_eq!(mock.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_classifiers_own_hint_comes_first() {
    // An API that says how long to wait in a header of its own.
    let policy = RetryPolicy::default()
        .max_attempts(2)
        .backoff(
            Backoff::exponential(Duration::from_millis(10), Duration::from_millis(10))
                .jitter(Jitter::None),
        )
        .classifier(|head, outcome| match outcome {
            Outcome::Response {
                status, headers, ..
            } if status == StatusCode::SERVICE_UNAVAILABLE => {
                match headers
                    .get("x-busy-for-ms")
                    .and_then(|v| v.to_str().ok()?.parse().ok())
                {
                    Some(ms) => Classification::RetryWithHint(
                        RetryReason::Custom("busy"),
                        Hint::new(Duration::from_millis(ms), HintSource::Classifier),
                    ),
                    None => DefaultClassifier.classify(head, outcome),
                }
            }
            _ => DefaultClassifier.classify(head, outcome),
        });
    let mock = hinted(503, &[("x-busy-for-ms", "1500"), ("retry-after", "9")]);
    let start = tokio::time::Instant::now();
    let response = RetryLayer::new()
        .policy(policy)
        .layer(mock)
        .oneshot(get("http://h/"))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(start.elapsed(), Duration::from_millis(1500));
    let info = response.extensions().get::<RetryInfo>().unwrap();
    assert_eq!(
        only(info),
        (Duration::from_millis(1500), Some(HintSource::Classifier))
    );
    assert_eq!(info.retries()[0].reason, RetryReason::Custom("busy"));
}

/// Each header from a real hyper server: the second attempt comes no sooner than the
/// server asked (real time, one second each).
#[tokio::test]
async fn each_header_from_a_real_server_is_waited_out() {
    type Headers = Vec<(&'static str, &'static str)>;
    let cases: [(&str, Headers, HintSource); 3] = [
        (
            "retry-after",
            vec![("retry-after", "1")],
            HintSource::RetryAfter,
        ),
        (
            "ratelimit",
            vec![("ratelimit", "\"default\";r=0;t=1")],
            HintSource::RateLimit,
        ),
        (
            "x-ratelimit-reset",
            vec![("x-ratelimit-remaining", "0"), ("x-ratelimit-reset", "1")],
            HintSource::XRateLimitReset,
        ),
    ];
    for (name, headers, source) in cases {
        let server = serve(move |hit| {
            let headers = headers.clone();
            async move {
                if hit.index == 0 {
                    respond_with(429, &headers)
                } else {
                    respond_with(200, &[])
                }
            }
        })
        .await;
        let start = std::time::Instant::now();
        let req = Request::get(server.url("/limited"))
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap();
        let response = layer()
            .layer(common::server::client())
            .oneshot(req)
            .await
            .unwrap();
        let elapsed = start.elapsed();
        assert_eq!(response.status(), 200, "{name}");
        let info = response.extensions().get::<RetryInfo>().unwrap();
        assert_eq!(only(info), (Duration::from_secs(1), Some(source)), "{name}");
        assert!(elapsed >= Duration::from_secs(1), "{name}: {elapsed:?}");
        assert_eq!(server.count(), 2, "{name}");
    }
}
