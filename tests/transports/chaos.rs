//! Chaos: 2,000 logical requests (GET, PUT, and POST with keys stamped by the layer), 50
//! at a time, through a hyper-util client wrapped in the layer, against a hyper server on
//! 127.0.0.1 that injects faults on a seeded schedule:
//!
//! - 503 with `Retry-After: 0` (honoured) or `Retry-After: 1` (above `max_retry_after`, so
//!   the layer gives up at once and returns it);
//! - 429;
//! - the connection closed before any work was done;
//! - the connection closed *after* the work was done (a keyed POST is applied and stored,
//!   and the answer is lost: a retry with the same key must get the stored answer);
//! - answers slower than the attempt timeout (the work is done, the answer comes too late).
//!
//! The fault of an attempt depends only on the seed, the logical request and the attempt
//! number (sent by the layer in `retry-attempt`), not on timing. The server books every
//! attempt; at the end the test checks that every request ended, that each keyed POST was
//! applied exactly once, that no request had more than `max_attempts` attempts, that what
//! the caller got is exactly what the last attempt produced, and that retries stayed within
//! the budget's bound `C + r * requests + m * seconds`.
//!
//! Real time by nature, so every wait is short: an attempt timeout of 50 ms, backoff from
//! 2 ms to 20 ms, `max_retry_after` 500 ms. Every loop is bounded, and each request is
//! abandoned (and counted as a hang, which fails the test) after 10 s.
#![allow(clippy::disallowed_methods)] // tokio's paused clock and sleeps, or real time

use crate::common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use common::server::{Action, Hit, serve, serve_h2};
use http::{Method, Request, Response};
use http_body_util::{BodyExt, Full};
use tokio::time::Instant;
use tower::{Layer, ServiceExt};
use tower_http_retry::{
    AttemptTimedOut, Backoff, IdempotencyKey, Jitter, RetryBudget, RetryError, RetryInfo,
    RetryLayer, RetryPolicy, StopReason,
};

const SEED: u64 = 0x0C4A_05EE_D2E5_u64;
const REQUESTS: usize = 2_000;
const CONCURRENCY: usize = 50;
const MAX_ATTEMPTS: u32 = 4;
const ATTEMPT_TIMEOUT: Duration = Duration::from_millis(50);
const SLOW_ANSWER: Duration = Duration::from_millis(200);
const MAX_RETRY_AFTER: Duration = Duration::from_millis(500);
const MAX_REPLAY_BYTES: usize = 4_096;
/// Two layers share the traffic (even ids, odd ids), each with its own budget.
struct Lane {
    name: &'static str,
    ratio: f64,
    min_per_sec: u32,
    max_tokens: u32,
}

const LANES: [Lane; 2] = [
    // The defaults: under this much failure they must refuse retries.
    Lane {
        name: "default budget",
        ratio: 0.1,
        min_per_sec: 10,
        max_tokens: 100,
    },
    // Room for every retry: max_attempts and the stored answers do the limiting.
    Lane {
        name: "roomy budget",
        ratio: 1.0,
        min_per_sec: 100,
        max_tokens: 2_000,
    },
];

fn lane(id: u64) -> usize {
    (id % LANES.len() as u64) as usize
}

/// A request still running after this long counts as hung.
const HANG: Duration = Duration::from_secs(10);

/// SplitMix64: a tiny, well-mixed generator, so the schedule depends on nothing else.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Fault {
    None,
    /// 503 with `Retry-After: 0`.
    Unavailable,
    /// 503 with `Retry-After: 1`, above `max_retry_after`.
    UnavailableLong,
    /// 429.
    TooMany,
    /// The connection closed before any work.
    CloseBefore,
    /// The work done, then the connection closed without an answer.
    CloseAfter,
    /// The work done, the answer sent after the attempt timeout.
    Slow,
}

impl Fault {
    /// The fault for attempt `attempt` of logical request `id`.
    fn of(id: u64, attempt: u32) -> Self {
        match mix(SEED ^ mix(id) ^ (u64::from(attempt) << 56)) % 100 {
            0..55 => Fault::None,
            55..63 => Fault::Unavailable,
            63..66 => Fault::UnavailableLong,
            66..74 => Fault::TooMany,
            74..82 => Fault::CloseBefore,
            82..91 => Fault::CloseAfter,
            _ => Fault::Slow,
        }
    }

