//! Hedging against a slow tail: ours against tower's `hedge`, a hand-written fixed-delay
//! hedge and no hedging at all, in the same run, interleaved, over HTTP/1 and HTTP/2.
//!
//! In-process hyper servers on 127.0.0.1 (HTTP/1, and prior-knowledge cleartext HTTP/2)
//! answer 200 with a 2-byte body after about 1 ms (`tokio::time::sleep(1 ms)`), or after
//! 200 ms for a chosen fraction of the requests they receive: 1% (the setting) and
//! 5%. Which arrivals are slow is a seeded deterministic function of the arrival number
//! (splitmix64 of a fixed seed plus the server's count of requests received, below the
//! fraction of 2^64): every arrival, a hedge included, is slow with the same probability,
//! independently of the others, and a rerun sees the same sequence. A third server answers
//! 503 to everything after the same 1 ms (a total outage).
//!
//! Sixteen tasks share each client (hyper-util legacy clients over an `HttpConnector` with
//! `TCP_NODELAY`; over HTTP/2 built `http2_only(true)`, one connection), each task sending
//! GETs one after the other until the round's count is reached; a request's latency runs from
//! the call to the end of its response body. The clients:
//!
//! | name | what |
//! | --- | --- |
//! | `bare` | the client alone |
//! | `tower p0.9` | `tower::hedge::Hedge::new(client, policy, 10, 0.9, 1 s)`: its policy clones every GET (method, URI, version, headers) and allows every hedge |
//! | `hand 10ms` | a hand-written hedge: the request, and if it has not answered after 10 ms a second one; the first to answer wins, the other is dropped |
//! | `ours after 10ms` | `RetryPolicy::default().max_attempts(2).hedge(Hedging::after(10 ms))` |
//! | `ours p0.9` and up | `max_attempts(2)` and `Hedging::percentile(p).fallback(10 ms)` (50 samples by default) |
//! | `ours 3x after 10ms` | `max_attempts(3)` and `Hedging::after(10 ms)` (the 5% setting only) |
//! | `seatbelt after 10ms` | Microsoft's seatbelt, its hedging through its `tower-service` feature: 2 attempts, the second after 10 ms (`benches/support/seatbelt.rs`) |
//! | `seatbelt_http after 10ms` | seatbelt_http's hedging over a hyper-util client through the adapter of `benches/support/seatbelt.rs`, the same settings |
//! | `seatbelt 3x after 10ms` | seatbelt's, 3 attempts, each after 10 ms (the 5% setting and the outage; in the outage seatbelt_http's too) |
//!
//! Ours runs under `RetryPolicy::no_gates()` in the latency settings, so that the
//! budget, which pays for every hedge, does not get in the way of what is measured; in the
//! outage it runs with the default budget (and, for contrast, with none). seatbelt has no
//! budget, and no delay read from the latencies: a fixed delay (or one computed from the
//! request) is what it offers. Like ours, it sends the next attempt at once when one answers
//! with a status worth another (a 503 here); its timers run on tick's clock, driven by a
//! task on the clients' runtime. It keeps no record of its hedges, so its hedges per request
//! and delay are not printed (the server's count gives its extra load).
//!
//! Tower's `Hedge` is not `Clone`: the tasks share it behind a `std::sync::Mutex`, held only
//! for `poll_ready` (always ready over a hyper-util client) and `call`. Its docs suggest no
//! period or minimum of data points; 10 data points is what its own tests use, and the
//! period is 1 s (its tests' 60 s would leave it without a histogram to read for the whole
//! run: it reads the previous period's). Every client's wrapper (tower's `Hedge` and its
//! histogram, our layer and its latency record and budget) is made afresh for each round,
//! over a hyper-util client kept for the whole run (so connections are not set up again),
//! so each round measures the hedging from its first requests on.
//!
//! A round runs every client once per setting and protocol, one after the other, the order
//! rotating from round to round, so that the load of the shared machine spreads over all of
//! them. Per client the bench prints p50, p90, p99 and p99.9 of the latencies, the extra load
//! (requests the server received / requests sent - 1), hedges per request (ours from
//! `RetryInfo::hedges()`, the hand-written one its own count; tower's says nothing), the
//! share of requests a hedge won, for ours the requests the budget stopped
//! (`StopReason::BudgetExhausted`), and the median time from a request's first attempt to
//! its first hedge (ours: the first hedge's `RetryRecord::wait`), each as the median of the
//! rounds and their range.
//!
//! Run: `cargo bench -p tower-http-retry-benches --bench hedging` (or `cargo bench --bench
//! hedging` in the repository's root), about 4.5 minutes. `HEDGING_REQUESTS` sets the
//! requests per client and round (20 000 by default; half of it in the 5% setting, a
//! quarter in the outage) and `HEDGING_ROUNDS` the rounds (2).
//! Under `cargo test --benches` it makes one small round.
#![allow(clippy::disallowed_methods)] // measures real time with std's clock

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tick::Clock;
use tokio::net::TcpListener;
use tokio::runtime::Runtime;
use tower::{BoxError, Layer, Service, ServiceExt};
use tower_http_retry::{
    AttemptKind, Hedging, ReplayBody, Retry, RetryInfo, RetryLayer, RetryPolicy, StopReason,
};

