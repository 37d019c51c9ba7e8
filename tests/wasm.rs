//! The layer on `wasm32-unknown-unknown`, run in Node by wasm-bindgen's test runner
//! (TESTING.md, "wasm32"): the rules that need no socket, on JavaScript's clocks and timers.
//! There std's `Instant::now` and `SystemTime::now` panic, so every test here fails on a
//! layer that reads them: the default timer (the `wasm` feature: `performance.now()`,
//! `Date.now()`, `setTimeout`), the gates' default clock, getrandom's JavaScript backend
//! (jitter and keys), and `ManualClock`, whose instants are web-time's there.
//!
//! The inner service is a `service_fn` that answers from a script. The tests on the default
//! timer wait for real (JavaScript timers, a few milliseconds each, and one wait under a
//! second for an HTTP-date, whose resolution is a second); the others move a `ManualClock`
//! by hand. Empty on every other target.

#![cfg(all(target_arch = "wasm32", target_os = "unknown"))]

use std::convert::Infallible;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use tower::{Layer, ServiceExt};
use tower_http_retry::classify::RetryReason;
use tower_http_retry::hints::HintSource;
use tower_http_retry::{
    AttemptOutcome, Backoff, Hedging, IdempotencyKey, Jitter, ManualClock, ReplayBody, RetryBudget,
    RetryInfo, RetryLayer, RetryPolicy, StopReason, Timer,
};
use wasm_bindgen_test::wasm_bindgen_test;
use web_time::Instant;

// `drive`: a future polled to its end on a `ManualClock` moved by hand.
#[path = "common/manual.rs"]
mod manual;
use manual::drive;

const MS: Duration = Duration::from_millis(1);

/// JavaScript's wall clock, read apart from the layer: `Date.now()`.
fn js_wall_now() -> SystemTime {
    // Whole milliseconds since the epoch, as a float.
    UNIX_EPOCH + Duration::from_millis(js_sys::Date::now() as u64)
}

/// Header names and values.
type HeaderList = Vec<(&'static str, String)>;

/// The headers of an answer, made from the wall time when it is sent.
type Headers = fn(SystemTime) -> HeaderList;

/// What the script's service answers.
type Answer = Result<Response<Full<Bytes>>, Infallible>;

fn none(_: SystemTime) -> HeaderList {
    Vec::new()
}

/// A scripted server: the n-th call answers `steps[n]` (the last step for every call after
/// it), after a wait on `clock` when it has one and the step asks for it. Each call's
/// instant is recorded, the request's idempotency key, and the headers answered.
#[derive(Clone)]
struct Script {
    clock: Option<ManualClock>,
    steps: Arc<Vec<(Duration, u16, Headers)>>,
    calls: Arc<Mutex<Vec<Instant>>>,
    keys: Arc<Mutex<Vec<Option<String>>>>,
    answered: Arc<Mutex<Vec<HeaderList>>>,
    /// The wall clock the headers are made from: the manual clock's, else JavaScript's.
    wall: fn(&Script) -> SystemTime,
}

impl Script {
    fn new(steps: Vec<(Duration, u16, Headers)>) -> Self {
        Script {
            clock: None,
            steps: Arc::new(steps),
            calls: Arc::default(),
            keys: Arc::default(),
            answered: Arc::default(),
            wall: |_| js_wall_now(),
        }
    }

    fn on(mut self, clock: &ManualClock) -> Self {
        self.clock = Some(clock.clone());
        self.wall = |script| script.clock.as_ref().unwrap().wall_now();
        self
    }

    fn now(&self) -> Instant {
        match &self.clock {
            Some(clock) => clock.now(),
            None => web_time_now(),
        }
    }

    fn service(
        &self,
    ) -> impl tower::Service<
        Request<ReplayBody<Full<Bytes>>>,
        Response = Response<Full<Bytes>>,
        Error = Infallible,
        Future = impl Future<Output = Answer>,
    > + Clone
    + 'static {
        let script = self.clone();
        tower::service_fn(move |request: Request<ReplayBody<Full<Bytes>>>| {
            let script = script.clone();
            async move {
                let now = script.now();
                let n = {
                    let mut calls = script.calls.lock().unwrap();
                    calls.push(now);
                    calls.len() - 1
                };
                script.keys.lock().unwrap().push(
                    request
                        .headers()
                        .get("idempotency-key")
                        .map(|key| key.to_str().unwrap().to_owned()),
                );
                let (wait, status, headers) = script.steps[n.min(script.steps.len() - 1)];
                if let (Some(clock), false) = (&script.clock, wait.is_zero()) {
                    clock.sleep_until(now + wait).await;
                }
                let mut response = Response::new(Full::new(Bytes::new()));
                *response.status_mut() = StatusCode::from_u16(status).unwrap();
                let headers = headers((script.wall)(&script));
                for (name, value) in &headers {
                    response.headers_mut().insert(*name, value.parse().unwrap());
                }
                script.answered.lock().unwrap().push(headers);
                Answer::Ok(response)
            }
        })
    }

    /// When each call came, in ms after `start`.
    fn calls_since(&self, start: Instant) -> Vec<u64> {
        let calls = self.calls.lock().unwrap();
        calls
            .iter()
            .map(|at| (*at - start).as_millis() as u64)
            .collect()
    }
}

