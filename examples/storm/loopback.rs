//! The throttling storm on loopback, in real time: the clients and the server of table (f)
//! (`rate.rs`), with a hyper 1 server on 127.0.0.1 in place of the simulated one and a
//! hyper-util legacy client under each client's layer. `cargo run --release --example storm
//! -- loopback` prints it (about 2.5 minutes).
//!
//! The same numbers as the simulation: [`CLIENTS`] clients, each its own `RetryLayer` with
//! gates of its own (`rate::Policy::layer`) over a hyper-util client of its own (its own
//! connection pool: one keep-alive connection, since it sends one request at a time), each
//! working through [`PER_CLIENT`] GET requests one after another. The server keeps the
//! simulation's books (`rate::Books`: a token bucket of [`RATE`] a second, [`BURST`] held):
//! an admitted request is answered 200 after [`SERVICE_TIME`], any other 429 after
//! [`REJECT_TIME`], with `Retry-After: 1` or without. Everything runs on one multi-thread
//! tokio runtime with two workers, as `benches/end_to_end.rs` does.
//!
//! Bounded: each client sends at most its [`PER_CLIENT`] requests (each at most
//! `rate::ATTEMPTS` attempts, a limiter's wait at most its 20 s) and starts none after
//! [`RUN_LIMIT`]; the run waits for its clients [`GRACE`] more at most, then abandons them
//! (the row says so); the server accepts at most [`MAX_CONNECTIONS`] connections.
#![allow(clippy::disallowed_methods)] // tokio's paused clock and sleeps, or real time

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tower::{Layer, ServiceExt};
use tower_http_retry::{LocallyRefused, ReplayBody, RetryError, RetryInfo};

use crate::rate::{self, Books, ClientLog, Policy, Run};

pub use rate::{BURST, CLIENTS, PER_CLIENT, RATE, REJECT_TIME, SERVICE_TIME};

/// No client starts a request after this long into a run.
pub const RUN_LIMIT: Duration = Duration::from_secs(45);
/// How much longer a run waits for its clients' last requests.
pub const GRACE: Duration = Duration::from_secs(25);
/// The server accepts no more connections than this (the clients need one each).
pub const MAX_CONNECTIONS: usize = 1000;
/// The rows, in order: every policy of table (f).
pub const POLICIES: [Policy; 7] = Policy::ALL;

/// What one loopback run measured: the simulation's figures, and what only a real run has.
#[derive(Debug, Clone)]
pub struct Loopback {
    pub run: Run,
    /// Requests that ended in an error other than a local refusal (a connection's failure).
    pub errors: usize,
    /// Requests never started because the run reached [`RUN_LIMIT`], or abandoned after
    /// [`GRACE`].
    pub unfinished: usize,
    /// The most arrivals in any 10 consecutive 100 ms windows (a sliding second).
    pub peak_second: u32,
    /// The mean time the server took over an admitted request, and over a 429 (its sleeps).
    pub served_in: (Duration, Duration),
    /// The mean time, at the client, of a request that succeeded at its first attempt (from
    /// the call to its body's end): the cycle of a client the server admits each time.
    pub first_try: Duration,
}

/// Sums of durations and their counts, for means.
#[derive(Default)]
struct Mean {
    nanos: AtomicU64,
    count: AtomicU64,
}

