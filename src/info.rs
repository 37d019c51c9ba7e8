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
/// `{}` is a one-line summary, for a log line: each attempt named by its cause, the time
/// waited in all and what set the waits (`backoff`, `Retry-After`, `RateLimit`, ...), and
/// why the layer stopped, in [`StopReason`]'s words (`stopped: max attempts`).
///
/// An attempt's cause is the reason the classifier gave its outcome
/// ([`RetryReason`](crate::classify::RetryReason)) when that says more than the outcome: an
/// error's kind (`connect error`, `connection closed`, `timeout`, ...), a protocol's code
/// (`gRPC UNAVAILABLE`, on an HTTP 200), a custom classifier's reason. Otherwise the outcome
/// names it ([`AttemptOutcome`]: `503`, `200`, `error`, `timed out`, ...): a success, a
/// status, an error no rule recognised, an attempt the layer itself ended.
///
/// `{:#}` adds a line per attempt: the wait before it and what set it (or that it was a
/// transparent retry, or a hedge and what sent it), and its cause, with the HTTP status or
/// `error` beside a protocol's code or a custom reason (`gRPC UNAVAILABLE (HTTP 200)`);
/// then a line if the caller got the layer's own error instead of an attempt's outcome,
/// and the idempotency key, if any:
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
///      \x20 attempt 2, after 150 ms (backoff): 200",
/// );
/// # }
/// ```
///
/// Three refused connections read `3 attempts: connect error, connect error, connect error;
/// waited 300 ms (backoff); stopped: max attempts`. A gRPC call answered `UNAVAILABLE`, then
/// `OK`, reads `2 attempts: gRPC UNAVAILABLE, 200; ...`: a classifier gives a success no
/// reason, so its HTTP status names it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RetryInfo {
    /// What the first attempt got.
    first: AttemptOutcome,
    /// The retries and the causes no retry names, once there is one of either.
    // Boxed: a request that succeeds at once has neither, and pays a null pointer for them
    // (8 bytes of the record, one word written, moved and checked when it is dropped)
    // instead of a `Vec` and a pointer: the record stays at 64 bytes, and its drop inline
    // (measured: the drop of an 88-byte record was a call of its own, 13 instructions on
    // every request, `never()`'s included). A request that is retried, or stops on a
    // failure its classifier named, allocates the box once more.
    later: Option<Box<Later>>,
    /// The attempt whose outcome the caller got (1 for the first).
    returned: Option<u32>,
    stop: StopReason,
    idempotency_key: Option<HeaderValue>,
    /// No attempt was sent: a gate refused the first, or the deadline left no time for the
    /// wait a gate asked of it.
    unsent: bool,
}

impl RetryInfo {
    /// The retries decided, in order.
    fn list(&self) -> &[RetryRecord] {
        self.later.as_deref().map_or(&[], |later| &later.retries)
    }

    fn later_mut(&mut self) -> &mut Later {
        self.later.get_or_insert_with(Box::default)
    }

    /// Attempts sent, the first one included, a transparent retry included. The attempts
    /// that count against `max_attempts` are these less the transparent retries.
    pub fn attempts(&self) -> u32 {
        if self.unsent {
            return 0;
        }
        let unsent = self
            .list()
            .last()
            .is_some_and(|retry| retry.outcome == AttemptOutcome::NotSent);
        let sent = self.list().len() - usize::from(unsent);
        u32::try_from(sent).map_or(u32::MAX, |sent| sent.saturating_add(1))
    }

    /// Every retry the layer decided on, in order: why, how long it waited first, what it
    /// got. The last one may not have been sent ([`AttemptOutcome::NotSent`]: its service
    /// was not ready in time, or failed to get ready).
    pub fn retries(&self) -> &[RetryRecord] {
        self.list()
    }

    /// What every attempt sent got, in order, the first included.
    pub fn outcomes(&self) -> impl Iterator<Item = AttemptOutcome> + '_ {
        std::iter::once(self.first).filter(|_| !self.unsent).chain(
            self.list()
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
        self.list()
            .iter()
            .filter(|retry| retry.kind != AttemptKind::Hedge)
    }

