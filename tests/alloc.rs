//! Heap allocations per request on the success path, against tower's `Retry` and the bare
//! service (see BENCHMARKS.md for the targets).
//!
//! A counting global allocator wraps `std::alloc::System`. It counts only on the thread
//! that switched counting on (a thread-local flag), so the test harness may run these
//! tests in parallel. Every request is built before counting starts; what is counted is
//! `ready`, `call`, polling the response future to completion with a no-op waker
//! (`now_or_never`), and dropping the response. Frees are not counted; a `realloc` counts
//! as one allocation.
//!
//! Run with `cargo test --test alloc -- --nocapture` to see the counts. Set
//! `ALLOC_BACKTRACE=1` as well to print a backtrace of every counted allocation of the
//! layer cases (run one test at a time with `--test-threads=1`: the output is long).

use std::alloc::{GlobalAlloc, Layout, System};
use std::backtrace::Backtrace;
use std::cell::{Cell, RefCell};
use std::convert::Infallible;
use std::fmt;
use std::future::ready;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use futures_util::FutureExt;
use http::header::{ACCEPT, CONTENT_TYPE, USER_AGENT};
use http::{HeaderName, HeaderValue, Request, Response, StatusCode};
use http_body::Body;
use http_body_util::Full;
use tower::{Layer, Service, ServiceExt};
use tower_http_retry::{
    Backoff, IdempotencyKey, Jitter, ReplayBody, RetryInfo, RetryLayer, RetryPolicy, RetryQuota,
    Throttle,
};

#[path = "../benches/support/mod.rs"]
mod support;
use support::{ConnInfo, NOOP, Noop, TowerPolicy, drain};

// ---------------------------------------------------------------------------------------
// The counting allocator.

struct Counting;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
    static LARGEST: Cell<usize> = const { Cell::new(0) };
    /// Set while a backtrace is being taken, so its own allocations are not counted.
    static TRACING: Cell<bool> = const { Cell::new(false) };
    static TRACES: RefCell<Vec<(usize, Backtrace)>> = const { RefCell::new(Vec::new()) };
    static WANT_TRACES: Cell<bool> = const { Cell::new(false) };
}

fn record(size: usize) {
    // `try_with`: the allocator also runs while thread-locals are being torn down.
    let on = COUNTING.try_with(Cell::get).unwrap_or(false);
    let nested = TRACING.try_with(Cell::get).unwrap_or(true);
    if !on || nested {
        return;
    }
    let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
    let _ = LARGEST.try_with(|l| l.set(l.get().max(size)));
    if WANT_TRACES.try_with(Cell::get).unwrap_or(false) {
        let _ = TRACING.try_with(|t| t.set(true));
        let trace = Backtrace::force_capture();
        let _ = TRACES.try_with(|traces| traces.borrow_mut().push((size, trace)));
        let _ = TRACING.try_with(|t| t.set(false));
    }
}

// SAFETY: every method forwards to `System` with the arguments it was given; the counting
// touches only `const`-initialised thread-locals, which never allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        record(layout.size());
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract, which `System` shares.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        record(layout.size());
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        record(new_size);
        // SAFETY: `ptr` was allocated by `System` with `layout` (every allocation goes
        // through this wrapper).
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as for `realloc`.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// What the counter saw while a closure ran on this thread.
#[derive(Debug, Clone, Copy)]
struct Seen {
    allocations: u64,
    largest: usize,
}

fn count<R>(traced: bool, f: impl FnOnce() -> R) -> (R, Seen) {
    ALLOCATIONS.with(|c| c.set(0));
    LARGEST.with(|l| l.set(0));
    let want = traced && std::env::var_os("ALLOC_BACKTRACE").is_some();
    WANT_TRACES.with(|w| w.set(want));
    COUNTING.with(|c| c.set(true));
    let result = f();
    COUNTING.with(|c| c.set(false));
    WANT_TRACES.with(|w| w.set(false));
    let seen = Seen {
        allocations: ALLOCATIONS.with(Cell::get),
        largest: LARGEST.with(Cell::get),
    };
    let traces = TRACES.with(|t| std::mem::take(&mut *t.borrow_mut()));
    for (i, (size, trace)) in traces.iter().enumerate() {
        println!("--- allocation {i}: {size} bytes\n{trace}");
    }
    (result, seen)
}

// ---------------------------------------------------------------------------------------
// Requests and services.

