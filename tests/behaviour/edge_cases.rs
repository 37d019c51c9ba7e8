//! Edge cases found in review: exact-length bodies over hyper, saturated hints, a retry
//! that would start at the deadline, bodies at the cap, trailers-only bodies.
#![allow(clippy::disallowed_methods)] // tokio's paused clock and sleeps, or real time

use crate::common;

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use common::server;
use common::*;
use http::{Method, Request};
use http_body::{Body, Frame, SizeHint};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower::{Service, ServiceExt};
use tower_http_retry::{Backoff, Jitter, ReplayBody, RetryInfo, RetryLayer, RetryPolicy};

/// A body with an exact size hint and the default `is_end_stream` (false): a file or
/// stream of known length. hyper sends it with Content-Length.
struct Exact {
    chunks: Vec<Bytes>,
    len: u64,
}
impl Exact {
    fn new(parts: &[&'static [u8]]) -> Self {
        let chunks: Vec<Bytes> = parts.iter().map(|p| Bytes::from_static(p)).collect();
        let len = chunks.iter().map(|c| c.len() as u64).sum();
        Exact { chunks, len }
    }
}
impl Body for Exact {
    type Data = Bytes;
    type Error = Infallible;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.chunks.is_empty() {
            return Poll::Ready(None);
        }
        let c = self.chunks.remove(0);
        self.len -= c.len() as u64;
        Poll::Ready(Some(Ok(Frame::data(c))))
    }
    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.len)
    }
}

fn layer() -> RetryLayer {
    RetryLayer::new()
        .policy(RetryPolicy::new().no_gates())
        .policy(
            RetryPolicy::default().max_attempts(3).backoff(
                Backoff::exponential(Duration::from_millis(1), Duration::from_millis(1))
                    .jitter(Jitter::None),
            ),
        )
}

/// A PUT with an exact-length streaming body, answered 503 then 200 by a real hyper server.
#[tokio::test]
async fn exact_length_body_is_retried_after_503_over_hyper() {
    let srv = server::serve(|hit: server::Hit| async move {
        if hit.index == 0 {
            server::respond(503)
        } else {
            server::respond(200)
        }
    })
    .await;
    let client: Client<_, ReplayBody<Exact>> = Client::builder(TokioExecutor::new()).build_http();
    let mut svc = tower::ServiceBuilder::new().layer(layer()).service(client);
    let req = Request::builder()
        .method(Method::PUT)
        .uri(srv.url("/x"))
        .body(Exact::new(&[b"hello ", b"world"]))
        .unwrap();
    let resp = svc.ready().await.unwrap().call(req).await.unwrap();
    let info = resp.extensions().get::<RetryInfo>().unwrap().clone();
    let hits = srv.hits();
    for h in &hits {
        assert_eq!(&h.body[..], b"hello world");
    }
    assert_eq!(hits.len(), 2, "{info:?}");
    assert_eq!(resp.status(), 200);
}

/// A Retry-After hint that saturates, with max_retry_after = Duration::MAX and no
/// deadline: the layer should wait (for ever), not retry at once.
#[tokio::test(start_paused = true)]
async fn saturated_retry_after_does_not_mean_no_wait() {
    let mock = Mock::new([Reply::Headers(
        503,
        vec![("retry-after", "99999999999999999999".to_string())],
    )]);
    let layer = layer().policy(
        RetryPolicy::default()
            .max_attempts(2)
            .max_retry_after(Duration::MAX)
            .backoff(
                Backoff::exponential(Duration::from_millis(1), Duration::from_millis(1))
                    .jitter(Jitter::None),
            ),
    );
    let mut svc = tower::ServiceBuilder::new()
        .layer(layer)
        .service(mock.clone());
    let start = tokio::time::Instant::now();
    let fut = send(&mut svc, get("http://x/"));
    let r = tokio::time::timeout(Duration::from_secs(3600), fut).await;
    let seen = mock.seen();
    assert!(r.is_err(), "still waiting after an hour");
    assert_eq!(start.elapsed(), Duration::from_secs(3600));
    assert_eq!(
        seen.len(),
        1,
        "retried after {:?} although the hint said wait ~forever",
        seen.get(1).map(|s| s.at - seen[0].at)
    );
}

