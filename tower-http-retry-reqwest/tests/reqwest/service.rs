//! RetryLayer -> ReqwestService -> reqwest::Client -> a real hyper server on 127.0.0.1, in
//! real time; and reqwest's errors as the default classifier sees them.
//!
//! Every end-to-end test runs on a current-thread and on a multi-thread runtime.
#![allow(clippy::disallowed_methods)] // measures real time with std's clock

use crate::common;

use std::convert::Infallible;
use std::error::Error as StdError;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use common::server::{Action, respond, respond_with, serve, serve_failing_first, serve_on};
use http::Request;
use http_body_util::{BodyExt, Full, combinators::UnsyncBoxBody};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tower::{BoxError, Layer, Service, ServiceExt};
use tower_http_retry::classify::{
    Classification, Classify, DefaultClassifier, Outcome, Recognized, RetryReason,
};
use tower_http_retry::{Backoff, IdempotencyKey, Jitter, RetryInfo, RetryLayer, RetryPolicy};
use tower_http_retry_reqwest::ReqwestService;

/// A client that never asks a proxy: every request goes straight to 127.0.0.1.
fn client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

fn client_with_timeout(timeout: Duration) -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(timeout)
        .build()
        .unwrap()
}

fn quick(max_attempts: u32) -> RetryLayer {
    RetryLayer::new().policy(RetryPolicy::new().max_attempts(max_attempts).backoff(
        Backoff::exponential(Duration::from_millis(5), Duration::from_millis(50)),
    ))
}

fn empty() -> Full<Bytes> {
    Full::new(Bytes::new())
}

fn get(url: String) -> Request<Full<Bytes>> {
    Request::get(url).body(empty()).unwrap()
}

