//! Hedging against a slow tail.
//!
//! A local hyper server answers in about a millisecond, except one request in a hundred,
//! which takes 200 ms. Sixteen tasks send GETs through a hyper-util client wrapped in the
//! layer, first without hedging, then with a hedge after a fixed 10 ms, then with a hedge
//! at the route's 95th percentile of latency (10 ms until it has its samples). For each,
//! the example prints the latency percentiles, a small histogram, and the extra load the
//! hedges put on the server.
//!
//! Run with `cargo run --release --example hedging`. It ends by itself in a few seconds.
#![allow(clippy::disallowed_methods)] // tokio's paused clock and sleeps, or real time

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tower::{BoxError, Layer, Service, ServiceExt};
use tower_http_retry::{Hedging, ReplayBody, RetryBudget, RetryInfo, RetryLayer, RetryPolicy};

const TASKS: usize = 16;
const REQUESTS: usize = 4_000;
const SLOW: Duration = Duration::from_millis(200);

/// The server: every hundredth request it receives is slow. Returns its address and the
/// count of requests it received.
async fn start_server() -> std::io::Result<(std::net::SocketAddr, Arc<AtomicUsize>)> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let received = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&received);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let count = Arc::clone(&count);
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |_: Request<Incoming>| {
                    let n = count.fetch_add(1, Ordering::Relaxed);
                    async move {
                        let wait = match n % 100 {
                            37 => SLOW,
                            _ => Duration::from_millis(1),
                        };
                        tokio::time::sleep(wait).await;
                        Ok::<_, hyper::Error>(Response::new(Full::new(Bytes::from_static(b"ok"))))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Ok((addr, received))
}

/// What one run measured.
struct Run {
    latencies: Vec<Duration>,
    hedges: u32,
    hedge_wins: u32,
    received: usize,
}

async fn run(
    addr: std::net::SocketAddr,
    received: &AtomicUsize,
    policy: RetryPolicy,
) -> Result<Run, BoxError> {
    let client = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(64)
        .build_http::<ReplayBody<Empty<Bytes>>>();
    // Hedges are paid for by a budget: one of their own here, a fifth of the requests.
    let budget = RetryBudget::builder()
        .ratio(0.2)
        .min_per_sec(10.0)
        .max_tokens(100.0)
        .build();
    let service = RetryLayer::new().policy(policy.gate(budget)).layer(client);
    let before = received.load(Ordering::Relaxed);
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        let (mut service, next) = (service.clone(), Arc::clone(&next));
        tasks.push(tokio::spawn(async move {
            let mut seen = Vec::new();
            while next.fetch_add(1, Ordering::Relaxed) < REQUESTS {
                let request = Request::get(format!("http://{addr}/"))
                    .body(Empty::<Bytes>::new())
                    .unwrap();
                let started = Instant::now();
                let response = service.ready().await?.call(request).await?;
                let info = response.extensions().get::<RetryInfo>().cloned();
                response.into_body().collect().await?;
                seen.push((started.elapsed(), info));
            }
            Ok::<_, BoxError>(seen)
        }));
    }
    let mut run = Run {
        latencies: Vec::with_capacity(REQUESTS),
        hedges: 0,
        hedge_wins: 0,
        received: 0,
    };
    for task in tasks {
        for (latency, info) in task.await?? {
            run.latencies.push(latency);
            if let Some(info) = info {
                run.hedges += info
                    .retries()
                    .iter()
                    .filter(|r| r.kind == tower_http_retry::AttemptKind::Hedge)
                    .count() as u32;
                run.hedge_wins += u32::from(info.returned().is_some_and(|n| n > 1));
            }
        }
    }
    // Let the losers' connections close before the count is read.
    tokio::time::sleep(Duration::from_millis(50)).await;
    run.received = received.load(Ordering::Relaxed) - before;
    Ok(run)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

fn report(name: &str, mut run: Run) {
    run.latencies.sort_unstable();
    let l = &run.latencies;
    println!("{name}");
    println!(
        "  p50 {}   p90 {}   p99 {}   p99.9 {}   max {}",
        ms(percentile(l, 0.5)),
        ms(percentile(l, 0.9)),
        ms(percentile(l, 0.99)),
        ms(percentile(l, 0.999)),
        ms(*l.last().unwrap()),
    );
    println!(
        "  {} hedges ({} won); extra load on the server {:.1}%",
        run.hedges,
        run.hedge_wins,
        (run.received as f64 / l.len() as f64 - 1.0) * 100.0
    );
    // Requests by latency, on a log scale.
    let edges = [1, 2, 5, 10, 20, 50, 100, 200];
    let mut counts = [0usize; 9];
    for latency in l {
        let ms = latency.as_millis() as u64;
        counts[edges.iter().take_while(|&&edge| ms >= edge).count()] += 1;
    }
    let labels = [
        "   <1 ms", "  1-2 ms", "  2-5 ms", " 5-10 ms", "10-20 ms", "20-50 ms", "50-100ms",
        "100-200 ", " >=200ms",
    ];
    let most = counts.iter().copied().max().unwrap_or(1).max(1);
    for (label, count) in labels.iter().zip(counts) {
        // A logarithmic bar, so that the tail's few requests show.
        let bar = match count {
            0 => 0,
            n => 1 + ((n as f64).ln() / (most as f64).ln().max(1.0) * 39.0) as usize,
        };
        println!("  {label} {:>5} {}", count, "#".repeat(bar));
    }
    println!();
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let (addr, received) = start_server().await?;
    println!(
        "{REQUESTS} GETs from {TASKS} tasks; the server takes about 1 ms, and {} ms for one request in a hundred.\n",
        SLOW.as_millis()
    );
    let base = RetryPolicy::new().max_attempts(2);
    let runs = [
        ("no hedging", base.clone()),
        (
            "a hedge after 10 ms (Hedging::after)",
            base.clone()
                .hedge(Hedging::after(Duration::from_millis(10))),
        ),
        (
            "a hedge at the route's 95th percentile (Hedging::percentile(0.95), 10 ms until 50 samples)",
            base.clone()
                .hedge(Hedging::percentile(0.95).fallback(Duration::from_millis(10))),
        ),
    ];
    for (name, policy) in runs {
        let run = run(addr, &received, policy).await?;
        report(name, run);
    }
    Ok(())
}