/// A body exactly at the cap, streamed in chunks, is replayed.
#[tokio::test(start_paused = true)]
async fn body_exactly_at_cap_is_replayed() {
    let mock = Mock::statuses(&[503, 200]);
    let mut svc = tower::ServiceBuilder::new()
        .layer(layer().max_replay_bytes(4))
        .service(mock.clone());
    let req = Request::put("http://x/")
        .body(stream(vec![
            Bytes::from_static(b"ab"),
            Bytes::from_static(b"cd"),
        ]))
        .unwrap();
    let resp = send(&mut svc, req).await.unwrap();
    assert_eq!(resp.status(), 200);
    let seen = mock.seen();
    assert_eq!(seen.len(), 2);
    assert_eq!(&seen[1].body[..], b"abcd");
}

/// Trailers-only body.
#[tokio::test(start_paused = true)]
async fn trailers_only_body_is_replayed() {
    let mut t = http::HeaderMap::new();
    t.insert("x-sum", "1".parse().unwrap());
    let frames = vec![Ok::<_, Infallible>(Frame::<Bytes>::trailers(t.clone()))];
    let body = http_body_util::StreamBody::new(futures_util::stream::iter(frames));
    let mock = Mock::statuses(&[503, 200]);
    let mut svc = tower::ServiceBuilder::new()
        .layer(layer())
        .service(mock.clone());
    let req = Request::put("http://x/").body(body).unwrap();
    let resp = send(&mut svc, req).await.unwrap();
    assert_eq!(resp.status(), 200);
    let seen = mock.seen();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[1].trailers.as_ref(), Some(&t));
    assert!(seen[1].body.is_empty());
}

async fn send<B>(
    svc: &mut tower_http_retry::Retry<Mock>,
    req: Request<B>,
) -> Result<http::Response<http_body_util::Full<Bytes>>, tower::BoxError>
where
    B: Body + Unpin + Send + 'static,
    B::Data: Send,
    B::Error: Into<tower::BoxError>,
{
    ServiceExt::<Request<B>>::ready(svc).await?.call(req).await
}

/// A backoff that ends just before the deadline: tokio rounds the sleep up to the next
/// millisecond, so the retry is sent at (or after) the deadline and dropped at once.
#[tokio::test(start_paused = true)]
async fn retry_sent_at_the_deadline() {
    let mock = Mock::new([
        Reply::Status(503),
        Reply::Slow(Duration::from_millis(1), Box::new(Reply::Status(200))),
    ]);
    let layer = layer().policy(
        RetryPolicy::default()
            .max_attempts(3)
            .deadline(Duration::from_millis(10))
            .backoff(
                Backoff::exponential(Duration::from_micros(9_500), Duration::from_micros(9_500))
                    .jitter(Jitter::None),
            ),
    );
    let mut svc = tower::ServiceBuilder::new()
        .layer(layer)
        .service(mock.clone());
    let start = tokio::time::Instant::now();
    let response = send(&mut svc, get("http://x/")).await.unwrap();
    assert_eq!(
        mock.calls(),
        1,
        "a second attempt was sent with no time left"
    );
    // The last real outcome comes back, at once, with the reason.
    assert_eq!(response.status(), 503);
    assert_eq!(start.elapsed(), Duration::ZERO);
    let info = response.extensions().get::<RetryInfo>().unwrap();
    assert_eq!(info.stop(), tower_http_retry::StopReason::Deadline);
}

/// `RetryLayer`'s docs: the layer needs a tokio runtime with time enabled. Without it, a
/// request that needs no timer goes through; the first retry panics, and so does a call
/// whose policy has a deadline.
#[test]
fn a_runtime_without_timers_panics_at_the_first_retry_or_at_a_deadline() {
    use std::panic::{AssertUnwindSafe, catch_unwind};
    use tower::Layer;

    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let run = |layer: RetryLayer, mock: &Mock| {
        let svc = layer.layer(mock.clone());
        catch_unwind(AssertUnwindSafe(|| {
            runtime
                .block_on(svc.oneshot(get("http://h/")))
                .map(|response| response.status())
        }))
    };
    let message = |panic: Box<dyn std::any::Any + Send>| {
        panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default()
    };

    let mock = Mock::statuses(&[200]);
    let status = run(RetryLayer::new(), &mock)
        .expect("no timer needed")
        .unwrap();
    assert_eq!(status, 200);

    let mock = Mock::statuses(&[503]);
    let panic = run(RetryLayer::new(), &mock).expect_err("the first retry needs a timer");
    assert!(message(panic).contains("timers are disabled"));
    assert_eq!(mock.calls(), 1, "panicked before the retry was sent");

    let mock = Mock::statuses(&[200]);
    let deadline =
        RetryLayer::new().policy(RetryPolicy::default().deadline(Duration::from_secs(1)));
    let panic = run(deadline, &mock).expect_err("a deadline needs a timer at once");
    assert!(message(panic).contains("timers are disabled"));
}
