//! `RetryLayer::grpc()`: gRPC's A6 retry rules over a tonic `Channel` against a real
//! tonic server on 127.0.0.1 (tests/grpc/common/grpc.rs).
#![allow(clippy::disallowed_methods)] // measures real waits with std's clock

use crate::common;

use std::error::Error as _;
use std::time::{Duration, Instant};

use http::HeaderName;
use tonic::Code;
use tonic::transport::Channel;
use tower::{ServiceBuilder, ServiceExt};
use tower_http_retry::classify::RetryReason;
use tower_http_retry::hints::HintSource;
use tower_http_retry::{
    AttemptKind, Backoff, Gate as _, Jitter, RetryError, RetryInfo, RetryLayer, RetryPolicy,
    StopReason, Throttle,
};
use tower_http_retry_grpc::{self as grpc};
use tower_http_retry_grpc::{GrpcLayerExt, GrpcPolicyExt};

use common::grpc::{
    COLLECT, ECHO, GrpcServer, OTHER_UNARY, Step, UNARY, collect, quick, stack, unary,
    unary_request,
};
use common::transport::{H2Action, Server, h2_server, on_every_runtime, repeat};

#[tokio::test]
async fn unavailable_then_ok_with_a6_headers_and_no_keys() {
    let server = GrpcServer::start([
        Step::Fail(Code::Unavailable),
        Step::Fail(Code::Unavailable),
        Step::Ok,
    ])
    .await;
    let layer = RetryLayer::grpc().policy(quick().deadline(Duration::from_secs(20)));
    let reply = unary(stack(server.channel().await, layer), UNARY, b"hello")
        .await
        .unwrap();
    assert_eq!(&reply.get_ref()[..], b"hello");
    let info = reply.extensions().get::<RetryInfo>().unwrap();
    assert_eq!(info.attempts(), 3);
    assert!(
        info.retries()
            .iter()
            .all(|r| r.reason == grpc::reason(Code::Unavailable))
    );
    assert!(info.idempotency_key().is_none());
    let seen = server.seen();
    assert_eq!(seen.len(), 3);
    let previous: Vec<_> = seen
        .iter()
        .map(|s| {
            s.headers
                .get("grpc-previous-rpc-attempts")
                .map(|v| v.to_str().unwrap().to_string())
        })
        .collect();
    assert_eq!(previous, [None, Some("1".into()), Some("2".into())]);
    for call in &seen {
        assert!(!call.headers.contains_key("idempotency-key"));
        // The time left, rewritten on each attempt: under the 20 s deadline.
        let timeout = call.headers.get("grpc-timeout").expect("grpc-timeout sent");
        let left = common::grpc::grpc_timeout(timeout.to_str().unwrap());
        assert!(
            left <= Duration::from_secs(20) && left > Duration::from_secs(19),
            "{left:?}"
        );
    }
}

#[tokio::test]
async fn codes_the_policy_does_not_list_are_returned_at_once() {
    for (first, code) in [
        // A code the policy does not list.
        (Step::Fail(Code::PermissionDenied), Code::PermissionDenied),
        // A committed RPC (ordinary headers first, the error in the trailers), though its
        // code is listed.
        (Step::AfterHeaders(Code::Unavailable), Code::Unavailable),
    ] {
        let server = GrpcServer::start([first, Step::Ok]).await;
        let status = unary(
            stack(server.channel().await, RetryLayer::grpc().policy(quick())),
            UNARY,
            b"x",
        )
        .await
        .unwrap_err();
        assert_eq!(status.code(), code);
        assert_eq!(server.seen().len(), 1, "{code:?}: sent again");
    }
}

#[tokio::test]
async fn pushback_is_the_exact_wait_and_a_negative_one_stops() {
    // 300 ms pushback with a 1 ms backoff: the wait is the pushback, exactly.
    let server = GrpcServer::start([Step::Pushback(Code::Unavailable, "300"), Step::Ok]).await;
    let start = Instant::now();
    let reply = unary(
        stack(server.channel().await, RetryLayer::grpc().policy(quick())),
        UNARY,
        b"x",
    )
    .await
    .unwrap();
    assert!(start.elapsed() >= Duration::from_millis(300));
    let info = reply.extensions().get::<RetryInfo>().unwrap();
    assert_eq!(info.retries()[0].wait, Duration::from_millis(300));
    assert_eq!(
        info.retries()[0].hint,
        Some(HintSource::Header("grpc-retry-pushback-ms"))
    );

    // A pushback shorter than the backoff still sets the wait: it is exact, not a floor.
    let slow_backoff = quick().backoff(
        Backoff::exponential(Duration::from_secs(5), Duration::from_secs(5)).jitter(Jitter::None),
    );
    let server = GrpcServer::start([Step::Pushback(Code::Unavailable, "20"), Step::Ok]).await;
    let start = Instant::now();
    let reply = unary(
        stack(
            server.channel().await,
            RetryLayer::grpc().policy(slow_backoff),
        ),
        UNARY,
        b"x",
    )
    .await
    .unwrap();
    assert!(start.elapsed() < Duration::from_secs(4));
    assert_eq!(
        reply.extensions().get::<RetryInfo>().unwrap().retries()[0].wait,
        Duration::from_millis(20)
    );

    for value in ["-1", "soon"] {
        let server = GrpcServer::start([Step::Pushback(Code::Unavailable, value), Step::Ok]).await;
        let status = unary(
            stack(server.channel().await, RetryLayer::grpc().policy(quick())),
            UNARY,
            b"x",
        )
        .await
        .unwrap_err();
        assert_eq!(status.code(), Code::Unavailable, "{value}");
        assert_eq!(
            server.seen().len(),
            1,
            "{value}: no retry after a stopping pushback"
        );
    }
}

/// A pushback that says stop counts as a failure for the throttle whatever the code (A6
/// counts "a pushback response indicating not to retry"; grpc-go reads the pushback before
/// the code). C-core returns a code it does not retry before it looks, so it takes no
/// token: here A6 and grpc-go are followed.
#[tokio::test]
async fn a_pushback_that_says_stop_takes_a_token_whatever_the_code() {
    let fresh = || {
        Throttle::builder()
            .max_tokens(10.0)
            .token_ratio(0.1)
            .build()
    };
    for (step, tokens) in [
        (Step::Pushback(Code::InvalidArgument, "-1"), 9.0),
        (Step::Pushback(Code::InvalidArgument, "later"), 9.0),
        (Step::Pushback(Code::Unavailable, "-1"), 9.0),
        // A code not listed, without a stop: neither a success nor a failure.
        (Step::Pushback(Code::InvalidArgument, "5"), 10.0),
        (Step::Fail(Code::InvalidArgument), 10.0),
    ] {
        let server = GrpcServer::start([step.clone(), Step::Ok]).await;
        let throttle = fresh();
        let layer = RetryLayer::grpc().policy(quick().gate(throttle.clone()));
        let status = unary(stack(server.channel().await, layer), UNARY, b"x")
            .await
            .unwrap_err();
        assert_eq!(server.seen().len(), 1, "{step:?}");
        assert_eq!(throttle.tokens(), tokens, "{step:?}");
        let expected = match step {
            Step::Pushback(code, _) | Step::Fail(code) => code,
            _ => unreachable!(),
        };
        assert_eq!(status.code(), expected, "{step:?}");
    }
}