    fn does_the_work(self) -> bool {
        matches!(self, Fault::None | Fault::CloseAfter | Fault::Slow)
    }

    /// The status the caller sees when this fault was the last attempt's and it answered.
    fn status(self, method: &Method) -> Option<u16> {
        match self {
            Fault::None | Fault::Slow => Some(if method == Method::POST { 201 } else { 200 }),
            Fault::Unavailable | Fault::UnavailableLong => Some(503),
            Fault::TooMany => Some(429),
            Fault::CloseBefore | Fault::CloseAfter => None,
        }
    }
}

/// The method of logical request `id`, and its body.
fn plan(id: u64) -> (Method, Bytes) {
    let draw = mix(SEED.rotate_left(17) ^ id);
    let method = match draw % 10 {
        0..4 => Method::GET,
        4..7 => Method::PUT,
        _ => Method::POST,
    };
    if method == Method::GET {
        return (method, Bytes::new());
    }
    // One body in twenty is over the replay cap: sent once, never retried.
    let len = if (draw >> 8) % 20 == 0 {
        MAX_REPLAY_BYTES + 1_000
    } else {
        16 + (draw >> 16) as usize % 2_048
    };
    let mut body = format!("{method} {id} ").into_bytes();
    body.extend((0..len).map(|i| b'a' + ((id as usize + i) % 26) as u8));
    (method, Bytes::from(body))
}

/// One attempt as the server booked it.
#[derive(Debug, Clone)]
struct Booked {
    attempt: u32,
    fault: Fault,
    key: Option<String>,
}

/// A keyed POST's record on the server.
#[derive(Debug, Clone)]
struct Order {
    id: u64,
    number: u64,
    applied: u32,
    replayed: u32,
}

/// The server's books.
#[derive(Default)]
struct Books {
    attempts: HashMap<u64, Vec<Booked>>,
    orders: HashMap<String, Order>,
    next_order: u64,
    puts: HashMap<u64, u32>,
    faults: BTreeMap<Fault, usize>,
    /// Things that must never happen, described.
    anomalies: Vec<String>,
}

impl Books {
    /// Books one attempt and decides what the server does.
    fn handle(&mut self, hit: &Hit) -> (Fault, Option<Response<Full<Bytes>>>) {
        let mut anomaly = |text: String| self.anomalies.push(text);
        let Some(id) = hit
            .path
            .rsplit('/')
            .next()
            .and_then(|id| id.parse::<u64>().ok())
        else {
            anomaly(format!("unexpected path {}", hit.path));
            return (Fault::CloseBefore, None);
        };
        let attempt = hit
            .headers
            .get("retry-attempt")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u32>().ok());
        let Some(attempt) = attempt else {
            anomaly(format!("request {id}: no valid retry-attempt header"));
            return (Fault::CloseBefore, None);
        };
        let key = hit
            .headers
            .get("idempotency-key")
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
        let (method, body) = plan(id);
        if hit.method != method {
            anomaly(format!("request {id}: {} instead of {method}", hit.method));
        }
        if hit.body != body {
            anomaly(format!(
                "request {id} attempt {attempt}: a body of {} bytes instead of the {} sent first",
                hit.body.len(),
                body.len()
            ));
        }
        match (&key, method == Method::POST) {
            (None, true) => anomaly(format!("request {id}: a POST without a key")),
            (Some(_), false) => anomaly(format!("request {id}: a key on a {method}")),
            _ => {}
        }

