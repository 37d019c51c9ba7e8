//! Per-request cost of the layer on the success path, over a service that does nothing.
//!
//! One criterion group, so every case runs in the same process, one after the other:
//!
//! | id | what |
//! | --- | --- |
//! | `get/bare` | the no-op service alone |
//! | `get/bare_info` | the no-op service inserting a `RetryInfo` itself: the price of that insert |
//! | `get/ours` | `RetryLayer::new()` (3 attempts, shared budget, no keys) over it |
//! | `get/ours_no_gates` | the same with `RetryPolicy::no_gates()` |
//! | `get/tower` | `tower::retry::Retry` with an equivalent policy (see [`TowerPolicy`]) |
//! | `get/ours_never` | ours with `RetryPolicy::never()` |
//! | `get/ours_limiter`, `get_conn/ours_limiter` | ours with `RetryPolicy::new().gate(AdaptiveLimiter::builder().build())`: the layer's budget and a limiter that never throttles (every answer is a 200) |
//! | `get/ours_adaptive_throttle`, `get_conn/ours_adaptive_throttle` | ours with `.gate(AdaptiveThrottle::builder().build())` beside the budget: client-side throttling that never rejects |
//! | `get/ours_throttle` | ours with gRPC A6's `Throttle::builder().build()` beside the budget: a gate that hears every outcome but is not asked before first attempts |
//! | `get/ours_limiter_only` | `RetryPolicy::new().no_gates().gate(AdaptiveLimiter::builder().build())`: the limiter without the budget, beside `ours_no_gates` |
//! | `get_read/*` | bare, ours, tower, never, but the inner service reads the request body |
//! | `post/*` | bare, `ours` (as it comes: no key, so the POST may not be repeated), `ours_key` (keys turned on: ours stamps an `Idempotency-Key`), tower (adds nothing) |
//! | `get_conn/*` | as `get_read`, but every response already carries one extension, as every response of a hyper-util client over its `HttpConnector` does (`HttpInfo`): the `RetryInfo` insert then finds the extension map made |
//!
//! The request is a GET (or POST) with a parsed URI, four headers and a fresh 1 KiB
//! `Full<Bytes>` body. Requests are built outside the timed section, 64 at a time; the
//! timed section is `ready` + `call` + polling the response future once with a no-op
//! waker (`now_or_never`: no runtime in the measurement) + dropping the response (its
//! `RetryInfo` included). Each criterion sample reports the median time per request of its
//! batches of 64 (see [`median_of_batches`]), which keeps a batch during which the
//! scheduler preempted the bench from counting in full.
//!
//! After criterion, an interleaved run cycles through bare, ours, tower and never round
//! after round and prints medians and per-round ratios: criterion runs the cases one after
//! the other, and on a shared machine the load changes in between.
//!
//! Run: `cargo bench --bench overhead`.
#![allow(clippy::disallowed_methods)] // measures real time with std's clock

use std::fmt;
use std::hint::black_box;
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{BenchmarkId, Criterion};
use futures_util::FutureExt;
use http::header::{ACCEPT, CONTENT_TYPE, USER_AGENT};
use http::{HeaderName, HeaderValue, Method, Request, Response};
use http_body_util::Full;
use tower::{Layer, Service, ServiceExt};
use tower_http_retry::{
    AdaptiveLimiter, AdaptiveThrottle, IdempotencyKey, RetryLayer, RetryPolicy, Throttle,
};

#[path = "support/mod.rs"]
mod support;
use support::{Noop, TowerPolicy, extra_runs, median};

/// A request as a client builds it: a parsed URI, constant headers from static strings,
/// a request id made at run time, and a fresh 1 KiB body.
fn request(method: &Method, i: u64) -> Request<Full<Bytes>> {
    Request::builder()
        .method(method.clone())
        .uri(format!("http://127.0.0.1:3000/items/{i}"))
        .header(ACCEPT, HeaderValue::from_static("application/json"))
        .header(USER_AGENT, HeaderValue::from_static("overhead-bench/1"))
        .header(CONTENT_TYPE, HeaderValue::from_static("application/json"))
        .header(
            HeaderName::from_static("x-request-id"),
            HeaderValue::try_from(format!("req-{i:08}")).expect("a valid header value"),
        )
        .body(Full::new(Bytes::from(vec![b'a'; 1024])))
        .expect("a valid request")
}

/// One request through `svc`, entirely synchronous.
fn one<S, RB>(svc: &mut S, request: Request<Full<Bytes>>)
where
    S: Service<Request<Full<Bytes>>, Response = Response<RB>>,
    S::Error: fmt::Debug,
{
    let ready = svc
        .ready()
        .now_or_never()
        .expect("the service is ready at once");
    ready.expect("the service is ready");
    let response = svc
        .call(request)
        .now_or_never()
        .expect("the response is ready at once")
        .expect("a response");
    black_box(response.status());
}

/// The requests of one case: each gets a new id.
struct Source {
    method: Method,
    next: u64,
}

impl Source {
    fn new(method: &Method) -> Self {
        Self {
            method: method.clone(),
            next: 0,
        }
    }