/// A pushback is the wait itself, bounded only by the RPC's deadline: one longer than the
/// policy's `max_retry_after` (30 s by default, a floor's bound for HTTP's `Retry-After`)
/// is waited out.
#[tokio::test(start_paused = true)]
async fn a_pushback_longer_than_max_retry_after_is_waited_out() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let server = tower::service_fn(
        move |_: http::Request<tower_http_retry::ReplayBody<String>>| {
            let n = counted.fetch_add(1, Ordering::SeqCst);
            async move {
                let mut response = http::Response::new(String::new());
                if n == 0 {
                    let headers = response.headers_mut();
                    headers.insert("grpc-status", http::HeaderValue::from_static("14"));
                    headers.insert(
                        "grpc-retry-pushback-ms",
                        http::HeaderValue::from_static("45000"),
                    );
                }
                Ok::<_, std::convert::Infallible>(response)
            }
        },
    );
    let policy = quick().deadline(Duration::from_secs(120));
    // The policy sets no `max_retry_after`: the crate's 30 s applies.
    assert!(
        !format!("{policy:?}").contains("max_retry_after"),
        "{policy:?}"
    );
    let client = tower::Layer::layer(&RetryLayer::grpc().policy(policy), server);
    let request = http::Request::post("http://127.0.0.1/test.Raw/Unary")
        .body(String::new())
        .unwrap();
    let start = tokio::time::Instant::now();
    let response = client.oneshot(request).await.unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert_eq!(start.elapsed(), Duration::from_secs(45));
    let info = response.extensions().get::<RetryInfo>().unwrap();
    assert_eq!(info.stop(), StopReason::Final);
    assert_eq!(info.retries()[0].wait, Duration::from_secs(45));

    // The same 45 s as HTTP's `Retry-After`, a floor, is above that 30 s: no retry.
    let server = tower::service_fn(
        |_: http::Request<tower_http_retry::ReplayBody<String>>| async {
            let response = http::Response::builder()
                .header("grpc-status", "14")
                .header("retry-after", "45")
                .body(String::new())
                .unwrap();
            Ok::<_, std::convert::Infallible>(response)
        },
    );
    let policy = quick().deadline(Duration::from_secs(120));
    let client = tower::Layer::layer(&RetryLayer::grpc().policy(policy), server);
    let request = http::Request::post("http://127.0.0.1/test.Raw/Unary")
        .body(String::new())
        .unwrap();
    let response = client.oneshot(request).await.unwrap();
    let info = response.extensions().get::<RetryInfo>().unwrap();
    assert_eq!(info.attempts(), 1, "{info:?}");
}

/// `grpc-previous-rpc-attempts` is absent on the first attempt, even when the caller set
/// one (A6), and the layer's own on the retries.
#[tokio::test]
async fn a_callers_stray_previous_attempts_never_reaches_the_server() {
    let server = GrpcServer::start([Step::Fail(Code::Unavailable), Step::Ok]).await;
    let mut request = tonic::Request::new(bytes::Bytes::from_static(b"x"));
    request
        .metadata_mut()
        .insert("grpc-previous-rpc-attempts", "7".parse().unwrap());
    let client = stack(server.channel().await, RetryLayer::grpc().policy(quick()));
    unary_request(client, UNARY, request).await.unwrap();
    let seen: Vec<_> = server
        .seen()
        .iter()
        .map(|s| {
            s.headers
                .get("grpc-previous-rpc-attempts")
                .map(|v| v.to_str().unwrap().to_string())
        })
        .collect();
    assert_eq!(seen, [None, Some("1".to_string())]);
}

#[tokio::test]
async fn the_throttle_engages_under_a_total_outage() {
    // A6's example: maxTokens 10, tokenRatio 0.1. Each failed attempt takes a token;
    // retries stop once the bucket is at half (5) or below.
    let throttle = Throttle::builder()
        .max_tokens(10.0)
        .token_ratio(0.1)
        .build();
    let server = GrpcServer::start((0..100).map(|_| Step::Fail(Code::Unavailable))).await;
    let layer = RetryLayer::grpc().policy(quick().gate(throttle.clone()));
    let mut stops = Vec::new();
    for _ in 0..5 {
        let client = stack(server.channel().await, layer.clone());
        let status = unary(client, UNARY, b"x").await.unwrap_err();
        assert_eq!(status.code(), Code::Unavailable);
        stops.push(server.seen().len());
    }
    // 10 -> 5 tokens takes five failed attempts; after that every call is sent once.
    assert_eq!(
        stops[0], 4,
        "the first call still has its retries: {stops:?}"
    );
    let after: Vec<_> = stops.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(
        after.iter().all(|&n| n == 1),
        "one attempt per call once throttled: {stops:?}"
    );
    // No retry allowed: half of the 10 tokens, or fewer, are left.
    assert!(throttle.tokens() <= 5.0, "{throttle:?}");
}

#[tokio::test]
async fn the_throttle_refused_retry_is_reported() {
    let throttle = Throttle::builder().max_tokens(2.0).token_ratio(0.1).build();
    let server = GrpcServer::start((0..10).map(|_| Step::Fail(Code::Unavailable))).await;
    let layer = RetryLayer::grpc().policy(quick().gate(throttle));
    let client = ServiceBuilder::new()
        .layer(layer)
        .layer(grpc::tonic_body_layer())
        .service(server.channel().await);
    // Below the status layer the http response is there to read: the record says why.
    let request = http::Request::post(format!("{}{}", server.uri(), UNARY))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(http_body_util::Full::new(common::grpc::frame(b"x")))
        .unwrap();
    let response = tower::ServiceExt::oneshot(client, request).await.unwrap();
    let info = response.extensions().get::<RetryInfo>().unwrap();
    assert_eq!(info.stop(), StopReason::Throttled);
    assert_eq!(info.attempts(), 1, "2 -> 1 token is already at half");
}

