//! Pieces the benches and `tests/alloc.rs` share: the no-op inner service, the tower
//! `Retry` policy they compare against (`overhead`, `end_to_end` and `retry_heavy` all use
//! [`TowerPolicy`]), and how much of a bench's extra (non-criterion) part to run. The
//! seatbelt rows' pieces are in `seatbelt.rs` beside this file.
#![allow(dead_code)]

use std::future::{Ready, ready};
use std::sync::Arc;
use std::time::Duration;

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use http::{Request, Response};
use http_body::Body;
use tower::Service;
use tower::retry::budget::{Budget, TpsBudget};
use tower_http_retry::RetryInfo;

/// A `tower::retry::Policy` doing what ours does on the success path: the request is
/// cloned up front (`clone_request`; the `Full<Bytes>` body clone is a reference count,
/// once the first clone of a `Vec`-backed `Bytes` has allocated its shared header), every
/// logical request deposits once into a `TpsBudget`, and 408, 429, 502, 503, 504 and errors
/// are retried at most twice, each retry withdrawn from the budget. It adds no idempotency
/// key.
#[derive(Clone)]
pub struct TowerPolicy {
    budget: Arc<TpsBudget>,
    outcomes: u32,
}

impl TowerPolicy {
    pub fn new() -> Self {
        Self {
            budget: Arc::new(TpsBudget::new(Duration::from_secs(10), 10, 0.1)),
            outcomes: 0,
        }
    }

    /// The same policy over another budget (`benches/retry_heavy.rs` gives both sides one
    /// that never runs dry, so that both retry every 503).
    pub fn with_budget(budget: TpsBudget) -> Self {
        Self {
            budget: Arc::new(budget),
            outcomes: 0,
        }
    }
}

impl<B: Clone, RB, E> tower::retry::Policy<Request<B>, Response<RB>, E> for TowerPolicy {
    type Future = Ready<()>;

    fn retry(
        &mut self,
        _: &mut Request<B>,
        result: &mut Result<Response<RB>, E>,
    ) -> Option<Self::Future> {
        self.outcomes += 1;
        if self.outcomes == 1 {
            self.budget.deposit();
        }
        let retryable = match result {
            Ok(response) => matches!(response.status().as_u16(), 408 | 429 | 502 | 503 | 504),
            Err(_) => true,
        };
        (retryable && self.outcomes <= 2 && self.budget.withdraw()).then(|| ready(()))
    }

    fn clone_request(&mut self, request: &Request<B>) -> Option<Request<B>> {
        let mut copy = Request::new(request.body().clone());
        *copy.method_mut() = request.method().clone();
        *copy.uri_mut() = request.uri().clone();
        *copy.version_mut() = request.version();
        *copy.headers_mut() = request.headers().clone();
        *copy.extensions_mut() = request.extensions().clone();
        Some(copy)
    }
}

/// The median of `values` (sorted in place); NaN when there are none.
pub fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

/// How much of the extra, non-criterion part to run: all of it under `cargo bench`, a
/// single quick pass under `cargo test --benches` or criterion's `--test`, none for
/// `--list` or `--profile-time`.
pub fn extra_runs(full: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    let has = |flag: &str| args.iter().any(|a| a == flag);
    if has("--list") || has("--profile-time") {
        0
    } else if has("--bench") && !has("--test") {
        full
    } else {
        1
    }
}

/// Answers 200 with an empty body at once. With `drain`, first reads the request body to
/// its end (all of it is ready at once here: `Full` and `ReplayBody` of `Full`). With
/// `conn_info`, the response carries one extension already, as every response of a
/// hyper-util legacy client over its `HttpConnector` does (`HttpInfo`).
#[derive(Clone, Copy)]
pub struct Noop {
    pub drain: bool,
    pub conn_info: bool,
    /// Puts a `RetryInfo` in the response itself: the price of that one insert.
    pub info: bool,
}

pub const NOOP: Noop = Noop {
    drain: false,
    conn_info: false,
    info: false,
};

/// Stands in for hyper-util's `HttpInfo`: two socket addresses.
#[derive(Clone, Copy)]
pub struct ConnInfo {
    _remote: std::net::SocketAddr,
    _local: std::net::SocketAddr,
}

impl<B> Service<Request<B>> for Noop
where
    B: Body + Unpin,
{
    type Response = Response<()>;
    type Error = Infallible;
    type Future = Ready<Result<Response<()>, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        if self.drain {
            drain(request.into_body());
        }
        let mut response = Response::new(());
        if self.conn_info {
            let addr = std::net::SocketAddr::from(([127, 0, 0, 1], 3000));
            response.extensions_mut().insert(ConnInfo {
                _remote: addr,
                _local: addr,
            });
        }
        if self.info {
            response.extensions_mut().insert(RetryInfo::default());
        }
        ready(Ok(response))
    }
}

/// Polls a body that is ready at once to its end; gives up on `Pending`. At most 1024
/// frames.
pub fn drain<B: Body + Unpin>(mut body: B) -> u64 {
    let mut cx = Context::from_waker(Waker::noop());
    let mut bytes = 0u64;
    for _ in 0..1024 {
        match Pin::new(&mut body).poll_frame(&mut cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    bytes += bytes::Buf::remaining(data) as u64;
                }
            }
            Poll::Ready(Some(Err(_)) | None) | Poll::Pending => break,
        }
    }
    bytes
}

/// A request body the end-to-end benches make from the bytes they send: `Full<Bytes>` for
/// hyper-util clients and the layers over them; seatbelt_http's `HttpBody` has its own
/// implementation in `benches/support/seatbelt.rs` (kept out of this module, which
/// `tests/alloc.rs` shares and builds without seatbelt).
pub trait RequestBody {
    fn of(bytes: bytes::Bytes) -> Self;
}

impl RequestBody for http_body_util::Full<bytes::Bytes> {
    fn of(bytes: bytes::Bytes) -> Self {
        http_body_util::Full::new(bytes)
    }
}

/// One request through a client-like service, its response body read to the end: what the
/// end-to-end benches do per request. The response body is hyper's `Incoming` for every
/// client but seatbelt_http's, whose `HttpBody` is read the same way.
pub async fn exchange<S, E, B, RB>(
    mut svc: S,
    request: Request<B>,
) -> (http::StatusCode, bytes::Bytes)
where
    S: Service<Request<B>, Response = Response<RB>, Error = E>,
    E: Into<tower::BoxError>,
    RB: Body,
    RB::Error: std::fmt::Debug,
{
    use http_body_util::BodyExt;
    use tower::ServiceExt;
    let response = svc
        .ready()
        .await
        .map_err(Into::into)
        .expect("client ready")
        .call(request)
        .await
        .map_err(Into::into)
        .expect("a response from 127.0.0.1");
    let status = response.status();
    let body = response.into_body().collect().await.expect("response body");
    (status, body.to_bytes())
}
