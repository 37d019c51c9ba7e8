//! A hyper-util legacy client with and without the layer, and under tower's `Retry`,
//! against an in-process hyper server on 127.0.0.1, 64 requests in flight, over HTTP/1
//! and over HTTP/2.
//!
//! Everything runs on one multi-thread tokio runtime (two workers): the servers' accept
//! loops and connections, the clients' connection tasks, and the benchmark loop itself
//! (`block_on` from the bench thread). One iteration is a batch of 512 requests kept 64 in
//! flight (`buffer_unordered(64)`), each response body read to its end. The servers answer
//! every request 200 with a 15-byte body after reading the request body.
//!
//! Two servers: one speaking HTTP/1 (each client keeps a pool of up to 64 connections to
//! it), one speaking HTTP/2 only (the clients are built `http2_only(true)`, and each
//! multiplexes its 64 requests over one connection).
//!
//! Two kinds of request: `get` (empty body) and `put_1k` (a 1 KiB `Full<Bytes>` body, which
//! our layer records for replay). Eight clients per protocol, each with its own connection
//! pool: `bare`, `ours` (`RetryLayer::new()`, every default), `tower` (`tower::retry::Retry`
//! with the policy `benches/overhead.rs` compares against, [`TowerPolicy`]: the request
//! cloned up front, a `TpsBudget` deposit per request), two variants that show where the
//! layer's cost goes: `ours_no_gates` (`RetryPolicy::no_gates()`) and `ours_never` (a
//! `RetryPolicy::never()` default: no retry state, no head or service clone), and three for
//! Microsoft's seatbelt (`benches/support/seatbelt.rs`): `seatbelt` (its retry through its
//! `tower-service` feature, over the client as it is), `adapter` (the client built over
//! seatbelt_http's `HttpBody`, under the adapter that turns its answers into
//! `HttpResponse`s, with no retry: what seatbelt_http's types cost alone) and
//! `seatbelt_http` (seatbelt_http's retry over that adapter). The last two are sent
//! `HttpBody` requests and read `HttpBody` answers, as a seatbelt_http caller does.
//!
//! Each criterion sample reports its iterations times their median batch time (see
//! [`timed`]). Criterion runs the cases one after the other, and on a busy machine the load
//! changes in between, so afterwards the bench also cycles through the clients, a few
//! batches at a time ("interleaved"), and prints the median requests per second of each,
//! its ratio to bare and, for ours, to tower, each also as the median of the per-round
//! ratios. The interleaved run is made twice per protocol: with the bench thread's one task
//! driving the batch, as above, and with 64 tasks spawned on the runtime's workers, each
//! sending 8 requests one after the other (how a server's handlers share a client). In the
//! first, everything the client side does runs on one thread, which makes any cost on the
//! caller's side count more; in the second, that work is spread over the workers. A summary
//! of the per-round medians ends the output, and a second one for seatbelt's rows (seatbelt
//! and ours against bare and each other, the adapter against bare, seatbelt_http against
//! the adapter).
//!
//! Run: `cargo bench --bench end_to_end` (only the interleaved part:
//! `cargo bench --bench end_to_end -- interleaved-only`, a filter no criterion case matches).
#![allow(clippy::disallowed_methods)] // measures real time with std's clock

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{Criterion, Throughput};
use futures_util::StreamExt;
use futures_util::stream;
use http::{Method, Request, Response};
use http_body_util::{BodyExt, Full};
use http_extensions::HttpBody;
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::runtime::Runtime;
use tower::{BoxError, Layer, Service};
use tower_http_retry::{ReplayBody, Retry, RetryLayer, RetryPolicy};

#[path = "support/mod.rs"]
mod support;
use support::{RequestBody, TowerPolicy, extra_runs, median};
#[path = "support/seatbelt.rs"]
mod seatbelt_rows;

/// Requests per iteration.
const BATCH: usize = 512;
/// Requests in flight at once.
const IN_FLIGHT: usize = 64;
/// A server stops accepting after this many connections (the HTTP/1 pools need about 320).
const MAX_CONNECTIONS: usize = 4096;
/// What the servers answer.
const ANSWER: &[u8] = b"ok, handled...\n";

type Bare = Client<HttpConnector, Full<Bytes>>;
type Ours = Retry<Client<HttpConnector, ReplayBody<Full<Bytes>>>>;
type Tower = tower::retry::Retry<TowerPolicy, Bare>;
type Seatbelt = seatbelt_rows::SeatbeltRetry<Full<Bytes>>;