#[tokio::test]
async fn a_client_streaming_call_is_replayed_under_grpc_rules() {
    let server = GrpcServer::start([Step::Fail(Code::Unavailable), Step::Ok]).await;
    let reply = collect(
        stack(server.channel().await, RetryLayer::grpc().policy(quick())),
        &[b"a,", b"b,", b"c"],
    )
    .await
    .unwrap();
    assert_eq!(&reply.get_ref()[..], b"a,b,c");
    let seen = server.seen();
    assert_eq!(seen.len(), 2);
    assert!(
        seen.iter()
            .all(|s| &s.body[..] == b"a,b,c" && s.path == COLLECT)
    );
}

#[tokio::test]
async fn the_deadline_reaches_the_caller_as_deadline_exceeded() {
    let slow = || Step::Slow(Duration::from_secs(30), Box::new(Step::Ok));
    let server = GrpcServer::start([slow(), slow()]).await;
    let layer = RetryLayer::grpc().policy(quick().deadline(Duration::from_millis(200)));
    let status = unary(stack(server.channel().await, layer), UNARY, b"x")
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
}

// ---- A6's transparent retry, against an h2-crate server that refuses streams ----

/// A tonic `Channel` to an h2-crate server.
async fn h2_channel(server: &Server) -> Channel {
    tonic::transport::Endpoint::from_shared(server.url(""))
        .unwrap()
        .connect()
        .await
        .expect("connect to the h2 server")
}

/// An h2 server refusing the first `refusals` streams, then answering gRPC echoes.
async fn refusing(refusals: usize) -> Server {
    h2_server(move |index| match index < refusals {
        true => H2Action::Refuse,
        false => H2Action::GrpcEcho,
    })
    .await
}

/// Tells `throttle` of one failure, the way a throttle hears one: a call under a
/// one-attempt gRPC policy that has it, answered Trailers-Only UNAVAILABLE. The path alone,
/// as tonic's clients send it: the count of requests without an authority.
async fn fail_once_under(throttle: &Throttle) {
    use tower::Layer;
    let layer =
        RetryLayer::grpc().policy(RetryPolicy::new().max_attempts(1).gate(throttle.clone()));
    let unavailable = tower::service_fn(
        |_: http::Request<tower_http_retry::ReplayBody<String>>| async {
            let response = http::Response::builder()
                .header("grpc-status", "14")
                .body(())
                .unwrap();
            Ok::<_, std::convert::Infallible>(response)
        },
    );
    let request = http::Request::post(UNARY).body(String::new()).unwrap();
    let response = layer.layer(unavailable).oneshot(request).await.unwrap();
    assert_eq!(response.headers()["grpc-status"], "14");
}

/// A throttle of 10 tokens that is 2 down, earning 0.5 per success: any failure it is told
/// of shows in its count.
async fn drained_throttle() -> Throttle {
    let throttle = Throttle::builder()
        .max_tokens(10.0)
        .token_ratio(0.5)
        .build();
    fail_once_under(&throttle).await;
    fail_once_under(&throttle).await;
    assert_eq!(throttle.tokens(), 8.0);
    throttle
}

fn a6_layer(throttle: &Throttle, attempts: u32) -> RetryLayer {
    RetryLayer::grpc()
        .attempt_header(HeaderName::from_static("x-attempt"))
        .policy(quick().max_attempts(attempts).gate(throttle.clone()))
}

fn header<'a>(applied: &'a common::transport::Applied, name: &str) -> Option<&'a str> {
    applied.headers.get(name).map(|v| v.to_str().unwrap())
}

/// With `max_attempts(1)` the RPC still succeeds after a refused stream: the stream is
/// sent again at once, not counted as an attempt in `grpc-previous-rpc-attempts` (absent
/// on the retry, as on a first attempt) nor by the throttle (only the success shows).
#[test]
fn a_refused_stream_is_sent_again_at_once_outside_the_attempt_count() {
    on_every_runtime(Duration::from_secs(60), |mode| {
        repeat(mode, 25, |_| async {
            let server = refusing(1).await;
            let throttle = drained_throttle().await;
            let client = stack(h2_channel(&server).await, a6_layer(&throttle, 1));
            let reply = unary(client, UNARY, b"hello").await.unwrap();
            assert_eq!(&reply.get_ref()[..], b"hello");

            let info = reply.extensions().get::<RetryInfo>().unwrap();
            assert_eq!((info.attempts(), info.stop()), (2, StopReason::Final));
            assert_eq!(info.retries().len(), 1);
            let retry = info.retries()[0];
            assert_eq!(retry.kind, AttemptKind::Transparent);
            assert_eq!(retry.reason, RetryReason::RefusedStream);
            assert_eq!(retry.wait, Duration::ZERO);
            assert_eq!(info.total_wait(), Duration::ZERO);

            assert_eq!(server.log.seen(), 2);
            let applied = server.log.applied();
            assert_eq!(applied.len(), 1, "the refused stream was not processed");
            assert_eq!(header(&applied[0], "grpc-previous-rpc-attempts"), None);
            assert_eq!(header(&applied[0], "x-attempt"), Some("2"));
            // 8 + 0.5 for the success; a failure counted would have left 7.5.
            assert_eq!(throttle.tokens(), 8.5);
        })
    });
}

/// Only one transparent retry per RPC: a second refusal goes by the normal rules. With
/// `max_attempts(1)` that ends the RPC (UNAVAILABLE, the record in the status's source);
/// with 2 it is an ordinary retry, after a backoff, counted by the throttle and in
/// `grpc-previous-rpc-attempts`.
#[test]
fn a_second_refusal_is_judged_by_the_normal_rules() {
    on_every_runtime(Duration::from_secs(60), |mode| {
        repeat(mode, 25, |_| async {
            let server = refusing(2).await;
            let throttle = drained_throttle().await;
            let client = stack(h2_channel(&server).await, a6_layer(&throttle, 1));
            let status = unary(client, UNARY, b"x").await.unwrap_err();
            assert_eq!(status.code(), Code::Unavailable, "{status:?}");
            let error = status.source().and_then(|e| e.downcast_ref::<RetryError>());
            let info = error.expect("the layer's error is the source").info();
            assert_eq!((info.attempts(), info.stop()), (2, StopReason::MaxAttempts));
            assert_eq!(info.retries().len(), 1);
            assert_eq!(info.retries()[0].kind, AttemptKind::Transparent);
            assert_eq!((server.log.seen(), server.log.applied().len()), (2, 0));
            // The second refusal is a failure of a retryable kind: one token.
            assert_eq!(throttle.tokens(), 7.0);

            let server = refusing(2).await;
            let throttle = drained_throttle().await;
            let client = stack(h2_channel(&server).await, a6_layer(&throttle, 2));
            let reply = unary(client, UNARY, b"y").await.unwrap();
            assert_eq!(&reply.get_ref()[..], b"y");
            let info = reply.extensions().get::<RetryInfo>().unwrap();
            assert_eq!((info.attempts(), info.stop()), (3, StopReason::Final));
            let kinds: Vec<_> = info
                .retries()
                .iter()
                .map(|r| (r.reason, r.kind == AttemptKind::Transparent))
                .collect();
            assert_eq!(
                kinds,
                [
                    (RetryReason::RefusedStream, true),
                    (RetryReason::RefusedStream, false)
                ]
            );
            // `quick()`'s backoff, without jitter: the first retry's ceiling, 2 ms.
            assert_eq!(info.retries()[1].wait, Duration::from_millis(2));
            let applied = server.log.applied();
            assert_eq!(applied.len(), 1);
            assert_eq!(header(&applied[0], "grpc-previous-rpc-attempts"), Some("1"));
            assert_eq!(header(&applied[0], "x-attempt"), Some("3"));
            assert_eq!(throttle.tokens(), 7.5, "one failure, one success");
        })
    });
}

