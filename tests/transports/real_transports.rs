//! The layer over real transports: a hyper-util client against hyper HTTP/1 and HTTP/2
//! servers, an `h2` server sending RST_STREAM and GOAWAY, and a raw-frame HTTP/2 server,
//! all on 127.0.0.1. Every case runs on a current-thread and a multi-thread runtime, its
//! requests awaited directly and from spawned tasks, and the racy ones a hundred times in
//! each of those four ways: how and when a transport lets go of a body, and which error it
//! reports, differ from a mock's in ways that only show up here (see TESTING.md).
//!
//! What every case checks: no retry that is safe is refused (the retry happens, with the
//! whole body), and no keyless POST is applied twice by the server.

use crate::common;
use tower::ServiceExt;

use std::time::Duration;

use bytes::Bytes;
use common::transport::{
    H2Action, Mode, Proto, Script, Server, Step, apply, client, h2_server, hyper_server,
    on_every_runtime, raw_goaway, read_all, repeat, status,
};
use http::{Method, Request};
use tower::{BoxError, Layer};
use tower_http_retry::classify::RetryReason;
use tower_http_retry::{
    Backoff, IdempotencyKey, Jitter, RetryInfo, RetryLayer, RetryPolicy, StopReason,
};

/// Racy cases run this many times in each of the four ways.
const RACY_RUNS: usize = 100;
/// A hung case fails rather than blocking the suite.
const LIMIT: Duration = Duration::from_secs(60);

fn layer(keys: bool) -> RetryLayer {
    let policy = RetryPolicy::default().max_attempts(3).backoff(
        Backoff::exponential(Duration::from_millis(1), Duration::from_millis(4))
            .jitter(Jitter::None),
    );
    // Keys are off unless turned on (for a server that de-duplicates on them).
    let layer = RetryLayer::new().policy(policy);
    if keys {
        layer.policy(RetryPolicy::new().idempotency_key(IdempotencyKey::default()))
    } else {
        layer
    }
}

fn request(method: Method, server: &Server, path: &str, steps: &[Step]) -> Request<Script> {
    Request::builder()
        .method(method)
        .uri(server.url(path))
        .body(Script::new(steps))
        .unwrap()
}

/// Sends `req` through a fresh client wrapped in `layer`.
async fn send(
    proto: Proto,
    layer: RetryLayer,
    req: Request<Script>,
) -> Result<http::Response<hyper::body::Incoming>, BoxError> {
    layer.layer(client(proto)).oneshot(req).await
}

fn info(response: &http::Response<hyper::body::Incoming>) -> RetryInfo {
    response.extensions().get::<RetryInfo>().unwrap().clone()
}

/// A safe retry that happened: the answer is 200 after exactly `attempts` attempts, each
/// retry for `reason`, and the server read the whole body (trailers too) once.
fn assert_retried(
    context: &str,
    result: Result<http::Response<hyper::body::Incoming>, BoxError>,
    server: &Server,
    attempts: u32,
    reason: RetryReason,
    steps: &[Step],
) {
    let response = match result {
        Ok(response) => response,
        Err(error) => panic!("{context}: failed instead of retrying: {error}"),
    };
    let info = info(&response);
    assert_eq!(
        (response.status().as_u16(), info.attempts(), info.stop()),
        (200, attempts, StopReason::Final),
        "{context}: {info:?}"
    );
    assert!(
        info.retries().iter().all(|r| r.reason == reason),
        "{context}: {info:?}"
    );
    let applied = server.log.applied();
    let whole = Script::bytes(steps);
    let complete: Vec<_> = applied.iter().filter(|a| a.body == whole).collect();
    assert_eq!(complete.len(), 1, "{context}: {applied:?}");
    for step in steps {
        if let Step::Trailers(name, value) = step {
            let trailers = complete[0].trailers.as_ref();
            assert_eq!(
                trailers.and_then(|t| t.get(*name)).map(|v| v.as_bytes()),
                Some(value.as_bytes()),
                "{context}: the retry arrived without its trailers: {applied:?}"
            );
        }
    }
}

