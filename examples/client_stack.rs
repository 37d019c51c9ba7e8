//! A production-shaped client stack against a server that goes down and comes back.
//!
//! ```text
//! circuit breaker  ->  RetryLayer  ->  per-attempt TimeoutLayer  ->  hyper-util client
//! ```
//!
//! - The circuit breaker is outside the retry layer: it sees one outcome per logical
//!   request, and once it opens, the whole attempt sequence is skipped, not just one try.
//! - The timeout is inside: it limits each attempt, and the retry layer treats its `Elapsed`
//!   as a retryable timeout.
//! - One retrying layer on the call path; the breaker and the timeout never retry.
//!
//! The server is healthy, then slow on first attempts (the timeout fires and the retry
//! succeeds), then down (connections refused: retries fail fast, the breaker opens and
//! rejects calls at once), then back (the breaker lets a probe through and closes).
//!
//! Run with `cargo run --example client_stack`. It ends by itself in a few seconds.
#![allow(clippy::disallowed_methods)] // measures real time with std's clock

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderName, Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tower::timeout::TimeoutLayer;
use tower::{BoxError, Service, ServiceBuilder, ServiceExt};
use tower_http_retry::{Backoff, RetryInfo, RetryLayer, RetryPolicy};
use tower_resilience_circuitbreaker::{CircuitBreakerError, CircuitBreakerLayer, CircuitState};

const HEALTHY: u8 = 0;
const SLOW_FIRST_ATTEMPTS: u8 = 1;

/// A server that can be stopped (every connection closed, the port refused) and restarted
/// on the same port.
struct Server {
    addr: SocketAddr,
    tasks: Option<JoinSet<()>>,
}

impl Server {
    async fn start(addr: SocketAddr, mode: Arc<AtomicU8>) -> std::io::Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let mut tasks = JoinSet::new();
        tasks.spawn(async move {
            let mut connections = JoinSet::new();
            while let Ok((stream, _)) = listener.accept().await {
                let mode = Arc::clone(&mode);
                connections.spawn(async move {
                    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                        let slow = mode.load(Ordering::SeqCst) == SLOW_FIRST_ATTEMPTS
                            && req.headers().get("retry-attempt").is_some_and(|v| v == "1");
                        async move {
                            if slow {
                                tokio::time::sleep(Duration::from_millis(400)).await;
                            }
                            Ok::<_, std::convert::Infallible>(Response::new(Full::new(
                                Bytes::from_static(b"ok"),
                            )))
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(Self {
            addr,
            tasks: Some(tasks),
        })
    }

    /// Closes the listener and every open connection.
    fn stop(&mut self) {
        // Dropping the set aborts the accept loop, which drops its own set of connections.
        self.tasks = None;
    }
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let mode = Arc::new(AtomicU8::new(HEALTHY));
    let mut server = Server::start("127.0.0.1:0".parse()?, Arc::clone(&mode)).await?;
    let addr = server.addr;
    println!("client stack demo: server on http://{addr}\n");

    let breaker = CircuitBreakerLayer::builder()
        .failure_classifier(
            |result: &Result<Response<Incoming>, BoxError>| match result {
                Ok(response) => response.status().is_server_error(),
                Err(_) => true,
            },
        )
        .consecutive_failures(3)
        .wait_duration_in_open(Duration::from_millis(800))
        .permitted_calls_in_half_open(1)
        .on_state_transition(|from, to| {
            let note = match to {
                CircuitState::Open => "calls are rejected without touching the network",
                CircuitState::HalfOpen => "one probe may go through",
                CircuitState::Closed => "normal operation",
            };
            println!("   breaker: {from:?} -> {to:?} ({note})");
        })
        .build()?;
    let retry = RetryLayer::new()
        .policy(
            RetryPolicy::new()
                .max_attempts(3)
                .backoff(Backoff::exponential(
                    Duration::from_millis(20),
                    Duration::from_millis(200),
                ))
                .deadline(Duration::from_secs(2)),
        )
        .attempt_header(HeaderName::from_static("retry-attempt"));
    let client = Client::builder(TokioExecutor::new()).build_http();
    let mut stack = ServiceBuilder::new()
        .layer(breaker)
        .layer(retry)
        .layer(TimeoutLayer::new(Duration::from_millis(150)))
        .service(client);

    let started = Instant::now();
    let (mut ok, mut failed, mut rejected) = (0, 0, 0);
    for i in 0..30 {
        match i {
            5 => {
                println!(
                    "-- server turns slow on first attempts (400 ms > the 150 ms attempt timeout)"
                );
                mode.store(SLOW_FIRST_ATTEMPTS, Ordering::SeqCst);
            }
            9 => {
                println!("-- server goes down");
                mode.store(HEALTHY, Ordering::SeqCst);
                server.stop();
            }
            18 => {
                println!("-- server comes back");
                server = Server::start(addr, Arc::clone(&mode)).await?;
            }
            _ => {}
        }
        let request =
            Request::get(format!("http://{addr}/status")).body(Full::new(Bytes::new()))?;
        let t = Instant::now();
        let result = stack.ready().await?.call(request).await;
        let took = t.elapsed();
        let at = started.elapsed().as_secs_f64();
        match result {
            Ok(response) => {
                let info = response
                    .extensions()
                    .get::<RetryInfo>()
                    .cloned()
                    .unwrap_or_default();
                let status = response.status();
                let _ = response.into_body().collect().await;
                // The record's one-line summary: attempts, outcomes, waits, why it stopped.
                println!("{at:5.2}s #{i:<2} {status} in {took:.0?}: {info}");
                ok += 1;
            }
            Err(CircuitBreakerError::OpenCircuit) => {
                println!(
                    "{at:5.2}s #{i:<2} rejected by the open breaker in {took:.0?} (no attempt made)"
                );
                rejected += 1;
            }
            Err(CircuitBreakerError::Inner(error)) => {
                println!("{at:5.2}s #{i:<2} failed in {took:.0?}: {error}");
                failed += 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!(
        "\nsummary: {ok} succeeded, {failed} failed after retries, {rejected} rejected by the breaker, {:.1?} in all",
        started.elapsed()
    );
    Ok(())
}
