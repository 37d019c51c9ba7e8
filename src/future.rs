//! [`ResponseFuture`]: drives attempts, timers and readiness; the decisions are made in
//! plain code elsewhere in the crate.
//!
//! A request that may be retried goes through these states; one that is sent once only
//! through the first:
//!
//! ```text
//!   call ──► Attempt ──outcome──► retry? ──no──► finished
//!               ▲                  │    ▲
//!               │             yes  │    │ released (decided anew)
//!               │                  ▼    │
//!               │   body still held by the transport ──► Releasing
//!               │                  │
//!           Readying ◄── timer ── Waiting
//! ```
//!
//! One timer serves every state: during an attempt it fires at the attempt timeout or the
//! deadline, whichever is first; while the transport still holds the last attempt's body
//! and while the retry's service gets ready, at the deadline, else the attempt timeout;
//! while waiting, at the end of the backoff. Every outcome leaves through one place, which
//! finishes the record and the trace. Nothing is boxed on the way to a first-attempt
//! success, and no task is spawned: dropping the future drops the attempt in flight and
//! sends nothing more.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};
use std::time::{Duration, SystemTime};

use http::{HeaderValue, Request, Response};
use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep, sleep_until};
use tower::BoxError;
use tower_service::Service;

use crate::backoff::JitterRng;
use crate::classify::{Classification, Outcome};
use crate::config::Plan;
use crate::decision::{self, Judgement, Limits, RELEASE_GRACE, Schedule};
use crate::error::{DeadlineExceeded, RetryError};
use crate::head::Head;
use crate::hints::{Hint, HintSource};
use crate::info::{Attempt, RetryInfo, StopReason};
use crate::replay::{NotReplayable, Replay, ReplayBody};
use crate::trace::Trace;

