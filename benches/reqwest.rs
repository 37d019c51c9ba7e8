//! Where reqwest users meet the layer: bare reqwest, the layer over `ReqwestService` (with
//! its keys, and without them retrying POSTs as reqwest-retry does), reqwest-middleware
//! alone, the layer as a reqwest-middleware `RetryMiddleware`, reqwest-middleware with
//! reqwest-retry, and reqwest 0.13's built-in retries, side by side in one binary, against
//! a hyper HTTP/1 server on 127.0.0.1.
//!
//! Speed: 16 tasks on a two-worker runtime send a batch of 500 requests through one client
//! (each task takes the next request until the batch is done; every response body is
//! read). A round runs one batch per client, the order rotated from round to round, for
//! each of three workloads: `get` (an empty GET), `post_1k` (a POST with a 1 KiB body; ours
//! stamps an `Idempotency-Key` on it) and `flaky` (a GET to a path that answers every
//! tenth request 503; the retrying clients retry with zero backoff, bare returns the 503).
//! Each round's ratio is bare's time over the client's (above 1: faster than bare); the
//! output is, per workload and client, the median requests per second and the median and
//! quartiles of the per-round ratios. A warm-up round (not counted) opens the connections.
//!
//! Every retrying client is configured alike: 3 attempts at most, zero backoff. Ours:
//! `RetryLayer::new()` with that policy, its default budget, and keys turned on (so that its
//! POSTs are retried, as the others' are);
//! reqwest-retry: `ExponentialBackoff` with zero bounds and 2 retries; reqwest's built-in:
//! `retry::for_host("127.0.0.1")` with a classifier that retries 503s (without one it
//! retries nothing) and its default 2 retries and budget. The built-in has no backoff at
//! all: it is the floor, not a peer in features.
//!
//! Behaviour, after the timing, with fresh clients: the gap between the two attempts of a
//! GET answered `503` with `Retry-After: 1` and then 200 (measured by the server); whether a
//! retried POST carries an `Idempotency-Key`, the same on both attempts; whether a POST
//! whose body is `Body::wrap_stream` is retried after a 503; and, under a total outage
//! (every answer a 503), the attempts per request of a fresh client over 500 requests.
//!
//! Run: `cargo bench -p tower-http-retry-benches --features reqwest --bench reqwest`
//! (`ROUNDS=n` for another number of rounds than 30).
#![allow(clippy::disallowed_methods)] // measures real time with std's clock

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tower::ServiceExt;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use reqwest_middleware::ClientWithMiddleware;
use reqwest_retry::RetryTransientMiddleware;
use reqwest_retry::policies::ExponentialBackoff;
use tokio::net::TcpListener;
use tower_http_retry::{Backoff, IdempotencyKey, Retry, RetryLayer, RetryPolicy};
use tower_http_retry_reqwest::{ReqwestService, RetryMiddleware};

/// Requests per batch.
const BATCH: usize = 500;
/// Tasks sending a batch.
const TASKS: usize = 16;
/// Rounds under `cargo bench` unless `ROUNDS` says otherwise.
const ROUNDS: usize = 30;
/// The server stops accepting after this many connections (each client keeps up to
/// `TASKS`).
const MAX_CONNECTIONS: usize = 4096;
/// What the server answers with a 200.
const ANSWER: &[u8] = b"ok, handled...\n";
/// Attempt records kept by the behaviour paths at most (they are few).
const MAX_RECORDS: usize = 1024;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Bare,
    Service,
    /// The layer over `ReqwestService` sending no key and retrying POSTs anyway, as
    /// reqwest-retry does: the like-for-like POST beside it.
    ServiceNoKey,
    /// reqwest-middleware's client with no middleware: what the two middleware rows pay
    /// for the chain itself, before any retry middleware.
    Chain,
    Middleware,
    ReqwestRetry,
    Builtin,
}

const KINDS: [Kind; 7] = [
    Kind::Bare,
    Kind::Service,
    Kind::ServiceNoKey,
    Kind::Chain,
    Kind::Middleware,
    Kind::ReqwestRetry,
    Kind::Builtin,
];

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Bare => "bare reqwest",
            Kind::Service => "RetryLayer over ReqwestService",
            Kind::ServiceNoKey => "the same, no key, assume_idempotent",
            Kind::Chain => "reqwest-middleware, no middleware",
            Kind::Middleware => "RetryMiddleware (reqwest-middleware)",
            Kind::ReqwestRetry => "reqwest-middleware + reqwest-retry",
            Kind::Builtin => "reqwest 0.13 built-in retry",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Workload {
    Get,
    Post,
    Flaky,
}