    /// The time the request spent with no attempt in flight, from its first attempt's
    /// start to its end as the layer sees it (the response head returned to the caller, or
    /// the error): the waits before retries (backoff, `Retry-After`, a gate's pacing), the
    /// time the transport took to let go of the request body, the time a retry's service
    /// took to get ready, and the layer's own work in between. While a hedge overlaps
    /// another attempt, an attempt is in flight: hedges add only the gaps when none was.
    ///
    /// This is gRPC's "retry delay" (the `grpc.client.call.retry_delay` metric of grpc/proposal
    /// A96), measured by the layer as attempts start and end, where
    /// [`total_wait`](Self::total_wait) adds up the waits it decided. Zero for a request that
    /// was not retried: its one attempt was in flight all along, and no clock is read for
    /// it.
    ///
    /// ```
    /// use bytes::Bytes;
    /// use http::{Request, Response, StatusCode};
    /// use http_body_util::Full;
    /// use std::time::Duration;
    /// use tower::{Layer, ServiceExt};
    /// use tower_http_retry::{Backoff, Jitter, RetryInfo, RetryLayer, RetryPolicy};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// # let calls = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    /// // `inner` answers 503 twice, then 200.
    /// # let inner = tower::service_fn(move |_: Request<tower_http_retry::ReplayBody<Full<Bytes>>>| {
    /// #     let n = calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    /// #     let status = if n < 2 { StatusCode::SERVICE_UNAVAILABLE } else { StatusCode::OK };
    /// #     async move { Ok::<_, std::convert::Infallible>(Response::builder().status(status).body(()).unwrap()) }
    /// # });
    /// let wait = Duration::from_millis(100);
    /// let policy = RetryPolicy::default().backoff(Backoff::exponential(wait, wait).jitter(Jitter::None));
    /// let client = RetryLayer::new().policy(policy).layer(inner);
    /// let request = Request::get("http://127.0.0.1:3000/").body(Full::new(Bytes::new())).unwrap();
    /// let response = client.oneshot(request).await.unwrap();
    /// let info = response.extensions().get::<RetryInfo>().unwrap();
    /// // Two waits of 100 ms with nothing in flight (the clock is paused: no time passes
    /// // between them).
    /// assert_eq!(info.retry_delay(), Duration::from_millis(200));
    /// # }
    /// ```
    pub fn retry_delay(&self) -> Duration {
        self.later
            .as_deref()
            .map_or(Duration::ZERO, |later| later.idle)
    }

    /// Books that from `now` no attempt is in flight, unless that was already booked.
    pub(crate) fn idle_from(&mut self, now: tokio::time::Instant) {
        self.later_mut().idle_since.get_or_insert(now);
    }

    /// Books that at `now` an attempt starts, or the request ends, after a time with no
    /// attempt in flight, if there was one.
    pub(crate) fn idle_until(&mut self, now: tokio::time::Instant) {
        if let Some(later) = self.later.as_deref_mut() {
            if let Some(since) = later.idle_since.take() {
                later.idle = later
                    .idle
                    .saturating_add(now.saturating_duration_since(since));
            }
        }
    }

    /// Whether no attempt is in flight now (a time booked by [`Self::idle_from`]).
    #[inline]
    pub(crate) fn idling(&self) -> bool {
        self.later
            .as_deref()
            .is_some_and(|later| later.idle_since.is_some())
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
        self.later_mut().retries.push(retry);
    }

