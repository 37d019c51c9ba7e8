//! Retry-heavy traffic: CPU time per retry, ours against tower's `Retry`, in the same run.
//!
//! Two in-process hyper HTTP/1 servers on 127.0.0.1: the "heavy" one answers 503 (empty
//! body, no `Retry-After`) to every tenth request it receives, counted across all its
//! connections, and 200 with a 15-byte body to the others; the "clean" one answers 200 to
//! every request. Both read the request body first. Three clients, each twice (one per
//! server, each with its own pool of connections), all hyper-util legacy clients with
//! `TCP_NODELAY`:
//!
//! | cases | client |
//! | --- | --- |
//! | `bare_heavy`, `bare_clean` | the bare client (sees the 503s, retries nothing) |
//! | `ours_heavy`, `ours_clean` | ours: `RetryLayer::new()` with a zero backoff |
//! | `tower_heavy`, `tower_clean` | `tower::retry::Retry` with [`TowerPolicy`] |
//! | `seatbelt_heavy`, `seatbelt_clean` | Microsoft's seatbelt, its retry through its `tower-service` feature |
//! | `adapter_heavy`, `adapter_clean` | the client over seatbelt_http's `HttpBody`, under the adapter of `benches/support/seatbelt.rs`, no retry (sees the 503s) |
//! | `seatbelt_http_heavy`, `seatbelt_http_clean` | seatbelt_http's retry over that adapter |
//!
//! Every retrying client makes at most 3 attempts and retries a 503 at once (ours with a
//! zero `Backoff`, tower's policy with a ready future, seatbelt's with a zero base delay).
//! Ours and tower's deposit into a budget per request and withdraw per retry; both budgets
//! are given room for a retry per request (ours
//! `RetryBudget::builder().ratio(1.0).min_per_sec(10).max_tokens(100).build()`, tower's `TpsBudget::new(10 s, 10, 1.0)`), so neither
//! runs dry and both retry every 503 (the bench prints the 503s left at the end: the
//! requests whose three attempts all drew a 503). seatbelt has no budget: it retries every
//! 503 without that bookkeeping. The retry-heavy traffic is about 11 attempts per 10
//! requests. The `adapter` and `seatbelt_http` clients are sent `HttpBody` requests and
//! read `HttpBody` answers, as a seatbelt_http caller does.
//!
//! The servers run on a runtime of their own (one worker, threads named `server`), the
//! clients on another (one worker, `client`); the bench thread only waits. One batch is
//! 512 requests kept 64 in flight by one task on the client runtime, each response body read
//! to its end; a case's turn in a round is 8 batches. Each round runs every client's two
//! turns back to back (heavy and clean, which goes first alternating from round to round),
//! the order of the clients rotating. Each turn is measured by:
//!
//! - wall time (`std::time::Instant`);
//! - CPU time of the whole process and of the client threads alone, summed from each
//!   thread's `/proc/self/task/*/schedstat` (nanoseconds on the CPU; no thread comes or
//!   goes during the run);
//! - the process's `utime + stime` from `/proc/self/stat` (10 ms ticks), summed over all
//!   rounds as a check on the former;
//! - the attempts the server received, so retries = attempts - requests.
//!
//! Then for each retrying client: CPU per retry = (CPU of the heavy turn - CPU of the clean
//! turn) / the heavy turn's retries, that is what the 503s and their retries added; printed
//! as the median over the rounds and as the total over all rounds, and as ratios (ours /
//! tower, ours / seatbelt, seatbelt_http / seatbelt). The process figure includes the server's half of every extra attempt (the same
//! for both), the client figure is the client threads alone (the connections' tasks
//! included). The bare client's heavy - clean difference per 503 shows what the 503s cost
//! without any retry. The CPU per request of the heavy turns, as medians of per-round
//! ratios, is the steadier figure on a busy machine.
//!
//! Run: `cargo bench --bench retry_heavy`. Linux only (it reads `/proc`).
#![allow(clippy::disallowed_methods)] // measures real time with std's clock

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::StreamExt;
use futures_util::stream;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use http_extensions::HttpBody;
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::runtime::Runtime;
use tower::retry::budget::TpsBudget;
use tower::{BoxError, Layer, Service};
use tower_http_retry::{Backoff, ReplayBody, Retry, RetryBudget, RetryLayer, RetryPolicy};

#[path = "support/mod.rs"]
mod support;
use support::{RequestBody, TowerPolicy, extra_runs, median};
#[path = "support/seatbelt.rs"]
mod seatbelt_rows;

