//! The cost-weighted retry quota (the AWS SDKs' standard mode) through the layer: a retry
//! costs tokens by the failure it follows, a success refunds its request's last retry, a
//! first-try success adds the reward; the balances are exact.

use crate::common;

use std::time::Duration;

use common::{Mock, get};
use tower::{Layer, ServiceExt};
use tower_http_retry::{Backoff, Jitter, RetryLayer, RetryPolicy, RetryQuota, StopReason};

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
    let quota = RetryQuota::aws_standard();
    let mock = Mock::statuses(&[503; 200]);
    let client = RetryLayer::new()
        .no_budget()
        .quota(quota.clone())
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
    assert_eq!(quota.tokens(), 0);
}

/// One request after another, each balance worked out by hand from the costs.
#[tokio::test(start_paused = true)]
async fn each_balance_follows_the_costs_refunds_and_rewards() {
    let quota = RetryQuota::builder().max_tokens(20).build();
    let mock = Mock::statuses(&[
        503, 503, 200, // two transient retries (10 each), the last refunded
        200, // a first-try success: the reward
        429, 200, // a throttling retry (5), refunded
        503, 503, // 10 taken; the next 10 is not there
    ]);
    let client = RetryLayer::new()
        .no_budget()
        .quota(quota.clone())
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
    assert_eq!(balances, [10, 11, 11, 1]);
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

/// Per authority, a server that fails spends its own pool only.
#[tokio::test(start_paused = true)]
async fn a_per_authority_quota_keeps_each_servers_pool() {
    let quota = RetryQuota::builder().max_tokens(20).per_authority().build();
    let mock = Mock::statuses(&[503, 503, 503, 503, 200]);
    let client = RetryLayer::new()
        .no_budget()
        .quota(quota.clone())
        .policy(policy(4))
        .layer(mock);
    // Down: 503, retry (10), 503, retry (10), 503: out of tokens.
    let response = client
        .clone()
        .oneshot(get("http://down.test/"))
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    // The other server's pool is whole: its 503 is retried (10), then 200 refunds it.
    let response = client.oneshot(get("http://up.test/")).await.unwrap();
    let info = response
        .extensions()
        .get::<tower_http_retry::RetryInfo>()
        .unwrap();
    assert_eq!(response.status(), 200, "{info:?}");
    let pool = |host: &str| quota.partition(&format!("http://{host}/").parse().unwrap());
    assert_eq!(pool("down.test").tokens(), 0);
    assert_eq!(pool("up.test").tokens(), 20);
    assert_eq!(quota.authorities(), 2);
}

/// A transparent retry (a stream the server refused before it left) is the transport's,
/// not a failure of the server's: the quota neither pays for it nor counts it as a retry,
/// so a success after it is a first-try success for the quota.
#[tokio::test]
async fn a_transparent_retry_costs_the_quota_nothing() {
    use common::transport::{H2Action, Proto, Script, client, h2_server};

    let server = h2_server(|index| match index {
        0 => H2Action::Refuse,
        1 => H2Action::Apply(503),
        _ => H2Action::Apply(200),
    })
    .await;
    let quota = RetryQuota::builder().max_tokens(100).build();
    let client = RetryLayer::new()
        .no_budget()
        .quota(quota.clone())
        .policy(policy(3).transparent_retry())
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
    assert_eq!(quota.tokens(), 100);
}

/// A retry that cost nothing is still a retry: the success after it refunds its 0 and earns
/// no first-try reward (smithy-rs releases the zero permit).
#[tokio::test(start_paused = true)]
async fn a_success_after_a_free_retry_earns_no_reward() {
    let quota = RetryQuota::builder()
        .max_tokens(20)
        .retry_cost(0)
        .transient_retry_cost(10)
        .build();
    let mock = Mock::statuses(&[503, 503, 503, 429, 200]);
    let client = RetryLayer::new()
        .no_budget()
        .quota(quota.clone())
        .policy(policy(3))
        .layer(mock);
    // Three 503s: two retries at 10, no success to refund them.
    client
        .clone()
        .oneshot(get("http://api.test/"))
        .await
        .unwrap();
    assert_eq!(quota.tokens(), 0);
    // A 429's retry costs 0 here; the success after it refunds that 0, no reward.
    client.oneshot(get("http://api.test/")).await.unwrap();
    assert_eq!(
        quota.tokens(),
        0,
        "no reward after a retry, even a free one"
    );
}