#[path = "support/mod.rs"]
mod support;
use support::median;
#[path = "support/seatbelt.rs"]
mod seatbelt_rows;
use seatbelt_rows::{Adapter, HttpClient, HttpHedge, SeatbeltHedge};

/// Tasks sharing a client.
const TASKS: usize = 16;
/// Requests per client and round, unless `HEDGING_REQUESTS` says otherwise.
const REQUESTS: usize = 20_000;
/// Rounds, unless `HEDGING_ROUNDS` says otherwise.
const ROUNDS: usize = 2;
/// A slow answer.
const SLOW: Duration = Duration::from_millis(200);
/// Every other answer (tokio's timer makes it 1 to 2 ms).
const FAST: Duration = Duration::from_millis(1);
/// The fixed hedging delay.
const DELAY: Duration = Duration::from_millis(10);
/// Which arrivals are slow follows from this seed.
const SEED: u64 = 0x6865_6467_696e_6721;
/// A client's run in a round stops sending after this long, whatever its count.
const RUN_LIMIT: Duration = Duration::from_secs(60);
/// A server accepts at most this many connections (HTTP/1 hedges that lose close theirs).
const MAX_CONNECTIONS: usize = 1_000_000;
/// The default budget's figures, for the outage's bound: tokens at the start, deposit per
/// request, tokens per second.
const BUDGET_START: f64 = 100.0;
const BUDGET_RATIO: f64 = 0.1;
const BUDGET_PER_SEC: f64 = 10.0;

type Plain = Client<HttpConnector, Empty<Bytes>>;
type Replay = Client<HttpConnector, ReplayBody<Empty<Bytes>>>;
type Ours = Retry<Replay>;
type TowerHedge = tower::hedge::Hedge<Plain, ClonePolicy>;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Proto {
    H1,
    H2,
}

impl Proto {
    fn name(self) -> &'static str {
        match self {
            Proto::H1 => "HTTP/1",
            Proto::H2 => "HTTP/2",
        }
    }
}

/// What a server does.
#[derive(Clone, Copy, PartialEq)]
enum Setting {
    /// 200 after 200 ms for this fraction of arrivals, after 1 ms for the others.
    Slow(f64),
    /// 503 to everything, after 1 ms.
    Outage,
}

impl Setting {
    fn name(self) -> String {
        match self {
            Setting::Slow(fraction) => format!("{}% slow", fraction * 100.0),
            Setting::Outage => "outage (503 to all)".to_owned(),
        }
    }
}

/// splitmix64: a well-mixed 64-bit value of `x`.
fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A running server: its address, and the requests it received.
struct Server {
    addr: SocketAddr,
    received: Arc<AtomicU64>,
}

/// Starts a server on 127.0.0.1 on the current runtime.
async fn serve(proto: Proto, setting: Setting) -> Server {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind 127.0.0.1");
    let addr = listener.local_addr().expect("local address");
    let received = Arc::new(AtomicU64::new(0));
    let count = Arc::clone(&received);
    let threshold = match setting {
        Setting::Slow(fraction) => (fraction * u64::MAX as f64) as u64,
        Setting::Outage => 0,
    };
    tokio::spawn(async move {
        for _ in 0..MAX_CONNECTIONS {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let _ = stream.set_nodelay(true);
            let count = Arc::clone(&count);
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |_: Request<Incoming>| {
                    let n = count.fetch_add(1, Ordering::Relaxed);
                    async move {
                        let slow = mix(SEED.wrapping_add(n)) < threshold;
                        tokio::time::sleep(if slow { SLOW } else { FAST }).await;
                        let mut response = Response::new(Full::new(Bytes::from_static(b"ok")));
                        if setting == Setting::Outage {
                            *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
                        }
                        Ok::<_, hyper::Error>(response)
                    }
                });
                let io = TokioIo::new(stream);
                let _ = match proto {
                    Proto::H1 => {
                        hyper::server::conn::http1::Builder::new()
                            .serve_connection(io, service)
                            .await
                    }
                    Proto::H2 => {
                        hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                            .serve_connection(io, service)
                            .await
                    }
                };
            });
        }
    });
    Server { addr, received }
}