const STREAM: &[Step] = &[
    Step::Data(b"first chunk;"),
    Step::Wait(Duration::from_millis(30)),
    Step::Data(b"second chunk;"),
    Step::Data(b"third chunk"),
];

/// HTTP/1: the server reads the first chunk of a streaming PUT and drops the connection
/// while hyper's connection task still holds the body (pending). The retry must wait for
/// the task to let go of it, then send the recorded chunk and the rest.
#[test]
fn h1_reset_after_the_first_chunk_of_a_streaming_put_is_retried() {
    on_every_runtime(LIMIT, |mode| {
        repeat(mode, RACY_RUNS, move |run| async move {
            let server = hyper_server(
                Proto::H1,
                |req: Request<hyper::body::Incoming>, index, log| async move {
                    if index == 0 {
                        let mut body = req.into_body();
                        let _ = http_body_util::BodyExt::frame(&mut body).await;
                        return Err(std::io::Error::other("reset after the first chunk"));
                    }
                    apply(req, &log, 200).await
                },
            )
            .await;
            let result = send(
                Proto::H1,
                layer(true),
                request(Method::PUT, &server, "/doc", STREAM),
            )
            .await;
            let context = format!("{mode:?} run {run}");
            assert_retried(
                &context,
                result,
                &server,
                2,
                RetryReason::ConnectionClosed,
                STREAM,
            );
        })
    });
}

/// A plan for the `h2` server: `first()` for the first stream, a 200 for every later one.
fn first_then_200(first: fn() -> H2Action) -> impl Fn(usize) -> H2Action + Copy + Send + Sync {
    move |index| {
        if index == 0 {
            first()
        } else {
            H2Action::Apply(200)
        }
    }
}

/// HTTP/2: RST_STREAM(REFUSED_STREAM) after the first chunk of a keyless POST. The refusal
/// proves the server did not process it, so even a keyless POST is retried; the body is
/// still in hyper's body pipe when the response future fails.
#[test]
fn h2_refused_stream_mid_body_retries_a_keyless_post() {
    on_every_runtime(LIMIT, |mode| {
        repeat(mode, RACY_RUNS, move |run| async move {
            let server = h2_server(first_then_200(|| {
                H2Action::ResetAfterFirstChunk(h2::Reason::REFUSED_STREAM)
            }))
            .await;
            let result = send(
                Proto::H2,
                layer(false),
                request(Method::POST, &server, "/orders", STREAM),
            )
            .await;
            let context = format!("{mode:?} run {run}");
            assert_retried(
                &context,
                result,
                &server,
                2,
                RetryReason::RefusedStream,
                STREAM,
            );
            let applied = server.log.applied();
            assert_eq!(applied.len(), 1, "{context}: a keyless POST applied twice");
            assert!(applied[0].headers.get("idempotency-key").is_none());
        })
    });
}

/// Any other reset code is not proof: a keyless POST is returned, sent once; a PUT is
/// retried (a stream reset is HTTP/2's connection reset), its whole body replayed.
#[test]
fn h2_other_resets_retry_a_put_and_not_a_keyless_post() {
    on_every_runtime(LIMIT, |mode| {
        repeat(mode, 20, move |run| async move {
            let context = format!("{mode:?} run {run}");
            let server =
                h2_server(|_| H2Action::ResetAfterFirstChunk(h2::Reason::INTERNAL_ERROR)).await;
            let result = send(
                Proto::H2,
                layer(false),
                request(Method::POST, &server, "/orders", STREAM),
            )
            .await;
            assert!(result.is_err(), "{context}");
            assert_eq!(server.log.seen(), 1, "{context}: sent again");

            let server = h2_server(first_then_200(|| {
                H2Action::ResetAfterFirstChunk(h2::Reason::INTERNAL_ERROR)
            }))
            .await;
            let result = send(
                Proto::H2,
                layer(false),
                request(Method::PUT, &server, "/doc", STREAM),
            )
            .await;
            assert_retried(
                &context,
                result,
                &server,
                2,
                RetryReason::ConnectionClosed,
                STREAM,
            );
        })
    });
}