/// The protocol between a client and its server.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Proto {
    /// HTTP/1.1, a pool of connections per client.
    H1,
    /// Prior-knowledge cleartext HTTP/2, one connection per client.
    H2,
}

impl Proto {
    fn name(self) -> &'static str {
        match self {
            Proto::H1 => "h1",
            Proto::H2 => "h2",
        }
    }
}

/// Starts a server speaking `proto` on 127.0.0.1 on the current runtime; returns its
/// address.
async fn serve(proto: Proto) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind 127.0.0.1");
    let addr = listener.local_addr().expect("local address");
    tokio::spawn(async move {
        for _ in 0..MAX_CONNECTIONS {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let _ = stream.set_nodelay(true);
            tokio::spawn(async move {
                let service = hyper::service::service_fn(|request: Request<Incoming>| async move {
                    // Read the request body, as a real handler would.
                    let _ = request.into_body().collect().await;
                    Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(ANSWER))))
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
    addr
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

/// One request through any client-like service; reads the response body to its end.
async fn one<S, B, RB>(svc: S, request: Request<B>)
where
    S: Sends<B, RB>,
    RB: http_body::Body,
    RB::Error: std::fmt::Debug,
{
    let (status, body) = support::exchange(svc, request).await;
    assert!(status.is_success());
    assert_eq!(body, ANSWER);
}

/// `BATCH` requests, `IN_FLIGHT` at a time.
async fn batch<S, B, RB>(svc: &S, addr: SocketAddr, method: &Method)
where
    S: Sends<B, RB>,
    B: RequestBody,
    RB: http_body::Body,
    RB::Error: std::fmt::Debug,
{
    stream::iter(0..BATCH)
        .map(|i| one(svc.clone(), request(addr, method, i)))
        .buffer_unordered(IN_FLIGHT)
        .count()
        .await;
}

/// Who sends the requests of a batch.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Driver {
    /// The bench thread, one task: `buffer_unordered` over the batch.
    OneTask,
    /// `IN_FLIGHT` tasks spawned on the runtime's workers, as a server's handlers would.
    Tasks,
}

/// `BATCH` requests from `IN_FLIGHT` tasks spawned on the runtime, each sending its share
/// one after the other.
async fn batch_spawned<S, B, RB>(svc: &S, addr: SocketAddr, method: &Method)
where
    S: Sends<B, RB>,
    S::Future: Send,
    B: RequestBody + Send + 'static,
    RB: http_body::Body + Send + 'static,
    RB::Data: Send,
    RB::Error: std::fmt::Debug,
{
    let per_task = BATCH / IN_FLIGHT;
    let mut tasks = Vec::with_capacity(IN_FLIGHT);
    for t in 0..IN_FLIGHT {
        let svc = svc.clone();
        let method = method.clone();
        tasks.push(tokio::spawn(async move {
            for j in 0..per_task {
                one(svc.clone(), request(addr, &method, t * per_task + j)).await;
            }
        }));
    }
    for task in tasks {
        task.await.expect("a client task");
    }
}

/// `iters` batches; returns `iters` times the median batch time. The median, not the sum:
/// the machine is shared, and a batch during which the scheduler gave both cores to
/// something else would otherwise count in full.
fn timed<S, B, RB>(
    runtime: &Runtime,
    svc: &S,
    addr: SocketAddr,
    method: &Method,
    driver: Driver,
    iters: u64,
) -> Duration
where
    S: Sends<B, RB>,
    S::Future: Send,
    B: RequestBody + Send + 'static,
    RB: http_body::Body + Send + 'static,
    RB::Data: Send,
    RB::Error: std::fmt::Debug,
{
    let mut times = Vec::with_capacity(iters as usize);
    runtime.block_on(async {
        for _ in 0..iters {
            let start = Instant::now();
            match driver {
                Driver::OneTask => batch(svc, addr, method).await,
                Driver::Tasks => batch_spawned(svc, addr, method).await,
            }
            times.push(start.elapsed().as_secs_f64());
        }
    });
    Duration::from_secs_f64(median(&mut times) * iters as f64)
}

/// A plain hyper-util legacy client; over HTTP/2 it speaks prior-knowledge cleartext
/// HTTP/2 and multiplexes every request over one connection. `TCP_NODELAY` on both ends
/// (without it, HTTP/2 `put_1k` stalls on Nagle's algorithm and delayed ACKs, at a fifth of
/// `get`'s rate).
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

/// Times `iters` batches of one kind of request through one client.
type Timer<'a> = Box<dyn Fn(&Method, Driver, u64) -> Duration + 'a>;

/// One client under test.
struct Case<'a> {
    name: &'static str,
    timed: Timer<'a>,
}

/// The clients of one protocol, each with its own pool: bare first, then ours, tower, the
/// two variants of ours, and seatbelt's three.
struct Clients {
    bare: Bare,
    ours: Ours,
    tower: Tower,
    ours_no_gates: Ours,
    ours_never: Ours,
    seatbelt: Seatbelt,
    adapter: seatbelt_rows::Adapter,
    seatbelt_http: seatbelt_rows::HttpRetrying,
}

impl Clients {
    /// Must be called inside the runtime (the clients' pools and seatbelt's clock spawn on
    /// it).
    fn new(proto: Proto) -> Self {
        // seatbelt's backoff from 100 ms, as ours' default (nothing is retried here).
        let base = Duration::from_millis(100);
        let clock = seatbelt_rows::clock();
        Self {
            bare: client(proto),
            ours: RetryLayer::new().layer(client(proto)),
            tower: tower::retry::Retry::new(TowerPolicy::new(), client(proto)),
            ours_no_gates: RetryLayer::new()
                .policy(RetryPolicy::new().no_gates())
                .layer(client(proto)),
            ours_never: RetryLayer::new()
                .policy(RetryPolicy::never())
                .layer(client(proto)),
            seatbelt: seatbelt_rows::retry(&clock, client(proto), base),
            adapter: seatbelt_rows::Adapter(client(proto)),
            seatbelt_http: seatbelt_rows::http_retry(
                &clock,
                seatbelt_rows::Adapter(client(proto)),
                base,
            ),
        }
    }

    fn cases<'a>(&'a self, runtime: &'a Runtime, addr: SocketAddr) -> Vec<Case<'a>> {
        fn case<'a, S, B, RB>(
            name: &'static str,
            runtime: &'a Runtime,
            svc: &'a S,
            addr: SocketAddr,
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
                timed: Box::new(move |m: &Method, d, i| timed(runtime, svc, addr, m, d, i)),
            }
        }
        vec![
            case("bare", runtime, &self.bare, addr),
            case("ours", runtime, &self.ours, addr),
            case("tower", runtime, &self.tower, addr),
            case("ours_no_gates", runtime, &self.ours_no_gates, addr),
            case("ours_never", runtime, &self.ours_never, addr),
            case("seatbelt", runtime, &self.seatbelt, addr),
            case::<_, HttpBody, HttpBody>("adapter", runtime, &self.adapter, addr),
            case::<_, HttpBody, HttpBody>("seatbelt_http", runtime, &self.seatbelt_http, addr),
        ]
    }
}

