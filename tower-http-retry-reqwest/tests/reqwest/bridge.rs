//! reqwest's request builders through the layer (`RequestBuilderExt::send_with`) to a real
//! hyper server on 127.0.0.1, in real time; and the bridge's error, which hands reqwest's
//! own back.
#![allow(clippy::disallowed_methods)] // measures real time with std's clock

use crate::common;

use std::error::Error as StdError;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use common::server::{Action, respond, serve, serve_failing_first};
use tower::{BoxError, Layer, ServiceBuilder, ServiceExt};
use tower_http_retry::classify::RetryReason;
use tower_http_retry::{
    Backoff, DeadlineExceeded, IdempotencyKey, ReplayBody, RetryError, RetryInfo, RetryLayer,
    RetryPolicy, StopReason,
};
use tower_http_retry_reqwest::{Error, RequestBuilderExt, ReqwestService};

/// A client that never asks a proxy: every request goes straight to 127.0.0.1.
fn client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

fn quick(max_attempts: u32) -> RetryLayer {
    RetryLayer::new().policy(RetryPolicy::new().max_attempts(max_attempts).backoff(
        Backoff::exponential(Duration::from_millis(5), Duration::from_millis(50)),
    ))
}

/// A port on 127.0.0.1 that nothing listens on (bound, then closed).
fn closed_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

on_both_runtimes!(
    a_builder_is_sent_through_the_layer_and_retried,
    a_post_keeps_its_body_and_one_key_on_every_attempt,
    the_services_client_sends_the_request,
    a_request_timeout_bounds_every_attempt,
    the_future_is_spawned_and_the_service_stays_usable,
);

/// The builder's URL, headers and method reach the server on every attempt; the answer is
/// reqwest's `Response` with the record and the final URL.
async fn a_builder_is_sent_through_the_layer_and_retried() {
    let server = serve_failing_first(2, 503, 200).await;
    let client = client();
    let service = quick(3).layer(ReqwestService::new(client.clone()));
    let url = server.url("/items/1?full=1");
    let response = client
        .get(&url)
        .header("x-trace", "abc")
        .send_with(&service)
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.url().as_str(), url);
    let info = response.extensions().get::<RetryInfo>().unwrap().clone();
    assert_eq!(info.attempts(), 3);
    assert_eq!(
        info.retries().iter().map(|r| r.reason).collect::<Vec<_>>(),
        [RetryReason::Status(http::StatusCode::SERVICE_UNAVAILABLE); 2]
    );
    let hits = server.hits();
    assert_eq!(hits.len(), 3);
    for hit in &hits {
        assert_eq!(hit.method, http::Method::GET);
        assert_eq!(hit.path, "/items/1");
        assert_eq!(hit.headers["x-trace"], "abc");
    }
    assert_eq!(response.text().await.unwrap(), "status 200");
}

/// The layer's rules hold for a bridged request: keys on, one key on both attempts of a
/// POST, the body sent whole each time, with its length.
async fn a_post_keeps_its_body_and_one_key_on_every_attempt() {
    let server = serve_failing_first(1, 503, 201).await;
    let client = client();
    let service = quick(3)
        .policy(RetryPolicy::new().idempotency_key(IdempotencyKey::default()))
        .layer(ReqwestService::new(client.clone()));
    let response = client
        .post(server.url("/orders"))
        .body("{\"sku\":1}")
        .send_with(&service)
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    let hits = server.hits();
    assert_eq!(hits.len(), 2);
    let key = hits[0].headers.get("idempotency-key").unwrap();
    assert_eq!(hits[1].headers.get("idempotency-key"), Some(key));
    for hit in &hits {
        assert_eq!(hit.body, Bytes::from_static(b"{\"sku\":1}"));
        assert_eq!(hit.headers["content-length"], "9");
    }
    let info = response.extensions().get::<RetryInfo>().unwrap();
    assert_eq!(info.idempotency_key(), Some(key));
}

/// The builder's client only builds the request: the service's client sends it, with its
/// own default headers.
async fn the_services_client_sends_the_request() {
    let server = serve(|_| async { respond(200) }).await;
    let with_header = |value: &'static str| {
        let mut headers = http::HeaderMap::new();
        headers.insert("x-client", http::HeaderValue::from_static(value));
        reqwest::Client::builder()
            .no_proxy()
            .default_headers(headers)
            .build()
            .unwrap()
    };
    let service = quick(3).layer(ReqwestService::new(with_header("service")));
    let response = with_header("builder")
        .get(server.url("/"))
        .send_with(&service)
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let hits = server.hits();
    assert_eq!(hits.len(), 1);
    assert_eq!(hits[0].headers["x-client"], "service");
}

