//! Hedging over real hyper HTTP/1 and HTTP/2 servers and a real hyper-util client, on both
//! runtimes, awaited and spawned: the slow original's handler is dropped at the server once
//! the hedge wins (HTTP/2 resets its stream, HTTP/1 closes its connection) and never
//! finishes, the winner's body arrives intact, and nothing outlives the request.
#![allow(clippy::disallowed_methods)] // tokio's paused clock and sleeps, or real time

use crate::common;
use tower::ServiceExt;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::transport::{
    Proto, Script, Step, client, hyper_server, on_every_runtime, read_all, repeat,
};
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use tower::Layer;
use tower_http_retry::{AttemptOutcome, Hedging, RetryInfo, RetryLayer, RetryPolicy};

const RUNS: usize = 50;
const LIMIT: Duration = Duration::from_secs(60);

const BODY: &[Step] = &[
    Step::Data(b"first chunk;"),
    Step::Wait(Duration::from_millis(5)),
    Step::Data(b"second chunk"),
];

/// Counts a handler's future as dropped when it is.
struct Dropped(Arc<AtomicUsize>);

impl Drop for Dropped {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// A PUT route that opts in to hedging: its server takes a second copy of the document as
/// harmless (a PUT is not hedged unless its policy says so).
fn layer() -> RetryLayer {
    RetryLayer::new()
        .policy(RetryPolicy::new().no_gates())
        .attempt_header(http::HeaderName::from_static("x-attempt"))
        .policy(
            RetryPolicy::default()
                .max_attempts(2)
                .assume_idempotent(true)
                .hedge(Hedging::after(Duration::from_millis(40))),
        )
}

async fn case(proto: Proto, run: usize) {
    let dropped = Arc::new(AtomicUsize::new(0));
    let finished = Arc::new(AtomicUsize::new(0));
    let (d, f) = (Arc::clone(&dropped), Arc::clone(&finished));
    let server = hyper_server(proto, move |req: Request<hyper::body::Incoming>, _, log| {
        let (dropped, finished) = (Arc::clone(&d), Arc::clone(&f));
        async move {
            let first = req.headers()["x-attempt"] == "1";
            // From the start: the original may be dropped while it still reads its body.
            let guard = first.then(|| Dropped(dropped));
            let (parts, body) = req.into_parts();
            let applied = read_all(&parts, body)
                .await
                .map_err(|e| std::io::Error::other(e.to_string()))?;
            let echo = applied.body.clone();
            log.record(applied);
            if first {
                // Slow: the hedge wins long before this ends.
                tokio::time::sleep(Duration::from_secs(20)).await;
                finished.fetch_add(1, Ordering::SeqCst);
            }
            drop(guard);
            Ok(Response::new(Full::new(echo)))
        }
    })
    .await;
    let request = Request::put(server.url("/doc"))
        .body(Script::new(BODY))
        .unwrap();
    let context = format!("{proto:?} run {run}");
    let response = layer()
        .layer(client(proto))
        .oneshot(request)
        .await
        .unwrap_or_else(|e| panic!("{context}: {e}"));
    let info = response.extensions().get::<RetryInfo>().cloned().unwrap();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, Script::bytes(BODY), "{context}: the winner's body");
    assert_eq!(info.returned(), Some(2), "{context}: {info:?}");
    assert_eq!(
        info.outcomes().next().unwrap(),
        AttemptOutcome::Cancelled,
        "{context}"
    );
    // The original's handler is dropped at the server, soon, and never finishes.
    let waited = tokio::time::timeout(Duration::from_secs(5), async {
        while dropped.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await;
    assert!(
        waited.is_ok(),
        "{context}: the loser's handler is still running"
    );
    // Every attempt the server read to its end got the whole body: the hedge's, and the
    // original's unless it was dropped while it still read it.
    let applied = server.log.applied();
    assert!(
        (1..=2).contains(&applied.len()) && applied.iter().all(|a| a.body == Script::bytes(BODY)),
        "{context}: {applied:?}"
    );
    assert_eq!(finished.load(Ordering::SeqCst), 0, "{context}");
    assert_eq!(server.log.seen(), 2, "{context}: nothing more was sent");
}

/// Both attempts in flight, then the caller gives up: both handlers are dropped at the
/// server, and nothing more is sent.
async fn dropped(proto: Proto, run: usize) {
    let dropped = Arc::new(AtomicUsize::new(0));
    let d = Arc::clone(&dropped);
    let server = hyper_server(proto, move |req: Request<hyper::body::Incoming>, _, log| {
        let dropped = Arc::clone(&d);
        async move {
            let _guard = Dropped(dropped);
            let (parts, body) = req.into_parts();
            let applied = read_all(&parts, body)
                .await
                .map_err(|e| std::io::Error::other(e.to_string()))?;
            log.record(applied);
            tokio::time::sleep(Duration::from_secs(20)).await;
            Ok(Response::new(Full::new(bytes::Bytes::new())))
        }
    })
    .await;
    let context = format!("{proto:?} run {run}");
    let request = Request::put(server.url("/doc"))
        .body(Script::new(BODY))
        .unwrap();
    let call = layer().layer(client(proto)).oneshot(request);
    // The hedge goes at 40 ms; the caller gives up at 150.
    let outcome = tokio::time::timeout(Duration::from_millis(150), call).await;
    assert!(outcome.is_err(), "{context}: answered");
    let waited = tokio::time::timeout(Duration::from_secs(5), async {
        while dropped.load(Ordering::SeqCst) < 2 {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await;
    assert!(
        waited.is_ok(),
        "{context}: {} of 2 handlers dropped",
        dropped.load(Ordering::SeqCst)
    );
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(server.log.seen(), 2, "{context}: nothing more was sent");
}

#[test]
fn a_dropped_hedged_request_leaves_nothing_running_at_the_server() {
    for proto in [Proto::H1, Proto::H2] {
        on_every_runtime(LIMIT, |mode| {
            repeat(mode, 6, move |run| dropped(proto, run))
        });
    }
}

#[test]
fn over_http1_the_winning_hedge_closes_the_originals_connection() {
    on_every_runtime(LIMIT, |mode| repeat(mode, RUNS, |run| case(Proto::H1, run)));
}

#[test]
fn over_http2_the_winning_hedge_resets_the_originals_stream() {
    on_every_runtime(LIMIT, |mode| repeat(mode, RUNS, |run| case(Proto::H2, run)));
}