fn client<B>(proto: Proto) -> Client<HttpConnector, B>
where
    B: http_body::Body + Send,
    B::Data: Send,
{
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    Client::builder(TokioExecutor::new())
        .http2_only(proto == Proto::H2)
        .build(connector)
}

fn get(uri: &Uri) -> Request<Empty<Bytes>> {
    Request::get(uri.clone())
        .body(Empty::new())
        .expect("a valid request")
}

/// Tower's hedging policy: every GET may be hedged, cloned field by field (`Request` is not
/// `Clone`).
#[derive(Clone)]
struct ClonePolicy;

impl tower::hedge::Policy<Request<Empty<Bytes>>> for ClonePolicy {
    fn clone_request(&self, request: &Request<Empty<Bytes>>) -> Option<Request<Empty<Bytes>>> {
        let mut copy = Request::new(Empty::new());
        *copy.method_mut() = request.method().clone();
        *copy.uri_mut() = request.uri().clone();
        *copy.version_mut() = request.version();
        *copy.headers_mut() = request.headers().clone();
        Some(copy)
    }

    fn can_retry(&self, _: &Request<Empty<Bytes>>) -> bool {
        true
    }
}

/// A client under test, as configured.
#[derive(Clone)]
enum Kind {
    Bare,
    Tower,
    Hand,
    /// Our layer: its policy, and whether it has the default budget (else none).
    Ours(Box<RetryPolicy>, bool),
    /// seatbelt's hedging, this many attempts in all.
    Seatbelt(u8),
    /// seatbelt_http's hedging over the adapter, this many attempts in all.
    SeatbeltHttp(u8),
}

/// A client under test: its name and kind, and the hyper-util client it wraps, one per
/// protocol, kept for the whole run (and, for seatbelt's, the clock of its timers).
struct Spec {
    name: String,
    kind: Kind,
    plain: [Plain; 2],
    replay: [Replay; 2],
    http: [HttpClient; 2],
    clock: Option<Clock>,
}

/// A client's wrapper for one round, shared by the tasks.
#[derive(Clone)]
enum Sender {
    Bare(Plain),
    Tower(Arc<Mutex<TowerHedge>>),
    Hand(Plain),
    Ours(Ours),
    Seatbelt(SeatbeltHedge<Empty<Bytes>>),
    SeatbeltHttp(HttpHedge),
}

impl Spec {
    /// Must be called inside the clients' runtime (seatbelt's clock spawns its driver there).
    fn new(name: impl Into<String>, kind: Kind) -> Self {
        let clock =
            matches!(kind, Kind::Seatbelt(_) | Kind::SeatbeltHttp(_)).then(seatbelt_rows::clock);
        Self {
            name: name.into(),
            kind,
            plain: [client(Proto::H1), client(Proto::H2)],
            replay: [client(Proto::H1), client(Proto::H2)],
            http: [client(Proto::H1), client(Proto::H2)],
            clock,
        }
    }

    /// A fresh wrapper (a new histogram, record or budget) over the kept client.
    fn sender(&self, proto: Proto) -> Sender {
        let i = usize::from(proto == Proto::H2);
        let plain = self.plain[i].clone();
        match &self.kind {
            Kind::Bare => Sender::Bare(plain),
            Kind::Hand => Sender::Hand(plain),
            Kind::Tower => Sender::Tower(Arc::new(Mutex::new(tower::hedge::Hedge::new(
                plain,
                ClonePolicy,
                10,
                0.9,
                Duration::from_secs(1),
            )))),
            Kind::Ours(policy, budget) => {
                let policy = RetryPolicy::clone(policy);
                let policy = if *budget { policy } else { policy.no_gates() };
                Sender::Ours(
                    RetryLayer::new()
                        .policy(policy)
                        .layer(self.replay[i].clone()),
                )
            }
            Kind::Seatbelt(attempts) => Sender::Seatbelt(seatbelt_rows::hedge(
                self.clock.as_ref().expect("seatbelt's clock"),
                plain,
                *attempts,
                DELAY,
            )),
            Kind::SeatbeltHttp(attempts) => Sender::SeatbeltHttp(seatbelt_rows::http_hedge(
                self.clock.as_ref().expect("seatbelt's clock"),
                Adapter(self.http[i].clone()),
                *attempts,
                DELAY,
            )),
        }
    }
}

