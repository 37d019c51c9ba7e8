//! The storm simulations, driving the real layer under paused time. Shared by the `storm`
//! example (which prints them) and `tests/behaviour/storm.rs` (which checks their shape).
#![allow(clippy::disallowed_methods)] // tokio's paused clock and sleeps, or real time

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::future::{Ready, ready};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use http::{HeaderName, Method, Request, Response, StatusCode};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tower::util::MapResponse;
use tower::{Layer, Service, ServiceExt};
use tower_http_retry::{
    Backoff, Hedging, Jitter, RetryBudget, RetryInfo, RetryLayer, RetryPolicy, RetryQuota,
    StopReason, Throttle,
};

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
        .attempt_header(HeaderName::from_static("retry-attempt"))
        .policy(
            RetryPolicy::new()
                .no_gates()
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
    let retries = match budget {
        true => Retries::DefaultBudget,
        false => Retries::AttemptsOnly,
    };
    amplification_of(layers, retries, requests, per_second).await
}

/// [`amplification`] for any row's retries (the hedged ones too).
pub async fn amplification_of(
    layers: usize,
    retries: Retries,
    requests: usize,
    per_second: u32,
) -> f64 {
    let storm = Storm {
        layers,
        retries,
        failure_rate: 1.0,
        requests,
        per_second,
        backoff: Backoff::default(),
        seed: 7,
    };
    storm.run().await.load()
}

/// The default budget's settings, for the arithmetic: `RetryBudget::default()` is
/// `RetryBudget::builder().ratio(RATIO).min_per_sec(MIN_PER_SEC).max_tokens(MAX_TOKENS).build()`.
pub const RATIO: f64 = 0.1;
/// See [`RATIO`].
pub const MIN_PER_SEC: f64 = 10.0;
/// See [`RATIO`].
pub const MAX_TOKENS: f64 = 100.0;

/// A6's example `retryThrottling`: `maxTokens` 10, `tokenRatio` 0.1. The throttle rows use
/// `Throttle::builder().max_tokens(THROTTLE_MAX_TOKENS).token_ratio(THROTTLE_RATIO).build()`.
pub const THROTTLE_MAX_TOKENS: f64 = 10.0;
/// See [`THROTTLE_MAX_TOKENS`].
pub const THROTTLE_RATIO: f64 = 0.1;

/// The throttle's net tokens per attempt at failure rate `p`: a failed attempt takes 1, a
/// success adds the ratio. Every attempt counts (the first of a request, a retry, and one
/// whose retry the throttle then refuses), so this does not depend on how many retries
/// pass: the count drains when it is negative, whatever the throttle does.
pub fn throttle_drift(p: f64) -> f64 {
    THROTTLE_RATIO * (1.0 - p) - p
}

/// The failure rate at which [`throttle_drift`] is 0: ratio / (1 + ratio), 1/11 for A6's
/// example. Below it the count stays near full and every retry passes; above it the count
/// falls to the threshold within a few dozen attempts and then to 0, and no retry passes.
pub fn throttle_knee() -> f64 {
    THROTTLE_RATIO / (1.0 + THROTTLE_RATIO)
}

/// What each layer of a storm does about a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retries {
    /// `RetryPolicy::never()`: every request is sent once.
    Off,
    /// Three attempts, no budget.
    AttemptsOnly,
    /// Three attempts, spent from the default `RetryBudget` (each layer its own bucket).
    DefaultBudget,
    /// Up to three attempts in flight, hedged every 10 ms (`Hedging::after`), no budget: in
    /// an outage every failure sends the next hedge at once.
    HedgedNoBudget,
    /// The same, every hedge spent from the default `RetryBudget`.
    HedgedBudget,
    /// Three attempts, A6's example throttle (each layer its own) and no budget (A6 has
    /// none): the throttle alone.
    Throttle,
}

