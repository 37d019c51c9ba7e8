// Every retry decision as plain code: the limits of a logical request, whether an outcome
// may be retried, the gates, the hint and how long to wait, what a timer that fired means,
// and the record of it all. Nothing here knows futures or services: the driver
// (`future.rs`) gathers the facts, asks here, and carries out the answer.

use std::time::Duration;

use tower::BoxError;

use crate::backoff::JitterRng;
use crate::classify::{Classification, RetryReason};
use crate::config::Plan;
use crate::error::{AttemptTimedOut, DeadlineExceeded, ServiceNotReady};
use crate::gate::{Admitted, Ask, Gates, Heard, Ticket};
use crate::hints::Hint;
use crate::hook::{Attempt, AttemptKind};
use crate::info::{AttemptOutcome, RetryInfo, RetryRecord, StopReason};
use crate::policy::Settings;
use crate::replay::NotReplayable;
use crate::time::{Clock, Instant};

/// How late a tokio timer may fire: it rounds deadlines up to the next millisecond.
const TIMER_SLACK: Duration = Duration::from_millis(1);

/// How long to wait for a transport to drop the last attempt's body when neither a
/// deadline nor an attempt timeout bounds it. hyper drops it within moments of failing the
/// response future (its connection task or body pipe notices the failure on its next
/// poll); this is the margin for a loaded runtime.
pub(crate) const RELEASE_GRACE: Duration = Duration::from_secs(1);

/// The time limits of one logical request.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// When the deadline passes, the deadline itself and the floor.
    deadline: Option<(Instant, Span)>,
    attempt_timeout: Option<Duration>,
}

/// A deadline's length and the floor of time an attempt needs to start
/// ([`RetryPolicy::min_time_left`](crate::RetryPolicy::min_time_left)), in the 16 bytes of
/// one `Duration`: the floor, in whole microseconds, takes the room a `Duration` leaves
/// as padding. `Limits` is moved with every response future, and a field of its own for
/// the floor cost every request 25 instructions of copying (callgrind, `get`).
#[derive(Debug, Clone, Copy)]
struct Span {
    secs: u64,
    nanos: u32,
    floor_micros: u32,
}

impl Span {
    fn new(whole: Duration, floor: Duration) -> Self {
        Self {
            secs: whole.as_secs(),
            nanos: whole.subsec_nanos(),
            floor_micros: u32::try_from(floor.as_micros()).unwrap_or(u32::MAX),
        }
    }

    fn whole(self) -> Duration {
        Duration::new(self.secs, self.nanos)
    }

    fn floor(self) -> Duration {
        Duration::from_micros(u64::from(self.floor_micros))
    }
}

impl Limits {
    /// The limits of a request starting now, its deadline also at most `bound` away when
    /// given (a time limit the caller's request sets itself): the shorter applies. The
    /// clock is read only for a deadline.
    pub(crate) fn start(policy: &Settings, bound: Option<Duration>, clock: &Clock) -> Self {
        let deadline = match (policy.deadline, bound) {
            (Some(d), Some(b)) => Some(d.min(b)),
            (d, b) => d.or(b),
        };
        Self {
            deadline: deadline.and_then(|d| {
                let at = clock.now().checked_add(d)?;
                Some((at, Span::new(d, policy.min_time_left)))
            }),
            attempt_timeout: policy.attempt_timeout,
        }
    }

    /// Whether the deadline leaves less than the floor for the first attempt, at the start
    /// (no clock is read).
    #[inline]
    pub(crate) fn no_time_at_start(&self) -> bool {
        self.deadline
            .is_some_and(|(_, span)| span.floor_micros != 0 && span.whole() < span.floor())
    }

    /// Whether an attempt may not start at `now`: the deadline has passed, or it leaves
    /// less than the floor.
    pub(crate) fn too_late_to_start(&self, now: Instant) -> bool {
        self.deadline
            .is_some_and(|(at, span)| now >= at || at.saturating_duration_since(now) < span.floor())
    }

    /// The last instant an attempt may start: the deadline less the floor (`now`, if
    /// earlier, when that is before the clock's first instant).
    pub(crate) fn start_by(&self, now: Instant) -> Option<Instant> {
        self.deadline
            .map(|(at, span)| at.checked_sub(span.floor()).unwrap_or_else(|| at.min(now)))
    }

