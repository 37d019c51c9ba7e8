// What happened to a logical request, attached to the response the caller gets.

use std::fmt;
use std::time::Duration;

use http::{HeaderValue, StatusCode};

use crate::classify::RetryReason;
use crate::hints::HintSource;
use crate::hook::AttemptKind;

/// The story of one logical request, in the extensions of the response returned to the
/// caller (or in the [`RetryError`](crate::RetryError)), whether it succeeded, failed for
/// good, or ran out of retries: every attempt, what it got, why each retry was sent and how
/// long the layer waited before it, and why it stopped.
///
/// ```
/// # use tower_http_retry::RetryInfo;
/// # let response = {
/// #     let mut r = http::Response::new(());
/// #     r.extensions_mut().insert(RetryInfo::default());
/// #     r
/// # };
/// let info = response.extensions().get::<RetryInfo>().unwrap();
/// println!("{} attempt(s), waited {:?}, stopped: {}", info.attempts(), info.total_wait(), info.stop());
/// for retry in info.retries() {
///     println!("  after {} waited {:?}, got {:?}", retry.reason, retry.wait, retry.outcome);
/// }
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RetryInfo {
    /// What the first attempt got.
    first: AttemptOutcome,
    /// Every retry decided, in order; only the last may not have been sent.
    retries: Vec<RetryRecord>,
    /// The attempt whose outcome the caller got (1 for the first).
    returned: Option<u32>,
    stop: StopReason,
    idempotency_key: Option<HeaderValue>,
}

impl RetryInfo {
    /// Attempts sent, the first one included, a transparent retry included. The attempts
    /// that count against `max_attempts` are these less the transparent retries.
    pub fn attempts(&self) -> u32 {
        let unsent = self
            .retries
            .last()
            .is_some_and(|retry| retry.outcome == AttemptOutcome::NotSent);
        let sent = self.retries.len() - usize::from(unsent);
        u32::try_from(sent).map_or(u32::MAX, |sent| sent.saturating_add(1))
    }

    /// What the first attempt got.
    pub fn first(&self) -> AttemptOutcome {
        self.first
    }

    /// Every retry the layer decided on, in order: why, how long it waited first, what it
    /// got. The last one may not have been sent ([`AttemptOutcome::NotSent`]: its service
    /// was not ready in time, or failed to get ready).
    pub fn retries(&self) -> &[RetryRecord] {
        &self.retries
    }

    /// What every attempt sent got, in order, the first included.
    pub fn outcomes(&self) -> impl Iterator<Item = AttemptOutcome> + '_ {
        std::iter::once(self.first).chain(
            self.retries
                .iter()
                .map(|retry| retry.outcome)
                .filter(|outcome| *outcome != AttemptOutcome::NotSent),
        )
    }

    /// The attempt (1 for the first) whose outcome the caller got: the response, or the
    /// attempt's error or timeout. `None` when no attempt's outcome was returned: the
    /// layer's own limit ended the request ([`DeadlineExceeded`](crate::DeadlineExceeded),
    /// [`ServiceNotReady`](crate::ServiceNotReady)), or the service failed to get ready for
    /// a retry and the caller got its error.
    pub fn returned(&self) -> Option<u32> {
        self.returned
    }

    /// The time the layer waited between attempts, in all: the sum of the retries' waits.
    pub fn total_wait(&self) -> Duration {
        self.retries.iter().fold(Duration::ZERO, |total, retry| {
            total.saturating_add(retry.wait)
        })
    }

    /// Why the layer stopped and returned what it returned.
    pub fn stop(&self) -> StopReason {
        self.stop
    }

    /// The idempotency key every attempt carried, if the request had one.
    pub fn idempotency_key(&self) -> Option<&HeaderValue> {
        self.idempotency_key.as_ref()
    }

    #[inline]
    pub(crate) fn set_stop(&mut self, stop: StopReason) {
        self.stop = stop;
    }

    #[inline]
    pub(crate) fn set_idempotency_key(&mut self, key: Option<HeaderValue>) {
        self.idempotency_key = key;
    }

    #[inline]
    pub(crate) fn push_retry(&mut self, retry: RetryRecord) {
        self.retries.push(retry);
    }

    /// Books what the attempt now ending got: the first, or the last retry.
    #[inline]
    pub(crate) fn set_outcome(&mut self, outcome: AttemptOutcome) {
        match self.retries.last_mut() {
            Some(retry) => retry.outcome = outcome,
            None => self.first = outcome,
        }
    }

    /// Books what attempt `number` (1 for the first) got, whichever ended last: hedged
    /// attempts end in any order.
    pub(crate) fn set_outcome_of(&mut self, number: u32, outcome: AttemptOutcome) {
        match number.checked_sub(2) {
            None => self.first = outcome,
            Some(index) => {
                if let Some(retry) = self.retries.get_mut(index as usize) {
                    retry.outcome = outcome;
                }
            }
        }
    }

    /// Books that the caller gets attempt `number`'s outcome (a hedged request's winner).
    pub(crate) fn set_returned(&mut self, number: u32) {
        self.returned = Some(number);
    }

    /// The hedges sent ([`AttemptKind::Hedge`]): attempts sent while others were in
    /// flight, by a policy with [`RetryPolicy::hedge`](crate::RetryPolicy::hedge).
    pub fn hedges(&self) -> u32 {
        let hedges = self
            .retries
            .iter()
            .filter(|retry| retry.kind == AttemptKind::Hedge)
            .count();
        u32::try_from(hedges).unwrap_or(u32::MAX)
    }

    /// Books that the caller gets the outcome of the attempt that ended last, unless a
    /// retry was decided and never sent: then the caller gets what kept it from being sent.
    /// A hedged request's winner, booked first, stays.
    #[inline]
    pub(crate) fn set_returned_last(&mut self) {
        if self.returned.is_some() {
            return;
        }
        self.returned = match self.retries.last() {
            None => Some(1),
            Some(retry) if retry.outcome == AttemptOutcome::NotSent => None,
            Some(_) => {
                Some(u32::try_from(self.retries.len()).map_or(u32::MAX, |n| n.saturating_add(1)))
            }
        };
    }
}