impl Mean {
    fn add(&self, d: Duration) {
        self.nanos.fetch_add(d.as_nanos() as u64, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    fn get(&self) -> Duration {
        let count = self.count.load(Ordering::Relaxed).max(1);
        Duration::from_nanos(self.nanos.load(Ordering::Relaxed) / count)
    }
}

/// What the server measured of its own answers.
#[derive(Default)]
struct Served {
    admitted: Mean,
    throttled: Mean,
}

/// Serves HTTP/1.1 on 127.0.0.1: every request (its body read) is counted in `books` and
/// answered 200 after [`SERVICE_TIME`] if admitted, else 429 after [`REJECT_TIME`].
async fn serve(
    books: Arc<Mutex<Books>>,
    served: Arc<Served>,
    retry_after: bool,
) -> (SocketAddr, JoinSet<()>) {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind 127.0.0.1");
    let addr = listener.local_addr().expect("local address");
    let mut server = JoinSet::new();
    server.spawn(async move {
        let mut connections = JoinSet::new();
        for _ in 0..MAX_CONNECTIONS {
            let Ok((stream, _)) = listener.accept().await else {
                break;
            };
            let _ = stream.set_nodelay(true);
            let (books, served) = (Arc::clone(&books), Arc::clone(&served));
            connections.spawn(async move {
                let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                    let (books, served) = (Arc::clone(&books), Arc::clone(&served));
                    async move {
                        let _ = request.into_body().collect().await;
                        let admitted = books.lock().unwrap().arrive();
                        let mut response = Response::new(Full::new(Bytes::from_static(b"ok")));
                        let began = Instant::now();
                        if admitted {
                            tokio::time::sleep(SERVICE_TIME).await;
                            served.admitted.add(began.elapsed());
                        } else {
                            tokio::time::sleep(REJECT_TIME).await;
                            served.throttled.add(began.elapsed());
                            *response.status_mut() = StatusCode::TOO_MANY_REQUESTS;
                            if retry_after {
                                response.headers_mut().insert(
                                    http::header::RETRY_AFTER,
                                    HeaderValue::from_static("1"),
                                );
                            }
                        }
                        Ok::<_, Infallible>(response)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
        // The connections live as long as this task, which the run aborts when it is done.
        std::future::pending::<()>().await;
    });
    (addr, server)
}

/// One client's hyper-util client: its own pool, `TCP_NODELAY` as the server's side.
fn client() -> Client<HttpConnector, ReplayBody<Empty<Bytes>>> {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    Client::builder(TokioExecutor::new()).build(connector)
}

/// What the clients of one run counted, as they went (so that an abandoned client's
/// requests still count).
#[derive(Default)]
struct Tally {
    succeeded: AtomicUsize,
    refused: AtomicUsize,
    errors: AtomicUsize,
    /// Requests that ended, in any way.
    finished: AtomicUsize,
    first_try: Mean,
}

/// Runs the batch under `policy` on the current (real-time) runtime.
pub async fn run(policy: Policy, retry_after: bool, seed: u64) -> Loopback {
    let start = Instant::now();
    let books = Arc::new(Mutex::new(Books::new(start)));
    let served = Arc::new(Served::default());
    let (addr, mut server) = serve(Arc::clone(&books), Arc::clone(&served), retry_after).await;
    let stop = start + RUN_LIMIT;
    let tally = Arc::new(Tally::default());
    let mut clients = JoinSet::new();
    for c in 0..CLIENTS {
        let svc = policy.layer(seed.wrapping_add(c as u64)).layer(client());
        let uri = format!("http://{addr}/items");
        let tally = Arc::clone(&tally);
        clients.spawn(async move {
            let mut log = ClientLog::default();
            for _ in 0..PER_CLIENT {
                if Instant::now() >= stop {
                    break;
                }
                let request = Request::get(uri.as_str())
                    .body(Empty::<Bytes>::new())
                    .expect("a valid request");
                let began = Instant::now();
                let counter = match ServiceExt::oneshot(svc.clone(), request).await {
                    Ok(response) => {
                        let ok = response.status().is_success();
                        let info = response.extensions().get::<RetryInfo>();
                        let first = info.is_some_and(|info| info.attempts() == 1);
                        log.book(info, start.elapsed());
                        // Read to its end, so the connection is kept for the next request.
                        let _ = response.into_body().collect().await;
                        if ok && first {
                            tally.first_try.add(began.elapsed());
                        }
                        ok.then_some(&tally.succeeded)
                    }
                    Err(error) => {
                        let local = error
                            .downcast_ref::<RetryError>()
                            .is_some_and(|e| e.get_ref().is::<LocallyRefused>());
                        Some(if local { &tally.refused } else { &tally.errors })
                    }
                };
                if let Some(counter) = counter {
                    counter.fetch_add(1, Ordering::Relaxed);
                }
                tally.finished.fetch_add(1, Ordering::Relaxed);
            }
            log.finished = start.elapsed();
            log
        });
    }
    let mut last = start;
    let mut finished = Vec::with_capacity(CLIENTS);
    let give_up = stop + GRACE;
    while let Ok(Some(done)) = tokio::time::timeout_at(give_up, clients.join_next()).await {
        finished.push(done.expect("a client task"));
        last = Instant::now();
    }
    let abandoned = !clients.is_empty();
    clients.abort_all();
    let elapsed = if abandoned {
        start.elapsed()
    } else {
        last - start
    };
    server.abort_all();
    let books = books.lock().unwrap();
    let requests = CLIENTS * PER_CLIENT;
    let peak_second = books
        .windows
        .windows(10)
        .map(|w| w.iter().sum::<u32>())
        .max()
        .unwrap_or_else(|| books.windows.iter().sum());
    let count = |n: &AtomicUsize| n.load(Ordering::Relaxed);
    Loopback {
        run: Run::of(
            policy,
            retry_after,
            requests,
            (count(&tally.succeeded), count(&tally.refused)),
            (elapsed, finished),
            &books,
        ),
        errors: count(&tally.errors),
        unfinished: requests - count(&tally.finished),
        peak_second,
        served_in: (served.admitted.get(), served.throttled.get()),
        first_try: tally.first_try.get(),
    }
}

/// Every row: each policy without `Retry-After`, then with it, one after another on one
/// runtime of two workers.
pub fn table(seed: u64) -> Vec<Loopback> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a multi-thread runtime");
    let mut rows = Vec::new();
    for retry_after in [false, true] {
        for policy in POLICIES {
            let row = runtime.block_on(run(policy, retry_after, seed));
            eprintln!(
                "  done: {} {} in {:.1} s",
                policy.label(),
                if retry_after { "(Retry-After)" } else { "" },
                row.run.elapsed.as_secs_f64()
            );
            rows.push(row);
        }
    }
    rows
}
