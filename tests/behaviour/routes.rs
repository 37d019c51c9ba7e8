//! Per-route policies through the layer, under paused time.

use crate::common;

use std::time::Duration;

use bytes::Bytes;
use common::Mock;
use http::{Method, Request};
use http_body_util::Full;
use tower::{Layer, ServiceExt};
use tower_http_retry::{
    Backoff, IdempotencyKey, Jitter, RetryBudget, RetryInfo, RetryLayer, RetryPolicy, RouteMatch,
    StopReason,
};

fn policy(attempts: u32) -> RetryPolicy {
    RetryPolicy::default().max_attempts(attempts).backoff(
        Backoff::exponential(Duration::from_millis(10), Duration::from_secs(1))
            .jitter(Jitter::None),
    )
}

/// Keys on for the payments API, which de-duplicates on them; off (the default) elsewhere.
fn layer() -> RetryLayer {
    RetryLayer::new()
        .policy(policy(2))
        .route(
            RouteMatch::post()
                .host("*.pay.example")
                .path_prefix("/v1/payments"),
            policy(5).idempotency_key(IdempotencyKey::default()),
        )
        .route(
            RouteMatch::get().host("api.example").path_prefix("/health"),
            RetryPolicy::never(),
        )
        .route(
            RouteMatch::methods([Method::PUT, Method::DELETE]).path_prefix("/v1"),
            policy(4),
        )
}

async fn attempts(layer: &RetryLayer, method: Method, uri: &str) -> u32 {
    let mock = Mock::statuses(&[503; 8]);
    let request = Request::builder()
        .method(method)
        .uri(uri)
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = layer.layer(mock.clone()).oneshot(request).await.unwrap();
    let info = response.extensions().get::<RetryInfo>().unwrap();
    assert_eq!(info.attempts() as usize, mock.calls());
    info.attempts()
}

