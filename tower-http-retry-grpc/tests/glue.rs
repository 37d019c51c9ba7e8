//! The gRPC glue against a real tonic server on 127.0.0.1 (tests/grpc/common/grpc.rs): a tonic
//! client over a `Channel`, through `grpc::tonic_body_layer()` under the current retry
//! layer, sees every scripted answer; Trailers-Only answers arrive as response headers;
//! the layer's and the channel's timeouts reach the caller as the right codes.
#![allow(clippy::disallowed_methods)] // tokio's paused clock and sleeps, or real time

use crate::common;

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use tonic::Code;
use tonic::transport::Channel;
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_http_retry::classify::{Classification, Outcome, RetryReason};
use tower_http_retry::{Backoff, Retry, RetryInfo, RetryLayer, RetryPolicy};
use tower_http_retry_grpc::{
    self as grpc, IntoStatus, Pushback, TonicBody, pushback, trailers_only_code,
};

use common::grpc::{COLLECT, GrpcServer, Step, UNARY, collect, frame, unary, unary_request};

/// A layer that stamps no idempotency key (laid beneath the tests' policies).
fn keyless() -> RetryLayer {
    RetryLayer::new().policy(RetryPolicy::new().idempotency_key(None))
}

/// status layer, retry layer, body layer, channel: the whole stack.
fn stack(channel: Channel, policy: RetryPolicy) -> IntoStatus<Retry<TonicBody<Channel>>> {
    ServiceBuilder::new()
        .layer(grpc::status_layer())
        .layer(keyless().policy(policy))
        .layer(grpc::tonic_body_layer())
        .service(channel)
}

/// The same without the status layer: what tonic makes of the layer's errors itself.
fn bare_stack(channel: Channel, policy: RetryPolicy) -> Retry<TonicBody<Channel>> {
    ServiceBuilder::new()
        .layer(keyless().policy(policy))
        .layer(grpc::tonic_body_layer())
        .service(channel)
}

/// A policy that retries Trailers-Only UNAVAILABLE, written with today's classifier hook.
fn retry_unavailable() -> RetryPolicy {
    RetryPolicy::new()
        .max_attempts(3)
        .backoff(Backoff::exponential(
            Duration::from_millis(1),
            Duration::from_millis(5),
        ))
        .assume_idempotent(true)
        .classifier(|_, outcome| match outcome {
            Outcome::Response { headers, .. }
                if trailers_only_code(headers) == Some(Code::Unavailable) =>
            {
                Classification::Retry(RetryReason::Custom("unavailable"))
            }
            _ => Classification::Done,
        })
}

#[tokio::test]
async fn each_scripted_answer_reaches_a_tonic_client() {
    let server = GrpcServer::start([
        Step::Ok,
        Step::Fail(Code::Unavailable),
        Step::Pushback(Code::Unavailable, "25"),
        Step::Fail(Code::InvalidArgument),
        Step::AfterHeaders(Code::Unavailable),
        Step::Ok,
        Step::Fail(Code::ResourceExhausted),
    ])
    .await;
    let client = stack(server.channel().await, RetryPolicy::never());

    let reply = unary(client.clone(), UNARY, b"ping").await.unwrap();
    assert_eq!(&reply.get_ref()[..], b"ping");

    let status = unary(client.clone(), UNARY, b"ping").await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(status.message(), "scripted Unavailable");

    let status = unary(client.clone(), UNARY, b"ping").await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(
        status.metadata().get("grpc-retry-pushback-ms").unwrap(),
        "25"
    );

    let status = unary(client.clone(), UNARY, b"ping").await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);

    let status = unary(client.clone(), UNARY, b"ping").await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "the error after headers");

    let reply = collect(client.clone(), &[b"a", b"bb", b"ccc"])
        .await
        .unwrap();
    assert_eq!(&reply.get_ref()[..], b"abbccc");

    let status = collect(client, &[b"a"]).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);

    let seen = server.seen();
    assert_eq!(seen.len(), 7);
    assert_eq!(seen[5].path, COLLECT);
    assert_eq!(&seen[5].body[..], b"abbccc");
}