    /// The error of an attempt not started at `now` (`None`: at the start) because the
    /// floor was not left: it names the floor while the deadline itself has not passed.
    pub(crate) fn floor_exceeded(&self, now: Option<Instant>) -> BoxError {
        match self.deadline {
            Some((at, span)) if span.floor_micros != 0 && now.is_none_or(|now| now < at) => {
                Box::new(DeadlineExceeded::with_floor(span.whole(), span.floor()))
            }
            _ => self.deadline_exceeded(),
        }
    }

    /// Whether an attempt has any end at all (else no clock needs reading for it).
    pub(crate) fn bounds_attempts(&self) -> bool {
        self.deadline.is_some() || self.attempt_timeout.is_some()
    }

    pub(crate) fn deadline(&self) -> Option<Instant> {
        self.deadline.map(|(at, _)| at)
    }

    pub(crate) fn attempt_timeout(&self) -> Option<Duration> {
        self.attempt_timeout
    }

    pub(crate) fn past_deadline(&self, now: Instant) -> bool {
        self.deadline.is_some_and(|(at, _)| now >= at)
    }

    /// The time left before the deadline at `now`; at the start, the deadline itself.
    pub(crate) fn time_left(&self, now: Option<Instant>) -> Option<Duration> {
        self.deadline.map(|(at, span)| match now {
            Some(now) => at.saturating_duration_since(now),
            None => span.whole(),
        })
    }

    /// When an attempt started `now` must end, if ever: the attempt timeout or the
    /// deadline, whichever comes first.
    pub(crate) fn attempt_end(&self, now: Instant) -> Option<Instant> {
        let timeout = self.attempt_timeout.and_then(|t| now.checked_add(t));
        match (timeout, self.deadline()) {
            (Some(t), Some(d)) => Some(t.min(d)),
            (t, d) => t.or(d),
        }
    }

    /// The end of a wait that is not an attempt (for the retry's service to become ready,
    /// for a transport to let go of a body): the deadline, else the attempt timeout from
    /// `now`, else `fallback` from `now` if given.
    pub(crate) fn wait_end(&self, now: Instant, fallback: Option<Duration>) -> Option<Instant> {
        self.deadline()
            .or_else(|| self.attempt_timeout.or(fallback).map(|t| after(now, t)))
    }

    pub(crate) fn deadline_exceeded(&self) -> BoxError {
        let deadline = self
            .deadline
            .map_or(Duration::ZERO, |(_, span)| span.whole());
        Box::new(DeadlineExceeded::new(deadline))
    }
}

/// The instant `wait` after `now`; a wait too long to represent ends in about thirty
/// years, which is "never" for a request but still a wait, not none.
pub(crate) fn after(now: Instant, wait: Duration) -> Instant {
    now.checked_add(wait)
        .or_else(|| now.checked_add(Duration::from_secs(86_400 * 365 * 30)))
        .unwrap_or(now)
}

/// How a request may be sent more than once: decided once, when it is called, from its
/// plan, its method and whether it carries an idempotency key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Repeat {
    /// Sent once: `never()`, one attempt without a transparent retry, `CONNECT`.
    Once,
    /// Retried only after a failure that proves the server never saw it: a request that
    /// may not be repeated (a POST without a key).
    IfUnseen,
    /// Retried after any outcome worth it: an idempotent method, a request with a key, a
    /// policy that declares its requests repeatable.
    Retry,
    /// Hedged: safe to send twice at once (a safe method, or a policy that declares its
    /// requests repeatable), under a policy that hedges.
    Hedge,
}

impl Repeat {
    /// Whether any retryable outcome may be retried (else only one the server never saw).
    pub(crate) fn any_outcome(self) -> bool {
        self != Repeat::IfUnseen
    }
}

/// How a request of `method` under `plan` may be repeated; `keyed` when it carries an
/// idempotency key. Idempotent is not enough for a hedge: a DELETE applied by a slow first
/// attempt makes its hedge answer 404, and that answer would win.
#[inline]
pub(crate) fn repeat(plan: &Plan, method: &http::Method, keyed: bool) -> Repeat {
    let policy = &plan.policy;
    if policy.sends_once() || method == http::Method::CONNECT {
        return Repeat::Once;
    }
    let declared = policy.assume_idempotent;
    if plan.hedging.is_some() && (method.is_safe() || declared) {
        return Repeat::Hedge;
    }
    match method.is_idempotent() || keyed || declared {
        true => Repeat::Retry,
        false => Repeat::IfUnseen,
    }
}