const REQUESTS: usize = 100;
const WARM_UP: usize = 10;

/// A GET as a client would build it: a parsed URI, a few headers (constant ones from
/// static strings, a request id made at run time), and a fresh 1 KiB body.
fn get(i: usize) -> Request<Full<Bytes>> {
    Request::get(format!("http://127.0.0.1:3000/items/{i}"))
        .header(ACCEPT, HeaderValue::from_static("application/json"))
        .header(USER_AGENT, HeaderValue::from_static("alloc-test/1"))
        .header(CONTENT_TYPE, HeaderValue::from_static("application/json"))
        .header(
            HeaderName::from_static("x-request-id"),
            HeaderValue::try_from(format!("req-{i:08}")).unwrap(),
        )
        .body(Full::new(Bytes::from(vec![b'a'; 1024])))
        .unwrap()
}

/// Average allocations per request of `svc`, after a warm-up, for `REQUESTS` requests
/// made by `make`.
fn per_request<S, RB>(name: &str, mut svc: S, make: impl Fn(usize) -> Request<Full<Bytes>>) -> f64
where
    S: Service<Request<Full<Bytes>>, Response = Response<RB>>,
    S::Error: fmt::Debug,
{
    let one = |svc: &mut S, request| {
        let ready = svc.ready().now_or_never().expect("ready at once");
        ready.expect("ready");
        let response = svc
            .call(request)
            .now_or_never()
            .expect("answered at once")
            .expect("success");
        assert_eq!(response.status(), StatusCode::OK);
    };
    // Warm-up: thread-local generators, tracing call sites, the budget's first window.
    for i in 0..WARM_UP {
        one(&mut svc, make(i));
    }
    // With ALLOC_BACKTRACE set, show where one request's allocations come from.
    if std::env::var_os("ALLOC_BACKTRACE").is_some() {
        let request = make(WARM_UP);
        println!("=== {name}: backtraces of one request");
        let ((), one_seen) = count(true, || one(&mut svc, request));
        println!(
            "=== {name}: {} allocations in that request",
            one_seen.allocations
        );
    }
    let requests: Vec<_> = (0..REQUESTS).map(&make).collect();
    let ((), seen) = count(false, || {
        for request in requests {
            one(&mut svc, request);
        }
    });
    let average = seen.allocations as f64 / REQUESTS as f64;
    println!(
        "{name:<28} {average:>5.2} allocations per request (largest {} bytes)",
        seen.largest
    );
    average
}

fn tower_retry<S>(inner: S) -> tower::retry::Retry<TowerPolicy, S> {
    tower::retry::Retry::new(TowerPolicy::new(), inner)
}

// ---------------------------------------------------------------------------------------
// The tests.

#[test]
fn the_counter_sees_allocations_on_this_thread_only() {
    let (v, seen) = count(false, || {
        let v = std::hint::black_box(vec![0u8; 4096]);
        std::thread::spawn(|| std::hint::black_box(vec![0u8; 100_000]))
            .join()
            .unwrap();
        v
    });
    // The thread's own 100 kB vector is not counted; spawning allocates a little here.
    assert!(seen.allocations >= 1, "{seen:?}");
    assert!(seen.largest >= 4096 && seen.largest < 100_000, "{seen:?}");
    assert_eq!(v.len(), 4096);
}

#[test]
fn the_request_and_the_services_behave_as_assumed() {
    // Our layer over the no-op service succeeds at once and reports one attempt.
    let drain_all = Noop {
        drain: true,
        conn_info: true,
        info: false,
    };
    let mut ours = RetryLayer::new().layer(drain_all);
    let response = ours.call(get(0)).now_or_never().unwrap().unwrap();
    let info = response.extensions().get::<RetryInfo>().unwrap();
    assert_eq!(info.attempts(), 1);
    assert!(response.extensions().get::<ConnInfo>().is_some());
    // Draining reads the whole 1 KiB.
    let replay = ReplayBody::new(Full::new(Bytes::from(vec![1u8; 1024])), 64 * 1024);
    assert_eq!(drain(replay), 1024);
    // Tower's retry over the same service succeeds at once too.
    let mut tower = tower_retry(drain_all);
    let response = tower.call(get(0)).now_or_never().unwrap().unwrap();
    assert_eq!(response.status(), StatusCode::OK);
}

