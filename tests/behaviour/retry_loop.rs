//! The retry loop against scripted services, under paused time.
#![allow(clippy::disallowed_methods)] // tokio's paused clock and sleeps, or real time

use crate::common;

use std::io;
use std::time::Duration;

use bytes::Bytes;
use common::{Mock, Reply, get, request, stream};
use http::{Method, StatusCode};
use tokio::time::Instant;
use tower::{Layer, Service, ServiceExt};
use tower_http_retry::classify::RetryReason;
use tower_http_retry::{Backoff, Jitter, RetryInfo, RetryLayer, RetryPolicy, StopReason};

const MS: Duration = Duration::from_millis(1);

fn fixed(max_attempts: u32) -> RetryLayer {
    RetryLayer::new().policy(
        RetryPolicy::default()
            .max_attempts(max_attempts)
            .backoff(Backoff::exponential(100 * MS, 10_000 * MS).jitter(Jitter::None)),
    )
}

fn info<B>(response: &http::Response<B>) -> RetryInfo {
    response
        .extensions()
        .get::<RetryInfo>()
        .cloned()
        .expect("RetryInfo attached")
}

#[tokio::test(start_paused = true)]
async fn retryable_statuses_are_retried_up_to_max_attempts() {
    for code in [408u16, 429, 502, 503, 504] {
        let mock = Mock::statuses(&[code, code, code, code]);
        let svc = fixed(3).layer(mock.clone());
        let response = svc.oneshot(get("http://h/x")).await.unwrap();
        assert_eq!(
            response.status().as_u16(),
            code,
            "last {code} is returned as is"
        );
        let info = info(&response);
        assert_eq!(info.attempts(), 3, "{code}");
        assert_eq!(mock.calls(), 3, "{code}");
        assert_eq!(info.stop(), StopReason::MaxAttempts);
        let status = StatusCode::from_u16(code).unwrap();
        assert!(
            info.retries()
                .iter()
                .all(|r| r.reason == RetryReason::Status(status))
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_500_is_retried_at_most_once() {
    let mock = Mock::statuses(&[500, 500, 500]);
    let response = fixed(5)
        .layer(mock.clone())
        .oneshot(get("http://h/"))
        .await
        .unwrap();
    assert_eq!(response.status(), 500);
    assert_eq!(mock.calls(), 2);
    assert_eq!(info(&response).stop(), StopReason::Final);

    // A 500 after another retryable failure still gets its one retry.
    let mock = Mock::statuses(&[503, 500, 200]);
    let response = fixed(5)
        .layer(mock.clone())
        .oneshot(get("http://h/"))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(mock.calls(), 3);
}

#[tokio::test(start_paused = true)]
async fn final_statuses_are_returned_as_is_after_one_attempt() {
    for code in [
        200u16, 201, 204, 301, 304, 400, 401, 403, 404, 409, 422, 501,
    ] {
        let mock = Mock::statuses(&[code, 200]);
        let response = fixed(3)
            .layer(mock.clone())
            .oneshot(get("http://h/"))
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), code);
        assert_eq!(mock.calls(), 1, "{code}");
        let info = info(&response);
        assert_eq!((info.attempts(), info.stop()), (1, StopReason::Final));
    }
}

#[tokio::test(start_paused = true)]
async fn the_last_retryable_response_keeps_its_headers_and_body() {
    let mock = Mock::new([
        Reply::Status(503),
        Reply::Headers(503, vec![("x-last", "yes".into())]),
    ]);
    let response = fixed(2)
        .layer(mock)
        .oneshot(get("http://h/"))
        .await
        .unwrap();
    assert_eq!(response.headers()["x-last"], "yes");
    let body = http_body_util::BodyExt::collect(response.into_body())
        .await
        .unwrap();
    assert_eq!(body.to_bytes(), Bytes::from_static(b"status 503"));
}

fn io_error(kind: io::ErrorKind) -> Reply {
    Reply::error(move || io::Error::from(kind))
}

#[tokio::test(start_paused = true)]
async fn retryable_errors_are_retried() {
    let cases: Vec<(Box<dyn Fn() -> Reply>, RetryReason)> = vec![
        (
            Box::new(|| io_error(io::ErrorKind::ConnectionRefused)),
            RetryReason::Connect,
        ),
        (
            Box::new(|| io_error(io::ErrorKind::ConnectionReset)),
            RetryReason::ConnectionClosed,
        ),
        (
            Box::new(|| io_error(io::ErrorKind::ConnectionAborted)),
            RetryReason::ConnectionClosed,
        ),
        (
            Box::new(|| io_error(io::ErrorKind::BrokenPipe)),
            RetryReason::ConnectionClosed,
        ),
        (
            Box::new(|| io_error(io::ErrorKind::UnexpectedEof)),
            RetryReason::ConnectionClosed,
        ),
        (
            Box::new(|| io_error(io::ErrorKind::TimedOut)),
            RetryReason::Timeout,
        ),
        (
            Box::new(|| Reply::error(tower::timeout::error::Elapsed::new)),
            RetryReason::Timeout,
        ),
    ];
    for (make, reason) in cases {
        let mock = Mock::new([make(), make()]);
        let response = fixed(3)
            .layer(mock.clone())
            .oneshot(get("http://h/"))
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "{reason:?}");
        let info = info(&response);
        assert_eq!(info.attempts(), 3, "{reason:?}");
        assert_eq!(
            info.retries().iter().map(|r| r.reason).collect::<Vec<_>>(),
            [reason, reason]
        );
    }
}

