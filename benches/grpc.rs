//! tonic unary calls on loopback with and without the layer (the target: "at least
//! 0.97x the bare channel's throughput"), 64 calls in flight.
//!
//! An in-process tonic server on 127.0.0.1 answers `bench.Raw/Echo`, a hand-written
//! raw-bytes unary method echoing its request (`benches/support/grpc.rs`). Everything runs
//! on one multi-thread tokio runtime (two workers): the server, the channels' connection
//! and buffer tasks, and the benchmark loop (`block_on` from the bench thread). One
//! iteration is a batch of 512 unary calls kept 64 in flight, each reply checked.
//!
//! Three clients, each over its own `Channel` (one HTTP/2 connection each):
//! - `bare`: the `Channel` itself, as `tonic::client::Grpc::new(channel)` uses it;
//! - `ours`: what the README stacks, `grpc::status_layer()`, `RetryLayer::grpc()` (no keys,
//!   UNAVAILABLE retried, the default budget) and `grpc::tonic_body_layer()` over the
//!   channel;
//! - `ours_never`: the same stack with a `RetryPolicy::never()` policy (no retry state
//!   kept per call), which shows what the retry bookkeeping costs apart from the glue.
//!
//! Two message sizes: `16b` and `1k` (a 1 KiB message, which the layer records for replay
//! as it goes out).
//!
//! Each criterion sample reports its iterations times their median batch time. After
//! criterion's part the bench cycles through the clients, a few batches at a time
//! ("interleaved", the order rotating every round), and prints the median calls per
//! second of each and its ratio to bare, as the ratio of medians and as the median of the
//! per-round ratios; the latter is the figure the target is judged by. Beside it, the CPU
//! time per call of the whole process (client, server, user and kernel, from
//! `/proc/self/task/*/schedstat`; Linux only) and its ratio to bare: what the throughput
//! comes to when the cores are the limit, less sensitive to the machine's load than the
//! wall clock. The interleaved run is made twice: with the bench thread's one task driving
//! the batch (`buffer_unordered(64)`), and with 64 tasks spawned on the runtime's workers,
//! each making 8 calls one after the other.
//!
//! At the end the bench prints how many calls the server answered, for instruction counts
//! per call under callgrind (BENCHMARKS.md).
//!
//! Run: `cargo bench -p tower-http-retry-benches --features grpc --bench grpc` (only the interleaved part:
//! `cargo bench -p tower-http-retry-benches --features grpc --bench grpc -- interleaved-only`).
#![allow(clippy::disallowed_methods)] // measures real time with std's clock

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{Criterion, Throughput};
use futures_util::StreamExt;
use futures_util::stream;
use tokio::runtime::Runtime;
use tonic::transport::Channel;
use tower::ServiceBuilder;
use tower_http_retry::{Retry, RetryLayer, RetryPolicy};
use tower_http_retry_grpc::GrpcLayerExt;
use tower_http_retry_grpc::{self as grpc, IntoStatus, TonicBody};

#[path = "support/mod.rs"]
mod support;
use support::{extra_runs, median};

#[path = "support/grpc.rs"]
mod grpc_support;
use grpc_support::echo;

/// Calls per iteration.
const BATCH: usize = 512;
/// Calls in flight at once.
const IN_FLIGHT: usize = 64;
/// Interleaved rounds under `cargo bench`.
const ROUNDS: usize = 40;

type Ours = IntoStatus<Retry<TonicBody<Channel>>>;

/// Who makes the calls of a batch.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Driver {
    /// The bench thread, one task: `buffer_unordered` over the batch.
    OneTask,
    /// `IN_FLIGHT` tasks spawned on the runtime's workers.
    Tasks,
}

/// A request message of `size` bytes.
fn message(size: usize) -> Bytes {
    Bytes::from(vec![b'm'; size])
}

/// `BATCH` calls, `IN_FLIGHT` at a time, from the current task.
async fn batch<S>(svc: &S, size: usize)
where
    S: tonic::client::GrpcService<tonic::body::Body> + Clone,
    S::ResponseBody: http_body::Body<Data = Bytes> + Send + 'static,
    <S::ResponseBody as http_body::Body>::Error: Into<tower::BoxError> + Send,
{
    let message = message(size);
    stream::iter(0..BATCH)
        .map(|_| echo(svc.clone(), message.clone()))
        .buffer_unordered(IN_FLIGHT)
        .count()
        .await;
}

