//! The `metrics` feature: retries by reason, budget refusals, the histogram of waits.
#![cfg(feature = "metrics")]

mod common;

use std::time::Duration;

use common::{Mock, get};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use tower::{Layer, ServiceExt};
use tower_http_retry::{Backoff, Jitter, RetryBudget, RetryLayer, RetryPolicy};

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
    let layer = RetryLayer::new().policy(policy).budget(
        RetryBudget::builder()
            .ratio(0.0)
            .min_per_sec(0)
            .max_tokens(1)
            .build(),
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

    let mut retries = Vec::new();
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
            ("http_retry_wait_seconds", DebugValue::Histogram(values)) => {
                waits.extend(values.into_iter().map(|v| v.into_inner()))
            }
            _ => {}
        }
    }
    assert_eq!(retries, [("status_503".to_string(), 1)]);
    assert_eq!(refusals, [("connection_closed".to_string(), 1)]);
    assert_eq!(waits, [0.2]);
}
