//! The seatbelt rows of `end_to_end`, `retry_heavy` and `hedging`: Microsoft's `seatbelt`
//! (retry and hedging through its `tower-service` feature) over a hyper-util client, and
//! `seatbelt_http` over the same client through [`Adapter`].
//!
//! Each is set up as close to the other rows as seatbelt allows:
//!
//! - **What is retried or hedged**: requests whose method is idempotent (GET, PUT: the
//!   benches send no other), on 408, 429, 502, 503, 504 and on client errors; everything
//!   else is returned as it is. The core crate knows nothing of HTTP: its classifier and its
//!   request clone are written here (as tower's policy is, in `mod.rs`); seatbelt_http's are
//!   its own (`HttpClone::idempotent()`, and `HttpRecovery` limited to those statuses, with
//!   its `Retry-After` reading kept).
//! - **Attempts**: 3 (`max_retry_attempts(2)`), or as many as the hedging row says.
//! - **Backoff**: exponential from a base with jitter, capped at 10 s: the base is 100 ms
//!   where ours runs with its default (`end_to_end`, where nothing is retried), zero where
//!   the other rows retry at once (`retry_heavy`). seatbelt's jitter is decorrelated; it has
//!   no full jitter, ours' default.
//! - **No budget**: seatbelt has none, so these rows neither deposit nor withdraw.
//!
//! Not in `mod.rs`: `tests/alloc.rs` shares that file and builds without seatbelt.
#![allow(dead_code)]

use std::sync::OnceLock;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use bytesbuf::BytesView;
use bytesbuf::mem::GlobalPool;
use futures_util::FutureExt;
use futures_util::future::Map;
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use http_extensions::{
    HttpBody, HttpBodyBuilder, HttpBodyOptions, HttpError, HttpRequest, HttpResponse, ResponseExt,
};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::{Client, ResponseFuture};
use seatbelt::hedging::Hedging;
use seatbelt::retry::{Backoff, Retry, RetryLayer};
use seatbelt::{RecoveryInfo, ResilienceContext};
use seatbelt_http::hedging::{HttpHedging, HttpHedgingLayerExt};
use seatbelt_http::retry::{HttpRetry, HttpRetryLayerExt};
use seatbelt_http::{HttpClone, HttpRecovery, HttpResilienceContext};
use tick::Clock;
use tower::{Layer, Service};

use crate::support::RequestBody;

/// What a hyper-util legacy client answers.
pub type Outcome = Result<Response<Incoming>, hyper_util::client::legacy::Error>;

/// seatbelt's retry over a hyper-util client sending `B` bodies.
pub type SeatbeltRetry<B> = Retry<Request<B>, Outcome, Client<HttpConnector, B>>;

/// seatbelt's hedging over a hyper-util client sending `B` bodies.
pub type SeatbeltHedge<B> = Hedging<Request<B>, Outcome, Client<HttpConnector, B>>;

/// seatbelt_http's retry over the adapted client.
pub type HttpRetrying = HttpRetry<Adapter>;

/// seatbelt_http's hedging over the adapted client.
pub type HttpHedge = HttpHedging<Adapter>;

/// A clock for seatbelt's timers (backoff, hedging delays): tick's, driven by a task on the
/// current tokio runtime. Must be called inside one.
pub fn clock() -> Clock {
    Clock::new_tokio()
}

/// The statuses every retrying row of the benches retries (ours by default, tower's
/// `TowerPolicy`).
fn transient(status: StatusCode) -> bool {
    matches!(status.as_u16(), 408 | 429 | 502 | 503 | 504)
}

/// The core crate's classifier: a transient status or a client error is worth another
/// attempt, anything else is the answer.
fn recovery(outcome: &Outcome) -> RecoveryInfo {
    match outcome {
        Ok(response) if transient(response.status()) => RecoveryInfo::retry(),
        Ok(_) => RecoveryInfo::never(),
        Err(_) => RecoveryInfo::retry(),
    }
}

/// The core crate's clone: only an idempotent request is copied for another attempt (a
/// `None` sends the original once, with no retry). `Request<B>` is `Clone` when `B` is.
fn idempotent_copy<B: Clone>(request: &mut Request<B>) -> Option<Request<B>> {
    request.method().is_idempotent().then(|| request.clone())
}

/// seatbelt_http's classifier limited to the statuses the other rows retry; on those it
/// keeps its own reading (`Retry-After` as the delay, client errors as they were marked).
fn http_recovery() -> HttpRecovery {
    HttpRecovery::custom_with_clock(|response, clock| {
        if transient(response.status()) {
            response.recovery_with_clock(clock)
        } else {
            RecoveryInfo::never()
        }
    })
}

/// The settings every seatbelt retry row shares: 3 attempts, exponential backoff from
/// `base` with seatbelt's jitter, capped at 10 s.
fn settings<In, Out, S1, S2>(
    layer: RetryLayer<In, Out, S1, S2>,
    base: Duration,
) -> RetryLayer<In, Out, S1, S2> {
    layer
        .max_retry_attempts(2)
        .backoff(Backoff::Exponential)
        .base_delay(base)
        .max_delay(Duration::from_secs(10))
        .use_jitter(true)
}