/// A port on 127.0.0.1 that nothing listens on (bound, then closed).
fn closed_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The default classification of a failure (it reads the outcome alone: no request head
/// is needed).
fn classify_error(error: &(dyn StdError + 'static)) -> Classification {
    let head = Request::new(()).into_parts().0;
    DefaultClassifier.classify(&head, Outcome::Error(error))
}

/// The whole `source()` chain, the error itself first.
fn chain<'a>(error: &'a (dyn StdError + 'static)) -> Vec<&'a (dyn StdError + 'static)> {
    let mut links = vec![error];
    while let Some(next) = links[links.len() - 1].source() {
        links.push(next);
    }
    links
}

/// The reqwest error in what the layer returned (the inner error, or what wraps it).
fn find_reqwest(error: &BoxError) -> &reqwest::Error {
    chain(&**error)
        .into_iter()
        .find_map(|e| e.downcast_ref::<reqwest::Error>())
        .unwrap_or_else(|| panic!("no reqwest::Error in {error:?}"))
}

/// The request straight through `ReqwestService`, no layer: the error reqwest reports, as
/// the service hands it to the layer (recognised).
async fn reqwest_error(client: reqwest::Client, request: Request<Full<Bytes>>) -> Recognized {
    let request = request.map(|body| tower_http_retry::ReplayBody::new(body, 64 * 1024));
    ReqwestService::new(client)
        .oneshot(request)
        .await
        .expect_err("the request must fail")
}

/// reqwest's own error inside what the service handed over.
fn inner(error: &Recognized) -> &reqwest::Error {
    error
        .get_ref()
        .downcast_ref::<reqwest::Error>()
        .expect("the service hands over reqwest's error")
}

/// A hyper server on 127.0.0.1 whose sockets close with an RST (`SO_LINGER` 0). After
/// reading a request, it drops the connection without answering when `reset(index, path)`
/// says so (`index` counts every request before this one), else it answers 200 with the
/// body it read.
async fn resetting_server<F>(reset: F) -> (SocketAddr, Arc<AtomicUsize>)
where
    F: Fn(usize, &str) -> bool + Clone + Send + Sync + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let hits = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&hits);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            stream.set_zero_linger().unwrap();
            let (counter, reset) = (Arc::clone(&counter), reset.clone());
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let n = counter.fetch_add(1, Ordering::SeqCst);
                    let reset = reset(n, req.uri().path());
                    async move {
                        let body = match req.into_body().collect().await {
                            Ok(body) => body.to_bytes(),
                            Err(e) => return Err(std::io::Error::other(e)),
                        };
                        if reset {
                            Err(std::io::Error::other("reset"))
                        } else {
                            Ok(http::Response::new(Full::new(body)))
                        }
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (addr, hits)
}

// ---- classification of reqwest's errors -------------------------------------------------

#[tokio::test]
async fn a_closed_port_is_a_connect_error() {
    let port = closed_port();
    let error = reqwest_error(client(), get(format!("http://127.0.0.1:{port}/"))).await;
    assert!(inner(&error).is_connect(), "{error:?}");
    assert_eq!(
        classify_error(&error),
        Classification::Retry(RetryReason::Connect)
    );
    assert!(RetryReason::Connect.request_not_processed());
}

#[tokio::test]
async fn a_reqwest_timeout_is_a_timeout() {
    let server = serve(|_| async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        respond(200)
    })
    .await;
    let error = reqwest_error(
        client_with_timeout(Duration::from_millis(100)),
        get(server.url("/slow")),
    )
    .await;
    assert!(inner(&error).is_timeout(), "{error:?}");
    assert!(!inner(&error).is_connect(), "{error:?}");
    // Nothing else in the chain says "timeout" in a way the other rules understand:
    // reqwest's own (private) error type is what is found, through `is_timeout`.
    for link in chain(inner(&error)).into_iter().skip(1) {
        assert!(!link.is::<std::io::Error>(), "{link:?}");
        assert!(!link.is::<tower::timeout::error::Elapsed>(), "{link:?}");
        assert!(!link.is::<reqwest::Error>(), "{link:?}");
    }
    assert_eq!(
        classify_error(&error),
        Classification::Retry(RetryReason::Timeout)
    );
    assert_eq!(server.count(), 1);
}

#[tokio::test]
async fn a_reset_underneath_is_a_closed_connection() {
    let (addr, hits) = resetting_server(|_, _| true).await;
    let error = reqwest_error(client(), get(format!("http://{addr}/reset"))).await;
    assert!(
        !inner(&error).is_connect() && !inner(&error).is_timeout(),
        "{error:?}"
    );
    // A real reset, found under reqwest's and hyper's own errors.
    let reset = chain(inner(&error)).into_iter().any(|e| {
        e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionReset)
    });
    assert!(reset, "{error:?}");
    assert_eq!(
        classify_error(&error),
        Classification::Retry(RetryReason::ConnectionClosed)
    );
    assert!(!RetryReason::ConnectionClosed.request_not_processed());
    assert_eq!(hits.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_connection_closed_without_an_answer_is_a_closed_connection() {
    let server = serve(|_| async { Action::Close }).await;
    let error = reqwest_error(client(), get(server.url("/close"))).await;
    assert!(
        !inner(&error).is_connect() && !inner(&error).is_timeout(),
        "{error:?}"
    );
    assert_eq!(
        classify_error(&error),
        Classification::Retry(RetryReason::ConnectionClosed)
    );
}

#[tokio::test]
async fn a_request_reqwest_cannot_take_fails_at_once_and_sends_nothing() {
    let server = serve(|_| async { respond(200) }).await;
    // A relative URI: reqwest needs an absolute URL.
    let error = reqwest_error(client(), get("/items/1".to_string())).await;
    assert!(inner(&error).is_builder(), "{error:?}");
    assert_eq!(classify_error(&error), Classification::Done);
    // Through the layer: the conversion error comes back, not retried.
    let error = quick(3)
        .layer(ReqwestService::new(client()))
        .oneshot(get("/items/1".to_string()))
        .await
        .unwrap_err();
    assert!(find_reqwest(&error).is_builder(), "{error:?}");
    // A scheme reqwest does not speak fails the same way.
    let error = reqwest_error(client(), get(format!("ftp://{}/file", server.addr))).await;
    assert!(inner(&error).is_builder(), "{error:?}");
    assert_eq!(classify_error(&error), Classification::Done);
    assert_eq!(server.count(), 0);
}

// ---- redirects, which reqwest follows itself ---------------------------------------------

#[tokio::test]
async fn a_redirect_is_followed_without_a_body_and_returned_with_one() {
    let server = serve(|hit| async move {
        match hit.path.as_str() {
            "/old" => respond_with(307, &[("location", "/new")]),
            _ => respond(200),
        }
    })
    .await;
    let svc = quick(3).layer(ReqwestService::new(client()));
    // An empty body is known to be empty: reqwest sends it again to the new location, and
    // the response knows where it came from.
    let response = svc.clone().oneshot(get(server.url("/old"))).await.unwrap();
    assert_eq!(response.status(), 200);
    let response = reqwest::Response::from(response);
    assert_eq!(response.url().path(), "/new");
    assert_eq!(server.count(), 2);
    // A body reqwest cannot clone: the 307 comes back as it is, the body sent once.
    let request = Request::put(server.url("/old"))
        .body(Full::new(Bytes::from_static(b"data")))
        .unwrap();
    let response = svc.oneshot(request).await.unwrap();
    assert_eq!(response.status(), 307);
    assert_eq!(server.count(), 3);
}

// ---- end to end, on both runtimes -------------------------------------------------------

on_both_runtimes!(
    get_after_two_503s_takes_three_attempts,
    put_after_a_reset_is_sent_again_with_the_same_body,
    post_carries_one_key_on_every_attempt,
    keyless_post_is_not_retried_after_a_reset,
    keyless_post_is_retried_when_the_connection_was_refused,
    streaming_body_is_replayed_byte_for_byte,
    send_only_streaming_body_is_replayed,
    full_body_keeps_its_content_length,
    retry_after_is_honoured,
    spawned_requests_are_each_retried,
    many_resets_under_streaming_uploads_never_refuse_a_safe_retry,
    reqwest_timeout_is_retried,
    keyless_post_is_not_retried_after_a_reqwest_timeout,
    response_converts_back_to_a_reqwest_response,
);

async fn get_after_two_503s_takes_three_attempts() {
    let server = serve_failing_first(2, 503, 200).await;
    let svc = quick(3).layer(ReqwestService::new(client()));
    let response = svc.oneshot(get(server.url("/items/1"))).await.unwrap();
    assert_eq!(response.status(), 200);
    let info = response.extensions().get::<RetryInfo>().unwrap().clone();
    assert_eq!(info.attempts(), 3);
    assert_eq!(
        info.retries().iter().map(|r| r.reason).collect::<Vec<_>>(),
        [RetryReason::Status(http::StatusCode::SERVICE_UNAVAILABLE); 2]
    );
    assert_eq!(server.count(), 3);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, Bytes::from_static(b"status 200"));
}

async fn put_after_a_reset_is_sent_again_with_the_same_body() {
    let (addr, hits) = resetting_server(|n, _| n == 0).await;
    let svc = quick(3).layer(ReqwestService::new(client()));
    let request = Request::put(format!("http://{addr}/doc"))
        .body(Full::new(Bytes::from_static(b"version 2")))
        .unwrap();
    let response = svc.oneshot(request).await.unwrap();
    assert_eq!(response.status(), 200);
    let info = response.extensions().get::<RetryInfo>().unwrap();
    assert_eq!(info.attempts(), 2);
    assert_eq!(info.retries()[0].reason, RetryReason::ConnectionClosed);
    assert_eq!(hits.load(Ordering::SeqCst), 2);
}

async fn post_carries_one_key_on_every_attempt() {
    let server = serve_failing_first(1, 503, 201).await;
    // Keys on: this server is taken to de-duplicate on them.
    let svc = quick(3)
        .policy(RetryPolicy::new().idempotency_key(IdempotencyKey::default()))
        .layer(ReqwestService::new(client()));
    let request = Request::post(server.url("/orders"))
        .body(Full::new(Bytes::from_static(b"{\"sku\":1}")))
        .unwrap();
    let response = svc.oneshot(request).await.unwrap();
    assert_eq!(response.status(), 201);
    let hits = server.hits();
    assert_eq!(hits.len(), 2);
    let keys: Vec<_> = hits
        .iter()
        .map(|h| h.headers.get("idempotency-key").cloned().unwrap())
        .collect();
    assert_eq!(keys[0], keys[1]);
    let info = response.extensions().get::<RetryInfo>().unwrap();
    assert_eq!(info.idempotency_key(), Some(&keys[0]));
    assert!(
        hits.iter()
            .all(|h| h.body == Bytes::from_static(b"{\"sku\":1}"))
    );
}

async fn keyless_post_is_not_retried_after_a_reset() {
    let (addr, hits) = resetting_server(|n, _| n == 0).await;
    let svc = quick(3)
        .policy(RetryPolicy::new().idempotency_key(None))
        .layer(ReqwestService::new(client()));
    let request = Request::post(format!("http://{addr}/orders"))
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap();
    let error = svc.oneshot(request).await.unwrap_err();
    let error = find_reqwest(&error);
    assert!(!error.is_connect() && !error.is_timeout(), "{error:?}");
    assert_eq!(hits.load(Ordering::SeqCst), 1);
}

async fn keyless_post_is_retried_when_the_connection_was_refused() {
    let port = closed_port();
    let layer = RetryLayer::new().policy(
        RetryPolicy::new()
            .max_attempts(3)
            .backoff(
                Backoff::exponential(Duration::from_millis(150), Duration::from_secs(1))
                    .jitter(Jitter::None),
            )
            .idempotency_key(None),
    );
    let svc = layer.layer(ReqwestService::new(client()));
    let request = Request::post(format!("http://127.0.0.1:{port}/orders"))
        .body(Full::new(Bytes::from_static(b"{\"sku\":1}")))
        .unwrap();
    let call = tokio::spawn(svc.oneshot(request));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let listener = TcpListener::bind(("127.0.0.1", port)).await.unwrap();
    let server = serve_on(listener, |_| async { respond(201) });
    let response = call.await.unwrap().unwrap();
    assert_eq!(response.status(), 201);
    let info = response.extensions().get::<RetryInfo>().unwrap();
    assert_eq!(info.retries()[0].reason, RetryReason::Connect);
    let hits = server.hits();
    assert_eq!(hits.len(), 1);
    assert_eq!(hits[0].body, Bytes::from_static(b"{\"sku\":1}"));
    assert!(hits[0].headers.get("idempotency-key").is_none());
}

const CHUNKS: [&[u8]; 3] = [b"alpha,", b"beta,", b"gamma"];

fn chunks() -> Vec<Bytes> {
    CHUNKS.iter().map(|c| Bytes::from_static(c)).collect()
}

async fn streaming_body_is_replayed_byte_for_byte() {
    let server = serve_failing_first(1, 503, 200).await;
    let svc = quick(3).layer(ReqwestService::new(client()));
    let request = Request::put(server.url("/stream"))
        .body(common::stream(chunks()))
        .unwrap();
    let response = svc.oneshot(request).await.unwrap();
    assert_eq!(response.status(), 200);
    let hits = server.hits();
    assert_eq!(hits.len(), 2);
    for hit in &hits {
        assert_eq!(hit.body, Bytes::from_static(b"alpha,beta,gamma"));
        // No length was known: sent chunked, both times.
        assert_eq!(hit.headers["transfer-encoding"], "chunked");
    }
}

/// A body that is `Send` but not `Sync`, as tower stacks often have.
async fn send_only_streaming_body_is_replayed() {
    let server = serve_failing_first(1, 502, 200).await;
    let svc = quick(3).layer(ReqwestService::new(client()));
    let body: UnsyncBoxBody<Bytes, Infallible> = UnsyncBoxBody::new(common::stream(chunks()));
    let request = Request::put(server.url("/stream")).body(body).unwrap();
    let response = svc.oneshot(request).await.unwrap();
    assert_eq!(response.status(), 200);
    let hits = server.hits();
    assert_eq!(hits.len(), 2);
    assert!(
        hits.iter()
            .all(|h| h.body == Bytes::from_static(b"alpha,beta,gamma"))
    );
}

async fn full_body_keeps_its_content_length() {
    let server = serve_failing_first(1, 503, 200).await;
    let svc = quick(3).layer(ReqwestService::new(client()));
    let request = Request::put(server.url("/doc"))
        .body(Full::new(Bytes::from_static(b"version 2")))
        .unwrap();
    let response = svc.oneshot(request).await.unwrap();
    assert_eq!(response.status(), 200);
    let hits = server.hits();
    assert_eq!(hits.len(), 2);
    for hit in &hits {
        assert_eq!(hit.headers["content-length"], "9");
        assert!(hit.headers.get("transfer-encoding").is_none());
        assert_eq!(hit.body, Bytes::from_static(b"version 2"));
    }
}

async fn retry_after_is_honoured() {
    let server = serve(|hit| async move {
        if hit.index == 0 {
            respond_with(429, &[("retry-after", "1")])
        } else {
            respond(200)
        }
    })
    .await;
    let start = std::time::Instant::now();
    let response = quick(3)
        .layer(ReqwestService::new(client()))
        .oneshot(get(server.url("/rate")))
        .await
        .unwrap();
    let elapsed = start.elapsed();
    assert_eq!(response.status(), 200);
    assert!(elapsed >= Duration::from_secs(1), "{elapsed:?}");
    assert!(elapsed < Duration::from_secs(2), "{elapsed:?}");
    let info = response.extensions().get::<RetryInfo>().unwrap();
    assert_eq!(
        info.retries()[0].hint,
        Some(tower_http_retry::hints::HintSource::RetryAfter)
    );
    assert!(info.total_wait() >= Duration::from_secs(1));
    assert_eq!(server.count(), 2);
}

async fn spawned_requests_are_each_retried() {
    const TASKS: usize = 16;
    // The first attempt on every path is a 503.
    let seen = Arc::new(std::sync::Mutex::new(std::collections::HashSet::new()));
    let server = serve(move |hit| {
        let first = seen.lock().unwrap().insert(hit.path.clone());
        async move { if first { respond(503) } else { respond(200) } }
    })
    .await;
    let svc = quick(3).layer(ReqwestService::new(client()));
    let mut tasks = Vec::new();
    for i in 0..TASKS {
        let mut svc = svc.clone();
        let request = get(server.url(&format!("/items/{i}")));
        tasks.push(tokio::spawn(async move {
            svc.ready().await?.call(request).await
        }));
    }
    for task in tasks {
        let response = task.await.unwrap().unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!(
            response.extensions().get::<RetryInfo>().unwrap().attempts(),
            2
        );
    }
    assert_eq!(server.count(), 2 * TASKS);
}

/// Races between the transport letting go of a failed attempt's body and the retry that
/// replays it: repeated, concurrent, each upload reset once.
async fn many_resets_under_streaming_uploads_never_refuse_a_safe_retry() {
    const REQUESTS: usize = 48;
    const AT_ONCE: usize = 8;
    let seen = Arc::new(std::sync::Mutex::new(std::collections::HashSet::new()));
    let (addr, hits) =
        resetting_server(move |_, path: &str| seen.lock().unwrap().insert(path.to_owned())).await;
    let svc = quick(3).layer(ReqwestService::new(client()));
    for round in 0..REQUESTS / AT_ONCE {
        let tasks: Vec<_> = (0..AT_ONCE)
            .map(|i| {
                let request = Request::put(format!("http://{addr}/doc/{round}/{i}"))
                    .body(common::stream(chunks()))
                    .unwrap();
                tokio::spawn(svc.clone().oneshot(request))
            })
            .collect();
        for task in tasks {
            let response = task.await.unwrap().unwrap();
            assert_eq!(response.status(), 200);
            let info = response.extensions().get::<RetryInfo>().unwrap().clone();
            assert_eq!(info.attempts(), 2);
            assert_eq!(info.retries()[0].reason, RetryReason::ConnectionClosed);
            // The server echoes what it read: the whole body, replayed.
            let body = response.into_body().collect().await.unwrap().to_bytes();
            assert_eq!(body, Bytes::from_static(b"alpha,beta,gamma"));
        }
    }
    assert_eq!(hits.load(Ordering::SeqCst), 2 * REQUESTS);
}

/// A server whose first answer comes after `delay`, every later one at once.
async fn slow_once(delay: Duration) -> common::server::Server {
    serve(move |hit| async move {
        if hit.index == 0 {
            tokio::time::sleep(delay).await;
        }
        respond(200)
    })
    .await
}

async fn reqwest_timeout_is_retried() {
    let server = slow_once(Duration::from_millis(800)).await;
    let svc = quick(3).layer(ReqwestService::new(client_with_timeout(
        Duration::from_millis(200),
    )));
    let start = std::time::Instant::now();
    let response = svc.oneshot(get(server.url("/slow"))).await.unwrap();
    assert_eq!(response.status(), 200);
    let info = response.extensions().get::<RetryInfo>().unwrap();
    assert_eq!(info.attempts(), 2);
    assert_eq!(info.retries()[0].reason, RetryReason::Timeout);
    // The retry did not wait for the slow answer.
    assert!(start.elapsed() < Duration::from_millis(700));
    assert_eq!(server.count(), 2);
}

async fn keyless_post_is_not_retried_after_a_reqwest_timeout() {
    let server = slow_once(Duration::from_millis(400)).await;
    let svc = quick(3)
        .policy(RetryPolicy::new().idempotency_key(None))
        .layer(ReqwestService::new(client_with_timeout(
            Duration::from_millis(100),
        )));
    let request = Request::post(server.url("/orders"))
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap();
    let error = svc.oneshot(request).await.unwrap_err();
    assert!(find_reqwest(&error).is_timeout(), "{error:?}");
    // A timeout is no proof that the server did nothing: no second POST. (Wait for the
    // slow first answer to be over, so that a second POST would have been counted.)
    tokio::time::sleep(Duration::from_millis(450)).await;
    assert_eq!(server.count(), 1);
}

async fn response_converts_back_to_a_reqwest_response() {
    let server = serve_failing_first(1, 503, 200).await;
    let url = server.url("/items/9?full=1");
    let response = quick(3)
        .layer(ReqwestService::new(client()))
        .oneshot(get(url.clone()))
        .await
        .unwrap();
    let response = reqwest::Response::from(response);
    assert_eq!(response.url().as_str(), url);
    assert_eq!(
        response.extensions().get::<RetryInfo>().unwrap().attempts(),
        2
    );
    assert_eq!(response.text().await.unwrap(), "status 200");
}

// ---- the service itself -------------------------------------------------------------------

#[test]
fn the_service_is_send_sync_and_clone_and_its_future_is_send() {
    fn send_sync_clone<T: Send + Sync + Clone + 'static>(_: &T) {}
    fn send<T: Send>(_: &T) {}
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let service = ReqwestService::new(client());
        send_sync_clone(&service);
        let mut layered = quick(3).layer(service.clone());
        let future = layered.call(get(format!("http://127.0.0.1:{}/", closed_port())));
        send(&future);
        assert!(format!("{service:?}").starts_with("ReqwestService"));
        let error = future.await.unwrap_err();
        assert!(find_reqwest(&error).is_connect(), "{error:?}");
    });
}
