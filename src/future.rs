//! [`ResponseFuture`]: the attempt / wait / re-ready state machine.
//!
//! ```text
//!   call ──► Attempt ──outcome──► decide ──return──► Done
//!               ▲                 │   ▲ │
//!               │           retry │   │ └─body still held──► Releasing
//!               │                 ▼   └───────released──────────┘
//!           Readying ◄──timer── Waiting
//! ```
//!
//! One timer serves every state: during an attempt it fires at the attempt timeout or the
//! deadline, whichever is first; while the transport still holds the last attempt's body
//! it bounds the wait for its release; while waiting it is the backoff; while re-readying
//! the service it is the deadline. Nothing is boxed on the way to a first-attempt success (the
//! state only retries use is boxed when the first retry is considered) and no task is
//! spawned: dropping the future drops the attempt in flight and sends nothing more.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::{Duration, SystemTime};

use http::{HeaderValue, Request, Response};
use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep, sleep_until};
use tower::BoxError;
use tower_service::Service;

use crate::backoff::JitterRng;
use crate::classify::{Classification, Outcome};
use crate::error::{AttemptTimedOut, DeadlineExceeded};
use crate::head::Head;
use crate::info::{RetryInfo, RetryRecord, StopReason};
use crate::layer::{Config, PolicyRef};
use crate::policy::RetryPolicy;
use crate::replay::{NotReplayable, Replay, ReplayBody};
use crate::service::Prototype;
use crate::trace::Trace;