    /// Books what the attempt now ending got: the first, or the last retry.
    #[inline]
    pub(crate) fn set_outcome(&mut self, outcome: AttemptOutcome) {
        match self
            .later
            .as_deref_mut()
            .and_then(|later| later.retries.last_mut())
        {
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
                let later = self.later.as_deref_mut();
                if let Some(retry) = later.and_then(|later| later.retries.get_mut(index as usize)) {
                    retry.outcome = outcome;
                }
            }
        }
    }

    /// Books the reason the classifier gave attempt `number`'s outcome (1 for the first),
    /// when no retry will carry it: the request stops on it, or it is a hedged request's.
    pub(crate) fn set_cause(&mut self, number: u32, reason: RetryReason) {
        let cause = Cause { number, reason };
        let causes = &mut self.later_mut().causes;
        match causes.iter_mut().find(|booked| booked.number == number) {
            Some(booked) => *booked = cause,
            None => causes.push(cause),
        }
    }

    /// The reason the classifier gave attempt `number`'s outcome (1 for the first), if the
    /// record has it: booked for the attempt itself, or the reason of the retry after it
    /// (a hedge's is not: it was sent for its delay, or for another attempt's failure).
    fn cause_of(&self, number: u32) -> Option<RetryReason> {
        if let Some(cause) = self.booked().find(|cause| cause.number == number) {
            return Some(cause.reason);
        }
        let next = self
            .list()
            .get(usize::try_from(number).ok()?.checked_sub(1)?)?;
        (next.kind != AttemptKind::Hedge).then_some(next.reason)
    }

    /// The causes booked for attempts no retry names.
    fn booked(&self) -> impl Iterator<Item = &Cause> {
        self.later.iter().flat_map(|later| later.causes.iter())
    }

    /// The causes booked for attempts no retry names, with their attempts' numbers.
    #[cfg(test)]
    pub(crate) fn booked_causes(&self) -> Vec<(u32, RetryReason)> {
        self.booked()
            .map(|cause| (cause.number, cause.reason))
            .collect()
    }

    /// Every attempt sent, in order, as the record names it.
    fn named(&self) -> impl Iterator<Item = Named> + '_ {
        (1..).zip(self.outcomes()).map(|(number, outcome)| Named {
            outcome,
            reason: self.cause_of(number),
        })
    }

    /// Books that the caller gets attempt `number`'s outcome (a hedged request's winner).
    pub(crate) fn set_returned(&mut self, number: u32) {
        self.returned = Some(number);
    }

    /// The hedges sent ([`AttemptKind::Hedge`]).
    pub(crate) fn hedges(&self) -> u32 {
        let hedges = self
            .list()
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
        let list = self.list();
        self.returned = match list.last() {
            None => Some(1),
            Some(retry) if retry.outcome == AttemptOutcome::NotSent => None,
            Some(_) => Some(u32::try_from(list.len()).map_or(u32::MAX, |n| n.saturating_add(1))),
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
        for (i, named) in self.named().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{named}")?;
        }
        if self
            .list()
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
        write!(f, "; stopped: {}", self.stop)?;
        if !f.alternate() {
            return Ok(());
        }
        let named = |number, outcome| Named {
            outcome,
            reason: self.cause_of(number),
        };
        if !self.unsent {
            write!(f, "\n  attempt 1: {:#}", named(1, self.first))?;
        }
        for (number, retry) in (2..).zip(self.list()) {
            write!(f, "\n  attempt {number}, ")?;
            match retry.kind {
                AttemptKind::Transparent => f.write_str("at once (transparent retry)")?,
                AttemptKind::Hedge => {
                    write!(
                        f,
                        "a hedge {} after attempt {}",
                        Millis(retry.wait),
                        number - 1
                    )?;
                    match retry.reason {
                        RetryReason::Hedge => f.write_str(" (hedging delay)")?,
                        reason => write!(f, " (after {})", Named::trigger(reason))?,
                    }
                }
                _ => write!(
                    f,
                    "after {} ({})",
                    Millis(retry.wait),
                    WaitSource::of(retry)
                )?,
            }
            write!(f, ": {:#}", named(number, retry.outcome))?;
        }
        if self.returned.is_none() && (self.unsent || !self.list().is_empty()) {
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

/// What a record holds once a request is retried or stops on a named failure.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Later {
    /// Every retry decided, in order; only the last may not have been sent. Each one's
    /// reason is the cause of the attempt before it, unless it is a hedge.
    retries: Vec<RetryRecord>,
    /// The causes no retry names ([`RetryInfo::set_cause`]): of the attempt the request
    /// stopped on, when the classifier gave it a reason; of a hedged request's attempts,
    /// each so judged.
    causes: Vec<Cause>,
    /// The time with no attempt in flight so far ([`RetryInfo::retry_delay`]).
    idle: Duration,
    /// Since when no attempt has been in flight, while none is.
    idle_since: Option<tokio::time::Instant>,
}

/// The reason the classifier gave one attempt's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Cause {
    /// The attempt (1 for the first).
    number: u32,
    /// The reason the classifier gave its outcome.
    reason: RetryReason,
}

/// One attempt as the record names it: by the reason its outcome was given, when that says
/// more than the outcome (an error's kind, a protocol's code or a custom reason on a
/// response), else by the outcome. `{:#}` adds the outcome beside a name that does not say
/// what it was: `gRPC UNAVAILABLE (HTTP 200)`, `gRPC INTERNAL (error)`.
#[derive(Clone, Copy)]
struct Named {
    outcome: AttemptOutcome,
    reason: Option<RetryReason>,
}

impl Named {
    /// A hedge's trigger, a reason alone, as the record names it: a status by its number.
    fn trigger(reason: RetryReason) -> impl fmt::Display {
        let outcome = match reason {
            RetryReason::Status(status) => AttemptOutcome::Response(status),
            _ => AttemptOutcome::Error,
        };
        Named {
            outcome,
            reason: Some(reason),
        }
    }

    /// The reason that names the attempt, if one does.
    fn by_reason(&self) -> Option<RetryReason> {
        match (self.outcome, self.reason?) {
            (AttemptOutcome::Response(_), RetryReason::Status(_)) => None,
            (AttemptOutcome::Response(_) | AttemptOutcome::Error, reason) => Some(reason),
            // The layer's own ends (timed out, abandoned, ...) say what happened themselves.
            _ => None,
        }
    }
}

