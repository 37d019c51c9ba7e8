// What happened to a logical request, attached to the response the caller gets.

use std::fmt;
use std::time::Duration;

use http::{HeaderValue, StatusCode};

use crate::hints::HintSource;
use crate::hook::AttemptKind;
use crate::reason::RetryReason;

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
///
/// # Display
///
/// `{}` is a one-line summary, for a log line: the attempts and what each got, the time
/// waited in all and what set the waits (`backoff`, `Retry-After`, `RateLimit`, ...), and
/// why the layer stopped ([`StopReason::as_str`]). `{:#}` adds a line per attempt, with the
/// reason for its retry and the wait before it, then why the layer stopped in words
/// (unless the outcome was final), and the idempotency key, if any:
///
/// ```
/// use bytes::Bytes;
/// use http::{Request, Response, StatusCode};
/// use http_body_util::Full;
/// use tower::{Layer, ServiceExt};
/// use std::time::Duration;
/// use tower_http_retry::{Backoff, Jitter, RetryInfo, RetryLayer, RetryPolicy};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// # let calls = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
/// // `inner` answers 503 once, then 200.
/// # let inner = tower::service_fn(move |_: Request<tower_http_retry::ReplayBody<Full<Bytes>>>| {
/// #     let first = calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0;
/// #     let status = if first { StatusCode::SERVICE_UNAVAILABLE } else { StatusCode::OK };
/// #     async move { Ok::<_, std::convert::Infallible>(Response::builder().status(status).body(()).unwrap()) }
/// # });
/// let wait = Duration::from_millis(150);
/// let policy = RetryPolicy::default().backoff(Backoff::exponential(wait, wait).jitter(Jitter::None));
/// let client = RetryLayer::new().policy(policy).layer(inner);
/// let request = Request::get("http://127.0.0.1:3000/").body(Full::new(Bytes::new())).unwrap();
/// let response = client.oneshot(request).await.unwrap();
/// let info = response.extensions().get::<RetryInfo>().unwrap();
/// assert_eq!(
///     info.to_string(),
///     "2 attempts: 503, 200; waited 150 ms (backoff); stopped: final",
/// );
/// assert_eq!(
///     format!("{info:#}"),
///     "2 attempts: 503, 200; waited 150 ms (backoff); stopped: final\n\
///      \x20 attempt 1: 503\n\
///      \x20 attempt 2, after status 503 and 150 ms (backoff): 200",
/// );
/// # }
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
    /// No attempt was sent: a gate refused the first, or the deadline left no time for the
    /// wait a gate asked of it.
    unsent: bool,
}

impl RetryInfo {
    /// Attempts sent, the first one included, a transparent retry included. The attempts
    /// that count against `max_attempts` are these less the transparent retries.
    pub fn attempts(&self) -> u32 {
        if self.unsent {
            return 0;
        }
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
        std::iter::once(self.first).filter(|_| !self.unsent).chain(
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
    /// A hedge is no wait (its `wait` is the time since the attempt before it was sent,
    /// which was still in flight), so hedges count nothing here.
    pub fn total_wait(&self) -> Duration {
        self.waits().fold(Duration::ZERO, |total, retry| {
            total.saturating_add(retry.wait)
        })
    }

    /// The attempts that were waited for: every retry but the hedges.
    fn waits(&self) -> impl Iterator<Item = &RetryRecord> + '_ {
        self.retries
            .iter()
            .filter(|retry| retry.kind != AttemptKind::Hedge)
    }

    /// Why the layer stopped and returned what it returned.
    pub fn stop(&self) -> StopReason {
        self.stop
    }

    /// The idempotency key every attempt carried, if the request had one.
    pub fn idempotency_key(&self) -> Option<&HeaderValue> {
        self.idempotency_key.as_ref()
    }

    /// Books that no attempt was sent, for this reason.
    pub(crate) fn set_unsent(&mut self, stop: StopReason) {
        self.unsent = true;
        self.stop = stop;
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

impl fmt::Display for RetryInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let attempts = self.attempts();
        let plural = if attempts == 1 { "" } else { "s" };
        match attempts {
            0 => f.write_str("no attempt sent")?,
            _ => write!(f, "{attempts} attempt{plural}: ")?,
        }
        for (i, outcome) in self.outcomes().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{outcome}")?;
        }
        if self
            .retries
            .last()
            .is_some_and(|retry| retry.outcome == AttemptOutcome::NotSent)
        {
            f.write_str(" (the last retry not sent)")?;
        }
        let hedges = self.hedges();
        if hedges > 0 {
            let plural = if hedges == 1 { "" } else { "s" };
            write!(f, "; {hedges} hedge{plural}")?;
            if let Some(returned) = self.returned {
                write!(f, ", attempt {returned} returned")?;
            }
        }
        if self.waits().next().is_some() {
            write!(f, "; waited {} (", Millis(self.total_wait()))?;
            let mut seen: Vec<WaitSource> = Vec::new();
            for retry in self.waits() {
                let source = WaitSource::of(retry);
                if !seen.contains(&source) {
                    if !seen.is_empty() {
                        f.write_str(", ")?;
                    }
                    write!(f, "{source}")?;
                    seen.push(source);
                }
            }
            f.write_str(")")?;
        }
        write!(f, "; stopped: {}", self.stop.as_str())?;
        if !f.alternate() {
            return Ok(());
        }
        write!(f, "\n  attempt 1: {}", self.first)?;
        for (i, retry) in self.retries.iter().enumerate() {
            write!(f, "\n  attempt {}, after {}", i + 2, retry.reason)?;
            match retry.kind {
                AttemptKind::Transparent => f.write_str(", a transparent retry")?,
                AttemptKind::Hedge => write!(
                    f,
                    ", a hedge {} after the attempt before",
                    Millis(retry.wait)
                )?,
                _ => write!(f, " and {} ({})", Millis(retry.wait), WaitSource::of(retry))?,
            }
            write!(f, ": {}", retry.outcome)?;
        }
        if self.stop != StopReason::Final {
            write!(f, "\n  stopped: {}", self.stop)?;
        }
        if self.returned.is_none() && (self.unsent || !self.retries.is_empty()) {
            f.write_str("\n  returned: the layer's own error, no attempt's outcome")?;
        }
        if let Some(key) = &self.idempotency_key {
            match key.to_str() {
                Ok(key) => write!(f, "\n  idempotency key: {key}")?,
                Err(_) => write!(f, "\n  idempotency key: {key:?}")?,
            }
        }
        Ok(())
    }
}