/// What the decisions remember of one request between its attempts, from its first retry
/// on (a request that succeeds at once never has one).
#[derive(Debug)]
pub(crate) struct Course {
    rng: JitterRng,
    /// The previous wait actually slept, for decorrelated jitter (the base before any).
    previous: Duration,
    /// Retries up to the last exact hint: the backoff counts from there.
    offset: usize,
    /// What the retries took from the gates.
    pub(crate) ticket: Ticket,
}

impl Course {
    pub(crate) fn new(policy: &Settings) -> Self {
        Self {
            rng: policy.jitter_rng(),
            previous: policy.backoff.base(),
            offset: 0,
            ticket: Ticket::default(),
        }
    }
}

/// The facts of one outcome that the driver has at hand.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Outcome {
    /// The classifier's verdict.
    pub(crate) verdict: Classification,
    /// The attempt produced a response (as opposed to an error).
    pub(crate) responded: bool,
    /// An idempotent method, a key on the request, or a policy that declares the request
    /// repeatable.
    pub(crate) may_repeat: bool,
    /// The outcome is decided again after the transport released the body: the gates
    /// heard of it already, and a body still held is not replayable.
    pub(crate) released: bool,
    /// The attempt failed in a way that proves it never left the client, and why
    /// ([`classify::never_left`](crate::classify::never_left)); looked for only when the
    /// policy has transparent retries.
    pub(crate) never_left: Option<RetryReason>,
}

/// The facts that cost something to learn, asked for only when a decision needs them.
pub(crate) trait Facts {
    /// The current time.
    fn now(&mut self) -> Instant;
    /// Whether the body can be sent again after the attempt that produced the outcome.
    fn replay(&mut self) -> Result<(), NotReplayable>;
    /// The server's hint in the response's headers (`Retry-After`, the RateLimit fields).
    fn server_hint(&mut self) -> Option<Hint>;
}

/// The hint for the attempt after an outcome: the classifier's own first; else, after a
/// response, the server's.
fn hint_after(verdict: Classification, responded: bool, facts: &mut impl Facts) -> Option<Hint> {
    match verdict {
        Classification::RetryWithHint(_, hint) => Some(hint),
        _ if responded => facts.server_hint(),
        _ => None,
    }
}

/// A floor hint (`Retry-After`) longer than the policy honours: the caller is better
/// served by the response than by the wait. An exact hint has no such bound.
fn asks_too_long(hint: Hint, max_retry_after: Duration) -> bool {
    !hint.exact && hint.wait > max_retry_after
}

/// Whether a wait from `now` would end too close to the deadline to leave time for an
/// attempt. Timers fire on whole milliseconds, so a wait may end up to 1 ms late: a wait
/// that would end within that of the deadline leaves no time.
fn leaves_no_time(now: Instant, wait: Duration, deadline: Instant) -> bool {
    now.checked_add(wait)
        .and_then(|ends| ends.checked_add(TIMER_SLACK))
        .is_none_or(|ends| ends >= deadline)
}

/// What the driver does with an outcome.
#[derive(Debug)]
pub(crate) enum Answer {
    /// Return it: the record says why ([`RetryInfo::stop`]).
    Return,
    /// Return it: a gate refused the retry that this reason called for (the record's
    /// stop says which, [`by_gate`]).
    Refused(RetryReason),
    /// Keep it and wait for the transport to release the body, then decide again.
    AwaitRelease,
    /// Drop it, wait `wait`, then send the next attempt. `start` is the request's course
    /// when this is its first retry.
    Retry {
        wait: Duration,
        start: Option<Course>,
    },
}

/// Whether `stop` is a gate's refusal of a retry (or hedge) that everything else allowed:
/// the budget's or a quota's, or the throttle's.
pub(crate) fn by_gate(stop: StopReason) -> bool {
    matches!(stop, StopReason::BudgetExhausted | StopReason::Throttled)
}

/// Returns the outcome, for `reason`; `cause` is the reason its attempt was given, if any.
fn stop(info: &mut RetryInfo, reason: StopReason, cause: Option<RetryReason>) -> Answer {
    attempt_classified(info, cause);
    record_stop(info, reason);
    Answer::Return
}