impl fmt::Display for Named {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Some(reason) = self.by_reason() else {
            return write!(f, "{}", self.outcome);
        };
        write!(f, "{reason}")?;
        if !f.alternate() {
            return Ok(());
        }
        match (self.outcome, reason) {
            (AttemptOutcome::Response(status), _) => write!(f, " (HTTP {})", status.as_u16()),
            // A transport failure's reason says it was one.
            (
                _,
                RetryReason::Connect
                | RetryReason::RefusedStream
                | RetryReason::NotSent
                | RetryReason::GoAway
                | RetryReason::ConnectionClosed
                | RetryReason::Timeout,
            ) => Ok(()),
            _ => f.write_str(" (error)"),
        }
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
/// Displayed as the status code (`503`), `error`, `timed out`, `abandoned`, `cancelled` or
/// `not sent`. [`RetryInfo`]'s `Display` names an attempt by the reason the classifier gave
/// it when that says more (`connect error` for an `error`, `gRPC UNAVAILABLE` for a `200`).
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
/// Each stop has one name: [`as_str`](Self::as_str) is the stable label (`max_attempts`),
/// and `Display` writes it in words (`max attempts`), as [`RetryInfo`]'s summary does
/// (`stopped: max attempts`).
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
    /// A budget refused the retry (or the hedge): the [`RetryBudget`](crate::RetryBudget)
    /// or the [`RetryQuota`](crate::RetryQuota) had too few tokens, or the
    /// [`ConcurrencyBudget`](crate::ConcurrencyBudget) too many retries and hedges in
    /// flight.
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
    /// The retry [`Throttle`](crate::Throttle) refused the retry: too many recent failures;
    /// or an [`AdaptiveLimiter`](crate::AdaptiveLimiter) refused an attempt whose wait for
    /// a token would have been longer than its `max_wait`; or an
    /// [`AdaptiveThrottle`](crate::AdaptiveThrottle) rejected an attempt. A first attempt so
    /// refused is never sent: the caller gets [`LocallyRefused`](crate::LocallyRefused).
    Throttled,
    /// The retry was decided, but the inner service did not get ready for it, and nothing
    /// more was sent: either it was not ready within the attempt timeout (the bound of that
    /// wait when the request has no deadline; with one, the deadline bounds it, and its
    /// passing is [`StopReason::Deadline`]) and the caller got
    /// [`ServiceNotReady`](crate::ServiceNotReady), or its `poll_ready` failed and the
    /// caller got that error.
    ServiceNotReady,
    /// A response body could not be continued: the continuation's answer is of another
    /// representation (another strong `ETag`, `Last-Modified` or `Content-Encoding`) than
    /// the bytes already handed over ([`RetryLayer::resume`](crate::RetryLayer::resume)).
    RepresentationChanged,
    /// A response body could not be continued: the continuation's answer states another
    /// complete length than the first response.
    LengthChanged,
    /// A response body could not be continued: the server answered the range with the
    /// whole representation (200) and no strong `ETag` proved it the same one.
    RangeIgnored,
    /// A response body could not be continued: the continuation's `Content-Range` is
    /// missing, malformed, multipart, or does not cover the next byte.
    RangeMismatch,
    /// A response body could not be continued: bytes were already handed over and the
    /// first response had no validator (no strong `ETag`, no strong `Last-Modified`) to
    /// prove a continuation of the same representation, so none was sent.
    NoValidator,
    /// A response body broke after its policy's
    /// [`max_continuations`](crate::RetryPolicy::max_continuations).
    MaxContinuations,
}

impl StopReason {
    /// A short, stable name, for metrics labels and log fields: `max_attempts`. `Display`
    /// writes the same name in words (`max attempts`), and so does the record.
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
            StopReason::RepresentationChanged => "representation_changed",
            StopReason::LengthChanged => "length_changed",
            StopReason::RangeIgnored => "range_ignored",
            StopReason::RangeMismatch => "range_mismatch",
            StopReason::NoValidator => "no_validator",
            StopReason::MaxContinuations => "max_continuations",
        }
    }
}

/// The stop in words, for people: its label's ([`StopReason::as_str`]), `_` written as a
/// space (`max attempts`). The record writes it so.
impl fmt::Display for StopReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, word) in self.as_str().split('_').enumerate() {
            if i > 0 {
                f.write_str(" ")?;
            }
            f.write_str(word)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::reason::FailureKind;

    const UNAVAILABLE: RetryReason = RetryReason::Code {
        protocol: "gRPC",
        value: 14,
        name: "UNAVAILABLE",
        kind: FailureKind::Transient,
    };
    const S503: RetryReason = RetryReason::Status(StatusCode::SERVICE_UNAVAILABLE);

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

    /// `{}` and `{:#}`.
    fn shown(info: &RetryInfo) -> (String, String) {
        (info.to_string(), format!("{info:#}"))
    }

    /// Checks `{}` and `{:#}` of `info`: `{:#}` is `{}` and then `lines`.
    #[track_caller]
    fn assert_shown(info: &RetryInfo, summary: &str, lines: &[&str]) {
        let mut alternate = summary.to_string();
        for line in lines {
            alternate.push_str("\n  ");
            alternate.push_str(line);
        }
        assert_eq!(shown(info), (summary.to_string(), alternate));
    }

    /// A request answered `outcome` once, stopped for `stop`, its reason `cause`, as the
    /// driver books it.
    fn stopped_on(
        outcome: AttemptOutcome,
        cause: Option<RetryReason>,
        stop: StopReason,
    ) -> RetryInfo {
        let mut info = RetryInfo::default();
        info.set_outcome(outcome);
        if let Some(reason) = cause {
            info.set_cause(info.attempts(), reason);
        }
        info.set_stop(stop);
        info.set_returned_last();
        info
    }

    /// 503, then 503 with `Retry-After: 1`, then 200, on a POST with a key.
    fn retried() -> RetryInfo {
        let mut info = RetryInfo::default();
        info.set_idempotency_key(Some(HeaderValue::from_static("3f2a9c1e")));
        info.set_outcome(status(503));
        info.push_retry(retry(S503, 150, None));
        info.set_outcome(status(503));
        info.push_retry(retry(S503, 1000, Some(HintSource::RetryAfter)));
        info.set_outcome(status(200));
        info.set_returned_last();
        info
    }

