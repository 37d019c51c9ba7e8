//! Idempotency keys: one stable key per logical request, observed on the server side.

use crate::common;
use tower::ServiceExt;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use common::server::{Action, client, respond, serve};
use common::{Mock, request};
use futures_util::future::join_all;
use http::{HeaderName, HeaderValue, Method, Request};
use http_body_util::Full;
use tower::Layer;
use tower_http_retry::{
    Backoff, IdempotencyKey, Jitter, RetryInfo, RetryLayer, RetryPolicy, RouteMatch, StopReason,
};

/// A layer with keys on, as for a server that de-duplicates on them.
fn layer() -> RetryLayer {
    RetryLayer::new().policy(
        RetryPolicy::default()
            .backoff(
                Backoff::exponential(Duration::from_millis(10), Duration::from_millis(100))
                    .jitter(Jitter::Full),
            )
            .idempotency_key(IdempotencyKey::default()),
    )
}

fn keys(mock: &Mock) -> Vec<HeaderValue> {
    mock.seen()
        .iter()
        .map(|s| s.headers["idempotency-key"].clone())
        .collect()
}

fn is_quoted_uuid(v: &HeaderValue) -> bool {
    let s = v.to_str().unwrap();
    s.len() == 38 && s.starts_with('"') && s.ends_with('"') && uuid_v4(&s[1..37])
}