/// What set a retry's wait, as the summary names it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum WaitSource {
    Backoff,
    Transparent,
    Hint(HintSource),
}

impl WaitSource {
    fn of(retry: &RetryRecord) -> Self {
        match (retry.kind, retry.hint) {
            (AttemptKind::Transparent, _) => WaitSource::Transparent,
            (_, Some(hint)) => WaitSource::Hint(hint),
            (_, None) => WaitSource::Backoff,
        }
    }
}

impl fmt::Display for WaitSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WaitSource::Backoff => f.write_str("backoff"),
            WaitSource::Transparent => f.write_str("transparent retry"),
            WaitSource::Hint(hint) => write!(f, "{hint}"),
        }
    }
}

/// A wait as the summary writes it: `0 ms`, `450 µs`, `150 ms`, `1.25 s`, `3600 s`.
struct Millis(Duration);

impl fmt::Display for Millis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let wait = self.0;
        if wait.is_zero() {
            f.write_str("0 ms")
        } else if wait < Duration::from_millis(1) {
            write!(f, "{} µs", wait.as_micros().max(1))
        } else if wait < Duration::from_secs(1) {
            // Rounded to the millisecond.
            write!(f, "{} ms", (wait.as_micros() + 500) / 1000)
        } else {
            // Rounded to the hundredth of a second, trailing zeros dropped.
            let hundredths = (wait.as_millis() + 5) / 10;
            let (whole, frac) = (hundredths / 100, hundredths % 100);
            match frac {
                0 => write!(f, "{whole} s"),
                _ if frac % 10 == 0 => write!(f, "{whole}.{} s", frac / 10),
                _ => write!(f, "{whole}.{frac:02} s"),
            }
        }
    }
}

/// What one attempt got.
///
/// Displayed as the status code (`503`), `error`, `timed out`, `abandoned` or `not sent`.
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

impl fmt::Display for AttemptOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AttemptOutcome::Response(status) => write!(f, "{}", status.as_u16()),
            AttemptOutcome::Error => f.write_str("error"),
            AttemptOutcome::TimedOut => f.write_str("timed out"),
            AttemptOutcome::Abandoned => f.write_str("abandoned"),
            AttemptOutcome::Cancelled => f.write_str("cancelled"),
            AttemptOutcome::NotSent => f.write_str("not sent"),
        }
    }
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
/// let client = RetryLayer::new().layer(inner);
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
    /// Under `max_attempts(1)` the policy's gates still heard the outcome.
    Disabled,
    /// The attempt limit was reached.
    MaxAttempts,
    /// The outcome was retryable, but the method is not idempotent and the request carries
    /// no idempotency key, and the failure does not prove the server never saw it.
    NotIdempotent,
    /// The body could not be sent again: over the replay cap, or still held by the
    /// transport of the last attempt when the wait for it ran out.
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
    /// gRPC's negative or malformed `x-retry-in-ms`).
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

#[cfg(test)]
mod tests {
    use super::*;

    fn retry(reason: RetryReason, wait_ms: u64, hint: Option<HintSource>) -> RetryRecord {
        RetryRecord {
            kind: AttemptKind::Retry,
            reason,
            wait: Duration::from_millis(wait_ms),
            hint,
            outcome: AttemptOutcome::NotSent,
        }
    }

    fn status(code: u16) -> AttemptOutcome {
        AttemptOutcome::Response(StatusCode::from_u16(code).unwrap())
    }