/// One request's measure.
#[derive(Clone, Copy, Default)]
struct Sample {
    latency: Duration,
    hedges: u32,
    hedge_won: bool,
    budget_stopped: bool,
    ok: bool,
    /// The time from the first attempt to the first hedge, when one was sent.
    hedge_after: Option<Duration>,
}

/// Reads a response body to its end (hyper's `Incoming`, or seatbelt_http's `HttpBody`).
async fn read<B>(response: Response<B>) -> Result<StatusCode, BoxError>
where
    B: http_body::Body,
    B::Error: Into<BoxError>,
{
    let status = response.status();
    response.into_body().collect().await.map_err(Into::into)?;
    Ok(status)
}

impl Sender {
    async fn send(&self, uri: &Uri) -> Result<Sample, BoxError> {
        let start = Instant::now();
        let mut sample = Sample::default();
        let status = match self {
            Sender::Bare(client) => read(client.request(get(uri)).await?).await?,
            Sender::Tower(hedge) => {
                let future = {
                    let mut hedge = hedge.lock().expect("tower's hedge");
                    let mut cx = Context::from_waker(Waker::noop());
                    match hedge.poll_ready(&mut cx) {
                        Poll::Ready(Ok(())) => {}
                        _ => panic!("tower's hedge over a hyper-util client is always ready"),
                    }
                    hedge.call(get(uri))
                };
                read(future.await?).await?
            }
            Sender::Hand(client) => {
                let first = client.request(get(uri));
                tokio::pin!(first);
                let response = tokio::select! {
                    biased;
                    response = &mut first => response?,
                    () = tokio::time::sleep(DELAY) => {
                        sample.hedges = 1;
                        sample.hedge_after = Some(start.elapsed());
                        let second = client.request(get(uri));
                        tokio::select! {
                            biased;
                            response = &mut first => response?,
                            response = second => {
                                sample.hedge_won = true;
                                response?
                            }
                        }
                    }
                };
                read(response).await?
            }
            Sender::Ours(service) => {
                let response = service.clone().oneshot(get(uri)).await?;
                if let Some(info) = response.extensions().get::<RetryInfo>() {
                    sample.hedges = info
                        .retries()
                        .iter()
                        .filter(|r| r.kind == tower_http_retry::AttemptKind::Hedge)
                        .count() as u32;
                    sample.hedge_won = info.returned().is_some_and(|n| n > 1);
                    sample.budget_stopped = info.stop() == StopReason::BudgetExhausted;
                    sample.hedge_after = info
                        .retries()
                        .iter()
                        .find(|r| r.kind == AttemptKind::Hedge)
                        .map(|r| r.wait);
                }
                read(response).await?
            }
            Sender::Seatbelt(service) => {
                read(ServiceExt::oneshot(service.clone(), get(uri)).await?).await?
            }
            Sender::SeatbeltHttp(service) => {
                let request = Request::get(uri.clone())
                    .body(seatbelt_rows::bodies().empty())
                    .expect("a valid request");
                read(ServiceExt::oneshot(service.clone(), request).await?).await?
            }
        };
        sample.latency = start.elapsed();
        sample.ok = status.is_success();
        Ok(sample)
    }
}

/// What one client measured in one round.
#[derive(Clone, Copy)]
struct Stats {
    p50: f64,
    p90: f64,
    p99: f64,
    p999: f64,
    load: f64,
    /// Attempts the server received per request.
    attempts: f64,
    /// `None` where the client does not say (tower's).
    hedges: Option<f64>,
    hedge_wins: Option<f64>,
    budget_stops: Option<f64>,
    /// The median time from the first attempt to the first hedge, in ms.
    hedge_after: Option<f64>,
    ok: f64,
    requests: usize,
    seconds: f64,
}

