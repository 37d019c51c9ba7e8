//! reqwest-middleware's client -> RetryMiddleware -> middlewares below -> reqwest::Client ->
//! a real hyper server on 127.0.0.1, in real time, on both runtimes.
#![allow(clippy::disallowed_methods)] // measures real time with std's clock
#![cfg(feature = "middleware")]

use crate::common;

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use common::server::{respond, respond_with, serve, serve_failing_first};
use http::Extensions;
use http_body::Frame;
use http_body_util::StreamBody;
use reqwest::{Request, Response};
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware, Middleware, Next};
use tower_http_retry::classify::RetryReason;
use tower_http_retry::{
    Backoff, DeadlineExceeded, IdempotencyKey, RetryInfo, RetryLayer, RetryPolicy,
};
use tower_http_retry_reqwest::RetryMiddleware;

fn layer(max_attempts: u32) -> RetryLayer {
    RetryLayer::new().policy(RetryPolicy::new().max_attempts(max_attempts).backoff(
        Backoff::exponential(Duration::from_millis(5), Duration::from_millis(50)),
    ))
}

fn reqwest_client(timeout: Option<Duration>) -> reqwest::Client {
    // No proxy from the environment: every request goes straight to 127.0.0.1.
    let builder = reqwest::Client::builder().no_proxy();
    match timeout {
        Some(timeout) => builder.timeout(timeout),
        None => builder,
    }
    .build()
    .unwrap()
}

/// Counts the calls that reach it.
#[derive(Clone, Default)]
struct Count(Arc<AtomicUsize>);