/// What creating a response's extension map costs, beyond the one `Box` of the value:
/// the bare service inserting a `RetryInfo` itself, less the bare service, less one.
///
/// `http::Extensions` allocates its map (a `Box`) and the map's table on the first insert.
/// hyper-util's client responses always carry `HttpInfo` already, so there the layer's
/// `RetryInfo` costs one `Box`, as the allocation target counts it. On a response with no extensions
/// (a bare test service), whoever inserts first pays the map too: the targets below add
/// this measured cost for those cases, and hold exactly for the hyper-util case.
fn extension_map_cost() -> f64 {
    let bare = per_request("bare", NOOP, get);
    let with_info = per_request("bare + RetryInfo insert", Noop { info: true, ..NOOP }, get);
    let cost = with_info - bare - 1.0;
    assert!((0.0..=2.0).contains(&cost), "unexpected map cost {cost}");
    cost
}

/// The target: ours <= tower + 2 (the replay state and `RetryInfo`), all three counted in
/// one test, on responses that carry an extension as hyper-util's do, body read.
#[test]
fn ours_allocates_at_most_two_more_than_tower_per_get_with_response_extensions() {
    let real = Noop {
        drain: true,
        conn_info: true,
        info: false,
    };
    let bare = per_request("bare, conn info", real, get);
    let tower = per_request("tower Retry, conn info", tower_retry(real), get);
    let ours = per_request(
        "ours (default), conn info",
        RetryLayer::new().layer(real),
        get,
    );
    println!(
        "ours - tower = {:+.2}, ours - bare = {:+.2}",
        ours - tower,
        ours - bare
    );
    assert!(
        ours <= tower + 2.0,
        "ours {ours} > tower {tower} + 2 (bare {bare})"
    );
}

/// A hedged request that succeeds before its delay boxes its flight and its first attempt
/// (its attempts in flight, together) and keeps them in a vector: three allocations more
/// than the same policy without hedging, and nothing more (no timer task, no hedge).
#[test]
fn a_hedged_request_answered_at_once_allocates_its_flight_and_nothing_more() {
    let plain = per_request(
        "ours, 2 attempts",
        RetryLayer::new()
            .policy(RetryPolicy::default().max_attempts(2))
            .layer(NOOP),
        get,
    );
    let hedged =
        per_request(
            "ours, hedged after 10 ms",
            RetryLayer::new()
                .policy(RetryPolicy::default().max_attempts(2).hedge(
                    tower_http_retry::Hedging::after(std::time::Duration::from_millis(10)),
                ))
                .layer(NOOP),
            get,
        );
    println!("hedged - plain = {:+.2}", hedged - plain);
    assert!(hedged <= plain + 3.0, "hedged {hedged} > plain {plain} + 3");
    assert!(
        hedged >= plain + 1.0,
        "hedged {hedged}, plain {plain}: no flight?"
    );
}

/// The same target on a response with no extensions, where the first insert also creates
/// the map (see [`extension_map_cost`]). The inner service does not read the body.
#[test]
fn ours_allocates_at_most_two_more_than_tower_per_get() {
    let map = extension_map_cost();
    let bare = per_request("bare", NOOP, get);
    let tower = per_request("tower Retry", tower_retry(NOOP), get);
    let ours = per_request("ours (default policy)", RetryLayer::new().layer(NOOP), get);
    println!(
        "ours - tower = {:+.2}, ours - bare = {:+.2}, map {map}",
        ours - tower,
        ours - bare
    );
    assert!(
        ours <= tower + 2.0 + map,
        "ours {ours} > tower {tower} + 2 + map {map} (bare {bare})"
    );
}

/// The same, with an inner service that reads the request body to its end, as a real
/// client does: the replay recording keeps a handle of the 1 KiB chunk (inline, no `Vec`).
#[test]
fn ours_allocates_at_most_two_more_than_tower_per_get_when_the_body_is_read() {
    let map = extension_map_cost();
    let read = Noop {
        drain: true,
        conn_info: false,
        info: false,
    };
    let bare = per_request("bare, body read", read, get);
    let tower = per_request("tower Retry, body read", tower_retry(read), get);
    let ours = per_request(
        "ours (default), body read",
        RetryLayer::new().layer(read),
        get,
    );
    println!(
        "ours - tower = {:+.2}, ours - bare = {:+.2}, map {map}",
        ours - tower,
        ours - bare
    );
    assert!(
        ours <= tower + 2.0 + map,
        "ours {ours} > tower {tower} + 2 + map {map} (bare {bare})"
    );
}