/// Nearest rank.
fn percentile(sorted: &[Duration], p: f64) -> f64 {
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1].as_secs_f64() * 1e3
}

/// `requests` GETs through `sender` from `TASKS` tasks.
fn run(runtime: &Runtime, sender: Sender, server: &Server, requests: usize) -> Stats {
    let uri: Uri = format!("http://{}/", server.addr).parse().expect("a URI");
    let before = server.received.load(Ordering::Relaxed);
    let start = Instant::now();
    let samples = runtime.block_on(async {
        let next = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::with_capacity(TASKS);
        for _ in 0..TASKS {
            let (sender, next, uri) = (sender.clone(), Arc::clone(&next), uri.clone());
            tasks.push(tokio::spawn(async move {
                let mut samples = Vec::with_capacity(requests / TASKS + 1);
                while next.fetch_add(1, Ordering::Relaxed) < requests && start.elapsed() < RUN_LIMIT
                {
                    samples.push(sender.send(&uri).await.expect("a response from 127.0.0.1"));
                }
                samples
            }));
        }
        let mut samples = Vec::with_capacity(requests);
        for task in tasks {
            samples.extend(task.await.expect("a client task"));
        }
        // Let the last hedges reach the server before its count is read.
        tokio::time::sleep(Duration::from_millis(30)).await;
        samples
    });
    let seconds = start.elapsed().as_secs_f64();
    let received = server.received.load(Ordering::Relaxed) - before;
    let n = samples.len().max(1) as f64;
    let mut latencies: Vec<Duration> = samples.iter().map(|s| s.latency).collect();
    latencies.sort_unstable();
    let says = matches!(sender, Sender::Hand(_) | Sender::Ours(_));
    let ours = matches!(sender, Sender::Ours(_));
    let share = |f: &dyn Fn(&Sample) -> f64| samples.iter().map(f).sum::<f64>() / n;
    Stats {
        p50: percentile(&latencies, 0.5),
        p90: percentile(&latencies, 0.9),
        p99: percentile(&latencies, 0.99),
        p999: percentile(&latencies, 0.999),
        load: received as f64 / n - 1.0,
        attempts: received as f64 / n,
        hedges: says.then(|| share(&|s| f64::from(s.hedges))),
        hedge_wins: says.then(|| share(&|s| f64::from(u8::from(s.hedge_won)))),
        budget_stops: ours.then(|| share(&|s| f64::from(u8::from(s.budget_stopped)))),
        hedge_after: says
            .then(|| {
                let mut after: Vec<f64> = samples
                    .iter()
                    .filter_map(|s| s.hedge_after)
                    .map(|d| d.as_secs_f64() * 1e3)
                    .collect();
                median(&mut after)
            })
            .filter(|m| !m.is_nan()),
        ok: share(&|s| f64::from(u8::from(s.ok))),
        requests: samples.len(),
        seconds,
    }
}

/// The median over the rounds and the range, of one figure.
struct Spread {
    median: f64,
    min: f64,
    max: f64,
}

fn spread(values: impl Iterator<Item = f64>) -> Spread {
    let mut values: Vec<f64> = values.collect();
    let min = values.iter().copied().fold(f64::INFINITY, f64::min);
    let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    Spread {
        median: median(&mut values),
        min,
        max,
    }
}

impl Spread {
    /// `median (min-max)`, with `digits` decimals, scaled by `scale`.
    fn show(&self, scale: f64, digits: usize) -> String {
        if self.median.is_nan() {
            return "-".to_owned();
        }
        let (m, a, b) = (self.median * scale, self.min * scale, self.max * scale);
        if (b - a).abs() < 0.5 * 10f64.powi(-(digits as i32)) {
            format!("{m:.digits$}")
        } else {
            format!("{m:.digits$} ({a:.digits$}-{b:.digits$})")
        }
    }
}

/// The figures of one table: its setting and protocol, and per client the rounds' stats.
struct Table {
    setting: Setting,
    proto: Proto,
    names: Vec<String>,
    rounds: Vec<Vec<Stats>>,
}

impl Table {
    fn of(&self, name: &str, f: impl Fn(&Stats) -> f64) -> Spread {
        let i = self.names.iter().position(|n| n == name);
        spread(
            i.map(|i| self.rounds[i].iter().map(&f).collect::<Vec<_>>())
                .unwrap_or_default()
                .into_iter(),
        )
    }