/// Decides what becomes of one attempt's outcome under `plan`, and books it: gates told,
/// retry recorded, or the stop.
pub(crate) fn decide(
    plan: &Plan,
    gates: &Gates,
    limits: &Limits,
    outcome: &Outcome,
    facts: &mut impl Facts,
    course: Option<&mut Course>,
    info: &mut RetryInfo,
) -> Answer {
    let policy = &plan.policy;
    let verdict = outcome.verdict;
    // A request the server provably never saw is sent again at once, outside the count.
    let transparent = transparent(
        policy.transparent,
        outcome.never_left,
        verdict,
        info.retries(),
    );
    // Every gate hears of an outcome once (not again after the body's release), and not of
    // a transparent retry's: the server never saw that attempt.
    let gated = match (transparent, outcome.released) {
        (None, false) => gates.on_outcome(Heard::of(verdict), course.as_deref().map(|c| &c.ticket)),
        _ => Ok(()),
    };
    let judged = match transparent {
        Some(reason) => Ok(reason),
        None => judge(&Judgement {
            verdict,
            may_repeat: outcome.may_repeat,
            attempts: info.attempts(),
            max_attempts: policy.max_attempts,
            previous: info.retries(),
            // The clock is read only for an error under a deadline.
            failed_after_deadline: !outcome.responded
                && limits.deadline().is_some()
                && limits.past_deadline(facts.now()),
        }),
    };
    let reason = match judged {
        Ok(reason) => reason,
        Err(stopped) => return stop(info, stopped, verdict.reason()),
    };
    if gated.is_err() {
        stop(info, StopReason::Throttled, Some(reason));
        return Answer::Refused(reason);
    }
    if let Classification::Stop(_) = verdict {
        return stop(info, StopReason::ServerSaidStop, Some(reason));
    }
    match facts.replay() {
        Ok(()) => {}
        // The transport has not dropped the last attempt's body yet (hyper does that in its
        // connection task or body pipe, after failing the response future). The outcome
        // may be returned after that wait: its cause is booked now.
        Err(NotReplayable::InFlight) if !outcome.released => {
            attempt_classified(info, Some(reason));
            return Answer::AwaitRelease;
        }
        Err(_) => return stop(info, StopReason::BodyNotReplayable, Some(reason)),
    }

    // A first retry's course is made here, and kept only if the retry goes ahead.
    let mut start = None;
    let course = match course {
        Some(course) => course,
        None => start.insert(Course::new(policy)),
    };
    let n = backoff_number(info.retries(), course.offset);
    let backoff = match transparent {
        Some(_) => Duration::ZERO,
        None => course.rng.draw(&policy.backoff, n, course.previous),
    };
    // A transparent retry goes at once, whatever the hints.
    let hint = match transparent {
        Some(_) => None,
        None => hint_after(verdict, outcome.responded, facts),
    };
    let schedule = Schedule {
        reason,
        backoff,
        hint,
        max_hint: policy.max_retry_after,
        now: facts.now(),
        deadline: limits.start_by(facts.now()),
        transparent: transparent.is_some(),
    };
    let record = match schedule_retry(&schedule, gates, &mut course.ticket) {
        Ok(record) => record,
        Err(refused) => {
            if refused == StopReason::BudgetExhausted {
                crate::trace::budget_refused(&reason);
            }
            stop(info, refused, Some(reason));
            return match by_gate(refused) {
                true => Answer::Refused(reason),
                false => Answer::Return,
            };
        }
    };
    // After an exact hint the backoff starts again from the first retry's; a transparent
    // retry's zero wait is no backoff, so decorrelated jitter goes on from the wait before.
    if hint.is_some_and(|hint| hint.exact) {
        course.offset = info.retries().len() + 1;
    }
    if !record.is_transparent() {
        course.previous = record.wait;
    }
    crate::trace::retried(&record);
    record_retry(info, record);
    Answer::Retry {
        wait: record.wait,
        start,
    }
}

/// A success that needed no thought (a 2xx under the default classification): booked, as
/// the last attempt's outcome returned.
#[inline]
pub(crate) fn succeeded(info: &mut RetryInfo) {
    record_stop(info, StopReason::Final);
    returning(info, false);
}

/// The outcome of a request sent once (one attempt, not `never()`): its gates hear it as
/// they would under retries (a quota's reward for a success, a throttle's failure for what
/// the classifier would have retried), with no ticket, since nothing was withdrawn.
pub(crate) fn sent_once(gates: &Gates, verdict: Classification) {
    // No retry follows, whatever a throttle would say of one.
    let _ = gates.on_outcome(Heard::of(verdict), None);
}