const SLOW: &[Step] = &[
    Step::Data(b"the start;"),
    Step::Wait(Duration::from_millis(400)),
    Step::Data(b"the end"),
];

/// An attempt timeout during a slow upload: the attempt is dropped while the transport is
/// waiting on the body; hyper lets go of it (closing the HTTP/1 connection, resetting the
/// HTTP/2 stream) and the retry resumes the upload where it was.
#[test]
fn attempt_timeout_during_a_slow_upload_is_retried_over_h1_and_h2() {
    for proto in [Proto::H1, Proto::H2] {
        on_every_runtime(LIMIT, |mode| {
            repeat(
                mode,
                if mode == Mode::Direct { 5 } else { 50 },
                move |run| async move {
                    let server =
                        hyper_server(
                            proto,
                            |req, _, log| async move { apply(req, &log, 200).await },
                        )
                        .await;
                    let layer = RetryLayer::new().policy(
                        RetryPolicy::default()
                            .attempt_timeout(Duration::from_millis(300))
                            .backoff(Backoff::exponential(Duration::ZERO, Duration::ZERO)),
                    );
                    let result =
                        send(proto, layer, request(Method::PUT, &server, "/upload", SLOW)).await;
                    let context = format!("{proto:?} {mode:?} run {run}");
                    assert_retried(&context, result, &server, 2, RetryReason::Timeout, SLOW);
                },
            )
        });
    }
}

const SIZED: &[Step] = &[Step::Data(b"abc"), Step::Data(b"def")];

/// A streamed body whose length the request's own `Content-Length` gives: hyper stops at
/// that length without a last poll, and a 503 after it is a 503 after the whole body.
#[test]
fn a_503_after_a_content_length_stream_is_retried() {
    for proto in [Proto::H1, Proto::H2] {
        on_every_runtime(LIMIT, |mode| {
            repeat(mode, 20, move |run| async move {
                let server = hyper_server(proto, |req, index, log| async move {
                    apply(req, &log, if index == 0 { 503 } else { 200 }).await
                })
                .await;
                let mut req = request(Method::PUT, &server, "/sized", SIZED);
                req.headers_mut()
                    .insert(http::header::CONTENT_LENGTH, "6".parse().unwrap());
                let result = send(proto, layer(true), req).await;
                let context = format!("{proto:?} {mode:?} run {run}");
                let status = RetryReason::Status(http::StatusCode::SERVICE_UNAVAILABLE);
                let response = result.unwrap_or_else(|e| panic!("{context}: {e}"));
                let info = info(&response);
                assert_eq!(
                    (response.status().as_u16(), info.attempts()),
                    (200, 2),
                    "{context}: {info:?}"
                );
                assert_eq!(info.retries()[0].reason, status);
                let applied = server.log.applied();
                assert_eq!(applied.len(), 2, "{context}");
                assert!(
                    applied
                        .iter()
                        .all(|a| a.body == Bytes::from_static(b"abcdef")),
                    "{context}: {applied:?}"
                );
            })
        });
    }
}

/// A body of 3 MiB in 16 KiB chunks after a first chunk of 3 bytes: three times the stream
/// window hyper's HTTP/2 server grants (1 MiB), so a server that stops reading holds the
/// rest back (hyper's client takes the next chunk only when the window has room; one huge
/// chunk it would take whole, into h2's buffer).
fn large() -> Vec<Step> {
    static CHUNK: [u8; 16 << 10] = [b'x'; 16 << 10];
    let mut steps = vec![Step::Data(b"abc")];
    steps.extend((0..192).map(|_| Step::Data(&CHUNK)));
    steps
}

