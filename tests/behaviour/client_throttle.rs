//! Client-side throttling (`AdaptiveThrottle`) through the layer: once 429s dominate a
//! server's recent history, attempts to it are rejected before they are sent (a first
//! attempt with the layer's own error, a retry by returning the last outcome), every clone
//! counting together, each server apart when kept per authority. (grpc-go's vectors are
//! the core's unit tests: `src/gate/adaptive_throttle/tests.rs`.)
//!
//! The gate draws at random. With `K` = 1 and `P` = 0.001, once a server has throttled n
//! attempts and accepted none, an attempt goes with probability 0.001 / (n + 0.001): the
//! assertions below allow one such attempt (or, for the retry, check the outcome only when
//! it was rejected), and fail with a probability under 10^-5.
#![allow(clippy::disallowed_methods)] // tokio's paused clock and sleeps, or real time

use crate::common;
use tower::ServiceExt;

use std::time::Duration;

use common::{Mock, get};
use tower::Layer;
use tower_http_retry::{
    AdaptiveThrottle, Backoff, Jitter, LocallyRefused, RetryError, RetryInfo, RetryLayer,
    RetryPolicy, StopReason,
};

fn eager() -> AdaptiveThrottle {
    AdaptiveThrottle::builder()
        .accepts_multiplier(1.0)
        .requests_padding(0.001)
        .per_authority()
        .build()
}

fn policy(throttle: &AdaptiveThrottle, attempts: u32) -> RetryPolicy {
    RetryPolicy::default()
        .max_attempts(attempts)
        .backoff(
            Backoff::exponential(Duration::from_millis(1), Duration::from_millis(1))
                .jitter(Jitter::None),
        )
        .no_gates()
        .gate(throttle.clone())
}

#[tokio::test(start_paused = true)]
async fn once_a_server_throttles_its_attempts_are_rejected_before_they_are_sent() {
    let throttle = eager();
    let throttled = Mock::statuses(&[429; 50]);
    let healthy = Mock::statuses(&[]);
    let to_throttled = RetryLayer::new()
        .policy(policy(&throttle, 1))
        .layer(throttled.clone());
    let to_healthy = RetryLayer::new()
        .policy(policy(&throttle, 1))
        .layer(healthy.clone());
    // The first 429 is sent and heard; of the 20 requests after it, rejected locally, at
    // most one more gets through.
    let first = to_throttled.clone().oneshot(get("http://a.test/")).await;
    assert_eq!(first.unwrap().status(), 429);
    let mut refused = 0;
    for _ in 0..20 {
        match to_throttled.clone().oneshot(get("http://a.test/")).await {
            Ok(response) => assert_eq!(response.status(), 429),
            Err(error) => {
                let error = error.downcast_ref::<RetryError>().unwrap();
                assert!(
                    error.get_ref().is::<LocallyRefused>(),
                    "{}",
                    error.get_ref()
                );
                assert_eq!(
                    (error.info().attempts(), error.info().stop()),
                    (0, StopReason::Throttled)
                );
                assert_eq!(
                    error.info().to_string(),
                    "no attempt sent; stopped: throttled"
                );
                refused += 1;
            }
        }
    }
    assert!(refused >= 19, "{refused}");
    assert_eq!(throttled.calls(), 1 + 20 - refused);
    // Another server, through the same handle kept per authority, has no history: all go.
    for _ in 0..10 {
        let response = to_healthy.clone().oneshot(get("http://b.test/")).await;
        assert_eq!(response.unwrap().status(), 200);
    }
    assert_eq!(healthy.calls(), 10);
}

#[tokio::test(start_paused = true)]
async fn a_retry_it_rejects_returns_the_last_outcome_and_the_window_forgets() {
    let throttle = AdaptiveThrottle::builder()
        .accepts_multiplier(1.0)
        .requests_padding(0.001)
        .window(Duration::from_secs(10), 10)
        .build();
    let mock = Mock::statuses(&[429; 50]);
    let client = RetryLayer::new()
        .policy(policy(&throttle, 3))
        .layer(mock.clone());
    // The first 429 makes the retry after it all but certain to be rejected: the 429 is
    // returned, as a budget's refusal returns it.
    let response = client
        .clone()
        .oneshot(get("http://api.test/"))
        .await
        .unwrap();
    let info = response.extensions().get::<RetryInfo>().unwrap();
    if mock.calls() == 1 {
        assert_eq!(
            (response.status().as_u16(), info.attempts(), info.stop()),
            (429, 1, StopReason::Throttled)
        );
    }
    // Ten seconds later the window holds nothing: the next request is sent.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let calls = mock.calls();
    let _ = client.oneshot(get("http://api.test/")).await;
    assert!(mock.calls() > calls);
}