pin_project! {
    /// The response future of [`Retry`](crate::Retry).
    ///
    /// Generic over the inner service's future `F` (as tower's `Timeout` future is), its
    /// service `S`, the caller's body `B` and the response `R`, and naming none of their
    /// associated types, so that a client made with the layer can be driven from inside
    /// `tokio::spawn` wherever the bare client can.
    #[must_use = "futures do nothing unless polled"]
    pub struct ResponseFuture<F, S, B, R> {
        #[pin]
        state: State<F, R>,
        #[pin]
        timer: Option<Sleep>,
        // Whether `timer` means anything in the current state.
        armed: bool,
        limits: Limits,
        info: RetryInfo,
        retrying: Option<Retrying<S, B>>,
        trace: Trace,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F, R> {
        Attempt { #[pin] future: F },
        // The outcome is kept while waiting for the transport to let go of the body (in the
        // state, not beside it: the attempt's future and it are never there together).
        Releasing { held: Option<Result<R, BoxError>> },
        Waiting,
        Readying,
        Done,
    }
}

/// The copy of the inner service that retries clone from. Behind a `Mutex` so that the
/// response future stays `Send` for services that are `Send` but not `Sync` (tower's
/// `BoxCloneService`); it is locked only to clone, when a first retry is decided.
pub(crate) struct Prototype<S>(Arc<Mutex<S>>);

impl<S> Clone for Prototype<S> {
    fn clone(&self) -> Self {
        Prototype(Arc::clone(&self.0))
    }
}

impl<S: Clone> Prototype<S> {
    pub(crate) fn new(service: &S) -> Self {
        Prototype(Arc::new(Mutex::new(service.clone())))
    }

    /// A fresh clone of the inner service.
    fn make(&self) -> S {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }
}

/// What a request that may be retried keeps between attempts.
pub(crate) struct Retrying<S, B> {
    pub(crate) prototype: Prototype<S>,
    pub(crate) head: Head,
    pub(crate) replay: Replay<B>,
    /// The request's policy, resolved once when it was called.
    pub(crate) plan: Arc<Plan>,
    /// What only retries use, boxed when the first retry goes ahead: most requests succeed
    /// at once, and a clone of a client (hundreds of bytes for hyper-util's) would make
    /// every response future that much larger.
    later: Option<Box<Later<S>>>,
}

impl<S, B> Retrying<S, B> {
    pub(crate) fn new(
        prototype: Prototype<S>,
        head: Head,
        replay: Replay<B>,
        plan: Arc<Plan>,
    ) -> Self {
        Self {
            prototype,
            head,
            replay,
            plan,
            later: None,
        }
    }
}

/// The retry-only part of [`Retrying`].
struct Later<S> {
    /// The inner service for retries, cloned from the prototype before the first retry.
    service: Option<S>,
    rng: JitterRng,
    /// The previous wait actually slept, for decorrelated jitter.
    previous: Duration,
    /// Retries before the last gRPC pushback: the backoff counts from there.
    offset: usize,
}

/// What the driver does after an outcome.
enum Next {
    Finish,
    Wait(Duration),
    /// Worth a retry, but the transport still holds the last attempt's body: wait for it
    /// to be dropped, then decide again.
    AwaitRelease,
}

impl<F, S, B, R> ResponseFuture<F, S, B, R> {
    /// Starts the future on the first attempt. `retrying` is `None` for a request that is
    /// sent once.
    pub(crate) fn new(
        future: F,
        limits: Limits,
        info: RetryInfo,
        retrying: Option<Retrying<S, B>>,
        trace: Trace,
    ) -> Self {
        // Most requests have no time limit: no clock read for them.
        let end = match limits.bounds_attempts() {
            true => limits.attempt_end(Instant::now()),
            false => None,
        };
        Self {
            state: State::Attempt { future },
            timer: end.map(sleep_until),
            armed: end.is_some(),
            limits,
            info,
            retrying,
            trace,
        }
    }
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

fn timer_fired(timer: Pin<&mut Option<Sleep>>, armed: bool, cx: &mut Context<'_>) -> bool {
    armed
        && timer
            .as_pin_mut()
            .is_some_and(|sleep| sleep.poll(cx).is_ready())
}

impl<F, S, B, RB, E> Future for ResponseFuture<F, S, B, Response<RB>>
where
    F: Future<Output = Result<Response<RB>, E>>,
    E: Into<BoxError>,
    S: Service<Request<ReplayBody<B>>, Response = Response<RB>, Error = E, Future = F> + Clone,
    B: http_body::Body + Unpin,
{
    type Output = Result<Response<RB>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        let _entered = this.trace.enter();
        loop {
            let (result, next) = match this.state.as_mut().project() {
                StateProj::Attempt { future } => {
                    let result = match future.poll(cx) {
                        Poll::Ready(result) => result.map_err(Into::into),
                        Poll::Pending => {
                            if !timer_fired(this.timer.as_mut(), *this.armed, cx) {
                                return Poll::Pending;
                            }
                            Err(this.limits.expired(Instant::now(), this.info.attempts))
                        }
                    };
                    // Drop the attempt (and the body it may hold) before judging it.
                    this.state.set(State::Done);
                    let next = match this.retrying.as_mut() {
                        Some(_) if is_deadline(&result) => {
                            decision::record_stop(this.info, StopReason::Deadline);
                            Next::Finish
                        }
                        Some(retrying) => decide(retrying, this.limits, this.info, &result, true),
                        None => Next::Finish,
                    };
                    (result, next)
                }
                StateProj::Releasing { held } => {
                    let retrying = this
                        .retrying
                        .as_mut()
                        .expect("only retries wait for a body");
                    let responded = matches!(held, Some(Ok(_)));
                    let released = retrying.replay.poll_released(cx, responded).is_ready();
                    if !released && !timer_fired(this.timer.as_mut(), *this.armed, cx) {
                        return Poll::Pending;
                    }
                    let result = held.take().expect("an outcome is held");
                    this.state.set(State::Done);
                    let next = if released {
                        // Decided anew: time has passed, and the body's state changed.
                        decide(retrying, this.limits, this.info, &result, false)
                    } else {
                        let stop = if this.limits.past_deadline(Instant::now()) {
                            StopReason::Deadline
                        } else {
                            StopReason::BodyNotReplayable
                        };
                        decision::record_stop(this.info, stop);
                        Next::Finish
                    };
                    (result, next)
                }
                StateProj::Waiting => {
                    if *this.armed {
                        if let Some(sleep) = this.timer.as_mut().as_pin_mut() {
                            ready!(sleep.poll(cx));
                        }
                    }
                    let end = this.limits.wait_end(Instant::now(), None);
                    arm(this.timer.as_mut(), this.armed, end);
                    this.state.set(State::Readying);
                    continue;
                }
                StateProj::Readying => {
                    let retrying = this.retrying.as_mut().expect("only retries get ready");
                    let prototype = &retrying.prototype;
                    let later = retrying.later.as_mut().expect("a retry was decided");
                    let service = later.service.get_or_insert_with(|| prototype.make());
                    let ready = match service.poll_ready(cx) {
                        Poll::Ready(ready) => ready.map_err(Into::into),
                        Poll::Pending => {
                            if !timer_fired(this.timer.as_mut(), *this.armed, cx) {
                                return Poll::Pending;
                            }
                            Err(this.limits.expired(Instant::now(), this.info.attempts))
                        }
                    };
                    let now = Instant::now();
                    match ready {
                        // Readiness took the time that was left: send nothing.
                        Ok(()) if this.limits.past_deadline(now) => {
                            decision::record_stop(this.info, StopReason::Deadline);
                            (
                                Err(this.limits.expired(now, this.info.attempts)),
                                Next::Finish,
                            )
                        }
                        Ok(()) => {
                            this.info.attempts += 1;
                            let attempt = this.info.attempts;
                            let mut head = retrying.head.to_parts();
                            if let Some(name) = &retrying.plan.attempt_header {
                                head.headers
                                    .insert(name.clone(), HeaderValue::from(attempt));
                            }
                            head.extensions.insert(Attempt::new(attempt));
                            #[cfg(feature = "grpc")]
                            if retrying.plan.policy.grpc_codes.is_some() {
                                // A6: transparent retries are not attempts here.
                                let counted =
                                    decision::counted_attempts(attempt, &this.info.retries);
                                crate::grpc::set_previous_rpc_attempts(
                                    &mut head.headers,
                                    counted - 1,
                                );
                                if let Some(deadline) = this.limits.deadline() {
                                    crate::grpc::set_grpc_timeout(
                                        &mut head.headers,
                                        deadline.saturating_duration_since(now),
                                    );
                                }
                            }
                            let request = Request::from_parts(head, retrying.replay.body());
                            let future = service.call(request);
                            arm(
                                this.timer.as_mut(),
                                this.armed,
                                this.limits.attempt_end(now),
                            );
                            this.state.set(State::Attempt { future });
                            continue;
                        }
                        Err(error) => {
                            if this.limits.past_deadline(now) {
                                decision::record_stop(this.info, StopReason::Deadline);
                            }
                            (Err(error), Next::Finish)
                        }
                    }
                }
                StateProj::Done => panic!("ResponseFuture polled after completion"),
            };
            match next {
                Next::Finish => return Poll::Ready(finish(this.info, this.trace, result)),
                Next::AwaitRelease => {
                    let end = this.limits.wait_end(Instant::now(), Some(RELEASE_GRACE));
                    arm(this.timer.as_mut(), this.armed, end);
                    this.state.set(State::Releasing { held: Some(result) });
                }
                Next::Wait(wait) => {
                    if let Some(record) = this.info.retries.last() {
                        let error = result.as_ref().err().map(|e| &**e);
                        this.trace.retry(this.info.attempts, record, error);
                    }
                    drop(result);
                    let now = Instant::now();
                    if wait.is_zero() {
                        // No wait: straight to readiness, without a timer tick in between.
                        arm(
                            this.timer.as_mut(),
                            this.armed,
                            this.limits.wait_end(now, None),
                        );
                        this.state.set(State::Readying);
                    } else {
                        arm(
                            this.timer.as_mut(),
                            this.armed,
                            Some(decision::after(now, wait)),
                        );
                        this.state.set(State::Waiting);
                    }
                }
            }
        }
    }
}

/// True for this layer's own deadline error.
fn is_deadline<R>(result: &Result<R, BoxError>) -> bool {
    result
        .as_ref()
        .err()
        .is_some_and(|e| e.is::<DeadlineExceeded>())
}

/// The one way out: the record goes into the response's extensions, or into the error.
fn finish<RB>(
    info: &mut RetryInfo,
    trace: &Trace,
    result: Result<Response<RB>, BoxError>,
) -> Result<Response<RB>, BoxError> {
    let info = std::mem::take(info);
    match result {
        Ok(mut response) => {
            trace.finish(&info, None);
            response.extensions_mut().insert(info);
            Ok(response)
        }
        Err(error) => {
            if error.is::<DeadlineExceeded>() {
                trace.deadline(&*error);
            }
            trace.finish(&info, Some(&*error));
            Err(Box::new(RetryError::new(info, error)))
        }
    }
}

/// Gathers the facts of one outcome, has the decision made, and books it. `may_wait` is
/// false when the decision is taken again after waiting for the body's release: a body
/// still held then is not replayable.
fn decide<S, B, RB>(
    retrying: &mut Retrying<S, B>,
    limits: &Limits,
    info: &mut RetryInfo,
    result: &Result<Response<RB>, BoxError>,
    may_wait: bool,
) -> Next {
    let stop = |info: &mut RetryInfo, reason| {
        decision::record_stop(info, reason);
        Next::Finish
    };
    let plan = &*retrying.plan;
    let policy = &plan.policy;
    // The common case, a success under the default classification, is settled at once.
    if plan.plain_success(result) {
        return stop(info, StopReason::Final);
    }
    let outcome = match result {
        Ok(response) => Outcome::Response {
            status: response.status(),
            headers: response.headers(),
        },
        // The caller's own body failed: theirs to handle.
        Err(_) if retrying.replay.body_failed() => return stop(info, StopReason::Final),
        Err(error) => Outcome::Error(&**error),
    };
    let verdict = policy.classify(&retrying.head, outcome);
    let judgement = Judgement {
        verdict,
        may_repeat: retrying.head.method().is_idempotent()
            || info.idempotency_key.is_some()
            || policy.assume_idempotent,
        attempts: info.attempts,
        max_attempts: policy.max_attempts,
        previous: &info.retries,
        // The clock is read only for an error under a deadline.
        failed_after_deadline: result.is_err()
            && limits.deadline().is_some()
            && limits.past_deadline(Instant::now()),
    };
    // A6: a stream refused before it left is sent again at once, outside the count.
    let transparent = decision::transparent(policy.transparent_retries(), verdict, &info.retries);
    // The server's application never saw a transparently retried stream: nothing for the
    // throttle. The throttle hears of an outcome once, not again after the body's release.
    #[cfg(feature = "grpc")]
    let grpc = match transparent {
        Some(_) => Ok(None),
        None => grpc_gate(plan, result, verdict, may_wait),
    };
    let reason = match transparent.map_or_else(|| decision::judge(&judgement), Ok) {
        Ok(reason) => reason,
        Err(reason) => return stop(info, reason),
    };
    #[cfg(feature = "grpc")]
    let pushback = match grpc {
        Ok(pushback) => pushback,
        Err(reason) => return stop(info, reason),
    };
    #[cfg(not(feature = "grpc"))]
    let pushback: Option<Duration> = None;
    match retrying.replay.check(result.is_ok()) {
        Ok(()) => {}
        // The transport has not dropped the last attempt's body yet (hyper does that in its
        // connection task or body pipe, after failing the response future).
        Err(NotReplayable::InFlight) if may_wait => return Next::AwaitRelease,
        Err(_) => return stop(info, StopReason::BodyNotReplayable),
    }

    let offset = retrying.later.as_ref().map_or(0, |later| later.offset);
    let n = decision::backoff_number(&info.retries, offset);
    // The generator of a first retry is boxed only if the retry goes ahead.
    let mut fresh = None;
    let backoff = match retrying.later.as_deref_mut() {
        _ if transparent.is_some() => Duration::ZERO,
        Some(later) => later.rng.draw(&policy.backoff, n, later.previous),
        None => fresh
            .insert(policy.jitter_rng())
            .draw(&policy.backoff, n, policy.backoff.base()),
    };
    // The classifier's own hint first; else the server's (Retry-After, then the longest
    // of the RateLimit fields and X-RateLimit-Reset).
    let hint = match (verdict, result) {
        _ if pushback.is_some() => pushback.map(|wait| Hint::new(wait, HintSource::GrpcPushback)),
        (Classification::RetryWithHint(_, wait), _) => {
            Some(Hint::new(wait, HintSource::Classifier))
        }
        (_, Ok(response)) => crate::hints::server_hint(response.headers(), SystemTime::now()),
        (_, Err(_)) => None,
    };
    let schedule = Schedule {
        reason,
        backoff,
        hint,
        max_hint: policy.max_retry_after,
        exact: pushback.is_some(),
        now: Instant::now(),
        deadline: limits.deadline(),
        transparent: transparent.is_some(),
    };
    let withdraw = || plan.budget.as_ref().is_none_or(|budget| budget.withdraw());
    let record = match decision::schedule(&schedule, withdraw) {
        Ok(record) => record,
        Err(reason) => {
            if reason == StopReason::BudgetExhausted {
                crate::trace::budget_refused(info.attempts, &schedule.reason);
            }
            return stop(info, reason);
        }
    };
    // After a pushback the backoff starts again from the first retry's.
    let offset = if pushback.is_some() {
        info.retries.len() + 1
    } else {
        offset
    };
    // A transparent retry's zero wait is no backoff: decorrelated jitter goes on from the
    // wait before it (the base before any).
    match retrying.later.as_deref_mut() {
        Some(later) => {
            if !record.transparent {
                later.previous = record.wait;
            }
            later.offset = offset;
        }
        None => {
            retrying.later = Some(Box::new(Later {
                service: None,
                // The one drawn from above, if any: `later` was empty then too.
                rng: fresh.unwrap_or_else(|| policy.jitter_rng()),
                previous: match record.transparent {
                    true => policy.backoff.base(),
                    false => record.wait,
                },
                offset,
            }));
        }
    }
    crate::trace::retried(&record);
    decision::record_retry(info, record);
    Next::Wait(record.wait)
}

/// gRPC's throttle and pushback for one outcome of a gRPC policy (A6): a success (an OK or
/// committed response) refills the throttle; a retryable failure drains it, and a retry is
/// refused once it is at half or below; `grpc-retry-pushback-ms` gives the exact wait, or
/// says stop. `Ok(None)` when neither applies. `first` is false when the outcome is
/// decided again after the body's release: the throttle has counted it already, and its
/// verdict then stands.
#[cfg(feature = "grpc")]
fn grpc_gate<RB>(
    plan: &Plan,
    result: &Result<Response<RB>, BoxError>,
    verdict: Classification,
    first: bool,
) -> Result<Option<Duration>, StopReason> {
    use crate::grpc::Pushback;
    if plan.policy.grpc_codes.is_none() {
        return Ok(None);
    }
    let headers = result.as_ref().ok().map(Response::headers);
    if let Some(headers) = headers {
        let code = crate::grpc::trailers_only_code(headers);
        if matches!(code, None | Some(tonic::Code::Ok)) {
            if let Some(throttle) = &plan.throttle {
                throttle.record_success();
            }
            return Ok(None);
        }
    }
    let retryable = !matches!(verdict, Classification::Done);
    if !retryable {
        return Ok(None);
    }
    if let Some(throttle) = plan.throttle.as_ref().filter(|_| first) {
        if !throttle.record_failure() {
            return Err(StopReason::Throttled);
        }
    }
    match headers.and_then(crate::grpc::pushback) {
        Some(Pushback::Stop) => Err(StopReason::ServerPushback),
        Some(Pushback::Wait(wait)) => Ok(Some(wait)),
        None => Ok(None),
    }
}

impl<F, S, B, R> std::fmt::Debug for ResponseFuture<F, S, B, R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match &self.state {
            State::Attempt { .. } => "attempt",
            State::Releasing { .. } => "releasing",
            State::Waiting => "waiting",
            State::Readying => "readying",
            State::Done => "done",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .field("info", &self.info)
            .finish()
    }
}