/// The caller's own request body failed: the error is theirs, returned as is.
pub(crate) fn caller_body_failed(info: &mut RetryInfo) {
    record_stop(info, StopReason::Final);
}

/// What an attempt whose timer fired at `now` ends with.
#[derive(Debug)]
pub(crate) enum Expired {
    /// The deadline passed: the request ends with this error.
    Deadline(BoxError),
    /// The attempt timeout passed first: an outcome like any other (a retryable timeout).
    Attempt(BoxError),
}

/// An attempt's timer fired at `now`.
pub(crate) fn attempt_expired(limits: &Limits, now: Instant) -> Expired {
    if limits.past_deadline(now) {
        return Expired::Deadline(limits.deadline_exceeded());
    }
    let timeout = limits.attempt_timeout.unwrap_or_default();
    Expired::Attempt(Box::new(AttemptTimedOut::new(timeout)))
}

/// The deadline ended an attempt of a request that may be retried.
pub(crate) fn deadline_passed(info: &mut RetryInfo) {
    record_stop(info, StopReason::Deadline);
}

/// The wait for the transport to release the body ran out at `now` with the body still
/// held: the held outcome is returned.
pub(crate) fn release_timed_out(limits: &Limits, now: Instant, info: &mut RetryInfo) {
    let reason = match limits.past_deadline(now) {
        true => StopReason::Deadline,
        false => StopReason::BodyNotReplayable,
    };
    record_stop(info, reason);
}

/// The retry's service became ready at `now`: the attempt to send, or, when readiness took
/// the time that was left, the error to end with. Counts the attempt.
pub(crate) fn ready(
    limits: &Limits,
    now: Instant,
    info: &mut RetryInfo,
) -> Result<Attempt, BoxError> {
    if limits.too_late_to_start(now) {
        record_stop(info, StopReason::Deadline);
        return Err(limits.floor_exceeded(Some(now)));
    }
    // Sent: in flight, and dropped if nothing else is booked for it.
    info.set_outcome(AttemptOutcome::Abandoned);
    let kind = match info.retries().last() {
        Some(record) => record.kind,
        None => AttemptKind::Retry,
    };
    Ok(Attempt {
        number: info.attempts(),
        counted_before: counted_attempts(info.attempts(), info.retries()).saturating_sub(1),
        time_left: limits.time_left(Some(now)),
        timeout: limits.attempt_timeout,
        kind,
    })
}

/// The retry's service was still not ready when its wait ran out at `now`: nothing is
/// sent, and the request ends with this error (the record keeps the retry that asked).
pub(crate) fn not_ready(limits: &Limits, now: Instant, info: &mut RetryInfo) -> BoxError {
    if limits.past_deadline(now) {
        record_stop(info, StopReason::Deadline);
        return limits.deadline_exceeded();
    }
    record_stop(info, StopReason::ServiceNotReady);
    let timeout = limits.attempt_timeout.unwrap_or_default();
    Box::new(ServiceNotReady::new(timeout))
}

/// The retry's service failed to get ready: nothing more is sent, its error is returned as
/// is, and the stop says so (the deadline's doing if it had passed).
pub(crate) fn ready_failed(limits: &Limits, now: impl FnOnce() -> Instant, info: &mut RetryInfo) {
    let stop = match limits.deadline().is_some() && limits.past_deadline(now()) {
        true => StopReason::Deadline,
        false => StopReason::ServiceNotReady,
    };
    record_stop(info, stop);
}

/// The first attempt, for the hooks: no clock is read for it.
pub(crate) fn first_attempt(limits: &Limits) -> Attempt {
    first_attempt_at(limits, None)
}

/// The first attempt, sent at `now` (after a wait a gate asked for), else at the start.
pub(crate) fn first_attempt_at(limits: &Limits, now: Option<Instant>) -> Attempt {
    Attempt {
        number: 1,
        counted_before: 0,
        time_left: limits.time_left(now),
        timeout: limits.attempt_timeout,
        kind: AttemptKind::First,
    }
}

/// Books that no attempt is sent, for `stop` (a gate refused the first attempt, or the
/// deadline leaves no time for the wait one asked of it); the caller's error.
pub(crate) fn first_refused(limits: &Limits, stop: StopReason, info: &mut RetryInfo) -> BoxError {
    info.set_unsent(stop);
    match stop {
        StopReason::Deadline => limits.floor_exceeded(None),
        _ => {
            crate::trace::locally_refused(stop);
            Box::new(crate::error::LocallyRefused::new(stop))
        }
    }
}