pin_project! {
    /// The response future of [`Retry`](crate::Retry).
    #[must_use = "futures do nothing unless you `.await` or poll them"]
    pub struct ResponseFuture<S, B>
    where
        S: Service<Request<ReplayBody<B>>>,
    {
        #[pin]
        state: State<S::Future>,
        #[pin]
        timer: Option<Sleep>,
        // Whether `timer` means anything in the current state.
        armed: bool,
        attempts: Attempts,
        retrying: Option<Retrying<S, B>>,
        // The outcome kept while waiting for the transport to let go of the body.
        held: Option<Result<S::Response, BoxError>>,
        trace: Trace,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F> {
        Attempt { #[pin] future: F },
        Releasing,
        Waiting,
        Readying,
        Done,
    }
}

/// Limits and the running record, for every request, retried or not.
#[derive(Debug)]
pub(crate) struct Attempts {
    /// When the deadline passes, and the configured deadline.
    deadline: Option<(Instant, Duration)>,
    attempt_timeout: Option<Duration>,
    info: RetryInfo,
}

impl Attempts {
    pub(crate) fn start(policy: &RetryPolicy) -> Self {
        let deadline = policy
            .deadline
            .and_then(|d| Instant::now().checked_add(d).map(|at| (at, d)));
        Self {
            deadline,
            attempt_timeout: policy.attempt_timeout,
            info: RetryInfo {
                attempts: 1,
                ..RetryInfo::default()
            },
        }
    }

    /// When the current attempt must end, if ever.
    fn attempt_end(&self) -> Option<Instant> {
        let timeout = self
            .attempt_timeout
            .and_then(|t| Instant::now().checked_add(t));
        match (timeout, self.deadline) {
            (Some(t), Some((d, _))) => Some(t.min(d)),
            (t, d) => t.or(d.map(|(at, _)| at)),
        }
    }

    /// The error for a timer that fired during an attempt or while re-readying.
    fn expired(&self) -> BoxError {
        match self.deadline {
            Some((at, deadline)) if Instant::now() >= at => {
                Box::new(DeadlineExceeded::new(deadline, self.info.attempts))
            }
            _ => Box::new(AttemptTimedOut::new(
                self.attempt_timeout.unwrap_or_default(),
                self.info.attempts,
            )),
        }
    }
}

/// What a request that may be retried keeps between attempts.
pub(crate) struct Retrying<S, B> {
    prototype: Prototype<S>,
    head: Head,
    replay: Replay<B>,
    config: Arc<Config>,
    policy: PolicyRef,
    /// What only retries use, boxed when the first retry is considered: most requests
    /// succeed at once, and a clone of a client (hundreds of bytes for hyper-util's) would
    /// make every response future that much larger.
    later: Option<Box<Later<S>>>,
}

/// The retry-only part of [`Retrying`].
struct Later<S> {
    /// The inner service for retries, cloned from the prototype before the first retry.
    service: Option<S>,
    rng: JitterRng,
    /// The previous backoff, for decorrelated jitter.
    previous: Duration,
}

enum Step {
    Return,
    Retry(Duration),
    /// Worth a retry, but the transport still holds the last attempt's body: wait for it
    /// to be dropped, then decide again.
    AwaitRelease,
}

/// How long to wait for a transport to drop the last attempt's body when neither a
/// deadline nor an attempt timeout bounds it. hyper drops it within moments of failing the
/// response future (its connection task or body pipe notices the failure on its next
/// poll); this is the margin for a loaded runtime.
const RELEASE_GRACE: Duration = Duration::from_secs(1);

impl<S, B> ResponseFuture<S, B>
where
    S: Service<Request<ReplayBody<B>>>,
{
    /// A request that is sent once.
    pub(crate) fn once(future: S::Future, mut attempts: Attempts, trace: Trace) -> Self {
        attempts.info.stop = StopReason::Disabled;
        let end = attempts.attempt_end();
        Self {
            state: State::Attempt { future },
            timer: end.map(sleep_until),
            armed: end.is_some(),
            attempts,
            retrying: None,
            held: None,
            trace,
        }
    }

    /// A request that may be retried.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn retrying(
        future: S::Future,
        mut attempts: Attempts,
        prototype: Prototype<S>,
        head: Head,
        key: Option<HeaderValue>,
        replay: Replay<B>,
        config: Arc<Config>,
        policy: PolicyRef,
        trace: Trace,
    ) -> Self {
        attempts.info.idempotency_key = key;
        let end = attempts.attempt_end();
        Self {
            state: State::Attempt { future },
            timer: end.map(sleep_until),
            armed: end.is_some(),
            attempts,
            retrying: Some(Retrying {
                prototype,
                head,
                replay,
                config,
                policy,
                later: None,
            }),
            held: None,
            trace,
        }
    }
}

/// How late a tokio timer may fire: it rounds deadlines up to the next millisecond.
const TIMER_SLACK: Duration = Duration::from_millis(1);

/// The instant `wait` from now; a wait too long to represent ends in about thirty years,
/// which is "never" for a request but still a wait, not none.
fn instant_after(wait: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(wait)
        .or_else(|| now.checked_add(Duration::from_secs(86_400 * 365 * 30)))
        .unwrap_or(now)
}

/// Points the timer at `at`, reusing the one already there.
fn arm(mut timer: Pin<&mut Option<Sleep>>, armed: &mut bool, at: Option<Instant>) {
    *armed = at.is_some();
    if let Some(at) = at {
        match timer.as_mut().as_pin_mut() {
            Some(sleep) => sleep.reset(at),
            None => timer.set(Some(sleep_until(at))),
        }
    }
}

/// Ends the future with the error of a timer that fired while re-readying: the deadline.
fn give_up<F>(mut state: Pin<&mut State<F>>, attempts: &Attempts, trace: &Trace) -> BoxError {
    state.set(State::Done);
    let error = attempts.expired();
    trace.deadline(&*error);
    error
}

fn timer_fired(timer: Pin<&mut Option<Sleep>>, armed: bool, cx: &mut Context<'_>) -> bool {
    armed
        && timer
            .as_pin_mut()
            .is_some_and(|sleep| sleep.poll(cx).is_ready())
}

impl<S, B, RB> Future for ResponseFuture<S, B>
where
    S: Service<Request<ReplayBody<B>>, Response = Response<RB>> + Clone,
    S::Error: Into<BoxError>,
    B: http_body::Body + Unpin,
{
    type Output = Result<Response<RB>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        let _entered = this.trace.enter();
        loop {
            let (result, step) = match this.state.as_mut().project() {
                StateProj::Attempt { future } => {
                    let result = match future.poll(cx) {
                        Poll::Ready(result) => result.map_err(Into::into),
                        Poll::Pending => {
                            if !timer_fired(this.timer.as_mut(), *this.armed, cx) {
                                return Poll::Pending;
                            }
                            let error = this.attempts.expired();
                            if error.is::<DeadlineExceeded>() {
                                this.state.set(State::Done);
                                this.trace.deadline(&*error);
                                return Poll::Ready(Err(error));
                            }
                            Err(error)
                        }
                    };
                    // Drop the attempt (and the body it may hold) before judging it.
                    this.state.set(State::Done);
                    let step = match this.retrying.as_mut() {
                        Some(retrying) => decide(retrying, this.attempts, &result, true),
                        None => Step::Return,
                    };
                    (result, step)
                }
                StateProj::Releasing => {
                    let retrying = this
                        .retrying
                        .as_mut()
                        .expect("only requests that may be retried wait for their body");
                    let responded = matches!(this.held, Some(Ok(_)));
                    match retrying.replay.poll_released(cx, responded) {
                        Poll::Ready(_) => {
                            let result = this.held.take().expect("an outcome is held");
                            this.state.set(State::Done);
                            // Decided anew: time has passed, and the body's state changed.
                            let step = decide(retrying, this.attempts, &result, false);
                            (result, step)
                        }
                        Poll::Pending => {
                            if !timer_fired(this.timer.as_mut(), *this.armed, cx) {
                                return Poll::Pending;
                            }
                            let result = this.held.take().expect("an outcome is held");
                            this.state.set(State::Done);
                            let past_deadline = this
                                .attempts
                                .deadline
                                .is_some_and(|(at, _)| Instant::now() >= at);
                            this.attempts.info.stop = if past_deadline {
                                StopReason::Deadline
                            } else {
                                StopReason::BodyNotReplayable
                            };
                            (result, Step::Return)
                        }
                    }
                }
                StateProj::Waiting => {
                    if let Some(sleep) = this.timer.as_mut().as_pin_mut() {
                        if *this.armed {
                            ready!(sleep.poll(cx));
                        }
                    }
                    let deadline = this.attempts.deadline.map(|(at, _)| at);
                    arm(this.timer.as_mut(), this.armed, deadline);
                    this.state.set(State::Readying);
                    continue;
                }
                StateProj::Readying => {
                    let retrying = this
                        .retrying
                        .as_mut()
                        .expect("only requests that may be retried wait");
                    let prototype = &retrying.prototype;
                    let service = retrying
                        .later
                        .as_mut()
                        .expect("a retry was decided")
                        .service
                        .get_or_insert_with(|| prototype.make());
                    match service.poll_ready(cx) {
                        Poll::Ready(Ok(())) => {}
                        Poll::Ready(Err(error)) => {
                            this.state.set(State::Done);
                            return Poll::Ready(Err(error.into()));
                        }
                        Poll::Pending => {
                            if timer_fired(this.timer.as_mut(), *this.armed, cx) {
                                return Poll::Ready(Err(give_up(
                                    this.state,
                                    this.attempts,
                                    this.trace,
                                )));
                            }
                            return Poll::Pending;
                        }
                    }
                    if let Some((at, _)) = this.attempts.deadline {
                        if Instant::now() >= at {
                            // Readiness took the time that was left: send nothing.
                            return Poll::Ready(Err(give_up(
                                this.state,
                                this.attempts,
                                this.trace,
                            )));
                        }
                    }
                    this.attempts.info.attempts += 1;
                    let attempt = this.attempts.info.attempts;
                    let mut head = retrying.head.to_parts();
                    if let Some(name) = &retrying.config.attempt_header {
                        head.headers
                            .insert(name.clone(), HeaderValue::from(attempt));
                    }
                    let request = Request::from_parts(head, retrying.replay.body());
                    let future = service.call(request);
                    let end = this.attempts.attempt_end();
                    arm(this.timer.as_mut(), this.armed, end);
                    this.state.set(State::Attempt { future });
                    continue;
                }
                StateProj::Done => panic!("ResponseFuture polled after completion"),
            };
            match step {
                Step::Return => {
                    let info = std::mem::take(&mut this.attempts.info);
                    this.trace
                        .finish(&info, result.as_ref().err().map(|e| &**e));
                    return Poll::Ready(result.map(|mut response| {
                        response.extensions_mut().insert(info);
                        response
                    }));
                }
                Step::AwaitRelease => {
                    let bound = this.attempts.deadline.map(|(at, _)| at).unwrap_or_else(|| {
                        instant_after(this.attempts.attempt_timeout.unwrap_or(RELEASE_GRACE))
                    });
                    arm(this.timer.as_mut(), this.armed, Some(bound));
                    *this.held = Some(result);
                    this.state.set(State::Releasing);
                }
                Step::Retry(wait) => {
                    let info = &this.attempts.info;
                    if let Some(record) = info.retries.last() {
                        this.trace.retry(
                            info.attempts,
                            record,
                            result.as_ref().err().map(|e| &**e),
                        );
                    }
                    drop(result);
                    arm(this.timer.as_mut(), this.armed, Some(instant_after(wait)));
                    this.state.set(State::Waiting);
                }
            }
        }
    }
}