/// web-time's monotonic clock (`performance.now()`), read apart from the layer.
#[allow(clippy::disallowed_methods)] // the test's own stopwatch
fn web_time_now() -> Instant {
    Instant::now()
}

fn get() -> Request<Full<Bytes>> {
    Request::get("http://h/x")
        .body(Full::new(Bytes::new()))
        .unwrap()
}

fn info(response: &Response<Full<Bytes>>) -> &RetryInfo {
    response.extensions().get::<RetryInfo>().unwrap()
}

#[wasm_bindgen_test]
async fn the_default_timer_waits_on_javascripts_clock_and_the_record_says_so() {
    // No timer given: the `wasm` feature's default, `setTimeout` and `performance.now()`.
    let script = Script::new(vec![(Duration::ZERO, 503, none)]);
    let layer = RetryLayer::new().policy(
        RetryPolicy::default()
            .max_attempts(5)
            .backoff(Backoff::exponential(2 * MS, 10 * MS).jitter(Jitter::None)),
    );
    let start = web_time_now();
    let response = layer.layer(script.service()).oneshot(get()).await.unwrap();
    let took = web_time_now() - start;
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    let info = info(&response);
    assert_eq!(info.attempts(), 5);
    assert_eq!(info.stop(), StopReason::MaxAttempts);
    // The waits grow and stop at the cap: 4, 8, 10, 10 ms.
    let waits: Vec<Duration> = info.retries().iter().map(|r| r.wait).collect();
    assert_eq!(waits, [4 * MS, 8 * MS, 10 * MS, 10 * MS]);
    for retry in info.retries() {
        assert_eq!(
            retry.reason,
            RetryReason::Status(StatusCode::SERVICE_UNAVAILABLE)
        );
        assert_eq!(
            retry.outcome,
            AttemptOutcome::Response(StatusCode::SERVICE_UNAVAILABLE)
        );
        assert_eq!(retry.hint, None);
    }
    assert_eq!(info.total_wait(), 32 * MS);
    // Each wait was slept on JavaScript's timer: the calls are at least the waits apart.
    let calls = script.calls.lock().unwrap().clone();
    assert_eq!(calls.len(), 5);
    for (pair, wait) in calls.windows(2).zip(&waits) {
        assert!(
            pair[1] - pair[0] >= *wait,
            "{:?} < {wait:?}",
            pair[1] - pair[0]
        );
    }
    assert!(took >= 32 * MS, "{took:?}");
}

#[wasm_bindgen_test]
fn jittered_waits_stay_under_their_ceilings_and_keys_come_from_javascripts_generator() {
    // Full jitter from the operating system's generator, which is `crypto.getRandomValues`
    // here (getrandom's JavaScript backend); waits on a hand-moved clock.
    let clock = ManualClock::new();
    let backoff = Backoff::exponential(100 * MS, 400 * MS).jitter(Jitter::Full);
    let layer = RetryLayer::new().timer(clock.clone()).policy(
        RetryPolicy::default()
            .max_attempts(6)
            .backoff(backoff)
            .idempotency_key(IdempotencyKey::new()),
    );
    let mut all_waits = Vec::new();
    let mut keys = Vec::new();
    for _ in 0..4 {
        let script = Script::new(vec![(Duration::ZERO, 503, none)]).on(&clock);
        let request = Request::post("http://h/orders")
            .body(Full::new(Bytes::from_static(b"{}")))
            .unwrap();
        let (took, response) = drive(&clock, layer.layer(script.service()).oneshot(request));
        let response = response.unwrap();
        let info = info(&response);
        assert_eq!(info.attempts(), 6);
        let waits: Vec<Duration> = info.retries().iter().map(|r| r.wait).collect();
        for (n, wait) in (1..).zip(&waits) {
            assert!(*wait <= backoff.ceiling(n), "retry {n}: {wait:?}");
        }
        // Slept on the clock: the clock moved a millisecond at a time, so by at least
        // the waits, and at most a millisecond more for each.
        let total: Duration = waits.iter().sum();
        assert!(
            took >= total && took <= total + 6 * MS,
            "{took:?} for {total:?}"
        );
        all_waits.extend(waits);
        // One key for the request, the same on every attempt.
        let sent = script.keys.lock().unwrap().clone();
        assert_eq!(sent.len(), 6);
        assert!(sent.iter().all(|key| key == &sent[0]), "{sent:?}");
        let key = sent[0].clone().expect("a POST carries the key");
        assert_eq!(
            info.idempotency_key().map(|k| k.to_str().unwrap()),
            Some(key.as_str())
        );
        keys.push(key);
    }
    // 20 waits drawn at random, each up to 200 to 400 ms: not all at their ceilings, not
    // all the same (odds far below one in a billion either way).
    assert!(all_waits.iter().any(|w| *w < 200 * MS), "{all_waits:?}");
    assert!(
        all_waits.iter().any(|w| *w != all_waits[0]),
        "{all_waits:?}"
    );
    // Each request its own key.
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), 4);
}