impl Retries {
    /// The rows of a partial-outage table, in order.
    pub const ALL: [Retries; 4] = [
        Retries::Off,
        Retries::AttemptsOnly,
        Retries::DefaultBudget,
        Retries::Throttle,
    ];

    /// The row's label.
    pub fn label(self) -> &'static str {
        match self {
            Retries::Off => "no retries",
            Retries::AttemptsOnly => "3 attempts, no budget",
            Retries::DefaultBudget => "3 attempts, default budget",
            Retries::HedgedNoBudget => "hedged x3, no budget",
            Retries::HedgedBudget => "hedged x3, default budget",
            Retries::Throttle => "3 attempts, A6's Throttle",
        }
    }

    /// Whether something (a budget or a throttle) may refuse this row's retries.
    pub fn refuses(self) -> bool {
        !matches!(
            self,
            Retries::Off | Retries::AttemptsOnly | Retries::HedgedNoBudget
        )
    }
}

/// Sustained traffic through `layers` nested retrying layers to a server whose every
/// attempt fails (503) with probability `failure_rate`, independently of the others.
#[derive(Debug, Clone, Copy)]
pub struct Storm {
    /// Nested retrying layers, 1 to 3; each is a separate client with its own budget.
    pub layers: usize,
    /// What every layer does about a failed attempt.
    pub retries: Retries,
    /// The chance that one attempt fails, in [0, 1].
    pub failure_rate: f64,
    /// Logical requests sent at the top.
    pub requests: usize,
    /// Logical requests started per second, evenly spaced.
    pub per_second: u32,
    /// The backoff of every layer.
    pub backoff: Backoff,
    /// Seeds the server's failures and the layers' jitter.
    pub seed: u64,
}

/// What one layer of a storm saw, top layer first.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LayerCount {
    /// Logical requests this layer answered.
    pub requests: usize,
    /// Retries its budget or throttle refused: answers stopped with
    /// `StopReason::BudgetExhausted` or `StopReason::Throttled`.
    pub refused: usize,
}

/// What a storm run measured.
#[derive(Debug, Clone, PartialEq)]
pub struct Measured {
    /// Logical requests sent at the top.
    pub requests: usize,
    /// Logical requests whose final answer was a success.
    pub succeeded: usize,
    /// Attempts that reached the server.
    pub attempts: usize,
    /// Each layer's counts, top first.
    pub layers: Vec<LayerCount>,
    /// Simulated time from the first request to the last answer.
    pub elapsed: Duration,
}

impl Measured {
    /// Share of logical requests that succeeded.
    pub fn goodput(&self) -> f64 {
        self.succeeded as f64 / self.requests as f64
    }

    /// Attempts at the server per logical request.
    pub fn load(&self) -> f64 {
        self.attempts as f64 / self.requests as f64
    }

    /// Retries refused, every layer's budget or throttle together.
    pub fn refused(&self) -> usize {
        self.layers.iter().map(|l| l.refused).sum()
    }

    /// Retries layer `k` (0 is the top) sent: calls it made below minus requests it got.
    pub fn retries_at(&self, k: usize) -> usize {
        let below = self
            .layers
            .get(k + 1)
            .map_or(self.attempts, |next| next.requests);
        below - self.layers[k].requests
    }
}

/// A server that fails each call on its own with probability `failure_rate`: a 503, else
/// a 200. Draws come from a seeded SplitMix64 sequence in call order, which a
/// current-thread runtime under paused time makes the same on every run.
#[derive(Clone)]
struct Flaky {
    failure_rate: f64,
    state: Arc<AtomicU64>,
    calls: Arc<AtomicUsize>,
}

impl Flaky {
    const GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;

    fn new(failure_rate: f64, seed: u64) -> Self {
        Self {
            failure_rate,
            state: Arc::new(AtomicU64::new(seed)),
            calls: Arc::default(),
        }
    }

    /// Uniform in [0, 1).
    fn draw(&self) -> f64 {
        let mut z = self
            .state
            .fetch_add(Self::GAMMA, Ordering::Relaxed)
            .wrapping_add(Self::GAMMA);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }
}