/// What a tonic `Channel` hands the layer for each kind of answer, read at the HTTP level:
/// an error before any output is Trailers-Only, so `grpc-status` (and pushback) are in
/// the response headers and the body has neither data nor trailers; an OK answer and an
/// error after the reply have ordinary headers, and their status comes in the trailers.
#[tokio::test]
async fn trailers_only_arrives_as_response_headers_through_a_channel() {
    let server = GrpcServer::start([
        Step::Fail(Code::Unavailable),
        Step::Pushback(Code::Unavailable, "40"),
        Step::Ok,
        Step::AfterHeaders(Code::Unavailable),
    ])
    .await;
    let mut channel = server.channel().await;

    // (grpc-status in the headers, pushback, data received, grpc-status in the trailers)
    let expected = [
        (Some(Code::Unavailable), None, false, None),
        (
            Some(Code::Unavailable),
            Some(Pushback::Wait(Duration::from_millis(40))),
            false,
            None,
        ),
        (None, None, true, Some("0")),
        (None, None, true, Some("14")),
    ];
    for (i, (code, wait, data, trailer)) in expected.into_iter().enumerate() {
        let request = http::Request::post(format!("{}{UNARY}", server.uri()))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(tonic::body::Body::new(Full::new(frame(b"hello"))))
            .unwrap();
        let response = channel.ready().await.unwrap().call(request).await.unwrap();
        assert_eq!(response.status(), http::StatusCode::OK);
        assert_eq!(trailers_only_code(response.headers()), code, "answer {i}");
        assert_eq!(pushback(response.headers()), wait, "answer {i}");
        let collected = response.into_body().collect().await.unwrap();
        let trailers = collected.trailers().cloned();
        let bytes = collected.to_bytes();
        assert_eq!(!bytes.is_empty(), data, "answer {i}");
        if data {
            assert_eq!(bytes, frame(b"hello"), "answer {i}");
        }
        assert_eq!(
            trailers
                .as_ref()
                .and_then(|t| t.get("grpc-status"))
                .map(|v| v.to_str().unwrap().to_string())
                .as_deref(),
            trailer,
            "answer {i}"
        );
    }
}

#[tokio::test]
async fn the_current_layer_with_a_grpc_classifier_retries_unavailable() {
    let server = GrpcServer::start([
        Step::Fail(Code::Unavailable),
        Step::Fail(Code::Unavailable),
        Step::Ok,
    ])
    .await;
    let client = stack(server.channel().await, retry_unavailable());
    let reply = unary(client, UNARY, b"again").await.unwrap();
    assert_eq!(&reply.get_ref()[..], b"again");
    // The http response's extensions become the tonic response's.
    assert_eq!(reply.extensions().get::<RetryInfo>().unwrap().attempts(), 3);

    let seen = server.seen();
    assert_eq!(seen.len(), 3);
    for call in &seen {
        assert_eq!(&call.body[..], b"again");
        assert!(!call.headers.contains_key("idempotency-key"));
    }
}

#[tokio::test]
async fn a_client_streaming_call_is_replayed_from_the_buffer() {
    let server = GrpcServer::start([Step::Fail(Code::Unavailable), Step::Ok]).await;
    let client = stack(server.channel().await, retry_unavailable());
    let reply = collect(client, &[b"one,", b"two,", b"three"])
        .await
        .unwrap();
    assert_eq!(&reply.get_ref()[..], b"one,two,three");
    let seen = server.seen();
    assert_eq!(seen.len(), 2);
    assert!(seen.iter().all(|call| &call.body[..] == b"one,two,three"));
}

#[tokio::test]
async fn an_error_after_headers_is_committed_and_not_retried() {
    let server = GrpcServer::start([Step::AfterHeaders(Code::Unavailable), Step::Ok]).await;
    let client = stack(server.channel().await, retry_unavailable());
    let status = unary(client, UNARY, b"x").await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(server.seen().len(), 1);
}

#[tokio::test]
async fn a_non_retryable_code_is_returned_at_once() {
    let server = GrpcServer::start([Step::Fail(Code::PermissionDenied), Step::Ok]).await;
    let client = stack(server.channel().await, retry_unavailable());
    let status = unary(client, UNARY, b"x").await.unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied);
    assert_eq!(server.seen().len(), 1);
}

