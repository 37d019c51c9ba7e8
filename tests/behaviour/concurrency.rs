//! The concurrency budget (Envoy's retry budget) through the layer, under paused time: the
//! retries and hedges in flight at once are at most a share of the requests in flight, or
//! the floor; a retry refused returns the last response, a hedge refused is not sent; kept
//! per authority, each server counts its own; beside a token budget, a refusal gives the
//! other's token back; and every count comes back to zero however a request ends (answered,
//! dropped in each of its states, its service never ready, a panic). The server counts the
//! retries and hedges it has in hand at once, so the bound is seen where it matters; one
//! case does the same against a hyper server on 127.0.0.1, in real time.
#![allow(clippy::disallowed_methods)] // tokio's paused clock and sleeps, or real time

use crate::common::{self, get};

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::join_all;
use http::{Request, Response};
use http_body_util::Full;
use tower::{BoxError, Layer, Service, ServiceExt};
use tower_http_retry::{
    Attempt, AttemptKind, Backoff, ConcurrencyBudget, Gate, Hedging, Jitter, ReplayBody,
    RetryBudget, RetryError, RetryInfo, RetryLayer, RetryPolicy, ServiceNotReady, StopReason,
};

/// What the server does with an attempt.
#[derive(Clone, Copy, Debug)]
enum Act {
    /// Answers this status after this many milliseconds.
    Answer(u64, u16),
    /// Panics in `call`.
    PanicInCall,
    /// Panics when the response future is first polled.
    PanicInFuture,
}

#[derive(Default)]
struct Tally {
    firsts: AtomicUsize,
    /// Retries and hedges: received, in hand now, and the most in hand at once.
    later: AtomicUsize,
    in_hand: AtomicUsize,
    peak: AtomicUsize,
}

/// A server that answers first attempts one way and the others (retries, hedges) another,
/// and counts the others it has in hand: from `call` until their response future is dropped.
#[derive(Clone)]
struct Server {
    first: Act,
    later: Act,
    tally: Arc<Tally>,
    /// Once a first attempt came, never ready again (and never waking its caller).
    stall: bool,
}

impl Server {
    fn new(first: Act, later: Act) -> Self {
        Server {
            first,
            later,
            tally: Arc::default(),
            stall: false,
        }
    }

    fn firsts(&self) -> usize {
        self.tally.firsts.load(Ordering::SeqCst)
    }

    fn later(&self) -> usize {
        self.tally.later.load(Ordering::SeqCst)
    }

    fn peak(&self) -> usize {
        self.tally.peak.load(Ordering::SeqCst)
    }
}

/// A retry or hedge in the server's hand until its future is dropped.
struct InHand(Arc<Tally>);

impl Drop for InHand {
    fn drop(&mut self) {
        self.0.in_hand.fetch_sub(1, Ordering::SeqCst);
    }
}

impl<B: Send + 'static> Service<Request<ReplayBody<B>>> for Server {
    type Response = Response<Full<Bytes>>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        match self.stall && self.firsts() > 0 {
            true => Poll::Pending,
            false => Poll::Ready(Ok(())),
        }
    }

    fn call(&mut self, request: Request<ReplayBody<B>>) -> Self::Future {
        let kind = request.extensions().get::<Attempt>().map(|a| a.kind);
        let (act, guard) = match kind {
            None | Some(AttemptKind::First) => {
                self.tally.firsts.fetch_add(1, Ordering::SeqCst);
                (self.first, None)
            }
            Some(_) => {
                let tally = &self.tally;
                tally.later.fetch_add(1, Ordering::SeqCst);
                let now = tally.in_hand.fetch_add(1, Ordering::SeqCst) + 1;
                tally.peak.fetch_max(now, Ordering::SeqCst);
                (self.later, Some(InHand(Arc::clone(tally))))
            }
        };
        if let Act::PanicInCall = act {
            panic!("the server panicked in call");
        }
        Box::pin(async move {
            let _guard = guard;
            match act {
                Act::Answer(ms, status) => {
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                    Ok(common::response(status, &[("x-attempt", kind_name(kind))]))
                }
                Act::PanicInFuture => panic!("the server panicked in its future"),
                Act::PanicInCall => unreachable!(),
            }
        })
    }
}