/// `RequestBuilder::timeout` (kept in the request's extensions through reqwest's
/// conversions, and in every attempt's copy of them) bounds each attempt: every slow
/// answer times out, each is retried, and the last timeout comes back as reqwest's error.
async fn a_request_timeout_bounds_every_attempt() {
    let server = serve(|_| async {
        tokio::time::sleep(Duration::from_secs(5)).await;
        respond(200)
    })
    .await;
    let client = client();
    let service = quick(2).layer(ReqwestService::new(client.clone()));
    let started = std::time::Instant::now();
    let error = client
        .get(server.url("/slow"))
        .timeout(Duration::from_millis(100))
        .send_with(&service)
        .await
        .unwrap_err();
    assert!(error.as_reqwest().unwrap().is_timeout(), "{error:?}");
    let info = error.info().unwrap();
    assert_eq!(info.attempts(), 2);
    assert_eq!(info.retries()[0].reason, RetryReason::Timeout);
    assert_eq!(server.count(), 2);
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
}

/// The future owns what it needs: it can be spawned, and the service is used again (and
/// dropped) while it runs.
async fn the_future_is_spawned_and_the_service_stays_usable() {
    // The first two answers are 503s, whichever request they go to.
    let server = serve_failing_first(2, 503, 200).await;
    let client = client();
    let service = quick(3).layer(ReqwestService::new(client.clone()));
    let first = tokio::spawn(client.get(server.url("/a")).send_with(&service));
    let second = client.get(server.url("/b")).send_with(&service);
    drop(service);
    let mut attempts = 0;
    for response in [first.await.unwrap().unwrap(), second.await.unwrap()] {
        assert_eq!(response.status(), 200);
        attempts += response.extensions().get::<RetryInfo>().unwrap().attempts();
    }
    assert_eq!((attempts, server.count()), (4, 4));
}

// ---- the error --------------------------------------------------------------------------

#[tokio::test]
async fn a_refused_connection_is_reqwests_error_with_the_record() {
    let port = closed_port();
    let client = client();
    let service = quick(3).layer(ReqwestService::new(client.clone()));
    let error = client
        .get(format!("http://127.0.0.1:{port}/"))
        .send_with(&service)
        .await
        .unwrap_err();
    let reqwest_error = error.as_reqwest().expect("reqwest's error");
    assert!(reqwest_error.is_connect(), "{error:?}");
    // The last attempt's error is reqwest's own, as raised.
    assert!(error.get_ref().is::<reqwest::Error>());
    let info = error.info().unwrap();
    assert_eq!((info.attempts(), info.stop()), (3, StopReason::MaxAttempts));
    assert!(
        info.retries()
            .iter()
            .all(|r| r.reason == RetryReason::Connect)
    );
    // Shown as the layer's error is: the last error, the attempts, why it stopped.
    let shown = error.to_string();
    assert!(shown.contains("after 3 attempt(s)"), "{shown}");
    // Its source chain is the layer's error's: reqwest's error first.
    assert!(error.source().unwrap().is::<reqwest::Error>());
}

#[tokio::test]
async fn a_status_error_is_reqwests_after_the_retries() {
    let server = serve(|_| async { respond(503) }).await;
    let client = client();
    let service = quick(2).layer(ReqwestService::new(client.clone()));
    let result: Result<reqwest::Response, Error> = async {
        let response = client.get(server.url("/")).send_with(&service).await?;
        assert_eq!(
            response.extensions().get::<RetryInfo>().unwrap().attempts(),
            2
        );
        Ok(response.error_for_status()?)
    }
    .await;
    let error = result.unwrap_err();
    let status = error.as_reqwest().and_then(reqwest::Error::status);
    assert_eq!(status, Some(http::StatusCode::SERVICE_UNAVAILABLE));
    // Not the layer's: after the layer returned.
    assert!(error.info().is_none());
    assert_eq!(server.count(), 2);
}

