//! The throttling storm: 100 clients against a server that admits a fixed rate and answers
//! 429 above it, driving the real layer under paused time. Shared by the `storm` example
//! (table (f)) and `tests/behaviour/storm.rs`.
//!
//! Each client is a separate `RetryLayer` with gates of its own (as 100 processes would
//! have) and works through its share of a fixed batch one request after another (a closed
//! loop). The server admits [`RATE`] requests per second through a token bucket (burst
//! [`BURST`]): an admitted request is answered 200 after [`SERVICE_TIME`], one above the
//! rate 429 after [`REJECT_TIME`], with `Retry-After: 1` or without.
#![allow(clippy::disallowed_methods)] // tokio's paused clock and sleeps, or real time

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tower::ServiceExt;

use http::{HeaderValue, Request, Response, StatusCode};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tower::{Layer, Service};
use tower_http_retry::{
    AdaptiveLimiter, AdaptiveThrottle, AttemptOutcome, LocallyRefused, RetryBudget, RetryError,
    RetryInfo, RetryLayer, RetryPolicy, RetryQuota,
};

/// Clients, each its own layer and gates.
pub const CLIENTS: usize = 100;
/// Requests each client must get through, one after another.
pub const PER_CLIENT: usize = 50;
/// Requests the server admits per second.
pub const RATE: f64 = 500.0;
/// The most requests the server admits at once (a tenth of a second's worth).
pub const BURST: f64 = 50.0;
/// How long an admitted request takes.
pub const SERVICE_TIME: Duration = Duration::from_millis(20);
/// How long a 429 takes.
pub const REJECT_TIME: Duration = Duration::from_millis(1);
/// Attempts per request, under every policy (the AWS SDKs' default).
pub const ATTEMPTS: u32 = 3;
/// The width of the windows the server's load is counted in.
pub const LOAD_WINDOW: Duration = Duration::from_millis(100);

/// What each client's policy is, a row of the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// Default backoff (100 ms base, 10 s cap, full jitter), no gate.
    BackoffOnly,
    /// The default `RetryBudget` (10% of requests, 10 a second, 100 tokens).
    Budget,
    /// `RetryQuota::default()`.
    Quota,
    /// `RetryQuota::builder().aws_standard_2026()` with its 50 ms backoff.
    Quota2026,
    /// `AdaptiveLimiter` (defaults: 20 s longest wait), no other gate.
    Adaptive,
    /// `AdaptiveThrottle` (grpc-go's defaults: 30 s, K 2, P 8), no other gate.
    ClientThrottle,
    /// `AdaptiveLimiter` and the default `RetryBudget`.
    AdaptiveBudget,
}

impl Policy {
    pub const ALL: [Policy; 7] = [
        Policy::BackoffOnly,
        Policy::Budget,
        Policy::Quota,
        Policy::Quota2026,
        Policy::Adaptive,
        Policy::ClientThrottle,
        Policy::AdaptiveBudget,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Policy::BackoffOnly => "backoff only",
            Policy::Budget => "ratio budget (default)",
            Policy::Quota => "AWS quota",
            Policy::Quota2026 => "AWS quota 2026, 50 ms base",
            Policy::Adaptive => "adaptive limiter",
            Policy::ClientThrottle => "client throttling (grpc-go)",
            Policy::AdaptiveBudget => "adaptive + budget",
        }
    }

    /// One client's layer: new gates, its own jitter seed.
    pub fn layer(self, seed: u64) -> RetryLayer {
        let policy = RetryPolicy::new()
            .max_attempts(ATTEMPTS)
            .rng_seed(seed)
            .no_gates();
        let policy = match self {
            Policy::BackoffOnly => policy,
            Policy::Budget => policy.gate(RetryBudget::default()),
            Policy::Quota => policy.gate(RetryQuota::default()),
            Policy::Quota2026 => policy
                .gate(RetryQuota::builder().aws_standard_2026().build())
                .backoff(tower_http_retry::Backoff::from_initial(
                    Duration::from_millis(50),
                    Duration::from_secs(20),
                )),
            Policy::Adaptive => policy.gate(AdaptiveLimiter::builder().build()),
            Policy::ClientThrottle => policy.gate(AdaptiveThrottle::builder().build()),
            Policy::AdaptiveBudget => policy
                .gate(AdaptiveLimiter::builder().build())
                .gate(RetryBudget::default()),
        };
        RetryLayer::new().policy(policy)
    }
}

/// The server's books: its token bucket and what it counted. The loopback run's server
/// (`loopback.rs`) keeps the same books.
#[derive(Debug)]
pub struct Books {
    start: Instant,
    tokens: f64,
    refilled: Duration,
    pub admitted: usize,
    pub throttled: usize,
    /// Arrivals per [`LOAD_WINDOW`], from the start.
    pub windows: Vec<u32>,
    /// Admissions per second, from the start.
    pub seconds: Vec<u32>,
}