/// The layer's deadline reaches a tonic caller as DEADLINE_EXCEEDED through the status
/// layer, and as UNKNOWN without it (tonic's `Status::from_error` does not know it).
#[tokio::test]
async fn the_layers_deadline_is_deadline_exceeded() {
    let slow = || Step::Slow(Duration::from_secs(30), Box::new(Step::Ok));
    let server = GrpcServer::start([slow(), slow()]).await;
    let policy = || RetryPolicy::new().deadline(Duration::from_millis(200));

    let status = unary(stack(server.channel().await, policy()), UNARY, b"x")
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert!(status.message().contains("deadline"), "{status:?}");
    // The caller reaches the record through the status's source.
    let source = std::error::Error::source(&status).expect("the layer's error");
    let retry = source
        .downcast_ref::<tower_http_retry::RetryError>()
        .expect("the layer's RetryError");
    assert_eq!(retry.info().stop(), tower_http_retry::StopReason::Deadline);
    assert!(retry.get_ref().is::<tower_http_retry::DeadlineExceeded>());

    let status = unary(bare_stack(server.channel().await, policy()), UNARY, b"x")
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unknown, "{status:?}");
}

/// The channel enforces `grpc-timeout` itself and reports it as CANCELLED ("Timeout
/// expired"); the status layer makes it DEADLINE_EXCEEDED. The server is sent the
/// header.
#[tokio::test]
async fn the_channels_own_timeout_is_deadline_exceeded_through_the_status_layer() {
    let slow = || Step::Slow(Duration::from_secs(30), Box::new(Step::Ok));
    let server = GrpcServer::start([slow(), slow()]).await;
    let request = || {
        let mut request = tonic::Request::new(Bytes::from_static(b"x"));
        request.set_timeout(Duration::from_millis(150));
        request
    };

    let bare = bare_stack(server.channel().await, RetryPolicy::never());
    let status = unary_request(bare, UNARY, request()).await.unwrap_err();
    assert_eq!(status.code(), Code::Cancelled, "{status:?}");
    assert_eq!(status.message(), "Timeout expired");

    let full = stack(server.channel().await, RetryPolicy::never());
    let status = unary_request(full, UNARY, request()).await.unwrap_err();
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");

    // Give the server a moment to record both calls (they are still sleeping).
    for _ in 0..50 {
        if server.seen().len() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let seen = server.seen();
    assert_eq!(seen.len(), 2);
    let timeout = seen[0]
        .headers
        .get("grpc-timeout")
        .expect("grpc-timeout sent");
    assert_eq!(
        common::grpc::grpc_timeout(timeout.to_str().unwrap()),
        Duration::from_millis(150)
    );
}

/// What a tonic caller can see of a failure that the layer returns as a response (a
/// Trailers-Only answer after the last attempt): tonic's client turns the response headers
/// into the `Status` and its metadata, and drops the response's extensions. So the retry
/// record has to travel as a header, such as `grpc-previous-rpc-attempts` set on the
/// response headers, to reach the caller; here a layer above the retry layer does that.
#[tokio::test]
async fn response_headers_are_a_failed_calls_only_channel_to_the_caller() {
    let server = GrpcServer::start([
        Step::Fail(Code::Unavailable),
        Step::Fail(Code::Unavailable),
        Step::Fail(Code::Unavailable),
    ])
    .await;
    let client = ServiceBuilder::new()
        .layer(grpc::status_layer())
        .map_response(|mut response: http::Response<tonic::body::Body>| {
            let attempts = response
                .extensions()
                .get::<RetryInfo>()
                .map_or(1, |info| info.attempts());
            response.headers_mut().insert(
                "grpc-previous-rpc-attempts",
                http::HeaderValue::from(attempts - 1),
            );
            response
        })
        .layer(keyless().policy(retry_unavailable()))
        .layer(grpc::tonic_body_layer())
        .service(server.channel().await);
    let status = unary(client, UNARY, b"x").await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(
        status.metadata().get("grpc-previous-rpc-attempts").unwrap(),
        "2"
    );
    assert_eq!(server.seen().len(), 3);
}

/// A server that is not there: tonic's connect error comes out as UNAVAILABLE.
#[tokio::test]
async fn a_refused_connection_is_unavailable() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_lazy();
    let status = unary(stack(channel, RetryPolicy::never()), UNARY, b"x")
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
}