    fn print(&self) {
        println!();
        println!(
            "{}, {} ({} rounds; median over the rounds, and the range):",
            self.setting.name(),
            self.proto.name(),
            self.rounds.first().map_or(0, Vec::len)
        );
        println!(
            "  {:<28} {:>18} {:>18} {:>20} {:>20} {:>18} {:>12} {:>12} {:>10} {:>16}",
            "client",
            "p50 ms",
            "p90 ms",
            "p99 ms",
            "p99.9 ms",
            "extra load %",
            "hedges/req",
            "hedge wins",
            "budget",
            "hedge after ms"
        );
        for (name, rounds) in self.names.iter().zip(&self.rounds) {
            let s = |f: &dyn Fn(&Stats) -> f64| spread(rounds.iter().map(f));
            let opt = |f: &dyn Fn(&Stats) -> Option<f64>| {
                spread(rounds.iter().map(|r| f(r).unwrap_or(f64::NAN)))
            };
            println!(
                "  {:<28} {:>18} {:>18} {:>20} {:>20} {:>18} {:>12} {:>12} {:>10} {:>16}",
                name,
                s(&|r| r.p50).show(1.0, 2),
                s(&|r| r.p90).show(1.0, 2),
                s(&|r| r.p99).show(1.0, 1),
                s(&|r| r.p999).show(1.0, 1),
                s(&|r| r.load).show(100.0, 2),
                opt(&|r| r.hedges).show(1.0, 4),
                opt(&|r| r.hedge_wins).show(100.0, 2),
                opt(&|r| r.budget_stops).show(100.0, 1),
                opt(&|r| r.hedge_after).show(1.0, 1),
            );
        }
        if self.setting == Setting::Outage {
            for (name, rounds) in self.names.iter().zip(&self.rounds) {
                let attempts = spread(rounds.iter().map(|r| r.attempts));
                let bound = spread(rounds.iter().map(|r| {
                    let n = r.requests as f64;
                    1.0 + BUDGET_RATIO + (BUDGET_START + BUDGET_PER_SEC * r.seconds) / n
                }));
                let ok = spread(rounds.iter().map(|r| r.ok));
                println!(
                    "  {name}: {} attempts per request (the default budget's bound 1 + 0.1 + (100 + 10/s x {:.1} s) / requests = {}); {}% answered 2xx",
                    attempts.show(1.0, 3),
                    spread(rounds.iter().map(|r| r.seconds)).median,
                    bound.show(1.0, 3),
                    ok.show(100.0, 1),
                );
            }
        }
    }
}

fn env_count(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
        .max(1)
}

/// The percentiles of ours beside `percentile(0.9)`, to find one whose extra load is no more
/// than tower's; 0.99 only where 1% are slow (at 5% it reads in the slow answers). At 5%,
/// 0.95 sits on the edge between the fast answers and the slow ones, so its delay jumps
/// between the two; 0.92 reads the fast answers' own tail.
fn higher(setting: Setting) -> &'static [f64] {
    match setting {
        Setting::Slow(fraction) if fraction < 0.02 => &[0.95, 0.98, 0.99],
        _ => &[0.92, 0.95, 0.98],
    }
}

/// The requests of a round in `setting`: the count where 1% are slow, half of it
/// where 5% are (the bare client alone takes 15 s a round there), a quarter in the outage.
fn requests_in(setting: Setting, requests: usize) -> usize {
    match setting {
        Setting::Slow(fraction) if fraction < 0.02 => requests,
        Setting::Slow(_) => requests.div_ceil(2),
        Setting::Outage => requests.div_ceil(4),
    }
}

fn policy(attempts: u32, hedging: Hedging) -> RetryPolicy {
    RetryPolicy::default().max_attempts(attempts).hedge(hedging)
}