/// A connection refused (nothing listens) is gRPC's UNAVAILABLE, handed to the retry
/// policy as C-core and grpc-go hand it a failed pick: counted against `max_attempts` and
/// by the throttle, retried only when the method lists UNAVAILABLE. (A refused connection
/// proves the server never saw the request, but it says the server is down: no transparent
/// retry.)
#[test]
fn a_refused_connection_is_unavailable_for_the_retry_policy() {
    on_every_runtime(Duration::from_secs(60), |mode| {
        repeat(mode, 10, |_| async {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap();
            drop(listener);
            let channel = || {
                tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
                    .unwrap()
                    .connect_lazy()
            };
            let failed = |status: &tonic::Status| {
                let error = status.source().and_then(|e| e.downcast_ref::<RetryError>());
                error
                    .expect("the layer's error is the source")
                    .info()
                    .clone()
            };
            // Listed, one attempt: nothing more.
            let throttle = drained_throttle().await;
            let status = unary(stack(channel(), a6_layer(&throttle, 1)), UNARY, b"x")
                .await
                .unwrap_err();
            assert_eq!(status.code(), Code::Unavailable, "{status:?}");
            let info = failed(&status);
            assert_eq!((info.attempts(), info.stop()), (1, StopReason::MaxAttempts));
            assert_eq!(throttle.tokens(), 7.0, "counted");
            // Listed, two attempts: one counted retry, with its backoff.
            let throttle = drained_throttle().await;
            let status = unary(stack(channel(), a6_layer(&throttle, 2)), UNARY, b"x")
                .await
                .unwrap_err();
            let info = failed(&status);
            assert_eq!((info.attempts(), info.stop()), (2, StopReason::MaxAttempts));
            assert_eq!(info.retries()[0].reason, RetryReason::Connect);
            assert_eq!(info.retries()[0].kind, AttemptKind::Retry);
            assert_eq!(info.retries()[0].wait, Duration::from_millis(2));
            assert_eq!(throttle.tokens(), 6.0, "both refusals counted");
            // Not listed: final at once, and not a failure the throttle counts.
            let throttle = drained_throttle().await;
            let layer = RetryLayer::grpc().policy(
                quick()
                    .grpc_codes([Code::ResourceExhausted])
                    .gate(throttle.clone()),
            );
            let status = unary(stack(channel(), layer), UNARY, b"x")
                .await
                .unwrap_err();
            assert_eq!(status.code(), Code::Unavailable, "{status:?}");
            let info = failed(&status);
            assert_eq!((info.attempts(), info.stop()), (1, StopReason::Final));
            assert_eq!(throttle.tokens(), 8.0);
        })
    });
}

/// A transport failure under a gRPC policy has the code gRPC's clients give it, and is
/// retried only when the method lists that code (the listed codes are the service owner's
/// only word that the method may be repeated): a dropped connection is UNAVAILABLE, a
/// stream the server reset by its HTTP/2 code (INTERNAL_ERROR is INTERNAL, CANCEL
/// CANCELLED, ENHANCE_YOUR_CALM RESOURCE_EXHAUSTED).
#[test]
fn a_transport_failure_is_retried_only_when_its_code_is_listed() {
    use common::transport::Applied;

    fn layer(throttle: &Throttle, codes: &[Code]) -> RetryLayer {
        RetryLayer::grpc().policy(
            quick()
                .grpc_codes(codes.iter().copied())
                .gate(throttle.clone()),
        )
    }
    /// Two failures, then answers: a dropped connection (`None`) or a reset stream.
    async fn call(
        reset: Option<h2::Reason>,
        codes: &[Code],
    ) -> (Result<Code, RetryInfo>, Vec<Applied>, f64) {
        let server = h2_server(move |index| match (index < 2, reset) {
            (true, None) => H2Action::ApplyThenDrop,
            (true, Some(reason)) => H2Action::ResetAfterFirstChunk(reason),
            (false, _) => H2Action::GrpcEcho,
        })
        .await;
        let throttle = drained_throttle().await;
        let client = stack(h2_channel(&server).await, layer(&throttle, codes));
        let result = match unary(client, UNARY, b"x").await {
            Ok(reply) => Err(reply.extensions().get::<RetryInfo>().unwrap().clone()),
            Err(status) => Ok(status.code()),
        };
        (result, server.log.applied(), throttle.tokens())
    }

    on_every_runtime(Duration::from_secs(60), |mode| {
        repeat(mode, 5, |_| async {
            // Two dropped connections, then success, for a method that retries only
            // RESOURCE_EXHAUSTED: one attempt, the caller gets UNAVAILABLE.
            let (result, applied, tokens) = call(None, &[Code::ResourceExhausted]).await;
            assert_eq!(result.unwrap(), Code::Unavailable);
            assert_eq!(applied.len(), 1, "sent once");
            assert_eq!(tokens, 8.0, "a code not listed counts neither way");
            // The same with UNAVAILABLE listed: retried twice, then the answer.
            let (result, applied, tokens) = call(None, &[Code::Unavailable]).await;
            let info = result.unwrap_err();
            assert_eq!(info.attempts(), 3);
            let reasons: Vec<_> = info.retries().iter().map(|r| r.reason).collect();
            assert_eq!(reasons, [RetryReason::ConnectionClosed; 2]);
            assert_eq!(applied.len(), 3);
            assert_eq!(tokens, 6.5, "two failures, one success");

            for (reason, code) in [
                (h2::Reason::INTERNAL_ERROR, Code::Internal),
                (h2::Reason::CANCEL, Code::Cancelled),
                (h2::Reason::ENHANCE_YOUR_CALM, Code::ResourceExhausted),
            ] {
                let reset = || Some(reason);
                // UNAVAILABLE is not the code of a reset stream.
                let (result, _, tokens) = call(reset(), &[Code::Unavailable]).await;
                assert_eq!(result.unwrap(), code, "{reason:?}");
                assert_eq!(tokens, 8.0, "{reason:?}");
                // Its own code is.
                let (result, _, tokens) = call(reset(), &[code]).await;
                let info = result.unwrap_err();
                assert_eq!(info.attempts(), 3, "{reason:?}");
                assert_eq!(info.retries()[0].reason, grpc::reason(code), "{reason:?}");
                assert_eq!(tokens, 6.5, "{reason:?}");
            }
        })
    });
}