    fn fill(&mut self, requests: &mut Vec<Request<Full<Bytes>>>, n: u64) {
        requests.extend((0..n).map(|_| {
            self.next += 1;
            request(&self.method, self.next)
        }));
    }
}

/// Sends `iters` requests through `send` in batches of `BATCH`, building each batch
/// untimed, and returns `iters` times the median time per request of the batches.
///
/// The median of batches, not their sum: this machine is shared, and a batch during which
/// the scheduler took the CPU away would otherwise count in full.
fn median_of_batches(
    send: &mut dyn FnMut(Request<Full<Bytes>>),
    source: &mut Source,
    iters: u64,
) -> Duration {
    const BATCH: u64 = 64;
    let mut per_request = Vec::with_capacity(iters.div_ceil(BATCH) as usize);
    let mut requests = Vec::with_capacity(BATCH as usize);
    let mut left = iters;
    while left > 0 {
        let n = left.min(BATCH);
        source.fill(&mut requests, n);
        let start = Instant::now();
        for request in requests.drain(..) {
            send(request);
        }
        per_request.push(start.elapsed().as_nanos() as f64 / n as f64);
        left -= n;
    }
    Duration::from_nanos((median(&mut per_request) * iters as f64) as u64)
}

/// A service under test, type-erased so that the same code drives every case.
struct Case<'a> {
    name: &'static str,
    send: Box<dyn FnMut(Request<Full<Bytes>>) + 'a>,
}

fn case<'a, S, RB>(name: &'static str, mut svc: S) -> Case<'a>
where
    S: Service<Request<Full<Bytes>>, Response = Response<RB>> + 'a,
    S::Error: fmt::Debug,
{
    Case {
        name,
        send: Box::new(move |request| one(&mut svc, request)),
    }
}

/// The cases of one kind of request; the first is always the bare service. `ours_no_gates`
/// only with `all` (criterion); `bare_info` for the plain GET.
fn cases(kind: &Kind, all: bool) -> Vec<Case<'static>> {
    let (method, drain) = (&kind.method, kind.drain);
    let noop = Noop {
        drain,
        conn_info: kind.conn_info,
        info: false,
    };
    let mut cases = vec![case("bare", noop)];
    if method == Method::GET && !drain && !kind.conn_info {
        cases.push(case(
            "bare_info",
            Noop {
                drain,
                conn_info: false,
                info: true,
            },
        ));
    }
    cases.push(case("ours", RetryLayer::new().layer(noop)));
    if method == Method::POST {
        cases.push(case(
            "ours_key",
            RetryLayer::new()
                .policy(RetryPolicy::new().idempotency_key(IdempotencyKey::default()))
                .layer(noop),
        ));
    }
    if all && method == Method::GET && !drain && !kind.conn_info {
        cases.push(case(
            "ours_no_gates",
            RetryLayer::new()
                .policy(RetryPolicy::new().no_gates())
                .layer(noop),
        ));
    }
    cases.push(case(
        "tower",
        tower::retry::Retry::new(TowerPolicy::new(), noop),
    ));
    if method != Method::POST {
        cases.push(case(
            "ours_never",
            RetryLayer::new().policy(RetryPolicy::never()).layer(noop),
        ));
    }
    // The gates that are asked before every attempt, configured but never throttling
    // (every answer is a 200): on `get` and `get_conn`, beside the budget `ours` has.
    if kind.name == "get" || kind.name == "get_conn" {
        cases.push(case(
            "ours_limiter",
            RetryLayer::new()
                .policy(RetryPolicy::new().gate(AdaptiveLimiter::builder().build()))
                .layer(noop),
        ));
        cases.push(case(
            "ours_adaptive_throttle",
            RetryLayer::new()
                .policy(RetryPolicy::new().gate(AdaptiveThrottle::builder().build()))
                .layer(noop),
        ));
    }
    if all && method == Method::GET && !drain && !kind.conn_info {
        cases.push(case(
            "ours_throttle",
            RetryLayer::new()
                .policy(RetryPolicy::new().gate(Throttle::builder().build()))
                .layer(noop),
        ));
        cases.push(case(
            "ours_limiter_only",
            RetryLayer::new()
                .policy(
                    RetryPolicy::new()
                        .no_gates()
                        .gate(AdaptiveLimiter::builder().build()),
                )
                .layer(noop),
        ));
    }
    cases
}

/// The three kinds of request: (id prefix, method, whether the inner service reads the body).
fn kinds() -> [Kind; 4] {
    let kind = |name, method, drain, conn_info| Kind {
        name,
        method,
        drain,
        conn_info,
    };
    [
        kind("get", Method::GET, false, false),
        kind("get_read", Method::GET, true, false),
        kind("post", Method::POST, false, false),
        kind("get_conn", Method::GET, true, true),
    ]
}

/// One kind of request and inner service.
struct Kind {
    /// The id prefix.
    name: &'static str,
    method: Method,
    /// Whether the inner service reads the request body.
    drain: bool,
    /// Whether its responses already carry one extension, as hyper-util's do (`HttpInfo`).
    conn_info: bool,
}