#[tokio::test(start_paused = true)]
async fn routing_matrix() {
    let layer = layer();
    let cases = [
        (Method::POST, "https://eu.pay.example/v1/payments", 5),
        (
            Method::POST,
            "https://eu.pay.example/v1/payments/77/capture",
            5,
        ),
        // The bare domain is not a subdomain: the default policy, no key, not repeated.
        (Method::POST, "https://pay.example/v1/payments", 1),
        (Method::POST, "https://eu.pay.example/v1/paymentsx", 1),
        (Method::GET, "https://eu.pay.example/v1/payments", 2),
        (Method::GET, "https://api.example/health", 1),
        (Method::GET, "https://api.example/healthz", 2),
        (Method::GET, "https://other.example/health", 2),
        (Method::HEAD, "https://api.example/health", 2),
        (Method::PUT, "https://any.example/v1/items/1", 4),
        (Method::DELETE, "http://127.0.0.1:8080/v1/items/1", 4),
        (Method::PUT, "https://any.example/v2/items/1", 2),
        (Method::PATCH, "https://any.example/v1/items/1", 1),
    ];
    for (method, uri, expected) in cases {
        assert_eq!(
            attempts(&layer, method.clone(), uri).await,
            expected,
            "{method} {uri}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn the_first_matching_route_wins() {
    let layer = RetryLayer::new()
        .route(RouteMatch::any().path_prefix("/a"), policy(4))
        .route(RouteMatch::get().path_prefix("/a/b"), policy(5));
    assert_eq!(attempts(&layer, Method::GET, "http://h/a/b").await, 4);
}

#[tokio::test(start_paused = true)]
async fn a_policy_in_the_request_overrides_its_route() {
    let layer = layer();
    let mock = Mock::statuses(&[503; 8]);
    let mut request = Request::post("https://eu.pay.example/v1/payments")
        .body(Full::new(Bytes::new()))
        .unwrap();
    request
        .extensions_mut()
        .insert(policy(3).idempotency_key(IdempotencyKey::default()));
    layer.layer(mock.clone()).oneshot(request).await.unwrap();
    assert_eq!(mock.calls(), 3);

    let mock = Mock::statuses(&[503; 8]);
    let mut request = Request::put("https://x/v1/a")
        .body(Full::new(Bytes::new()))
        .unwrap();
    request.extensions_mut().insert(RetryPolicy::never());
    let response = layer.layer(mock.clone()).oneshot(request).await.unwrap();
    assert_eq!(mock.calls(), 1);
    assert_eq!(
        response.extensions().get::<RetryInfo>().unwrap().stop(),
        StopReason::Disabled
    );
}

#[tokio::test(start_paused = true)]
async fn routes_with_their_own_budgets_do_not_drain_each_other() {
    // Two retries' worth each; no refill, no deposits.
    let payments = RetryBudget::builder()
        .ratio(0.0)
        .min_per_sec(0)
        .max_tokens(2)
        .build();
    let search = RetryBudget::builder()
        .ratio(0.0)
        .min_per_sec(0)
        .max_tokens(2)
        .build();
    let layer = RetryLayer::new()
        .route(
            RouteMatch::post().path_prefix("/pay"),
            policy(3)
                .budget(payments.clone())
                .idempotency_key(IdempotencyKey::default()),
        )
        .route(
            RouteMatch::get().path_prefix("/search"),
            policy(3).budget(search.clone()),
        );

    // Payments are down and spend their whole budget.
    for _ in 0..3 {
        attempts(&layer, Method::POST, "http://h/pay").await;
    }
    assert!(payments.tokens() < 1.0);
    let mock = Mock::statuses(&[503; 8]);
    let request = Request::post("http://h/pay")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = layer.layer(mock).oneshot(request).await.unwrap();
    let info = response.extensions().get::<RetryInfo>().unwrap();
    assert_eq!(info.stop(), StopReason::BudgetExhausted);
    assert_eq!(info.stop(), StopReason::BudgetExhausted);

    // Search still has its own two retries.
    assert_eq!(search.tokens(), 2.0);
    assert_eq!(attempts(&layer, Method::GET, "http://h/search").await, 3);
    assert_eq!(search.tokens(), 0.0);
}

#[tokio::test(start_paused = true)]
async fn clones_of_one_service_share_one_budget() {
    let budget = RetryBudget::builder()
        .ratio(0.0)
        .min_per_sec(0)
        .max_tokens(3)
        .build();
    let svc = RetryLayer::new()
        .policy(policy(3))
        .budget(budget.clone())
        .layer(Mock::statuses(&[503; 16]));
    let a = svc.clone();
    let b = svc.clone();
    let get = || {
        Request::get("http://h/")
            .body(Full::new(Bytes::new()))
            .unwrap()
    };
    let first = a.oneshot(get()).await.unwrap();
    assert_eq!(first.extensions().get::<RetryInfo>().unwrap().attempts(), 3);
    let second = b.oneshot(get()).await.unwrap();
    let info = second.extensions().get::<RetryInfo>().unwrap();
    assert_eq!(info.attempts(), 2, "the clone found one token left");
    assert_eq!(info.stop(), StopReason::BudgetExhausted);
}

#[tokio::test(start_paused = true)]
async fn a_routes_policy_is_complete_and_inherits_nothing_from_the_default() {
    use common::Reply;
    use tower_http_retry::AttemptTimedOut;

    let base = policy(2).attempt_timeout(Duration::from_secs(1));
    let layer = RetryLayer::new()
        .policy(base.clone())
        // Built from nothing: no attempt timeout, whatever the default policy has.
        .route(
            RouteMatch::get().path_prefix("/bare"),
            RetryPolicy::default(),
        )
        // Built from the base: its attempt timeout too.
        .route(
            RouteMatch::get().path_prefix("/based"),
            base.clone().max_attempts(3),
        );
    let slow = || {
        Mock::new((0..4).map(|_| Reply::Slow(Duration::from_secs(5), Box::new(Reply::Status(200)))))
    };

    let mock = slow();
    let response = layer
        .layer(mock.clone())
        .oneshot(common::get("http://h/bare"))
        .await
        .unwrap();
    assert_eq!(response.status(), 200, "waited the 5 s out");
    assert_eq!(mock.calls(), 1);

    let mock = slow();
    let error = layer
        .layer(mock.clone())
        .oneshot(common::get("http://h/based"))
        .await
        .unwrap_err();
    let timed_out = common::last(&error)
        .downcast_ref::<AttemptTimedOut>()
        .expect("{error}");
    assert_eq!(timed_out.attempt(), 3, "the route's 3 attempts");
    assert_eq!(
        timed_out.timeout(),
        Duration::from_secs(1),
        "the base's timeout"
    );
    assert_eq!(mock.calls(), 3);
}