#[tokio::test(start_paused = true)]
async fn other_errors_are_returned_as_is() {
    #[derive(Debug)]
    struct Custom;
    impl std::fmt::Display for Custom {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("custom failure: connection reset")
        }
    }
    impl std::error::Error for Custom {}

    let mock = Mock::new([Reply::error(|| Custom), Reply::Status(200)]);
    let err = fixed(3)
        .layer(mock.clone())
        .oneshot(get("http://h/"))
        .await
        .unwrap_err();
    assert!(
        common::last(&err).is::<Custom>(),
        "the inner error is passed through unchanged: {err}"
    );
    assert_eq!(mock.calls(), 1);

    let mock = Mock::new([
        io_error(io::ErrorKind::PermissionDenied),
        Reply::Status(200),
    ]);
    let err = fixed(3)
        .layer(mock.clone())
        .oneshot(get("http://h/"))
        .await
        .unwrap_err();
    returned_at_once(&err, &mock, io::ErrorKind::PermissionDenied);
}

#[tokio::test(start_paused = true)]
async fn an_error_from_the_callers_own_body_is_not_retried() {
    let frames = vec![
        Ok(http_body::Frame::data(Bytes::from_static(b"part"))),
        Err(io::Error::from(io::ErrorKind::ConnectionReset)),
    ];
    let body = http_body_util::StreamBody::new(futures_util::stream::iter(frames));
    let request = http::Request::put("http://h/").body(body).unwrap();
    let mock = Mock::statuses(&[200]);
    let err = fixed(3)
        .layer(mock.clone())
        .oneshot(request)
        .await
        .unwrap_err();
    // The caller's own error, even though its kind would be retryable from the network.
    returned_at_once(&err, &mock, io::ErrorKind::ConnectionReset);
}

#[tokio::test(start_paused = true)]
async fn max_attempts_counts_the_first_try() {
    for max in 1..=5 {
        let mock = Mock::statuses(&[503; 8]);
        let response = fixed(max)
            .layer(mock.clone())
            .oneshot(get("http://h/"))
            .await
            .unwrap();
        assert_eq!(mock.calls(), max as usize);
        assert_eq!(info(&response).attempts(), max);
    }
}

#[tokio::test(start_paused = true)]
async fn waits_follow_the_backoff_exactly() {
    let mock = Mock::statuses(&[503, 503, 503]);
    let start = Instant::now();
    let response = fixed(4)
        .layer(mock.clone())
        .oneshot(get("http://h/"))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let seen = mock.seen();
    let gaps: Vec<_> = seen.windows(2).map(|w| w[1].at - w[0].at).collect();
    assert_eq!(gaps, [200 * MS, 400 * MS, 800 * MS]);
    assert_eq!(start.elapsed(), 1400 * MS);
    let info = info(&response);
    assert_eq!(info.total_wait(), 1400 * MS);
    assert_eq!(
        info.retries().iter().map(|r| r.wait).collect::<Vec<_>>(),
        gaps
    );
}