/// Only the first refusal is transparent; a second one is UNAVAILABLE for the retry
/// policy, final when the method does not list it.
#[test]
fn a_second_refusal_is_final_when_unavailable_is_not_listed() {
    on_every_runtime(Duration::from_secs(60), |mode| {
        repeat(mode, 10, |_| async {
            let server = refusing(2).await;
            let throttle = drained_throttle().await;
            let layer = RetryLayer::grpc().policy(
                quick()
                    .grpc_codes([Code::ResourceExhausted])
                    .gate(throttle.clone()),
            );
            let status = unary(stack(h2_channel(&server).await, layer), UNARY, b"x")
                .await
                .unwrap_err();
            assert_eq!(status.code(), Code::Unavailable, "{status:?}");
            let error = status.source().and_then(|e| e.downcast_ref::<RetryError>());
            let info = error.expect("the layer's error is the source").info();
            assert_eq!((info.attempts(), info.stop()), (2, StopReason::Final));
            assert_eq!(info.retries()[0].kind, AttemptKind::Transparent);
            assert_eq!(server.log.seen(), 2);
            assert_eq!(throttle.tokens(), 8.0);
        })
    });
}

/// Plain HTTP policies have no transparent retry (it is A6's rule): a refused stream is
/// retried as any retryable failure, counted against `max_attempts`.
#[test]
fn plain_policies_count_a_refused_stream_as_an_attempt() {
    on_every_runtime(Duration::from_secs(60), |mode| {
        repeat(mode, 10, |_| async {
            let plain = |attempts| {
                RetryLayer::new().policy(quick_plain().max_attempts(attempts).idempotency_key(None))
            };
            let server = refusing(1).await;
            let status = unary(stack(h2_channel(&server).await, plain(1)), UNARY, b"x")
                .await
                .unwrap_err();
            assert_eq!(status.code(), Code::Unavailable);
            assert_eq!(server.log.seen(), 1, "sent once");

            let server = refusing(1).await;
            let reply = unary(stack(h2_channel(&server).await, plain(2)), UNARY, b"x")
                .await
                .unwrap();
            let info = reply.extensions().get::<RetryInfo>().unwrap();
            assert_eq!(info.attempts(), 2);
            assert_ne!(info.retries()[0].kind, AttemptKind::Transparent);
            assert_eq!(info.retries()[0].reason, RetryReason::RefusedStream);
        })
    });
}

fn quick_plain() -> RetryPolicy {
    RetryPolicy::new().backoff(
        Backoff::exponential(Duration::from_millis(1), Duration::from_millis(4))
            .jitter(Jitter::None),
    )
}

/// The throttle hears of a failed attempt once, also when the retry first waits for the
/// transport to let go of the streaming body (the outcome is decided again then).
#[test]
fn a_failure_is_counted_once_when_the_retry_waits_for_the_body() {
    use common::transport::{Proto, Script, Step as Chunk, client};

    on_every_runtime(Duration::from_secs(60), |mode| {
        repeat(mode, 10, |_| async {
            let server = h2_server(|index| match index {
                0 => H2Action::ResetAfterFirstChunk(h2::Reason::CANCEL),
                _ => H2Action::Apply(200),
            })
            .await;
            let throttle = drained_throttle().await;
            let retrying = ServiceBuilder::new()
                .layer(
                    RetryLayer::grpc().policy(
                        quick()
                            .max_attempts(2)
                            .grpc_codes([Code::Cancelled])
                            .gate(throttle.clone()),
                    ),
                )
                .service(client(Proto::H2));
            let steps = [
                Chunk::Data(b"first,"),
                Chunk::Wait(Duration::from_millis(30)),
                Chunk::Data(b"second"),
            ];
            let request = http::Request::post(server.url(UNARY))
                .header("content-type", "application/grpc")
                .body(Script::new(&steps))
                .unwrap();
            let response = retrying.oneshot(request).await.unwrap();
            let info = response.extensions().get::<RetryInfo>().unwrap();
            assert_eq!(info.attempts(), 2);
            assert_eq!(info.retries()[0].reason, grpc::reason(Code::Cancelled));
            assert_eq!(server.log.applied()[0].body, Script::bytes(&steps));
            // 8 - 1 for the reset + 0.5 for the answer (committed: no grpc-status).
            assert_eq!(throttle.tokens(), 7.5);
        })
    });
}

// ---- An answer before the request body was read ----

/// A raw hyper HTTP/2 (h2c) server, not tonic's router (which reads the request message
/// before any handler runs): the first call is answered Trailers-Only UNAVAILABLE (HTTP
/// 200, `content-type: application/grpc`, `grpc-status: 14`, END_STREAM on the headers)
/// without a byte of its body read; every later call is read whole and echoed as a unary
/// reply (a request's message frame is a valid reply), `grpc-status: 0` in the trailers.
mod unread_then_echo {
    use std::convert::Infallible;
    use std::net::SocketAddr;
    use std::sync::{Arc, Mutex};

    use bytes::Bytes;
    use http::{HeaderMap, HeaderValue, Request, Response};
    use http_body::Frame;
    use http_body_util::{BodyExt, Either, Full, StreamBody};
    use hyper::body::Incoming;
    use hyper_util::rt::{TokioExecutor, TokioIo};
    use tokio::net::TcpListener;
    use tokio::task::{JoinHandle, JoinSet};

    /// One call as the server saw it.
    #[derive(Debug, Clone)]
    pub struct Call {
        pub headers: HeaderMap,
        /// The request body, read whole; `None` for the call answered without reading it.
        pub body: Option<Bytes>,
    }

    type Calls = Arc<Mutex<Vec<Call>>>;

    /// Trailers-Only (an empty body that says so, so hyper ends the stream on the
    /// headers), or a reply and its trailers.
    type Reply = Either<
        Full<Bytes>,
        StreamBody<
            futures_util::stream::Iter<std::vec::IntoIter<Result<Frame<Bytes>, Infallible>>>,
        >,
    >;