    /// 503, then 503 with `Retry-After: 1`, then 200, on a POST with a key.
    fn retried() -> RetryInfo {
        let mut info = RetryInfo::default();
        info.set_idempotency_key(Some(HeaderValue::from_static("3f2a9c1e")));
        info.set_outcome(status(503));
        info.push_retry(retry(
            RetryReason::Status(StatusCode::SERVICE_UNAVAILABLE),
            150,
            None,
        ));
        info.set_outcome(status(503));
        info.push_retry(retry(
            RetryReason::Status(StatusCode::SERVICE_UNAVAILABLE),
            1000,
            Some(HintSource::RetryAfter),
        ));
        info.set_outcome(status(200));
        info.set_returned_last();
        info
    }

    #[test]
    fn one_attempt() {
        let mut info = RetryInfo::default();
        info.set_outcome(status(200));
        info.set_returned_last();
        assert_eq!(info.to_string(), "1 attempt: 200; stopped: final");
        assert_eq!(
            format!("{info:#}"),
            "1 attempt: 200; stopped: final\n  attempt 1: 200"
        );
    }

    #[test]
    fn retries_with_their_waits_and_the_key() {
        let info = retried();
        assert_eq!(
            info.to_string(),
            "3 attempts: 503, 503, 200; waited 1.15 s (backoff, Retry-After); stopped: final"
        );
        assert_eq!(
            format!("{info:#}"),
            "3 attempts: 503, 503, 200; waited 1.15 s (backoff, Retry-After); stopped: final\n\
             \x20 attempt 1: 503\n\
             \x20 attempt 2, after status 503 and 150 ms (backoff): 503\n\
             \x20 attempt 3, after status 503 and 1 s (Retry-After): 200\n\
             \x20 idempotency key: 3f2a9c1e"
        );
    }

    #[test]
    fn a_transparent_retry_and_a_limit() {
        let mut info = RetryInfo::default();
        info.set_outcome(AttemptOutcome::Error);
        info.push_retry(RetryRecord {
            kind: AttemptKind::Transparent,
            wait: Duration::ZERO,
            ..retry(RetryReason::Connect, 0, None)
        });
        info.set_outcome(AttemptOutcome::TimedOut);
        info.push_retry(retry(RetryReason::Timeout, 87, None));
        info.set_outcome(status(502));
        info.set_stop(StopReason::MaxAttempts);
        info.set_returned_last();
        assert_eq!(
            info.to_string(),
            "3 attempts: error, timed out, 502; waited 87 ms (transparent retry, backoff); \
             stopped: max_attempts"
        );
        assert_eq!(
            format!("{info:#}"),
            "3 attempts: error, timed out, 502; waited 87 ms (transparent retry, backoff); \
             stopped: max_attempts\n\
             \x20 attempt 1: error\n\
             \x20 attempt 2, after connect error, a transparent retry: timed out\n\
             \x20 attempt 3, after timeout and 87 ms (backoff): 502\n\
             \x20 stopped: attempt limit reached"
        );
    }

    #[test]
    fn a_retry_never_sent() {
        let mut info = RetryInfo::default();
        info.set_outcome(status(503));
        info.push_retry(retry(
            RetryReason::Status(StatusCode::SERVICE_UNAVAILABLE),
            2500,
            Some(HintSource::Header("x-retry-in-ms")),
        ));
        info.set_stop(StopReason::ServiceNotReady);
        info.set_returned_last();
        assert_eq!(info.attempts(), 1);
        assert_eq!(
            info.to_string(),
            "1 attempt: 503 (the last retry not sent); waited 2.5 s (x-retry-in-ms); \
             stopped: service_not_ready"
        );
        assert_eq!(
            format!("{info:#}"),
            "1 attempt: 503 (the last retry not sent); waited 2.5 s (x-retry-in-ms); \
             stopped: service_not_ready\n\
             \x20 attempt 1: 503\n\
             \x20 attempt 2, after status 503 and 2.5 s (x-retry-in-ms): not sent\n\
             \x20 stopped: service not ready for the retry in time\n\
             \x20 returned: the layer's own error, no attempt's outcome"
        );
    }

    #[test]
    fn waits_are_written_in_their_unit() {
        let text = |d: Duration| Millis(d).to_string();
        assert_eq!(text(Duration::ZERO), "0 ms");
        assert_eq!(text(Duration::from_nanos(1)), "1 µs");
        assert_eq!(text(Duration::from_micros(450)), "450 µs");
        assert_eq!(text(Duration::from_micros(149_600)), "150 ms");
        assert_eq!(text(Duration::from_millis(999)), "999 ms");
        assert_eq!(text(Duration::from_millis(1000)), "1 s");
        assert_eq!(text(Duration::from_millis(1250)), "1.25 s");
        assert_eq!(text(Duration::from_millis(1204)), "1.2 s");
        assert_eq!(text(Duration::from_secs(3600)), "3600 s");
    }

    #[test]
    fn outcomes() {
        let all = [
            (status(404), "404"),
            (AttemptOutcome::Error, "error"),
            (AttemptOutcome::TimedOut, "timed out"),
            (AttemptOutcome::Abandoned, "abandoned"),
            (AttemptOutcome::NotSent, "not sent"),
        ];
        for (outcome, text) in all {
            assert_eq!(outcome.to_string(), text);
        }
    }
}
