//! The cost-weighted retry quota (the AWS SDKs' standard mode) through the layer: a retry
//! costs tokens by the failure it follows, a success refunds its request's last retry, a
//! first-try success adds the reward; the balances are exact.
#![allow(clippy::disallowed_methods)] // tokio's paused clock and sleeps, or real time

use crate::common;
use tower::ServiceExt;

use std::time::Duration;

use common::{Mock, get};
use http::Method;
use tower::Layer;
use tower_http_retry::classify::{Classification, Classify, DefaultClassifier, Outcome};
use tower_http_retry::{
    Backoff, Jitter, RetryInfo, RetryLayer, RetryPolicy, RetryQuota, StopReason, Throttle,
};

fn policy(attempts: u32) -> RetryPolicy {
    RetryPolicy::default().max_attempts(attempts).backoff(
        Backoff::exponential(Duration::from_millis(1), Duration::from_millis(1))
            .jitter(Jitter::None),
    )
}

/// smithy-rs's "quota runs out before max attempts" (aws-smithy-runtime `tests/retries.rs`,
/// the same case through its standard strategy): 500 tokens at 10 per retry after a
/// transient error pay for 50 retries, so an always-failing request makes 51 attempts.
#[tokio::test(start_paused = true)]
async fn the_quota_runs_out_before_the_attempts_do() {
    let quota = RetryQuota::default();
    let mock = Mock::statuses(&[503; 200]);
    let client = RetryLayer::new()
        .policy(RetryPolicy::new().no_gates().gate(quota.clone()))
        .policy(policy(100))
        .layer(mock.clone());
    let response = client.oneshot(get("http://api.test/")).await.unwrap();
    let info = response
        .extensions()
        .get::<tower_http_retry::RetryInfo>()
        .unwrap();
    assert_eq!(info.attempts(), 51);
    assert_eq!(info.stop(), StopReason::BudgetExhausted);
    assert_eq!(mock.calls(), 51);
    assert_eq!(quota.tokens(), 0.0);
}

/// One request after another, each balance worked out by hand from the costs.
#[tokio::test(start_paused = true)]
async fn each_balance_follows_the_costs_refunds_and_rewards() {
    let quota = RetryQuota::builder().max_tokens(20.0).build();
    let mock = Mock::statuses(&[
        503, 503, 200, // two transient retries (10 each), the last refunded
        200, // a first-try success: the reward
        429, 200, // a throttling retry (5), refunded
        503, 503, // 10 taken; the next 10 is not there
    ]);
    let client = RetryLayer::new()
        .policy(RetryPolicy::new().no_gates().gate(quota.clone()))
        .policy(policy(3))
        .layer(mock);
    let mut balances = Vec::new();
    let mut stops = Vec::new();
    for _ in 0..4 {
        let response = client
            .clone()
            .oneshot(get("http://api.test/"))
            .await
            .unwrap();
        let info = response
            .extensions()
            .get::<tower_http_retry::RetryInfo>()
            .unwrap();
        stops.push(info.stop());
        balances.push(quota.tokens());
    }
    assert_eq!(balances, [10.0, 11.0, 11.0, 1.0]);
    assert_eq!(
        stops,
        [
            StopReason::Final,
            StopReason::Final,
            StopReason::Final,
            StopReason::BudgetExhausted
        ]
    );
}

/// A transparent retry (a stream the server refused before it left) is the transport's,
/// not a failure of the server's: the quota neither pays for it nor counts it as a retry,
/// so a success after it is a first-try success for the quota. (The refusal is h2's
/// `RST_STREAM(REFUSED_STREAM)`: recognised with the `h2` feature.)
#[cfg(feature = "h2")]
#[tokio::test]
async fn a_transparent_retry_costs_the_quota_nothing() {
    use common::transport::{H2Action, Proto, Script, client, h2_server};

    let server = h2_server(|index| match index {
        0 => H2Action::Refuse,
        1 => H2Action::Apply(503),
        _ => H2Action::Apply(200),
    })
    .await;
    let quota = RetryQuota::builder().max_tokens(100.0).build();
    let client = RetryLayer::new()
        .policy(RetryPolicy::new().no_gates().gate(quota.clone()))
        .policy(policy(3).transparent_retry(true))
        .layer(client(Proto::H2));
    let request = http::Request::get(server.url("/"))
        .body(Script::empty())
        .unwrap();
    let response = client.oneshot(request).await.unwrap();
    assert_eq!(response.status(), 200);
    let info = response
        .extensions()
        .get::<tower_http_retry::RetryInfo>()
        .unwrap();
    let kinds: Vec<_> = info.retries().iter().map(|r| r.kind).collect();
    assert_eq!(
        kinds,
        [
            tower_http_retry::AttemptKind::Transparent,
            tower_http_retry::AttemptKind::Retry
        ]
    );
    // The 503's retry cost 10 and its success refunded it; the refusal cost nothing.
    assert_eq!(quota.tokens(), 100.0);
}