fn percentile_hedging(p: f64) -> Hedging {
    Hedging::percentile(p).fallback(DELAY)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let has = |flag: &str| args.iter().any(|a| a == flag);
    if has("--list") {
        return;
    }
    let full = has("--bench") && !has("--test");
    let requests = if full {
        env_count("HEDGING_REQUESTS", REQUESTS)
    } else {
        400
    };
    let rounds = if full {
        env_count("HEDGING_ROUNDS", ROUNDS)
    } else {
        1
    };

    let servers_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("server")
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let clients_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("client")
        .enable_all()
        .build()
        .expect("a tokio runtime");

    let settings = [Setting::Slow(0.01), Setting::Slow(0.05), Setting::Outage];
    let protos = [Proto::H1, Proto::H2];
    let mut servers = Vec::new();
    for setting in settings {
        for proto in protos {
            servers.push((setting, proto, servers_rt.block_on(serve(proto, setting))));
        }
    }

    let specs_of = |setting: Setting| -> Vec<Spec> {
        let _guard = clients_rt.enter();
        let mut specs = vec![
            Spec::new("bare", Kind::Bare),
            Spec::new("tower p0.9", Kind::Tower),
        ];
        if setting == Setting::Outage {
            specs.push(Spec::new(
                "ours 3x after 10ms",
                Kind::Ours(Box::new(policy(3, Hedging::after(DELAY))), true),
            ));
            specs.push(Spec::new(
                "ours 3x, no budget",
                Kind::Ours(Box::new(policy(3, Hedging::after(DELAY))), false),
            ));
            specs.push(Spec::new("seatbelt 3x after 10ms", Kind::Seatbelt(3)));
            specs.push(Spec::new(
                "seatbelt_http 3x after 10ms",
                Kind::SeatbeltHttp(3),
            ));
            return specs;
        }
        specs.push(Spec::new("hand 10ms", Kind::Hand));
        specs.push(Spec::new(
            "ours after 10ms",
            Kind::Ours(Box::new(policy(2, Hedging::after(DELAY))), false),
        ));
        for &p in std::iter::once(&0.9).chain(higher(setting)) {
            specs.push(Spec::new(
                format!("ours p{p}"),
                Kind::Ours(Box::new(policy(2, percentile_hedging(p))), false),
            ));
        }
        if setting == Setting::Slow(0.05) {
            specs.push(Spec::new(
                "ours 3x after 10ms",
                Kind::Ours(Box::new(policy(3, Hedging::after(DELAY))), false),
            ));
        }
        specs.push(Spec::new("seatbelt after 10ms", Kind::Seatbelt(2)));
        specs.push(Spec::new("seatbelt_http after 10ms", Kind::SeatbeltHttp(2)));
        if setting == Setting::Slow(0.05) {
            specs.push(Spec::new("seatbelt 3x after 10ms", Kind::Seatbelt(3)));
        }
        specs
    };
    let specs: Vec<Vec<Spec>> = settings.iter().map(|s| specs_of(*s)).collect();

    println!(
        "hedging: {TASKS} tasks, {requests} GETs per client and round (half at 5% slow, a quarter in the outage), {rounds} rounds; slow answers {} ms, others {} ms (tokio's timer), fixed hedge delay {} ms",
        SLOW.as_millis(),
        FAST.as_millis(),
        DELAY.as_millis()
    );
    let mut tables: Vec<Table> = Vec::new();
    for (setting, proto, _) in &servers {
        let i = settings.iter().position(|s| s == setting).unwrap_or(0);
        tables.push(Table {
            setting: *setting,
            proto: *proto,
            names: specs[i].iter().map(|s| s.name.clone()).collect(),
            rounds: specs[i].iter().map(|_| Vec::new()).collect(),
        });
    }
    let started = Instant::now();
    for round in 0..rounds {
        for (t, (setting, proto, server)) in servers.iter().enumerate() {
            let i = settings.iter().position(|s| s == setting).unwrap_or(0);
            let specs = &specs[i];
            let n = specs.len();
            for k in 0..n {
                let j = (round + k) % n;
                let stats = run(
                    &clients_rt,
                    specs[j].sender(*proto),
                    server,
                    requests_in(*setting, requests),
                );
                tables[t].rounds[j].push(stats);
            }
            eprintln!(
                "round {} of {rounds}: {}, {} done ({:.0} s in all)",
                round + 1,
                setting.name(),
                proto.name(),
                started.elapsed().as_secs_f64()
            );
        }
    }
    for table in &tables {
        table.print();
    }
    summary(&tables);
}