/// An HTTP/2 server that answers attempt `early` (0 for the first) with a 503 after reading
/// 3 bytes of its body, and resets the stream; it applies the others, with a 503 before
/// that attempt and a 200 after it.
async fn early_503(early: usize) -> Server {
    hyper_server(Proto::H2, move |req, index, log| async move {
        if index != early {
            return apply(req, &log, if index < early { 503 } else { 200 }).await;
        }
        let (parts, mut body) = req.into_parts();
        let mut read = Vec::new();
        while read.len() < 3 {
            match http_body_util::BodyExt::frame(&mut body).await {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        read.extend_from_slice(&data);
                    }
                }
                _ => break,
            }
        }
        log.record(common::transport::Applied {
            method: parts.method,
            path: parts.uri.path().to_string(),
            headers: parts.headers,
            body: read.into(),
            trailers: None,
        });
        Ok(status(503))
    })
    .await
}

/// A PUT of `large()` against `early_503(early)`: answered 200 by attempt `early + 2`, after
/// the attempt that was answered early, every other attempt having sent the whole body.
fn an_early_503_is_followed_by_the_whole_body(early: usize) {
    on_every_runtime(LIMIT, |mode| {
        repeat(mode, 20, move |run| async move {
            let server = early_503(early).await;
            let steps = large();
            let layer = layer(true).max_replay_bytes(8 << 20);
            let req = request(Method::PUT, &server, "/doc", &steps);
            let context = format!("{mode:?} run {run}");
            let response = send(Proto::H2, layer, req)
                .await
                .unwrap_or_else(|e| panic!("{context}: {e}"));
            let info = info(&response);
            assert_eq!(
                (response.status().as_u16(), info.attempts(), info.stop()),
                (200, early as u32 + 2, StopReason::Final),
                "{context}: {info:?}"
            );
            let applied = server.log.applied();
            assert_eq!(applied.len(), early + 2, "{context}");
            for (i, attempt) in applied.iter().enumerate() {
                match i == early {
                    true => assert!(attempt.body.len() < 1 << 20, "{context}"),
                    false => assert_eq!(attempt.body, Script::bytes(&steps), "{context}: {i}"),
                }
            }
        })
    });
}

/// HTTP/2: attempt 1 is read whole and answered 503; the server answers attempt 2 with a
/// 503 after reading a few bytes and resets the stream (`NO_ERROR`), so flow control keeps
/// most of the replayed body from ever leaving. That 503 came before the attempt sent its
/// body, and the whole body is still at hand: attempt 3 sends all of it again. (Over HTTP/1
/// a server that stops reading closes the connection, which the client sees as a reset, not
/// an early response; the rule itself is also checked with a scripted transport in
/// tests/behaviour/retry_loop.rs.)
#[test]
fn h2_an_early_503_is_retried_with_the_whole_body() {
    an_early_503_is_followed_by_the_whole_body(1);
}

/// HTTP/2: the server answers 503 to the first attempt after reading only 3 bytes of a
/// 3 MiB body that fits the replay cap, and resets the stream: the rest was never read
/// from the caller's body. The retry replays what was read and reads the rest: the server
/// gets every byte once, in order.
#[test]
fn h2_an_early_503_to_the_first_attempt_is_retried_with_the_rest_read_from_the_caller() {
    an_early_503_is_followed_by_the_whole_body(0);
}

const WITH_TRAILERS: &[Step] = &[
    Step::Data(b"payload;"),
    Step::Data(b"more"),
    Step::Trailers("x-checksum", "c0ffee"),
];

fn with_trailers(server: &Server, path: &str) -> Request<Script> {
    let mut req = request(Method::PUT, server, path, WITH_TRAILERS);
    // HTTP/1 sends only the trailer fields the head announces.
    req.headers_mut()
        .insert(http::header::TRAILER, "x-checksum".parse().unwrap());
    req
}

