//! Hedging under paused time: A6's timeline (when each attempt starts), which outcome wins,
//! what the gates allow, the body a hedge waits for, and what is left behind.
#![allow(clippy::disallowed_methods)] // tokio's paused clock and sleeps, or real time

use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody};
use tokio::time::Instant;
use tower::{BoxError, Layer, Service, ServiceExt};
use tower_http_retry::classify::RetryReason;
use tower_http_retry::{
    AttemptKind, AttemptOutcome, DeadlineExceeded, Hedging, IdempotencyKey, ReplayBody,
    RetryBudget, RetryError, RetryInfo, RetryLayer, RetryPolicy, StopReason, Throttle,
};

/// One attempt's script: how long it takes and what it answers.
#[derive(Clone, Copy)]
struct Step {
    /// How long the attempt is stuck before its body is read (a connection being made, a
    /// pool or a stream limit to wait for).
    stall: Duration,
    after: Duration,
    status: u16,
    retry_after: Option<u64>,
}

fn answer(ms: u64, status: u16) -> Step {
    Step {
        stall: Duration::ZERO,
        after: Duration::from_millis(ms),
        status,
        retry_after: None,
    }
}

/// An attempt stuck for `stall` ms before it reads its body, then answered at once.
fn stuck(stall: u64, status: u16) -> Step {
    Step {
        stall: Duration::from_millis(stall),
        ..answer(0, status)
    }
}

/// When a call came, and the count of earlier attempts it carried.
type Call = (Duration, Option<String>);

/// Answers each call with the next step of its script (else 200 after 10 s), reads the whole
/// body first, and records when each call came and how many of its futures are alive.
#[derive(Clone)]
struct Timeline {
    script: Arc<Mutex<VecDeque<Step>>>,
    start: Instant,
    calls: Arc<Mutex<Vec<Call>>>,
    bodies: Arc<Mutex<Vec<Bytes>>>,
    alive: Arc<AtomicUsize>,
}

impl Timeline {
    fn new(steps: &[Step]) -> Self {
        Timeline {
            script: Arc::new(Mutex::new(steps.iter().copied().collect())),
            start: Instant::now(),
            calls: Arc::default(),
            bodies: Arc::default(),
            alive: Arc::default(),
        }
    }

    /// When each call came, in ms since the start.
    fn starts(&self) -> Vec<u64> {
        let calls = self.calls.lock().unwrap();
        calls.iter().map(|(at, _)| at.as_millis() as u64).collect()
    }

    fn previous_attempts(&self) -> Vec<Option<String>> {
        let calls = self.calls.lock().unwrap();
        calls.iter().map(|(_, header)| header.clone()).collect()
    }

    fn alive(&self) -> usize {
        self.alive.load(Ordering::SeqCst)
    }
}

/// Counts a call's future as alive until it is dropped.
struct Alive(Arc<AtomicUsize>);

impl Drop for Alive {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl<B> Service<Request<ReplayBody<B>>> for Timeline
where
    B: http_body::Body<Data = Bytes> + Unpin + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Response = Response<Full<Bytes>>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Full<Bytes>>, BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<ReplayBody<B>>) -> Self::Future {
        let previous = request
            .headers()
            .get("x-previous")
            .map(|v| v.to_str().unwrap().to_string());
        self.calls
            .lock()
            .unwrap()
            .push((self.start.elapsed(), previous));
        let step = self
            .script
            .lock()
            .unwrap()
            .pop_front()
            .unwrap_or(answer(10_000, 200));
        self.alive.fetch_add(1, Ordering::SeqCst);
        let alive = Alive(Arc::clone(&self.alive));
        let bodies = Arc::clone(&self.bodies);
        Box::pin(async move {
            let _alive = alive;
            tokio::time::sleep(step.stall).await;
            let body = request.into_body().collect().await.map_err(Into::into)?;
            bodies.lock().unwrap().push(body.to_bytes());
            tokio::time::sleep(step.after).await;
            let mut response = Response::builder().status(step.status);
            if let Some(seconds) = step.retry_after {
                response = response.header("retry-after", seconds);
            }
            Ok(response.body(Full::new(Bytes::from_static(b"ok"))).unwrap())
        })
    }
}

/// Writes the count of earlier attempts, as gRPC's `grpc-previous-rpc-attempts` does.
struct Previous;

impl tower_http_retry::AttemptHook for Previous {
    fn before_attempt(&self, attempt: &tower_http_retry::Attempt, headers: &mut http::HeaderMap) {
        if attempt.counted_before > 0 {
            headers.insert("x-previous", attempt.counted_before.into());
        }
    }
}

/// Hedges every 500 ms, up to 4 attempts (A6's example), with no budget in the way.
fn a6(policy: RetryPolicy) -> RetryLayer {
    RetryLayer::new()
        .policy(RetryPolicy::new().no_gates())
        .policy(
            policy
                .max_attempts(4)
                .on_attempt(Previous)
                .hedge(Hedging::after(Duration::from_millis(500))),
        )
}