impl<B> Service<Request<B>> for Flaky {
    type Response = Response<()>;
    type Error = Infallible;
    type Future = Ready<Result<Response<()>, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<B>) -> Self::Future {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let mut response = Response::new(());
        if self.draw() < self.failure_rate {
            *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
        }
        ready(Ok(response))
    }
}

/// Whether a final answer is a success.
fn succeeded<RB>(response: &Response<RB>) -> bool {
    response.status().is_success()
}

/// Wraps a retrying layer's service to count what it answers: every answer ends one of its
/// logical requests, and one marked `stopped as `BudgetExhausted` or `Throttled`, is a retry
/// its budget or throttle refused.
fn counted<S, RB>(
    service: S,
    count: Arc<Mutex<LayerCount>>,
) -> MapResponse<S, impl FnOnce(Response<RB>) -> Response<RB> + Clone> {
    MapResponse::new(service, move |response: Response<RB>| {
        let mut count = count.lock().unwrap();
        count.requests += 1;
        if response
            .extensions()
            .get::<RetryInfo>()
            .is_some_and(|info| {
                matches!(
                    info.stop(),
                    StopReason::BudgetExhausted | StopReason::Throttled
                )
            })
        {
            count.refused += 1;
        }
        response
    })
}

impl Storm {
    /// Runs the storm; call it under [`paused`].
    pub async fn run(self) -> Measured {
        assert!((1..=3).contains(&self.layers), "1 to 3 layers");
        let server = Flaky::new(self.failure_rate, self.seed);
        let method = Method::GET;
        let counts: Vec<Arc<Mutex<LayerCount>>> =
            (0..self.layers).map(|_| Arc::default()).collect();
        let succeeded = Arc::new(AtomicUsize::new(0));
        let start = Instant::now();
        macro_rules! run {
            ($service:expr) => {{
                let service = $service;
                let gap = Duration::from_secs(1) / self.per_second;
                let mut set = JoinSet::new();
                for _ in 0..self.requests {
                    let service = service.clone();
                    let succeeded = succeeded.clone();
                    let method = method.clone();
                    set.spawn(async move {
                        let request = Request::builder()
                            .method(method)
                            .uri("http://storm.test/")
                            .body(http_body_util::Empty::<bytes::Bytes>::new())
                            .expect("a valid request");
                        if let Ok(response) = service.oneshot(request).await {
                            if self::succeeded(&response) {
                                succeeded.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    });
                    tokio::time::sleep(gap).await;
                }
                while set.join_next().await.is_some() {}
            }};
        }
        // Each layer is a separate client library on the path: each has its own budget.
        let layer = || self.layer();
        match self.layers {
            1 => run!(counted(layer().layer(server.clone()), counts[0].clone())),
            2 => run!(counted(
                layer().layer(counted(layer().layer(server.clone()), counts[1].clone())),
                counts[0].clone()
            )),
            _ => run!(counted(
                layer().layer(counted(
                    layer().layer(counted(layer().layer(server.clone()), counts[2].clone())),
                    counts[1].clone()
                )),
                counts[0].clone()
            )),
        }
        Measured {
            requests: self.requests,
            succeeded: succeeded.load(Ordering::Relaxed),
            attempts: server.calls.load(Ordering::Relaxed),
            layers: counts.iter().map(|c| *c.lock().unwrap()).collect(),
            elapsed: start.elapsed(),
        }
    }

    fn layer(&self) -> RetryLayer {
        let policy = RetryPolicy::new()
            .max_attempts(3)
            .backoff(self.backoff)
            .rng_seed(self.seed);
        let hedge = Hedging::after(Duration::from_millis(10));
        let policy = match self.retries {
            Retries::Off => RetryPolicy::never().no_gates(),
            Retries::AttemptsOnly => policy.no_gates(),
            // A new default budget per layer (per client), in place of the layer's own.
            Retries::DefaultBudget => policy.gate(RetryBudget::default()),
            Retries::HedgedNoBudget => policy.no_gates().hedge(hedge),
            Retries::HedgedBudget => policy.gate(RetryBudget::default()).hedge(hedge),
            // A6 has no budget: the throttle alone. A new throttle per layer (per client).
            Retries::Throttle => policy.no_gates().gate(
                Throttle::builder()
                    .max_tokens(THROTTLE_MAX_TOKENS)
                    .token_ratio(THROTTLE_RATIO)
                    .build(),
            ),
        };
        RetryLayer::new().policy(policy)
    }

    /// What the arithmetic says this storm should measure, given the simulated time it ran
    /// (the budget's per-second refill depends on it). Each layer gets the one-layer
    /// arithmetic of [`Step`], facing the failure rate the layer below leaves, as if the
    /// outcomes it sees were independent too.
    pub fn expected(&self, elapsed: Duration) -> Expected {
        // Refill is credited per whole millisecond: count T up to the next one.
        let seconds = elapsed.as_nanos().div_ceil(1_000_000) as f64 / 1000.0;
        let top = self.requests as f64;
        // Requests each layer sees, top first: found by iterating, as a layer's load
        // depends on its allowance, which depends on the requests it sees.
        let mut seen = vec![top; self.layers];
        let mut steps = vec![Step::default(); self.layers];
        for _ in 0..64 {
            let mut failure = self.failure_rate;
            for k in (0..self.layers).rev() {
                steps[k] = match self.retries {
                    Retries::Off => Step::new(failure, 0.0),
                    // A hedge after an instant failure is a retry without a wait: the
                    // same arithmetic.
                    Retries::AttemptsOnly | Retries::HedgedNoBudget => {
                        Step::new(failure, f64::INFINITY)
                    }
                    Retries::DefaultBudget | Retries::HedgedBudget => Step::new(
                        failure,
                        (MAX_TOKENS + RATIO * seen[k] + MIN_PER_SEC * seconds) / seen[k],
                    ),
                    Retries::Throttle => Step::throttled(failure),
                };
                failure = 1.0 - steps[k].goodput;
            }
            for k in 1..self.layers {
                seen[k] = seen[k - 1] * steps[k - 1].load;
            }
        }
        Expected {
            goodput: steps[0].goodput,
            load: steps.iter().map(|s| s.load).product(),
            refused: steps.iter().zip(&seen).map(|(s, n)| s.refused * n).sum(),
            allowance: steps
                .iter()
                .zip(&seen)
                .map(|(s, n)| s.allowance * n)
                .collect(),
        }
    }
}

/// The arithmetic for one layer with 3 attempts, facing attempts that fail with
/// probability `p`, allowed `allowance` retries per request (0: none, infinite: no budget).
///
/// Without a budget: goodput 1 - p^3, load 1 + p + p^2. With one, model every retry as
/// granted with the same chance q, so retries per request are q p + (q p)^2; the budget
/// binds when p + p^2 exceeds the allowance, and then q solves q p + (q p)^2 = allowance.
/// Each attempt succeeds with 1 - p and each success ends one request, so goodput is
/// (1 - p) * load whatever q is; refused retries per request are (1 - q) p (1 + q p).
#[derive(Debug, Clone, Copy, Default)]
struct Step {
    goodput: f64,
    load: f64,
    refused: f64,
    allowance: f64,
}

impl Step {
    /// A6's throttle facing failure rate `p`: if [`throttle_drift`] is positive, the count
    /// stays near full and every retry passes (q = 1, as without a budget); if negative, it
    /// falls past the threshold within the first few dozen attempts and stays below, so no
    /// retry passes (q = 0; the handful granted at the start are left out) and every failed
    /// first attempt is a refused retry: p per request. The allowance is infinite or 0.
    fn throttled(p: f64) -> Self {
        if throttle_drift(p) > 0.0 {
            Self::new(p, f64::INFINITY)
        } else {
            Self {
                goodput: 1.0 - p,
                load: 1.0,
                refused: p,
                allowance: 0.0,
            }
        }
    }

    fn new(p: f64, allowance: f64) -> Self {
        let q = if allowance <= 0.0 {
            0.0
        } else if p + p * p <= allowance {
            1.0
        } else {
            // q p = (-1 + sqrt(1 + 4 allowance)) / 2
            ((1.0 + 4.0 * allowance).sqrt() - 1.0) / (2.0 * p)
        };
        let retries = q * p + (q * p) * (q * p);
        let load = 1.0 + retries;
        let refused = if allowance <= 0.0 {
            0.0
        } else {
            (1.0 - q) * p * (1.0 + q * p)
        };
        Self {
            goodput: (1.0 - p) * load,
            load,
            refused,
            allowance,
        }
    }
}

/// What the arithmetic says a storm should measure.
#[derive(Debug, Clone, PartialEq)]
pub struct Expected {
    /// 1 - p^3 per layer without a budget; (1 - p) * load with one.
    pub goodput: f64,
    /// 1 + p + p^2 per layer without a budget, multiplied over the layers.
    pub load: f64,
    /// Retries refused by the budgets or throttles, all layers together.
    pub refused: f64,
    /// Each layer's budget ceiling, top first: C + r * (requests it sees) + m * T
    /// (infinite without a budget, 0 without retries).
    pub allowance: Vec<f64>,
}

/// The failure rates of the partial-outage tables.
pub const FAILURE_RATES: [f64; 4] = [0.05, 0.2, 0.5, 1.0];
/// Logical requests per run of the partial-outage tables: 20 s at 1,000 per second.
pub const PARTIAL_REQUESTS: usize = 20_000;
/// Logical requests per second in the partial-outage tables.
pub const PARTIAL_PER_SECOND: u32 = 1_000;

/// The backoff of the partial-outage tables: small (10 ms base, 100 ms cap, full jitter),
/// so retries follow soon after the failure they answer but not all in the same instant.
pub fn partial_backoff() -> Backoff {
    Backoff::exponential(PARTIAL_BASE, PARTIAL_CAP)
}

/// [`partial_backoff`]'s base.
pub const PARTIAL_BASE: Duration = Duration::from_millis(10);
/// [`partial_backoff`]'s cap.
pub const PARTIAL_CAP: Duration = Duration::from_millis(100);

/// One row of a partial-outage table.
#[derive(Debug, Clone)]
pub struct Row {
    /// The storm that was run.
    pub storm: Storm,
    /// What it measured.
    pub measured: Measured,
    /// What the arithmetic says it should have.
    pub expected: Expected,
}

/// Every row of the partial-outage table for `layers` nested layers: each failure rate in
/// [`FAILURE_RATES`] under each of [`Retries::ALL`], 20,000 requests at 1,000 per second.
pub fn partial_outage(layers: usize) -> Vec<Row> {
    let mut rows = Vec::new();
    for (i, &failure_rate) in FAILURE_RATES.iter().enumerate() {
        for retries in Retries::ALL {
            let storm = Storm {
                layers,
                retries,
                failure_rate,
                requests: PARTIAL_REQUESTS,
                per_second: PARTIAL_PER_SECOND,
                backoff: partial_backoff(),
                seed: 2024 + i as u64,
            };
            let measured = paused(storm.run());
            let expected = storm.expected(measured.elapsed);
            rows.push(Row {
                storm,
                measured,
                expected,
            });
        }
    }
    rows
}

/// `RetryQuota::default()`'s capacity, and its cost of a retry after a transient
/// failure (a 503), for the arithmetic.
pub const QUOTA_MAX_TOKENS: f64 = 500.0;
/// See [`QUOTA_MAX_TOKENS`].
pub const QUOTA_COST: f64 = 10.0;

/// The failure rate of the healthy server in the two-server table: 5%, on its own.
pub const HEALTHY_FAILURE_RATE: f64 = 0.05;

/// What one client's gates are in the two-server table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shared {
    /// The default budget, one bucket for both servers.
    OneBudget,
    /// The default budget's settings, one bucket per authority.
    BudgetPerAuthority,
    /// The AWS SDKs' quota (`RetryQuota::default()`), one pool for both, no budget.
    OneQuota,
    /// The same quota, one pool per authority, no budget.
    QuotaPerAuthority,
}

impl Shared {
    pub const ALL: [Shared; 4] = [
        Shared::OneBudget,
        Shared::BudgetPerAuthority,
        Shared::OneQuota,
        Shared::QuotaPerAuthority,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Shared::OneBudget => "one default budget",
            Shared::BudgetPerAuthority => "default budget per authority",
            Shared::OneQuota => "one AWS quota",
            Shared::QuotaPerAuthority => "AWS quota per authority",
        }
    }

