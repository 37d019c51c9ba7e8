//! Idempotency keys: one stable key per logical request, observed on the server side.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use common::server::{Action, client, respond, serve};
use common::{Mock, request};
use futures_util::future::join_all;
use http::{HeaderValue, Method, Request};
use http_body_util::Full;
use tower::{Layer, ServiceExt};
use tower_http_retry::{
    Backoff, IdempotencyKey, Jitter, RetryInfo, RetryLayer, RetryPolicy, StopReason,
};

fn layer() -> RetryLayer {
    RetryLayer::new().policy(
        RetryPolicy::default().backoff(
            Backoff::exponential(Duration::from_millis(10), Duration::from_millis(100))
                .jitter(Jitter::Full),
        ),
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
    assert_eq!(info.idempotency_key.as_ref(), Some(&sent[0]));
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
    let custom =
        layer().idempotency_key(IdempotencyKey::default().header_name("X-Request-Key").raw());
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
    let gen_layer = layer().idempotency_key(IdempotencyKey::default().generator(move || {
        format!(
            "order-{}",
            c.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
        )
    }));
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
        .no_idempotency_key()
        .layer(mock.clone())
        .oneshot(request(Method::POST, "http://h/a", b"1"))
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(mock.calls(), 1);
    assert!(!mock.seen()[0].headers.contains_key("idempotency-key"));
    assert_eq!(
        response.extensions().get::<RetryInfo>().unwrap().stop,
        StopReason::NotIdempotent
    );
}

#[test]
fn an_invalid_header_name_is_refused_at_construction() {
    let err = IdempotencyKey::default()
        .try_header_name("idempotency key")
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("\"idempotency key\" is not a valid header name"),
        "{err}"
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
    let mut layer = layer().no_budget();
    if !keys_on {
        layer = layer.no_idempotency_key();
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
