// Deadline propagation: the header that tells a server how long an attempt has (written
// by a hook the policy adds, `RetryPolicy::deadline_header`), and the server's half, a
// layer that reads it, clamps it to its own limit, bounds the handler with tower's
// `Timeout` and hands the deadline to the handler, whose own calls through a `RetryLayer`
// carry it on (`deadline/server.rs`, with tower's `Timeout`: the `tokio` feature). One
// convention, relative whole milliseconds, read and written here.

use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue};

use crate::hook::{Attempt, AttemptHook};
use crate::time::Instant;

#[cfg(feature = "tokio")]
mod server;
#[cfg(feature = "tokio")]
pub use self::server::{Deadline, DeadlineLayer};
/// What a caller tells Envoy: the whole time the route has, Envoy's own retries included.
pub(crate) const ENVOY_UPSTREAM_TIMEOUT: HeaderName =
    HeaderName::from_static("x-envoy-upstream-rq-timeout-ms");

/// The greatest value written: ten digits, the most a reader takes.
const MAX_MILLIS: u64 = 9_999_999_999;

/// `time` in whole milliseconds, rounded up, at least 1: a reader that takes 0 for "no
/// limit" (Envoy) never gets it, and one rounding down never gets more than was left.
pub(crate) fn millis(time: Duration) -> HeaderValue {
    let whole = time.as_millis();
    let up = whole + u128::from(time.subsec_nanos() % 1_000_000 != 0);
    let ms = u64::try_from(up).unwrap_or(u64::MAX).clamp(1, MAX_MILLIS);
    HeaderValue::from(ms)
}

/// The hook [`RetryPolicy::deadline_header`](crate::RetryPolicy::deadline_header) adds:
/// the time this attempt has, the lesser of the time left and the attempt timeout.
pub(crate) struct DeadlineHeader(pub(crate) HeaderName);

impl AttemptHook for DeadlineHeader {
    fn before_attempt(&self, attempt: &Attempt, headers: &mut HeaderMap) {
        let time = match (attempt.time_left, attempt.timeout) {
            (Some(left), Some(timeout)) => left.min(timeout),
            (Some(time), None) | (None, Some(time)) => time,
            (None, None) => return,
        };
        headers.insert(self.0.clone(), millis(time));
    }
}

/// The instant a request's work is no longer wanted: what [`DeadlineLayer`] puts in the
/// extensions of every request it passes to the handler (the caller's deadline, clamped
/// to the layer's limit, or that limit alone).
///
/// A [`Retry`](crate::Retry) service reads it from the requests it is given: put it in the
/// extensions of a handler's own outgoing requests, and their deadline is at most what is
/// left of it (the shorter of it and the policy's applies), and the
/// [deadline header](crate::RetryPolicy::deadline_header) tells the next server what is
/// left. A chain of services then works within the first caller's budget.
///
/// The instant is on the retry layer's [`Timer`](crate::Timer): tokio's by default, whose
/// `tokio::time::Instant::into_std` gives one (paused time included). On
/// `wasm32-unknown-unknown` it is a `web_time::Instant`.
///
/// ```
/// use std::time::Duration;
/// use bytes::Bytes;
/// use http::{Request, Response};
/// use http_body_util::Full;
/// use tower::{Layer, ServiceExt};
/// use tower_http_retry::{DeadlineExceeded, RequestDeadline, RetryError, RetryLayer};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// # let slow = tower::service_fn(|_: Request<tower_http_retry::ReplayBody<Full<Bytes>>>| async {
/// #     tokio::time::sleep(Duration::from_secs(60)).await;
/// #     Ok::<_, std::convert::Infallible>(Response::new(()))
/// # });
/// // In a handler: `incoming` is the request the server was given.
/// # let mut incoming = Request::new(());
/// # incoming.extensions_mut().insert(RequestDeadline((tokio::time::Instant::now() + Duration::from_millis(300)).into_std()));
/// let client = RetryLayer::new().layer(slow);
/// let mut outgoing = Request::get("http://127.0.0.1:3000/next").body(Full::new(Bytes::new())).unwrap();
/// if let Some(deadline) = incoming.extensions().get::<RequestDeadline>() {
///     outgoing.extensions_mut().insert(*deadline);
/// }
/// let error = client.oneshot(outgoing).await.unwrap_err();
/// let error = error.downcast_ref::<RetryError>().unwrap();
/// assert_eq!(error.get_ref().downcast_ref::<DeadlineExceeded>().unwrap().deadline(), Duration::from_millis(300));
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RequestDeadline(pub Instant);