impl Books {
    /// Full bucket, nothing counted; time counted from `start`.
    pub fn new(start: Instant) -> Self {
        Self {
            start,
            tokens: BURST,
            refilled: Duration::ZERO,
            admitted: 0,
            throttled: 0,
            windows: Vec::new(),
            seconds: Vec::new(),
        }
    }

    /// Counts an arrival now and says whether the bucket admits it (and counts that).
    pub fn arrive(&mut self) -> bool {
        let now = self.start.elapsed();
        let window = (now.as_nanos() / LOAD_WINDOW.as_nanos()) as usize;
        if self.windows.len() <= window {
            self.windows.resize(window + 1, 0);
        }
        self.windows[window] += 1;
        let gained = (now - self.refilled).as_secs_f64() * RATE;
        self.tokens = (self.tokens + gained).min(BURST);
        self.refilled = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            self.admitted += 1;
            let second = now.as_secs() as usize;
            if self.seconds.len() <= second {
                self.seconds.resize(second + 1, 0);
            }
            self.seconds[second] += 1;
            true
        } else {
            self.throttled += 1;
            false
        }
    }
}

/// A server that admits [`RATE`] a second (a token bucket of [`BURST`]) and answers 429
/// above it.
#[derive(Clone)]
struct Limited {
    books: Arc<Mutex<Books>>,
    retry_after: bool,
}

impl Limited {
    fn new(retry_after: bool) -> Self {
        Self {
            books: Arc::new(Mutex::new(Books::new(Instant::now()))),
            retry_after,
        }
    }
}

impl<B> Service<Request<B>> for Limited {
    type Response = Response<()>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<()>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<B>) -> Self::Future {
        let admitted = self.books.lock().unwrap().arrive();
        let retry_after = self.retry_after;
        Box::pin(async move {
            let mut response = Response::new(());
            if admitted {
                tokio::time::sleep(SERVICE_TIME).await;
            } else {
                tokio::time::sleep(REJECT_TIME).await;
                *response.status_mut() = StatusCode::TOO_MANY_REQUESTS;
                if retry_after {
                    response
                        .headers_mut()
                        .insert(http::header::RETRY_AFTER, HeaderValue::from_static("1"));
                }
            }
            Ok(response)
        })
    }
}

/// What one run measured.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    pub policy: Policy,
    pub retry_after: bool,
    /// Requests in the batch.
    pub requests: usize,
    /// Requests that ended in a 200.
    pub succeeded: usize,
    /// Requests refused before any attempt was sent (`LocallyRefused`).
    pub refused_locally: usize,
    /// Attempts the server answered 429.
    pub throttled: usize,
    /// Attempts the server admitted.
    pub admitted: usize,
    /// Simulated time from the first request to the last answer.
    pub elapsed: Duration,
    /// The most arrivals in one [`LOAD_WINDOW`].
    pub peak_window: u32,
    /// Attempts admitted in each second of the run, from the start.
    pub admitted_per_second: Vec<u32>,
    /// Arrivals in each [`LOAD_WINDOW`] of the run, from the start.
    pub arrivals: Vec<u32>,
    /// Each client's log, the first to finish first.
    pub clients: Vec<ClientLog>,
}

/// What one client saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ClientLog {
    /// When it finished its share, from the start of the run.
    pub finished: Duration,
    /// The 429s its attempts received.
    pub throttled: u32,
    /// When the last request that received a 429 ended, from the start.
    pub last_throttled: Option<Duration>,
}

impl ClientLog {
    /// Books the answer to one request, ended now (`since` the start): the 429s its
    /// attempts received, from the layer's record.
    pub fn book(&mut self, info: Option<&RetryInfo>, since: Duration) {
        let throttled = info.map_or(0, |info| {
            info.outcomes()
                .filter(|o| *o == AttemptOutcome::Response(StatusCode::TOO_MANY_REQUESTS))
                .count() as u32
        });
        if throttled > 0 {
            self.throttled += throttled;
            self.last_throttled = Some(since);
        }
    }
}

impl Run {
    /// A run of `requests` requests of which `succeeded` ended in a 200 and `refused` were
    /// refused locally, over `elapsed`, its clients done at `finished`, as the server's
    /// `books` saw it.
    pub fn of(
        policy: Policy,
        retry_after: bool,
        requests: usize,
        (succeeded, refused_locally): (usize, usize),
        (elapsed, mut clients): (Duration, Vec<ClientLog>),
        books: &Books,
    ) -> Self {
        clients.sort_by_key(|c| c.finished);
        Run {
            policy,
            retry_after,
            requests,
            succeeded,
            refused_locally,
            throttled: books.throttled,
            admitted: books.admitted,
            elapsed,
            peak_window: books.windows.iter().copied().max().unwrap_or(0),
            admitted_per_second: books.seconds.clone(),
            arrivals: books.windows.clone(),
            clients,
        }
    }