#[tokio::test(start_paused = true)]
async fn full_jitter_waits_stay_under_the_ceiling_and_differ_between_requests() {
    let layer = RetryLayer::new().policy(RetryPolicy::default().max_attempts(4).rng_seed(9));
    let mut all = Vec::new();
    for _ in 0..2 {
        let mock = Mock::statuses(&[503, 503, 503]);
        let response = layer.layer(mock).oneshot(get("http://h/")).await.unwrap();
        let waits: Vec<_> = info(&response).retries().iter().map(|r| r.wait).collect();
        for (n, wait) in waits.iter().enumerate() {
            assert!(*wait <= 100 * MS * 2u32.pow(n as u32 + 1), "{waits:?}");
        }
        all.push(waits);
    }
    assert_ne!(
        all[0], all[1],
        "two requests must not share a jitter sequence"
    );
}

#[tokio::test(start_paused = true)]
async fn a_service_that_is_not_ready_is_not_called() {
    let mock = Mock::statuses(&[503]);
    mock.not_ready_for(5);
    let mut svc = fixed(2).layer(mock.clone());
    ServiceExt::<http::Request<http_body_util::Full<Bytes>>>::ready(&mut svc)
        .await
        .unwrap();
    let future = svc.call(get("http://h/"));
    let response = future.await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(mock.calls(), 2);
    // One poll for the first attempt, then the five `Pending`s and the `Ready` of the retry:
    // the retry was sent only once the clone said it was ready.
    assert_eq!(mock.ready_polls(), 1 + 5 + 1);
}

#[tokio::test(start_paused = true)]
async fn post_without_a_key_is_not_retried_after_a_503() {
    let mock = Mock::statuses(&[503, 200]);
    let layer = fixed(3).policy(RetryPolicy::new().idempotency_key(None));
    let response = layer
        .layer(mock.clone())
        .oneshot(request(Method::POST, "http://h/orders", b"{}"))
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(mock.calls(), 1);
    assert_eq!(info(&response).stop(), StopReason::NotIdempotent);
    assert!(mock.seen()[0].headers.get("idempotency-key").is_none());
}

#[tokio::test(start_paused = true)]
async fn post_without_a_key_is_retried_after_a_connect_error() {
    let mock = Mock::new([io_error(io::ErrorKind::ConnectionRefused)]);
    let layer = fixed(3).policy(RetryPolicy::new().idempotency_key(None));
    let response = layer
        .layer(mock.clone())
        .oneshot(request(Method::POST, "http://h/orders", b"{\"n\":1}"))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(mock.calls(), 2);
    assert_eq!(
        mock.seen().last().unwrap().body,
        Bytes::from_static(b"{\"n\":1}")
    );
}

#[tokio::test(start_paused = true)]
async fn post_without_a_key_is_not_retried_after_a_reset() {
    let mock = Mock::new([io_error(io::ErrorKind::ConnectionReset)]);
    let layer = fixed(3).policy(RetryPolicy::new().idempotency_key(None));
    let err = layer
        .layer(mock.clone())
        .oneshot(request(Method::POST, "http://h/orders", b"{}"))
        .await
        .unwrap_err();
    returned_at_once(&err, &mock, io::ErrorKind::ConnectionReset);
}

#[tokio::test(start_paused = true)]
async fn post_with_the_callers_key_is_retried_and_the_key_kept() {
    let mock = Mock::statuses(&[503, 503]);
    let mut req = request(Method::POST, "http://h/orders", b"{}");
    req.headers_mut()
        .insert("idempotency-key", "caller-key-1".parse().unwrap());
    let response = fixed(3)
        .policy(RetryPolicy::new().idempotency_key(None))
        .layer(mock.clone())
        .oneshot(req)
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let keys: Vec<_> = mock
        .seen()
        .iter()
        .map(|s| s.headers["idempotency-key"].clone())
        .collect();
    assert_eq!(keys, ["caller-key-1"; 3]);
    assert_eq!(info(&response).idempotency_key().unwrap(), "caller-key-1");
}