/// A request that can never be retried "pays almost nothing: no head clone, no
/// replay state": at most one allocation over the bare service (the `RetryInfo`), on
/// responses that carry an extension as hyper-util's do.
#[test]
fn never_allocates_at_most_one_more_than_bare_per_get() {
    let real = Noop {
        drain: false,
        conn_info: true,
        info: false,
    };
    let bare = per_request("bare, conn info", real, get);
    let never = per_request(
        "ours (never), conn info",
        RetryLayer::new().policy(RetryPolicy::never()).layer(real),
        get,
    );
    println!("never - bare = {:+.2}", never - bare);
    assert!(never <= bare + 1.0, "never {never} > bare {bare} + 1");
}

/// On a response with no extensions: no head clone and no replay state, so nothing but
/// what a `RetryInfo` insert costs on the same response.
#[test]
fn never_allocates_nothing_but_the_retry_info_insert() {
    let with_info = per_request("bare + RetryInfo insert", Noop { info: true, ..NOOP }, get);
    let never = per_request(
        "ours (never)",
        RetryLayer::new().policy(RetryPolicy::never()).layer(NOOP),
        get,
    );
    assert!(with_info >= 1.0, "the insert allocates: {with_info}");
    assert!(
        never <= with_info,
        "never {never} > bare with a RetryInfo insert {with_info}"
    );
}

/// Not a target, a record: a POST gets no key by default; with keys on, an idempotency key
/// from us (tower adds none).
#[test]
fn post_with_a_key_is_counted_too() {
    let post = |i| {
        let mut request = get(i);
        *request.method_mut() = http::Method::POST;
        request
    };
    let keyed =
        || RetryLayer::new().policy(RetryPolicy::new().idempotency_key(IdempotencyKey::default()));
    let bare = per_request("bare, POST", NOOP, post);
    let tower = per_request("tower Retry, POST (no key)", tower_retry(NOOP), post);
    let plain = per_request("ours (default), POST", RetryLayer::new().layer(NOOP), post);
    let ours = per_request("ours, keys on, POST + key", keyed().layer(NOOP), post);
    println!(
        "ours - tower = {:+.2}, ours - bare = {:+.2}, unkeyed - bare = {:+.2}",
        ours - tower,
        ours - bare,
        plain - bare
    );
    let mut svc = keyed().layer(NOOP);
    let response = svc.call(post(0)).now_or_never().unwrap().unwrap();
    let info = response.extensions().get::<RetryInfo>().unwrap();
    assert!(info.idempotency_key().is_some(), "{info:?}");
    let mut svc = RetryLayer::new().layer(NOOP);
    let response = svc.call(post(0)).now_or_never().unwrap().unwrap();
    let info = response.extensions().get::<RetryInfo>().unwrap();
    assert!(info.idempotency_key().is_none(), "{info:?}");
    assert!(
        ours > bare && tower > bare && plain > bare,
        "bare {bare}, tower {tower}, ours {ours}, unkeyed {plain}"
    );
    assert!(
        plain < ours,
        "the key allocates: unkeyed {plain}, keyed {ours}"
    );
}

/// One attempt under gates that hear outcomes (a quota, a throttle) reports each outcome
/// without keeping the head or a replay state: it allocates what `never()` does, which
/// tells them nothing, and the flag its body raises if the caller's body fails (that
/// failure is the caller's, and no gate hears it).
#[test]
fn one_attempt_reporting_to_its_gates_keeps_no_head_and_no_replay_state() {
    let layer = || {
        RetryLayer::new().policy(
            RetryPolicy::new()
                .gate(RetryQuota::default())
                .gate(Throttle::builder().build()),
        )
    };
    let never = per_request(
        "ours (never), quota and throttle",
        layer().policy(RetryPolicy::never()).layer(NOOP),
        get,
    );
    let one = per_request(
        "ours (max_attempts(1)), quota and throttle",
        layer()
            .policy(RetryPolicy::default().max_attempts(1))
            .layer(NOOP),
        get,
    );
    let two = per_request(
        "ours (max_attempts(2)), quota and throttle",
        layer()
            .policy(RetryPolicy::default().max_attempts(2))
            .layer(NOOP),
        get,
    );
    println!(
        "one - never = {:+.2}, two - never = {:+.2}",
        one - never,
        two - never
    );
    assert!(one <= never + 1.0, "one attempt {one} > never {never} + 1");
    // The measure can tell: a policy that may retry keeps its head and its replay state.
    assert!(two >= never + 2.0, "two attempts {two}, never {never}");
}

