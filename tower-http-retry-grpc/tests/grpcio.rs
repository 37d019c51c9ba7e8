//! The layer against a second gRPC implementation: a server written with Python's grpcio
//! (gRPC's C core underneath), `tests/grpcio/server.py`, started by each test on a free
//! port of 127.0.0.1 with its own scripted plan.
//!
//! The client side is what `tests/grpc/glue.rs` and `tests/grpc/a6.rs` build over tonic's own
//! server: a tonic `Channel` under `grpc::status_layer()`, the `RetryLayer` and
//! `grpc::tonic_body_layer()`. So what is checked here is that the layer reads another
//! implementation's answers the way A6 says: C core's Trailers-Only failures (checked on
//! the wire first, with the `h2` crate), its pushback, its commitment once headers or a
//! message went out, and that grpcio sees the retries' metadata (`grpc-previous-rpc-attempts`,
//! and `grpc-timeout` as the call's deadline).
//!
//! grpcio comes from PyPI (`.ci/run` installs it: `python3 -m pip install grpcio==1.85.3`).
//! The interpreter is `python3`, or the one `PYTHON3` names. Without grpcio the tests fail
//! under `CI=true`, and elsewhere say loudly that they skipped.
#![allow(clippy::disallowed_methods)] // measures real waits with std's clock

use crate::common;

use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use tonic::Code;
use tower::ServiceBuilder;
use tower_http_retry::hints::HintSource;
use tower_http_retry::{Backoff, Jitter, RetryInfo, RetryLayer, RetryPolicy, StopReason};
use tower_http_retry_grpc::GrpcLayerExt;
use tower_http_retry_grpc::{self as grpc, Pushback};

use common::grpc::{COLLECT, UNARY, collect, frame, quick, stack, unary};
use common::grpcio::{GrpcioServer, python};

/// The server-streaming method: one reply message, and the only one that can fail after it.
const REPLY: &str = "/test.Raw/Reply";

/// One answer of the server read at the HTTP/2 level.
#[derive(Debug)]
struct Wire {
    headers: http::HeaderMap,
    /// END_STREAM was on the response HEADERS frame: Trailers-Only.
    ended_with_headers: bool,
    data: Bytes,
    trailers: Option<http::HeaderMap>,
}

/// One call of `path` with `message`, straight over the `h2` crate: what grpcio puts in
/// which frame.
async fn over_h2(port: u16, path: &str, message: &[u8]) -> Wire {
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    let (client, connection) = h2::client::handshake(tcp).await.expect("HTTP/2 handshake");
    let connection = tokio::spawn(connection);
    let mut client = client.ready().await.expect("h2 client ready");
    let request = http::Request::post(format!("http://127.0.0.1:{port}{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap();
    let (response, mut send) = client.send_request(request, false).expect("send headers");
    send.send_data(frame(message), true)
        .expect("send the message");
    let response = response.await.expect("response headers");
    let headers = response.headers().clone();
    let mut body = response.into_body();
    let ended_with_headers = body.is_end_stream();
    let mut data = BytesMut::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.expect("a DATA frame");
        let _ = body.flow_control().release_capacity(chunk.len());
        data.extend_from_slice(&chunk);
    }
    let trailers = body.trailers().await.expect("trailers or none");
    drop(client);
    connection.abort();
    Wire {
        headers,
        ended_with_headers,
        data: data.freeze(),
        trailers,
    }
}

fn header<'a>(map: &'a http::HeaderMap, name: &str) -> Option<&'a str> {
    map.get(name).map(|v| v.to_str().unwrap())
}