/// A retry that cost nothing is still a retry: the success after it refunds its 0 and earns
/// no first-try reward (smithy-rs releases the zero permit).
#[tokio::test(start_paused = true)]
async fn a_success_after_a_free_retry_earns_no_reward() {
    let quota = RetryQuota::builder()
        .max_tokens(20.0)
        .retry_cost(0.0)
        .transient_retry_cost(10.0)
        .build();
    let mock = Mock::statuses(&[503, 503, 503, 429, 200]);
    let client = RetryLayer::new()
        .policy(RetryPolicy::new().no_gates().gate(quota.clone()))
        .policy(policy(3))
        .layer(mock);
    // Three 503s: two retries at 10, no success to refund them.
    client
        .clone()
        .oneshot(get("http://api.test/"))
        .await
        .unwrap();
    assert_eq!(quota.tokens(), 0.0);
    // A 429's retry costs 0 here; the success after it refunds that 0, no reward.
    client.oneshot(get("http://api.test/")).await.unwrap();
    assert_eq!(
        quota.tokens(),
        0.0,
        "no reward after a retry, even a free one"
    );
}

// ---- Every gate hears every request it covers, whatever the policy's attempt limit ----

/// Drains `quota` (20 tokens) to 10 with one transient retry that never succeeds.
async fn drain_to_ten(quota: &RetryQuota) {
    let client = RetryLayer::new()
        .policy(RetryPolicy::new().no_gates().gate(quota.clone()))
        .policy(policy(2))
        .layer(Mock::statuses(&[503, 503]));
    client.oneshot(get("http://api.test/")).await.unwrap();
    assert_eq!(quota.tokens(), 10.0);
}

/// smithy-rs's standard strategy rewards a first-try success even with retries disabled: a
/// quota drained to 10 of 20 is at 15 after five of them under `max_attempts(1)`. Under
/// `never()` the quota hears nothing and stays at 10.
#[tokio::test(start_paused = true)]
async fn one_attempt_still_rewards_the_quota_and_never_does_not() {
    for (policy, after) in [
        (RetryPolicy::default().max_attempts(1), 15.0),
        (RetryPolicy::never(), 10.0),
    ] {
        let quota = RetryQuota::builder().max_tokens(20.0).build();
        drain_to_ten(&quota).await;
        let client = RetryLayer::new()
            .policy(RetryPolicy::new().no_gates().gate(quota.clone()))
            .policy(policy.clone())
            .layer(Mock::statuses(&[200; 5]));
        for _ in 0..5 {
            let response = client
                .clone()
                .oneshot(get("http://api.test/"))
                .await
                .unwrap();
            let info = response.extensions().get::<RetryInfo>().unwrap();
            assert_eq!((info.attempts(), info.stop()), (1, StopReason::Disabled));
        }
        assert_eq!(quota.tokens(), after, "{policy:?}");
    }
}

/// Under `max_attempts(1)` the A6 throttle hears a failure the classifier would have
/// retried (a 503, a reset), and a success; not a final outcome (a 404), and nothing at
/// all under `never()` or for CONNECT.
#[tokio::test(start_paused = true)]
async fn one_attempt_still_tells_the_throttle_of_its_failures() {
    let reset = || std::io::Error::from(std::io::ErrorKind::ConnectionReset);
    let cases: [(RetryPolicy, Method, common::Reply, f64); 7] = [
        (policy(1), Method::GET, common::Reply::Status(503), 9.0),
        (policy(1), Method::POST, common::Reply::Status(503), 9.0),
        (policy(1), Method::GET, common::Reply::error(reset), 9.0),
        (policy(1), Method::GET, common::Reply::Status(404), 10.0),
        (
            RetryPolicy::never(),
            Method::GET,
            common::Reply::Status(503),
            10.0,
        ),
        (policy(3), Method::CONNECT, common::Reply::Status(503), 10.0),
        // A success gives a tenth of a token back, after the one failure before it.
        (policy(1), Method::GET, common::Reply::Status(200), 9.1),
    ];
    for (i, (policy, method, reply, tokens)) in cases.into_iter().enumerate() {
        let throttle = Throttle::builder()
            .max_tokens(10.0)
            .token_ratio(0.1)
            .build();
        if i == 6 {
            let fail = RetryLayer::new()
                .policy(RetryPolicy::new().gate(throttle.clone()))
                .policy(policy.clone())
                .layer(Mock::statuses(&[503]));
            fail.oneshot(get("http://api.test/")).await.unwrap();
        }
        let client = RetryLayer::new()
            .policy(RetryPolicy::new().gate(throttle.clone()))
            .policy(policy.clone())
            .layer(Mock::new([reply]));
        let uri = match method {
            Method::CONNECT => "http://api.test:443",
            _ => "http://api.test/",
        };
        let request = http::Request::builder()
            .method(method.clone())
            .uri(uri)
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap();
        let _ = client.oneshot(request).await;
        assert!(
            (throttle.tokens() - tokens).abs() < 1e-9,
            "case {i}: {method} under {policy:?}: {} tokens, expected {tokens}",
            throttle.tokens()
        );
    }
}