const WORKLOADS: [Workload; 3] = [Workload::Get, Workload::Post, Workload::Flaky];

impl Workload {
    fn name(self) -> &'static str {
        match self {
            Workload::Get => "get",
            Workload::Post => "post_1k",
            Workload::Flaky => "flaky (10% 503s, zero backoff)",
        }
    }
}

/// The server's state: a counter for the flaky and outage paths, and what each attempt to
/// a `/once/...` path brought (when it arrived, its idempotency key, its body's length).
/// One attempt at a `/once/...` path: when it arrived, its idempotency key, its body's
/// length.
type Record = (Instant, Option<String>, usize);

#[derive(Default)]
struct State {
    flaky: AtomicUsize,
    down: AtomicUsize,
    once: Mutex<HashMap<String, Vec<Record>>>,
}

async fn handle(state: Arc<State>, request: Request<Incoming>) -> Response<Full<Bytes>> {
    let path = request.uri().path().to_owned();
    let key = request
        .headers()
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    // Read the request body, as a real handler would.
    let received = match request.into_body().collect().await {
        Ok(body) => body.to_bytes().len(),
        Err(_) => 0,
    };
    let status = |status: StatusCode| {
        let mut response = Response::new(Full::new(Bytes::from_static(ANSWER)));
        *response.status_mut() = status;
        response
    };
    match path.as_str() {
        "/ok" => status(StatusCode::OK),
        "/flaky" => {
            if state
                .flaky
                .fetch_add(1, Ordering::Relaxed)
                .is_multiple_of(10)
            {
                status(StatusCode::SERVICE_UNAVAILABLE)
            } else {
                status(StatusCode::OK)
            }
        }
        "/down" => {
            state.down.fetch_add(1, Ordering::Relaxed);
            status(StatusCode::SERVICE_UNAVAILABLE)
        }
        // The first attempt gets a 503 (with `Retry-After: 1` under `/once/ra-`), the
        // others a 200; every answer reports the attempts so far.
        path if path.starts_with("/once/") => {
            let mut once = state.once.lock().unwrap_or_else(|e| e.into_inner());
            let records = once.entry(path.to_owned()).or_default();
            if records.len() < MAX_RECORDS {
                records.push((Instant::now(), key, received));
            }
            let first = records.len() == 1;
            let report = report(records);
            let mut response = if first {
                status(StatusCode::SERVICE_UNAVAILABLE)
            } else {
                status(StatusCode::OK)
            };
            if first && path.starts_with("/once/ra-") {
                response
                    .headers_mut()
                    .insert("retry-after", http::HeaderValue::from_static("1"));
            }
            if let Ok(value) = http::HeaderValue::try_from(report) {
                response.headers_mut().insert("x-report", value);
            }
            response
        }
        _ => status(StatusCode::NOT_FOUND),
    }
}

/// What the attempts to one path brought: their number, the gap between the first and the
/// last, their keys, and the last one's body length.
fn report(records: &[Record]) -> String {
    let attempts = records.len();
    let gap = match (records.first(), records.last()) {
        (Some(first), Some(last)) if attempts > 1 => {
            format!("{:.3}ms", (last.0 - first.0).as_secs_f64() * 1e3)
        }
        _ => "-".to_owned(),
    };
    let keys: Vec<&Option<String>> = records.iter().map(|r| &r.1).collect();
    let keys = if keys.iter().all(|k| k.is_none()) {
        "none"
    } else if keys.iter().all(|k| k.is_some() && *k == keys[0]) {
        "the same on every attempt"
    } else {
        "differ"
    };
    let body = records.last().map_or(0, |r| r.2);
    format!("attempts={attempts} gap={gap} key={keys} body={body}")
}