    /// Three connect errors, 100 ms and 200 ms apart: the attempt limit.
    fn refused_three_times() -> RetryInfo {
        let mut info = RetryInfo::default();
        info.set_outcome(AttemptOutcome::Error);
        info.push_retry(retry(RetryReason::Connect, 100, None));
        info.set_outcome(AttemptOutcome::Error);
        info.push_retry(retry(RetryReason::Connect, 200, None));
        info.set_outcome(AttemptOutcome::Error);
        info.set_cause(3, RetryReason::Connect);
        info.set_stop(StopReason::MaxAttempts);
        info.set_returned_last();
        info
    }

    /// A hedged GET: the first attempt answers 200, the hedge sent 500 ms after it is
    /// cancelled.
    fn hedged() -> RetryInfo {
        let mut info = RetryInfo::default();
        info.push_retry(RetryRecord {
            kind: AttemptKind::Hedge,
            outcome: AttemptOutcome::Abandoned,
            ..retry(RetryReason::Hedge, 500, None)
        });
        info.set_outcome_of(1, status(200));
        info.set_outcome_of(2, AttemptOutcome::Cancelled);
        info.set_returned(1);
        info
    }

    #[test]
    fn one_attempt() {
        let info = stopped_on(status(200), None, StopReason::Final);
        assert_shown(&info, "1 attempt: 200; stopped: final", &["attempt 1: 200"]);
    }

    /// Every outcome an attempt can have, in a record, exactly. A new outcome fails to
    /// compile here until it has its line.
    #[test]
    fn every_outcome_is_written() {
        let all = [
            status(503),
            AttemptOutcome::Error,
            AttemptOutcome::TimedOut,
            AttemptOutcome::Abandoned,
            AttemptOutcome::Cancelled,
            AttemptOutcome::NotSent,
        ];
        for outcome in all {
            let (info, summary, lines): (RetryInfo, &str, &[&str]) = match outcome {
                AttemptOutcome::Response(_) => (
                    retried(),
                    "3 attempts: 503, 503, 200; waited 1.15 s (backoff, Retry-After); \
                     stopped: final",
                    &[
                        "attempt 1: 503",
                        "attempt 2, after 150 ms (backoff): 503",
                        "attempt 3, after 1 s (Retry-After): 200",
                        "idempotency key: 3f2a9c1e",
                    ],
                ),
                // An error the classifier gave no reason: final.
                AttemptOutcome::Error => (
                    stopped_on(AttemptOutcome::Error, None, StopReason::Final),
                    "1 attempt: error; stopped: final",
                    &["attempt 1: error"],
                ),
                AttemptOutcome::TimedOut => {
                    let mut info = RetryInfo::default();
                    info.set_outcome(AttemptOutcome::TimedOut);
                    info.push_retry(retry(RetryReason::Timeout, 100, None));
                    info.set_outcome(status(200));
                    info.set_returned_last();
                    (
                        info,
                        "2 attempts: timed out, 200; waited 100 ms (backoff); stopped: final",
                        &[
                            "attempt 1: timed out",
                            "attempt 2, after 100 ms (backoff): 200",
                        ],
                    )
                }
                // The deadline passed during the retry: the caller got `DeadlineExceeded`.
                AttemptOutcome::Abandoned => {
                    let mut info = RetryInfo::default();
                    info.set_outcome(status(503));
                    info.push_retry(retry(S503, 100, None));
                    info.set_outcome(AttemptOutcome::Abandoned);
                    info.set_stop(StopReason::Deadline);
                    (
                        info,
                        "2 attempts: 503, abandoned; waited 100 ms (backoff); stopped: deadline",
                        &[
                            "attempt 1: 503",
                            "attempt 2, after 100 ms (backoff): abandoned",
                            "returned: the layer's own error, no attempt's outcome",
                        ],
                    )
                }
                AttemptOutcome::Cancelled => (
                    hedged(),
                    "2 attempts: 200, cancelled; 1 hedge, attempt 1 returned; stopped: final",
                    &[
                        "attempt 1: 200",
                        "attempt 2, a hedge 500 ms after attempt 1 (hedging delay): cancelled",
                    ],
                ),
                // The retry's service was not ready in time.
                AttemptOutcome::NotSent => {
                    let mut info = RetryInfo::default();
                    info.set_outcome(status(503));
                    info.push_retry(retry(S503, 2500, Some(HintSource::Header("x-retry-in-ms"))));
                    info.set_stop(StopReason::ServiceNotReady);
                    info.set_returned_last();
                    assert_eq!(info.attempts(), 1);
                    (
                        info,
                        "1 attempt: 503 (the last retry not sent); waited 2.5 s (x-retry-in-ms); \
                         stopped: service not ready",
                        &[
                            "attempt 1: 503",
                            "attempt 2, after 2.5 s (x-retry-in-ms): not sent",
                            "returned: the layer's own error, no attempt's outcome",
                        ],
                    )
                }
            };
            assert_shown(&info, summary, lines);
        }
    }