/// What one attempt got.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AttemptOutcome {
    /// A response with this status.
    Response(StatusCode),
    /// An error from the inner service.
    Error,
    /// Nothing within the attempt timeout: the layer dropped it
    /// ([`AttemptTimedOut`](crate::AttemptTimedOut)).
    TimedOut,
    /// Still in flight when the request's deadline passed: the layer dropped it.
    Abandoned,
    /// A hedged attempt still in flight when another attempt's outcome was returned: the
    /// layer dropped it (the transport resets its stream or closes its connection).
    Cancelled,
    /// Never sent: a retry the layer decided on and waited for, whose service was not
    /// ready in time or failed to get ready (or the deadline passed first).
    #[default]
    NotSent,
}

/// One retry: what kind, why, how long the layer waited before it, and what it got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct RetryRecord {
    /// A retry after an outcome worth retrying, or a transparent retry
    /// ([`RetryPolicy::transparent_retry`](crate::RetryPolicy::transparent_retry), which
    /// gRPC policies have): the attempt before it failed in a way that proves the server
    /// never saw it (`reason` is [`RetryReason::Connect`] or [`RetryReason::RefusedStream`]),
    /// so it was sent again at once (`wait` is zero), once per logical request, without
    /// counting against `max_attempts` or for the retry throttle.
    pub kind: AttemptKind,
    /// Why: the classification of the attempt before it.
    pub reason: RetryReason,
    /// The wait before the retry.
    pub wait: Duration,
    /// Which hint set the wait (`Retry-After`, a RateLimit field, `X-RateLimit-Reset`, the
    /// classifier's own, a protocol's header), or `None` when the backoff did (no hint, or
    /// one shorter than the backoff).
    pub hint: Option<HintSource>,
    /// What it got ([`AttemptOutcome::NotSent`] when it was never sent).
    pub outcome: AttemptOutcome,
}

impl RetryRecord {
    /// A transparent retry ([`AttemptKind::Transparent`]).
    pub(crate) fn is_transparent(&self) -> bool {
        self.kind == AttemptKind::Transparent
    }
}

