//! Per-route policies through the layer, under paused time: which route a request
//! matches, and what its policy is laid over (the layer's) and under (the request's own).
#![allow(clippy::disallowed_methods)] // tokio's paused clock and sleeps, or real time

use crate::common;
use tower::ServiceExt;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use common::Mock;
use http::{Method, Request, Response};
use http_body_util::Full;
use tokio::time::Instant;
use tower::{BoxError, Layer, Service};
use tower_http_retry::classify::{Recognized, RetryReason};
use tower_http_retry::{
    AttemptKind, Backoff, DeadlineExceeded, Hedging, IdempotencyKey, Jitter, ReplayBody,
    RetryBudget, RetryError, RetryInfo, RetryLayer, RetryPolicy, RouteMatch, StopReason, Throttle,
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
        .min_per_sec(0.0)
        .max_tokens(2.0)
        .build();
    let search = RetryBudget::builder()
        .ratio(0.0)
        .min_per_sec(0.0)
        .max_tokens(2.0)
        .build();
    let layer = RetryLayer::new()
        .route(
            RouteMatch::post().path_prefix("/pay"),
            policy(3)
                .gate(payments.clone())
                .idempotency_key(IdempotencyKey::default()),
        )
        .route(
            RouteMatch::get().path_prefix("/search"),
            policy(3).gate(search.clone()),
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
        .min_per_sec(0.0)
        .max_tokens(3.0)
        .build();
    let svc = RetryLayer::new()
        .policy(policy(3).gate(budget.clone()))
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
async fn a_routes_policy_keeps_the_layers_settings_it_does_not_turn_off() {
    use common::Reply;
    use tower_http_retry::AttemptTimedOut;

    let base = policy(2).attempt_timeout(Duration::from_secs(1));
    let layer = RetryLayer::new()
        .policy(base.clone())
        // Turns the layer's attempt timeout off: no attempt timeout.
        .route(
            RouteMatch::get().path_prefix("/bare"),
            RetryPolicy::default().attempt_timeout(None),
        )
        // Sets its attempts only: the layer's attempt timeout too.
        .route(
            RouteMatch::get().path_prefix("/based"),
            RetryPolicy::default().max_attempts(3),
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
    let retry = error.downcast_ref::<RetryError>().expect("{error}");
    assert_eq!(retry.info().attempts(), 3, "the route's 3 attempts");
    assert_eq!(retry.info().returned(), Some(3));
    assert_eq!(
        timed_out.timeout(),
        Duration::from_secs(1),
        "the layer's timeout"
    );
    assert_eq!(mock.calls(), 3);
}

// ---- What a route's policy is laid over, and what is laid over it ----

type Inner = Request<ReplayBody<Full<Bytes>>>;

/// A server that counts its calls and answers call `n` (from 0) with `answer(n)`, a status
/// or an error, after `delay`.
fn counting<F>(
    delay: Duration,
    answer: F,
) -> (
    Arc<AtomicUsize>,
    impl Service<Inner, Response = Response<Full<Bytes>>, Error = BoxError, Future = impl Send> + Clone,
)
where
    F: Fn(usize) -> Result<u16, BoxError> + Clone + Send + Sync + 'static,
{
    let calls = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&calls);
    let service = tower::service_fn(move |_: Inner| {
        let answer = answer(count.fetch_add(1, Ordering::SeqCst));
        async move {
            tokio::time::sleep(delay).await;
            let status = answer?;
            Ok::<_, BoxError>(
                Response::builder()
                    .status(status)
                    .body(Full::new(Bytes::new()))
                    .unwrap(),
            )
        }
    });
    (calls, service)
}

/// Waits of exactly 10 ms.
fn fixed_backoff() -> Backoff {
    Backoff::exponential(Duration::from_millis(10), Duration::from_millis(10)).jitter(Jitter::None)
}

fn info<B>(response: &Response<B>) -> &RetryInfo {
    response.extensions().get::<RetryInfo>().unwrap()
}

/// A route that sets its attempts alone runs within the layer's deadline (routes used to
/// start from the crate's defaults, with no deadline); `deadline(None)` takes it away.
#[tokio::test(start_paused = true)]
async fn a_route_inherits_the_layers_deadline_unless_it_turns_it_off() {
    let layer = RetryLayer::new()
        .policy(
            RetryPolicy::new()
                .deadline(Duration::from_secs(1))
                .backoff(fixed_backoff()),
        )
        .route(
            RouteMatch::get().path_prefix("/bounded"),
            RetryPolicy::new().max_attempts(5),
        )
        .route(
            RouteMatch::get().path_prefix("/unbounded"),
            RetryPolicy::new().max_attempts(5).deadline(None),
        );
    let always_503 = || counting(Duration::from_millis(400), |_| Ok(503));

    // 503 at 400 ms, 10 ms, 503 at 810 ms, 10 ms, and the third attempt, in flight at 1 s,
    // is dropped: the deadline, not the 5 attempts.
    let (calls, server) = always_503();
    let start = Instant::now();
    let error = layer
        .layer(server)
        .oneshot(common::get("http://h/bounded"))
        .await
        .unwrap_err();
    assert_eq!(start.elapsed(), Duration::from_secs(1));
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    let retry = error.downcast_ref::<RetryError>().expect("{error}");
    assert_eq!(retry.info().stop(), StopReason::Deadline);
    let deadline = retry
        .get_ref()
        .downcast_ref::<DeadlineExceeded>()
        .expect("{error}");
    assert_eq!(
        (deadline.deadline(), retry.info().attempts()),
        (Duration::from_secs(1), 3)
    );

    // Without it: the 5 attempts, the last 503 returned after 5 * 400 + 4 * 10 ms.
    let (calls, server) = always_503();
    let start = Instant::now();
    let response = layer
        .layer(server)
        .oneshot(common::get("http://h/unbounded"))
        .await
        .unwrap();
    assert_eq!(start.elapsed(), Duration::from_millis(2_040));
    assert_eq!(calls.load(Ordering::SeqCst), 5);
    assert_eq!(response.status(), 503);
    assert_eq!(
        (info(&response).attempts(), info(&response).stop()),
        (5, StopReason::MaxAttempts)
    );
}

/// A request's own policy is laid over the route it matches: it changes what it sets (here
/// the deadline), and the route's attempts still apply (not the crate's default 3).
#[tokio::test(start_paused = true)]
async fn a_requests_policy_is_laid_over_its_routes() {
    let layer = RetryLayer::new()
        .policy(RetryPolicy::new().backoff(fixed_backoff()))
        .route(
            RouteMatch::get().path_prefix("/four"),
            RetryPolicy::new().max_attempts(4),
        );
    let with_deadline = |deadline: Duration| {
        let mut request = common::get("http://h/four");
        request
            .extensions_mut()
            .insert(RetryPolicy::new().deadline(deadline));
        request
    };

    // A deadline the attempts fit in: the route's four attempts.
    let (calls, server) = counting(Duration::from_millis(400), |_| Ok(503));
    let response = layer
        .layer(server)
        .oneshot(with_deadline(Duration::from_secs(10)))
        .await
        .unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 4);
    assert_eq!(
        (info(&response).attempts(), info(&response).stop()),
        (4, StopReason::MaxAttempts)
    );

    // One they do not: the request's deadline ends it, in the third attempt.
    let (calls, server) = counting(Duration::from_millis(400), |_| Ok(503));
    let start = Instant::now();
    let error = layer
        .layer(server)
        .oneshot(with_deadline(Duration::from_secs(1)))
        .await
        .unwrap_err();
    assert_eq!(start.elapsed(), Duration::from_secs(1));
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    assert!(common::last(&error).is::<DeadlineExceeded>(), "{error}");
}

/// `never()` in a request is absolute: laid over a route that hedges, or one that retries
/// transparently, the request is sent once, and nothing the route sets brings a second
/// attempt back.
#[tokio::test(start_paused = true)]
async fn never_in_a_request_turns_off_its_routes_hedging_and_transparent_retries() {
    let layer = RetryLayer::new()
        .route(
            RouteMatch::get().path_prefix("/hedged"),
            RetryPolicy::new()
                .max_attempts(3)
                .hedge(Hedging::after(Duration::from_millis(100))),
        )
        .route(
            RouteMatch::get().path_prefix("/transparent"),
            RetryPolicy::new().max_attempts(1).transparent_retry(true),
        );
    let never = |uri: &str| {
        let mut request = common::get(uri);
        request.extensions_mut().insert(RetryPolicy::never());
        request
    };
    let slow_200 = || counting(Duration::from_millis(400), |_| Ok(200));
    // The first attempt refused before the server saw it (as a client module recognises
    // an `RST_STREAM(REFUSED_STREAM)`), then 200.
    let refused_then_200 = || {
        counting(Duration::ZERO, |n| match n {
            0 => Err(Recognized::new(
                std::io::Error::other("refused stream"),
                Some(RetryReason::RefusedStream),
            )
            .into()),
            _ => Ok(200),
        })
    };

    // Under the routes' policies: hedged at 100 and 200 ms; a refused attempt sent again
    // at once.
    let (calls, server) = slow_200();
    let response = layer
        .layer(server)
        .oneshot(common::get("http://h/hedged"))
        .await
        .unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    assert_eq!(
        info(&response)
            .retries()
            .iter()
            .filter(|r| r.kind == tower_http_retry::AttemptKind::Hedge)
            .count(),
        2
    );
    let (calls, server) = refused_then_200();
    let response = layer
        .layer(server)
        .oneshot(common::get("http://h/transparent"))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    let kinds: Vec<_> = info(&response).retries().iter().map(|r| r.kind).collect();
    assert_eq!(kinds, [AttemptKind::Transparent]);

    // With `never()` laid over them: once, the slow answer waited for and the refusal
    // returned.
    let (calls, server) = slow_200();
    let start = Instant::now();
    let response = layer
        .layer(server)
        .oneshot(never("http://h/hedged"))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(start.elapsed(), Duration::from_millis(400));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(
        (
            info(&response)
                .retries()
                .iter()
                .filter(|r| r.kind == tower_http_retry::AttemptKind::Hedge)
                .count(),
            info(&response).stop()
        ),
        (0, StopReason::Disabled)
    );
    let (calls, server) = refused_then_200();
    let error = layer
        .layer(server)
        .oneshot(never("http://h/transparent"))
        .await
        .unwrap_err();
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    // The module's own error, as the caller gets it with retries off.
    let io = common::last(&error).downcast_ref::<std::io::Error>();
    assert_eq!(
        io.map(ToString::to_string).as_deref(),
        Some("refused stream")
    );
    let retry = error.downcast_ref::<RetryError>().expect("{error}");
    assert_eq!(retry.info().stop(), StopReason::Disabled);
}

/// A route's own budget replaces the layer's, and the layer's throttle, another kind of
/// gate, still applies beside it; a route that sets `no_gates()` has none of the layer's,
/// its budget included.
#[tokio::test(start_paused = true)]
async fn a_routes_gates_replace_their_kinds_and_no_gates_drops_the_layers() {
    let budget = |tokens: f64| {
        RetryBudget::builder()
            .ratio(0.0)
            .min_per_sec(0.0)
            .max_tokens(tokens)
            .build()
    };
    let (layer_budget, own_budget) = (budget(10.0), budget(10.0));
    // Retries while more than 2 of its 4 tokens are left: 2 failures in a row stop them.
    let throttle = Throttle::builder().max_tokens(4.0).token_ratio(1.0).build();
    let layer = RetryLayer::new()
        .policy(
            RetryPolicy::new()
                .backoff(fixed_backoff())
                .gate(layer_budget.clone())
                .gate(throttle.clone()),
        )
        .route(
            RouteMatch::get().path_prefix("/own"),
            RetryPolicy::new().max_attempts(5).gate(own_budget.clone()),
        );
    let (calls, server) = counting(Duration::ZERO, |_| Ok(503));
    let response = layer
        .layer(server)
        .oneshot(common::get("http://h/own"))
        .await
        .unwrap();
    // The throttle stopped it after two failures (not the 5 attempts); the one retry was
    // paid from the route's budget, not the layer's.
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert_eq!(
        (info(&response).attempts(), info(&response).stop()),
        (2, StopReason::Throttled)
    );
    assert_eq!(throttle.tokens(), 2.0);
    assert_eq!((own_budget.tokens(), layer_budget.tokens()), (9.0, 10.0));

    // A layer whose budget is empty: its own requests are not retried; a route with
    // `no_gates()` retries all the same.
    let drained = budget(1.0);
    let layer = RetryLayer::new()
        .policy(
            RetryPolicy::new()
                .max_attempts(3)
                .backoff(fixed_backoff())
                .gate(drained.clone()),
        )
        .route(
            RouteMatch::get().path_prefix("/free"),
            RetryPolicy::new().no_gates(),
        );
    while tower::retry::budget::Budget::withdraw(&drained) {}
    let (calls, server) = counting(Duration::ZERO, |_| Ok(503));
    let response = layer
        .layer(server)
        .oneshot(common::get("http://h/other"))
        .await
        .unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(info(&response).stop(), StopReason::BudgetExhausted);
    let (calls, server) = counting(Duration::ZERO, |_| Ok(503));
    let response = layer
        .layer(server)
        .oneshot(common::get("http://h/free"))
        .await
        .unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    assert_eq!(
        (info(&response).attempts(), info(&response).stop()),
        (3, StopReason::MaxAttempts)
    );
    assert_eq!(drained.tokens(), 0.0);
}

/// Writes `x-layer-hook` on every attempt.
struct LayerHook;

impl tower_http_retry::AttemptHook for LayerHook {
    fn before_attempt(&self, _: &tower_http_retry::Attempt, headers: &mut http::HeaderMap) {
        headers.insert("x-layer-hook", http::HeaderValue::from_static("1"));
    }
}

/// A route's `no_hooks()` turns off the hooks of the policies beneath it, not the layer's
/// attempt header, a setting of the layer's own.
#[tokio::test(start_paused = true)]
async fn no_hooks_leaves_the_layers_attempt_header() {
    let layer = RetryLayer::new()
        .attempt_header(http::HeaderName::from_static("x-attempt"))
        .policy(
            RetryPolicy::new()
                .on_attempt(LayerHook)
                .backoff(fixed_backoff()),
        )
        .route(
            RouteMatch::any().path_prefix("/plain"),
            RetryPolicy::new().no_hooks(),
        );
    for (uri, hooked) in [("http://h/rpc", true), ("http://h/plain", false)] {
        let mock = common::Mock::statuses(&[503, 200]);
        let response = layer
            .layer(mock.clone())
            .oneshot(common::get(uri))
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        let seen = mock.seen();
        let attempts: Vec<_> = seen
            .iter()
            .map(|s| s.headers["x-attempt"].clone())
            .collect();
        assert_eq!(attempts, ["1", "2"], "{uri}");
        assert!(
            seen.iter()
                .all(|s| s.headers.contains_key("x-layer-hook") == hooked),
            "{uri}: {seen:?}"
        );
    }
}

/// What the layer's policy turns on (as a gRPC layer does for its calls: requests declared
/// repeatable, a hook, transparent retries), a route takes back with
/// `assume_idempotent(false)`, `no_hooks()` and `transparent_retry(false)`.
#[tokio::test(start_paused = true)]
async fn a_route_takes_back_what_the_layers_policy_turned_on() {
    let reset = || std::io::Error::from(std::io::ErrorKind::ConnectionReset);
    let layer = RetryLayer::new()
        .policy(
            RetryPolicy::new()
                .assume_idempotent(true)
                .on_attempt(LayerHook)
                .backoff(fixed_backoff()),
        )
        .route(
            RouteMatch::any().path_prefix("/plain"),
            RetryPolicy::new().assume_idempotent(false).no_hooks(),
        );
    // A keyless POST whose connection was reset: repeatable under the layer's policy, so
    // sent again; on the plain route it may have been applied, so it is not.
    for (uri, calls, hooked) in [("http://h/rpc", 2, true), ("http://h/plain", 1, false)] {
        let mock = common::Mock::new([common::Reply::error(reset)]);
        let result = layer
            .layer(mock.clone())
            .oneshot(common::request(Method::POST, uri, b"{}"))
            .await;
        assert_eq!(mock.calls(), calls, "{uri}");
        let seen = mock.seen();
        assert!(
            seen.iter()
                .all(|s| s.headers.contains_key("x-layer-hook") == hooked),
            "{uri}: {seen:?}"
        );
        match calls {
            2 => assert_eq!(result.unwrap().status(), 200),
            _ => {
                let error = result.unwrap_err();
                let retry = error.downcast_ref::<RetryError>().expect("{error}");
                assert_eq!(retry.info().stop(), StopReason::NotIdempotent);
            }
        }
    }

    // A stream refused before the server saw it: sent again at once outside the count
    // under the layer's policy, returned on the route that turned that off.
    let layer = RetryLayer::new()
        .policy(RetryPolicy::new().max_attempts(1).transparent_retry(true))
        .route(
            RouteMatch::get().path_prefix("/plain"),
            RetryPolicy::new().transparent_retry(false),
        );
    let refused_then_200 = || {
        counting(Duration::ZERO, |n| match n {
            0 => Err(Recognized::new(
                std::io::Error::other("refused stream"),
                Some(RetryReason::RefusedStream),
            )
            .into()),
            _ => Ok(200),
        })
    };
    let (calls, server) = refused_then_200();
    let response = layer
        .layer(server)
        .oneshot(common::get("http://h/rpc"))
        .await
        .unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    let kinds: Vec<_> = info(&response).retries().iter().map(|r| r.kind).collect();
    assert_eq!(kinds, [AttemptKind::Transparent]);
    let (calls, server) = refused_then_200();
    let error = layer
        .layer(server)
        .oneshot(common::get("http://h/plain"))
        .await
        .unwrap_err();
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    let retry = error.downcast_ref::<RetryError>().expect("{error}");
    assert_eq!(retry.info().retries().len(), 0, "{:?}", retry.info());
}