impl Count {
    fn get(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

#[async_trait::async_trait]
impl Middleware for Count {
    async fn handle(
        &self,
        req: Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<Response> {
        self.0.fetch_add(1, Ordering::SeqCst);
        next.run(req, extensions).await
    }
}

/// `above -> RetryMiddleware -> below -> client`.
fn client(layer: RetryLayer, timeout: Option<Duration>) -> (ClientWithMiddleware, Count, Count) {
    let (above, below) = (Count::default(), Count::default());
    let client = ClientBuilder::new(reqwest_client(timeout))
        .with(above.clone())
        .with(RetryMiddleware::new(layer))
        .with(below.clone())
        .build();
    (client, above, below)
}

fn first_fails_with(
    code: u16,
) -> impl Fn(common::server::Hit) -> std::future::Ready<common::server::Action>
+ Clone
+ Send
+ Sync
+ 'static {
    move |hit| {
        std::future::ready(if hit.index == 0 {
            respond(code)
        } else {
            respond(200)
        })
    }
}

on_both_runtimes!(
    get_after_two_503s_is_one_request_above_and_three_below,
    post_carries_one_key_and_the_same_body_on_every_attempt,
    streaming_body_is_replayed,
    retry_after_is_honoured,
    a_policy_in_the_middleware_extensions_overrides_the_layer,
    every_attempt_starts_from_the_callers_extensions_and_the_last_comes_back,
    an_error_from_a_middleware_below_is_classified_and_retried,
    a_middleware_error_comes_back_as_it_was_raised,
    a_refused_connection_comes_back_as_reqwest_error_after_the_retries,
    a_reqwest_timeout_is_retried,
    the_deadline_comes_back_as_a_middleware_error,
    spawned_requests_are_each_retried,
    a_request_timeout_holds_on_every_attempt,
);

/// `RequestBuilder::timeout` (kept in the request's extensions, which the middleware does
/// not convert per attempt) bounds every attempt: each of the server's slow answers times
/// out and is retried, and the last timeout comes back.
async fn a_request_timeout_holds_on_every_attempt() {
    let server = serve(|_| async {
        tokio::time::sleep(Duration::from_secs(5)).await;
        respond(200)
    })
    .await;
    let (client, _, below) = client(layer(2), None);
    let started = std::time::Instant::now();
    let error = client
        .get(server.url("/slow"))
        .timeout(Duration::from_millis(100))
        .send()
        .await
        .unwrap_err();
    assert!(error.is_timeout(), "{error:?}");
    assert_eq!(below.get(), 2);
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
}

async fn get_after_two_503s_is_one_request_above_and_three_below() {
    let server = serve_failing_first(2, 503, 200).await;
    let (client, above, below) = client(layer(3), None);
    let url = server.url("/items/1");
    let response = client.get(&url).send().await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.url().as_str(), url);
    let info = response.extensions().get::<RetryInfo>().unwrap();
    assert_eq!(info.attempts(), 3);
    assert_eq!(
        info.retries()[0].reason,
        RetryReason::Status(http::StatusCode::SERVICE_UNAVAILABLE)
    );
    assert_eq!((above.get(), below.get(), server.count()), (1, 3, 3));
    assert_eq!(response.text().await.unwrap(), "status 200");
}

async fn post_carries_one_key_and_the_same_body_on_every_attempt() {
    let server = serve(first_fails_with(503)).await;
    // Keys on: this server is taken to de-duplicate on them.
    let keyed = layer(3).policy(RetryPolicy::new().idempotency_key(IdempotencyKey::default()));
    let (client, _, below) = client(keyed, None);
    let response = client
        .post(server.url("/orders"))
        .body("{\"sku\":1}")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let hits = server.hits();
    assert_eq!((hits.len(), below.get()), (2, 2));
    let key = hits[0].headers.get("idempotency-key").unwrap();
    assert_eq!(hits[1].headers.get("idempotency-key"), Some(key));
    for hit in &hits {
        assert_eq!(hit.body, Bytes::from_static(b"{\"sku\":1}"));
        assert_eq!(hit.headers["content-length"], "9");
    }
    let info = response.extensions().get::<RetryInfo>().unwrap();
    assert_eq!(info.idempotency_key(), Some(key));
}

async fn streaming_body_is_replayed() {
    let server = serve(first_fails_with(502)).await;
    let (client, _, _) = client(layer(3), None);
    let chunks = ["alpha,", "beta,", "gamma"]
        .map(|c| Ok::<_, Infallible>(Frame::data(Bytes::from_static(c.as_bytes()))));
    let body = reqwest::Body::wrap(StreamBody::new(futures_util::stream::iter(chunks)));
    let response = client
        .put(server.url("/stream"))
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let hits = server.hits();
    assert_eq!(hits.len(), 2);
    for hit in &hits {
        assert_eq!(hit.body, Bytes::from_static(b"alpha,beta,gamma"));
        assert_eq!(hit.headers["transfer-encoding"], "chunked");
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
    let (client, _, _) = client(layer(3), None);
    let start = std::time::Instant::now();
    let response = client.get(server.url("/rate")).send().await.unwrap();
    let elapsed = start.elapsed();
    assert_eq!(response.status(), 200);
    assert!(elapsed >= Duration::from_secs(1), "{elapsed:?}");
    assert!(elapsed < Duration::from_secs(2), "{elapsed:?}");
    assert_eq!(
        response.extensions().get::<RetryInfo>().unwrap().retries()[0].hint,
        Some(tower_http_retry::hints::HintSource::RetryAfter)
    );
}

async fn a_policy_in_the_middleware_extensions_overrides_the_layer() {
    let server = serve(|_| async { respond(503) }).await;
    let (client, _, below) = client(layer(3), None);
    let response = client
        .get(server.url("/health"))
        .with_extension(RetryPolicy::never())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!((below.get(), server.count()), (1, 1));
    // Without it, the same request is retried.
    let response = client.get(server.url("/health")).send().await.unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(below.get(), 1 + 3);
}

#[derive(Clone, Debug, PartialEq)]
struct Marker(&'static str);

#[derive(Clone, Debug, PartialEq)]
struct SeenBelow(usize);

/// What one call found in the extensions.
type Found = (Option<Marker>, Option<SeenBelow>);

/// Records in the extensions which attempt it saw, and what it found there.
#[derive(Clone, Default)]
struct Recorder {
    calls: Count,
    found: Arc<Mutex<Vec<Found>>>,
}

#[async_trait::async_trait]
impl Middleware for Recorder {
    async fn handle(
        &self,
        req: Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<Response> {
        let n = self.calls.0.fetch_add(1, Ordering::SeqCst) + 1;
        self.found.lock().unwrap().push((
            extensions.get::<Marker>().cloned(),
            extensions.get::<SeenBelow>().cloned(),
        ));
        extensions.insert(SeenBelow(n));
        next.run(req, extensions).await
    }
}

async fn every_attempt_starts_from_the_callers_extensions_and_the_last_comes_back() {
    let server = serve_failing_first(2, 503, 200).await;
    let recorder = Recorder::default();
    let client = ClientBuilder::new(reqwest_client(None))
        .with(RetryMiddleware::new(layer(3)))
        .with(recorder.clone())
        .build();
    let request = client.get(server.url("/x")).build().unwrap();
    let mut extensions = Extensions::new();
    extensions.insert(Marker("caller"));
    let response = client
        .execute_with_extensions(request, &mut extensions)
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    // Each attempt saw the caller's marker and nothing an earlier attempt left.
    assert_eq!(
        *recorder.found.lock().unwrap(),
        vec![(Some(Marker("caller")), None); 3]
    );
    // The caller gets the last attempt's extensions.
    assert_eq!(extensions.get::<SeenBelow>(), Some(&SeenBelow(3)));
    assert_eq!(extensions.get::<Marker>(), Some(&Marker("caller")));
}

/// Fails its first `times` calls with an `io::Error` of `kind`, then lets calls through.
#[derive(Clone)]
struct Fail {
    calls: Count,
    times: usize,
    kind: std::io::ErrorKind,
}

impl Fail {
    fn new(times: usize, kind: std::io::ErrorKind) -> Self {
        Self {
            calls: Count::default(),
            times,
            kind,
        }
    }
}

#[async_trait::async_trait]
impl Middleware for Fail {
    async fn handle(
        &self,
        req: Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<Response> {
        if self.calls.0.fetch_add(1, Ordering::SeqCst) < self.times {
            return Err(reqwest_middleware::Error::middleware(std::io::Error::from(
                self.kind,
            )));
        }
        next.run(req, extensions).await
    }
}

async fn an_error_from_a_middleware_below_is_classified_and_retried() {
    let server = serve(|_| async { respond(200) }).await;
    let reset = Fail::new(1, std::io::ErrorKind::ConnectionReset);
    let client = ClientBuilder::new(reqwest_client(None))
        .with(RetryMiddleware::new(layer(3)))
        .with(reset.clone())
        .build();
    let response = client.get(server.url("/x")).send().await.unwrap();
    assert_eq!(response.status(), 200);
    let info = response.extensions().get::<RetryInfo>().unwrap();
    assert_eq!(info.retries()[0].reason, RetryReason::ConnectionClosed);
    assert_eq!((reset.calls.get(), server.count()), (2, 1));
}

async fn a_middleware_error_comes_back_as_it_was_raised() {
    let server = serve(|_| async { respond(200) }).await;
    for (kind, calls) in [
        // Not retryable: returned at once.
        (std::io::ErrorKind::PermissionDenied, 1),
        // Retryable: returned after the last attempt.
        (std::io::ErrorKind::ConnectionReset, 3),
    ] {
        let fail = Fail::new(usize::MAX, kind);
        let client = ClientBuilder::new(reqwest_client(None))
            .with(RetryMiddleware::new(layer(3)))
            .with(fail.clone())
            .build();
        let error = client.get(server.url("/x")).send().await.unwrap_err();
        match &error {
            reqwest_middleware::Error::Middleware(e) => {
                let io = e.downcast_ref::<std::io::Error>();
                assert_eq!(io.map(std::io::Error::kind), Some(kind), "{e:?}");
            }
            other => panic!("expected the middleware's error, got {other:?}"),
        }
        assert_eq!(fail.calls.get(), calls, "{kind:?}");
    }
    assert_eq!(server.count(), 0);
}

async fn a_refused_connection_comes_back_as_reqwest_error_after_the_retries() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let (client, above, below) = client(layer(2), None);
    let error = client
        .get(format!("http://127.0.0.1:{port}/"))
        .send()
        .await
        .unwrap_err();
    match &error {
        reqwest_middleware::Error::Reqwest(e) => assert!(e.is_connect(), "{e:?}"),
        other => panic!("expected a reqwest error, got {other:?}"),
    }
    assert_eq!((above.get(), below.get()), (1, 2));
}

async fn a_reqwest_timeout_is_retried() {
    let server = serve(|hit| async move {
        if hit.index == 0 {
            tokio::time::sleep(Duration::from_millis(800)).await;
        }
        respond(200)
    })
    .await;
    let (client, _, below) = client(layer(3), Some(Duration::from_millis(200)));
    let response = client.get(server.url("/slow")).send().await.unwrap();
    assert_eq!(response.status(), 200);
    let info = response.extensions().get::<RetryInfo>().unwrap();
    assert_eq!(info.retries()[0].reason, RetryReason::Timeout);
    assert_eq!(below.get(), 2);
}

async fn the_deadline_comes_back_as_a_middleware_error() {
    let server = serve(|_| async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        respond(200)
    })
    .await;
    let layer = RetryLayer::new().policy(RetryPolicy::new().deadline(Duration::from_millis(100)));
    let (client, _, _) = client(layer, None);
    let error = client.get(server.url("/slow")).send().await.unwrap_err();
    match &error {
        reqwest_middleware::Error::Middleware(e) => {
            assert!(e.downcast_ref::<DeadlineExceeded>().is_some(), "{e:?}")
        }
        other => panic!("expected the layer's own error, got {other:?}"),
    }
}

async fn spawned_requests_are_each_retried() {
    const TASKS: usize = 16;
    let seen = Arc::new(Mutex::new(std::collections::HashSet::new()));
    let server = serve(move |hit| {
        let first = seen.lock().unwrap().insert(hit.path.clone());
        async move { if first { respond(503) } else { respond(200) } }
    })
    .await;
    let (client, above, below) = client(layer(3), None);
    let tasks: Vec<_> = (0..TASKS)
        .map(|i| {
            let (client, url) = (client.clone(), server.url(&format!("/items/{i}")));
            tokio::spawn(async move { client.get(url).send().await })
        })
        .collect();
    for task in tasks {
        let response = task.await.unwrap().unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!(
            response.extensions().get::<RetryInfo>().unwrap().attempts(),
            2
        );
    }
    assert_eq!((above.get(), below.get()), (TASKS, 2 * TASKS));
}