/// Why the layer stopped retrying and returned what it returned.
///
/// [`RetryInfo::stop`] tells a 503 the layer gave up on from one it was not allowed to
/// retry:
///
/// ```
/// use bytes::Bytes;
/// use http::{Method, Request, Response, StatusCode};
/// use http_body_util::Full;
/// use tower::{Layer, ServiceExt};
/// use tower_http_retry::{RetryInfo, RetryLayer, StopReason};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// // A server that is down.
/// let inner = tower::service_fn(|_: Request<tower_http_retry::ReplayBody<Full<Bytes>>>| async {
///     Ok::<_, std::convert::Infallible>(
///         Response::builder().status(StatusCode::SERVICE_UNAVAILABLE).body(()).unwrap(),
///     )
/// });
/// let client = RetryLayer::new().no_idempotency_key().layer(inner);
///
/// for (method, expected) in [
///     (Method::GET, StopReason::MaxAttempts),   // retried, 3 attempts in all
///     (Method::POST, StopReason::NotIdempotent), // no key: may not be repeated
/// ] {
///     let request = Request::builder()
///         .method(method)
///         .uri("http://127.0.0.1:3000/orders")
///         .body(Full::new(Bytes::new()))
///         .unwrap();
///     let response = client.clone().oneshot(request).await.unwrap();
///     let info = response.extensions().get::<RetryInfo>().unwrap();
///     assert_eq!(info.stop(), expected);
///     // A stable label for logs and metrics.
///     println!("{} after {} attempt(s)", info.stop().as_str(), info.attempts());
/// }
/// # }
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StopReason {
    /// The outcome is final under the classification: a success, or a status or error that
    /// is not retried (including a second 500).
    #[default]
    Final,
    /// Retries are off for this request (`max_attempts(1)`, `never()`, or `CONNECT`).
    Disabled,
    /// The attempt limit was reached.
    MaxAttempts,
    /// The outcome was retryable, but the method is not idempotent and the request carries
    /// no idempotency key, and the failure does not prove the server never saw it.
    NotIdempotent,
    /// The body could not be sent again (over the replay cap, or not fully sent before the
    /// response).
    BodyNotReplayable,
    /// The retry budget refused the retry.
    BudgetExhausted,
    /// The deadline passed, or the next wait would have ended after it.
    Deadline,
    /// A floor hint (the server's `Retry-After`, RateLimit fields or `X-RateLimit-Reset`,
    /// or a classifier's [`Hint::new`](crate::hints::Hint::new)) asked for longer than
    /// `max_retry_after`, or any hint, an exact one included, for longer than the deadline
    /// leaves.
    HintTooLong,
    /// The server said not to retry ([`Classification::Stop`](crate::classify::Classification::Stop):
    /// gRPC's negative or malformed `grpc-retry-pushback-ms`).
    ServerSaidStop,
    /// The retry [`Throttle`](crate::Throttle) refused the retry: too many recent failures.
    Throttled,
    /// The retry was decided, but the inner service did not get ready for it, and nothing
    /// more was sent: either it was not ready within the attempt timeout (the bound of that
    /// wait when the request has no deadline; with one, the deadline bounds it, and its
    /// passing is [`StopReason::Deadline`]) and the caller got
    /// [`ServiceNotReady`](crate::ServiceNotReady), or its `poll_ready` failed and the
    /// caller got that error.
    ServiceNotReady,
}

impl StopReason {
    /// A short, stable name, for logs and metrics labels.
    pub fn as_str(&self) -> &'static str {
        match self {
            StopReason::Final => "final",
            StopReason::Disabled => "disabled",
            StopReason::MaxAttempts => "max_attempts",
            StopReason::NotIdempotent => "not_idempotent",
            StopReason::BodyNotReplayable => "body_not_replayable",
            StopReason::BudgetExhausted => "budget_exhausted",
            StopReason::Deadline => "deadline",
            StopReason::HintTooLong => "hint_too_long",
            StopReason::ServerSaidStop => "server_said_stop",
            StopReason::Throttled => "throttled",
            StopReason::ServiceNotReady => "service_not_ready",
        }
    }
}

impl fmt::Display for StopReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = match self {
            StopReason::Final => "final outcome",
            StopReason::Disabled => "retries disabled",
            StopReason::MaxAttempts => "attempt limit reached",
            StopReason::NotIdempotent => "not idempotent and no idempotency key",
            StopReason::BodyNotReplayable => "body cannot be replayed",
            StopReason::BudgetExhausted => "retry budget exhausted",
            StopReason::Deadline => "deadline would pass",
            StopReason::HintTooLong => "server's delay hint too long",
            StopReason::ServerSaidStop => "server said not to retry",
            StopReason::Throttled => "retry throttle engaged",
            StopReason::ServiceNotReady => "service not ready for the retry in time",
        };
        f.write_str(text)
    }
}

/// The number of the attempt a request is, in the extensions of every retry's request
/// (the first attempt carries none: nothing to pay on the success path).
///
/// An inner tracing or OpenTelemetry layer can record it as the stable
/// `http.request.resend_count` attribute ([`Attempt::resend_count`]).
///
/// ```
/// use tower_http_retry::Attempt;
///
/// # let request = {
/// #     let mut r = http::Request::new(());
/// #     r.extensions_mut().insert(Attempt::new(3));
/// #     r
/// # };
/// if let Some(attempt) = request.extensions().get::<Attempt>() {
///     assert_eq!((attempt.number(), attempt.resend_count()), (3, 2));
/// }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Attempt(u32);

impl Attempt {
    /// Attempt number `number` (1 is the first attempt).
    pub fn new(number: u32) -> Self {
        Self(number)
    }

    /// The attempt's number: 2 for the first retry.
    pub fn number(&self) -> u32 {
        self.0
    }

    /// How many times the request was sent before this attempt.
    pub fn resend_count(&self) -> u32 {
        self.0.saturating_sub(1)
    }
}