    /// The client's gates, as a policy: laid over the layer's, it replaces the layer's own
    /// budget.
    fn gates(self) -> RetryPolicy {
        let policy = RetryPolicy::new();
        match self {
            Shared::OneBudget => policy.gate(RetryBudget::default()),
            Shared::BudgetPerAuthority => {
                policy.gate(RetryBudget::builder().per_authority().build())
            }
            Shared::OneQuota => policy.no_gates().gate(RetryQuota::default()),
            Shared::QuotaPerAuthority => policy
                .no_gates()
                .gate(RetryQuota::builder().per_authority().build()),
        }
    }
}

/// What the two-server run measured for the healthy server.
#[derive(Debug, Clone, PartialEq)]
pub struct TwoServers {
    pub gates: Shared,
    /// Logical requests to each server.
    pub per_server: usize,
    /// Share of the healthy server's requests that succeeded.
    pub healthy_goodput: f64,
    /// Retries of the healthy server's requests that a gate refused.
    pub healthy_refused: usize,
    /// Simulated time from the first request to the last answer.
    pub elapsed: Duration,
}

/// One client, two servers: `down.test` in a total outage (every attempt a 503) and
/// `healthy.test` failing [`HEALTHY_FAILURE_RATE`] of its attempts on its own, requests
/// alternating between them, [`PARTIAL_REQUESTS`] in all at [`PARTIAL_PER_SECOND`], 3
/// attempts, [`partial_backoff`]. Call it under [`paused`].
pub async fn two_servers(gates: Shared, seed: u64) -> TwoServers {
    let down = Flaky::new(1.0, seed);
    let healthy = Flaky::new(HEALTHY_FAILURE_RATE, seed + 1);
    let server = tower::service_fn(move |request: Request<_>| {
        let mut server = match request.uri().host() {
            Some("down.test") => down.clone(),
            _ => healthy.clone(),
        };
        server.call(request)
    });
    let policy = RetryPolicy::new()
        .max_attempts(3)
        .backoff(partial_backoff())
        .rng_seed(seed);
    let client = RetryLayer::new()
        .policy(gates.gates())
        .policy(policy)
        .layer(server);
    let succeeded = Arc::new(AtomicUsize::new(0));
    let refused = Arc::new(AtomicUsize::new(0));
    let gap = Duration::from_secs(1) / PARTIAL_PER_SECOND;
    let start = Instant::now();
    let mut set = JoinSet::new();
    for i in 0..PARTIAL_REQUESTS {
        let client = client.clone();
        let (succeeded, refused) = (succeeded.clone(), refused.clone());
        let host = if i % 2 == 0 {
            "down.test"
        } else {
            "healthy.test"
        };
        set.spawn(async move {
            let request = Request::get(format!("http://{host}/"))
                .body(http_body_util::Empty::<bytes::Bytes>::new())
                .expect("a valid request");
            let response = client
                .oneshot(request)
                .await
                .expect("the flaky servers answer every call");
            if host == "healthy.test" {
                if self::succeeded(&response) {
                    succeeded.fetch_add(1, Ordering::Relaxed);
                }
                let info = response.extensions().get::<RetryInfo>();
                // A quota that cannot pay stops the same way as a budget.
                if info.is_some_and(|info| info.stop() == StopReason::BudgetExhausted) {
                    refused.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
        tokio::time::sleep(gap).await;
    }
    while set.join_next().await.is_some() {}
    let per_server = PARTIAL_REQUESTS / 2;
    TwoServers {
        gates,
        per_server,
        healthy_goodput: succeeded.load(Ordering::Relaxed) as f64 / per_server as f64,
        healthy_refused: refused.load(Ordering::Relaxed),
        elapsed: start.elapsed(),
    }
}

impl TwoServers {
    /// The arithmetic for the healthy server's goodput. With one budget, both servers'
    /// retries draw from C + r * N + m * T; model every retry as granted with one chance q,
    /// so the outage's requests take q + q^2 retries each and the healthy server's
    /// q p + (q p)^2, and q solves N/2 (q + q^2 + q p + (q p)^2) = C + r N + m T. Per
    /// authority, the healthy server has C + r N/2 + m T to itself, which its p + p^2 per
    /// request does not exhaust: q = 1. Goodput is (1 - p) (1 + q p + (q p)^2).
    pub fn expected_goodput(&self) -> f64 {
        let p = HEALTHY_FAILURE_RATE;
        let seconds = self.elapsed.as_nanos().div_ceil(1_000_000) as f64 / 1000.0;
        let half = self.per_server as f64;
        let q = match self.gates {
            Shared::OneBudget => {
                let supply = MAX_TOKENS + RATIO * 2.0 * half + MIN_PER_SEC * seconds;
                let demand = |q: f64| half * (q + q * q + q * p + (q * p) * (q * p));
                bisect(|q| demand(q) - supply)
            }
            Shared::BudgetPerAuthority => {
                let supply = MAX_TOKENS + RATIO * half + MIN_PER_SEC * seconds;
                let demand = |q: f64| half * (q * p + (q * p) * (q * p));
                bisect(|q| demand(q) - supply)
            }
            // The quota's income is the healthy server's first-try successes, 1 token each
            // (a success after retries only gives its last retry back), plus 500 to start;
            // every retry costs 10 (a 503 is transient), and only a success refunds one. The
            // outage spends 10 per retry and never refunds; the healthy server's retries
            // (p + p^2 per request, at q) pay 10 and get 10 back when they succeed.
            Shared::OneQuota => {
                let income = QUOTA_MAX_TOKENS + half * (1.0 - p);
                let demand = |q: f64| {
                    let healthy = q * p + (q * p) * (q * p);
                    // Per request: the outage's q + q^2 retries, all lost; the healthy
                    // server's, less the one refunded when it succeeds.
                    let refunded = (1.0 - p) * (q * p);
                    QUOTA_COST * half * (q + q * q + healthy - refunded)
                };
                bisect(|q| demand(q) - income)
            }
            Shared::QuotaPerAuthority => {
                let income = QUOTA_MAX_TOKENS + half * (1.0 - p);
                let demand = |q: f64| {
                    let healthy = q * p + (q * p) * (q * p);
                    QUOTA_COST * half * (healthy - (1.0 - p) * (q * p))
                };
                bisect(|q| demand(q) - income)
            }
        };
        (1.0 - p) * (1.0 + q * p + (q * p) * (q * p))
    }
}

/// The q in [0, 1] where the increasing `f` crosses zero (1 if it never does).
fn bisect(f: impl Fn(f64) -> f64) -> f64 {
    if f(1.0) <= 0.0 {
        return 1.0;
    }
    let (mut low, mut high) = (0.0, 1.0);
    for _ in 0..60 {
        let mid = (low + high) / 2.0;
        if f(mid) > 0.0 {
            high = mid;
        } else {
            low = mid;
        }
    }
    low
}
