//! The `metrics` feature: retries by reason, budget refusals, the histogram of waits,
//! hedges and their wins, first attempts refused locally, a body's continuations.
#![cfg(feature = "metrics")]
#![allow(clippy::disallowed_methods)] // tokio's paused clock and sleeps, or real time

mod common;

use std::time::Duration;
use tower::ServiceExt;

use common::{Mock, get};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use tower::Layer;
use tower_http_retry::{
    AdaptiveLimiter, Backoff, Hedging, Jitter, RetryBudget, RetryLayer, RetryPolicy,
};

#[tokio::test(start_paused = true)]
async fn retries_refusals_and_waits_are_recorded() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder
        .install()
        .expect("the only recorder in this test binary");

    let policy = RetryPolicy::default().max_attempts(3).backoff(
        Backoff::exponential(Duration::from_millis(100), Duration::from_secs(1))
            .jitter(Jitter::None),
    );
    // One token: the first request spends it on one retry, its second retry is refused.
    let layer = RetryLayer::new().policy(
        policy.gate(
            RetryBudget::builder()
                .ratio(0.0)
                .min_per_sec(0.0)
                .max_tokens(1.0)
                .build(),
        ),
    );
    let mock = Mock::new([
        common::Reply::Status(503),
        common::Reply::error(|| std::io::Error::from(std::io::ErrorKind::ConnectionReset)),
    ]);
    let response = layer.layer(mock.clone()).oneshot(get("http://h/")).await;
    assert!(
        response.is_err(),
        "the reset after the refused retry is returned"
    );
    assert_eq!(mock.calls(), 2);

    // A hedged request: its hedge is counted as one, not as a retry, and it wins.
    let calls = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let slow_first = {
        let calls = calls.clone();
        tower::service_fn(
            move |_: http::Request<
                tower_http_retry::ReplayBody<http_body_util::Full<bytes::Bytes>>,
            >| {
                let n = calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                async move {
                    if n == 0 {
                        tokio::time::sleep(Duration::from_secs(5)).await;
                    }
                    Ok::<_, std::convert::Infallible>(http::Response::new(()))
                }
            },
        )
    };
    let hedged = RetryLayer::new()
        .policy(RetryPolicy::new().no_gates())
        .policy(
            RetryPolicy::default()
                .max_attempts(2)
                .hedge(Hedging::after(Duration::from_millis(100))),
        );
    hedged
        .layer(slow_first)
        .oneshot(get("http://h/"))
        .await
        .unwrap();

    // A limiter that never waits, after a 429: the next request is refused locally.
    let limiter = AdaptiveLimiter::builder().max_wait(Duration::ZERO).build();
    let limited = RetryLayer::new()
        .policy(RetryPolicy::new().no_gates().max_attempts(1).gate(limiter))
        .layer(Mock::statuses(&[429]));
    assert_eq!(
        limited
            .clone()
            .oneshot(get("http://h/"))
            .await
            .unwrap()
            .status(),
        429
    );
    assert!(limited.oneshot(get("http://h/")).await.is_err());

    // A body cut once: one continuation, after the first retry's wait (twice the base).
    let files = common::files::FileServer::new(
        common::files::File::new(1000),
        &[common::files::Cut::After(300)],
    );
    let resuming = RetryLayer::new()
        .policy(
            RetryPolicy::new().backoff(
                Backoff::exponential(Duration::from_millis(300), Duration::from_secs(1))
                    .jitter(Jitter::None),
            ),
        )
        .resume()
        .layer(files);
    let body = resuming
        .oneshot(get("http://h/file"))
        .await
        .unwrap()
        .into_body();
    let bytes = http_body_util::BodyExt::collect(body)
        .await
        .unwrap()
        .to_bytes();
    assert_eq!(bytes.len(), 1000);

    let mut retries = Vec::new();
    let mut continuations = Vec::new();
    let mut hedges = Vec::new();
    let mut local = Vec::new();
    let mut wins = 0;
    let mut refusals = Vec::new();
    let mut waits = Vec::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let key = key.key();
        let reason = key
            .labels()
            .find(|l| l.key() == "reason")
            .map(|l| l.value().to_string());
        match (key.name(), value) {
            ("http_retry_retries_total", DebugValue::Counter(n)) => {
                retries.push((reason.unwrap(), n))
            }
            ("http_retry_budget_refusals_total", DebugValue::Counter(n)) => {
                refusals.push((reason.unwrap(), n))
            }
            ("http_retry_hedges_total", DebugValue::Counter(n)) => {
                hedges.push((reason.unwrap(), n))
            }
            ("http_retry_hedge_wins_total", DebugValue::Counter(n)) => wins += n,
            ("http_retry_continuations_total", DebugValue::Counter(n)) => {
                continuations.push((reason.unwrap(), n))
            }
            ("http_retry_local_refusals_total", DebugValue::Counter(n)) => {
                let stop = key.labels().find(|l| l.key() == "stop");
                local.push((stop.unwrap().value().to_string(), n))
            }
            ("http_retry_wait_seconds", DebugValue::Histogram(values)) => {
                waits.extend(values.into_iter().map(|v| v.into_inner()))
            }
            _ => {}
        }
    }
    assert_eq!(retries, [("status_503".to_string(), 1)]);
    assert_eq!(refusals, [("connection_closed".to_string(), 1)]);
    assert_eq!(waits, [0.2, 0.6]);
    assert_eq!(continuations, [("connection_closed".to_string(), 1)]);
    assert_eq!(hedges, [("hedge".to_string(), 1)]);
    assert_eq!(wins, 1);
    assert_eq!(local, [("throttled".to_string(), 1)]);
}