    /// Every stop, in a record, exactly, in the same words as its `Display`: its label
    /// with spaces. A new stop fails to compile here until it has its line.
    #[test]
    fn every_stop_is_written_in_one_wording() {
        let all = [
            StopReason::Final,
            StopReason::Disabled,
            StopReason::MaxAttempts,
            StopReason::NotIdempotent,
            StopReason::BodyNotReplayable,
            StopReason::BudgetExhausted,
            StopReason::Deadline,
            StopReason::HintTooLong,
            StopReason::ServerSaidStop,
            StopReason::Throttled,
            StopReason::ServiceNotReady,
            StopReason::RepresentationChanged,
            StopReason::LengthChanged,
            StopReason::RangeIgnored,
            StopReason::RangeMismatch,
            StopReason::NoValidator,
            StopReason::MaxContinuations,
        ];
        for stop in all {
            let (label, words, info, summary, lines): (_, _, _, &str, &[&str]) = match stop {
                // A response body's stops: in the record of a body's error (tests/behaviour/resume.rs).
                StopReason::RepresentationChanged
                | StopReason::LengthChanged
                | StopReason::RangeIgnored
                | StopReason::RangeMismatch
                | StopReason::NoValidator
                | StopReason::MaxContinuations => {
                    let words = stop.as_str().replace('_', " ");
                    assert_eq!(stop.to_string(), words);
                    continue;
                }
                StopReason::Final => (
                    "final",
                    "final",
                    stopped_on(status(404), None, stop),
                    "1 attempt: 404; stopped: final",
                    &["attempt 1: 404"],
                ),
                // `never()`: nothing classified the error.
                StopReason::Disabled => (
                    "disabled",
                    "disabled",
                    stopped_on(AttemptOutcome::Error, None, stop),
                    "1 attempt: error; stopped: disabled",
                    &["attempt 1: error"],
                ),
                StopReason::MaxAttempts => (
                    "max_attempts",
                    "max attempts",
                    refused_three_times(),
                    "3 attempts: connect error, connect error, connect error; \
                     waited 300 ms (backoff); stopped: max attempts",
                    &[
                        "attempt 1: connect error",
                        "attempt 2, after 100 ms (backoff): connect error",
                        "attempt 3, after 200 ms (backoff): connect error",
                    ],
                ),
                // A POST without a key, its connection reset under it.
                StopReason::NotIdempotent => (
                    "not_idempotent",
                    "not idempotent",
                    stopped_on(
                        AttemptOutcome::Error,
                        Some(RetryReason::ConnectionClosed),
                        stop,
                    ),
                    "1 attempt: connection closed; stopped: not idempotent",
                    &["attempt 1: connection closed"],
                ),
                StopReason::BodyNotReplayable => (
                    "body_not_replayable",
                    "body not replayable",
                    stopped_on(status(503), Some(S503), stop),
                    "1 attempt: 503; stopped: body not replayable",
                    &["attempt 1: 503"],
                ),
                StopReason::BudgetExhausted => (
                    "budget_exhausted",
                    "budget exhausted",
                    stopped_on(AttemptOutcome::Error, Some(RetryReason::Connect), stop),
                    "1 attempt: connect error; stopped: budget exhausted",
                    &["attempt 1: connect error"],
                ),
                StopReason::Deadline => (
                    "deadline",
                    "deadline",
                    stopped_on(AttemptOutcome::Error, Some(RetryReason::Timeout), stop),
                    "1 attempt: timeout; stopped: deadline",
                    &["attempt 1: timeout"],
                ),
                StopReason::HintTooLong => {
                    let info = RetryInfo {
                        idempotency_key: Some(HeaderValue::from_static("k-1")),
                        ..stopped_on(
                            status(429),
                            Some(RetryReason::Status(StatusCode::TOO_MANY_REQUESTS)),
                            stop,
                        )
                    };
                    (
                        "hint_too_long",
                        "hint too long",
                        info,
                        "1 attempt: 429; stopped: hint too long",
                        &["attempt 1: 429", "idempotency key: k-1"],
                    )
                }
                // gRPC's negative pushback.
                StopReason::ServerSaidStop => (
                    "server_said_stop",
                    "server said stop",
                    stopped_on(status(200), Some(UNAVAILABLE), stop),
                    "1 attempt: gRPC UNAVAILABLE; stopped: server said stop",
                    &["attempt 1: gRPC UNAVAILABLE (HTTP 200)"],
                ),
                StopReason::Throttled => {
                    let mut info = RetryInfo::default();
                    info.set_outcome(status(200));
                    info.push_retry(retry(UNAVAILABLE, 100, None));
                    info.set_outcome(status(200));
                    info.set_cause(2, UNAVAILABLE);
                    info.set_stop(stop);
                    info.set_returned_last();
                    (
                        "throttled",
                        "throttled",
                        info,
                        "2 attempts: gRPC UNAVAILABLE, gRPC UNAVAILABLE; waited 100 ms (backoff); \
                         stopped: throttled",
                        &[
                            "attempt 1: gRPC UNAVAILABLE (HTTP 200)",
                            "attempt 2, after 100 ms (backoff): gRPC UNAVAILABLE (HTTP 200)",
                        ],
                    )
                }
                // The retry's service failed to get ready: the caller got its error.
                StopReason::ServiceNotReady => {
                    let mut info = RetryInfo::default();
                    info.set_outcome(AttemptOutcome::Error);
                    info.push_retry(retry(RetryReason::GoAway, 0, None));
                    info.set_stop(stop);
                    info.set_returned_last();
                    (
                        "service_not_ready",
                        "service not ready",
                        info,
                        "1 attempt: HTTP/2 GOAWAY (the last retry not sent); waited 0 ms (backoff); \
                         stopped: service not ready",
                        &[
                            "attempt 1: HTTP/2 GOAWAY",
                            "attempt 2, after 0 ms (backoff): not sent",
                            "returned: the layer's own error, no attempt's outcome",
                        ],
                    )
                }
            };
            assert_eq!((stop.as_str(), stop.to_string().as_str()), (label, words));
            assert_eq!(info.stop(), stop);
            assert_shown(&info, summary, lines);
        }
    }