fn kind_name(kind: Option<AttemptKind>) -> String {
    match kind {
        None => "first".to_string(),
        Some(kind) => format!("{kind:?}").to_lowercase(),
    }
}

/// Two attempts at most, 1 ms apart, under `gate` alone.
fn retrying(gate: &ConcurrencyBudget) -> RetryPolicy {
    RetryPolicy::default()
        .max_attempts(2)
        .backoff(
            Backoff::exponential(Duration::from_millis(1), Duration::from_millis(1))
                .jitter(Jitter::None),
        )
        .no_gates()
        .gate(gate.clone())
}

fn budget(ratio: f64, min: u32) -> ConcurrencyBudget {
    ConcurrencyBudget::builder()
        .ratio(ratio)
        .min_in_flight(min)
        .build()
}

/// What the budget shows in flight: requests, then retries and hedges.
fn in_flight(budget: &ConcurrencyBudget) -> (u64, u64) {
    let text = format!("{budget:?}");
    let read = |field: &str| {
        let start = text.find(field).unwrap_or_else(|| panic!("{text}")) + field.len();
        let digits: String = text[start..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        digits.parse::<u64>().unwrap()
    };
    (read("requests_in_flight: "), read("retries_in_flight: "))
}

type Answered = Result<Response<Full<Bytes>>, BoxError>;

/// The layer over a `Server`, as the tests send through it.
trait Client:
    Service<Request<Full<Bytes>>, Response = Response<Full<Bytes>>, Error = BoxError> + Clone
{
}

impl<S> Client for S where
    S: Service<Request<Full<Bytes>>, Response = Response<Full<Bytes>>, Error = BoxError> + Clone
{
}

async fn send(client: &impl Client, uri: &str) -> Answered {
    ServiceExt::oneshot(client.clone(), get(uri)).await
}

/// Sends `n` requests at once; each one's status, attempts and stop.
async fn burst(client: &impl Client, n: usize, uri: &str) -> Vec<(u16, u32, StopReason)> {
    let answers = join_all((0..n).map(|_| send(client, uri))).await;
    answers
        .into_iter()
        .map(|answer| {
            let response = answer.unwrap();
            let info = response.extensions().get::<RetryInfo>().unwrap();
            (response.status().as_u16(), info.attempts(), info.stop())
        })
        .collect()
}

fn count(answers: &[(u16, u32, StopReason)], wanted: (u16, u32, StopReason)) -> usize {
    answers.iter().filter(|&&answer| answer == wanted).count()
}

#[tokio::test(start_paused = true)]
async fn retries_in_flight_are_held_to_the_floor_then_to_the_share_of_requests() {
    let budget = budget(0.2, 3);
    // Every first attempt fails at 10 ms; every retry takes a second.
    let server = Server::new(Act::Answer(10, 503), Act::Answer(1_000, 200));
    let client = RetryLayer::new()
        .policy(retrying(&budget))
        .layer(server.clone());
    // 10 requests in flight: 0.2 of them is 2, under the floor of 3.
    let answers = burst(&client, 10, "http://api.test/").await;
    assert_eq!(count(&answers, (200, 2, StopReason::Final)), 3);
    assert_eq!(count(&answers, (503, 1, StopReason::BudgetExhausted)), 7);
    assert_eq!((server.later(), server.peak()), (3, 3));
    assert_eq!(in_flight(&budget), (0, 0));
    // 20 in flight: 0.2 of them is 4, over the floor.
    let server = Server::new(Act::Answer(10, 503), Act::Answer(1_000, 200));
    let client = RetryLayer::new()
        .policy(retrying(&budget))
        .layer(server.clone());
    let answers = burst(&client, 20, "http://api.test/").await;
    assert_eq!(count(&answers, (200, 2, StopReason::Final)), 4);
    assert_eq!(count(&answers, (503, 1, StopReason::BudgetExhausted)), 16);
    assert_eq!((server.firsts(), server.later(), server.peak()), (20, 4, 4));
    assert_eq!(in_flight(&budget), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn hedges_count_too_and_one_refused_is_not_sent() {
    let budget = budget(0.2, 3);
    // Every attempt answers 200 after a second; hedges are due every 100 ms.
    let server = Server::new(Act::Answer(1_000, 200), Act::Answer(1_000, 200));
    let policy = retrying(&budget)
        .max_attempts(3)
        .hedge(Hedging::after(Duration::from_millis(100)));
    let client = RetryLayer::new().policy(policy).layer(server.clone());
    let answers = burst(&client, 10, "http://api.test/").await;
    // Three hedges went at 100 ms; the others, and every second hedge, were not sent. Every
    // request got its first attempt's answer.
    assert_eq!((server.firsts(), server.later(), server.peak()), (10, 3, 3));
    assert!(
        answers.iter().all(|&(status, ..)| status == 200),
        "{answers:?}"
    );
    let hedged = answers.iter().filter(|&&(_, attempts, _)| attempts == 2);
    assert_eq!(hedged.count(), 3, "{answers:?}");
    assert_eq!(in_flight(&budget), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn hedges_and_retries_share_the_places() {
    let budget = budget(0.0, 2);
    let server = Server::new(Act::Answer(1_000, 200), Act::Answer(1_000, 200));
    let hedging = retrying(&budget).hedge(Hedging::after(Duration::from_millis(100)));
    let hedged = RetryLayer::new().policy(hedging).layer(server.clone());
    let failing = Server::new(Act::Answer(200, 503), Act::Answer(1_000, 200));
    let retried = RetryLayer::new()
        .policy(retrying(&budget))
        .layer(failing.clone());
    // Two hedged requests take both places at 100 ms; a retry at 200 ms finds none.
    let (a, b, c) = tokio::join!(
        send(&hedged, "http://api.test/"),
        send(&hedged, "http://api.test/"),
        send(&retried, "http://api.test/"),
    );
    for hedged in [a, b] {
        let hedged = hedged.unwrap();
        assert_eq!(
            hedged.extensions().get::<RetryInfo>().unwrap().attempts(),
            2
        );
    }
    let refused = c.unwrap();
    let info = refused.extensions().get::<RetryInfo>().unwrap();
    assert_eq!(
        (refused.status().as_u16(), info.attempts(), info.stop()),
        (503, 1, StopReason::BudgetExhausted)
    );
    assert_eq!((server.later(), failing.later()), (2, 0));
    assert_eq!(in_flight(&budget), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn a_refused_retry_returns_the_last_response_as_it_came() {
    let budget = budget(0.0, 1);
    let slow = Server::new(Act::Answer(10, 502), Act::Answer(1_000, 200));
    let taker = RetryLayer::new().policy(retrying(&budget)).layer(slow);
    let server = Server::new(Act::Answer(20, 503), Act::Answer(0, 200));
    let client = RetryLayer::new()
        .policy(retrying(&budget))
        .layer(server.clone());
    // The first request's retry holds the one place when the second fails.
    let (taken, refused) = tokio::join!(
        send(&taker, "http://api.test/"),
        send(&client, "http://api.test/")
    );
    assert_eq!(taken.unwrap().status(), 200);
    let refused = refused.unwrap();
    assert_eq!(refused.status(), 503);
    assert_eq!(refused.headers()["x-attempt"], "first");
    let info = refused.extensions().get::<RetryInfo>().unwrap();
    assert_eq!(
        (info.attempts(), info.stop()),
        (1, StopReason::BudgetExhausted)
    );
    assert_eq!((server.firsts(), server.later()), (1, 0));
    // Once the place is free, the same failure is retried.
    let retried = send(&client, "http://api.test/").await.unwrap();
    assert_eq!(retried.headers()["x-attempt"], "retry");
}

#[tokio::test(start_paused = true)]
async fn kept_per_authority_each_server_counts_its_own() {
    let budget = ConcurrencyBudget::builder()
        .ratio(0.0)
        .min_in_flight(1)
        .per_authority()
        .build();
    let server = Server::new(Act::Answer(10, 503), Act::Answer(1_000, 200));
    let client = RetryLayer::new()
        .policy(retrying(&budget))
        .layer(server.clone());
    let a: http::Uri = "http://a.test/".parse().unwrap();
    let b: http::Uri = "http://b.test/".parse().unwrap();
    let mut first_a = Box::pin(send(&client, "http://a.test/"));
    // Its retry is in flight at 500 ms.
    assert!(
        tokio::time::timeout(Duration::from_millis(500), &mut first_a)
            .await
            .is_err()
    );
    assert_eq!(in_flight(&budget.partition(&a)), (1, 1));
    assert_eq!(in_flight(&budget.partition(&b)), (0, 0));
    assert_eq!(
        in_flight(&budget),
        (0, 0),
        "the gate's own state, for no authority"
    );
    // b.test has its own place; a.test's second request finds its server's taken.
    let (other_a, only_b) = tokio::join!(
        send(&client, "http://a.test/"),
        send(&client, "http://b.test/")
    );
    let info = |r: &Response<Full<Bytes>>| {
        let info = r.extensions().get::<RetryInfo>().unwrap();
        (r.status().as_u16(), info.attempts(), info.stop())
    };
    assert_eq!(
        info(&other_a.unwrap()),
        (503, 1, StopReason::BudgetExhausted)
    );
    assert_eq!(info(&only_b.unwrap()), (200, 2, StopReason::Final));
    assert_eq!(first_a.await.unwrap().status(), 200);
    assert_eq!(in_flight(&budget.partition(&a)), (0, 0));
    assert_eq!(in_flight(&budget.partition(&b)), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn beside_a_token_budget_a_refusal_gives_the_budget_s_token_back() {
    let concurrency = budget(0.0, 1);
    let tokens = RetryBudget::builder()
        .ratio(0.0)
        .min_per_sec(0.0)
        .max_tokens(5.0)
        .build();
    let server = Server::new(Act::Answer(10, 503), Act::Answer(1_000, 200));
    let client = RetryLayer::new()
        .policy(retrying(&concurrency).gate(tokens.clone()))
        .layer(server.clone());
    let answers = burst(&client, 3, "http://api.test/").await;
    // One retry went, and took one token; the two the concurrency budget refused had their
    // tokens taken by the token budget first, and given back.
    assert_eq!(count(&answers, (200, 2, StopReason::Final)), 1);
    assert_eq!(count(&answers, (503, 1, StopReason::BudgetExhausted)), 2);
    assert_eq!(tokens.tokens(), 4.0);
    assert_eq!(server.later(), 1);
    // The token budget empty, it refuses first: the concurrency budget takes nothing.
    let empty = RetryBudget::builder()
        .ratio(0.0)
        .min_per_sec(0.0)
        .max_tokens(1.0)
        .build();
    let drained = RetryLayer::new()
        .policy(retrying(&concurrency).gate(empty.clone()))
        .layer(server.clone());
    let answers = burst(&drained, 2, "http://api.test/").await;
    assert_eq!(count(&answers, (200, 2, StopReason::Final)), 1);
    assert_eq!(count(&answers, (503, 1, StopReason::BudgetExhausted)), 1);
    assert_eq!(empty.tokens(), 0.0);
    assert_eq!(in_flight(&concurrency), (0, 0));
}

/// Runs `future` for `ms` milliseconds of paused time, then drops it.
async fn drop_after<F: Future + Unpin>(future: F, ms: u64) {
    let ended = tokio::time::timeout(Duration::from_millis(ms), future).await;
    assert!(ended.is_err(), "the request ended before it was dropped");
}

#[tokio::test(start_paused = true)]
async fn a_request_dropped_in_any_state_leaves_nothing_counted() {
    let budget = budget(0.2, 3);
    let server = Server::new(Act::Answer(10, 503), Act::Answer(1_000, 200));
    // Dropped with its retry in flight.
    let client = RetryLayer::new()
        .policy(retrying(&budget))
        .layer(server.clone());
    let mut request = Box::pin(send(&client, "http://api.test/"));
    drop_after(&mut request, 500).await;
    assert_eq!(in_flight(&budget), (1, 1));
    drop(request);
    assert_eq!(in_flight(&budget), (0, 0));
    // Dropped during the backoff: the retry was admitted (it counts from then, as in Envoy)
    // and never sent.
    let waiting = retrying(&budget).backoff(
        Backoff::exponential(Duration::from_secs(1), Duration::from_secs(1)).jitter(Jitter::None),
    );
    let client = RetryLayer::new().policy(waiting).layer(server.clone());
    let mut request = Box::pin(send(&client, "http://api.test/"));
    drop_after(&mut request, 500).await;
    assert_eq!(in_flight(&budget), (1, 1));
    drop(request);
    assert_eq!(in_flight(&budget), (0, 0));
    // Dropped with a hedge in flight beside its first attempt.
    let slow = Server::new(Act::Answer(1_000, 200), Act::Answer(1_000, 200));
    let hedging = retrying(&budget).hedge(Hedging::after(Duration::from_millis(100)));
    let client = RetryLayer::new().policy(hedging).layer(slow.clone());
    let mut request = Box::pin(send(&client, "http://api.test/"));
    drop_after(&mut request, 500).await;
    assert_eq!((in_flight(&budget), slow.later()), ((1, 1), 1));
    drop(request);
    assert_eq!(in_flight(&budget), (0, 0));
    // Each time the retry was counted by the server only when sent.
    assert_eq!(server.later(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_retry_whose_service_never_gets_ready_gives_its_place_back() {
    let budget = budget(0.0, 1);
    let mut server = Server::new(Act::Answer(10, 503), Act::Answer(0, 200));
    server.stall = true;
    let client = RetryLayer::new()
        .policy(retrying(&budget).attempt_timeout(Duration::from_millis(200)))
        .layer(server.clone());
    let error = send(&client, "http://api.test/").await.unwrap_err();
    let error = error
        .downcast_ref::<RetryError>()
        .expect("the layer's error");
    assert!(
        error.get_ref().is::<ServiceNotReady>(),
        "{}",
        error.get_ref()
    );
    assert_eq!(error.info().stop(), StopReason::ServiceNotReady);
    assert_eq!((server.firsts(), server.later()), (1, 0));
    assert_eq!(in_flight(&budget), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn a_panic_in_the_server_leaves_nothing_counted() {
    let budget = budget(0.2, 3);
    for later in [Act::PanicInFuture, Act::PanicInCall] {
        let server = Server::new(Act::Answer(10, 503), later);
        let client = RetryLayer::new()
            .policy(retrying(&budget))
            .layer(server.clone());
        let task = tokio::spawn(async move { send(&client, "http://api.test/").await });
        let ended = task.await.expect_err("the task panicked");
        assert!(ended.is_panic(), "{later:?}");
        assert_eq!(in_flight(&budget), (0, 0), "{later:?}");
        assert_eq!(server.later(), 1);
    }
}

/// Against a hyper server on 127.0.0.1, in real time: 10 requests at once, each first
/// attempt answered 503, each retry held for a second by the server. With a place for 2,
/// the server never holds more than 2 retries, and every request gets either its retry's
/// 200 or its own 503 back, refused.
#[tokio::test]
async fn against_a_real_server_it_never_holds_more_retries_than_the_places() {
    use std::collections::HashSet;
    use std::sync::Mutex;

    let seen: Arc<Mutex<HashSet<String>>> = Arc::default();
    let tally: Arc<Tally> = Arc::default();
    let server = {
        let (seen, tally) = (Arc::clone(&seen), Arc::clone(&tally));
        common::server::serve(move |hit| {
            let first = seen.lock().unwrap().insert(hit.path.clone());
            let tally = Arc::clone(&tally);
            async move {
                if first {
                    return common::server::respond(503);
                }
                tally.later.fetch_add(1, Ordering::SeqCst);
                let now = tally.in_hand.fetch_add(1, Ordering::SeqCst) + 1;
                tally.peak.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_secs(1)).await;
                tally.in_hand.fetch_sub(1, Ordering::SeqCst);
                common::server::respond(200)
            }
        })
        .await
    };
    let budget = budget(0.0, 2);
    let client = RetryLayer::new()
        .policy(retrying(&budget))
        .layer(common::server::client());
    let answers = join_all((0..10).map(|i| {
        let request = get(&server.url(&format!("/items/{i}")));
        ServiceExt::oneshot(client.clone(), request)
    }))
    .await;
    let mut refused = 0;
    for answer in answers {
        let response = answer.unwrap();
        let info = response.extensions().get::<RetryInfo>().unwrap();
        match (response.status().as_u16(), info.attempts(), info.stop()) {
            (200, 2, StopReason::Final) => {}
            (503, 1, StopReason::BudgetExhausted) => refused += 1,
            other => panic!("unexpected answer {other:?}"),
        }
    }
    let retried = tally.later.load(Ordering::SeqCst);
    assert_eq!(retried + refused, 10);
    assert!(tally.peak.load(Ordering::SeqCst) <= 2);
    assert!(
        refused >= 1,
        "no retry was refused: the server held them one at a time"
    );
    assert_eq!(in_flight(&budget), (0, 0));
}