#[wasm_bindgen_test]
async fn an_http_date_retry_after_is_measured_against_javascripts_wall_clock() {
    // The date is the first whole second at least 200 ms away on JavaScript's clock (an
    // HTTP-date has whole seconds), and the response has no `Date` header: the layer
    // measures it against its own wall clock, `Date.now()`, and waits until then, 200 ms to
    // 1.2 s (far above the 1 ms backoff).
    fn a_second_away(wall: SystemTime) -> HeaderList {
        let secs = (wall + 200 * MS)
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let date = UNIX_EPOCH + Duration::from_secs(secs + 1);
        vec![("retry-after", httpdate::fmt_http_date(date))]
    }
    let script = Script::new(vec![
        (Duration::ZERO, 503, a_second_away),
        (Duration::ZERO, 200, none),
    ]);
    let layer = RetryLayer::new().policy(
        RetryPolicy::default().backoff(Backoff::exponential(MS / 2, MS).jitter(Jitter::None)),
    );
    let wall_before = js_wall_now();
    let response = layer.layer(script.service()).oneshot(get()).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let info = info(&response);
    assert_eq!(info.attempts(), 2);
    let retry = info.retries()[0];
    assert_eq!(retry.hint, Some(HintSource::RetryAfter));
    // How far the date was from JavaScript's clock just before the request (the layer read
    // its clock a little later, so it may have found a little less).
    let date = httpdate::parse_http_date(&script.answered.lock().unwrap()[0][0].1).unwrap();
    let left = date.duration_since(wall_before).unwrap();
    assert!(left >= 200 * MS, "{left:?}");
    assert!(
        retry.wait <= left && retry.wait + 100 * MS >= left,
        "waited {:?}, {left:?} was left",
        retry.wait
    );
    // And it was slept: the second call came that long after the first.
    let calls = script.calls.lock().unwrap().clone();
    assert!(
        calls[1] - calls[0] >= retry.wait,
        "{:?}",
        calls[1] - calls[0]
    );
}

#[wasm_bindgen_test]
fn a_retry_budget_runs_out_on_javascripts_clock() {
    // Two retries saved up, nothing earned per request or per second: the budget's clock
    // is the default one (JavaScript's here), the layer's waits on a hand-moved clock.
    let budget = RetryBudget::builder()
        .ratio(0.0)
        .min_per_sec(0.0)
        .max_tokens(2.0)
        .build();
    let clock = ManualClock::new();
    let layer = RetryLayer::new().timer(clock.clone()).policy(
        RetryPolicy::default()
            .max_attempts(5)
            .backoff(Backoff::exponential(10 * MS, 100 * MS).jitter(Jitter::None))
            .gate(budget.clone()),
    );
    let script = Script::new(vec![(Duration::ZERO, 503, none)]).on(&clock);
    let (took, first) = drive(&clock, layer.layer(script.service()).oneshot(get()));
    let first = first.unwrap();
    assert_eq!(info(&first).attempts(), 3);
    assert_eq!(info(&first).stop(), StopReason::BudgetExhausted);
    // 20 ms and 40 ms of backoff before the two retries the budget granted.
    assert_eq!(took, 60 * MS);
    assert!(budget.tokens() < 1.0, "{}", budget.tokens());
    // The next request gets no retry at all.
    let (_, second) = drive(&clock, layer.layer(script.service()).oneshot(get()));
    let second = second.unwrap();
    assert_eq!(info(&second).attempts(), 1);
    assert_eq!(info(&second).stop(), StopReason::BudgetExhausted);
    assert_eq!(script.calls.lock().unwrap().len(), 4);
}

#[wasm_bindgen_test]
fn a_hedge_goes_after_its_delay_on_a_manual_clock() {
    let clock = ManualClock::new();
    // The first attempt is slow; the hedge sent 100 ms later answers 30 ms after that.
    let script = Script::new(vec![(1_000 * MS, 200, none), (30 * MS, 200, none)]).on(&clock);
    let layer = RetryLayer::new().timer(clock.clone()).policy(
        RetryPolicy::default()
            .max_attempts(3)
            .hedge(Hedging::after(100 * MS)),
    );
    let start = clock.now();
    let (took, response) = drive(&clock, layer.layer(script.service()).oneshot(get()));
    let response = response.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    // The third attempt would have gone at 200 ms: the hedge's answer came first.
    assert_eq!(script.calls_since(start), [0, 100]);
    assert_eq!(took, 130 * MS);
    let info = info(&response);
    assert_eq!(info.attempts(), 2);
    assert_eq!(info.returned(), Some(2));
}