    /// A gate refused the first attempt: nothing was sent.
    #[test]
    fn no_attempt_sent() {
        let mut info = RetryInfo::default();
        info.set_unsent(StopReason::Throttled);
        assert_shown(
            &info,
            "no attempt sent; stopped: throttled",
            &["returned: the layer's own error, no attempt's outcome"],
        );
    }

    /// Each reason names the attempt it was given, on an error or a response; a status only
    /// by its number. A new reason fails to compile here until it has its name.
    #[test]
    fn every_reason_names_its_attempt() {
        let all = [
            RetryReason::Status(StatusCode::BAD_GATEWAY),
            RetryReason::Connect,
            RetryReason::RefusedStream,
            RetryReason::NotSent,
            RetryReason::GoAway,
            RetryReason::ConnectionClosed,
            RetryReason::Timeout,
            UNAVAILABLE,
            RetryReason::Custom("quota_body"),
            RetryReason::Hedge,
        ];
        for reason in all {
            // On an error, then on a 200: `{}`, then `{:#}`.
            let (error, response): ([&str; 2], [&str; 2]) = match reason {
                RetryReason::Status(_) => (["status 502", "status 502 (error)"], ["200", "200"]),
                RetryReason::Connect => (
                    ["connect error"; 2],
                    ["connect error", "connect error (HTTP 200)"],
                ),
                RetryReason::RefusedStream => (
                    ["HTTP/2 stream refused"; 2],
                    ["HTTP/2 stream refused", "HTTP/2 stream refused (HTTP 200)"],
                ),
                RetryReason::NotSent => (
                    ["request not sent"; 2],
                    ["request not sent", "request not sent (HTTP 200)"],
                ),
                RetryReason::GoAway => (
                    ["HTTP/2 GOAWAY"; 2],
                    ["HTTP/2 GOAWAY", "HTTP/2 GOAWAY (HTTP 200)"],
                ),
                RetryReason::ConnectionClosed => (
                    ["connection closed"; 2],
                    ["connection closed", "connection closed (HTTP 200)"],
                ),
                RetryReason::Timeout => (["timeout"; 2], ["timeout", "timeout (HTTP 200)"]),
                RetryReason::Code { .. } => (
                    ["gRPC UNAVAILABLE", "gRPC UNAVAILABLE (error)"],
                    ["gRPC UNAVAILABLE", "gRPC UNAVAILABLE (HTTP 200)"],
                ),
                RetryReason::Custom(_) => (
                    ["quota_body", "quota_body (error)"],
                    ["quota_body", "quota_body (HTTP 200)"],
                ),
                RetryReason::Hedge => (
                    ["hedging delay", "hedging delay (error)"],
                    ["hedging delay", "hedging delay (HTTP 200)"],
                ),
            };
            for (outcome, [summary, line]) in
                [(AttemptOutcome::Error, error), (status(200), response)]
            {
                let info = stopped_on(outcome, Some(reason), StopReason::MaxAttempts);
                assert_shown(
                    &info,
                    &format!("1 attempt: {summary}; stopped: max attempts"),
                    &[&format!("attempt 1: {line}")],
                );
            }
        }
        // The layer's own ends name themselves, whatever the reason.
        for (outcome, name) in [
            (AttemptOutcome::TimedOut, "timed out"),
            (AttemptOutcome::Abandoned, "abandoned"),
            (AttemptOutcome::Cancelled, "cancelled"),
        ] {
            let info = stopped_on(outcome, Some(RetryReason::Timeout), StopReason::Deadline);
            assert_eq!(
                info.to_string(),
                format!("1 attempt: {name}; stopped: deadline")
            );
        }
    }