        let fault = Fault::of(id, attempt);
        *self.faults.entry(fault).or_default() += 1;
        self.attempts.entry(id).or_default().push(Booked {
            attempt,
            fault,
            key: key.clone(),
        });
        let status = |code: u16, body: String| {
            Response::builder()
                .status(code)
                .body(Full::new(Bytes::from(body)))
                .expect("a response")
        };
        let response = match fault {
            Fault::Unavailable | Fault::UnavailableLong => {
                let after = if fault == Fault::Unavailable {
                    "0"
                } else {
                    "1"
                };
                let mut response = status(503, "busy".into());
                response
                    .headers_mut()
                    .insert("retry-after", after.parse().expect("a header value"));
                Some(response)
            }
            Fault::TooMany => Some(status(429, "slow down".into())),
            Fault::CloseBefore => None,
            Fault::None | Fault::CloseAfter | Fault::Slow => {
                debug_assert!(fault.does_the_work());
                let answer = if method == Method::POST {
                    let key = key.unwrap_or_default();
                    let next = self.next_order;
                    let order = self.orders.entry(key).or_insert_with(|| Order {
                        id,
                        number: next,
                        applied: 0,
                        replayed: 0,
                    });
                    if order.applied == 0 {
                        order.applied = 1;
                        self.next_order += 1;
                    } else {
                        // The stored outcome, not a second application.
                        order.replayed += 1;
                    }
                    if order.id != id {
                        let other = order.id;
                        self.anomalies
                            .push(format!("requests {other} and {id} share a key"));
                    }
                    status(201, format!("order {}", order.number))
                } else if method == Method::PUT {
                    *self.puts.entry(id).or_default() += 1;
                    status(200, format!("stored {id}"))
                } else {
                    status(200, format!("item {id}"))
                };
                Some(answer)
            }
        };
        (fault, response)
    }
}

/// What the caller got for one logical request.
#[derive(Debug)]
enum Outcome {
    Response {
        status: u16,
        info: RetryInfo,
        body: Bytes,
    },
    Error {
        timed_out: bool,
        closed: bool,
        /// Attempts sent, from the error's record (0 when it has none).
        attempts: u32,
        text: String,
    },
    Hung,
}

async fn send<S>(service: S, url: String, id: u64) -> Outcome
where
    S: tower::Service<
            Request<Full<Bytes>>,
            Response = Response<hyper::body::Incoming>,
            Error = tower::BoxError,
        >,
{
    let (method, body) = plan(id);
    let request = Request::builder()
        .method(method)
        .uri(url)
        .body(Full::new(body))
        .expect("a request");
    let exchange = async {
        match service.oneshot(request).await {
            Ok(response) => {
                let status = response.status().as_u16();
                let info = response.extensions().get::<RetryInfo>().cloned();
                let body = response.into_body().collect().await.map(|b| b.to_bytes());
                match (info, body) {
                    (Some(info), Ok(body)) => Outcome::Response { status, info, body },
                    (None, _) => Outcome::Error {
                        timed_out: false,
                        closed: false,
                        attempts: 0,
                        text: "a response without RetryInfo".into(),
                    },
                    (_, Err(error)) => Outcome::Error {
                        timed_out: false,
                        closed: false,
                        attempts: 0,
                        text: format!("reading the body: {error}"),
                    },
                }
            }
            Err(error) => Outcome::Error {
                timed_out: common::last(&error).is::<AttemptTimedOut>(),
                closed: common::last(&error).is::<hyper_util::client::legacy::Error>(),
                attempts: error
                    .downcast_ref::<RetryError>()
                    .map_or(0, |error| error.info().attempts()),
                text: error.to_string(),
            },
        }
    };
    tokio::time::timeout(HANG, exchange)
        .await
        .unwrap_or(Outcome::Hung)
}

#[derive(Debug, Default)]
struct LaneTally {
    requests: usize,
    responses: usize,
    errors: usize,
    retries: u64,
    budget_refusals: usize,
    stops: BTreeMap<&'static str, usize>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_two_thousand_requests_against_a_faulty_server() {
    chaos(false).await;
}

/// The same over HTTP/2, every request multiplexed on one connection; "closing the
/// connection" is the server resetting the request's stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_two_thousand_requests_against_a_faulty_server_over_http2() {
    chaos(true).await;
}

