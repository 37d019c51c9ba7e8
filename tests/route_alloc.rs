//! Choosing a route allocates nothing: a layer with many routes costs the same heap
//! allocations per request as a layer with none.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::future::{Ready, ready};
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::FutureExt;
use http::{Method, Request, Response};
use http_body_util::Full;
use tower::{Layer, Service, ServiceExt};
use tower_http_retry::{ReplayBody, RetryLayer, RetryPolicy, RouteMatch};

struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<usize> = const { Cell::new(0) };
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.with(|n| n.set(n.get() + 1));
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[derive(Clone)]
struct Ok200;

impl Service<Request<ReplayBody<Full<Bytes>>>> for Ok200 {
    type Response = Response<()>;
    type Error = std::convert::Infallible;
    type Future = Ready<Result<Response<()>, Self::Error>>;
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }
    fn call(&mut self, _: Request<ReplayBody<Full<Bytes>>>) -> Self::Future {
        ready(Ok(Response::new(())))
    }
}

fn allocations_per_request(layer: &RetryLayer) -> usize {
    let svc = layer.layer(Ok200);
    let send = || {
        let request = Request::get("https://api.example/v2/items/42")
            .body(Full::new(Bytes::from_static(b"x")))
            .unwrap();
        svc.clone()
            .oneshot(request)
            .now_or_never()
            .unwrap()
            .unwrap();
    };
    for _ in 0..10 {
        send();
    }
    let before = ALLOCATIONS.with(Cell::get);
    for _ in 0..100 {
        send();
    }
    (ALLOCATIONS.with(Cell::get) - before) / 100
}

#[test]
fn choosing_among_many_routes_allocates_nothing() {
    let plain = RetryLayer::new();
    let mut routed = RetryLayer::new();
    for i in 0..20 {
        routed = routed.route(
            RouteMatch::method(Method::POST)
                .host(&format!("*.s{i}.example"))
                .path_prefix(&format!("/v{i}")),
            RetryPolicy::default(),
        );
    }
    // The last route matches: every route before it was tried.
    routed = routed.route(
        RouteMatch::get()
            .host("api.example")
            .path_prefix("/v2/items"),
        RetryPolicy::default().max_attempts(4),
    );
    let plain_count = allocations_per_request(&plain);
    let routed_count = allocations_per_request(&routed);
    assert!(plain_count > 0, "the counter counts");
    assert_eq!(routed_count, plain_count);

    let route = RouteMatch::get().host("*.example").path_prefix("/v2");
    let request = Request::get("https://api.example/v2/x").body(()).unwrap();
    let before = ALLOCATIONS.with(Cell::get);
    assert!(route.matches(&request));
    assert_eq!(ALLOCATIONS.with(Cell::get), before);
}