    /// The running server; its tasks end when it is dropped.
    pub struct Server {
        pub addr: SocketAddr,
        calls: Calls,
        task: JoinHandle<()>,
    }

    impl Drop for Server {
        fn drop(&mut self) {
            self.task.abort();
        }
    }

    impl Server {
        pub async fn start() -> Self {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let calls = Calls::default();
            let record = Arc::clone(&calls);
            let task = tokio::spawn(async move {
                // Dropped with this task, which aborts every connection's.
                let mut connections = JoinSet::new();
                while let Ok((tcp, _)) = listener.accept().await {
                    let record = Arc::clone(&record);
                    let service =
                        hyper::service::service_fn(move |req| answer(req, Arc::clone(&record)));
                    connections.spawn(async move {
                        let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                            .serve_connection(TokioIo::new(tcp), service)
                            .await;
                    });
                }
            });
            Server { addr, calls, task }
        }

        /// Every call so far, in order.
        pub fn calls(&self) -> Vec<Call> {
            self.calls.lock().unwrap().clone()
        }
    }

    async fn answer(req: Request<Incoming>, calls: Calls) -> Result<Response<Reply>, hyper::Error> {
        let (parts, body) = req.into_parts();
        let first = calls.lock().unwrap().is_empty();
        if first {
            calls.lock().unwrap().push(Call {
                headers: parts.headers,
                body: None,
            });
            // Not a byte of it read: dropped as it is.
            drop(body);
            let response = Response::builder()
                .status(200)
                .header("content-type", "application/grpc")
                .header("grpc-status", "14")
                .header("grpc-message", "answered before the request was read")
                .body(Either::Left(Full::new(Bytes::new())))
                .unwrap();
            return Ok(response);
        }
        let received = body.collect().await?.to_bytes();
        calls.lock().unwrap().push(Call {
            headers: parts.headers,
            body: Some(received.clone()),
        });
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", HeaderValue::from_static("0"));
        let frames = vec![Ok(Frame::data(received)), Ok(Frame::trailers(trailers))];
        let response = Response::builder()
            .status(200)
            .header("content-type", "application/grpc")
            .body(Either::Right(StreamBody::new(futures_util::stream::iter(
                frames,
            ))))
            .unwrap();
        Ok(response)
    }
}

/// A Trailers-Only UNAVAILABLE from a server that never read the request (a proxy or a
/// server shedding load answers so) is retried, and the retry carries the whole body: the
/// unary call's one message frame, 5 bytes of header and a 1-byte message, 6 bytes on the
/// wire, which the first answer left unread. (The client has usually sent all 6 bytes by
/// the time the answer comes: the layer finds the first attempt's body unfinished in a few
/// runs in a hundred.)
#[test]
fn an_unavailable_answered_before_the_body_was_read_is_retried_with_the_whole_body() {
    on_every_runtime(Duration::from_secs(60), |mode| {
        repeat(mode, 25, |run| async move {
            let server = unread_then_echo::Server::start().await;
            let channel =
                tonic::transport::Endpoint::from_shared(format!("http://{}", server.addr))
                    .unwrap()
                    .connect()
                    .await
                    .expect("connect to the raw server");
            let layer = RetryLayer::grpc()
                .attempt_header(HeaderName::from_static("x-attempt"))
                .policy(quick());
            let call = unary(stack(channel, layer), UNARY, b"x");
            let reply = tokio::time::timeout(Duration::from_secs(10), call)
                .await
                .unwrap_or_else(|_| panic!("run {run}: no answer within 10 s"))
                .unwrap_or_else(|status| panic!("run {run}: {status:?}"));
            assert_eq!(&reply.get_ref()[..], b"x", "run {run}");
            let info = reply.extensions().get::<RetryInfo>().unwrap();
            assert_eq!(
                (info.attempts(), info.stop()),
                (2, StopReason::Final),
                "run {run}: {info:#}"
            );
            assert_eq!(info.retries()[0].reason, grpc::reason(Code::Unavailable));

            let calls = server.calls();
            assert_eq!(calls.len(), 2, "run {run}: {calls:?}");
            let header = |call: &unread_then_echo::Call, name: &str| {
                call.headers
                    .get(name)
                    .map(|v| v.to_str().unwrap().to_string())
            };
            assert_eq!(calls[0].body, None, "run {run}");
            assert_eq!(header(&calls[0], "grpc-previous-rpc-attempts"), None);
            assert_eq!(header(&calls[0], "x-attempt").as_deref(), Some("1"));
            assert_eq!(
                header(&calls[1], "grpc-previous-rpc-attempts").as_deref(),
                Some("1"),
                "run {run}"
            );
            assert_eq!(header(&calls[1], "x-attempt").as_deref(), Some("2"));
            let whole = common::grpc::frame(b"x");
            assert_eq!(whole.len(), 6);
            assert_eq!(
                calls[1].body.as_ref(),
                Some(&whole),
                "run {run}: the retry's body"
            );
        })
    });
}

// ---- A whole layer from a service config ----