async fn serve() -> (SocketAddr, Arc<State>) {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind 127.0.0.1");
    let addr = listener.local_addr().expect("local address");
    let state = Arc::new(State::default());
    let shared = Arc::clone(&state);
    tokio::spawn(async move {
        for _ in 0..MAX_CONNECTIONS {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let _ = stream.set_nodelay(true);
            let state = Arc::clone(&shared);
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |request| {
                    let state = Arc::clone(&state);
                    async move { Ok::<_, Infallible>(handle(state, request).await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (addr, state)
}

fn reqwest_client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("a reqwest client")
}

fn layer() -> RetryLayer {
    RetryLayer::new().policy(
        RetryPolicy::new()
            .idempotency_key(IdempotencyKey::default())
            .max_attempts(3)
            .backoff(Backoff::exponential(Duration::ZERO, Duration::ZERO)),
    )
}

/// One client of each kind, each with its own connection pool and budget.
struct Clients {
    bare: reqwest::Client,
    service: Retry<ReqwestService>,
    service_no_key: Retry<ReqwestService>,
    chain: ClientWithMiddleware,
    middleware: ClientWithMiddleware,
    reqwest_retry: ClientWithMiddleware,
    builtin: reqwest::Client,
}

impl Clients {
    fn new() -> Self {
        let backoff = ExponentialBackoff::builder()
            .retry_bounds(Duration::ZERO, Duration::ZERO)
            .build_with_max_retries(2);
        let retry = reqwest::retry::for_host("127.0.0.1")
            .max_retries_per_request(2)
            .classify_fn(|attempt| {
                if attempt.status() == Some(StatusCode::SERVICE_UNAVAILABLE) {
                    attempt.retryable()
                } else {
                    attempt.success()
                }
            });
        Self {
            bare: reqwest_client(),
            service: tower::Layer::layer(&layer(), ReqwestService::new(reqwest_client())),
            service_no_key: tower::Layer::layer(
                &RetryLayer::new().policy(
                    RetryPolicy::default()
                        .max_attempts(3)
                        .backoff(Backoff::exponential(Duration::ZERO, Duration::ZERO))
                        .assume_idempotent(true),
                ),
                ReqwestService::new(reqwest_client()),
            ),
            chain: reqwest_middleware::ClientBuilder::new(reqwest_client()).build(),
            middleware: reqwest_middleware::ClientBuilder::new(reqwest_client())
                .with(RetryMiddleware::new(layer()))
                .build(),
            reqwest_retry: reqwest_middleware::ClientBuilder::new(reqwest_client())
                .with(RetryTransientMiddleware::new_with_policy(backoff))
                .build(),
            builtin: reqwest::Client::builder()
                .no_proxy()
                .retry(retry)
                .build()
                .expect("a reqwest client"),
        }
    }

    /// One request; the status and the body read to its end, or the error as text.
    async fn send(
        &self,
        kind: Kind,
        method: Method,
        url: &str,
        body: Option<reqwest::Body>,
    ) -> Result<reqwest::Response, String> {
        let plain = |client: &reqwest::Client, body: Option<reqwest::Body>| {
            let builder = client.request(method.clone(), url);
            match body {
                Some(body) => builder.body(body),
                None => builder,
            }
        };
        match kind {
            Kind::Bare => plain(&self.bare, body)
                .send()
                .await
                .map_err(|e| e.to_string()),
            Kind::Builtin => plain(&self.builtin, body)
                .send()
                .await
                .map_err(|e| e.to_string()),
            Kind::Service | Kind::ServiceNoKey => {
                let request = Request::builder()
                    .method(method)
                    .uri(url)
                    .body(body.unwrap_or_else(|| reqwest::Body::from(Bytes::new())))
                    .map_err(|e| e.to_string())?;
                let service = match kind {
                    Kind::Service => &self.service,
                    _ => &self.service_no_key,
                };
                match service.clone().oneshot(request).await {
                    Ok(response) => Ok(reqwest::Response::from(response)),
                    Err(error) => Err(error.to_string()),
                }
            }
            Kind::Chain | Kind::Middleware | Kind::ReqwestRetry => {
                let client = match kind {
                    Kind::Chain => &self.chain,
                    Kind::Middleware => &self.middleware,
                    _ => &self.reqwest_retry,
                };
                let builder = client.request(method, url);
                let builder = match body {
                    Some(body) => builder.body(body),
                    None => builder,
                };
                builder.send().await.map_err(|e| format!("{e:#}"))
            }
        }
    }
}

/// `BATCH` requests of `workload` through `kind`, from `TASKS` tasks; how long they took.
async fn batch(
    clients: &Arc<Clients>,
    kind: Kind,
    workload: Workload,
    addr: SocketAddr,
) -> Duration {
    let (method, url) = match workload {
        Workload::Get => (Method::GET, format!("http://{addr}/ok")),
        Workload::Post => (Method::POST, format!("http://{addr}/ok")),
        Workload::Flaky => (Method::GET, format!("http://{addr}/flaky")),
    };
    let url: Arc<str> = url.into();
    let payload = Bytes::from(vec![b'p'; 1024]);
    let next = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(TASKS);
    for _ in 0..TASKS {
        let (clients, url, next, method) = (
            Arc::clone(clients),
            Arc::clone(&url),
            Arc::clone(&next),
            method.clone(),
        );
        let payload = payload.clone();
        tasks.push(tokio::spawn(async move {
            while next.fetch_add(1, Ordering::Relaxed) < BATCH {
                let body = (method == Method::POST).then(|| reqwest::Body::from(payload.clone()));
                let response = clients
                    .send(kind, method.clone(), &url, body)
                    .await
                    .unwrap_or_else(|e| panic!("{}: {e}", kind.name()));
                let status = response.status();
                assert!(status.is_success() || status == StatusCode::SERVICE_UNAVAILABLE);
                let body = response.bytes().await.expect("the response body");
                assert_eq!(body, ANSWER);
            }
        }));
    }
    for task in tasks {
        task.await.expect("a sending task");
    }
    start.elapsed()
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = q * (sorted.len() - 1) as f64;
    let (lo, hi) = (i.floor() as usize, i.ceil() as usize);
    sorted[lo] + (sorted[hi] - sorted[lo]) * (i - lo as f64)
}

fn sorted(mut values: Vec<f64>) -> Vec<f64> {
    values.sort_by(f64::total_cmp);
    values
}

async fn speed(addr: SocketAddr, rounds: usize) {
    let clients = Arc::new(Clients::new());
    // Warm-up: every pool opens its connections.
    for workload in WORKLOADS {
        for kind in KINDS {
            batch(&clients, kind, workload, addr).await;
        }
    }
    // times[workload][kind][round]
    let mut times = vec![vec![Vec::with_capacity(rounds); KINDS.len()]; WORKLOADS.len()];
    for round in 0..rounds {
        for (w, workload) in WORKLOADS.into_iter().enumerate() {
            for i in 0..KINDS.len() {
                let k = (i + round) % KINDS.len();
                let elapsed = batch(&clients, KINDS[k], workload, addr).await;
                times[w][k].push(elapsed.as_secs_f64());
            }
        }
    }
    println!("\nspeed: {rounds} interleaved rounds of {BATCH} requests from {TASKS} tasks");
    for (w, workload) in WORKLOADS.into_iter().enumerate() {
        println!("\n{}", workload.name());
        println!(
            "  {:<38} {:>9}  {:>7}  {:>15}",
            "client", "req/s", "ratio", "p25-p75"
        );
        for (k, kind) in KINDS.into_iter().enumerate() {
            let rps = sorted(times[w][k].iter().map(|t| BATCH as f64 / t).collect());
            let ratios = sorted(
                times[w][0]
                    .iter()
                    .zip(&times[w][k])
                    .map(|(bare, t)| bare / t)
                    .collect(),
            );
            println!(
                "  {:<38} {:>9.0}  {:>7.3}  {:>7.3}-{:<7.3}",
                kind.name(),
                quantile(&rps, 0.5),
                quantile(&ratios, 0.5),
                quantile(&ratios, 0.25),
                quantile(&ratios, 0.75),
            );
        }
    }
}

fn first_line(text: &str) -> String {
    let line = text.lines().next().unwrap_or("");
    line.chars().take(90).collect()
}

/// One request to a `/once/...` path; what the server saw, or the error.
async fn once(
    clients: &Clients,
    kind: Kind,
    addr: SocketAddr,
    path: &str,
    method: Method,
    body: Option<reqwest::Body>,
) -> String {
    let url = format!("http://{addr}/once/{path}");
    match clients.send(kind, method, &url, body).await {
        Ok(response) => {
            let status = response.status().as_u16();
            let report = response
                .headers()
                .get("x-report")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_owned();
            let _ = response.bytes().await;
            format!("{status} {report}")
        }
        Err(error) => format!("error: {}", first_line(&error)),
    }
}

async fn behaviour(addr: SocketAddr, state: &Arc<State>) {
    println!("\nbehaviour (fresh clients; the server's view of the attempts)");
    for (k, kind) in KINDS.into_iter().enumerate() {
        let clients = Clients::new();
        println!("\n{}", kind.name());
        let ra = once(&clients, kind, addr, &format!("ra-{k}"), Method::GET, None).await;
        println!("  Retry-After: 1 then 200 (GET):  {ra}");
        let body = Some(reqwest::Body::from(Bytes::from_static(b"{\"amount\":1}")));
        let key = once(
            &clients,
            kind,
            addr,
            &format!("key-{k}"),
            Method::POST,
            body,
        )
        .await;
        println!("  503 then 200 (POST):            {key}");
        let chunks: Vec<Result<Bytes, Infallible>> = vec![
            Ok(Bytes::from_static(b"chunk one, ")),
            Ok(Bytes::from_static(b"chunk two")),
        ];
        let body = Some(reqwest::Body::wrap_stream(futures_util::stream::iter(
            chunks,
        )));
        let stream = once(
            &clients,
            kind,
            addr,
            &format!("stream-{k}"),
            Method::POST,
            body,
        )
        .await;
        println!("  503 then 200 (wrap_stream POST): {stream}");
        // A total outage: a fresh client (its budget full) sends BATCH GETs, all answered 503.
        let clients = Arc::new(Clients::new());
        let before = state.down.load(Ordering::Relaxed);
        let next = Arc::new(AtomicUsize::new(0));
        let url: Arc<str> = format!("http://{addr}/down").into();
        let mut tasks = Vec::with_capacity(TASKS);
        for _ in 0..TASKS {
            let (clients, url, next) = (Arc::clone(&clients), Arc::clone(&url), Arc::clone(&next));
            tasks.push(tokio::spawn(async move {
                while next.fetch_add(1, Ordering::Relaxed) < BATCH {
                    if let Ok(response) = clients.send(kind, Method::GET, &url, None).await {
                        let _ = response.bytes().await;
                    }
                }
            }));
        }
        for task in tasks {
            task.await.expect("a sending task");
        }
        let attempts = state.down.load(Ordering::Relaxed) - before;
        println!(
            "  total outage, {BATCH} GETs:       {:.2} attempts per request",
            attempts as f64 / BATCH as f64
        );
    }
}

/// `REQWEST_PROFILE=service/get` (a client: bare, service, service_no_key, chain,
/// middleware, reqwest_retry, builtin; a workload: get, post, flaky) sends `REQWEST_PROFILE_N` batches (default 4)
/// through that client alone, after one batch to warm it up: a run to count instructions
/// with `valgrind --tool=callgrind`, where the difference from the same run of `bare`,
/// divided by the requests, is the client's own cost per request (the server's work is the
/// same in every run).
async fn profile(addr: SocketAddr, spec: &str) {
    let (kind, workload) = spec
        .split_once('/')
        .expect("REQWEST_PROFILE=client/workload");
    let kind = match kind {
        "bare" => Kind::Bare,
        "service" => Kind::Service,
        "service_no_key" => Kind::ServiceNoKey,
        "chain" => Kind::Chain,
        "middleware" => Kind::Middleware,
        "reqwest_retry" => Kind::ReqwestRetry,
        "builtin" => Kind::Builtin,
        other => panic!("an unknown client: {other}"),
    };
    let workload = match workload {
        "get" => Workload::Get,
        "post" => Workload::Post,
        "flaky" => Workload::Flaky,
        other => panic!("an unknown workload: {other}"),
    };
    let batches: usize = std::env::var("REQWEST_PROFILE_N")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(4)
        .clamp(1, 1000);
    let clients = Arc::new(Clients::new());
    batch(&clients, kind, workload, addr).await;
    let mut elapsed = Duration::ZERO;
    for _ in 0..batches {
        elapsed += batch(&clients, kind, workload, addr).await;
    }
    println!(
        "{spec}: {} requests, {:.1} us/request",
        batches * BATCH,
        elapsed.as_secs_f64() * 1e6 / (batches * BATCH) as f64
    );
}

fn main() {
    let profiled = std::env::var("REQWEST_PROFILE").ok();
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == "--list") {
        return;
    }
    // All of it under `cargo bench`, one round under `cargo test --benches`.
    let rounds = if args.iter().any(|a| a == "--bench") {
        std::env::var("ROUNDS")
            .ok()
            .and_then(|r| r.parse().ok())
            .unwrap_or(ROUNDS)
            .clamp(1, 1000)
    } else {
        1
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    runtime.block_on(async {
        let (addr, state) = serve().await;
        if let Some(spec) = profiled {
            profile(addr, &spec).await;
            return;
        }
        speed(addr, rounds).await;
        behaviour(addr, &state).await;
    });
}