fn get() -> Request<Full<Bytes>> {
    Request::get("http://127.0.0.1/")
        .body(Full::new(Bytes::new()))
        .unwrap()
}

fn info(response: &Response<Full<Bytes>>) -> &RetryInfo {
    response.extensions().get::<RetryInfo>().unwrap()
}

fn kinds(info: &RetryInfo) -> Vec<AttemptKind> {
    info.retries().iter().map(|retry| retry.kind).collect()
}

#[tokio::test(start_paused = true)]
async fn while_none_answers_an_attempt_starts_every_delay_up_to_max_attempts() {
    let server = Timeline::new(&[answer(1_800, 200)]);
    let response = a6(RetryPolicy::default())
        .layer(server.clone())
        .oneshot(get())
        .await
        .unwrap();
    assert_eq!(server.starts(), [0, 500, 1000, 1500]);
    // The first answered at 1.8 s; the three hedges were cancelled.
    let info = info(&response);
    assert_eq!(info.attempts(), 4);
    assert_eq!(
        info.retries()
            .iter()
            .filter(|r| r.kind == tower_http_retry::AttemptKind::Hedge)
            .count(),
        3
    );
    assert_eq!(info.returned(), Some(1));
    assert_eq!(info.stop(), StopReason::Final);
    assert_eq!(
        info.outcomes().collect::<Vec<_>>(),
        [
            AttemptOutcome::Response(StatusCode::OK),
            AttemptOutcome::Cancelled,
            AttemptOutcome::Cancelled,
            AttemptOutcome::Cancelled,
        ]
    );
    assert_eq!(kinds(info), [AttemptKind::Hedge; 3]);
    for retry in info.retries() {
        assert_eq!(retry.reason, RetryReason::Hedge);
        assert_eq!(retry.wait, Duration::from_millis(500));
    }
    // Each hedge says how many went before it, as a retry does.
    assert_eq!(
        server.previous_attempts(),
        [None, Some("1".into()), Some("2".into()), Some("3".into())]
    );
    assert_eq!(server.alive(), 0, "the losers were dropped");
    // Hedges are no waits.
    assert_eq!(info.total_wait(), Duration::ZERO);
    assert_eq!(
        info.to_string(),
        "4 attempts: 200, cancelled, cancelled, cancelled; 3 hedges, attempt 1 returned; \
         stopped: final"
    );
    assert_eq!(
        format!("{info:#}").lines().nth(2),
        Some("  attempt 2, a hedge 500 ms after attempt 1 (hedging delay): cancelled")
    );
}