/// `BATCH` calls from `IN_FLIGHT` spawned tasks, each making its share one after the
/// other.
async fn batch_spawned<S>(svc: &S, size: usize)
where
    S: tonic::client::GrpcService<tonic::body::Body> + Clone + Send + 'static,
    S::Future: Send,
    S::ResponseBody: http_body::Body<Data = Bytes> + Send + 'static,
    <S::ResponseBody as http_body::Body>::Error: Into<tower::BoxError> + Send,
{
    let per_task = BATCH / IN_FLIGHT;
    let message = message(size);
    let mut tasks = Vec::with_capacity(IN_FLIGHT);
    for _ in 0..IN_FLIGHT {
        let svc = svc.clone();
        let message = message.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..per_task {
                echo(svc.clone(), message.clone()).await;
            }
        }));
    }
    for task in tasks {
        task.await.expect("a client task");
    }
}

/// `iters` batches; returns `iters` times the median batch time (the machine is shared:
/// a batch during which both cores went elsewhere does not count in full).
fn timed<S>(runtime: &Runtime, svc: &S, size: usize, driver: Driver, iters: u64) -> Duration
where
    S: tonic::client::GrpcService<tonic::body::Body> + Clone + Send + 'static,
    S::Future: Send,
    S::ResponseBody: http_body::Body<Data = Bytes> + Send + 'static,
    <S::ResponseBody as http_body::Body>::Error: Into<tower::BoxError> + Send,
{
    let mut times = Vec::with_capacity(iters as usize);
    runtime.block_on(async {
        for _ in 0..iters {
            let start = Instant::now();
            match driver {
                Driver::OneTask => batch(svc, size).await,
                Driver::Tasks => batch_spawned(svc, size).await,
            }
            times.push(start.elapsed().as_secs_f64());
        }
    });
    Duration::from_secs_f64(median(&mut times) * iters as f64)
}

/// Times `iters` batches of one message size through one client.
type Timer<'a> = Box<dyn Fn(usize, Driver, u64) -> Duration + 'a>;

struct Case<'a> {
    name: &'static str,
    timed: Timer<'a>,
}

fn case<'a, S>(name: &'static str, runtime: &'a Runtime, svc: &'a S) -> Case<'a>
where
    S: tonic::client::GrpcService<tonic::body::Body> + Clone + Send + 'static,
    S::Future: Send,
    S::ResponseBody: http_body::Body<Data = Bytes> + Send + 'static,
    <S::ResponseBody as http_body::Body>::Error: Into<tower::BoxError> + Send,
{
    Case {
        name,
        timed: Box::new(move |size, driver, iters| timed(runtime, svc, size, driver, iters)),
    }
}

/// The README's stack over `channel`, with `layer`.
fn stack(channel: Channel, layer: RetryLayer) -> Ours {
    ServiceBuilder::new()
        .layer(grpc::status_layer())
        .layer(layer)
        .layer(grpc::tonic_body_layer())
        .service(channel)
}

struct Clients {
    bare: Channel,
    ours: Ours,
    ours_never: Ours,
}

impl Clients {
    async fn new(addr: SocketAddr) -> Self {
        use grpc_support::channel;
        Self {
            bare: channel(addr).await,
            ours: stack(channel(addr).await, RetryLayer::grpc()),
            ours_never: stack(
                channel(addr).await,
                RetryLayer::grpc().policy(RetryPolicy::never()),
            ),
        }
    }

    fn cases<'a>(&'a self, runtime: &'a Runtime) -> Vec<Case<'a>> {
        vec![
            case("bare", runtime, &self.bare),
            case("ours", runtime, &self.ours),
            case("ours_never", runtime, &self.ours_never),
        ]
    }
}

fn size_name(size: usize) -> &'static str {
    if size == 16 { "16b" } else { "1k" }
}

