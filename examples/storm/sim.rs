//! The storm simulations, driving the real layer under paused time. Shared by the `storm`
//! example (which prints them) and `tests/storm.rs` (which checks their shape).

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::future::{Ready, ready};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tower::{Layer, Service, ServiceExt};
use tower_http_retry::{Backoff, Jitter, RetryBudget, RetryLayer, RetryPolicy};

/// Width of a time window, as in the figures the project grew from.
pub const WINDOW: Duration = Duration::from_millis(50);

/// Runs `future` on a current-thread runtime whose clock is paused: sleeps take no real
/// time, so thousands of clients and minutes of simulated traffic run in a moment.
pub fn paused<F: std::future::Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime")
        .block_on(future)
}

/// A service that is down: every call gets a 503 at once. It records when each call came and
/// which attempt it was (from the `retry-attempt` header, when the layer sends one).
#[derive(Clone)]
struct Outage {
    start: Instant,
    calls: Arc<Mutex<Vec<(u32, Duration)>>>,
}

impl Outage {
    fn new() -> Self {
        Self {
            start: Instant::now(),
            calls: Arc::default(),
        }
    }

    fn count(&self) -> usize {
        self.calls.lock().unwrap().len()
    }
}

impl<B> Service<Request<B>> for Outage {
    type Response = Response<()>;
    type Error = Infallible;
    type Future = Ready<Result<Response<()>, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let attempt = request
            .headers()
            .get("retry-attempt")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        self.calls
            .lock()
            .unwrap()
            .push((attempt, self.start.elapsed()));
        let mut response = Response::new(());
        *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
        ready(Ok(response))
    }
}

/// Calls per 50 ms window, for one retry round.
#[derive(Debug, Clone, Default)]
pub struct Round {
    pub windows: BTreeMap<u64, u32>,
}

impl Round {
    /// Windows with at least one call.
    pub fn occupied(&self) -> usize {
        self.windows.len()
    }

    /// The most calls in one window.
    pub fn peak(&self) -> u32 {
        self.windows.values().copied().max().unwrap_or(0)
    }
}

/// `clients` requests fail together at t = 0; each retries `retries` times with `jitter`
/// (base 100 ms, cap 10 s, no budget). Returns the calls per window of each retry round
/// (index 0 is retry 1).
pub async fn jitter_spread(jitter: Jitter, clients: usize, retries: u32, seed: u64) -> Vec<Round> {
    let outage = Outage::new();
    let layer = RetryLayer::new()
        .no_budget()
        .attempt_header("retry-attempt")
        .policy(
            RetryPolicy::default()
                .max_attempts(retries + 1)
                .backoff(
                    Backoff::exponential(Duration::from_millis(100), Duration::from_secs(10))
                        .jitter(jitter),
                )
                .rng_seed(seed),
        );
    let service = layer.layer(outage.clone());
    let mut clients_set = JoinSet::new();
    for _ in 0..clients {
        let service = service.clone();
        clients_set.spawn(async move {
            let request = Request::get("http://storm.test/")
                .body(http_body_util::Empty::<bytes::Bytes>::new());
            let _ = service.oneshot(request.expect("a valid request")).await;
        });
    }
    while clients_set.join_next().await.is_some() {}

    let mut rounds = vec![Round::default(); retries as usize];
    for &(attempt, at) in outage.calls.lock().unwrap().iter() {
        if attempt >= 2 {
            let window = (at.as_nanos() / WINDOW.as_nanos()) as u64;
            *rounds[attempt as usize - 2]
                .windows
                .entry(window)
                .or_default() += 1;
        }
    }
    rounds
}

/// Calls that reach the bottom per logical request during a total outage with sustained
/// traffic: `requests` logical requests, `per_second` of them each second, through
/// `layers` nested retrying layers (3 attempts each, default backoff), each with its own
/// default budget or none.
pub async fn amplification(layers: usize, budget: bool, requests: usize, per_second: u32) -> f64 {
    assert!(layers >= 1);
    let outage = Outage::new();
    let layer = |_| {
        let layer = RetryLayer::new().policy(RetryPolicy::default().max_attempts(3).rng_seed(7));
        if budget {
            layer.budget(RetryBudget::default())
        } else {
            layer.no_budget()
        }
    };
    // Each layer is a separate client library on the path: each has its own budget.
    macro_rules! run {
        ($service:expr) => {{
            let service = $service;
            let gap = Duration::from_secs(1) / per_second;
            let mut set = JoinSet::new();
            for _ in 0..requests {
                let service = service.clone();
                set.spawn(async move {
                    let request = Request::get("http://storm.test/")
                        .body(http_body_util::Empty::<bytes::Bytes>::new())
                        .expect("a valid request");
                    let _ = service.oneshot(request).await;
                });
                tokio::time::sleep(gap).await;
            }
            while set.join_next().await.is_some() {}
        }};
    }
    match layers {
        1 => run!(layer(0).layer(outage.clone())),
        2 => run!(layer(0).layer(layer(1).layer(outage.clone()))),
        3 => run!(layer(0).layer(layer(1).layer(layer(2).layer(outage.clone())))),
        _ => panic!("1 to 3 layers"),
    }
    outage.count() as f64 / requests as f64
}