/// What the layer relies on, checked in grpcio's frames: a failure before any output is
/// Trailers-Only (one HEADERS frame with END_STREAM, `grpc-status` and the trailing
/// metadata in it, pushback included, sent as the handler set it, `-1` too); once the
/// handler sent its own initial metadata, or a message, the status comes in trailers after
/// ordinary headers.
#[tokio::test]
async fn grpcio_sends_trailers_only_for_a_failure_before_any_output() {
    let Some(python) = python("grpcio_sends_trailers_only_for_a_failure_before_any_output") else {
        return;
    };
    let server = GrpcioServer::start(
        python,
        &[
            "fail:UNAVAILABLE",
            "pushback:UNAVAILABLE:250",
            "pushback:RESOURCE_EXHAUSTED:-1",
            "ok",
            "headers:UNAVAILABLE",
            "after:UNAVAILABLE",
            "fail:UNAVAILABLE",
        ],
    );

    for (i, (path, pushback)) in [(UNARY, None), (UNARY, Some("250")), (UNARY, Some("-1"))]
        .into_iter()
        .enumerate()
    {
        let wire = over_h2(server.port, path, b"hello").await;
        assert!(wire.ended_with_headers, "answer {i}: {wire:?}");
        assert!(wire.data.is_empty() && wire.trailers.is_none(), "{wire:?}");
        let code = grpc::trailers_only_code(&wire.headers);
        let expected = if i == 2 {
            Code::ResourceExhausted
        } else {
            Code::Unavailable
        };
        assert_eq!(code, Some(expected), "answer {i}: {wire:?}");
        assert_eq!(header(&wire.headers, "grpc-retry-pushback-ms"), pushback);
        let expected = match pushback {
            None => None,
            Some("-1") => Some(Pushback::Stop),
            Some(_) => Some(Pushback::Wait(Duration::from_millis(250))),
        };
        assert_eq!(grpc::pushback(&wire.headers), expected, "answer {i}");
        assert!(
            header(&wire.headers, "grpc-message").is_some_and(|m| m.starts_with("scripted")),
            "{wire:?}"
        );
    }

    // OK: headers, the echo, `grpc-status: 0` in the trailers.
    let wire = over_h2(server.port, UNARY, b"hello").await;
    assert!(!wire.ended_with_headers);
    assert_eq!(grpc::trailers_only_code(&wire.headers), None, "{wire:?}");
    assert_eq!(wire.data, frame(b"hello"));
    assert_eq!(
        header(wire.trailers.as_ref().unwrap(), "grpc-status"),
        Some("0")
    );

    // The handler's own initial metadata, then a failure: headers without grpc-status,
    // no message, the status in the trailers.
    let wire = over_h2(server.port, UNARY, b"hello").await;
    assert!(!wire.ended_with_headers, "{wire:?}");
    assert_eq!(grpc::trailers_only_code(&wire.headers), None, "{wire:?}");
    assert_eq!(header(&wire.headers, "x-committed"), Some("yes"));
    assert!(wire.data.is_empty());
    assert_eq!(
        header(wire.trailers.as_ref().unwrap(), "grpc-status"),
        Some("14")
    );

    // A reply message, then a failure.
    let wire = over_h2(server.port, REPLY, b"hello").await;
    assert!(!wire.ended_with_headers);
    assert_eq!(grpc::trailers_only_code(&wire.headers), None, "{wire:?}");
    assert_eq!(wire.data, frame(b"hello"));
    assert_eq!(
        header(wire.trailers.as_ref().unwrap(), "grpc-status"),
        Some("14")
    );

    // The streaming method fails Trailers-Only as well when nothing went out yet.
    let wire = over_h2(server.port, REPLY, b"hello").await;
    assert!(wire.ended_with_headers, "{wire:?}");
    assert_eq!(
        grpc::trailers_only_code(&wire.headers),
        Some(Code::Unavailable)
    );

    assert_eq!(server.seen().await.len(), 7);
}