/// hyper drops a body right after its trailers frame: the body was fully sent, and a 503
/// after it is retried, trailers and all.
#[test]
fn a_503_after_a_body_with_trailers_is_retried_with_the_trailers() {
    for proto in [Proto::H1, Proto::H2] {
        on_every_runtime(LIMIT, |mode| {
            repeat(mode, 20, move |run| async move {
                let server = hyper_server(proto, |req, index, log| async move {
                    apply(req, &log, if index == 0 { 503 } else { 200 }).await
                })
                .await;
                let result = send(proto, layer(true), with_trailers(&server, "/t")).await;
                let context = format!("{proto:?} {mode:?} run {run}");
                let response = result.unwrap_or_else(|e| panic!("{context}: {e}"));
                assert_eq!(
                    (response.status().as_u16(), info(&response).attempts()),
                    (200, 2),
                    "{context}"
                );
                let applied = server.log.applied();
                assert_eq!(applied.len(), 2, "{context}");
                for a in &applied {
                    assert_eq!(a.body, Bytes::from_static(b"payload;more"), "{context}");
                    assert_eq!(
                        a.trailers
                            .as_ref()
                            .and_then(|t| t.get("x-checksum"))
                            .map(|v| v.as_bytes()),
                        Some(&b"c0ffee"[..]),
                        "{context}: {applied:?}"
                    );
                }
            })
        });
    }
}

/// The connection closes after the server read the body and its trailers, without an
/// answer: the retry carries the trailers too.
#[test]
fn a_retry_after_a_close_following_the_trailers_carries_them() {
    // HTTP/1: hyper's server drops the connection when the handler fails.
    on_every_runtime(LIMIT, |mode| {
        repeat(mode, 20, move |run| async move {
            let server = hyper_server(
                Proto::H1,
                |req: Request<hyper::body::Incoming>, index, log| async move {
                    if index == 0 {
                        let (parts, body) = req.into_parts();
                        let _ = read_all(&parts, body).await;
                        return Err(std::io::Error::other("closing after the trailers"));
                    }
                    apply(req, &log, 200).await
                },
            )
            .await;
            let result = send(Proto::H1, layer(true), with_trailers(&server, "/t")).await;
            let context = format!("H1 {mode:?} run {run}");
            assert_retried(
                &context,
                result,
                &server,
                2,
                RetryReason::ConnectionClosed,
                WITH_TRAILERS,
            );
        })
    });
    // HTTP/2: the server drops the whole connection.
    on_every_runtime(LIMIT, |mode| {
        repeat(mode, 20, move |run| async move {
            let server = h2_server(first_then_200(|| H2Action::ApplyThenDrop)).await;
            let result = send(Proto::H2, layer(true), with_trailers(&server, "/t")).await;
            let context = format!("H2 {mode:?} run {run}");
            let response = result.unwrap_or_else(|e| panic!("{context}: {e}"));
            assert_eq!(
                (response.status().as_u16(), info(&response).attempts()),
                (200, 2),
                "{context}"
            );
            let applied = server.log.applied();
            assert_eq!(applied.len(), 2, "{context}");
            assert!(
                applied.iter().all(|a| a
                    .trailers
                    .as_ref()
                    .is_some_and(|t| t.get("x-checksum").is_some())),
                "{context}: {applied:?}"
            );
        })
    });
}

const POST_BODY: &[Step] = &[Step::Data(b"order 42")];

/// A keyless POST of `POST_BODY` over HTTP/2 that the layer must not send again: it comes
/// back as the transport's error, and the server applied it exactly `applied` times (once
/// when it did the work before the connection went, none when it read nothing).
async fn keyless_post_is_returned(context: &str, server: &Server, applied: usize) {
    let result = send(
        Proto::H2,
        layer(false),
        request(Method::POST, server, "/orders", POST_BODY),
    )
    .await;
    assert!(
        result.is_err(),
        "{context}: a keyless POST: {:?}",
        result.map(|r| r.status())
    );
    assert_eq!(
        server.log.applied().len(),
        applied,
        "{context}: a keyless POST applied more often than the server did the work"
    );
}