async fn chaos(h2: bool) {
    let books = Arc::new(Mutex::new(Books::default()));
    let server = {
        let books = Arc::clone(&books);
        let handler = move |hit: Hit| {
            let books = Arc::clone(&books);
            async move {
                let (fault, response) = books.lock().unwrap().handle(&hit);
                if fault == Fault::Slow {
                    tokio::time::sleep(SLOW_ANSWER).await;
                }
                match response {
                    Some(response) if fault != Fault::CloseAfter => Action::Respond(response),
                    _ => Action::Close,
                }
            }
        };
        if h2 {
            serve_h2(handler).await
        } else {
            serve(handler).await
        }
    };
    assert!(server.addr.ip().is_loopback());

    let client = if h2 {
        common::server::client_h2()
    } else {
        common::server::client()
    };
    let services: Vec<_> = LANES
        .iter()
        .map(|lane| {
            // The chaos server de-duplicates its POSTs on the key: keys on.
            RetryLayer::new()
                .policy(
                    RetryPolicy::default()
                        .idempotency_key(IdempotencyKey::default())
                        .max_attempts(MAX_ATTEMPTS)
                        .attempt_timeout(ATTEMPT_TIMEOUT)
                        .max_retry_after(MAX_RETRY_AFTER)
                        .backoff(
                            Backoff::exponential(
                                Duration::from_millis(2),
                                Duration::from_millis(20),
                            )
                            .jitter(Jitter::Full),
                        )
                        .rng_seed(SEED)
                        .gate(
                            RetryBudget::builder()
                                .ratio(lane.ratio)
                                .min_per_sec(f64::from(lane.min_per_sec))
                                .max_tokens(f64::from(lane.max_tokens))
                                .build(),
                        ),
                )
                .max_replay_bytes(MAX_REPLAY_BYTES)
                .attempt_header(http::HeaderName::from_static("retry-attempt"))
                .layer(client.clone())
        })
        .collect();

    let started = Instant::now();
    let next = Arc::new(AtomicUsize::new(0));
    let mut workers = Vec::with_capacity(CONCURRENCY);
    for _ in 0..CONCURRENCY {
        let (services, next) = (services.clone(), Arc::clone(&next));
        let base = server.url("");
        workers.push(tokio::spawn(async move {
            let mut outcomes = Vec::new();
            // Bounded: each turn takes a fresh index, and there are REQUESTS of them.
            for _ in 0..REQUESTS {
                let id = next.fetch_add(1, Ordering::SeqCst);
                if id >= REQUESTS {
                    break;
                }
                let id = id as u64;
                let (method, _) = plan(id);
                let url = format!("{base}/{}/{id}", method.as_str().to_lowercase());
                let service = services[lane(id)].clone();
                outcomes.push((id, send(service, url, id).await));
            }
            outcomes
        }));
    }
    let mut outcomes = BTreeMap::new();
    for worker in workers {
        outcomes.extend(worker.await.expect("a worker panicked"));
    }
    let elapsed = started.elapsed();
    // An abandoned attempt may still be on the wire; it is booked when it arrives. Give
    // such stragglers a moment so that the books are complete.
    tokio::time::sleep(SLOW_ANSWER + Duration::from_millis(100)).await;
    let books = books.lock().unwrap();

    // ---- every request ended, and the server saw nothing that must never happen ----
    assert_eq!(outcomes.len(), REQUESTS, "every request has an outcome");
    let hung: Vec<_> = outcomes
        .iter()
        .filter(|(_, o)| matches!(o, Outcome::Hung))
        .map(|(id, _)| id)
        .collect();
    assert!(hung.is_empty(), "still running after {HANG:?}: {hung:?}");
    assert!(
        books.anomalies.is_empty(),
        "{} anomalies, first ones: {:#?}",
        books.anomalies.len(),
        &books.anomalies[..books.anomalies.len().min(10)]
    );

    // ---- attempts per logical request, as the server saw them ----
    let seen = |id: u64| books.attempts.get(&id).map_or(&[][..], Vec::as_slice);
    for id in 0..REQUESTS as u64 {
        let booked = seen(id);
        assert!(
            booked.len() <= MAX_ATTEMPTS as usize,
            "request {id}: the server saw {} attempts",
            booked.len()
        );
        let numbers: HashSet<u32> = booked.iter().map(|b| b.attempt).collect();
        assert_eq!(numbers.len(), booked.len(), "request {id}: {booked:?}");
        assert!(
            numbers.iter().all(|n| (1..=MAX_ATTEMPTS).contains(n)),
            "request {id}: attempt numbers {numbers:?}"
        );
        if plan(id).1.len() > MAX_REPLAY_BYTES {
            assert!(
                booked.len() <= 1,
                "request {id}: a body over the cap was sent again"
            );
        }
    }

    // ---- keyed POSTs: one key per logical request, applied exactly once ----
    let mut keys_by_id: HashMap<u64, String> = HashMap::new();
    for (&id, booked) in &books.attempts {
        if plan(id).0 != Method::POST {
            continue;
        }
        let keys: HashSet<&String> = booked.iter().filter_map(|b| b.key.as_ref()).collect();
        assert_eq!(
            keys.len(),
            1,
            "request {id}: every attempt carries one same key"
        );
        keys_by_id.insert(id, keys.into_iter().next().cloned().expect("one key"));
    }
    let distinct: HashSet<&String> = keys_by_id.values().collect();
    assert_eq!(distinct.len(), keys_by_id.len(), "two POSTs shared a key");
    for (key, order) in &books.orders {
        assert_eq!(
            order.applied, 1,
            "key {key} (request {}) applied {} times",
            order.id, order.applied
        );
    }
    let stored_answers: u32 = books.orders.values().map(|o| o.replayed).sum();

    // ---- what the caller got is what the last attempt produced ----
    let mut tallies: Vec<LaneTally> = LANES.iter().map(|_| LaneTally::default()).collect();
    let (mut lost_in_transit, mut late_answers, mut never_arrived) = (0, 0, 0);
    for (&id, outcome) in &outcomes {
        let (method, body_sent) = plan(id);
        let over_cap = body_sent.len() > MAX_REPLAY_BYTES;
        let booked = seen(id);
        let last = booked.iter().max_by_key(|b| b.attempt);
        let tally = &mut tallies[lane(id)];
        tally.requests += 1;
        match outcome {
            Outcome::Response { status, info, body } => {
                tally.responses += 1;
                *tally.stops.entry(info.stop().as_str()).or_default() += 1;
                tally.budget_refusals += usize::from(info.stop() == StopReason::BudgetExhausted);
                assert!(
                    (1..=MAX_ATTEMPTS).contains(&info.attempts()),
                    "request {id}: {info:?}"
                );
                assert_eq!(
                    info.retries().len() as u32,
                    info.attempts() - 1,
                    "request {id}: {info:?}"
                );
                assert!(
                    booked.len() <= info.attempts() as usize,
                    "request {id}: the server saw more attempts than RetryInfo counts"
                );
                lost_in_transit += info.attempts() as usize - booked.len();
                tally.retries += u64::from(info.attempts() - 1);
                let last = booked
                    .iter()
                    .find(|b| b.attempt == info.attempts())
                    .unwrap_or_else(|| panic!("request {id}: the answering attempt is unbooked"));
                assert_eq!(
                    Some(*status),
                    last.fault.status(&method),
                    "request {id}: the caller got {status} after a last attempt with {:?}",
                    last.fault
                );
                if matches!(*status, 200 | 201) {
                    assert_eq!(info.stop(), StopReason::Final, "request {id}");
                } else {
                    // A retryable answer was returned: each reason that applies is a right
                    // one to stop for; the budget is asked only when none does.
                    let mut reasons = Vec::new();
                    if info.attempts() == MAX_ATTEMPTS {
                        reasons.push(StopReason::MaxAttempts);
                    }
                    if over_cap {
                        reasons.push(StopReason::BodyNotReplayable);
                    }
                    if last.fault == Fault::UnavailableLong {
                        reasons.push(StopReason::HintTooLong);
                    }
                    if reasons.is_empty() {
                        reasons.push(StopReason::BudgetExhausted);
                        assert_eq!(
                            info.stop(),
                            StopReason::BudgetExhausted,
                            "request {id}: {info:?}"
                        );
                    }
                    assert!(
                        reasons.contains(&info.stop()),
                        "request {id}: stopped for {:?}, expected one of {reasons:?}: {info:?}",
                        info.stop()
                    );
                }
                if method == Method::POST && *status == 201 {
                    let order = &books.orders[&keys_by_id[&id]];
                    assert_eq!(
                        body,
                        &Bytes::from(format!("order {}", order.number)),
                        "request {id}: the answer is the one stored with the key"
                    );
                }
            }
            Outcome::Error {
                timed_out,
                closed,
                attempts,
                text,
            } => {
                tally.errors += 1;
                assert!(
                    *timed_out || *closed,
                    "request {id}: an error the layer should not return: {text}"
                );
                assert!(
                    (1..=MAX_ATTEMPTS).contains(attempts) && booked.len() <= *attempts as usize,
                    "request {id}: {attempts} attempts in the record, {} seen: {text}",
                    booked.len()
                );
                lost_in_transit += *attempts as usize - booked.len();
                let Some(last) = last else {
                    // No attempt reached the server: each timed out before the server read
                    // it, or lost its connection to another request's fault.
                    never_arrived += 1;
                    continue;
                };
                // The error is the last attempt's own failure, passed through. A timeout can
                // follow any fault (an answer may miss 50 ms on a loaded machine), but a
                // closed connection only comes from the server closing it: on this
                // attempt's fault, or, when the server never read this attempt, on another
                // request's fault on the same connection (HTTP/2 shares one among many
                // streams; an HTTP/1 client may pick a connection the server has just
                // closed).
                let last_reached = last.attempt == *attempts;
                if *closed && last_reached {
                    assert!(
                        matches!(last.fault, Fault::CloseBefore | Fault::CloseAfter),
                        "request {id}: {text:?} after a last attempt with {:?}: {booked:?}",
                        last.fault
                    );
                } else if *timed_out && last.fault != Fault::Slow {
                    late_answers += 1;
                }
                tally.retries += u64::from(*attempts - 1);
            }
            Outcome::Hung => unreachable!("checked above"),
        }
    }

    // ---- each budget's bound: C + r * requests + m * seconds ----
    let secs = elapsed.as_secs_f64().ceil();
    let attempts_seen: usize = books.attempts.values().map(Vec::len).sum();
    let http = if h2 { "HTTP/2" } else { "HTTP/1" };
    println!(
        "chaos {http}: {REQUESTS} requests, {CONCURRENCY} at a time, in {elapsed:?}; \
         {attempts_seen} attempts seen by the server; faults {:?}; \
         {} POSTs applied once each, {stored_answers} retries answered from the store; \
         {lost_in_transit} attempts never reached the server, {never_arrived} requests \
         never did; {late_answers} final timeouts of answers not meant to be slow",
        books.faults,
        books.orders.len(),
    );
    for (lane, tally) in LANES.iter().zip(&tallies) {
        let bound = f64::from(lane.max_tokens)
            + lane.ratio * tally.requests as f64
            + f64::from(lane.min_per_sec) * secs;
        println!("chaos {http}: {} (bound {bound}): {tally:?}", lane.name);
        assert!(
            tally.retries as f64 <= bound,
            "{}: {} retries over the bound {bound}",
            lane.name,
            tally.retries
        );
    }

    // ---- the chaos did happen: every fault, and each path under test, many times ----
    for fault in [
        Fault::Unavailable,
        Fault::UnavailableLong,
        Fault::TooMany,
        Fault::CloseBefore,
        Fault::CloseAfter,
        Fault::Slow,
    ] {
        let count = books.faults.get(&fault).copied().unwrap_or(0);
        assert!(count >= 20, "{fault:?} injected only {count} times");
    }
    assert!(
        tallies[0].budget_refusals >= 10,
        "the default budget never bound: {:?}",
        tallies[0]
    );
    let max_attempts = tallies[1].stops.get("max_attempts").copied().unwrap_or(0);
    assert!(
        max_attempts >= 5,
        "max_attempts rarely reached: {:?}",
        tallies[1]
    );
    assert!(
        stored_answers >= 20,
        "only {stored_answers} retries were answered from the store"
    );
    assert!(elapsed < Duration::from_secs(60), "took {elapsed:?}");
}