/// One interleaved run's per-round medians of the ratios to bare, for the summary: of
/// throughput, and of CPU time per call.
struct Summary {
    label: String,
    /// (case, throughput / bare's, CPU per call / bare's)
    ratios: Vec<(&'static str, f64, f64)>,
}

/// Cycles through the cases, `rounds` times `PER_ROUND` batches each, the order rotating
/// every round; prints each case's median calls per second and CPU time per call (the
/// whole process's, server included, user and kernel), and their ratios to bare.
fn interleaved(cases: &[Case<'_>], size: usize, driver: Driver, rounds: usize) -> Summary {
    const PER_ROUND: u64 = 4;
    let calls = (PER_ROUND as usize * BATCH) as f64;
    let n = cases.len();
    let mut cps = vec![Vec::with_capacity(rounds); n];
    let mut cpu = vec![Vec::with_capacity(rounds); n];
    for round in 0..rounds {
        for k in 0..n {
            let i = (round + k) % n;
            let before = grpc_support::process_cpu_ns();
            let took = (cases[i].timed)(size, driver, PER_ROUND);
            let spent = grpc_support::process_cpu_ns() - before;
            cps[i].push(calls / took.as_secs_f64());
            cpu[i].push(spent as f64 / calls / 1e3);
        }
    }
    let by = match driver {
        Driver::OneTask => "one task",
        Driver::Tasks => "64 tasks",
    };
    let label = format!("unary {} {by}", size_name(size));
    println!("interleaved {label} ({rounds} rounds of {PER_ROUND} x {BATCH} calls per case):");
    let medians: Vec<f64> = cps.iter().map(|v| median(&mut v.clone())).collect();
    let cpu_medians: Vec<f64> = cpu.iter().map(|v| median(&mut v.clone())).collect();
    let per_round = |of: &[Vec<f64>], i: usize| {
        let mut r: Vec<f64> = of[i].iter().zip(&of[0]).map(|(x, y)| x / y).collect();
        median(&mut r)
    };
    let mut ratios = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        let (m, c) = (medians[i], cpu_medians[i]);
        if i == 0 {
            println!("  {:<12} {m:>7.0} calls/s, {c:>6.1} us CPU/call", case.name);
            continue;
        }
        let (to_bare, cpu_to_bare) = (per_round(&cps, i), per_round(&cpu, i));
        println!(
            "  {:<12} {m:>7.0} calls/s, / bare {:.3} (per round {to_bare:.3}); \
             {c:>6.1} us CPU/call, / bare {:.3} (per round {cpu_to_bare:.3})",
            case.name,
            m / medians[0],
            c / cpu_medians[0],
        );
        ratios.push((case.name, to_bare, cpu_to_bare));
    }
    Summary { label, ratios }
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let addr = runtime.block_on(grpc_support::serve());
    let clients = runtime.block_on(Clients::new(addr));
    let cases = clients.cases(&runtime);
    let sizes = [16, 1024];

    let mut c = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(15)
        .configure_from_args();
    {
        let mut group = c.benchmark_group("grpc");
        group.throughput(Throughput::Elements(BATCH as u64));
        for size in sizes {
            for case in &cases {
                let id = format!("unary/{}/{}", size_name(size), case.name);
                group.bench_function(id, |b| {
                    b.iter_custom(|iters| (case.timed)(size, Driver::OneTask, iters))
                });
            }
        }
        group.finish();
    }
    c.final_summary();

    let rounds = extra_runs(ROUNDS);
    if rounds == 0 {
        served();
        return;
    }
    // Every channel has its connection up and warm before the first round.
    for case in &cases {
        (case.timed)(16, Driver::Tasks, 1);
    }
    println!();
    let mut summaries = Vec::new();
    for driver in [Driver::OneTask, Driver::Tasks] {
        for size in sizes {
            summaries.push(interleaved(&cases, size, driver, rounds));
        }
    }
    println!();
    println!("summary, medians of the per-round ratios (target: throughput ours/bare >= 0.97):");
    println!(
        "  {:<24} {:>10} {:>11} {:>14} {:>15}",
        "", "ours/bare", "never/bare", "CPU ours/bare", "CPU never/bare"
    );
    for summary in &summaries {
        let get = |name: &str, cpu: bool| {
            summary
                .ratios
                .iter()
                .find(|r| r.0 == name)
                .map_or(f64::NAN, |r| if cpu { r.2 } else { r.1 })
        };
        println!(
            "  {:<24} {:>10.3} {:>11.3} {:>14.3} {:>15.3}",
            summary.label,
            get("ours", false),
            get("ours_never", false),
            get("ours", true),
            get("ours_never", true),
        );
    }
    served();
}

/// The number of calls the server answered in this run (for instruction counts per call
/// under callgrind: see BENCHMARKS.md).
fn served() {
    println!(
        "served {} calls",
        grpc_support::SERVED.load(std::sync::atomic::Ordering::Relaxed)
    );
}