#[tokio::test]
async fn unavailable_twice_then_ok_with_a6_metadata_seen_by_grpcio() {
    let Some(python) = python("unavailable_twice_then_ok_with_a6_metadata_seen_by_grpcio") else {
        return;
    };
    let server = GrpcioServer::start(python, &["fail:UNAVAILABLE", "fail:UNAVAILABLE", "ok"]);
    let layer = RetryLayer::grpc().policy(quick().deadline(Duration::from_secs(20)));
    let reply = unary(stack(server.channel().await, layer), UNARY, b"hello")
        .await
        .expect("the third attempt succeeds");
    assert_eq!(&reply.get_ref()[..], b"hello");
    let info = reply.extensions().get::<RetryInfo>().unwrap();
    assert_eq!(info.attempts(), 3);
    assert!(
        info.retries()
            .iter()
            .all(|r| r.reason == grpc::reason(Code::Unavailable)),
        "{info:?}"
    );

    let seen = server.seen().await;
    let steps: Vec<_> = seen.iter().map(|c| c.step.as_str()).collect();
    assert_eq!(steps, ["fail:UNAVAILABLE", "fail:UNAVAILABLE", "ok"]);
    let previous: Vec<_> = seen
        .iter()
        .map(|c| c.get("grpc-previous-rpc-attempts"))
        .collect();
    assert_eq!(previous, [None, Some("1"), Some("2")]);
    for call in &seen {
        assert_eq!(call.method, "Unary");
        assert_eq!(call.messages, [b"hello".to_vec()]);
        assert_eq!(call.get("idempotency-key"), None);
        // grpcio took `grpc-timeout` as the call's deadline: the time left of 20 s, on
        // every attempt (its clock may read a few milliseconds over).
        let left = call.deadline().expect("grpc-timeout sent on every attempt");
        assert!(
            left > Duration::from_secs(19) && left < Duration::from_millis(20_050),
            "{call:?}"
        );
        assert_eq!(call.get("grpc-timeout"), None, "C core consumes it");
    }
}

#[tokio::test]
async fn retries_stop_at_max_attempts_with_grpcios_last_answer() {
    let Some(python) = python("retries_stop_at_max_attempts_with_grpcios_last_answer") else {
        return;
    };
    let plan = ["fail:UNAVAILABLE"; 5];
    let server = GrpcioServer::start(python, &plan);
    let status = unary(
        stack(server.channel().await, RetryLayer::grpc().policy(quick())),
        UNARY,
        b"x",
    )
    .await
    .unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    let seen = server.seen().await;
    let previous: Vec<_> = seen
        .iter()
        .map(|c| c.get("grpc-previous-rpc-attempts"))
        .collect();
    assert_eq!(previous, [None, Some("1"), Some("2"), Some("3")]);
}

#[tokio::test]
async fn a_code_the_policy_does_not_list_is_returned_at_once() {
    let Some(python) = python("a_code_the_policy_does_not_list_is_returned_at_once") else {
        return;
    };
    let server = GrpcioServer::start(python, &["fail:INVALID_ARGUMENT", "ok"]);
    let status = unary(
        stack(server.channel().await, RetryLayer::grpc().policy(quick())),
        UNARY,
        b"x",
    )
    .await
    .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert_eq!(status.message(), "scripted fail:INVALID_ARGUMENT");
    let seen = server.seen().await;
    assert_eq!(seen.len(), 1, "{seen:?}");
    // No deadline, no `grpc-timeout`.
    assert_eq!(seen[0].deadline(), None, "{seen:?}");
}

#[tokio::test]
async fn grpcios_pushback_is_the_exact_wait() {
    let Some(python) = python("grpcios_pushback_is_the_exact_wait") else {
        return;
    };
    // 300 ms of pushback against 1 ms of backoff: the wait is the pushback's.
    let server = GrpcioServer::start(python, &["pushback:UNAVAILABLE:300", "ok"]);
    let client = stack(server.channel().await, RetryLayer::grpc().policy(quick()));
    let start = Instant::now();
    let reply = unary(client, UNARY, b"x")
        .await
        .expect("the retry succeeds");
    assert!(start.elapsed() >= Duration::from_millis(300));
    let info = reply.extensions().get::<RetryInfo>().unwrap();
    assert_eq!(info.attempts(), 2);
    assert_eq!(info.retries()[0].wait, Duration::from_millis(300));
    assert_eq!(
        info.retries()[0].hint,
        Some(HintSource::Header("grpc-retry-pushback-ms"))
    );
    let seen = server.seen().await;
    assert_eq!(seen.len(), 2);
    let gap = seen[1].arrived_ms - seen[0].arrived_ms;
    assert!(
        gap >= 299.0,
        "the retry arrived {gap:.1} ms after the first"
    );

    // 20 ms of pushback against a 5 s backoff: exact, not a floor.
    let slow = quick().backoff(
        Backoff::exponential(Duration::from_secs(5), Duration::from_secs(5)).jitter(Jitter::None),
    );
    let server = GrpcioServer::start(python, &["pushback:UNAVAILABLE:20", "ok"]);
    let client = stack(server.channel().await, RetryLayer::grpc().policy(slow));
    let start = Instant::now();
    let reply = unary(client, UNARY, b"x")
        .await
        .expect("the retry succeeds");
    assert!(start.elapsed() < Duration::from_secs(4));
    let info = reply.extensions().get::<RetryInfo>().unwrap();
    assert_eq!(info.retries()[0].wait, Duration::from_millis(20));
    assert_eq!(server.seen().await.len(), 2);
}