fn uuid_v4(s: &str) -> bool {
    let parts: Vec<_> = s.split('-').collect();
    parts.iter().map(|p| p.len()).collect::<Vec<_>>() == [8, 4, 4, 4, 12]
        && s.chars()
            .all(|c| c == '-' || c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
        && parts[2].starts_with('4')
        && matches!(parts[3].as_bytes()[0], b'8' | b'9' | b'a' | b'b')
}

#[tokio::test(start_paused = true)]
async fn every_attempt_of_one_post_carries_the_same_key() {
    let mock = Mock::statuses(&[503, 502]);
    let response = layer()
        .layer(mock.clone())
        .oneshot(request(Method::POST, "http://h/orders", b"{\"sku\":7}"))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let sent = keys(&mock);
    assert_eq!(sent.len(), 3);
    assert!(sent.iter().all(|k| *k == sent[0]), "{sent:?}");
    assert!(is_quoted_uuid(&sent[0]), "{:?}", sent[0]);
    let info = response.extensions().get::<RetryInfo>().unwrap();
    assert_eq!(info.idempotency_key(), Some(&sent[0]));
}

#[tokio::test(start_paused = true)]
async fn patch_gets_a_key_and_is_retried() {
    let mock = Mock::statuses(&[503]);
    let response = layer()
        .layer(mock.clone())
        .oneshot(request(Method::PATCH, "http://h/orders/1", b"{}"))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(mock.calls(), 2);
    let sent = keys(&mock);
    assert_eq!(sent[0], sent[1]);
}

#[tokio::test(start_paused = true)]
async fn two_posts_carry_different_keys() {
    let mock = Mock::default();
    let svc = layer().layer(mock.clone());
    svc.clone()
        .oneshot(request(Method::POST, "http://h/a", b"1"))
        .await
        .unwrap();
    svc.oneshot(request(Method::POST, "http://h/a", b"1"))
        .await
        .unwrap();
    let sent = keys(&mock);
    assert_ne!(sent[0], sent[1]);
}

#[tokio::test(start_paused = true)]
async fn idempotent_methods_get_no_key() {
    let mock = Mock::default();
    let svc = layer().layer(mock.clone());
    for m in [Method::GET, Method::PUT, Method::DELETE] {
        svc.clone()
            .oneshot(request(m, "http://h/a", b""))
            .await
            .unwrap();
    }
    assert!(
        mock.seen()
            .iter()
            .all(|s| !s.headers.contains_key("idempotency-key"))
    );
}

#[tokio::test(start_paused = true)]
async fn a_callers_key_is_kept_untouched() {
    let mock = Mock::statuses(&[503]);
    let mut req = request(Method::POST, "http://h/a", b"1");
    req.headers_mut()
        .insert("idempotency-key", HeaderValue::from_static("\"mine\""));
    layer().layer(mock.clone()).oneshot(req).await.unwrap();
    assert_eq!(keys(&mock), ["\"mine\"", "\"mine\""]);
}

#[tokio::test(start_paused = true)]
async fn raw_keys_and_custom_headers() {
    let mock = Mock::statuses(&[503]);
    let custom = layer().policy(
        RetryPolicy::new().idempotency_key(
            IdempotencyKey::default()
                .header_name(HeaderName::from_bytes(b"X-Request-Key").unwrap())
                .raw(),
        ),
    );
    let response = custom
        .layer(mock.clone())
        .oneshot(request(Method::POST, "http://h/a", b"1"))
        .await
        .unwrap();
    assert_eq!(
        response.status(),
        200,
        "the custom header makes the POST retryable"
    );
    let seen = mock.seen();
    let sent: Vec<_> = seen
        .iter()
        .map(|s| s.headers["x-request-key"].clone())
        .collect();
    assert_eq!(sent.len(), 2);
    assert_eq!(sent[0], sent[1]);
    assert!(uuid_v4(sent[0].to_str().unwrap()), "{:?}", sent[0]);
    assert!(!seen[0].headers.contains_key("idempotency-key"));
}

#[tokio::test(start_paused = true)]
async fn a_custom_generator_is_used_and_quoted() {
    let counter = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let c = Arc::clone(&counter);
    let gen_layer = layer().policy(RetryPolicy::new().idempotency_key(
        IdempotencyKey::default().generator(move || {
            format!(
                "order-{}",
                c.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
            )
        }),
    ));
    let mock = Mock::statuses(&[503]);
    gen_layer
        .layer(mock.clone())
        .oneshot(request(Method::POST, "http://h/a", b"1"))
        .await
        .unwrap();
    assert_eq!(keys(&mock), ["\"order-0\"", "\"order-0\""]);
    assert_eq!(
        counter.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "one key per logical request"
    );
}

#[tokio::test(start_paused = true)]
async fn with_keys_off_a_post_is_not_retried_after_a_503() {
    let mock = Mock::statuses(&[503]);
    let response = layer()
        .policy(RetryPolicy::new().idempotency_key(None))
        .layer(mock.clone())
        .oneshot(request(Method::POST, "http://h/a", b"1"))
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(mock.calls(), 1);
    assert!(!mock.seen()[0].headers.contains_key("idempotency-key"));
    assert_eq!(
        response.extensions().get::<RetryInfo>().unwrap().stop(),
        StopReason::NotIdempotent
    );
}

/// A server that applies each key's work once and answers repeats with the stored answer;
/// on the first attempt of every request it does the work and then drops the connection
/// without answering.
#[derive(Default)]
struct Ledger {
    applied: Mutex<HashMap<String, u32>>,
}

async fn exactly_once_run(
    keys_on: bool,
    requests: usize,
) -> (Arc<Ledger>, Vec<Result<u16, String>>) {
    let ledger = Arc::new(Ledger::default());
    let l = Arc::clone(&ledger);
    let server = serve(move |hit| {
        let ledger = Arc::clone(&l);
        async move {
            let order = String::from_utf8(hit.body.to_vec()).unwrap();
            let key = hit
                .headers
                .get("idempotency-key")
                .map(|k| k.to_str().unwrap().to_string());
            let mut applied = ledger.applied.lock().unwrap();
            match key {
                Some(key) if applied.contains_key(&format!("{key}|{order}")) => respond(200),
                Some(key) => {
                    applied.insert(format!("{key}|{order}"), 1);
                    *applied.entry(order).or_default() += 1;
                    Action::Close
                }
                None => {
                    *applied.entry(order).or_default() += 1;
                    Action::Close
                }
            }
        }
    })
    .await;
    // Every request needs a retry here, more than the default budget grants at once.
    let mut layer = layer().policy(RetryPolicy::new().no_gates());
    if !keys_on {
        layer = layer.policy(RetryPolicy::new().idempotency_key(None));
    }
    let svc = layer.layer(client());
    let calls = (0..requests).map(|i| {
        let svc = svc.clone();
        let req = Request::post(server.url("/orders"))
            .body(Full::new(Bytes::from(format!("order-{i}"))))
            .unwrap();
        async move {
            match tokio::time::timeout(Duration::from_secs(20), svc.oneshot(req)).await {
                Ok(Ok(response)) => Ok(response.status().as_u16()),
                Ok(Err(e)) => Err(format!("{e:?}")),
                Err(_) => Err("timed out".to_string()),
            }
        }
    });
    let results = join_all(calls).await;
    drop(server);
    (ledger, results)
}

/// (The dropped connection is hyper's `IncompleteMessage`: recognised with the `hyper`
/// feature.)
#[cfg(feature = "hyper")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_concurrent_posts_are_applied_exactly_once() {
    let (ledger, results) = exactly_once_run(true, 200).await;
    assert!(
        results.iter().all(|r| r == &Ok(200)),
        "{:?}",
        results.iter().find(|r| r != &&Ok(200))
    );
    let applied = ledger.applied.lock().unwrap();
    for i in 0..200 {
        assert_eq!(applied.get(&format!("order-{i}")), Some(&1), "order-{i}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_keys_off_nothing_is_retried_or_applied_twice() {
    let (ledger, results) = exactly_once_run(false, 200).await;
    assert!(
        results.iter().all(|r| r.is_err()),
        "every caller gets the error"
    );
    let applied = ledger.applied.lock().unwrap();
    let orders: Vec<_> = applied
        .iter()
        .filter(|(k, _)| k.starts_with("order-"))
        .collect();
    assert!(
        orders.iter().all(|(_, n)| **n == 1),
        "nothing applied twice"
    );
    assert!(orders.len() <= 200);
}

// ---- A policy's own key configuration (on routes and per-request overrides) ----

fn base() -> RetryPolicy {
    RetryPolicy::default().backoff(
        Backoff::exponential(Duration::from_millis(10), Duration::from_millis(100))
            .jitter(Jitter::None),
    )
}

/// A POST answered 503 once through `layer` is retried, both attempts with the same
/// generated key (a quoted UUID).
async fn retried_with_one_generated_key(layer: &RetryLayer, uri: &str, body: &'static [u8]) {
    let mock = Mock::statuses(&[503]);
    let response = layer
        .layer(mock.clone())
        .oneshot(request(Method::POST, uri, body))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let sent = keys(&mock);
    assert_eq!(sent.len(), 2);
    assert_eq!(sent[0], sent[1]);
    assert!(is_quoted_uuid(&sent[0]), "{:?}", sent[0]);
}

fn info(response: &http::Response<Full<Bytes>>) -> RetryInfo {
    response.extensions().get::<RetryInfo>().unwrap().clone()
}

fn has_header(mock: &Mock, name: &str) -> Vec<bool> {
    mock.seen()
        .iter()
        .map(|s| s.headers.contains_key(name))
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_route_without_keys_sends_none_and_does_not_repeat_its_posts() {
    let layer = RetryLayer::new()
        .policy(base().idempotency_key(IdempotencyKey::default()))
        .route(
            RouteMatch::post().path_prefix("/legacy"),
            base().idempotency_key(None),
        );

    let mock = Mock::statuses(&[503]);
    let response = layer
        .layer(mock.clone())
        .oneshot(request(Method::POST, "http://h/legacy/orders", b"1"))
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(
        mock.calls(),
        1,
        "a keyless POST is not repeated after a 503"
    );
    assert_eq!(has_header(&mock, "idempotency-key"), [false]);
    let legacy = info(&response);
    assert_eq!(legacy.idempotency_key(), None);
    assert_eq!(legacy.stop(), StopReason::NotIdempotent);

    // The layer's keys still apply everywhere else.
    retried_with_one_generated_key(&layer, "http://h/orders", b"1").await;
}

#[tokio::test(start_paused = true)]
async fn a_routes_own_key_applies_when_the_layer_has_none() {
    let layer = RetryLayer::new()
        .policy(base().idempotency_key(None))
        .route(
            RouteMatch::post().host("pay.example"),
            base().idempotency_key(
                IdempotencyKey::default()
                    .header_name(HeaderName::from_static("x-pay-key"))
                    .raw(),
            ),
        );

    let mock = Mock::statuses(&[503]);
    let response = layer
        .layer(mock.clone())
        .oneshot(request(Method::POST, "https://pay.example/charges", b"1"))
        .await
        .unwrap();
    assert_eq!(
        response.status(),
        200,
        "the route's key makes the POST retryable"
    );
    let sent: Vec<_> = mock
        .seen()
        .iter()
        .map(|s| s.headers["x-pay-key"].clone())
        .collect();
    assert_eq!(sent.len(), 2);
    assert_eq!(sent[0], sent[1]);
    assert!(uuid_v4(sent[0].to_str().unwrap()), "raw: {:?}", sent[0]);
    assert_eq!(has_header(&mock, "idempotency-key"), [false, false]);
    assert_eq!(info(&response).idempotency_key(), Some(&sent[0]));

    // Another host: the layer's configuration, no keys.
    let mock = Mock::statuses(&[503]);
    let response = layer
        .layer(mock.clone())
        .oneshot(request(Method::POST, "https://shop.example/orders", b"1"))
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(mock.calls(), 1);
    assert_eq!(has_header(&mock, "x-pay-key"), [false]);
    assert_eq!(has_header(&mock, "idempotency-key"), [false]);
}

#[tokio::test(start_paused = true)]
async fn a_request_policy_without_keys_overrides_the_layers_keys() {
    let layer = RetryLayer::new().policy(base().idempotency_key(IdempotencyKey::default()));
    let mock = Mock::statuses(&[503]);
    let mut req = request(Method::POST, "http://h/orders", b"1");
    req.extensions_mut().insert(base().idempotency_key(None));
    let response = layer.layer(mock.clone()).oneshot(req).await.unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(mock.calls(), 1);
    assert_eq!(has_header(&mock, "idempotency-key"), [false]);
    assert_eq!(info(&response).stop(), StopReason::NotIdempotent);
}

#[tokio::test(start_paused = true)]
async fn a_request_policy_without_keys_overrides_its_routes_keys() {
    let layer = RetryLayer::new()
        .policy(RetryPolicy::new().idempotency_key(None))
        .route(
            RouteMatch::post(),
            base().idempotency_key(IdempotencyKey::default()),
        );
    let mock = Mock::statuses(&[503]);
    let mut req = request(Method::POST, "http://h/orders", b"1");
    req.extensions_mut().insert(base().idempotency_key(None));
    let response = layer.layer(mock.clone()).oneshot(req).await.unwrap();
    assert_eq!(mock.calls(), 1);
    assert_eq!(has_header(&mock, "idempotency-key"), [false]);
    assert_eq!(info(&response).idempotency_key(), None);
}

#[tokio::test(start_paused = true)]
async fn a_request_policy_with_its_own_key_gets_one_when_the_layer_has_none() {
    let layer = RetryLayer::new().policy(base().idempotency_key(None));
    let mock = Mock::statuses(&[503, 502]);
    let mut req = request(Method::PATCH, "http://h/orders/1", b"{}");
    req.extensions_mut().insert(
        base().idempotency_key(IdempotencyKey::default().generator(|| "order-1-v2".to_string())),
    );
    let response = layer.layer(mock.clone()).oneshot(req).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(keys(&mock), ["\"order-1-v2\""; 3]);
    assert_eq!(
        info(&response).idempotency_key(),
        Some(&HeaderValue::from_static("\"order-1-v2\""))
    );
}

#[tokio::test(start_paused = true)]
async fn an_assumed_idempotent_route_gets_no_key_unless_it_configures_one() {
    let layer = RetryLayer::new()
        .policy(base())
        .route(
            RouteMatch::post().path_prefix("/search"),
            base().assume_idempotent(true),
        )
        .route(
            RouteMatch::post().path_prefix("/import"),
            base()
                .assume_idempotent(true)
                .idempotency_key(IdempotencyKey::default()),
        );

    // Retried like a GET, after statuses and errors alike, and sent without a key.
    let mock = Mock::new([
        common::Reply::Status(503),
        common::Reply::error(|| std::io::Error::from(std::io::ErrorKind::ConnectionReset)),
    ]);
    let response = layer
        .layer(mock.clone())
        .oneshot(request(Method::POST, "http://h/search", b"q=rust"))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(mock.calls(), 3);
    assert_eq!(has_header(&mock, "idempotency-key"), [false, false, false]);
    assert_eq!(info(&response).idempotency_key(), None);

    // A policy that also configures a key gets one.
    retried_with_one_generated_key(&layer, "http://h/import", b"rows").await;
}

#[tokio::test(start_paused = true)]
async fn an_assumed_idempotent_request_policy_is_retried_without_a_key() {
    for layer in [
        RetryLayer::new().policy(base()),
        RetryLayer::new().policy(base().idempotency_key(IdempotencyKey::default())),
    ] {
        let mock = Mock::statuses(&[503]);
        let mut req = request(Method::POST, "http://h/rpc/Lookup", b"id=7");
        req.extensions_mut().insert(base().assume_idempotent(true));
        let response = layer.layer(mock.clone()).oneshot(req).await.unwrap();
        assert_eq!(response.status(), 200, "{layer:?}");
        assert_eq!(mock.calls(), 2);
        assert_eq!(has_header(&mock, "idempotency-key"), [false, false]);
    }
}

#[tokio::test(start_paused = true)]
async fn a_callers_key_counts_under_a_policy_without_keys() {
    let layer = RetryLayer::new()
        .policy(base())
        .route(RouteMatch::post(), base().idempotency_key(None));
    let mock = Mock::statuses(&[503]);
    let mut req = request(Method::POST, "http://h/orders", b"1");
    req.headers_mut()
        .insert("idempotency-key", HeaderValue::from_static("\"mine\""));
    let response = layer.layer(mock.clone()).oneshot(req).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(keys(&mock), ["\"mine\"", "\"mine\""]);
    assert_eq!(
        info(&response).idempotency_key(),
        Some(&HeaderValue::from_static("\"mine\""))
    );
}

#[tokio::test(start_paused = true)]
async fn a_callers_key_in_the_policys_own_header_is_kept() {
    let layer = RetryLayer::new().policy(base()).route(
        RouteMatch::post(),
        base().idempotency_key(
            IdempotencyKey::default().header_name(HeaderName::from_static("x-key")),
        ),
    );
    let mock = Mock::statuses(&[503]);
    let mut req = request(Method::POST, "http://h/orders", b"1");
    req.headers_mut()
        .insert("x-key", HeaderValue::from_static("abc"));
    let response = layer.layer(mock.clone()).oneshot(req).await.unwrap();
    assert_eq!(response.status(), 200);
    let sent: Vec<_> = mock
        .seen()
        .iter()
        .map(|s| s.headers["x-key"].clone())
        .collect();
    assert_eq!(sent, ["abc", "abc"]);
    assert_eq!(has_header(&mock, "idempotency-key"), [false, false]);
    assert_eq!(
        info(&response).idempotency_key(),
        Some(&HeaderValue::from_static("abc"))
    );
}

/// Against a real hyper server that applies every POST it reads, de-duplicating only on
/// `Idempotency-Key`, and drops the connection after the first application of each: the
/// keyed route's POST is retried with its key and applied once; a POST elsewhere (keys are
/// off by default) is applied once and not repeated; the repeatable route's is retried
/// without a key. (The dropped connection is hyper's `IncompleteMessage`: recognised with
/// the `hyper` feature.)
#[cfg(feature = "hyper")]
#[tokio::test]
async fn per_route_keys_against_a_real_server() {
    let applied: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
    let a = Arc::clone(&applied);
    let server = serve(move |hit| {
        let applied = Arc::clone(&a);
        async move {
            let key = hit
                .headers
                .get("idempotency-key")
                .map(|k| k.to_str().unwrap().to_string());
            let mut applied = applied.lock().unwrap();
            if let Some(key) = key {
                if applied.contains_key(&key) {
                    return respond(200); // the stored answer
                }
                applied.insert(key, 1);
            }
            let n = applied.entry(hit.path.clone()).or_default();
            *n += 1;
            if *n == 1 { Action::Close } else { respond(200) }
        }
    })
    .await;
    let quick = RetryPolicy::default().backoff(Backoff::exponential(
        Duration::from_millis(5),
        Duration::from_millis(20),
    ));
    // Keys on for the route whose server de-duplicates on them, and there alone.
    let svc = RetryLayer::new()
        .policy(quick.clone())
        .route(
            RouteMatch::post().path_prefix("/orders"),
            quick.clone().idempotency_key(IdempotencyKey::default()),
        )
        .route(
            RouteMatch::post().path_prefix("/search"),
            quick.clone().assume_idempotent(true),
        )
        .layer(client());
    let post = |path: &str| {
        Request::post(server.url(path))
            .body(Full::new(Bytes::from_static(b"{}")))
            .unwrap()
    };

    let orders = svc.clone().oneshot(post("/orders")).await.unwrap();
    assert_eq!(orders.status(), 200);
    let legacy = svc.clone().oneshot(post("/legacy")).await;
    assert!(
        legacy.is_err(),
        "the key-less POST is not repeated: {legacy:?}"
    );
    let search = svc.clone().oneshot(post("/search")).await.unwrap();
    assert_eq!(search.status(), 200);

    let hits = server.hits();
    let on = |path: &str| -> Vec<Option<HeaderValue>> {
        hits.iter()
            .filter(|h| h.path == path)
            .map(|h| h.headers.get("idempotency-key").cloned())
            .collect()
    };
    let orders_keys = on("/orders");
    assert_eq!(orders_keys.len(), 2);
    assert!(orders_keys[0].is_some() && orders_keys[0] == orders_keys[1]);
    assert_eq!(
        orders
            .extensions()
            .get::<RetryInfo>()
            .unwrap()
            .idempotency_key(),
        orders_keys[0].as_ref()
    );
    assert_eq!(on("/legacy"), [None]);
    assert_eq!(on("/search"), [None, None]);
    let applied = applied.lock().unwrap();
    assert_eq!(
        applied.get("/orders"),
        Some(&1),
        "applied once, the retry answered by key"
    );
    assert_eq!(applied.get("/legacy"), Some(&1));
    assert_eq!(
        applied.get("/search"),
        Some(&2),
        "repeatable: applied by each attempt"
    );
}

// ---- The defaults: no keys, so no POST repeated unless the failure proves it unseen ----

#[tokio::test(start_paused = true)]
async fn by_default_a_post_gets_no_key_and_is_not_repeated() {
    for method in [Method::POST, Method::PATCH] {
        let mock = Mock::statuses(&[503]);
        let response = RetryLayer::new()
            .layer(mock.clone())
            .oneshot(request(method.clone(), "http://h/orders", b"{}"))
            .await
            .unwrap();
        assert_eq!(response.status(), 503, "{method}");
        assert_eq!(mock.calls(), 1, "{method}");
        assert_eq!(has_header(&mock, "idempotency-key"), [false]);
        let info = info(&response);
        assert_eq!(info.idempotency_key(), None);
        assert_eq!(info.stop(), StopReason::NotIdempotent);
    }
}

#[tokio::test(start_paused = true)]
async fn by_default_a_key_the_caller_set_makes_its_post_retryable_untouched() {
    let mock = Mock::statuses(&[503, 502]);
    let mut req = request(Method::POST, "http://h/orders", b"{}");
    req.headers_mut()
        .insert("idempotency-key", HeaderValue::from_static("order-77"));
    let response = RetryLayer::new()
        .policy(base())
        .layer(mock.clone())
        .oneshot(req)
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(keys(&mock), ["order-77"; 3]);
    assert_eq!(
        info(&response).idempotency_key(),
        Some(&HeaderValue::from_static("order-77"))
    );
}

#[tokio::test(start_paused = true)]
async fn by_default_a_post_is_retried_when_the_failure_proves_it_unseen() {
    // A refused connection: the server never saw the request.
    let mock = Mock::new([common::Reply::error(|| {
        std::io::Error::from(std::io::ErrorKind::ConnectionRefused)
    })]);
    let response = RetryLayer::new()
        .policy(base())
        .layer(mock.clone())
        .oneshot(request(Method::POST, "http://h/orders", b"{}"))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(mock.calls(), 2);
    assert_eq!(has_header(&mock, "idempotency-key"), [false, false]);
}

/// A real hyper server that ignores `Idempotency-Key` (as most do): it applies every order
/// it reads, and loses every other answer in a 503. Through `RetryLayer::new()` as it
/// comes, 12 POSTs apply 12 orders, each once; a layer that stamped keys and retried them
/// would apply 20 (every lost answer's order twice but the last).
#[tokio::test]
async fn by_default_twelve_posts_to_a_server_that_ignores_keys_apply_twelve_orders() {
    let applied: Arc<Mutex<Vec<String>>> = Arc::default();
    let a = Arc::clone(&applied);
    let server = serve(move |hit| {
        let applied = Arc::clone(&a);
        async move {
            let mut applied = applied.lock().unwrap();
            applied.push(String::from_utf8(hit.body.to_vec()).unwrap());
            match applied.len() % 2 {
                1 => respond(503),
                _ => respond(201),
            }
        }
    })
    .await;
    let svc = RetryLayer::new().layer(client());
    let mut statuses = Vec::new();
    for i in 0..12 {
        let req = Request::post(server.url("/orders"))
            .body(Full::new(Bytes::from(format!("order-{i}"))))
            .unwrap();
        let response = tokio::time::timeout(Duration::from_secs(20), svc.clone().oneshot(req))
            .await
            .expect("bounded")
            .unwrap();
        let info = response.extensions().get::<RetryInfo>().unwrap().clone();
        assert_eq!(info.attempts(), 1, "order-{i}: {info:?}");
        assert_eq!(info.idempotency_key(), None);
        statuses.push(response.status().as_u16());
    }
    let applied = applied.lock().unwrap();
    assert_eq!(applied.len(), 12, "{applied:?}");
    let expected: Vec<_> = (0..12).map(|i| format!("order-{i}")).collect();
    assert_eq!(*applied, expected, "each order applied once, in order");
    // The caller is told of every lost answer: half of them.
    assert_eq!(statuses.iter().filter(|s| **s == 503).count(), 6);
    // The server saw no key.
    assert!(
        server
            .hits()
            .iter()
            .all(|h| !h.headers.contains_key("idempotency-key"))
    );
}