    /// The cause booked for one attempt names that one only; the others keep their
    /// retries' reasons, or their outcomes.
    #[test]
    fn a_cause_names_its_own_attempt() {
        let mut info = refused_three_times();
        info.set_cause(2, RetryReason::Timeout);
        assert_eq!(
            info.to_string(),
            "3 attempts: connect error, timeout, connect error; waited 300 ms (backoff); \
             stopped: max attempts"
        );
        // Booked again, an attempt's cause is replaced.
        info.set_cause(3, RetryReason::GoAway);
        assert_eq!(
            info.booked_causes(),
            [(3, RetryReason::GoAway), (2, RetryReason::Timeout)]
        );
        assert!(
            info.to_string()
                .starts_with("3 attempts: connect error, timeout, HTTP/2 GOAWAY;")
        );
        // A hedge's reason is why it was sent, not what the attempt before it got.
        let mut info = hedged();
        info.later_mut().retries[0].reason = RetryReason::Connect;
        assert_eq!(
            format!("{info:#}"),
            "2 attempts: 200, cancelled; 1 hedge, attempt 1 returned; stopped: final\n\
             \x20 attempt 1: 200\n\
             \x20 attempt 2, a hedge 500 ms after attempt 1 (after connect error): cancelled"
        );
        info.later_mut().retries[0].reason = S503;
        assert!(
            format!("{info:#}").ends_with("(after 503): cancelled"),
            "{info:#}"
        );
    }

    /// A hedged request's attempts are each named by the cause booked as they ended: a
    /// hedge's reason is why it was sent, after a delay or another attempt's failure.
    #[test]
    fn hedged_attempts_are_named_by_their_own_causes() {
        let mut info = RetryInfo::default();
        let hedge = |reason, wait_ms| RetryRecord {
            kind: AttemptKind::Hedge,
            outcome: AttemptOutcome::Abandoned,
            ..retry(reason, wait_ms, None)
        };
        // Attempt 2 goes at the delay; attempt 1 fails, and attempt 3 goes at once.
        info.push_retry(hedge(RetryReason::Hedge, 500));
        info.set_outcome_of(1, status(200));
        info.set_cause(1, UNAVAILABLE);
        info.push_retry(hedge(UNAVAILABLE, 200));
        info.set_outcome_of(3, AttemptOutcome::Error);
        info.set_cause(3, RetryReason::ConnectionClosed);
        info.set_outcome_of(2, status(200));
        info.set_cause(2, UNAVAILABLE);
        info.set_stop(StopReason::MaxAttempts);
        info.set_returned(2);
        assert_shown(
            &info,
            "3 attempts: gRPC UNAVAILABLE, gRPC UNAVAILABLE, connection closed; 2 hedges, \
             attempt 2 returned; stopped: max attempts",
            &[
                "attempt 1: gRPC UNAVAILABLE (HTTP 200)",
                "attempt 2, a hedge 500 ms after attempt 1 (hedging delay): \
                 gRPC UNAVAILABLE (HTTP 200)",
                "attempt 3, a hedge 200 ms after attempt 2 (after gRPC UNAVAILABLE): \
                 connection closed",
            ],
        );
    }

    /// A transparent retry goes at once; a hint's source and the backoff are both named.
    #[test]
    fn a_transparent_retry_and_a_limit() {
        let mut info = RetryInfo::default();
        info.set_outcome(AttemptOutcome::Error);
        info.push_retry(RetryRecord {
            kind: AttemptKind::Transparent,
            ..retry(RetryReason::RefusedStream, 0, None)
        });
        info.set_outcome(AttemptOutcome::TimedOut);
        info.push_retry(retry(RetryReason::Timeout, 87, None));
        info.set_outcome(status(502));
        info.set_cause(3, RetryReason::Status(StatusCode::BAD_GATEWAY));
        info.set_stop(StopReason::MaxAttempts);
        info.set_returned_last();
        assert_shown(
            &info,
            "3 attempts: HTTP/2 stream refused, timed out, 502; \
             waited 87 ms (transparent retry, backoff); stopped: max attempts",
            &[
                "attempt 1: HTTP/2 stream refused",
                "attempt 2, at once (transparent retry): timed out",
                "attempt 3, after 87 ms (backoff): 502",
            ],
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
            (AttemptOutcome::Cancelled, "cancelled"),
            (AttemptOutcome::NotSent, "not sent"),
        ];
        for (outcome, text) in all {
            assert_eq!(outcome.to_string(), text);
        }
    }

    /// The retries and causes are boxed: the record of a request that succeeds at once
    /// holds a null pointer for them, no more.
    #[test]
    fn the_record_stays_small() {
        assert_eq!(
            std::mem::size_of::<Option<Box<Later>>>(),
            std::mem::size_of::<usize>()
        );
        assert!(
            std::mem::size_of::<RetryInfo>() <= 64,
            "{}",
            std::mem::size_of::<RetryInfo>()
        );
        let info = stopped_on(status(200), None, StopReason::Final);
        assert!(info.later.is_none());
    }
}
