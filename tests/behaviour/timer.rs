//! The layer on a timer of the user's: a `ManualClock` moved by hand, with no tokio runtime
//! at all (tokio's sleep would panic outside one, so every wait here is the clock's). The
//! retry loop's waits, a hedge's timeline, and an HTTP-date `Retry-After` measured against
//! the clock's wall time.

use std::convert::Infallible;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use tower::{Layer, ServiceExt};
use tower_http_retry::{
    Backoff, Hedging, Jitter, ManualClock, ReplayBody, RetryInfo, RetryLayer, RetryPolicy, Timer,
};

use crate::common::manual::drive;

const MS: Duration = Duration::from_millis(1);

/// A scripted server: the n-th call waits `steps[n].0` on the clock, then answers
/// `steps[n].1` (with the headers `steps[n].2` makes from the clock's wall time); the
/// instant of each call is recorded.
#[derive(Clone)]
struct Script {
    clock: ManualClock,
    steps: Arc<Vec<(Duration, u16, Headers)>>,
    calls: Arc<Mutex<Vec<Instant>>>,
}

/// The headers of an answer, made from the clock's wall time.
type Headers = fn(SystemTime) -> Vec<(&'static str, String)>;

/// What the script's service answers.
type Answer = Result<Response<Full<Bytes>>, Infallible>;

fn none(_: SystemTime) -> Vec<(&'static str, String)> {
    Vec::new()
}

impl Script {
    fn service(
        &self,
    ) -> impl tower::Service<
        Request<ReplayBody<Full<Bytes>>>,
        Response = Response<Full<Bytes>>,
        Error = Infallible,
        Future = impl Future<Output = Answer> + Send,
    > + Clone
    + Send
    + 'static {
        let script = self.clone();
        tower::service_fn(move |_: Request<ReplayBody<Full<Bytes>>>| {
            let script = script.clone();
            async move {
                let now = script.clock.now();
                let n = {
                    let mut calls = script.calls.lock().unwrap();
                    calls.push(now);
                    calls.len() - 1
                };
                let (wait, status, headers) = script.steps[n];
                script.clock.sleep_until(now + wait).await;
                let mut response = Response::new(Full::new(Bytes::new()));
                *response.status_mut() = StatusCode::from_u16(status).unwrap();
                for (name, value) in headers(script.clock.wall_now()) {
                    response.headers_mut().insert(name, value.parse().unwrap());
                }
                Ok::<_, Infallible>(response)
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

fn get() -> Request<Full<Bytes>> {
    Request::get("http://h/x")
        .body(Full::new(Bytes::new()))
        .unwrap()
}

#[test]
fn the_retry_loop_waits_on_a_hand_moved_clock_without_a_runtime() {
    let clock = ManualClock::new();
    let script = Script {
        clock: clock.clone(),
        steps: Arc::new(vec![
            (MS * 5, 503, none),
            (MS * 5, 503, none),
            (MS * 5, 200, none),
        ]),
        calls: Arc::default(),
    };
    let layer = RetryLayer::new().timer(clock.clone()).policy(
        RetryPolicy::default()
            .max_attempts(3)
            .attempt_timeout(MS * 50)
            .backoff(Backoff::exponential(100 * MS, 10_000 * MS).jitter(Jitter::None)),
    );
    let start = clock.now();
    let (took, response) = drive(&clock, layer.layer(script.service()).oneshot(get()));
    let response = response.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    // 5 ms, 200 ms of backoff, 5 ms, 400 ms, 5 ms: every wait on the hand-moved clock.
    assert_eq!(script.calls_since(start), [0, 205, 610]);
    assert_eq!(took, 615 * MS);
    let info = response.extensions().get::<RetryInfo>().unwrap();
    let waits: Vec<Duration> = info.retries().iter().map(|r| r.wait).collect();
    assert_eq!(waits, [200 * MS, 400 * MS]);
    // The time with no attempt in flight, on the same clock: the two waits.
    assert_eq!(info.retry_delay(), 600 * MS);
}

#[test]
fn an_attempt_timeout_fires_on_the_hand_moved_clock() {
    let clock = ManualClock::new();
    let script = Script {
        clock: clock.clone(),
        // The first attempt would take 10 s: its 50 ms timeout ends it.
        steps: Arc::new(vec![(10_000 * MS, 200, none), (MS, 200, none)]),
        calls: Arc::default(),
    };
    let layer = RetryLayer::new().timer(clock.clone()).policy(
        RetryPolicy::default()
            .attempt_timeout(MS * 50)
            .backoff(Backoff::exponential(10 * MS, 10_000 * MS).jitter(Jitter::None)),
    );
    let start = clock.now();
    let (took, response) = drive(&clock, layer.layer(script.service()).oneshot(get()));
    assert_eq!(response.unwrap().status(), StatusCode::OK);
    // Timed out at 50 ms, then 20 ms of backoff.
    assert_eq!(script.calls_since(start), [0, 70]);
    assert_eq!(took, 71 * MS);
}

#[test]
fn a_hedge_goes_after_its_delay_on_the_hand_moved_clock() {
    let clock = ManualClock::new();
    let script = Script {
        clock: clock.clone(),
        // The first attempt is slow; the hedge sent 100 ms later answers 30 ms after that.
        steps: Arc::new(vec![(1_000 * MS, 200, none), (30 * MS, 200, none)]),
        calls: Arc::default(),
    };
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
    assert_eq!(
        response.extensions().get::<RetryInfo>().unwrap().attempts(),
        2
    );
}

#[test]
fn an_http_date_retry_after_is_measured_against_the_timers_wall_clock() {
    let clock = ManualClock::new();
    // The hand-moved wall clock starts at a fixed date, years from the machine's: a layer
    // that read the machine's clock would find this date long past and not wait for it.
    assert_eq!(
        clock.wall_now(),
        UNIX_EPOCH + Duration::from_secs(1_700_000_000)
    );
    fn three_seconds_on(wall: SystemTime) -> Vec<(&'static str, String)> {
        // No `Date` header: the date is measured against the client's (the timer's) clock.
        vec![(
            "retry-after",
            httpdate::fmt_http_date(wall + Duration::from_secs(3)),
        )]
    }
    let script = Script {
        clock: clock.clone(),
        steps: Arc::new(vec![(MS, 503, three_seconds_on), (MS, 200, none)]),
        calls: Arc::default(),
    };
    let layer = RetryLayer::new().timer(clock.clone()).policy(
        RetryPolicy::default()
            .backoff(Backoff::exponential(10 * MS, 10_000 * MS).jitter(Jitter::None)),
    );
    let start = clock.now();
    let (_, response) = drive(&clock, layer.layer(script.service()).oneshot(get()));
    assert_eq!(response.unwrap().status(), StatusCode::OK);
    // Answered at 1 ms on the clock; the date, in whole seconds, is 3 s after the clock's
    // start: 2 999 ms of wait, far above the 20 ms of backoff.
    assert_eq!(script.calls_since(start), [0, 3_000]);
}