#[tokio::test]
async fn a_negative_pushback_from_grpcio_stops_retrying() {
    let Some(python) = python("a_negative_pushback_from_grpcio_stops_retrying") else {
        return;
    };
    let server = GrpcioServer::start(python, &["pushback:UNAVAILABLE:-1", "ok"]);
    let status = unary(
        stack(server.channel().await, RetryLayer::grpc().policy(quick())),
        UNARY,
        b"x",
    )
    .await
    .unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert_eq!(
        status.metadata().get("grpc-retry-pushback-ms").unwrap(),
        "-1"
    );
    assert_eq!(server.seen().await.len(), 1);

    // Below the status layer the http response is there to read: the record says why.
    let server = GrpcioServer::start(python, &["pushback:UNAVAILABLE:-1", "ok"]);
    let client = ServiceBuilder::new()
        .layer(RetryLayer::grpc().policy(quick()))
        .layer(grpc::tonic_body_layer())
        .service(server.channel().await);
    let request = http::Request::post(format!("{}{UNARY}", server.uri()))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(http_body_util::Full::new(frame(b"x")))
        .unwrap();
    let response = tower::ServiceExt::oneshot(client, request).await.unwrap();
    assert_eq!(
        grpc::trailers_only_code(response.headers()),
        Some(Code::Unavailable)
    );
    let info = response.extensions().get::<RetryInfo>().unwrap();
    assert_eq!(info.stop(), StopReason::ServerSaidStop, "{info:?}");
    assert_eq!(info.attempts(), 1);
    assert_eq!(server.seen().await.len(), 1);
}

/// A6: once the server sent its headers the RPC is committed. grpcio sends them with the
/// first message, or when the handler sends its own initial metadata.
#[tokio::test]
async fn a_failure_after_grpcio_sent_headers_is_committed() {
    let Some(python) = python("a_failure_after_grpcio_sent_headers_is_committed") else {
        return;
    };
    let server = GrpcioServer::start(python, &["after:UNAVAILABLE", "ok"]);
    let client = stack(server.channel().await, RetryLayer::grpc().policy(quick()));
    let status = unary(client, REPLY, b"x").await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert_eq!(status.message(), "scripted after:UNAVAILABLE");
    let seen = server.seen().await;
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].method, "Reply");

    let server = GrpcioServer::start(python, &["headers:UNAVAILABLE", "ok"]);
    let client = stack(server.channel().await, RetryLayer::grpc().policy(quick()));
    let status = unary(client, UNARY, b"x").await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert_eq!(status.message(), "scripted headers:UNAVAILABLE");
    assert_eq!(server.seen().await.len(), 1);

    // The control: the same failure before any output is retried.
    let server = GrpcioServer::start(python, &["fail:UNAVAILABLE", "ok"]);
    let client = stack(server.channel().await, RetryLayer::grpc().policy(quick()));
    let reply = unary(client, REPLY, b"x").await.expect("retried");
    assert_eq!(&reply.get_ref()[..], b"x");
    assert_eq!(server.seen().await.len(), 2);
}