#[tokio::test(start_paused = true)]
async fn a_non_fatal_failure_sends_the_next_hedge_at_once_and_the_delay_restarts() {
    // The first attempt fails with a 503 at 700 ms: the third goes then, the fourth 500 ms
    // later; the second answers at 1.7 s.
    let server = Timeline::new(&[answer(700, 503), answer(1_200, 200)]);
    let response = a6(RetryPolicy::default())
        .layer(server.clone())
        .oneshot(get())
        .await
        .unwrap();
    assert_eq!(server.starts(), [0, 500, 700, 1200]);
    let info = info(&response);
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(info.returned(), Some(2));
    assert_eq!(
        info.outcomes().collect::<Vec<_>>(),
        [
            AttemptOutcome::Response(StatusCode::SERVICE_UNAVAILABLE),
            AttemptOutcome::Response(StatusCode::OK),
            AttemptOutcome::Cancelled,
            AttemptOutcome::Cancelled,
        ]
    );
    // The third follows the 503, the others the delay.
    let reasons: Vec<_> = info.retries().iter().map(|r| r.reason).collect();
    assert_eq!(
        reasons,
        [
            RetryReason::Hedge,
            RetryReason::Status(StatusCode::SERVICE_UNAVAILABLE),
            RetryReason::Hedge,
        ]
    );
    assert_eq!(server.alive(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_fatal_outcome_wins_at_once_and_cancels_the_rest() {
    for (at, expected_starts) in [
        (300, vec![0]),
        (600, vec![0, 500]),
        (1_100, vec![0, 500, 1000]),
    ] {
        let server = Timeline::new(&[answer(at, 404)]);
        let response = a6(RetryPolicy::default())
            .layer(server.clone())
            .oneshot(get())
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::NOT_FOUND, "404 at {at} ms");
        assert_eq!(server.starts(), expected_starts, "404 at {at} ms");
        let info = info(&response);
        assert_eq!(info.returned(), Some(1));
        assert_eq!(info.stop(), StopReason::Final);
        assert!(
            info.outcomes()
                .skip(1)
                .all(|o| o == AttemptOutcome::Cancelled)
        );
        assert_eq!(server.alive(), 0);
    }
}

#[tokio::test(start_paused = true)]
async fn when_every_attempt_fails_the_last_failure_is_returned() {
    let server = Timeline::new(&[
        answer(2_000, 503),
        answer(2_000, 502),
        answer(2_000, 503),
        answer(2_000, 504),
    ]);
    let start = Instant::now();
    let response = a6(RetryPolicy::default())
        .layer(server.clone())
        .oneshot(get())
        .await
        .unwrap();
    // The fourth was sent at 1.5 s (the first failure came at 2 s), and ended last.
    assert_eq!(server.starts(), [0, 500, 1000, 1500]);
    assert_eq!(start.elapsed(), Duration::from_millis(3_500));
    assert_eq!(response.status(), StatusCode::GATEWAY_TIMEOUT);
    let info = info(&response);
    assert_eq!(info.stop(), StopReason::MaxAttempts);
    assert_eq!(info.returned(), Some(4));
    assert_eq!(
        info.to_string(),
        "4 attempts: 503, 502, 503, 504; 3 hedges, attempt 4 returned; stopped: max attempts"
    );
}

/// Each hedged attempt is named by the reason its outcome was given as it ended (a
/// hedge's own reason is why it was sent).
#[tokio::test(start_paused = true)]
async fn each_hedged_attempt_is_named_by_its_own_reason() {
    use tower_http_retry::classify::{Classification, Classify, DefaultClassifier, Outcome};
    let server = Timeline::new(&[
        answer(2_000, 503),
        answer(2_000, 502),
        answer(2_000, 503),
        answer(2_000, 503),
    ]);
    let overloaded = |head: &http::request::Parts, outcome: Outcome<'_>| match outcome {
        Outcome::Response { status, .. } if status == StatusCode::SERVICE_UNAVAILABLE => {
            Classification::Retry(RetryReason::Custom("overloaded"))
        }
        _ => DefaultClassifier.classify(head, outcome),
    };
    let response = a6(RetryPolicy::default().classifier(overloaded))
        .layer(server.clone())
        .oneshot(get())
        .await
        .unwrap();
    let info = info(&response);
    assert_eq!(
        format!("{info:#}"),
        "4 attempts: overloaded, 502, overloaded, overloaded; 3 hedges, attempt 4 returned; \
         stopped: max attempts\n\
         \x20 attempt 1: overloaded (HTTP 503)\n\
         \x20 attempt 2, a hedge 500 ms after attempt 1 (hedging delay): 502\n\
         \x20 attempt 3, a hedge 500 ms after attempt 2 (hedging delay): overloaded (HTTP 503)\n\
         \x20 attempt 4, a hedge 500 ms after attempt 3 (hedging delay): overloaded (HTTP 503)"
    );
}

#[tokio::test(start_paused = true)]
async fn a_second_500_is_fatal_for_the_request() {
    // The 500 once: the first one is non-fatal, the second is returned.
    let server = Timeline::new(&[answer(100, 500), answer(100, 500)]);
    let response = a6(RetryPolicy::default())
        .layer(server.clone())
        .oneshot(get())
        .await
        .unwrap();
    assert_eq!(server.starts(), [0, 100]);
    assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(info(&response).stop(), StopReason::Final);
    assert_eq!(info(&response).returned(), Some(2));
}

#[tokio::test(start_paused = true)]
async fn retry_after_on_a_non_fatal_failure_sets_the_next_hedges_time() {
    // A 503 asking for 2 s at 700 ms: the next hedge (due at 1 s) goes at 2.7 s instead.
    let slow = Step {
        stall: Duration::ZERO,
        after: Duration::from_millis(700),
        status: 503,
        retry_after: Some(2),
    };
    let server = Timeline::new(&[slow, answer(10_000, 200), answer(100, 200)]);
    let response = a6(RetryPolicy::default())
        .layer(server.clone())
        .oneshot(get())
        .await
        .unwrap();
    assert_eq!(server.starts(), [0, 500, 2700]);
    let info = info(&response);
    assert_eq!(info.returned(), Some(3));
    let third = info.retries()[1];
    assert_eq!(
        third.hint,
        Some(tower_http_retry::hints::HintSource::RetryAfter)
    );
    assert_eq!(third.wait, Duration::from_millis(2_200));
}

#[tokio::test(start_paused = true)]
async fn a_retry_after_over_the_limit_ends_hedging_and_the_others_go_on() {
    let slow = Step {
        stall: Duration::ZERO,
        after: Duration::from_millis(700),
        status: 503,
        retry_after: Some(600),
    };
    let server = Timeline::new(&[slow, answer(1_000, 200)]);
    let response = a6(RetryPolicy::default())
        .layer(server.clone())
        .oneshot(get())
        .await
        .unwrap();
    // No third: the second answers at 1.5 s.
    assert_eq!(server.starts(), [0, 500]);
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(info(&response).returned(), Some(2));
}

#[tokio::test(start_paused = true)]
async fn every_hedge_is_paid_for_by_the_budget_and_not_sent_when_refused() {
    let budget = RetryBudget::builder()
        .ratio(0.0)
        .min_per_sec(0.0)
        .max_tokens(1.0)
        .build();
    let server = Timeline::new(&[answer(3_000, 200)]);
    let layer = RetryLayer::new().policy(
        RetryPolicy::default()
            .max_attempts(4)
            .hedge(Hedging::after(Duration::from_millis(500)))
            .gate(budget.clone()),
    );
    let response = layer.layer(server.clone()).oneshot(get()).await.unwrap();
    // One token: one hedge.
    assert_eq!(server.starts(), [0, 500]);
    assert_eq!(
        info(&response)
            .retries()
            .iter()
            .filter(|r| r.kind == tower_http_retry::AttemptKind::Hedge)
            .count(),
        1
    );
    assert_eq!(info(&response).returned(), Some(1));
}

#[tokio::test(start_paused = true)]
async fn the_throttle_is_checked_not_drawn_for_a_hedge() {
    // Half of its tokens or less: no retry, no hedge.
    let throttle = Throttle::builder().max_tokens(4.0).token_ratio(1.0).build();
    let layer = a6(RetryPolicy::default()).policy(RetryPolicy::new().gate(throttle.clone()));
    let low = Timeline::new(&[answer(100, 503), answer(100, 503)]);
    let response = layer.layer(low.clone()).oneshot(get()).await.unwrap();
    // Each 503 took a token: the first left 3 (a hedge went at once), the second 2.
    assert_eq!(low.starts(), [0, 100]);
    assert_eq!(throttle.tokens(), 2.0);
    assert_eq!(info(&response).stop(), StopReason::Throttled);

    let server = Timeline::new(&[answer(1_200, 200)]);
    let response = layer.layer(server.clone()).oneshot(get()).await.unwrap();
    assert_eq!(server.starts(), [0], "no hedge while the throttle refuses");
    // The success gave one back; nothing else moved it.
    assert_eq!(throttle.tokens(), 3.0);
    assert_eq!(
        info(&response)
            .retries()
            .iter()
            .filter(|r| r.kind == tower_http_retry::AttemptKind::Hedge)
            .count(),
        0
    );
}

#[tokio::test(start_paused = true)]
async fn a_keyed_post_is_retried_not_hedged_unless_the_policy_assumes_idempotence() {
    let post = || {
        Request::post("http://127.0.0.1/orders")
            .body(Full::new(Bytes::from_static(b"order")))
            .unwrap()
    };
    let server = Timeline::new(&[answer(1_200, 503), answer(100, 200)]);
    let response = a6(RetryPolicy::default())
        .policy(RetryPolicy::new().idempotency_key(IdempotencyKey::default()))
        .layer(server.clone())
        .oneshot(post())
        .await
        .unwrap();
    // One at a time: the retry after the 503 (and its backoff), never a concurrent copy.
    let starts = server.starts();
    assert_eq!(starts.len(), 2);
    assert!(starts[1] >= 1_200, "{starts:?}");
    let record = info(&response);
    assert!(record.idempotency_key().is_some());
    assert_eq!(kinds(record), [AttemptKind::Retry]);

    let server = Timeline::new(&[answer(1_200, 200)]);
    let response = a6(RetryPolicy::default().assume_idempotent(true))
        .layer(server.clone())
        .oneshot(post())
        .await
        .unwrap();
    assert_eq!(server.starts(), [0, 500, 1000]);
    assert_eq!(
        info(&response)
            .retries()
            .iter()
            .filter(|r| r.kind == tower_http_retry::AttemptKind::Hedge)
            .count(),
        2
    );
    let bodies = server.bodies.lock().unwrap();
    assert!(bodies.iter().all(|body| body == "order"), "{bodies:?}");
}

/// A body whose chunks come at the given times (ms from its first poll).
fn slow_body(
    chunks: &[(u64, &'static str)],
) -> StreamBody<impl futures_util::Stream<Item = Result<http_body::Frame<Bytes>, Infallible>> + Unpin>
{
    let chunks: VecDeque<_> = chunks.iter().copied().collect();
    let start = Instant::now();
    let stream = futures_util::stream::unfold(chunks, move |mut chunks| async move {
        let (at, text) = chunks.pop_front()?;
        tokio::time::sleep_until(start + Duration::from_millis(at)).await;
        Some((
            Ok(http_body::Frame::data(Bytes::from_static(text.as_bytes()))),
            chunks,
        ))
    });
    StreamBody::new(Box::pin(stream))
}

/// A streaming body of no known size, still arriving: each hedge goes at its delay, the
/// attempts share the caller's body, and every attempt sends all of it.
#[tokio::test(start_paused = true)]
async fn hedges_go_at_their_delay_while_a_body_of_unknown_size_arrives() {
    let server = Timeline::new(&[answer(2_000, 200)]);
    let request = Request::put("http://127.0.0.1/doc")
        .body(slow_body(&[(0, "a"), (300, "b"), (800, "c")]))
        .unwrap();
    let response = a6(RetryPolicy::default().assume_idempotent(true))
        .layer(server.clone())
        .oneshot(request)
        .await
        .unwrap();
    assert_eq!(server.starts(), [0, 500, 1000, 1500]);
    assert_eq!(info(&response).returned(), Some(1));
    let bodies = server.bodies.lock().unwrap();
    assert_eq!(bodies.len(), 4);
    assert!(bodies.iter().all(|body| body == "abc"), "{bodies:?}");
}

/// A shared body that passes the replay cap while a hedge is in flight: the attempt that
/// read past the cap sends it whole, as a first attempt would, and the one that cannot
/// follow is dropped, with no more hedges.
#[tokio::test(start_paused = true)]
async fn attempts_that_cannot_follow_a_body_past_the_cap_are_dropped() {
    let server = Timeline::new(&[answer(2_000, 200)]);
    let request = Request::put("http://127.0.0.1/doc")
        .body(slow_body(&[(0, "0123456789"), (700, "0123456789")]))
        .unwrap();
    let response = a6(RetryPolicy::default().assume_idempotent(true))
        .max_replay_bytes(15)
        .layer(server.clone())
        .oneshot(request)
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    // The hedge went at 500 ms; at 700 the first attempt read past the cap.
    assert_eq!(server.starts(), [0, 500]);
    let info = info(&response);
    assert_eq!(info.returned(), Some(1));
    assert_eq!(
        info.outcomes().collect::<Vec<_>>(),
        [
            AttemptOutcome::Response(StatusCode::OK),
            AttemptOutcome::Cancelled
        ]
    );
    assert_eq!(
        *server.bodies.lock().unwrap(),
        ["01234567890123456789"],
        "sent whole by the first attempt, and by it alone"
    );
    assert_eq!(server.alive(), 0);
}

#[tokio::test(start_paused = true)]
async fn no_hedge_follows_a_body_over_the_replay_cap() {
    let server = Timeline::new(&[answer(2_000, 200)]);
    let request = Request::put("http://127.0.0.1/doc")
        .body(slow_body(&[(0, "0123456789"), (100, "0123456789")]))
        .unwrap();
    let response = a6(RetryPolicy::default().assume_idempotent(true))
        .max_replay_bytes(15)
        .layer(server.clone())
        .oneshot(request)
        .await
        .unwrap();
    assert_eq!(server.starts(), [0]);
    assert_eq!(info(&response).attempts(), 1);
    assert_eq!(
        server.bodies.lock().unwrap()[0].len(),
        20,
        "sent once, complete"
    );
}

#[tokio::test(start_paused = true)]
async fn the_deadline_bounds_every_attempt_and_the_attempt_timeout_each() {
    let server = Timeline::new(&[]);
    let layer = a6(RetryPolicy::default().deadline(Duration::from_millis(1_200)));
    let error = layer
        .layer(server.clone())
        .oneshot(get())
        .await
        .unwrap_err();
    let error = error.downcast::<RetryError>().unwrap();
    assert!(error.get_ref().is::<DeadlineExceeded>());
    assert_eq!(server.starts(), [0, 500, 1000]);
    let record = error.info();
    assert_eq!(record.stop(), StopReason::Deadline);
    assert_eq!(record.returned(), None);
    assert!(record.outcomes().all(|o| o == AttemptOutcome::Abandoned));
    assert_eq!(server.alive(), 0);

    // A timed-out attempt is a non-fatal failure: the next hedge goes at once.
    let server = Timeline::new(&[answer(10_000, 200), answer(100, 200)]);
    let layer = a6(RetryPolicy::default().attempt_timeout(Duration::from_millis(300)));
    let response = layer.layer(server.clone()).oneshot(get()).await.unwrap();
    assert_eq!(server.starts(), [0, 300]);
    assert_eq!(
        info(&response).outcomes().next().unwrap(),
        AttemptOutcome::TimedOut
    );
    assert_eq!(info(&response).returned(), Some(2));
}

#[tokio::test(start_paused = true)]
async fn dropping_the_response_future_drops_every_attempt_and_sends_nothing_more() {
    let server = Timeline::new(&[]);
    let mut service = a6(RetryPolicy::default()).layer(server.clone());
    let future = ServiceExt::<Request<Full<Bytes>>>::ready(&mut service)
        .await
        .unwrap()
        .call(get());
    let outcome = tokio::time::timeout(Duration::from_millis(1_100), future).await;
    assert!(outcome.is_err());
    assert_eq!(server.starts(), [0, 500, 1000]);
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(server.starts().len(), 3, "nothing sent after the drop");
    assert_eq!(server.alive(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_zero_delay_sends_every_attempt_at_once() {
    let server = Timeline::new(&[answer(100, 200)]);
    let layer = RetryLayer::new()
        .policy(RetryPolicy::new().no_gates())
        .policy(
            RetryPolicy::default()
                .max_attempts(3)
                .hedge(Hedging::after(Duration::ZERO)),
        );
    let response = layer.layer(server.clone()).oneshot(get()).await.unwrap();
    assert_eq!(server.starts(), [0, 0, 0]);
    assert_eq!(info(&response).returned(), Some(1));
}

#[tokio::test(start_paused = true)]
async fn a_policy_without_hedging_keeps_one_attempt_in_flight() {
    let server = Timeline::new(&[answer(1_200, 503), answer(100, 200)]);
    let layer = RetryLayer::new()
        .policy(RetryPolicy::new().no_gates())
        .policy(RetryPolicy::default().max_attempts(4).backoff(
            tower_http_retry::Backoff::exponential(Duration::ZERO, Duration::ZERO),
        ));
    let response = layer.layer(server.clone()).oneshot(get()).await.unwrap();
    assert_eq!(server.starts(), [0, 1200]);
    assert_eq!(kinds(info(&response)), [AttemptKind::Retry]);
}

/// Sends `get()` through `service` and returns when its calls started, relative to the
/// request's own start.
async fn starts_of<S>(server: &Timeline, service: S, request: Request<Full<Bytes>>) -> Vec<u64>
where
    S: Service<Request<Full<Bytes>>, Response = Response<Full<Bytes>>, Error = BoxError>,
{
    let before = server.starts().len();
    let at = server.start.elapsed().as_millis() as u64;
    service.oneshot(request).await.unwrap();
    server.starts()[before..].iter().map(|t| t - at).collect()
}

#[tokio::test(start_paused = true)]
async fn a_percentile_uses_its_fallback_until_it_has_its_samples() {
    let fast = vec![answer(100, 200); 5];
    let mut script = fast.clone();
    script.extend([answer(10_000, 200), answer(10, 200)]);
    let server = Timeline::new(&script);
    let layer = RetryLayer::new()
        .policy(RetryPolicy::new().no_gates())
        .policy(
            RetryPolicy::default().max_attempts(2).hedge(
                Hedging::percentile(0.5)
                    .min_samples(5)
                    .fallback(Duration::from_millis(300)),
            ),
        );
    let service = layer.layer(server.clone());
    // Five requests of 100 ms: the fallback (300 ms) never fires.
    for _ in 0..5 {
        assert_eq!(starts_of(&server, service.clone(), get()).await, [0]);
    }
    // Then the median of what was seen (100 ms, read to within 1/16): a hedge at about
    // 100 ms, not 300.
    let starts = starts_of(&server, service.clone(), get()).await;
    assert_eq!(starts.len(), 2);
    assert!((100..=107).contains(&starts[1]), "{starts:?}");
}

#[tokio::test(start_paused = true)]
async fn a_percentile_without_samples_or_fallback_does_not_hedge() {
    let server = Timeline::new(&[answer(1_000, 200), answer(1_000, 200)]);
    let layer = RetryLayer::new()
        .policy(RetryPolicy::new().no_gates())
        .policy(
            RetryPolicy::default()
                .max_attempts(2)
                .hedge(Hedging::percentile(0.9).min_samples(2)),
        );
    let service = layer.layer(server.clone());
    assert_eq!(starts_of(&server, service.clone(), get()).await, [0]);
    assert_eq!(starts_of(&server, service.clone(), get()).await, [0]);
    // Two samples of 1 s: now the third request hedges at about 1 s, and again.
    let starts = starts_of(&server, service, get()).await;
    assert_eq!(starts.len(), 2, "{starts:?}");
    assert!((1_000..=1_063).contains(&starts[1]), "{starts:?}");
}

#[tokio::test(start_paused = true)]
async fn clones_share_one_record_and_a_requests_own_policy_reads_its_routes() {
    let server = Timeline::new(&[
        answer(200, 200),
        answer(200, 200),
        answer(10_000, 200),
        answer(10, 200),
        answer(10_000, 200),
        answer(10, 200),
    ]);
    let hedged = RetryPolicy::default()
        .max_attempts(2)
        .hedge(Hedging::percentile(0.5).min_samples(2));
    let layer = RetryLayer::new()
        .policy(RetryPolicy::new().no_gates())
        .route(
            tower_http_retry::RouteMatch::get().path_prefix("/search"),
            hedged.clone(),
        );
    let search = || {
        Request::get("http://127.0.0.1/search")
            .body(Full::new(Bytes::new()))
            .unwrap()
    };
    let first = layer.layer(server.clone());
    let second = first.clone();
    assert_eq!(starts_of(&server, first.clone(), search()).await, [0]);
    assert_eq!(starts_of(&server, first, search()).await, [0]);
    // The other clone reads the same two samples: a hedge at about 200 ms.
    let starts = starts_of(&server, second.clone(), search()).await;
    assert!(
        starts.len() == 2 && (200..=213).contains(&starts[1]),
        "{starts:?}"
    );
    // A request carrying its own percentile policy reads the route's record too.
    let mut own = search();
    own.extensions_mut().insert(
        RetryPolicy::default()
            .max_attempts(2)
            .hedge(Hedging::percentile(0.5).min_samples(3)),
    );
    // (four samples by now: the warm-up requests, the hedge that won and the original it
    // beat, counted as at least its time).
    let starts = starts_of(&server, second, own).await;
    assert_eq!(starts.len(), 2, "{starts:?}");
    assert!(starts[1] >= 10 && starts[1] <= 213, "{starts:?}");
}

/// A body with an upper bound on its size, but no exact length.
struct Bounded<B>(B, u64);

impl<B: http_body::Body + Unpin> http_body::Body for Bounded<B> {
    type Data = B::Data;
    type Error = B::Error;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<B::Data>, B::Error>>> {
        Pin::new(&mut self.0).poll_frame(cx)
    }
    fn size_hint(&self) -> http_body::SizeHint {
        let mut hint = http_body::SizeHint::new();
        hint.set_upper(self.1);
        hint
    }
}

/// The first attempt is stuck for 2 s before it reads its body (a slow connect, a pool, a
/// stream limit): the hedge goes at its delay all the same, reads the caller's body itself,
/// and answers. For a `Full` body and for a streaming one whose size is bounded under the
/// cap.
#[tokio::test(start_paused = true)]
async fn a_hedge_goes_at_its_delay_though_the_first_attempt_never_read_its_body() {
    for streaming in [false, true] {
        let server = Timeline::new(&[stuck(2_000, 200), answer(2, 200)]);
        let layer = a6(RetryPolicy::default().assume_idempotent(true));
        let response = if streaming {
            let body = Bounded(slow_body(&[(0, "hello "), (10, "world")]), 64);
            let request = Request::put("http://127.0.0.1/doc").body(body).unwrap();
            layer.layer(server.clone()).oneshot(request).await.unwrap()
        } else {
            let request = Request::put("http://127.0.0.1/doc")
                .body(Full::new(Bytes::from_static(b"hello world")))
                .unwrap();
            layer.layer(server.clone()).oneshot(request).await.unwrap()
        };
        let answered = server.start.elapsed().as_millis() as u64;
        assert_eq!(server.starts(), [0, 500], "streaming: {streaming}");
        // The hedge's answer: 500 ms, its 2 ms, and the streaming body's 10 ms.
        assert!(answered < 600, "answered after {answered} ms");
        let info = info(&response);
        assert_eq!(info.returned(), Some(2));
        assert_eq!(
            info.outcomes().collect::<Vec<_>>(),
            [
                AttemptOutcome::Cancelled,
                AttemptOutcome::Response(StatusCode::OK)
            ]
        );
        // Only the hedge read a body, and it read all of it.
        assert_eq!(*server.bodies.lock().unwrap(), ["hello world"]);
        assert_eq!(server.alive(), 0);
    }
}

/// Two attempts stuck, then each reads the one body the other may already have recorded:
/// every attempt sends it all, once.
#[tokio::test(start_paused = true)]
async fn attempts_that_share_a_body_each_send_all_of_it() {
    let server = Timeline::new(&[stuck(700, 503), stuck(100, 503), answer(50, 200)]);
    let body = Bounded(slow_body(&[(0, "a"), (300, "b"), (650, "c")]), 64);
    let request = Request::put("http://127.0.0.1/doc").body(body).unwrap();
    let response = a6(RetryPolicy::default().assume_idempotent(true))
        .layer(server.clone())
        .oneshot(request)
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let bodies = server.bodies.lock().unwrap();
    assert_eq!(bodies.len(), 3, "{bodies:?}");
    assert!(bodies.iter().all(|body| body == "abc"), "{bodies:?}");
}

/// Idempotent is not concurrent-safe: a PUT or DELETE is not hedged unless its policy
/// declares its requests repeatable; the safe methods are.
#[tokio::test(start_paused = true)]
async fn only_safe_methods_and_declared_policies_are_hedged() {
    for (method, hedged) in [
        (http::Method::GET, true),
        (http::Method::HEAD, true),
        (http::Method::OPTIONS, true),
        (http::Method::TRACE, true),
        (http::Method::QUERY, true),
        (http::Method::PUT, false),
        (http::Method::DELETE, false),
        (http::Method::POST, false),
    ] {
        for declared in [false, true] {
            let server = Timeline::new(&[answer(1_200, 200)]);
            let policy = match declared {
                true => RetryPolicy::default().assume_idempotent(true),
                false => RetryPolicy::default(),
            };
            let request = Request::builder()
                .method(method.clone())
                .uri("http://127.0.0.1/item")
                .body(Full::new(Bytes::new()))
                .unwrap();
            let response = a6(policy)
                .layer(server.clone())
                .oneshot(request)
                .await
                .unwrap();
            let expected: &[u64] = match hedged || declared {
                true => &[0, 500, 1000],
                false => &[0],
            };
            assert_eq!(server.starts(), expected, "{method} declared: {declared}");
            assert_eq!(info(&response).attempts() as usize, expected.len());
        }
    }
}

/// A keyed POST is retried after a failure, never hedged: a server that de-duplicates on
/// the key answers a concurrent duplicate with 409.
#[tokio::test(start_paused = true)]
async fn a_keyed_post_is_never_hedged() {
    let server = Timeline::new(&[answer(1_200, 200)]);
    let request = Request::post("http://127.0.0.1/orders")
        .body(Full::new(Bytes::from_static(b"order")))
        .unwrap();
    let response = a6(RetryPolicy::default())
        .policy(RetryPolicy::new().idempotency_key(IdempotencyKey::default()))
        .layer(server.clone())
        .oneshot(request)
        .await
        .unwrap();
    assert_eq!(server.starts(), [0]);
    assert!(info(&response).idempotency_key().is_some());
    assert_eq!(
        info(&response)
            .retries()
            .iter()
            .filter(|r| r.kind == tower_http_retry::AttemptKind::Hedge)
            .count(),
        0
    );
}

/// A service whose first instance is ready at once and whose clones (the hedges' service)
/// get ready only `ready_after` from the start.
struct LateClones {
    inner: Timeline,
    ready_at: Instant,
    first: bool,
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl LateClones {
    fn new(inner: Timeline, ready_after: Duration) -> Self {
        LateClones {
            ready_at: inner.start + ready_after,
            inner,
            first: true,
            sleep: None,
        }
    }
}

impl Clone for LateClones {
    fn clone(&self) -> Self {
        LateClones {
            inner: self.inner.clone(),
            ready_at: self.ready_at,
            first: false,
            sleep: None,
        }
    }
}

impl<B> Service<Request<ReplayBody<B>>> for LateClones
where
    B: http_body::Body<Data = Bytes> + Unpin + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Response = Response<Full<Bytes>>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Full<Bytes>>, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        if self.first || Instant::now() >= self.ready_at {
            return Poll::Ready(Ok(()));
        }
        let at = self.ready_at;
        let sleep = self
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(at)));
        sleep.as_mut().poll(cx).map(Ok)
    }

    fn call(&mut self, request: Request<ReplayBody<B>>) -> Self::Future {
        self.inner.call(request)
    }
}

/// Every attempt failed and the next hedge's service is not ready: the hedge waits for it
/// as a retry waits for its service (without bound when the policy has no time limit), and
/// within the attempt timeout when it has one, after which the last failure is returned.
#[tokio::test(start_paused = true)]
async fn a_hedge_waits_for_its_service_as_a_retry_does() {
    // No time limit: the service is ready at 3 s, and the hedge goes then.
    let server = Timeline::new(&[answer(100, 503), answer(10, 200)]);
    let service = LateClones::new(server.clone(), Duration::from_secs(3));
    let response = a6(RetryPolicy::default())
        .layer(service)
        .oneshot(get())
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(server.starts(), [0, 3_000]);
    assert_eq!(info(&response).returned(), Some(2));

    // An attempt timeout of 2 s bounds the wait: the 503 is returned at 2.1 s.
    let server = Timeline::new(&[answer(100, 503), answer(10, 200)]);
    let service = LateClones::new(server.clone(), Duration::from_secs(3));
    let response = a6(RetryPolicy::default().attempt_timeout(Duration::from_secs(2)))
        .layer(service)
        .oneshot(get())
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(server.starts(), [0]);
    assert_eq!(server.start.elapsed(), Duration::from_millis(2_100));
    assert_eq!(info(&response).stop(), StopReason::ServiceNotReady);
}

#[tokio::test(start_paused = true)]
async fn no_hedge_starts_with_less_than_the_floor() {
    // Hedges every 500 ms within 2 s; with an 800 ms floor the one due at 1.5 s (500 ms
    // left) is not sent.
    let server = Timeline::new(&[answer(1_800, 200)]);
    let policy = RetryPolicy::default()
        .deadline(Duration::from_secs(2))
        .min_time_left(Duration::from_millis(800));
    let response = a6(policy)
        .layer(server.clone())
        .oneshot(get())
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(server.starts(), [0, 500, 1000]);
    assert_eq!(info(&response).attempts(), 3);
}