/// Asks the gates that pace first attempts for one, before it is sent at `now`: `Ok(None)`
/// to send it at once; `Ok(Some)` with what they took, to send it after their wait, which
/// the deadline leaves time for; or why it is not sent (what was taken given back).
pub(crate) fn admit_first(
    gates: &Gates,
    limits: &Limits,
    now: Instant,
) -> Result<Option<Admitted>, StopReason> {
    let admitted = gates.admit(Ask::First)?;
    if admitted.wait.is_zero() {
        return Ok(None);
    }
    if limits
        .start_by(now)
        .is_some_and(|start_by| leaves_no_time(now, admitted.wait, start_by))
    {
        gates.release(&admitted);
        return Err(StopReason::Deadline);
    }
    Ok(Some(admitted))
}

/// What an outcome's classification and the request allow, before any wait is chosen.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Judgement<'a> {
    pub(crate) verdict: Classification,
    pub(crate) may_repeat: bool,
    pub(crate) attempts: u32,
    pub(crate) max_attempts: u32,
    pub(crate) previous: &'a [RetryRecord],
    /// The outcome is an error that came at or after the deadline: when it is final, it is
    /// final because the time is up (a timer below the layer, such as the one a tonic
    /// `Channel` runs for the `grpc-timeout` the layer sent, fired with the deadline).
    pub(crate) failed_after_deadline: bool,
}

/// A transparent retry, for a policy that has them: an attempt the transport proved never
/// left the client (`RST_STREAM(REFUSED_STREAM)` on the request's own stream, or a request
/// hyper never started) is sent again once per logical request, at once, whatever the
/// attempts left and whatever the classifier said (it is the transport's retry, below the
/// policy's), and without telling the gates. `Some` with the reason when this outcome gets
/// it; a second such failure, and a verdict of [`Classification::Stop`], go by the normal
/// rules.
///
/// A connect error is proof too that the server never saw the request (so any method may
/// be retried after one), but not a transparent retry: a server that refuses connections is
/// down, and gRPC's clients hand that failure to the retry policy, counted.
pub(crate) fn transparent(
    enabled: bool,
    never_left: Option<RetryReason>,
    verdict: Classification,
    previous: &[RetryRecord],
) -> Option<RetryReason> {
    if !enabled
        || matches!(verdict, Classification::Stop(_))
        || previous.iter().any(RetryRecord::is_transparent)
    {
        return None;
    }
    never_left
}

/// The attempts that count against `max_attempts`: all of them but the transparent
/// retries among `previous`.
pub(crate) fn counted_attempts(attempts: u32, previous: &[RetryRecord]) -> u32 {
    let transparent = previous
        .iter()
        .filter(|record| record.is_transparent())
        .count();
    attempts.saturating_sub(u32::try_from(transparent).unwrap_or(u32::MAX))
}

/// The backoff's retry number for the next retry (1 for the first): the retries since the
/// first `offset` ones (those up to the last exact hint), transparent ones not counted.
pub(crate) fn backoff_number(previous: &[RetryRecord], offset: usize) -> u32 {
    let since = previous.get(offset..).unwrap_or_default();
    let counted = since
        .iter()
        .filter(|record| !record.is_transparent())
        .count();
    u32::try_from(counted + 1).unwrap_or(u32::MAX)
}

/// Whether the outcome is worth a retry, and for which reason; or why not.
pub(crate) fn judge(j: &Judgement<'_>) -> Result<RetryReason, StopReason> {
    let last = match j.failed_after_deadline {
        true => StopReason::Deadline,
        false => StopReason::Final,
    };
    let reason = match j.verdict {
        Classification::Success => return Err(StopReason::Final),
        Classification::Done => return Err(last),
        Classification::Retry(reason)
        | Classification::RetryWithHint(reason, _)
        | Classification::Stop(reason) => reason,
        Classification::RetryOnce(reason) => {
            if j.previous.iter().any(|r| r.reason == reason) {
                return Err(last);
            }
            reason
        }
    };
    if !j.may_repeat && !reason.request_not_processed() {
        return Err(StopReason::NotIdempotent);
    }
    if counted_attempts(j.attempts, j.previous) >= j.max_attempts {
        return Err(StopReason::MaxAttempts);
    }
    Ok(reason)
}