/// seatbelt's retry over `client`, backoff from `base`.
pub fn retry<B>(clock: &Clock, client: Client<HttpConnector, B>, base: Duration) -> SeatbeltRetry<B>
where
    B: Clone,
{
    let context = ResilienceContext::new(clock);
    settings(
        Retry::layer("retry", &context)
            .clone_input_with(|request, _| idempotent_copy(request))
            .recovery_with(|outcome, _| recovery(outcome)),
        base,
    )
    .layer(client)
}

/// seatbelt_http's retry over the adapted `client`, backoff from `base`.
pub fn http_retry(clock: &Clock, client: Adapter, base: Duration) -> HttpRetrying {
    let context = HttpResilienceContext::new(clock);
    settings(
        HttpRetry::layer("retry", &context)
            .http_clone(HttpClone::idempotent())
            .http_recovery(http_recovery()),
        base,
    )
    .layer(client)
}

/// seatbelt's hedging over `client`: `attempts` in all, each after `delay` without an
/// answer, or at once after an answer worth another attempt.
pub fn hedge<B>(
    clock: &Clock,
    client: Client<HttpConnector, B>,
    attempts: u8,
    delay: Duration,
) -> SeatbeltHedge<B>
where
    B: Clone,
{
    let context = ResilienceContext::new(clock);
    Hedging::layer("hedging", &context)
        .clone_input_with(|request, _| idempotent_copy(request))
        .recovery_with(|outcome, _| recovery(outcome))
        .max_hedged_attempts(attempts - 1)
        .hedging_delay(delay)
        .layer(client)
}

/// seatbelt_http's hedging over the adapted `client`, as [`hedge`].
pub fn http_hedge(clock: &Clock, client: Adapter, attempts: u8, delay: Duration) -> HttpHedge {
    let context = HttpResilienceContext::new(clock);
    HttpHedging::layer("hedging", &context)
        .http_clone(HttpClone::idempotent())
        .http_recovery(http_recovery())
        .max_hedged_attempts(attempts - 1)
        .hedging_delay(delay)
        .layer(client)
}

/// The one body builder of the process. seatbelt_http's bodies are made only by an
/// `HttpBodyBuilder`, which holds a memory pool and a clock (for body timeouts, which no row
/// sets); making a body from bytes it already has uses neither. Made at the first call,
/// which must be inside a tokio runtime (the clock's driver is spawned on it).
pub fn bodies() -> &'static HttpBodyBuilder {
    static BODIES: OnceLock<HttpBodyBuilder> = OnceLock::new();
    BODIES.get_or_init(|| HttpBodyBuilder::new(GlobalPool::new(), &clock()))
}

/// What a seatbelt_http caller sends: an empty body, or the bytes as a `BytesView`
/// (zero-copy, one small allocation for its bookkeeping).
impl RequestBody for HttpBody {
    fn of(bytes: Bytes) -> Self {
        if bytes.is_empty() {
            bodies().empty()
        } else {
            bodies().bytes(BytesView::from(bytes))
        }
    }
}

/// A hyper-util client sending `HttpBody` requests.
pub type HttpClient = Client<HttpConnector, HttpBody>;

/// The smallest adapter between seatbelt_http and a hyper-util client: seatbelt_http's
/// layers want an inner service from `HttpRequest` to `Result<HttpResponse, HttpError>`.
///
/// - The request goes to the client as it is: `HttpBody` is an `http_body::Body` whose
///   frames (`BytesView`) are `bytes::Buf`, so the client is built over it.
/// - The response's `Incoming` becomes an `HttpBody`: boxed by the builder (one
///   allocation per response), each data frame turned into a `BytesView` (one small
///   allocation per frame, no copy).
/// - A client error becomes an `HttpError` marked worth a retry (as the other rows retry
///   errors); a body error one marked not.
///
/// The future is the client's, mapped by a function pointer: no box.
#[derive(Clone)]
pub struct Adapter(pub HttpClient);

type Convert = fn(
    Result<Response<Incoming>, hyper_util::client::legacy::Error>,
) -> Result<HttpResponse, HttpError>;

impl Service<HttpRequest> for Adapter {
    type Response = HttpResponse;
    type Error = HttpError;
    type Future = Map<ResponseFuture, Convert>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), HttpError>> {
        Service::<HttpRequest>::poll_ready(&mut self.0, cx)
            .map_err(|error| HttpError::other(error, RecoveryInfo::retry(), "client"))
    }

    fn call(&mut self, request: HttpRequest) -> Self::Future {
        self.0.request(request).map(convert as Convert)
    }
}

fn convert(
    outcome: Result<Response<Incoming>, hyper_util::client::legacy::Error>,
) -> Result<HttpResponse, HttpError> {
    match outcome {
        Ok(response) => Ok(response.map(|body| {
            let body = body
                .map_frame(|frame| frame.map_data(BytesView::from))
                .map_err(|error| HttpError::other(error, RecoveryInfo::never(), "body"));
            bodies().body(body, &HttpBodyOptions::default())
        })),
        Err(error) => Err(HttpError::other(error, RecoveryInfo::retry(), "client")),
    }
}
