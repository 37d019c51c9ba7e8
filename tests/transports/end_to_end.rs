//! hyper-util client -> RetryLayer -> a real hyper server on 127.0.0.1, in real time.
#![allow(clippy::disallowed_methods)] // measures real time with std's clock

use crate::common;
use tower::ServiceExt;

use std::time::Duration;

use bytes::Bytes;
use common::server::{Action, client, respond, serve, serve_failing_first, serve_on};
use http::{Method, Request};
use http_body_util::{BodyExt, Full};
use tower::Layer;
use tower_http_retry::classify::RetryReason;
use tower_http_retry::{Backoff, Jitter, RetryInfo, RetryLayer, RetryPolicy, StopReason};

fn quick(max_attempts: u32) -> RetryLayer {
    RetryLayer::new().policy(RetryPolicy::default().max_attempts(max_attempts).backoff(
        Backoff::exponential(Duration::from_millis(5), Duration::from_millis(50)),
    ))
}

#[tokio::test]
async fn two_503s_then_200_takes_three_attempts_on_both_sides() {
    let server = serve_failing_first(2, 503, 200).await;
    let svc = quick(3).layer(client());
    let req = Request::get(server.url("/items/1"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = svc.oneshot(req).await.unwrap();
    assert_eq!(response.status(), 200);
    let info = response.extensions().get::<RetryInfo>().unwrap().clone();
    assert_eq!(info.attempts(), 3);
    assert_eq!(server.count(), 3);
    assert_eq!(
        info.retries().iter().map(|r| r.reason).collect::<Vec<_>>(),
        [RetryReason::Status(http::StatusCode::SERVICE_UNAVAILABLE); 2]
    );
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, Bytes::from_static(b"status 200"));
}

#[tokio::test]
async fn a_closed_connection_is_retried_for_put_with_the_same_body() {
    let server = serve(|hit| async move {
        if hit.index == 0 {
            Action::Close
        } else {
            respond(200)
        }
    })
    .await;
    let svc = quick(3).layer(client());
    let req = Request::put(server.url("/doc"))
        .body(Full::new(Bytes::from_static(b"version 2")))
        .unwrap();
    let response = svc.oneshot(req).await.unwrap();
    assert_eq!(response.status(), 200);
    let hits = server.hits();
    assert_eq!(hits.len(), 2);
    assert!(
        hits.iter()
            .all(|h| h.body == Bytes::from_static(b"version 2"))
    );
    let info = response.extensions().get::<RetryInfo>().unwrap();
    assert_eq!(info.retries()[0].reason, RetryReason::ConnectionClosed);
}

#[tokio::test]
async fn a_keyless_post_is_not_retried_after_a_closed_connection() {
    let server = serve(|hit| async move {
        if hit.index == 0 {
            Action::Close
        } else {
            respond(200)
        }
    })
    .await;
    let svc = quick(3)
        .policy(RetryPolicy::new().idempotency_key(None))
        .layer(client());
    let req = Request::post(server.url("/orders"))
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap();
    let err = svc.oneshot(req).await.unwrap_err();
    assert!(
        common::last(&err).is::<hyper_util::client::legacy::Error>(),
        "{err:?}"
    );
    assert_eq!(server.count(), 1);
}

#[tokio::test]
async fn a_keyless_post_is_retried_when_the_connection_was_refused() {
    // Find a free port, leave it closed for the first attempt, then start serving on it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let layer = RetryLayer::new().policy(
        RetryPolicy::default()
            .idempotency_key(None)
            .max_attempts(3)
            .backoff(
                Backoff::exponential(Duration::from_millis(150), Duration::from_secs(1))
                    .jitter(Jitter::None),
            ),
    );
    let svc = layer.layer(client());
    let req = Request::builder()
        .method(Method::POST)
        .uri(format!("http://127.0.0.1:{port}/orders"))
        .body(Full::new(Bytes::from_static(b"{\"sku\":1}")))
        .unwrap();
    let call = tokio::spawn(svc.oneshot(req));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .unwrap();
    let server = serve_on(listener, |_| async { respond(201) });
    let response = call.await.unwrap().unwrap();
    assert_eq!(response.status(), 201);
    let info = response.extensions().get::<RetryInfo>().unwrap();
    assert_eq!(info.retries()[0].reason, RetryReason::Connect);
    assert_eq!(server.hits().len(), 1);
    assert_eq!(server.hits()[0].body, Bytes::from_static(b"{\"sku\":1}"));
    assert!(server.hits()[0].headers.get("idempotency-key").is_none());
}

#[tokio::test]
async fn a_404_is_returned_after_one_attempt() {
    let server = serve(|_| async { respond(404) }).await;
    let response = quick(3)
        .layer(client())
        .oneshot(
            Request::get(server.url("/missing"))
                .body(Full::new(Bytes::new()))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(response.status(), 404);
    assert_eq!(server.count(), 1);
    let info = response.extensions().get::<RetryInfo>().unwrap();
    assert_eq!((info.attempts(), info.stop()), (1, StopReason::Final));
}

#[tokio::test]
async fn a_429_with_retry_after_1_is_honoured_in_real_time() {
    let server = serve(|hit| async move {
        if hit.index == 0 {
            common::server::respond_with(429, &[("retry-after", "1")])
        } else {
            respond(200)
        }
    })
    .await;
    let start = std::time::Instant::now();
    let response = quick(3)
        .layer(client())
        .oneshot(
            Request::get(server.url("/rate"))
                .body(Full::new(Bytes::new()))
                .unwrap(),
        )
        .await
        .unwrap();
    let elapsed = start.elapsed();
    assert_eq!(response.status(), 200);
    assert!(elapsed >= Duration::from_secs(1), "{elapsed:?}");
    assert!(elapsed < Duration::from_secs(2), "{elapsed:?}");
    assert_eq!(server.count(), 2);
}

#[tokio::test]
async fn a_503_asking_for_an_hour_comes_back_at_once() {
    let server =
        serve(|_| async { common::server::respond_with(503, &[("retry-after", "3600")]) }).await;
    let start = std::time::Instant::now();
    let response = quick(3)
        .layer(client())
        .oneshot(
            Request::get(server.url("/maintenance"))
                .body(Full::new(Bytes::new()))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    assert!(start.elapsed() < Duration::from_secs(1));
    assert_eq!(server.count(), 1);
    let info = response.extensions().get::<RetryInfo>().unwrap();
    assert_eq!((info.attempts(), info.stop()), (1, StopReason::HintTooLong));
}

#[tokio::test]
async fn the_server_sees_the_attempt_number_on_each_attempt() {
    let server = serve_failing_first(2, 502, 200).await;
    let svc = quick(3)
        .attempt_header(http::HeaderName::from_static("retry-attempt"))
        .layer(client());
    let req = Request::get(server.url("/a"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    assert_eq!(svc.oneshot(req).await.unwrap().status(), 200);
    let numbers: Vec<_> = server
        .hits()
        .iter()
        .map(|h| h.headers["retry-attempt"].clone())
        .collect();
    assert_eq!(numbers, ["1", "2", "3"]);
}