/// The wait of a retry that [`judge`] allowed and whose body can be sent again.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Schedule {
    pub(crate) reason: RetryReason,
    pub(crate) backoff: Duration,
    /// The classifier's or the server's hint, if one was given.
    pub(crate) hint: Option<Hint>,
    /// The longest floor hint honoured (`max_retry_after`); exact hints have none.
    pub(crate) max_hint: Duration,
    pub(crate) now: Instant,
    /// The last instant the attempt may start: the deadline less the floor
    /// ([`Limits::start_by`]).
    pub(crate) deadline: Option<Instant>,
    /// A transparent retry ([`transparent`]): sent at once, backoff and hints aside.
    pub(crate) transparent: bool,
}

/// Schedules the retry, or says why it cannot happen. The gates are asked last, only when
/// everything else allows the retry; what they take goes on the request's `ticket`. A gate
/// may ask the retry to wait longer: then it waits that long, if the deadline leaves time
/// for it, else nothing is taken and the deadline stops the request.
///
/// A transparent retry waits nothing, but the deadline still applies, and so does the
/// budget: it bounds every retry the layer sends, and one per logical request at most is
/// transparent.
pub(crate) fn schedule_retry(
    s: &Schedule,
    gates: &Gates,
    ticket: &mut Ticket,
) -> Result<RetryRecord, StopReason> {
    let hint = s.hint.filter(|_| !s.transparent);
    if hint.is_some_and(|hint| asks_too_long(hint, s.max_hint)) {
        return Err(StopReason::HintTooLong);
    }
    let backoff = match s.transparent {
        true => Duration::ZERO,
        false => s.backoff,
    };
    let (wait, from_hint) = match hint {
        Some(hint) if hint.exact => (hint.wait, true),
        Some(hint) => (hint.wait.max(backoff), hint.wait > backoff),
        None => (backoff, false),
    };
    if s.deadline
        .is_some_and(|deadline| leaves_no_time(s.now, wait, deadline))
    {
        return Err(match from_hint {
            true => StopReason::HintTooLong,
            false => StopReason::Deadline,
        });
    }
    let ask = match s.transparent {
        true => Ask::Transparent,
        false => Ask::Retry(s.reason.kind()),
    };
    let admitted = gates.admit(ask)?;
    let (wait, from_hint) = match admitted.wait > wait {
        true if s
            .deadline
            .is_some_and(|deadline| leaves_no_time(s.now, admitted.wait, deadline)) =>
        {
            gates.release(&admitted);
            return Err(StopReason::Deadline);
        }
        true => (admitted.wait, false),
        false => (wait, from_hint),
    };
    gates.commit(&admitted, ticket);
    Ok(RetryRecord {
        kind: match s.transparent {
            true => AttemptKind::Transparent,
            false => AttemptKind::Retry,
        },
        reason: s.reason,
        wait,
        hint: hint.filter(|_| from_hint).map(|hint| hint.source),
        outcome: AttemptOutcome::NotSent,
    })
}

/// Books a retry that goes ahead (not sent yet).
#[inline]
pub(crate) fn record_retry(info: &mut RetryInfo, record: RetryRecord) {
    info.push_retry(record);
}

/// Books why retrying stopped.
#[inline]
pub(crate) fn record_stop(info: &mut RetryInfo, stop: StopReason) {
    info.set_stop(stop);
}

/// Books what the attempt now ending got.
#[inline]
pub(crate) fn attempt_ended(info: &mut RetryInfo, outcome: AttemptOutcome) {
    info.set_outcome(outcome);
}

/// Books the reason the classifier gave the last attempt sent, when no retry will carry it
/// (the request stops on it). Nothing for an outcome without one (a success, a final
/// status): the record names it by the outcome.
pub(crate) fn attempt_classified(info: &mut RetryInfo, cause: Option<RetryReason>) {
    if let Some(reason) = cause {
        info.set_cause(info.attempts(), reason);
    }
}

/// Books whose outcome the caller gets: the last attempt's, unless the layer's own limit
/// ended the request (`layers_own`).
#[inline]
pub(crate) fn returning(info: &mut RetryInfo, layers_own: bool) {
    if !layers_own {
        info.set_returned_last();
    }
}

pub(crate) mod hedge;

#[cfg(test)]
mod tests;