/// The targets, read from the tables.
fn summary(tables: &[Table]) {
    println!();
    println!("targets (medians over the rounds):");
    for table in tables {
        let label = format!("{}, {}", table.setting.name(), table.proto.name());
        match table.setting {
            Setting::Slow(fraction) => {
                let tower = (
                    table.of("tower p0.9", |r| r.load).median,
                    table.of("tower p0.9", |r| r.p99).median,
                    table.of("tower p0.9", |r| r.p999).median,
                );
                println!(
                    "  {label}: tower p0.9 load {:.2}%, p99 {:.1} ms, p99.9 {:.1} ms",
                    tower.0 * 100.0,
                    tower.1,
                    tower.2
                );
                for &p in std::iter::once(&0.9).chain(higher(table.setting)) {
                    let name = format!("ours p{p}");
                    let load = table.of(&name, |r| r.load).median;
                    let p99 = table.of(&name, |r| r.p99).median;
                    let p999 = table.of(&name, |r| r.p999).median;
                    let verdict = match (load <= tower.0, p99 <= tower.1 && p999 <= tower.2) {
                        (true, true) => "load <= tower's and p99, p99.9 <= tower's: met",
                        (true, false) => "load <= tower's, but p99 or p99.9 above tower's",
                        (false, true) => "p99, p99.9 <= tower's, but load above tower's",
                        (false, false) => "load and tail above tower's",
                    };
                    println!(
                        "    {name}: load {:.2}%, p99 {p99:.1} ms, p99.9 {p999:.1} ms: {verdict}",
                        load * 100.0
                    );
                }
                let ours = (
                    table.of("ours after 10ms", |r| r.p99).median,
                    table.of("ours after 10ms", |r| r.p999).median,
                );
                let hand = (
                    table.of("hand 10ms", |r| r.p99).median,
                    table.of("hand 10ms", |r| r.p999).median,
                );
                println!(
                    "    ours after 10ms p99 {:.1} / p99.9 {:.1} ms against the hand-written {:.1} / {:.1} ms (ratios {:.3}, {:.3})",
                    ours.0,
                    ours.1,
                    hand.0,
                    hand.1,
                    ours.0 / hand.0,
                    ours.1 / hand.1
                );
                for name in ["seatbelt after 10ms", "seatbelt_http after 10ms"] {
                    let p99 = table.of(name, |r| r.p99).median;
                    let p999 = table.of(name, |r| r.p999).median;
                    println!(
                        "    {name} p99 {p99:.1} / p99.9 {p999:.1} ms, load {:.2}%: against ours after 10ms {:.3}, {:.3}, against the hand-written {:.3}, {:.3} (ratios of p99, p99.9)",
                        table.of(name, |r| r.load).median * 100.0,
                        p99 / ours.0,
                        p999 / ours.1,
                        p99 / hand.0,
                        p999 / hand.1,
                    );
                }
                if fraction > 0.02 {
                    let fast = table.of("bare", |r| r.p50).median;
                    let bound = 3.0 * DELAY.as_secs_f64() * 1e3 + fast;
                    let p999 = table.of("ours 3x after 10ms", |r| r.p999).median;
                    println!(
                        "    ours 3x after 10ms p99.9 {p999:.1} ms against 3 x 10 ms + bare p50 {fast:.2} ms = {bound:.1} ms: {}",
                        if p999 < bound { "met" } else { "missed" }
                    );
                    println!(
                        "    seatbelt 3x after 10ms p99.9 {:.1} ms",
                        table.of("seatbelt 3x after 10ms", |r| r.p999).median
                    );
                }
            }
            Setting::Outage => {
                let attempts = table.of("ours 3x after 10ms", |r| r.attempts).median;
                let bound = table
                    .of("ours 3x after 10ms", |r| {
                        1.0 + BUDGET_RATIO
                            + (BUDGET_START + BUDGET_PER_SEC * r.seconds) / r.requests as f64
                    })
                    .median;
                println!(
                    "  {label}: ours with the default budget {attempts:.3} attempts per request, bound {bound:.3}: {}; without a budget {:.3}; tower's hedge {:.3}",
                    if attempts <= bound * 1.01 {
                        "capped"
                    } else {
                        "over the bound"
                    },
                    table.of("ours 3x, no budget", |r| r.attempts).median,
                    table.of("tower p0.9", |r| r.attempts).median,
                );
                println!(
                    "    seatbelt 3x after 10ms (no budget) {:.3} attempts per request, seatbelt_http's {:.3}",
                    table.of("seatbelt 3x after 10ms", |r| r.attempts).median,
                    table
                        .of("seatbelt_http 3x after 10ms", |r| r.attempts)
                        .median,
                );
            }
        }
    }
}