/// GOAWAY naming the very stream as processed (nginx's habit after `keepalive_requests`):
/// the server did the work, so a keyless POST must not be sent again; a GET and a keyed
/// POST may be, and are.
#[test]
fn goaway_after_processing_retries_what_may_be_repeated_and_never_a_keyless_post() {
    on_every_runtime(LIMIT, |mode| {
        repeat(mode, RACY_RUNS, move |run| async move {
            let plan = first_then_200(|| H2Action::ApplyThenGoAway);
            let context = format!("{mode:?} run {run}");

            keyless_post_is_returned(&context, &h2_server(plan).await, 1).await;

            let server = h2_server(plan).await;
            let result = send(
                Proto::H2,
                layer(false),
                request(Method::GET, &server, "/items", &[]),
            )
            .await;
            let response = result.unwrap_or_else(|e| panic!("{context}: GET: {e}"));
            let info = info(&response);
            assert_eq!(
                (response.status().as_u16(), info.attempts()),
                (200, 2),
                "{context}: {info:?}"
            );

            let server = h2_server(plan).await;
            let result = send(
                Proto::H2,
                layer(true),
                request(Method::POST, &server, "/orders", POST_BODY),
            )
            .await;
            let response = result.unwrap_or_else(|e| panic!("{context}: keyed POST: {e}"));
            assert_eq!(response.status(), 200, "{context}");
            let applied = server.log.applied();
            assert_eq!(applied.len(), 2, "{context}");
            let keys: Vec<_> = applied
                .iter()
                .map(|a| a.headers.get("idempotency-key").cloned())
                .collect();
            assert!(
                keys[0].is_some() && keys[0] == keys[1],
                "{context}: {keys:?}"
            );
        })
    });
}

/// The raw GOAWAY server of the two tests below (`apply`: it applies the request first),
/// with hyper's HTTP/2 server answering 200 on later connections.
async fn goaway_then_200(apply_first: bool) -> Server {
    raw_goaway(1, apply_first, |req, _, log| async move {
        apply(req, &log, 200).await
    })
    .await
}

/// A retry after GOAWAY that succeeded: 200 after 2 attempts. hyper reports the GOAWAY
/// itself, or the close that follows it when it reads that first.
fn retried_once_after_goaway(
    context: &str,
    result: Result<http::Response<hyper::body::Incoming>, BoxError>,
) {
    let response = result.unwrap_or_else(|e| panic!("{context}: {e}"));
    let info = info(&response);
    assert_eq!(
        (response.status().as_u16(), info.attempts()),
        (200, 2),
        "{context}: {info:?}"
    );
    assert!(
        matches!(
            info.retries()[0].reason,
            RetryReason::GoAway | RetryReason::ConnectionClosed
        ),
        "{context}: {info:?}"
    );
}

/// GOAWAY with a last-stream-id below the request's stream, though the server did read
/// and apply it: what hyper reports to the stream a server processed last when the
/// connection goes away (measured against nginx). A GOAWAY is no proof, so a keyless POST
/// is returned, applied once, never twice; a GET and a keyed POST are retried.
#[test]
fn goaway_naming_an_earlier_stream_never_repeats_a_keyless_post() {
    on_every_runtime(LIMIT, |mode| {
        repeat(mode, RACY_RUNS, move |run| async move {
            let context = format!("{mode:?} run {run}");
            keyless_post_is_returned(&context, &goaway_then_200(true).await, 1).await;

            let server = goaway_then_200(true).await;
            let result = send(
                Proto::H2,
                layer(true),
                request(Method::POST, &server, "/orders", POST_BODY),
            )
            .await;
            retried_once_after_goaway(&format!("{context}: keyed POST"), result);
        })
    });
}

/// GOAWAY before the server read anything of the request: a GET is retried and succeeds;
/// a keyless POST is not (a GOAWAY proves nothing) and reaches the server zero times.
#[test]
fn goaway_before_processing_retries_a_get_and_leaves_a_keyless_post_alone() {
    on_every_runtime(LIMIT, |mode| {
        repeat(mode, 20, move |run| async move {
            let context = format!("{mode:?} run {run}");
            let server = goaway_then_200(false).await;
            let result = send(
                Proto::H2,
                layer(true),
                request(Method::GET, &server, "/items", &[]),
            )
            .await;
            retried_once_after_goaway(&format!("{context}: GET"), result);
            assert_eq!(server.log.applied().len(), 1, "{context}");

            keyless_post_is_returned(&context, &goaway_then_200(false).await, 0).await;
        })
    });
}

