//! A hyper-util legacy client with and without the layer, against an in-process hyper
//! HTTP/1 server on 127.0.0.1, 64 requests in flight.
//!
//! Everything runs on one multi-thread tokio runtime (two workers): the server's accept
//! loop and connections, the client's connection tasks, and the benchmark loop itself
//! (`block_on` from the bench thread). One iteration is a batch of 512 requests kept 64 in
//! flight (`buffer_unordered(64)`), each response body read to its end. The server answers
//! every request 200 with a 15-byte body after reading the request body.
//!
//! Two kinds of request: `get` (empty body) and `put_1k` (a 1 KiB `Full<Bytes>` body, which
//! our layer records for replay). Four clients, each with its own connection pool: `bare`,
//! `ours` (`RetryLayer::new()`, every default), and two variants that show where the
//! layer's cost goes: `ours_no_budget` (`.no_budget()`) and `ours_never` (a
//! `RetryPolicy::never()` default: no retry state, no head or service clone).
//!
//! Each criterion sample reports its iterations times their median batch time (see
//! [`timed`]). Criterion runs the cases one after the other, and on a busy machine the load
//! changes in between, so afterwards the bench also cycles through the clients, a few
//! batches at a time ("interleaved"), and prints the median requests per second of each and
//! its ratio to bare. The interleaved run is made twice: with the bench thread's one task
//! driving the batch, as above, and with 64 tasks spawned on the runtime's workers, each
//! sending 8 requests one after the other (how a server's handlers share a client). In the
//! first, everything the client side does runs on one thread, which makes any cost on the
//! caller's side count more; in the second, that work is spread over the workers.
//!
//! Run: `cargo bench --bench end_to_end`.
#![allow(clippy::disallowed_types)] // measures real time with std's clock

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{Criterion, Throughput};
use futures_util::StreamExt;
use futures_util::stream;
use http::{Method, Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::runtime::Runtime;
use tower::{BoxError, Layer, Service, ServiceExt};
use tower_http_retry::{ReplayBody, Retry, RetryLayer, RetryPolicy};

#[path = "support/mod.rs"]
mod support;
use support::{extra_runs, median};

/// Requests per iteration.
const BATCH: usize = 512;
/// Requests in flight at once.
const IN_FLIGHT: usize = 64;
/// The server stops accepting after this many connections (the pools need about 128).
const MAX_CONNECTIONS: usize = 4096;
/// What the server answers.
const ANSWER: &[u8] = b"ok, handled...\n";

type Bare = Client<HttpConnector, Full<Bytes>>;
type Ours = Retry<Client<HttpConnector, ReplayBody<Full<Bytes>>>>;

/// Starts the server on 127.0.0.1 on the current runtime; returns its address.
async fn serve() -> SocketAddr {
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
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

fn request(addr: SocketAddr, method: &Method, i: usize) -> Request<Full<Bytes>> {
    let body = if method == Method::GET {
        Bytes::new()
    } else {
        Bytes::from(vec![b'p'; 1024])
    };
    Request::builder()
        .method(method.clone())
        .uri(format!("http://{addr}/items/{i}"))
        .header(http::header::ACCEPT, "text/plain")
        .body(Full::new(body))
        .expect("a valid request")
}

/// One request through any client-like service; reads the response body to its end.
async fn one<S, E>(mut svc: S, request: Request<Full<Bytes>>)
where
    S: Service<Request<Full<Bytes>>, Response = Response<Incoming>, Error = E>,
    E: Into<BoxError>,
{
    let response = svc
        .ready()
        .await
        .map_err(Into::into)
        .expect("client ready")
        .call(request)
        .await
        .map_err(Into::into)
        .expect("a response from 127.0.0.1");
    assert!(response.status().is_success());
    let body = response.into_body().collect().await.expect("response body");
    assert_eq!(body.to_bytes(), ANSWER);
}

/// `BATCH` requests, `IN_FLIGHT` at a time.
async fn batch<S, E>(svc: &S, addr: SocketAddr, method: &Method)
where
    S: Service<Request<Full<Bytes>>, Response = Response<Incoming>, Error = E> + Clone,
    E: Into<BoxError>,
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
async fn batch_spawned<S, E>(svc: &S, addr: SocketAddr, method: &Method)
where
    S: Service<Request<Full<Bytes>>, Response = Response<Incoming>, Error = E>
        + Clone
        + Send
        + 'static,
    S::Future: Send,
    E: Into<BoxError>,
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
fn timed<S, E>(
    runtime: &Runtime,
    svc: &S,
    addr: SocketAddr,
    method: &Method,
    driver: Driver,
    iters: u64,
) -> Duration
where
    S: Service<Request<Full<Bytes>>, Response = Response<Incoming>, Error = E>
        + Clone
        + Send
        + 'static,
    S::Future: Send,
    E: Into<BoxError>,
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

/// A plain hyper-util legacy client over HTTP/1.
fn client<B>() -> Client<HttpConnector, B>
where
    B: http_body::Body + Send,
    B::Data: Send,
{
    Client::builder(TokioExecutor::new()).build_http()
}

/// Times `iters` batches of one kind of request through one client.
type Timer<'a> = Box<dyn Fn(&Method, Driver, u64) -> Duration + 'a>;

/// One client under test.
struct Case<'a> {
    name: &'static str,
    timed: Timer<'a>,
}

/// Cycles through the cases, `rounds` times `PER_ROUND` batches each (the order rotating
/// every round); prints the median requests per second of each, and for each layered case
/// the ratio of medians to bare and the median of the per-round ratios.
fn interleaved(cases: &[Case<'_>], method: &Method, driver: Driver, rounds: usize) {
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
    println!(
        "interleaved {}, {by} ({rounds} rounds of {PER_ROUND} x {BATCH} requests per case):",
        method_name(method)
    );
    let mut bare = rps[0].clone();
    let bare_median = median(&mut bare);
    for (i, case) in cases.iter().enumerate() {
        let mut mine = rps[i].clone();
        let m = median(&mut mine);
        if i == 0 {
            println!("  {:<14} {m:>7.0} req/s", case.name);
        } else {
            let mut paired: Vec<f64> = rps[i].iter().zip(&rps[0]).map(|(x, b)| x / b).collect();
            println!(
                "  {:<14} {m:>7.0} req/s, / bare {:.3} (median of per-round ratios {:.3})",
                case.name,
                m / bare_median,
                median(&mut paired)
            );
        }
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
    let addr = runtime.block_on(serve());
    let (bare, ours, ours_no_budget, ours_never): (Bare, Ours, Ours, Ours) = {
        let _guard = runtime.enter();
        (
            client(),
            RetryLayer::new().layer(client()),
            RetryLayer::new().no_budget().layer(client()),
            RetryLayer::new()
                .policy(RetryPolicy::never())
                .layer(client()),
        )
    };
    let runtime = &runtime;
    let cases = [
        Case {
            name: "bare",
            timed: Box::new(|m: &Method, d, i| timed(runtime, &bare, addr, m, d, i)),
        },
        Case {
            name: "ours",
            timed: Box::new(|m: &Method, d, i| timed(runtime, &ours, addr, m, d, i)),
        },
        Case {
            name: "ours_no_budget",
            timed: Box::new(|m: &Method, d, i| timed(runtime, &ours_no_budget, addr, m, d, i)),
        },
        Case {
            name: "ours_never",
            timed: Box::new(|m: &Method, d, i| timed(runtime, &ours_never, addr, m, d, i)),
        },
    ];

    let mut c = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(15)
        .configure_from_args();
    {
        let mut group = c.benchmark_group("end_to_end");
        group.throughput(Throughput::Elements(BATCH as u64));
        for method in [Method::GET, Method::PUT] {
            for case in &cases {
                let id = format!("{}/{}", method_name(&method), case.name);
                group.bench_function(id, |b| {
                    b.iter_custom(|iters| (case.timed)(&method, Driver::OneTask, iters))
                });
            }
        }
        group.finish();
    }
    c.final_summary();

    let rounds = extra_runs(60);
    if rounds == 0 {
        return;
    }
    println!();
    for driver in [Driver::OneTask, Driver::Tasks] {
        for method in [Method::GET, Method::PUT] {
            interleaved(&cases, &method, driver, rounds);
        }
    }
}