/// The server fails the client stream after reading all of it; the retry sends the same
/// messages again from the replay buffer, byte for byte, and the reply joins them.
#[tokio::test]
async fn a_client_stream_is_replayed_to_grpcio_byte_for_byte() {
    static BIG: [u8; 20_000] = [0x5a; 20_000];
    let Some(python) = python("a_client_stream_is_replayed_to_grpcio_byte_for_byte") else {
        return;
    };
    let server = GrpcioServer::start(python, &["fail:UNAVAILABLE", "ok"]);
    let client = stack(server.channel().await, RetryLayer::grpc().policy(quick()));
    let messages: [&'static [u8]; 4] = [b"one,", &BIG, b"", b"\x00\xfftwo"];
    let reply = collect(client, &messages)
        .await
        .expect("the retry succeeds");
    assert_eq!(&reply.get_ref()[..], &messages.concat()[..]);
    assert_eq!(reply.extensions().get::<RetryInfo>().unwrap().attempts(), 2);
    let seen = server.seen().await;
    assert_eq!(seen.len(), 2);
    for call in &seen {
        assert_eq!(format!("/test.Raw/{}", call.method), COLLECT);
        let got: Vec<&[u8]> = call.messages.iter().map(Vec::as_slice).collect();
        assert_eq!(
            got, messages,
            "{}: the messages as grpcio read them",
            call.step
        );
    }
}

/// The server sleeps past the layer's deadline: the caller gets DEADLINE_EXCEEDED at the
/// deadline, and grpcio was given the deadline as `grpc-timeout`.
#[tokio::test]
async fn a_grpcio_server_slower_than_the_deadline_is_deadline_exceeded() {
    let Some(python) = python("a_grpcio_server_slower_than_the_deadline_is_deadline_exceeded")
    else {
        return;
    };
    let server = GrpcioServer::start(python, &["sleep:5000:ok", "ok"]);
    let deadline = Duration::from_millis(300);
    let client = stack(
        server.channel().await,
        RetryLayer::grpc().policy(quick().deadline(deadline)),
    );
    let start = Instant::now();
    let status = unary(client, UNARY, b"x").await.unwrap_err();
    let took = start.elapsed();
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert!(
        took >= deadline - Duration::from_millis(5) && took < Duration::from_secs(3),
        "{took:?}"
    );
    eprintln!("deadline: {status:?} after {took:?}");
    // Whichever timer fired first, the layer's or the channel's own, the record says the
    // deadline ended the call.
    let retry = std::error::Error::source(&status)
        .and_then(|e| e.downcast_ref::<tower_http_retry::RetryError>())
        .expect("the layer's RetryError is the status's source");
    assert_eq!(
        retry.info().stop(),
        StopReason::Deadline,
        "{:?}",
        retry.info()
    );
    let seen = server.seen().await;
    assert_eq!(seen.len(), 1, "no attempt after the deadline: {seen:?}");
    let left = seen[0].deadline().expect("grpc-timeout sent");
    assert!(left <= deadline + Duration::from_millis(50), "{left:?}");
}

/// A service config hedging every method of `test.Raw`: up to 3 attempts, `delay` apart,
/// UNAVAILABLE non-fatal.
fn hedging_layer(delay: &str) -> RetryLayer {
    let config = grpc::service_config(&format!(
        r#"{{"methodConfig": [{{"name": [{{"service": "test.Raw"}}],
            "hedgingPolicy": {{"maxAttempts": 3, "hedgingDelay": "{delay}",
                               "nonFatalStatusCodes": ["UNAVAILABLE"]}}}}]}}"#
    ))
    .unwrap();
    // No budget (the config has no throttle: `no_gates` removes nothing else).
    RetryLayer::from_service_config(&config).policy(RetryPolicy::new().no_gates())
}