fn overhead(c: &mut Criterion) {
    let mut group = c.benchmark_group("overhead");
    for kind in kinds() {
        for mut case in cases(&kind, true) {
            let mut source = Source::new(&kind.method);
            group.bench_function(BenchmarkId::new(kind.name, case.name), |b| {
                b.iter_custom(|iters| median_of_batches(&mut case.send, &mut source, iters))
            });
        }
    }
    group.finish();
}

/// Cycles through the cases round after round (the order rotating), so that a change in
/// the machine's load hits all of them alike; prints the median ns per request of each and
/// the medians of the per-round ratios.
fn interleaved(kind: &Kind, rounds: usize) {
    const PER_ROUND: u64 = 64 * 200;
    let mut cases = cases(kind, false);
    let n = cases.len();
    let mut ns = vec![Vec::with_capacity(rounds); n];
    let mut source = Source::new(&kind.method);
    for round in 0..rounds {
        for k in 0..n {
            let i = (round + k) % n;
            let t = median_of_batches(&mut cases[i].send, &mut source, PER_ROUND);
            ns[i].push(t.as_nanos() as f64 / PER_ROUND as f64);
        }
    }
    let ratio = |a: usize, b: usize| {
        let mut r: Vec<f64> = ns[a].iter().zip(&ns[b]).map(|(x, y)| x / y).collect();
        median(&mut r)
    };
    println!(
        "interleaved {} ({rounds} rounds of {PER_ROUND} requests per case):",
        kind.name
    );
    for (i, case) in cases.iter().enumerate() {
        let mut v = ns[i].clone();
        let ratio = if i == 0 {
            String::new()
        } else {
            format!(", / bare {:.2}", ratio(i, 0))
        };
        println!(
            "  {:<12} {:>7.1} ns/request{ratio}",
            case.name,
            median(&mut v)
        );
    }
    let ours = cases.iter().position(|c| c.name.starts_with("ours"));
    let tower = cases.iter().position(|c| c.name == "tower");
    if let (Some(o), Some(t)) = (ours, tower) {
        let mut extra: Vec<f64> = (0..rounds)
            .map(|r| (ns[o][r] - ns[0][r]) / (ns[t][r] - ns[0][r]))
            .collect();
        println!(
            "  ours / tower {:.2}; (ours - bare) / (tower - bare) {:.2}",
            ratio(o, t),
            median(&mut extra)
        );
    }
    if let Some(never) = cases.iter().position(|c| c.name == "ours_never") {
        let mut extra: Vec<f64> = (0..rounds).map(|r| ns[never][r] - ns[0][r]).collect();
        println!(
            "  ours_never - bare {:.1} ns (median of per-round differences)",
            median(&mut extra)
        );
    }
    let ours = cases.iter().position(|c| c.name == "ours");
    for gated in ["ours_limiter", "ours_adaptive_throttle"] {
        if let (Some(o), Some(g)) = (ours, cases.iter().position(|c| c.name == gated)) {
            let mut extra: Vec<f64> = (0..rounds).map(|r| ns[g][r] - ns[o][r]).collect();
            println!(
                "  {gated} / ours {:.3}; {gated} - ours {:.1} ns (median of per-round differences)",
                ratio(g, o),
                median(&mut extra)
            );
        }
    }
}

/// `OVERHEAD_PROFILE=get/ours` (a kind and a case, as in the criterion ids) sends
/// `OVERHEAD_PROFILE_N` requests (default 20 000) through that one case and nothing else:
/// a run to count instructions with `valgrind --tool=callgrind`, where the difference from
/// the same run of `bare` is the case's own cost.
fn profile(spec: &str) {
    let (kind_name, case_name) = spec.split_once('/').expect("OVERHEAD_PROFILE=kind/case");
    let n: u64 = std::env::var("OVERHEAD_PROFILE_N")
        .ok()
        .map(|n| n.parse().expect("OVERHEAD_PROFILE_N is a number"))
        .unwrap_or(20_000);
    let kind = kinds()
        .into_iter()
        .find(|k| k.name == kind_name)
        .expect("a known kind: get, get_read, post, get_conn");
    let mut case = cases(&kind, true)
        .into_iter()
        .find(|c| c.name == case_name)
        .expect("a known case of that kind");
    let mut source = Source::new(&kind.method);
    let t = median_of_batches(&mut case.send, &mut source, n);
    println!(
        "{spec}: {n} requests, {:.1} ns/request",
        t.as_nanos() as f64 / n as f64
    );
}

fn main() {
    if let Ok(spec) = std::env::var("OVERHEAD_PROFILE") {
        profile(&spec);
        return;
    }
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_millis(700))
        .measurement_time(Duration::from_secs(3))
        .sample_size(60)
        .configure_from_args();
    overhead(&mut c);
    c.final_summary();

    let rounds = extra_runs(25);
    if rounds == 0 {
        return;
    }
    println!();
    for kind in kinds() {
        interleaved(&kind, rounds);
    }
}