/// The per-round medians of one interleaved run, for the summary.
struct Summary {
    label: String,
    /// (case name, median of per-round ratios to bare, to tower when the case is ours).
    ratios: Vec<(&'static str, f64, Option<f64>)>,
    /// The medians of the per-round ratios of the pairs in [`PAIRS`], in that order.
    pairs: Vec<f64>,
}

/// The pairs of cases compared round by round for the seatbelt summary: (numerator,
/// denominator), requests per second.
const PAIRS: [(&str, &str); 5] = [
    ("seatbelt", "bare"),
    ("ours", "seatbelt"),
    ("seatbelt", "tower"),
    ("adapter", "bare"),
    ("seatbelt_http", "adapter"),
];

/// Cycles through the cases, `rounds` times `PER_ROUND` batches each (the order rotating
/// every round); prints the median requests per second of each, and for each layered case
/// the ratio of medians to bare and the median of the per-round ratios (for ours and its
/// variants, also to tower).
fn interleaved(
    cases: &[Case<'_>],
    proto: Proto,
    method: &Method,
    driver: Driver,
    rounds: usize,
) -> Summary {
    const PER_ROUND: u64 = 4;
    let n = cases.len();
    let mut rps = vec![Vec::with_capacity(rounds); n];
    for round in 0..rounds {
        for k in 0..n {
            let i = (round + k) % n;
            let took = (cases[i].timed)(method, driver, PER_ROUND);
            rps[i].push((PER_ROUND as usize * BATCH) as f64 / took.as_secs_f64());
        }
    }
    let by = match driver {
        Driver::OneTask => "one task",
        Driver::Tasks => "64 tasks",
    };
    let label = format!("{} {} {by}", proto.name(), method_name(method));
    println!("interleaved {label} ({rounds} rounds of {PER_ROUND} x {BATCH} requests per case):");
    let medians: Vec<f64> = rps.iter().map(|v| median(&mut v.clone())).collect();
    let per_round = |a: usize, b: usize| {
        let mut r: Vec<f64> = rps[a].iter().zip(&rps[b]).map(|(x, y)| x / y).collect();
        median(&mut r)
    };
    let tower = cases.iter().position(|c| c.name == "tower");
    let mut ratios = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        let m = medians[i];
        if i == 0 {
            println!("  {:<14} {m:>7.0} req/s", case.name);
            continue;
        }
        let to_bare = per_round(i, 0);
        let mut line = format!(
            "  {:<14} {m:>7.0} req/s, / bare {:.3} (per round {to_bare:.3})",
            case.name,
            m / medians[0],
        );
        let mut to_tower = None;
        if let Some(t) = tower.filter(|_| case.name.starts_with("ours")) {
            let r = per_round(i, t);
            line += &format!(", / tower {:.3} (per round {r:.3})", m / medians[t]);
            to_tower = Some(r);
        }
        println!("{line}");
        ratios.push((case.name, to_bare, to_tower));
    }
    let at = |name: &str| cases.iter().position(|c| c.name == name);
    let pairs = PAIRS
        .iter()
        .map(|(a, b)| match (at(a), at(b)) {
            (Some(a), Some(b)) => per_round(a, b),
            _ => f64::NAN,
        })
        .collect();
    Summary {
        label,
        ratios,
        pairs,
    }
}

fn method_name(method: &Method) -> &'static str {
    if method == Method::GET {
        "get"
    } else {
        "put_1k"
    }
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let protos = [Proto::H1, Proto::H2];
    let addrs = protos.map(|proto| runtime.block_on(serve(proto)));
    let clients = {
        let _guard = runtime.enter();
        protos.map(Clients::new)
    };
    let cases: Vec<Vec<Case<'_>>> = clients
        .iter()
        .zip(addrs)
        .map(|(clients, addr)| clients.cases(&runtime, addr))
        .collect();