/// Requests per batch.
const BATCH: usize = 512;
/// Requests in flight at once.
const IN_FLIGHT: usize = 64;
/// Batches per case and round.
const PER_ROUND: usize = 8;
/// The heavy server answers 503 to every `EVERY`-th request it receives.
const EVERY: u64 = 10;
/// A server stops accepting after this many connections (the pools need about 200).
const MAX_CONNECTIONS: usize = 4096;
/// What the servers answer with a 200.
const ANSWER: &[u8] = b"ok, handled...\n";

type Bare = Client<HttpConnector, Full<Bytes>>;
type Ours = Retry<Client<HttpConnector, ReplayBody<Full<Bytes>>>>;
type Tower = tower::retry::Retry<TowerPolicy, Bare>;
type Seatbelt = seatbelt_rows::SeatbeltRetry<Full<Bytes>>;

/// A server's address and the number of requests it has received.
struct Server {
    addr: SocketAddr,
    received: Arc<AtomicU64>,
}

/// Starts an HTTP/1 server on 127.0.0.1 on the current runtime. With `every`, it answers
/// 503 to every `every`-th request it receives.
async fn serve(every: Option<u64>) -> Server {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind 127.0.0.1");
    let addr = listener.local_addr().expect("local address");
    let received = Arc::new(AtomicU64::new(0));
    let count = received.clone();
    tokio::spawn(async move {
        for _ in 0..MAX_CONNECTIONS {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let _ = stream.set_nodelay(true);
            let count = count.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                    let n = count.fetch_add(1, Ordering::Relaxed) + 1;
                    let unavailable = every.is_some_and(|e| n.is_multiple_of(e));
                    async move {
                        let _ = request.into_body().collect().await;
                        let response = if unavailable {
                            let mut response = Response::new(Full::new(Bytes::new()));
                            *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
                            response
                        } else {
                            Response::new(Full::new(Bytes::from_static(ANSWER)))
                        };
                        Ok::<_, Infallible>(response)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Server { addr, received }
}

/// A request with the body type `B` its client takes (`Full<Bytes>`, or seatbelt_http's
/// `HttpBody`).
fn request<B: RequestBody>(addr: SocketAddr, method: &Method, i: usize) -> Request<B> {
    let body = if method == Method::GET {
        Bytes::new()
    } else {
        Bytes::from(vec![b'p'; 1024])
    };
    Request::builder()
        .method(method.clone())
        .uri(format!("http://{addr}/items/{i}"))
        .header(http::header::ACCEPT, "text/plain")
        .body(B::of(body))
        .expect("a valid request")
}

/// What the harness asks of a client under test: requests with a body it can make (`B`),
/// answers with a body it can read (`RB`: hyper's `Incoming`, or seatbelt_http's
/// `HttpBody`).
trait Sends<B, RB>:
    Service<Request<B>, Response = Response<RB>, Error = Self::Fails> + Clone + Send + 'static
{
    type Fails: Into<BoxError>;
}

impl<S, B, RB, E> Sends<B, RB> for S
where
    S: Service<Request<B>, Response = Response<RB>, Error = E> + Clone + Send + 'static,
    E: Into<BoxError>,
{
    type Fails = E;
}

/// One request; reads the response body to its end. Returns whether the final answer was
/// a 503.
async fn one<S, B, RB>(svc: S, request: Request<B>) -> bool
where
    S: Sends<B, RB>,
    RB: http_body::Body,
    RB::Error: std::fmt::Debug,
{
    match support::exchange(svc, request).await {
        (StatusCode::OK, body) => {
            assert_eq!(body, ANSWER);
            false
        }
        (StatusCode::SERVICE_UNAVAILABLE, _) => true,
        (other, _) => panic!("unexpected status {other}"),
    }
}

/// `BATCH` requests, `IN_FLIGHT` at a time, from one task; returns the final 503s.
async fn batch<S, B, RB>(svc: S, addr: SocketAddr, method: Method) -> u64
where
    S: Sends<B, RB>,
    B: RequestBody,
    RB: http_body::Body,
    RB::Error: std::fmt::Debug,
{
    stream::iter(0..BATCH)
        .map(move |i| one(svc.clone(), request(addr, &method, i)))
        .buffer_unordered(IN_FLIGHT)
        .filter(|&unavailable| std::future::ready(unavailable))
        .count()
        .await as u64
}

/// CPU time so far, in nanoseconds: of the whole process, and of the client threads.
#[derive(Clone, Copy, Default)]
struct Cpu {
    process: u64,
    client: u64,
}

impl std::ops::Sub for Cpu {
    type Output = Cpu;

    fn sub(self, earlier: Cpu) -> Cpu {
        Cpu {
            process: self.process - earlier.process,
            client: self.client - earlier.client,
        }
    }
}

/// Sums the first field of every thread's `/proc/self/task/<tid>/schedstat` (time on the
/// CPU, ns), and that of the threads named `client` apart.
fn cpu_now() -> Cpu {
    let mut cpu = Cpu::default();
    let tasks = std::fs::read_dir("/proc/self/task").expect("/proc/self/task (Linux only)");
    for task in tasks.flatten() {
        let path = task.path();
        let Ok(schedstat) = std::fs::read_to_string(path.join("schedstat")) else {
            continue; // the thread has just ended
        };
        let ns: u64 = schedstat
            .split_whitespace()
            .next()
            .and_then(|f| f.parse().ok())
            .expect("a schedstat line");
        cpu.process += ns;
        let comm = std::fs::read_to_string(path.join("comm")).unwrap_or_default();
        if comm.starts_with("client") {
            cpu.client += ns;
        }
    }
    cpu
}

/// The process's `utime + stime` from `/proc/self/stat`, in clock ticks (1/100 s).
fn process_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
    // Fields after the command name (in parentheses, which may hold spaces): the state is
    // field 3, utime field 14, stime field 15.
    let rest = &stat[stat.rfind(')').expect("a stat line") + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| -> u64 { fields[n - 3].parse().expect("a tick count") };
    field(14) + field(15)
}

/// What one turn of one case measured.
#[derive(Clone, Copy)]
struct Turn {
    secs: f64,
    cpu: Cpu,
    ticks: u64,
    attempts: u64,
    unavailable: u64,
}

/// Runs `PER_ROUND` batches through `svc` on the client runtime and measures them.
fn turn<S, B, RB>(runtime: &Runtime, svc: &S, server: &Server, method: &Method) -> Turn
where
    S: Sends<B, RB>,
    S::Future: Send,
    B: RequestBody + Send + 'static,
    RB: http_body::Body + Send + 'static,
    RB::Data: Send,
    RB::Error: std::fmt::Debug,
{
    let svc = svc.clone();
    let (addr, method) = (server.addr, method.clone());
    let received = server.received.load(Ordering::Relaxed);
    let (ticks, cpu, start) = (process_ticks(), cpu_now(), Instant::now());
    let unavailable = runtime
        .block_on(runtime.spawn(async move {
            let mut unavailable = 0;
            for _ in 0..PER_ROUND {
                unavailable += batch(svc.clone(), addr, method.clone()).await;
            }
            unavailable
        }))
        .expect("the client task");
    let secs = start.elapsed().as_secs_f64();
    Turn {
        secs,
        cpu: cpu_now() - cpu,
        ticks: process_ticks() - ticks,
        attempts: server.received.load(Ordering::Relaxed) - received,
        unavailable,
    }
}

/// One client under test, and its server.
struct Case<'a> {
    name: &'static str,
    run: Box<dyn Fn(&Method) -> Turn + 'a>,
}

fn case<'a, S, B, RB>(
    name: &'static str,
    runtime: &'a Runtime,
    svc: &'a S,
    server: &'a Server,
) -> Case<'a>
where
    S: Sends<B, RB>,
    S::Future: Send,
    B: RequestBody + Send + 'static,
    RB: http_body::Body + Send + 'static,
    RB::Data: Send,
    RB::Error: std::fmt::Debug,
{
    Case {
        name,
        run: Box::new(move |method| turn(runtime, svc, server, method)),
    }
}

/// A hyper-util legacy client over HTTP/1, `TCP_NODELAY` on (as in `benches/end_to_end.rs`).
fn client<B>() -> Client<HttpConnector, B>
where
    B: http_body::Body + Send,
    B::Data: Send,
{
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    Client::builder(TokioExecutor::new()).build(connector)
}

/// Ours: every default but a zero backoff and a budget with room for a retry per request.
fn ours() -> Ours {
    RetryLayer::new()
        .policy(
            RetryPolicy::new()
                .backoff(Backoff::exponential(Duration::ZERO, Duration::ZERO))
                .gate(
                    RetryBudget::builder()
                        .ratio(1.0)
                        .min_per_sec(10.0)
                        .max_tokens(100.0)
                        .build(),
                ),
        )
        .layer(client())
}

/// Tower's `Retry` with the policy the other benches use, over a budget with room for a
/// retry per request.
fn tower() -> Tower {
    let budget = TpsBudget::new(Duration::from_secs(10), 10, 1.0);
    tower::retry::Retry::new(TowerPolicy::with_budget(budget), client())
}

/// seatbelt's retry (`benches/support/seatbelt.rs`): 3 attempts, no delay between them.
fn seatbelt(clock: &tick::Clock) -> Seatbelt {
    seatbelt_rows::retry(clock, client(), Duration::ZERO)
}

/// The client over seatbelt_http's `HttpBody`, under the adapter alone.
fn adapter() -> seatbelt_rows::Adapter {
    seatbelt_rows::Adapter(client())
}

/// seatbelt_http's retry over the adapter, as [`seatbelt`].
fn seatbelt_http(clock: &tick::Clock) -> seatbelt_rows::HttpRetrying {
    seatbelt_rows::http_retry(clock, adapter(), Duration::ZERO)
}

const US: f64 = 1e-3; // ns to µs

/// Cycles through the cases `rounds` times and prints the medians.
fn interleaved(cases: &[Case<'_>], method: &Method, rounds: usize) {
    let n = cases.len();
    let mut turns: Vec<Vec<Turn>> = vec![Vec::with_capacity(rounds); n];
    // Cases come in pairs, heavy then clean, for one client after the other; a pair's
    // turns run back to back, so that their difference sees the same load. The order of the
    // clients rotates every round, and within a pair which goes first alternates.
    let pairs = n / 2;
    for round in 0..rounds {
        for k in 0..pairs {
            let p = (round + k) % pairs;
            let order = if round % 2 == 0 {
                [2 * p, 2 * p + 1]
            } else {
                [2 * p + 1, 2 * p]
            };
            for i in order {
                turns[i].push((cases[i].run)(method));
            }
        }
    }
    let requests = (PER_ROUND * BATCH) as f64;
    let name = if method == Method::GET {
        "get"
    } else {
        "put_1k"
    };
    println!(
        "retry-heavy {name} ({rounds} rounds of {PER_ROUND} x {BATCH} requests per case, \
         64 in flight; the heavy server answers 503 to every {EVERY}th request):"
    );
    println!(
        "  {:<20} {:>8} {:>13} {:>12} {:>13} {:>13} {:>15}",
        "case",
        "req/s",
        "process µs/req",
        "client µs/req",
        "attempts/req",
        "final 503s/turn",
        "stat µs/req"
    );
    let med = |i: usize, f: &dyn Fn(&Turn) -> f64| {
        let mut v: Vec<f64> = turns[i].iter().map(f).collect();
        median(&mut v)
    };
    for (i, case) in cases.iter().enumerate() {
        let ticks: u64 = turns[i].iter().map(|t| t.ticks).sum();
        // 10 ms per tick, summed over the rounds.
        let stat_us = ticks as f64 * 10_000.0 / (requests * rounds as f64);
        println!(
            "  {:<20} {:>8.0} {:>13.2} {:>12.2} {:>13.3} {:>15.1} {:>15.2}",
            case.name,
            med(i, &|t| requests / t.secs),
            med(i, &|t| t.cpu.process as f64 * US / requests),
            med(i, &|t| t.cpu.client as f64 * US / requests),
            med(i, &|t| t.attempts as f64 / requests),
            med(i, &|t| t.unavailable as f64),
            stat_us,
        );
    }
    let at = |name: &str| {
        cases
            .iter()
            .position(|c| c.name == name)
            .expect("a case by that name")
    };
    let (bare, ours, tower) = (at("bare_heavy"), at("ours_heavy"), at("tower_heavy"));
    let (bare_clean, ours_clean, tower_clean) =
        (at("bare_clean"), at("ours_clean"), at("tower_clean"));
    let (seatbelt, adapter, seatbelt_http) = (
        at("seatbelt_heavy"),
        at("adapter_heavy"),
        at("seatbelt_http_heavy"),
    );
    let (seatbelt_clean, adapter_clean) = (at("seatbelt_clean"), at("adapter_clean"));
    let logical = (PER_ROUND * BATCH) as u64;
    // What the 503s and their retries added, per retry, in ns: per round (heavy turn minus
    // the clean turn of the same round, over the heavy turn's retries), and over all rounds.
    let per_retry = |heavy: usize, clean: usize, f: fn(&Cpu) -> u64| -> (f64, f64) {
        let pairs = turns[heavy].iter().zip(&turns[clean]);
        let mut rounds: Vec<f64> = pairs
            .clone()
            .map(|(h, c)| {
                let retries = h.attempts.saturating_sub(logical).max(1);
                (f(&h.cpu) as f64 - f(&c.cpu) as f64) / retries as f64
            })
            .collect();
        let (mut extra, mut retries) = (0.0, 0u64);
        for (h, c) in pairs {
            extra += f(&h.cpu) as f64 - f(&c.cpu) as f64;
            retries += h.attempts.saturating_sub(logical);
        }
        (median(&mut rounds), extra / retries.max(1) as f64)
    };
    let ratio = |a: usize, b: usize, f: fn(&Cpu) -> u64| {
        let mut r: Vec<f64> = turns[a]
            .iter()
            .zip(&turns[b])
            .map(|(x, y)| f(&x.cpu) as f64 / f(&y.cpu) as f64)
            .collect();
        median(&mut r)
    };
    println!(
        "  CPU per retry, (heavy - clean) / retries, µs (median of rounds / all rounds): \
         process, client threads"
    );
    let by: [fn(&Cpu) -> u64; 2] = [|c| c.process, |c| c.client];
    // Each retrying client's heavy case is followed by its clean one.
    let retrying = ["ours", "tower", "seatbelt", "seatbelt_http"];
    let figures: Vec<((f64, f64), (f64, f64))> = retrying
        .iter()
        .map(|name| {
            let h = at(&format!("{name}_heavy"));
            (per_retry(h, h + 1, by[0]), per_retry(h, h + 1, by[1]))
        })
        .collect();
    for (name, (p, c)) in retrying.iter().zip(&figures) {
        println!(
            "    {name:<14} {:>6.2} / {:>6.2}   {:>6.2} / {:>6.2}",
            p.0 * US,
            p.1 * US,
            c.0 * US,
            c.1 * US
        );
    }
    // Bare retries nothing: its heavy turn minus its clean turn, per 503 received.
    let bare_503 = |f: fn(&Cpu) -> u64| {
        let mut v: Vec<f64> = turns[bare]
            .iter()
            .zip(&turns[bare_clean])
            .map(|(h, c)| (f(&h.cpu) as f64 - f(&c.cpu) as f64) / h.unavailable.max(1) as f64)
            .collect();
        median(&mut v)
    };
    println!(
        "    (bare, per 503 without a retry: {:.2}, {:.2})",
        bare_503(by[0]) * US,
        bare_503(by[1]) * US
    );
    for (label, a, b) in [
        ("ours / tower", 0, 1),
        ("ours / seatbelt", 0, 2),
        ("seatbelt_http / seatbelt", 3, 2),
    ] {
        let ((ap, ac), (bp, bc)) = (figures[a], figures[b]);
        println!(
            "    {label:<24} {:>6.3} / {:>6.3}   {:>6.3} / {:>6.3}",
            ap.0 / bp.0,
            ap.1 / bp.1,
            ac.0 / bc.0,
            ac.1 / bc.1
        );
    }
    println!(
        "  CPU per request, medians of per-round ratios (process, client threads): \
         heavy ours / tower {:.3}, {:.3}; heavy ours / bare {:.3}, {:.3}; \
         heavy tower / bare {:.3}, {:.3}; clean ours / tower {:.3}, {:.3}",
        ratio(ours, tower, by[0]),
        ratio(ours, tower, by[1]),
        ratio(ours, bare, by[0]),
        ratio(ours, bare, by[1]),
        ratio(tower, bare, by[0]),
        ratio(tower, bare, by[1]),
        ratio(ours_clean, tower_clean, by[0]),
        ratio(ours_clean, tower_clean, by[1]),
    );
    println!(
        "  CPU per request, seatbelt (process, client threads): \
         heavy ours / seatbelt {:.3}, {:.3}; heavy seatbelt / bare {:.3}, {:.3}; \
         heavy seatbelt / tower {:.3}, {:.3}; clean ours / seatbelt {:.3}, {:.3}; \
         heavy adapter / bare {:.3}, {:.3}; clean adapter / bare {:.3}, {:.3}; \
         heavy seatbelt_http / adapter {:.3}, {:.3}; heavy seatbelt_http / seatbelt {:.3}, {:.3}",
        ratio(ours, seatbelt, by[0]),
        ratio(ours, seatbelt, by[1]),
        ratio(seatbelt, bare, by[0]),
        ratio(seatbelt, bare, by[1]),
        ratio(seatbelt, tower, by[0]),
        ratio(seatbelt, tower, by[1]),
        ratio(ours_clean, seatbelt_clean, by[0]),
        ratio(ours_clean, seatbelt_clean, by[1]),
        ratio(adapter, bare, by[0]),
        ratio(adapter, bare, by[1]),
        ratio(adapter_clean, bare_clean, by[0]),
        ratio(adapter_clean, bare_clean, by[1]),
        ratio(seatbelt_http, adapter, by[0]),
        ratio(seatbelt_http, adapter, by[1]),
        ratio(seatbelt_http, seatbelt, by[0]),
        ratio(seatbelt_http, seatbelt, by[1]),
    );
    // Requests per second under retry-heavy traffic, `a` over `b`, per round.
    let wall = |a: usize, b: usize| {
        let mut r: Vec<f64> = turns[a]
            .iter()
            .zip(&turns[b])
            .map(|(x, y)| y.secs / x.secs)
            .collect();
        median(&mut r)
    };
    println!(
        "  requests per second under retry-heavy traffic (per round): ours / tower {:.3}; \
         ours / seatbelt {:.3}; seatbelt / tower {:.3}; adapter / bare {:.3}; \
         seatbelt_http / adapter {:.3}",
        wall(ours, tower),
        wall(ours, seatbelt),
        wall(seatbelt, tower),
        wall(adapter, bare),
        wall(seatbelt_http, adapter),
    );
}

fn main() {
    let rounds = extra_runs(30);
    if rounds == 0 {
        return;
    }
    let servers = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("server")
        .enable_all()
        .build()
        .expect("the servers' runtime");
    let clients = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("client")
        .enable_all()
        .build()
        .expect("the clients' runtime");
    let heavy = servers.block_on(serve(Some(EVERY)));
    let clean = servers.block_on(serve(None));
    let (bare_heavy, bare_clean): (Bare, Bare);
    let (ours_heavy, ours_clean, tower_heavy, tower_clean);
    let (seatbelt_heavy, seatbelt_clean, adapter_heavy, adapter_clean);
    let (seatbelt_http_heavy, seatbelt_http_clean);
    {
        let _guard = clients.enter();
        (bare_heavy, bare_clean) = (client(), client());
        (ours_heavy, ours_clean) = (ours(), ours());
        (tower_heavy, tower_clean) = (tower(), tower());
        let clock = seatbelt_rows::clock();
        (seatbelt_heavy, seatbelt_clean) = (seatbelt(&clock), seatbelt(&clock));
        (adapter_heavy, adapter_clean) = (adapter(), adapter());
        (seatbelt_http_heavy, seatbelt_http_clean) = (seatbelt_http(&clock), seatbelt_http(&clock));
    }
    let rt = &clients;
    // In pairs, heavy then clean (see `interleaved`).
    let cases = [
        case("bare_heavy", rt, &bare_heavy, &heavy),
        case("bare_clean", rt, &bare_clean, &clean),
        case("ours_heavy", rt, &ours_heavy, &heavy),
        case("ours_clean", rt, &ours_clean, &clean),
        case("tower_heavy", rt, &tower_heavy, &heavy),
        case("tower_clean", rt, &tower_clean, &clean),
        case("seatbelt_heavy", rt, &seatbelt_heavy, &heavy),
        case("seatbelt_clean", rt, &seatbelt_clean, &clean),
        case::<_, HttpBody, HttpBody>("adapter_heavy", rt, &adapter_heavy, &heavy),
        case::<_, HttpBody, HttpBody>("adapter_clean", rt, &adapter_clean, &clean),
        case::<_, HttpBody, HttpBody>("seatbelt_http_heavy", rt, &seatbelt_http_heavy, &heavy),
        case::<_, HttpBody, HttpBody>("seatbelt_http_clean", rt, &seatbelt_http_clean, &clean),
    ];
    // Warm up: every pool opens its connections.
    for case in &cases {
        (case.run)(&Method::GET);
    }
    for method in [Method::GET, Method::PUT] {
        interleaved(&cases, &method, rounds);
    }
}
