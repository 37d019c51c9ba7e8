//! `RetryLayer::grpc()`: gRPC's A6 retry rules over a tonic `Channel` against a real
//! tonic server on 127.0.0.1 (tests/common/grpc.rs).
#![cfg(feature = "grpc")]
#![allow(clippy::disallowed_types)] // measures real waits with std's clock

mod common;

use std::time::{Duration, Instant};

use tonic::Code;
use tonic::transport::Channel;
use tower::ServiceBuilder;
use tower_http_retry::grpc::{self, IntoStatus, Throttle, TonicBody};
use tower_http_retry::hints::HintSource;
use tower_http_retry::{
    Backoff, Jitter, Retry, RetryInfo, RetryLayer, RetryPolicy, RetryReason, StopReason,
};

use common::grpc::{COLLECT, GrpcServer, Step, UNARY, collect, unary};

fn quick() -> RetryPolicy {
    RetryPolicy::default()
        .max_attempts(4)
        .backoff(
            Backoff::exponential(Duration::from_millis(1), Duration::from_millis(4))
                .jitter(Jitter::None),
        )
        .grpc_codes([Code::Unavailable])
}

fn stack(channel: Channel, layer: RetryLayer) -> IntoStatus<Retry<TonicBody<Channel>>> {
    ServiceBuilder::new()
        .layer(grpc::status_layer())
        .layer(layer)
        .layer(grpc::tonic_body_layer())
        .service(channel)
}

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
    assert_eq!(info.attempts, 3);
    assert!(
        info.retries
            .iter()
            .all(|r| r.reason == RetryReason::GrpcStatus(Code::Unavailable))
    );
    assert!(info.idempotency_key.is_none());
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
        let left = grpc::parse_grpc_timeout(timeout.as_bytes()).unwrap();
        assert!(
            left <= Duration::from_secs(20) && left > Duration::from_secs(19),
            "{left:?}"
        );
    }
}

#[tokio::test]
async fn codes_the_policy_does_not_list_are_returned_at_once() {
    let server = GrpcServer::start([Step::Fail(Code::PermissionDenied), Step::Ok]).await;
    let status = unary(
        stack(server.channel().await, RetryLayer::grpc().policy(quick())),
        UNARY,
        b"x",
    )
    .await
    .unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied);
    assert_eq!(server.seen().len(), 1);

    // A committed RPC (ordinary headers first, the error in the trailers) is not retried.
    let server = GrpcServer::start([Step::AfterHeaders(Code::Unavailable), Step::Ok]).await;
    let status = unary(
        stack(server.channel().await, RetryLayer::grpc().policy(quick())),
        UNARY,
        b"x",
    )
    .await
    .unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(server.seen().len(), 1);
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
    assert_eq!(info.retries[0].wait, Duration::from_millis(300));
    assert_eq!(info.retries[0].hint, Some(HintSource::GrpcPushback));

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
        reply.extensions().get::<RetryInfo>().unwrap().retries[0].wait,
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

#[tokio::test]
async fn the_throttle_engages_under_a_total_outage() {
    // A6's example: maxTokens 10, tokenRatio 0.1. Each failed attempt takes a token;
    // retries stop once the bucket is at half (5) or below.
    let throttle = Throttle::new(10.0, 0.1);
    let server = GrpcServer::start((0..100).map(|_| Step::Fail(Code::Unavailable))).await;
    let layer = RetryLayer::grpc()
        .throttle(throttle.clone())
        .policy(quick());
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
    assert!(!throttle.allows_retry());
}

#[tokio::test]
async fn the_throttle_refused_retry_is_reported() {
    let throttle = Throttle::new(2.0, 0.1);
    let server = GrpcServer::start((0..10).map(|_| Step::Fail(Code::Unavailable))).await;
    let layer = RetryLayer::grpc().throttle(throttle).policy(quick());
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
    assert_eq!(info.stop, StopReason::Throttled);
    assert_eq!(info.attempts, 1, "2 -> 1 token is already at half");
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