    let mut c = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(15)
        .configure_from_args();
    {
        let mut group = c.benchmark_group("end_to_end");
        group.throughput(Throughput::Elements(BATCH as u64));
        for (proto, cases) in protos.iter().zip(&cases) {
            for method in [Method::GET, Method::PUT] {
                for case in cases {
                    let id = format!("{}/{}/{}", proto.name(), method_name(&method), case.name);
                    group.bench_function(id, |b| {
                        b.iter_custom(|iters| (case.timed)(&method, Driver::OneTask, iters))
                    });
                }
            }
        }
        group.finish();
    }
    c.final_summary();

    let rounds = extra_runs(60);
    if rounds == 0 {
        return;
    }
    // Every pool opens its connections before the first round (criterion may not have run).
    for cases in &cases {
        for case in cases {
            (case.timed)(&Method::GET, Driver::Tasks, 1);
        }
    }
    println!();
    let mut summaries = Vec::new();
    for (proto, cases) in protos.iter().zip(&cases) {
        for driver in [Driver::OneTask, Driver::Tasks] {
            for method in [Method::GET, Method::PUT] {
                summaries.push(interleaved(cases, *proto, &method, driver, rounds));
            }
        }
    }
    println!();
    println!("summary, medians of the per-round ratios:");
    println!(
        "  {:<20} {:>10} {:>11} {:>11} {:>14} {:>14}",
        "", "ours/bare", "ours/tower", "tower/bare", "no_gates/bare", "never/bare"
    );
    for summary in &summaries {
        let get = |name: &str, tower: bool| {
            summary
                .ratios
                .iter()
                .find(|r| r.0 == name)
                .and_then(|r| if tower { r.2 } else { Some(r.1) })
                .unwrap_or(f64::NAN)
        };
        println!(
            "  {:<20} {:>10.3} {:>11.3} {:>11.3} {:>14.3} {:>14.3}",
            summary.label,
            get("ours", false),
            get("ours", true),
            get("tower", false),
            get("ours_no_gates", false),
            get("ours_never", false),
        );
    }
    println!();
    println!("summary, seatbelt, medians of the per-round ratios (requests per second):");
    print!("  {:<20}", "");
    for (a, b) in PAIRS {
        print!(" {:>22}", format!("{a}/{b}"));
    }
    println!();
    for summary in &summaries {
        print!("  {:<20}", summary.label);
        for ratio in &summary.pairs {
            print!(" {ratio:>22.3}");
        }
        println!();
    }
}