#[tokio::test]
async fn a_request_reqwest_cannot_build_never_reaches_the_service() {
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&calls);
    let service = tower::service_fn(move |_: http::Request<reqwest::Body>| {
        counted.fetch_add(1, Ordering::SeqCst);
        async { Ok::<_, BoxError>(http::Response::new(reqwest::Body::from("sent"))) }
    });
    for builder in [
        client().get("not a url"),
        client()
            .get("http://127.0.0.1:1/")
            .header("bad header", "x"),
    ] {
        let error = builder.send_with(&service).await.unwrap_err();
        assert!(error.as_reqwest().unwrap().is_builder(), "{error:?}");
        assert!(error.info().is_none());
    }
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    // The same service is called for a request that builds.
    let response = client()
        .get("http://127.0.0.1:1/")
        .send_with(&service)
        .await
        .unwrap();
    assert_eq!(response.text().await.unwrap(), "sent");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn the_layers_own_error_is_no_reqwest_error() {
    let server = serve(|_| async {
        tokio::time::sleep(Duration::from_secs(5)).await;
        respond(200)
    })
    .await;
    let client = client();
    let service = RetryLayer::new()
        .policy(RetryPolicy::new().deadline(Duration::from_millis(100)))
        .layer(ReqwestService::new(client.clone()));
    let error = client
        .get(server.url("/slow"))
        .send_with(&service)
        .await
        .unwrap_err();
    assert!(error.as_reqwest().is_none(), "{error:?}");
    let deadline = error.get_ref().downcast_ref::<DeadlineExceeded>().unwrap();
    assert_eq!(deadline.deadline(), Duration::from_millis(100));
    assert_eq!(error.info().unwrap().stop(), StopReason::Deadline);
}

/// `ReqwestService` alone fails with reqwest's error inside a `Recognized` (for the
/// layer); `Error::from` takes it out, and there is no record.
#[tokio::test]
async fn the_bare_services_error_is_reqwests_and_has_no_record() {
    let port = closed_port();
    let request = http::Request::get(format!("http://127.0.0.1:{port}/"))
        .body(ReplayBody::new(
            http_body_util::Full::new(Bytes::new()),
            1024,
        ))
        .unwrap();
    let recognized = ReqwestService::new(client())
        .oneshot(request)
        .await
        .unwrap_err();
    let error = Error::from(BoxError::from(recognized));
    assert!(error.get_ref().is::<reqwest::Error>(), "{error:?}");
    assert!(error.as_reqwest().unwrap().is_connect());
    assert!(error.info().is_none());
}

/// The layer's `BoxError`, from `oneshot`, read in one step.
#[tokio::test]
async fn error_from_the_layers_box_error_finds_reqwests_error_and_the_record() {
    let port = closed_port();
    let service = quick(2).layer(ReqwestService::new(client()));
    let request = http::Request::get(format!("http://127.0.0.1:{port}/"))
        .body(http_body_util::Full::new(Bytes::new()))
        .unwrap();
    let boxed = service.oneshot(request).await.unwrap_err();
    assert!(boxed.is::<RetryError>());
    let error = Error::from(boxed);
    assert!(error.as_reqwest().unwrap().is_connect(), "{error:?}");
    assert_eq!(error.info().unwrap().attempts(), 2);
}

/// reqwest's error and the record are found under a layer of one's own above that wraps
/// errors.
#[tokio::test]
async fn reqwests_error_and_the_record_are_found_under_a_wrapping_layer() {
    #[derive(Debug)]
    struct Wrapped(BoxError);
    impl std::fmt::Display for Wrapped {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("wrapped")
        }
    }
    impl StdError for Wrapped {
        fn source(&self) -> Option<&(dyn StdError + 'static)> {
            Some(&*self.0)
        }
    }
    let port = closed_port();
    let client = client();
    let service = ServiceBuilder::new()
        .map_err(|error: BoxError| Wrapped(error))
        .layer(quick(2))
        .service(ReqwestService::new(client.clone()));
    let error = client
        .get(format!("http://127.0.0.1:{port}/"))
        .send_with(&service)
        .await
        .unwrap_err();
    assert!(error.get_ref().is::<Wrapped>());
    assert!(error.as_reqwest().unwrap().is_connect(), "{error:?}");
    // So is the layer's record.
    assert_eq!(error.info().unwrap().attempts(), 2);
}

/// A server that closes the connection without answering: the error is not a reqwest
/// connect error, and a GET is retried on it.
#[tokio::test]
async fn a_closed_connection_is_retried_and_comes_back_as_reqwests_error() {
    let server = serve(|_| async { Action::Close }).await;
    let client = client();
    let service = quick(2).layer(ReqwestService::new(client.clone()));
    let error = client
        .get(server.url("/"))
        .send_with(&service)
        .await
        .unwrap_err();
    let reqwest_error = error.as_reqwest().unwrap();
    assert!(!reqwest_error.is_connect() && !reqwest_error.is_timeout());
    assert_eq!(
        error.info().unwrap().retries()[0].reason,
        RetryReason::ConnectionClosed
    );
    assert_eq!(server.count(), 2);
}

#[test]
fn the_error_is_send_sync_and_static() {
    fn error<T: StdError + Send + Sync + 'static>() {}
    error::<Error>();
}