#[tokio::test(start_paused = true)]
async fn connect_is_never_retried() {
    let mock = Mock::new([io_error(io::ErrorKind::ConnectionRefused)]);
    let req = http::Request::builder()
        .method(Method::CONNECT)
        .uri("h:443")
        .body(http_body_util::Full::new(Bytes::new()))
        .unwrap();
    assert!(fixed(3).layer(mock.clone()).oneshot(req).await.is_err());
    assert_eq!(mock.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_streaming_body_under_the_cap_is_replayed_byte_identical() {
    let chunks: Vec<Bytes> = (0..16u8).map(|i| Bytes::from(vec![i; 1000])).collect();
    let expected: Vec<u8> = chunks.iter().flat_map(|c| c.iter().copied()).collect();
    let mock = Mock::statuses(&[503, 502]);
    let req = http::Request::put("http://h/blob")
        .body(stream(chunks))
        .unwrap();
    let response = fixed(3).layer(mock.clone()).oneshot(req).await.unwrap();
    assert_eq!(response.status(), 200);
    let seen = mock.seen();
    assert_eq!(seen.len(), 3);
    for s in &seen {
        assert_eq!(s.body.as_ref(), &expected[..]);
    }
}

#[tokio::test(start_paused = true)]
async fn a_streaming_body_over_the_cap_is_sent_complete_once() {
    let chunks: Vec<Bytes> = (0..10u8).map(|i| Bytes::from(vec![i; 1024])).collect();
    let expected: Vec<u8> = chunks.iter().flat_map(|c| c.iter().copied()).collect();
    let mock = Mock::statuses(&[503, 200]);
    let req = http::Request::put("http://h/blob")
        .body(stream(chunks))
        .unwrap();
    let layer = fixed(3).max_replay_bytes(4096);
    let response = layer.layer(mock.clone()).oneshot(req).await.unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(mock.calls(), 1);
    assert_eq!(mock.seen()[0].body.as_ref(), &expected[..]);
    assert_eq!(info(&response).stop(), StopReason::BodyNotReplayable);
}

#[tokio::test(start_paused = true)]
async fn a_body_whose_size_hint_exceeds_the_cap_is_sent_once() {
    let mock = Mock::statuses(&[503, 200]);
    let req = http::Request::put("http://h/blob")
        .body(http_body_util::Full::new(Bytes::from(vec![1u8; 5000])))
        .unwrap();
    let response = fixed(3)
        .max_replay_bytes(4096)
        .layer(mock.clone())
        .oneshot(req)
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(mock.seen()[0].body.len(), 5000);
    assert_eq!(mock.calls(), 1);
}

/// A server (or a proxy) that answers 503 without reading the request: the body is still
/// unread in the caller's body, so the retry sends it.
#[tokio::test(start_paused = true)]
async fn a_response_before_the_body_was_sent_is_retried() {
    let mock = Mock::statuses(&[503, 200]);
    mock.skip_body();
    let req = request(Method::PUT, "http://h/x", b"never read");
    let response = fixed(3).layer(mock.clone()).oneshot(req).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(mock.calls(), 2);
    assert_eq!(info(&response).stop(), StopReason::Final);
}

/// A transport that reads at most `limits[n]` bytes of attempt `n`'s body, answers 503 and
/// drops the body; it records what each attempt sent.
#[derive(Clone)]
struct Cutting {
    limits: &'static [usize],
    sent: std::sync::Arc<std::sync::Mutex<Vec<Vec<u8>>>>,
}

impl<B> Service<http::Request<tower_http_retry::ReplayBody<B>>> for Cutting
where
    B: http_body::Body<Data = Bytes> + Unpin + Send + 'static,
    B::Error: std::fmt::Debug,
{
    type Response = http::Response<()>;
    type Error = std::convert::Infallible;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<http::Response<()>, Self::Error>> + Send>,
    >;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tower_http_retry::ReplayBody<B>>) -> Self::Future {
        let sent = std::sync::Arc::clone(&self.sent);
        let limit = self.limits[sent.lock().unwrap().len().min(self.limits.len() - 1)];
        Box::pin(async move {
            use http_body_util::BodyExt;
            let mut body = req.into_body();
            let mut read = Vec::new();
            while read.len() < limit {
                match body.frame().await {
                    Some(frame) => {
                        if let Ok(data) = frame.unwrap().into_data() {
                            read.extend_from_slice(&data);
                        }
                    }
                    None => break,
                }
            }
            sent.lock().unwrap().push(read);
            drop(body);
            Ok(http::Response::builder().status(503).body(()).unwrap())
        })
    }
}

/// Every attempt answered early is followed by one that sends the whole body: the recorded
/// part replayed, the rest read from the caller's body; with the request's
/// `Content-Length` and without one.
#[tokio::test(start_paused = true)]
async fn an_early_response_is_retried_with_the_whole_body() {
    for (limits, sent) in [
        // Attempt 1 read nothing, attempt 2 part of it, attempt 3 all of it.
        (&[0, 3, usize::MAX][..], [&b""[..], b"abc", b"abcdef"]),
        // Attempt 1 read it whole: the cut attempt 2 changes nothing for attempt 3.
        (
            &[usize::MAX, 3, usize::MAX][..],
            [b"abcdef", b"abc", b"abcdef"],
        ),
    ] {
        for declared in [Some("6"), None] {
            let transport = Cutting {
                limits,
                sent: Default::default(),
            };
            let mut req = http::Request::put("http://h/doc")
                .body(stream(vec![
                    Bytes::from_static(b"abc"),
                    Bytes::from_static(b"def"),
                ]))
                .unwrap();
            if let Some(length) = declared {
                req.headers_mut()
                    .insert(http::header::CONTENT_LENGTH, length.parse().unwrap());
            }
            let response = fixed(3)
                .layer(transport.clone())
                .oneshot(req)
                .await
                .unwrap();
            assert_eq!(response.status(), 503);
            let info = info(&response);
            assert_eq!(*transport.sent.lock().unwrap(), sent, "{declared:?}");
            assert_eq!(info.attempts(), 3, "{declared:?}");
            assert_eq!(info.stop(), StopReason::MaxAttempts, "{declared:?}");
        }
    }
}

#[tokio::test(start_paused = true)]
async fn never_and_one_attempt_send_once() {
    let mock = Mock::statuses(&[503, 200]);
    let layer = RetryLayer::new().policy(RetryPolicy::never());
    let response = layer
        .layer(mock.clone())
        .oneshot(get("http://h/"))
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(mock.calls(), 1);
    assert_eq!(info(&response).stop(), StopReason::Disabled);

    // A policy in the request's extensions overrides the layer's.
    let mock = Mock::statuses(&[503, 200]);
    let mut req = get("http://h/");
    req.extensions_mut().insert(RetryPolicy::never());
    let response = fixed(3).layer(mock.clone()).oneshot(req).await.unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(mock.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_custom_classifier_replaces_the_default() {
    use tower_http_retry::classify::{Classification, Classify, DefaultClassifier, Outcome};
    let classifier = |head: &http::request::Parts, outcome: Outcome<'_>| match outcome {
        Outcome::Response { status, .. } if status == StatusCode::CONFLICT => {
            Classification::Retry(RetryReason::Custom("conflict"))
        }
        Outcome::Response { status, .. } if status == StatusCode::SERVICE_UNAVAILABLE => {
            Classification::Done
        }
        _ => DefaultClassifier.classify(head, outcome),
    };
    let layer = RetryLayer::new().policy(
        RetryPolicy::default()
            .classifier(classifier)
            .backoff(Backoff::default().jitter(Jitter::None)),
    );
    let mock = Mock::statuses(&[409, 503, 200]);
    let response = layer
        .layer(mock.clone())
        .oneshot(get("http://h/"))
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(mock.calls(), 2);
    assert_eq!(
        info(&response).retries()[0].reason,
        RetryReason::Custom("conflict")
    );
}

#[tokio::test(start_paused = true)]
async fn the_attempt_header_numbers_each_attempt() {
    let mock = Mock::statuses(&[503, 503]);
    let layer = fixed(3).attempt_header(http::HeaderName::from_static("retry-attempt"));
    layer
        .layer(mock.clone())
        .oneshot(get("http://h/"))
        .await
        .unwrap();
    let numbers: Vec<_> = mock
        .seen()
        .iter()
        .map(|s| s.headers["retry-attempt"].clone())
        .collect();
    assert_eq!(numbers, ["1", "2", "3"]);
}

/// The header fields of one request, in order, repeated names included.
/// Appends one mark per attempt, and a header only the first attempt should carry.
struct Mark;

impl tower_http_retry::AttemptHook for Mark {
    fn before_attempt(&self, attempt: &tower_http_retry::Attempt, headers: &mut http::HeaderMap) {
        headers.append("x-mark", http::HeaderValue::from(attempt.number));
        if attempt.kind == tower_http_retry::AttemptKind::First {
            headers.insert("x-first-only", http::HeaderValue::from_static("yes"));
        }
    }
}

#[tokio::test(start_paused = true)]
async fn every_attempt_gets_its_hooks_on_the_callers_head() {
    let mock = Mock::statuses(&[503, 503, 200]);
    let layer = RetryLayer::new().policy(
        RetryPolicy::default()
            .backoff(Backoff::exponential(100 * MS, 10_000 * MS).jitter(Jitter::None))
            .on_attempt(Mark),
    );
    let response = layer
        .layer(mock.clone())
        .oneshot(get("http://h/x"))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let seen = mock.seen();
    for (n, attempt) in seen.iter().enumerate() {
        // What the hook wrote on an earlier attempt is not carried into a later one.
        let marks: Vec<_> = attempt.headers.get_all("x-mark").iter().collect();
        assert_eq!(marks, [(n + 1).to_string().as_str()], "attempt {}", n + 1);
        assert_eq!(
            attempt.headers.contains_key("x-first-only"),
            n == 0,
            "attempt {}",
            n + 1
        );
    }
    assert_eq!(seen.len(), 3);
}

fn fields(headers: &http::HeaderMap) -> Vec<(String, String, bool)> {
    headers
        .iter()
        .map(|(name, value)| {
            (
                name.to_string(),
                value.to_str().unwrap().to_owned(),
                value.is_sensitive(),
            )
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn every_attempt_carries_the_original_head() {
    let original = || {
        let mut req = request(Method::PUT, "http://h/items/7?v=2", b"{}");
        let headers = req.headers_mut();
        headers.append("x-many", "1".parse().unwrap());
        headers.insert("accept", "application/json".parse().unwrap());
        headers.append("x-many", "2".parse().unwrap());
        let mut secret: http::HeaderValue = "Bearer t".parse().unwrap();
        secret.set_sensitive(true);
        headers.insert("authorization", secret);
        headers.append("x-many", "3".parse().unwrap());
        req
    };
    let expected = fields(original().headers());
    // The default classifier (the head is kept as a list of fields) and a custom one (the
    // head is kept as `Parts`, which the classifier is given).
    let custom = |head: &http::request::Parts, outcome: tower_http_retry::classify::Outcome<'_>| {
        use tower_http_retry::classify::{Classify, DefaultClassifier};
        DefaultClassifier.classify(head, outcome)
    };
    let layers = [
        fixed(3),
        RetryLayer::new().policy(
            RetryPolicy::default()
                .classifier(custom)
                .backoff(Backoff::exponential(100 * MS, 10_000 * MS).jitter(Jitter::None)),
        ),
    ];
    for layer in layers {
        let mock = Mock::statuses(&[503, 502]);
        let response = layer.layer(mock.clone()).oneshot(original()).await.unwrap();
        assert_eq!(response.status(), 200);
        let seen = mock.seen();
        assert_eq!(seen.len(), 3);
        for attempt in &seen {
            assert_eq!(attempt.method, Method::PUT);
            assert_eq!(fields(&attempt.headers), expected);
            assert_eq!(attempt.body, Bytes::from_static(b"{}"));
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_custom_classifier_sees_the_request_head() {
    use tower_http_retry::classify::{Classification, Outcome};
    // Retries a 409 only for requests that say a conflict is worth retrying.
    let classifier = |head: &http::request::Parts, outcome: Outcome<'_>| match outcome {
        Outcome::Response { status, .. }
            if status == StatusCode::CONFLICT
                && head.uri.path() == "/cart"
                && head.headers.contains_key("x-retry-conflict") =>
        {
            Classification::Retry(RetryReason::Custom("conflict"))
        }
        _ => Classification::Done,
    };
    let layer = || {
        RetryLayer::new().policy(
            RetryPolicy::default()
                .classifier(classifier)
                .backoff(Backoff::exponential(MS, MS).jitter(Jitter::None)),
        )
    };
    let mut asks = get("http://h/cart");
    asks.headers_mut()
        .insert("x-retry-conflict", "1".parse().unwrap());
    let mock = Mock::statuses(&[409]);
    let response = layer().layer(mock.clone()).oneshot(asks).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(mock.calls(), 2);

    let mock = Mock::statuses(&[409]);
    let response = layer()
        .layer(mock.clone())
        .oneshot(get("http://h/cart"))
        .await
        .unwrap();
    assert_eq!(response.status(), 409);
    assert_eq!(mock.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_key_the_caller_set_on_an_idempotent_request_is_reported() {
    // Keys are stamped on non-idempotent methods only; a GET's own key is still the key
    // every attempt carried.
    let mut req = get("http://h/report");
    req.headers_mut()
        .insert("accept", "text/plain".parse().unwrap());
    req.headers_mut()
        .insert("idempotency-key", "caller-get-key".parse().unwrap());
    let mock = Mock::statuses(&[503]);
    let response = fixed(3).layer(mock.clone()).oneshot(req).await.unwrap();
    assert_eq!(info(&response).idempotency_key().unwrap(), "caller-get-key");
    assert_eq!(mock.seen()[1].headers["idempotency-key"], "caller-get-key");

    let mock = Mock::statuses(&[]);
    let response = fixed(3)
        .layer(mock.clone())
        .oneshot(get("http://h/report"))
        .await
        .unwrap();
    assert_eq!(info(&response).idempotency_key(), None);
}

#[tokio::test(start_paused = true)]
async fn a_seeded_policy_repeats_its_waits_and_draws_anew_for_each_retry() {
    async fn waits() -> Vec<Duration> {
        let layer = RetryLayer::new().policy(RetryPolicy::default().max_attempts(4).rng_seed(42));
        let mock = Mock::statuses(&[503, 503, 503]);
        let response = layer.layer(mock).oneshot(get("http://h/")).await.unwrap();
        info(&response).retries().iter().map(|r| r.wait).collect()
    }
    let first = waits().await;
    assert_eq!(first.len(), 3);
    assert_eq!(first, waits().await, "the same seed gives the same waits");
    // Full jitter: each wait is a fraction of its ceiling (200, 400, 800 ms). A generator
    // made anew for each retry would draw the same fraction every time.
    let fractions: Vec<f64> = first
        .iter()
        .enumerate()
        .map(|(n, wait)| wait.as_secs_f64() / (0.2 * f64::from(1u32 << n)))
        .collect();
    assert!(
        fractions
            .windows(2)
            .all(|pair| (pair[0] - pair[1]).abs() > 1e-6),
        "{fractions:?}"
    );
}

/// What the caller got is the inner service's own io error, of `kind`, after one call.
fn returned_at_once(err: &tower::BoxError, mock: &Mock, kind: io::ErrorKind) {
    let io = common::last(err).downcast_ref::<io::Error>();
    assert_eq!(io.map(io::Error::kind), Some(kind), "{err}");
    assert_eq!(mock.calls(), 1);
}