/// Judges one outcome: return it, or retry after a wait. Records the decision in `info`.
/// `may_wait` is false when the decision is taken again after waiting for the body's
/// release: a body still held then is not replayable.
fn decide<S, B, RB>(
    retrying: &mut Retrying<S, B>,
    attempts: &mut Attempts,
    result: &Result<Response<RB>, BoxError>,
    may_wait: bool,
) -> Step {
    let info = &mut attempts.info;
    let stop = |info: &mut RetryInfo, reason: StopReason| {
        info.stop = reason;
        Step::Return
    };
    let config = &*retrying.config;
    let policy = retrying.policy.get(config);

    let outcome = match result {
        Ok(response) => Outcome::Response {
            status: response.status(),
            headers: response.headers(),
        },
        Err(error) => {
            if retrying.replay.body_failed() {
                // The caller's own body failed: theirs to handle.
                return stop(info, StopReason::Final);
            }
            Outcome::Error(&**error)
        }
    };
    let reason = match policy.classify(&retrying.head, outcome) {
        Classification::Done => return stop(info, StopReason::Final),
        Classification::Retry(reason) => reason,
        Classification::RetryOnce(reason) => {
            if info.retries.iter().any(|r| r.reason == reason) {
                return stop(info, StopReason::Final);
            }
            reason
        }
    };
    // DESIGN 1.1: an idempotent method, or a key (stamped or the caller's), or a failure
    // that proves the server never saw the request.
    // A policy may also declare its requests repeatable whatever the method.
    let may_repeat = retrying.head.method().is_idempotent()
        || info.idempotency_key.is_some()
        || policy.assume_idempotent;
    if !may_repeat && !reason.request_not_processed() {
        return stop(info, StopReason::NotIdempotent);
    }
    if info.attempts >= policy.max_attempts {
        return stop(info, StopReason::MaxAttempts);
    }
    match retrying.replay.check(result.is_ok()) {
        Ok(()) => {}
        // The transport has not dropped the last attempt's body yet (hyper does that in its
        // connection task or body pipe, after failing the response future).
        Err(NotReplayable::InFlight) if may_wait => return Step::AwaitRelease,
        Err(_) => return stop(info, StopReason::BodyNotReplayable),
    }

    let n = u32::try_from(info.retries.len() + 1).unwrap_or(u32::MAX);
    // The generator of a first retry is boxed only if the retry goes ahead.
    let mut fresh = None;
    let backoff = match retrying.later.as_deref_mut() {
        Some(later) => later.rng.draw(&policy.backoff, n, later.previous),
        None => fresh
            .insert(policy.jitter_rng())
            .draw(&policy.backoff, n, policy.backoff.base()),
    };
    let hint = match result {
        Ok(response) => retry_after_hint(response),
        Err(_) => None,
    };
    if hint.is_some_and(|hint| hint > policy.max_retry_after) {
        return stop(info, StopReason::RetryAfterTooLong);
    }
    let wait = hint.map_or(backoff, |hint| hint.max(backoff));
    let from_hint = hint.is_some_and(|hint| hint > backoff);
    if let Some((at, _)) = attempts.deadline {
        // Timers fire on whole milliseconds, so a wait may end up to 1 ms late: a wait that
        // would end within that of the deadline leaves no time for an attempt.
        let ends = Instant::now()
            .checked_add(wait)
            .and_then(|ends| ends.checked_add(TIMER_SLACK));
        if ends.is_none_or(|ends| ends >= at) {
            let reason = if from_hint {
                StopReason::RetryAfterTooLong
            } else {
                StopReason::Deadline
            };
            return stop(info, reason);
        }
    }
    if let Some(budget) = config.budget_for(policy) {
        if !budget.withdraw() {
            info.budget_exhausted = true;
            crate::trace::budget_refused(info.attempts, &reason);
            return stop(info, StopReason::BudgetExhausted);
        }
    }

    match retrying.later.as_deref_mut() {
        Some(later) => later.previous = backoff,
        None => {
            retrying.later = Some(Box::new(Later {
                service: None,
                // Always the one drawn from above: `later` was empty then too.
                rng: fresh.unwrap_or_else(|| policy.jitter_rng()),
                previous: backoff,
            }));
        }
    }
    info.total_wait = info.total_wait.saturating_add(wait);
    let record = RetryRecord {
        reason,
        wait,
        retry_after: from_hint,
    };
    crate::trace::retried(&record);
    info.retries.push(record);
    Step::Retry(wait)
}

fn retry_after_hint<RB>(response: &Response<RB>) -> Option<Duration> {
    let value = response.headers().get(http::header::RETRY_AFTER)?;
    let date = response.headers().get(http::header::DATE);
    crate::retry_after::parse(value, date, SystemTime::now())
}

impl<S, B> std::fmt::Debug for ResponseFuture<S, B>
where
    S: Service<Request<ReplayBody<B>>>,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match &self.state {
            State::Attempt { .. } => "attempt",
            State::Releasing => "releasing",
            State::Waiting => "waiting",
            State::Readying => "readying",
            State::Done => "done",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .field("info", &self.attempts.info)
            .finish()
    }
}