    /// By when the first `share` of the clients had finished (0.5: half of them).
    pub fn clients_done_by(&self, share: f64) -> Duration {
        let n = ((self.clients.len() as f64 * share).ceil() as usize).max(1);
        self.clients
            .get(n - 1)
            .map(|c| c.finished)
            .unwrap_or_default()
    }

    /// Of the last tenth of the clients to finish, then of the others: the mean 429s a
    /// client received and the mean time of its last one (seconds from the start).
    pub fn slowest_tenth(&self) -> [(f64, f64); 2] {
        let split = self.clients.len() - self.clients.len() / 10;
        let mean = |clients: &[ClientLog]| {
            let n = clients.len().max(1) as f64;
            let throttled = clients.iter().map(|c| f64::from(c.throttled)).sum::<f64>() / n;
            let last = clients
                .iter()
                .map(|c| c.last_throttled.unwrap_or_default().as_secs_f64())
                .sum::<f64>()
                / n;
            (throttled, last)
        };
        [mean(&self.clients[split..]), mean(&self.clients[..split])]
    }

    /// 429s received per successful request.
    pub fn throttled_per_success(&self) -> f64 {
        self.throttled as f64 / self.succeeded.max(1) as f64
    }

    /// Share of the batch that succeeded.
    pub fn success_share(&self) -> f64 {
        self.succeeded as f64 / self.requests as f64
    }

    /// Successful requests per second of the run.
    pub fn goodput(&self) -> f64 {
        self.succeeded as f64 / self.elapsed.as_secs_f64()
    }

    /// The server's peak load, arrivals per second over a [`LOAD_WINDOW`].
    pub fn peak_load(&self) -> f64 {
        f64::from(self.peak_window) / LOAD_WINDOW.as_secs_f64()
    }

    /// The server's use of its rate over whole seconds `from..to` of the run (those that
    /// exist): admissions over what it could admit.
    pub fn utilisation(&self, from: usize, to: usize) -> f64 {
        let seconds = self
            .admitted_per_second
            .get(from..to.min(self.admitted_per_second.len()));
        match seconds {
            Some(s) if !s.is_empty() => {
                s.iter().map(|&n| f64::from(n)).sum::<f64>() / (s.len() as f64 * RATE)
            }
            _ => 0.0,
        }
    }

    /// Attempts that reached the server per request of the batch.
    pub fn load(&self) -> f64 {
        (self.admitted + self.throttled) as f64 / self.requests as f64
    }
}

/// Runs the batch under `policy`; call it under [`super::sim::paused`] (or any runtime
/// whose clock is paused). `clients` clients, `per_client` requests each.
pub async fn run(
    policy: Policy,
    retry_after: bool,
    clients: usize,
    per_client: usize,
    seed: u64,
) -> Run {
    let server = Limited::new(retry_after);
    let start = Instant::now();
    let mut set = JoinSet::new();
    for c in 0..clients {
        let client = policy
            .layer(seed.wrapping_add(c as u64))
            .layer(server.clone());
        set.spawn(async move {
            let (mut succeeded, mut refused, mut log) = (0, 0, ClientLog::default());
            for _ in 0..per_client {
                let request = Request::get("http://limited.test/")
                    .body(http_body_util::Empty::<bytes::Bytes>::new())
                    .expect("a valid request");
                match client.clone().oneshot(request).await {
                    Ok(response) => {
                        log.book(response.extensions().get::<RetryInfo>(), start.elapsed());
                        if response.status().is_success() {
                            succeeded += 1;
                        }
                    }
                    Err(error) => {
                        let local = error
                            .downcast_ref::<RetryError>()
                            .is_some_and(|e| e.get_ref().is::<LocallyRefused>());
                        assert!(local, "only the limiter fails a request here: {error}");
                        refused += 1;
                    }
                }
            }
            log.finished = start.elapsed();
            (succeeded, refused, log)
        });
    }
    let (mut succeeded, mut refused_locally, mut finished) = (0, 0, Vec::with_capacity(clients));
    while let Some(done) = set.join_next().await {
        let (s, r, f) = done.expect("a client task");
        succeeded += s;
        refused_locally += r;
        finished.push(f);
    }
    let elapsed = start.elapsed();
    let books = server.books.lock().unwrap();
    Run::of(
        policy,
        retry_after,
        clients * per_client,
        (succeeded, refused_locally),
        (elapsed, finished),
        &books,
    )
}

/// Every row: each policy, without `Retry-After` then with it, [`CLIENTS`] clients of
/// [`PER_CLIENT`] requests.
pub fn table(seed: u64) -> Vec<Run> {
    let mut runs = Vec::new();
    for retry_after in [false, true] {
        for policy in Policy::ALL {
            runs.push(super::sim::paused(run(
                policy,
                retry_after,
                CLIENTS,
                PER_CLIENT,
                seed,
            )));
        }
    }
    runs
}