/// Each `methodConfig` entry is its own route and policy: the method's (`Unary`), the
/// service's for its other methods (`Echo`), the default for another service (no
/// retries, the timeout as deadline); one throttle for all of them, the config's own.
#[tokio::test]
async fn a_service_config_gives_each_route_its_policy_and_one_throttle() {
    let config = grpc::service_config(
        r#"{
          "methodConfig": [
            {"name": [{"service": "test.Raw", "method": "Unary"}],
             "retryPolicy": {"maxAttempts": 4, "initialBackoff": "0.001s",
                             "maxBackoff": "0.004s", "backoffMultiplier": 1.5,
                             "retryableStatusCodes": ["UNAVAILABLE"]}},
            {"name": [{"service": "test.Raw"}],
             "retryPolicy": {"maxAttempts": 2, "initialBackoff": "0.001s",
                             "maxBackoff": "0.001s", "backoffMultiplier": 1,
                             "retryableStatusCodes": ["RESOURCE_EXHAUSTED"]}},
            {"name": [{}], "timeout": "7s"}
          ],
          "retryThrottling": {"maxTokens": 10, "tokenRatio": 0.5}
        }"#,
    )
    .unwrap();
    let throttle = config.throttle().unwrap().clone();
    let server = GrpcServer::start([]).await;
    let channel = server.channel().await;
    let client = stack(channel.clone(), RetryLayer::from_service_config(&config));
    let calls = |from: usize| -> Vec<(String, Option<String>)> {
        server.seen()[from..]
            .iter()
            .map(|s| {
                let previous = s.headers.get("grpc-previous-rpc-attempts");
                (s.path.clone(), previous.map(|v| v.to_str().unwrap().into()))
            })
            .collect()
    };

    // The method's entry: 4 attempts for UNAVAILABLE, A6's backoff (1, 1.5, 2.25 ms).
    server.push([
        Step::Fail(Code::Unavailable),
        Step::Fail(Code::Unavailable),
        Step::Fail(Code::Unavailable),
        Step::Ok,
    ]);
    let reply = unary(client.clone(), UNARY, b"a").await.unwrap();
    let info = reply.extensions().get::<RetryInfo>().unwrap();
    assert_eq!(info.attempts(), 4);
    for (retry, ceiling_us) in info.retries().iter().zip([1_000, 1_500, 2_250]) {
        assert!(retry.wait <= Duration::from_micros(ceiling_us), "{info:?}");
    }
    let previous: Vec<_> = calls(0).into_iter().map(|(_, p)| p).collect();
    assert_eq!(
        previous,
        [None, Some("1".into()), Some("2".into()), Some("3".into())]
    );
    assert_eq!(throttle.tokens(), 7.5, "three failures, one success");
    // Its codes are its own: RESOURCE_EXHAUSTED, which the service's entry lists, is final.
    server.push([Step::Fail(Code::ResourceExhausted), Step::Ok]);
    let status = unary(client.clone(), UNARY, b"b").await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert_eq!(calls(4), [(UNARY.to_string(), None)]);
    let _ = unary(client.clone(), UNARY, b"drain the Ok").await.unwrap();
    assert_eq!(throttle.tokens(), 8.0);

    // The service's entry for its other methods: RESOURCE_EXHAUSTED, 2 attempts.
    server.push([
        Step::Fail(Code::ResourceExhausted),
        Step::Ok,
        Step::Fail(Code::ResourceExhausted),
        Step::Fail(Code::ResourceExhausted),
        Step::Fail(Code::Unavailable),
    ]);
    let reply = unary(client.clone(), ECHO, b"c").await.unwrap();
    assert_eq!(reply.extensions().get::<RetryInfo>().unwrap().attempts(), 2);
    let status = unary(client.clone(), ECHO, b"d").await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    let status = unary(client.clone(), ECHO, b"e").await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "not the service's code");
    let echo = calls(6);
    assert_eq!(echo.len(), 5, "{echo:?}");
    assert!(echo.iter().all(|(path, _)| path == ECHO));
    // 8 - 1 + 0.5 - 2; UNAVAILABLE is not retryable here, so it is no failure.
    assert_eq!(throttle.tokens(), 5.5);

    // The default entry: one attempt, gRPC's rules, its timeout as the deadline.
    server.push([Step::Fail(Code::Unavailable), Step::Ok]);
    let status = unary(client.clone(), OTHER_UNARY, b"f").await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    let other = server.seen().pop().unwrap();
    assert_eq!(other.path, OTHER_UNARY);
    assert!(!other.headers.contains_key("idempotency-key"));
    let timeout = other.headers.get("grpc-timeout").expect("the deadline");
    let left = common::grpc::grpc_timeout(timeout.to_str().unwrap());
    assert!(left <= Duration::from_secs(7) && left > Duration::from_secs(6));
    let _ = unary(client.clone(), OTHER_UNARY, b"drain the Ok")
        .await
        .unwrap();

    // One throttle, the config's own handle, for every route and for every layer made
    // from the config: taken to half (5.0) from outside (a failure heard under another
    // layer that has it), a failure on the method's route through a second layer leaves
    // 4.0, and its retry is refused.
    server.push([Step::Fail(Code::Unavailable), Step::Ok]);
    assert_eq!(throttle.tokens(), 6.0);
    fail_once_under(&throttle).await;
    assert_eq!(throttle.tokens(), 5.0);
    let bare = ServiceBuilder::new()
        .layer(RetryLayer::from_service_config(&config))
        .layer(grpc::tonic_body_layer())
        .service(channel);
    // A path alone, as tonic's clients send it (the channel adds the origin below the
    // layer): the count of requests without an authority, the one the calls above drained.
    let request = http::Request::post(UNARY)
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(http_body_util::Full::new(common::grpc::frame(b"g")))
        .unwrap();
    let response = tower::ServiceExt::oneshot(bare.clone(), request)
        .await
        .unwrap();
    let info = response.extensions().get::<RetryInfo>().unwrap();
    assert_eq!((info.attempts(), info.stop()), (1, StopReason::Throttled));
    assert_eq!(throttle.tokens(), 4.0);
    // A6 throttles per server: a request that names its server (a client built with
    // tonic's `with_origin`) has that server's own count, full.
    let named = http::Request::post(format!("{}{}", server.uri(), UNARY))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(http_body_util::Full::new(common::grpc::frame(b"h")))
        .unwrap();
    let response = tower::ServiceExt::oneshot(bare, named).await.unwrap();
    let info = response.extensions().get::<RetryInfo>().unwrap();
    assert_ne!(info.stop(), StopReason::Throttled);
    let own = throttle.partition(&server.uri().parse().unwrap());
    assert!(own.tokens() >= 9.0, "{own:?}");
    assert_eq!(
        throttle.tokens(),
        4.0,
        "untouched by the named server's call"
    );
}

// ---- The caller's own grpc-timeout ----

fn sent_timeout(seen: &common::grpc::Seen) -> Duration {
    let value = seen.headers.get("grpc-timeout").expect("grpc-timeout sent");
    common::grpc::grpc_timeout(value.to_str().unwrap())
}

fn with_timeout(timeout: Duration) -> tonic::Request<bytes::Bytes> {
    let mut request = tonic::Request::new(bytes::Bytes::from_static(b"x"));
    request.set_timeout(timeout);
    request
}

/// gRPC's rule for a method's `timeout`: the caller's own deadline (tonic's
/// `Request::set_timeout`) applies when it is shorter. It is kept on the wire and ends
/// the RPC; a longer one is cut to the method's.
#[tokio::test]
async fn the_callers_shorter_timeout_beats_the_methods() {
    let config = grpc::service_config(
        r#"{"methodConfig": [{"name": [{"service": "test.Raw"}], "timeout": "20s",
            "retryPolicy": {"maxAttempts": 4, "initialBackoff": "0.001s",
                            "maxBackoff": "0.001s", "backoffMultiplier": 1,
                            "retryableStatusCodes": ["UNAVAILABLE"]}}]}"#,
    )
    .unwrap();
    let server = GrpcServer::start([Step::Slow(Duration::from_secs(30), Box::new(Step::Ok))]).await;
    let client = stack(
        server.channel().await,
        RetryLayer::from_service_config(&config),
    );
    let start = Instant::now();
    let status = unary_request(
        client.clone(),
        UNARY,
        with_timeout(Duration::from_millis(200)),
    )
    .await
    .unwrap_err();
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    assert!(sent_timeout(&server.seen()[0]) <= Duration::from_millis(200));

    let reply = unary_request(client, UNARY, with_timeout(Duration::from_secs(60)))
        .await
        .unwrap();
    assert_eq!(&reply.get_ref()[..], b"x");
    let sent = sent_timeout(&server.seen()[1]);
    assert!(
        sent <= Duration::from_secs(20) && sent > Duration::from_secs(19),
        "{sent:?}"
    );
}