/// A classifier that reads the request head still judges a one-attempt request's outcome
/// for its gates: here it calls a 409 on `/cart` a failure worth a retry.
#[tokio::test(start_paused = true)]
async fn one_attempt_reports_through_a_classifier_that_reads_the_request() {
    let throttle = Throttle::builder()
        .max_tokens(10.0)
        .token_ratio(0.1)
        .build();
    let policy = RetryPolicy::default()
        .max_attempts(1)
        .classifier(|head, outcome| match outcome {
            Outcome::Response { status, .. } if status == 409 && head.uri.path() == "/cart" => {
                Classification::Retry(tower_http_retry::classify::RetryReason::Custom("conflict"))
            }
            _ => DefaultClassifier.classify(head, outcome),
        });
    let client = RetryLayer::new()
        .policy(RetryPolicy::new().gate(throttle.clone()))
        .policy(policy)
        .layer(Mock::statuses(&[409, 409]));
    client
        .clone()
        .oneshot(get("http://api.test/other"))
        .await
        .unwrap();
    assert_eq!(throttle.tokens(), 10.0, "a 409 elsewhere is final");
    client.oneshot(get("http://api.test/cart")).await.unwrap();
    assert_eq!(throttle.tokens(), 9.0);
}

/// The AWS SDKs' 2026 standard mode through the layer, on a quota of 30 ("quota 30
/// recovery" of their tables, then throttling and exhaustion): 14 after a 500, 502 or 503,
/// 5 after a 429, the last retry refunded on success; the retries sent after the backoff the
/// SDKs pair with it, 50 ms doubling (jitter off here). A retry after the 429 waits the
/// policy's 50 ms too: the SDKs' 1 s after throttling is not a policy setting.
#[tokio::test(start_paused = true)]
async fn the_2026_preset_charges_14_and_5_through_the_layer() {
    let quota = RetryQuota::builder()
        .aws_standard_2026()
        .max_tokens(30.0)
        .build();
    let mock = Mock::statuses(&[
        500, 502, 200, // 30 - 14 - 14 = 2, the last refunded: 16
        500, 200, // 2, then 16
        429, 200, // 11, then 16
        503, 503, // 2; the next 14 is not there
        429, // 5 is not there either
    ]);
    let backoff = Backoff::from_initial(Duration::from_millis(50), Duration::from_secs(20))
        .jitter(Jitter::None);
    let client = RetryLayer::new()
        .policy(RetryPolicy::new().no_gates().gate(quota.clone()))
        .policy(RetryPolicy::default().max_attempts(3).backoff(backoff))
        .layer(mock.clone());
    let start = tokio::time::Instant::now();
    let mut ends = Vec::new();
    for _ in 0..5 {
        let response = client
            .clone()
            .oneshot(get("http://api.test/"))
            .await
            .unwrap();
        let info = response.extensions().get::<RetryInfo>().unwrap();
        ends.push((response.status().as_u16(), info.stop(), quota.tokens()));
    }
    assert_eq!(
        ends,
        [
            (200, StopReason::Final, 16.0),
            (200, StopReason::Final, 16.0),
            (200, StopReason::Final, 16.0),
            (503, StopReason::BudgetExhausted, 2.0),
            (429, StopReason::BudgetExhausted, 2.0),
        ]
    );
    let sent: Vec<u128> = mock
        .seen()
        .iter()
        .map(|seen| (seen.at - start).as_millis())
        .collect();
    assert_eq!(sent, [0, 50, 150, 150, 200, 200, 250, 250, 300, 300]);
}
