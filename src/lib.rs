//! Safe HTTP client retries for [tower] and [hyper].
//!
//! A retry that is not safe turns one payment into two, and a retry loop without limits
//! turns a short outage into a retry storm. [`RetryLayer`] wraps any
//! `tower::Service<http::Request<B>>` (a hyper-util client, a tower stack, a test service)
//! and retries only what is safe to repeat, only as often as the server can bear.
//!
//! **A POST is never sent twice unless its server de-duplicates it**: as it comes, the
//! layer repeats a POST only when the failure proves the server never saw it, or when the
//! request carries an `Idempotency-Key` (set by the caller, or stamped by the layer where
//! [keys are turned on](RetryPolicy::idempotency_key) for a server that honours them).
//!
//! - **Only safe requests.** Idempotent methods (GET, HEAD, OPTIONS, TRACE, QUERY, PUT,
//!   DELETE), requests that carry an `Idempotency-Key`, requests whose policy declares them
//!   repeatable ([`RetryPolicy::assume_idempotent`]), and failures that prove the server
//!   never saw the request (connect errors, HTTP/2 `REFUSED_STREAM`). `CONNECT` never.
//! - **One stable idempotency key, where the server honours it.** With keys turned on (for
//!   the layer, or for one route), non-idempotent requests get an `Idempotency-Key` before
//!   the first attempt; every retry carries the same one ([`IdempotencyKey`]).
//! - **Only retryable outcomes.** Connection failures, timeouts, 408, 429, 502, 503, 504,
//!   and a 500 once ([`classify`]); everything else is returned as is.
//! - **Bodies replayed, not copied.** [`ReplayBody`] keeps `Bytes` handles of what was sent
//!   (64 KiB by default) and replays them exactly; a larger body is sent once, complete.
//! - **Waits that spread load.** Capped exponential backoff with full jitter by default
//!   ([`Backoff`]), with the server's `Retry-After` as a floor ([`retry_after`]).
//! - **Limits.** Max attempts, an overall deadline, per-attempt timeouts, and gates shared
//!   by every clone of the service ([`Gate`]): a token-bucket [`RetryBudget`] by default, so
//!   retries stay a small fraction of traffic during an outage; gRPC's [`Throttle`]; the
//!   AWS SDKs' [`RetryQuota`]; Envoy's [`ConcurrencyBudget`], which bounds the retries and
//!   hedges in flight at once; and, asked before first attempts too, the AWS SDKs'
//!   adaptive [`AdaptiveLimiter`], which slows the client once a server throttles, and the
//!   SRE book's client-side [`AdaptiveThrottle`], which rejects a share of attempts
//!   locally; each per server if wanted.
//! - **Per-route policies** ([`RouteMatch`]) and a per-request override
//!   ([`RetryPolicy`] in the request's extensions), each laid over the layer's policy: a
//!   route changes what it names and keeps the rest.
//! - **Hedging** ([`Hedging`], [`RetryPolicy::hedge`]): a slow request that is safe to
//!   send twice at once (a safe method, or a route that declares it repeatable) gets
//!   another copy after a fixed delay or the route's latency percentile, and the first good
//!   answer wins. Writes are not hedged unless their route says so.
//! - **A record of what happened**: [`RetryInfo`] in the response's extensions.
//! - **Resumable downloads**, opt-in ([`RetryLayer::resume`]): a GET whose response body
//!   breaks is continued with `Range` and `If-Range`, and only with bytes that provably
//!   belong to the same representation ([`ResumeBody`]).
//!
//! An attempt ends when its response head arrives: a response body that fails while the
//! caller reads it is the caller's, neither retried nor bounded by the deadline, unless
//! the layer is made resumable ([`RetryLayer::resume`]), which then continues GET bodies.
//!
//! The layer's waits and time limits are tokio timers: it needs a tokio runtime with time
//! enabled (see [`RetryLayer`]).
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use http::{Request, Response, StatusCode};
//! use http_body_util::{BodyExt, Full};
//! use bytes::Bytes;
//! use tower::{ServiceBuilder, ServiceExt};
//! use tower_http_retry::{Backoff, RetryInfo, RetryLayer, RetryPolicy};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), tower::BoxError> {
//! # let calls = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
//! # let inner = tower::service_fn(move |req: Request<tower_http_retry::ReplayBody<Full<Bytes>>>| {
//! #     let n = calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
//! #     async move {
//! #         let _ = req.into_body().collect().await;
//! #         let status = if n < 2 { StatusCode::SERVICE_UNAVAILABLE } else { StatusCode::OK };
//! #         Ok::<_, std::convert::Infallible>(Response::builder().status(status).body(()).unwrap())
//! #     }
//! # });
//! // `inner` is any service taking `Request<ReplayBody<B>>`, such as a hyper-util client.
//! let client = ServiceBuilder::new()
//!     .layer(RetryLayer::new().policy(
//!         RetryPolicy::new()
//!             .max_attempts(3)
//!             .backoff(Backoff::exponential(Duration::from_millis(100), Duration::from_secs(10)))
//!             .deadline(Duration::from_secs(10)),
//!     ))
//!     .service(inner);
//!
//! let request = Request::get("http://127.0.0.1:3000/items/1").body(Full::new(Bytes::new()))?;
//! let response = client.oneshot(request).await?;
//! assert_eq!(response.status(), StatusCode::OK);
//! let info = response.extensions().get::<RetryInfo>().unwrap();
//! assert_eq!(info.attempts(), 3); // two 503s, then 200
//! # Ok(())
//! # }
//! ```
//!
//! # The inner service and its body
//!
//! The layer wraps the caller's request body in a [`ReplayBody`] (so that it can send it
//! again), so the inner service takes `http::Request<ReplayBody<B>>`, where `B` is the body
//! the caller sends ([`InnerService`]). A hyper-util client is built for that type. For
//! bodies of more than one type, box them; `Full`'s error type is `Infallible`, which
//! `map_err(|e| match e {})` turns into the `BoxError` of the box:
//!
//! ```no_run
//! use bytes::Bytes;
//! use http_body_util::combinators::BoxBody;
//! use http_body_util::{BodyExt, Full};
//! use hyper_util::client::legacy::Client;
//! use hyper_util::rt::TokioExecutor;
//! use tower::{BoxError, ServiceBuilder, ServiceExt};
//! use tower_http_retry::{ReplayBody, RetryLayer};
//!
//! type Body = BoxBody<Bytes, BoxError>;
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), BoxError> {
//! let hyper_client = Client::builder(TokioExecutor::new()).build_http::<ReplayBody<Body>>();
//! let client = ServiceBuilder::new().layer(RetryLayer::new()).service(hyper_client);
//!
//! let body: Body = Full::new(Bytes::from_static(b"{}")).map_err(|e| match e {}).boxed();
//! let request = http::Request::post("http://127.0.0.1:3000/orders").body(body)?;
//! let response = client.oneshot(request).await?;
//! # let _ = response;
//! # Ok(())
//! # }
//! ```
//!
//! A client built for `B` itself (`build_http::<Body>()`) does not fit: the compiler says
//! that the client "cannot be the inner service of `tower_http_retry::Retry`" where it
//! checks the bound (a `Service` bound, `ServiceExt::oneshot(client, request)`), and a
//! `ServiceExt` method called on the client (`client.oneshot(request)`, `client.ready()`)
//! fails with `E0599: the method ... exists for struct Retry<..>, but its trait bounds
//! were not satisfied`.
//!
//! # Logging
//!
//! With the `tracing` feature (on by default), the layer logs through
//! [tracing](https://docs.rs/tracing), on the target `tower_http_retry`:
//!
//! - every retry, transparent retry and hedge, at INFO ([`RetryLayer::retry_log_level`]
//!   sets another level): the attempt it sends, why, and the wait before it (for a hedge,
//!   the time since the attempt before it), with the request's method and URI; and so
//!   every continuation of a resumable body (`continuing the response body`, with the
//!   bytes already `handed` over);
//! - a retry a gate refuses (the budget, a quota, the throttle), at WARN;
//! - every request's span, `http_retry`, and its end (`done`: the attempts, what the one
//!   returned got, why the layer stopped, the time it waited), at DEBUG.
//!
//! A URI is logged without its query string and user info, where tokens and personal data
//! travel, unless [`RetryLayer::log_full_uri`] says to log it whole. No error's text is
//! logged (a client's error may hold the URL): the reason says what failed, and the caller
//! gets the error. With a subscriber that reads `RUST_LOG` (tracing-subscriber's
//! `EnvFilter`), a 503 retried once, then a retry the budget refused:
//!
//! ```text
//! RUST_LOG=tower_http_retry=info
//!  INFO tower_http_retry: retrying attempt=2 reason="status 503" wait=150ms method=GET uri=https://api.example/v1/items
//!  WARN tower_http_retry: not retrying: budget exhausted attempts=2 reason="status 503" method=GET uri=https://api.example/v1/items
//! ```
//!
//! # Guides
//!
//! The [`guide`] pages go into each part in depth: [what is retried and the
//! defaults](guide::defaults), [idempotency keys](guide::idempotency), [server hints,
//! deadlines and timeouts](guide::time), [deadlines that travel to the
//! server](guide::deadlines), [budgets and retry storms](guide::budgets),
//! [per-route policies](guide::routes), [composing with timeouts and circuit
//! breakers](guide::composing), [hedging](guide::hedging), [adaptive rate
//! limiting](guide::adaptive), [resumable downloads](guide::resume) and
//! [troubleshooting](guide::troubleshooting).
//!
//! # Features
//!
//! - `tracing` (default): an event per retry, a warning when a gate refuses one, a span
//!   per logical request ([Logging](#logging)).
//! - `hyper` (default): recognise hyper's and hyper-util's errors when classifying (a
//!   connect error, a request hyper never started, a connection closed under it).
//! - `h2` (default): recognise h2's errors, HTTP/2's: `RST_STREAM(REFUSED_STREAM)` as the
//!   proof that a request never left, `GOAWAY`, a reset stream, a connection's I/O
//!   failure as h2 reports it. An HTTP/1-only client leaves it off
//!   (`default-features = false, features = ["tracing", "hyper"]`), and h2 with indexmap and
//!   tokio-util leave its dependencies.
//! - `metrics`: through the [`metrics`](https://docs.rs/metrics) facade, the counter
//!   `http_retry_retries_total` (label `reason`), the counter
//!   `http_retry_budget_refusals_total` (label `reason`), the counter
//!   `http_retry_local_refusals_total` (label `stop`: requests a gate that paces first
//!   attempts did not send, [`LocallyRefused`]), the counter
//!   `http_retry_continuations_total` (label `reason`: response bodies continued, with
//!   [`RetryLayer::resume`]) and the histogram `http_retry_wait_seconds`.
//! - `opentelemetry` (with `tracing`): retry metrics through OpenTelemetry's metrics API,
//!   `RetryLayer::otel_meter`: four histograms per retried request
//!   (`tower_http_retry.call.retries`, `.transparent_retries`, `.hedges`, `.retry_delay`),
//!   in the shape of gRPC's retry metrics (grpc/proposal A96).
//! - `test-util`: [`RetryPolicy::rng_seed`], seeded jitter for reproducible tests and
//!   simulations, and [`Attempt::new`], to test a hook or a service outside the layer.
//!
//! gRPC's retry rules for tonic clients and the layer over reqwest are crates of their own,
//! built on this one's public API: `tower-http-retry-grpc` and `tower-http-retry-reqwest`.
//!
//! [tower]: https://docs.rs/tower
//! [hyper]: https://docs.rs/hyper

#![forbid(unsafe_code)]
#![warn(
    missing_docs,
    missing_debug_implementations,
    rust_2018_idioms,
    unreachable_pub
)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod backoff;
pub mod classify;
mod config;
mod deadline;
mod decision;
mod error;
pub mod future;
mod gate;
pub mod guide;
mod head;
mod hedge;
pub mod hints;
mod hook;
mod idempotency;
mod info;
mod layer;
mod otel_metrics;
mod policy;
mod reason;
mod replay;
mod resume;
pub mod retry_after;
mod route;
mod service;
mod trace;

// The README's examples compile as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

pub use crate::backoff::{Backoff, Jitter};
pub use crate::deadline::{Deadline, DeadlineLayer, RequestDeadline};
pub use crate::error::{
    AttemptTimedOut, DeadlineExceeded, InvalidConfig, LocallyRefused, RetryError, ServiceNotReady,
};
pub use crate::gate::{
    AdaptiveLimiter, AdaptiveThrottle, ConcurrencyBudget, Gate, GateBuilder, RetryBudget,
    RetryQuota, Throttle,
};
pub use crate::hedge::Hedging;
pub use crate::hook::{Attempt, AttemptHook, AttemptKind};
pub use crate::idempotency::IdempotencyKey;
pub use crate::info::{AttemptOutcome, RetryInfo, RetryRecord, StopReason};
pub use crate::layer::RetryLayer;
pub use crate::policy::RetryPolicy;
pub use crate::replay::ReplayBody;
pub use crate::resume::{Resume, ResumeBody, ResumeInfo};
pub use crate::route::RouteMatch;
pub use crate::service::{InnerService, Retry};