/// Without a deadline in the policy, the caller's `grpc-timeout` is the RPC's deadline:
/// each retry is told the time left, not the whole timeout again.
#[tokio::test]
async fn retries_are_told_the_time_left_of_the_callers_timeout() {
    let server = GrpcServer::start([
        Step::Fail(Code::Unavailable),
        Step::Fail(Code::Unavailable),
        Step::Ok,
    ])
    .await;
    let layer = RetryLayer::grpc().policy(
        quick().backoff(
            Backoff::exponential(Duration::from_millis(20), Duration::from_millis(20))
                .jitter(Jitter::None),
        ),
    );
    let reply = unary_request(
        stack(server.channel().await, layer),
        UNARY,
        with_timeout(Duration::from_secs(10)),
    )
    .await
    .unwrap();
    assert_eq!(reply.extensions().get::<RetryInfo>().unwrap().attempts(), 3);
    let sent: Vec<_> = server.seen().iter().map(sent_timeout).collect();
    assert!(sent[0] <= Duration::from_secs(10), "{sent:?}");
    // Each retry waited 20 ms first: the time left shrinks by at least that much.
    assert!(sent[1] + Duration::from_millis(20) <= sent[0], "{sent:?}");
    assert!(sent[2] + Duration::from_millis(20) <= sent[1], "{sent:?}");
}

/// A `GOAWAY` under a call reaches the caller as UNAVAILABLE, the code the retry policy
/// judged it by (a method that retries only RESOURCE_EXHAUSTED does not retry it), not as
/// its HTTP/2 error code (`NO_ERROR` would read as INTERNAL).
#[tokio::test]
async fn a_goaway_reaches_the_caller_as_unavailable() {
    use common::transport::{Proto, Script, client, raw_goaway, status};
    use tower::Layer;

    let server = raw_goaway(5, false, |_, _, _| async { Ok(status(200)) }).await;
    let layer = RetryLayer::grpc().policy(quick().grpc_codes([Code::ResourceExhausted]));
    let retrying = layer.layer(client(Proto::H2));
    let request = http::Request::post(server.url(UNARY))
        .header("content-type", "application/grpc")
        .body(Script::empty())
        .unwrap();
    let error = tower::ServiceExt::oneshot(retrying, request)
        .await
        .unwrap_err();
    let info = error.downcast_ref::<RetryError>().unwrap().info().clone();
    assert_eq!((info.attempts(), info.stop()), (1, StopReason::Final));
    let status = grpc::into_status(error);
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
}

/// Sends a call's first attempt (no `Attempt` extension) to `first` and every later attempt
/// to `later`: two upstreams, so that a hedge can get through while the first is stuck.
#[derive(Clone)]
struct FirstElsewhere<S> {
    first: S,
    later: S,
}

impl<S, B> tower::Service<http::Request<B>> for FirstElsewhere<S>
where
    S: tower::Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        // Channels are always ready to queue a call; the first attempt's stalls inside.
        match self.later.poll_ready(cx) {
            std::task::Poll::Ready(Ok(())) => self.first.poll_ready(cx),
            other => other,
        }
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        match request.extensions().get::<tower_http_retry::Attempt>() {
            None => self.first.call(request),
            Some(_) => self.later.call(request),
        }
    }
}

/// A unary call hedged after 100 ms whose first attempt never starts sending: its channel's
/// connector never connects, so the request, and the body behind it, never move. The hedge
/// goes at its delay all the same, reads the call's body (a stream of unknown length) from
/// the caller, and answers.
async fn a_hedge_goes_while_the_first_attempt_is_stuck_connecting() {
    let server = GrpcServer::start([Step::Ok]).await;
    let never = tower::service_fn(|_: http::Uri| {
        std::future::pending::<Result<hyper_util::rt::TokioIo<tokio::net::TcpStream>, std::io::Error>>(
        )
    });
    let stuck = tonic::transport::Endpoint::from_shared(server.uri())
        .unwrap()
        .connect_with_connector_lazy(never);
    let inner = FirstElsewhere {
        first: grpc::TonicBody::new(stuck),
        later: grpc::TonicBody::new(server.channel().await),
    };
    let policy = RetryPolicy::new()
        .max_attempts(2)
        .grpc_codes([Code::Unavailable])
        .hedge(tower_http_retry::Hedging::after(Duration::from_millis(100)))
        .deadline(Duration::from_secs(5));
    let service = ServiceBuilder::new()
        .layer(grpc::status_layer())
        .layer(RetryLayer::grpc().policy(policy.no_gates()))
        .service(inner);
    let started = Instant::now();
    let reply = unary(service, UNARY, b"hedged")
        .await
        .expect("the hedge answers");
    let took = started.elapsed();
    assert!(took < Duration::from_secs(2), "answered after {took:?}");
    assert_eq!(&reply.get_ref()[..], b"hedged");
    let info = reply.extensions().get::<RetryInfo>().unwrap();
    assert_eq!(
        (
            info.retries()
                .iter()
                .filter(|r| r.kind == tower_http_retry::AttemptKind::Hedge)
                .count(),
            info.returned()
        ),
        (1, Some(2)),
        "{info:?}"
    );
    let seen = server.seen();
    assert_eq!(seen.len(), 1, "only the hedge reached the server");
    assert_eq!(&seen[0].body[..], b"hedged", "the whole message");
    assert_eq!(
        seen[0]
            .headers
            .get("grpc-previous-rpc-attempts")
            .map(|v| v.to_str().unwrap().to_string()),
        Some("1".to_string())
    );
}

#[tokio::test(flavor = "current_thread")]
async fn hedging_a_call_whose_first_attempt_is_stuck_on_a_current_thread_runtime() {
    a_hedge_goes_while_the_first_attempt_is_stuck_connecting().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hedging_a_call_whose_first_attempt_is_stuck_on_a_multi_thread_runtime() {
    for _ in 0..5 {
        a_hedge_goes_while_the_first_attempt_is_stuck_connecting().await;
    }
}
