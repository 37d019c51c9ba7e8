//! Guides: what the layer does in depth, a page per subject. The README and the crate's
//! front page say what it is and how to start; these pages say how each part behaves and
//! why, with examples that are compiled and run as the crate's tests.
//!
//! - [`defaults`]: what is retried, the defaults, bodies and transports, where an attempt
//!   ends.
//! - [`idempotency`]: idempotency keys, where to turn them on, quoted or raw.
//! - [`time`]: `Retry-After` and the server's other hints, deadlines, per-attempt timeouts,
//!   the errors a request ends with.
//! - [`deadlines`]: deadlines that travel: the time each attempt has in a header, the
//!   floor, the server-side layer that reads it, a chain of services on one budget.
//! - [`budgets`]: why a budget and not only max attempts; the budget, the throttle, the
//!   quota and the concurrency budget; per-server gates; the storm example's tables and their arithmetic.
//! - [`adaptive`]: when a server throttles: the adaptive limiter, client-side throttling and
//!   the budgets, measured in a 100-client storm.
//! - [`resume`]: downloads that survive a broken connection: `Range` and `If-Range`, what
//!   is accepted as a continuation, encodings, the record.
//! - [`routes`]: per-route policies, and how a route's policy is laid over the layer's.
//! - [`composing`]: with timeouts and circuit breakers.
//! - [`hedging`]: hedging slow requests.
//! - [`telemetry`]: OpenTelemetry: a CLIENT span per attempt, `traceparent` on each, retry metrics (gRPC's A96 shape).
//! - [`troubleshooting`]: body types, and the compiler errors a first use meets.
//! - [`comparison`]: what tower's retry and hedge, reqwest, reqwest-retry,
//!   tower-resilience and seatbelt do out of the box, beside this crate.

#[doc = include_str!("guide/defaults.md")]
pub mod defaults {}

#[doc = include_str!("guide/idempotency.md")]
pub mod idempotency {}

#[doc = include_str!("guide/time.md")]
pub mod time {}

#[doc = include_str!("guide/deadlines.md")]
pub mod deadlines {}

#[doc = include_str!("guide/budgets.md")]
pub mod budgets {}

#[doc = include_str!("guide/adaptive.md")]
pub mod adaptive {}

#[doc = include_str!("guide/resume.md")]
pub mod resume {}

#[doc = include_str!("guide/routes.md")]
pub mod routes {}

#[doc = include_str!("guide/composing.md")]
pub mod composing {}

#[doc = include_str!("guide/hedging.md")]
pub mod hedging {}

#[doc = include_str!("guide/telemetry.md")]
pub mod telemetry {}

#[doc = include_str!("guide/troubleshooting.md")]
pub mod troubleshooting {}

#[doc = include_str!("guide/comparison.md")]
pub mod comparison {}