/// A fully read body and a 503 with nothing racy: the control case, so a failure of the
/// cases above is the transport's doing, not the server helpers'.
#[test]
fn control_a_503_then_200_over_h1_and_h2() {
    for proto in [Proto::H1, Proto::H2] {
        on_every_runtime(LIMIT, |mode| {
            repeat(mode, 5, move |run| async move {
                let server = hyper_server(proto, |req, index, log| async move {
                    if index == 0 {
                        return Ok(status(503));
                    }
                    apply(req, &log, 200).await
                })
                .await;
                let result =
                    send(proto, layer(true), request(Method::GET, &server, "/", &[])).await;
                let response =
                    result.unwrap_or_else(|e| panic!("{proto:?} {mode:?} run {run}: {e}"));
                assert_eq!(
                    (response.status().as_u16(), info(&response).attempts()),
                    (200, 2)
                );
            })
        });
    }
}

/// hyper's low-level HTTP/1 client whose connection task is aborted after the server got
/// the first request: hyper answers that request with "dispatch task is gone", a user-class
/// error that is a connection failure. Each call makes its own connection.
#[derive(Clone)]
struct AbortFirstConnection {
    addr: std::net::SocketAddr,
    first: std::sync::Arc<std::sync::atomic::AtomicBool>,
    received: std::sync::Arc<tokio::sync::Notify>,
}

impl tower::Service<Request<tower_http_retry::ReplayBody<Script>>> for AbortFirstConnection {
    type Response = http::Response<hyper::body::Incoming>;
    type Error = BoxError;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Self::Response, BoxError>> + Send>,
    >;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), BoxError>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<tower_http_retry::ReplayBody<Script>>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let stream = tokio::net::TcpStream::connect(this.addr).await?;
            let (mut sender, conn) =
                hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
            let task = tokio::spawn(conn);
            let response = sender.send_request(req);
            if this.first.swap(false, std::sync::atomic::Ordering::SeqCst) {
                this.received.notified().await;
                task.abort();
            }
            Ok(response.await?)
        })
    }
}

#[test]
fn dispatch_task_gone_retries_a_get_and_not_a_keyless_post() {
    on_every_runtime(LIMIT, |mode| {
        repeat(mode, 20, move |run| async move {
            for (method, keys) in [(Method::GET, true), (Method::POST, false)] {
                let context = format!("{method} {mode:?} run {run}");
                let received = std::sync::Arc::new(tokio::sync::Notify::new());
                let notify = received.clone();
                let server = hyper_server(Proto::H1, move |req, index, log| {
                    let notify = notify.clone();
                    async move {
                        if index == 0 {
                            notify.notify_one();
                            std::future::pending::<()>().await;
                        }
                        apply(req, &log, 200).await
                    }
                })
                .await;
                let inner = AbortFirstConnection {
                    addr: server.addr,
                    first: std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true)),
                    received,
                };
                let body: &[Step] = if method == Method::GET {
                    &[]
                } else {
                    POST_BODY
                };
                let req = request(method.clone(), &server, "/", body);
                let result = layer(keys).layer(inner).oneshot(req).await;
                if method == Method::GET {
                    let response = result.unwrap_or_else(|e| panic!("{context}: {e}"));
                    let info = info(&response);
                    assert_eq!(
                        (response.status().as_u16(), info.attempts()),
                        (200, 2),
                        "{context}"
                    );
                    assert_eq!(
                        info.retries()[0].reason,
                        RetryReason::ConnectionClosed,
                        "{context}"
                    );
                } else {
                    let error = result.err().unwrap_or_else(|| panic!("{context}: retried"));
                    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&*error);
                    let mut user = false;
                    while let Some(e) = source {
                        user |= e
                            .downcast_ref::<hyper::Error>()
                            .is_some_and(|h| h.is_user());
                        source = e.source();
                    }
                    assert!(
                        user,
                        "{context}: not hyper's dispatch-gone error: {error:?}"
                    );
                    assert_eq!(server.log.seen(), 1, "{context}: sent again");
                }
            }
        })
    });
}