/// Replaying a 64 KiB `Bytes` body copies no body bytes, so no allocation of
/// anything near its size happens while it is sent, answered 503, and sent again.
#[test]
fn replaying_a_64_kib_body_allocates_no_buffer_of_its_size() {
    const SIZE: usize = 64 * 1024;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    let body = Bytes::from(vec![b'z'; SIZE]);
    let origin = body.as_ptr() as usize;
    let calls = Arc::new(AtomicUsize::new(0));
    // Every frame the inner service receives: (attempt, address of its data, length).
    let frames = Arc::new(std::sync::Mutex::new(Vec::with_capacity(16)));
    let inner = {
        let (calls, frames) = (Arc::clone(&calls), Arc::clone(&frames));
        tower::service_fn(move |request: Request<ReplayBody<Full<Bytes>>>| {
            let attempt = calls.fetch_add(1, Ordering::SeqCst);
            let mut body = request.into_body();
            let mut cx = Context::from_waker(Waker::noop());
            for _ in 0..64 {
                match Pin::new(&mut body).poll_frame(&mut cx) {
                    Poll::Ready(Some(Ok(frame))) => {
                        if let Some(data) = frame.data_ref() {
                            let at = data.as_ptr() as usize;
                            frames.lock().unwrap().push((attempt, at, data.len()));
                        }
                    }
                    _ => break,
                }
            }
            let status = if attempt == 0 {
                StatusCode::SERVICE_UNAVAILABLE
            } else {
                StatusCode::OK
            };
            let mut response = Response::new(());
            *response.status_mut() = status;
            ready(Ok::<_, Infallible>(response))
        })
    };
    let mut svc = RetryLayer::new()
        .policy(
            RetryPolicy::default()
                .max_attempts(2)
                .backoff(Backoff::exponential(Duration::ZERO, Duration::ZERO).jitter(Jitter::None)),
        )
        .layer(inner);
    let request = Request::put("http://127.0.0.1:3000/blob")
        .body(Full::new(body))
        .unwrap();
    let (response, seen) = count(true, || {
        runtime.block_on(async {
            svc.ready().await.unwrap();
            svc.call(request).await.unwrap()
        })
    });
    println!("64 KiB replay: {seen:?}");
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        response.extensions().get::<RetryInfo>().unwrap().attempts(),
        2
    );
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    let frames = frames.lock().unwrap().clone();
    // Both attempts sent the whole body from the caller's own buffer.
    for attempt in 0..2 {
        let sent: usize = frames.iter().filter(|f| f.0 == attempt).map(|f| f.2).sum();
        assert_eq!(sent, SIZE, "attempt {attempt}: {frames:?}");
    }
    assert!(
        frames
            .iter()
            .all(|&(_, at, _)| at >= origin && at < origin + SIZE),
        "a frame does not point into the original buffer: {frames:?} (origin {origin:#x})"
    );
    assert!(
        seen.largest < SIZE,
        "an allocation of {} bytes happened during the replay",
        seen.largest
    );
}

/// Choosing a route allocates nothing. A layer with twenty routes before the
/// one that matches costs exactly what a layer with none costs.
#[test]
fn choosing_among_many_routes_allocates_nothing() {
    use tower_http_retry::RouteMatch;
    let mut routed = RetryLayer::new();
    for i in 0..20 {
        routed = routed.route(
            RouteMatch::post()
                .host(&format!("*.s{i}.example"))
                .path_prefix(&format!("/v{i}")),
            RetryPolicy::default(),
        );
    }
    routed = routed.route(
        RouteMatch::get().host("127.0.0.1").path_prefix("/items"),
        RetryPolicy::default().max_attempts(4),
    );
    let plain = per_request("ours, no routes", RetryLayer::new().layer(NOOP), get);
    let with_routes = per_request("ours, 21 routes", routed.layer(NOOP), get);
    assert!(plain > 0.0, "the counter counts");
    assert_eq!(with_routes, plain);

    let route = RouteMatch::get().host("*.example").path_prefix("/v2");
    let request = Request::get("https://api.example/v2/x").body(()).unwrap();
    let (matched, seen) = count(false, || route.matches(&request));
    assert!(matched);
    assert_eq!(seen.allocations, 0);
}