/// The server's records once every call in them has ended (a cancelled one is marked when
/// its sleep notices), waiting at most 5 s.
async fn seen_settled(server: &GrpcioServer, cancelled: usize) -> Vec<common::grpcio::Call> {
    let started = Instant::now();
    loop {
        let seen = server.seen().await;
        if seen.iter().filter(|c| c.cancelled).count() >= cancelled
            || started.elapsed() > Duration::from_secs(5)
        {
            return seen;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_hedge_wins_over_a_slow_grpcio_call_which_grpcio_sees_cancelled() {
    let Some(python) = python("a_hedge_wins_over_a_slow_grpcio_call_which_grpcio_sees_cancelled")
    else {
        return;
    };
    let server = GrpcioServer::start(python, &["sleep:10000:ok", "ok"]);
    let started = Instant::now();
    let reply = unary(
        stack(server.channel().await, hedging_layer("0.2s")),
        UNARY,
        b"hedged",
    )
    .await
    .expect("the hedge answers");
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(5),
        "took {took:?}: the hedge did not win"
    );
    assert!(
        took >= Duration::from_millis(200),
        "took {took:?}: sent before the delay"
    );
    assert_eq!(&reply.get_ref()[..], b"hedged");
    let info = reply.extensions().get::<RetryInfo>().unwrap();
    assert_eq!(
        info.retries()
            .iter()
            .filter(|r| r.kind == tower_http_retry::AttemptKind::Hedge)
            .count(),
        1,
        "{info:?}"
    );
    assert_eq!(info.returned(), Some(2));
    assert_eq!(
        info.outcomes().next().unwrap(),
        tower_http_retry::AttemptOutcome::Cancelled
    );

    let seen = seen_settled(&server, 1).await;
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert!(
        seen[0].cancelled,
        "grpcio saw the original cancelled: {seen:?}"
    );
    assert!(!seen[1].cancelled);
    let previous: Vec<_> = seen
        .iter()
        .map(|c| c.get("grpc-previous-rpc-attempts"))
        .collect();
    assert_eq!(previous, [None, Some("1")]);
    assert!(seen.iter().all(|c| c.messages == [b"hedged".to_vec()]));
    let gap = seen[1].arrived_ms - seen[0].arrived_ms;
    assert!(
        (150.0..2_000.0).contains(&gap),
        "the hedge came {gap} ms later"
    );
}

#[tokio::test]
async fn a_non_fatal_code_from_grpcio_sends_the_next_hedge_at_once() {
    let Some(python) = python("a_non_fatal_code_from_grpcio_sends_the_next_hedge_at_once") else {
        return;
    };
    // A 10 s delay: only the UNAVAILABLE's shortcut can send the second attempt soon.
    let server = GrpcioServer::start(python, &["fail:UNAVAILABLE", "ok"]);
    let started = Instant::now();
    let reply = unary(
        stack(server.channel().await, hedging_layer("10s")),
        UNARY,
        b"x",
    )
    .await
    .expect("the second attempt answers");
    assert!(started.elapsed() < Duration::from_secs(5));
    let info = reply.extensions().get::<RetryInfo>().unwrap();
    assert_eq!(info.returned(), Some(2));
    assert_eq!(info.retries()[0].reason, grpc::reason(Code::Unavailable));
    let seen = server.seen().await;
    assert_eq!(seen.len(), 2);
}

#[tokio::test]
async fn a_fatal_code_from_grpcio_wins_and_cancels_the_hedges_in_flight() {
    let Some(python) = python("a_fatal_code_from_grpcio_wins_and_cancels_the_hedges_in_flight")
    else {
        return;
    };
    let server = GrpcioServer::start(
        python,
        &[
            "sleep:600:fail:INVALID_ARGUMENT",
            "sleep:10000:ok",
            "sleep:10000:ok",
        ],
    );
    let started = Instant::now();
    let status = unary(
        stack(server.channel().await, hedging_layer("0.1s")),
        UNARY,
        b"x",
    )
    .await
    .unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    let seen = seen_settled(&server, 2).await;
    assert_eq!(seen.len(), 3, "{seen:?}");
    let cancelled: Vec<_> = seen.iter().map(|c| c.cancelled).collect();
    assert_eq!(cancelled, [false, true, true], "{seen:?}");
}
