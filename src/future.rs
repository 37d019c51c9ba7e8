//! [`ResponseFuture`], the response future of [`Retry`](crate::Retry), and
//! [`ResumeFuture`], that of a `Retry<S, `[`Resume`](crate::Resume)`>`.

// The driver: it polls attempts, timers and readiness, and carries out what `decision`
// answers. A request that may be retried goes through these states; one that is sent once
// only through `Once`:
//
//   call ──► Attempt ──outcome──► decide ──return──► finish
//               ▲                  │  ▲
//               │            wait  │  │ released (decided anew)
//               │                  │  │
//               │                  │  Releasing ◄── body still held by the transport
//               │                  ▼
//           Readying ◄── timer ── Waiting
//
// Before the first attempt, a gate that paces first attempts may ask it to wait
// (`Admitting`, holding the request and the service `poll_ready` readied, until the timer
// fires; then the attempt is sent and the request goes on as above) or refuse it
// (`Refused`: nothing is sent, and the caller gets `LocallyRefused`).
//
// Each state holds its own data: the retry context (`Retrying`) while the request may
// still be retried, and, from its first retry on, the boxed `Later` (the retry's service
// and the decisions' course). One timer serves every state (hedging, with several attempts
// in flight, will need more): during an attempt it fires at the attempt timeout or the
// deadline, whichever is first; while the transport still holds the last attempt's body
// and while the retry's service gets ready, at the deadline, else the attempt timeout;
// while waiting, at the end of the wait; it is boxed when a state first needs one. Every
// outcome leaves through `finish`. Nothing but that timer is boxed on the way to a
// first-attempt success, and no task is spawned: dropping the future drops the attempt in
// flight and sends nothing more.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};

use crate::time::{Clock, Instant, Sleep};
use http::{Request, Response};
use pin_project_lite::pin_project;
use tower::BoxError;
use tower_service::Service;

use crate::classify::Outcome as Seen;
use crate::config::Plan;
use crate::decision::{self, Answer, Course, Expired, Facts, Limits, Outcome, RELEASE_GRACE};
use crate::error::{DeadlineExceeded, LocallyRefused, RetryError, ServiceNotReady};
use crate::gate::{Admitted, Ask, Gates, Own, Presence, Reserved};
use crate::head::Head;
use crate::hints::Hint;
use crate::hook::{Attempt, AttemptKind};
use crate::info::{AttemptOutcome, RetryInfo, StopReason};
use crate::replay::{BodyWatch, NotReplayable, Replay, ReplayBody};
use crate::trace::{Slot, Trace};

pub use crate::resume::ResumeFuture;

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
        state: State<F, S, B, R>,
        // The end of the current state, if it has one; boxed, so that the many requests
        // that never need one carry no timer inline.
        timer: Timer,
        limits: Limits,
        info: RetryInfo,
        trace: Trace,
    }
}

pin_project! {
    #[project = StateProj]
    #[project_replace = StateOwn]
    enum State<F, S, B, R> {
        // The one attempt of a request that is never retried; `report` tells its gates of
        // the outcome, when a gate hears outcomes and the policy is not `never()`.
        // `span`: the attempt's OpenTelemetry span (nothing without the feature).
        Once { #[pin] future: F, report: Option<Report>, span: Slot },
        // An attempt of a request that may be retried.
        Attempt {
            #[pin]
            future: F,
            retry: Retrying<S, B>,
            later: Option<Box<Later<S>>>,
            span: Slot,
        },
        // The outcome is kept while waiting for the transport to let go of the body.
        Releasing {
            held: Result<R, BoxError>,
            retry: Retrying<S, B>,
            later: Option<Box<Later<S>>>,
        },
        Waiting { retry: Retrying<S, B>, later: Box<Later<S>> },
        Readying { retry: Retrying<S, B>, later: Box<Later<S>> },
        // A hedged request: its attempts, all boxed, in flight together.
        Hedged { flight: Box<hedge::Flight<F, S, B, R>> },
        // A first attempt a gate asked to wait, held until the timer fires.
        Admitting { held: Box<Held<S, B>> },
        // A first attempt the gates refused (or whose wait the deadline leaves no time
        // for): nothing is sent.
        Refused { stop: StopReason },
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
    pub(crate) fn make(&self) -> S {
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
    /// The request's own gates, when it needs any.
    pub(crate) own: Option<Box<Own>>,
    /// Whether any retryable outcome may be retried, else only one the server never saw
    /// ([`decision::repeat`]).
    pub(crate) any_outcome: bool,
}

impl<S, B> Retrying<S, B> {
    /// How the classifier sees an attempt's outcome; `None` when the caller's own request
    /// body failed, whose error is returned as it is, unclassified.
    fn seen<'a, RB>(&self, result: &'a Result<Response<RB>, BoxError>) -> Option<Seen<'a>> {
        match result {
            Ok(response) => Some(Seen::Response {
                status: response.status(),
                headers: response.headers(),
            }),
            Err(_) if self.replay.body_failed() => None,
            Err(error) => Some(Seen::Error(&**error)),
        }
    }

    /// The request of a later attempt (a retry or a hedge): the head's copy numbered and
    /// run through the hooks, with the body replayed for it; its span started in `span`.
    fn attempt_request(
        &self,
        attempt: &Attempt,
        trace: &Trace,
        span: &mut Slot,
    ) -> Request<ReplayBody<B>> {
        let mut head = self.head.to_parts();
        head.extensions.insert(*attempt);
        self.plan.hooks.before_attempt(attempt, &mut head.headers);
        *span = Slot::start_parts(
            trace,
            &self.plan.log,
            attempt.number,
            attempt.kind,
            &mut head,
        );
        Request::from_parts(head, self.replay.body(attempt.number - 1))
    }
}

/// What a request sent once keeps to report its outcome to the gates that hear outcomes
/// (a throttle, a quota), under a policy of one attempt that is not `never()`: no head copy
/// but for a classifier that reads the request, no replay state.
pub(crate) struct Report {
    plan: Arc<Plan>,
    own: Option<Box<Own>>,
    /// The request's head, for a classifier that reads it.
    parts: Option<Box<http::request::Parts>>,
    /// Whether the caller's body failed: that error is the caller's, and no gate hears it.
    body: BodyWatch,
    /// Whether the outcome is told (not under `never()`, nor for a `CONNECT`).
    told: bool,
}

impl Report {
    /// The copy of `request`'s head the plan's classifier reads, if it reads one: taken
    /// before the hooks write on the first attempt, as a retried request's is.
    pub(crate) fn head<B>(plan: &Plan, request: &Request<B>) -> Option<Box<http::request::Parts>> {
        plan.policy.classifier_needs_request().then(|| {
            let mut parts = Request::new(()).into_parts().0;
            parts.method = request.method().clone();
            parts.uri = request.uri().clone();
            parts.version = request.version();
            parts.headers = request.headers().clone();
            parts.extensions = request.extensions().clone();
            Box::new(parts)
        })
    }

    pub(crate) fn new(
        plan: Arc<Plan>,
        own: Option<Box<Own>>,
        parts: Option<Box<http::request::Parts>>,
        body: BodyWatch,
        told: bool,
    ) -> Self {
        Self {
            plan,
            own,
            parts,
            body,
            told,
        }
    }

    /// Tells the gates of the one attempt's outcome, and books the reason the classifier
    /// gave it.
    fn hear<RB>(&self, result: &Result<Response<RB>, BoxError>, info: &mut RetryInfo) {
        if !self.told {
            return;
        }
        let seen = match result {
            Ok(response) => Seen::Response {
                status: response.status(),
                headers: response.headers(),
            },
            // The caller's own body failed: its error, returned as is, unclassified.
            Err(_) if self.body.failed() => return,
            Err(error) => Seen::Error(&**error),
        };
        let verdict = self.plan.policy.classify_parts(self.parts.as_deref(), seen);
        let gates = Own::gates(&self.own, &self.plan.gates);
        decision::sent_once(gates, verdict);
        decision::attempt_classified(info, verdict.reason());
    }
}

/// What a first attempt that a gate paces becomes once it is sent.
pub(crate) enum Then<S, B> {
    /// The one attempt of a request sent once.
    Once(Report),
    /// The first attempt of a request that may be retried, and whether it is hedged.
    Retrying(Retrying<S, B>, bool),
}

impl<S, B> Then<S, B> {
    pub(crate) fn plan(&self) -> &Plan {
        match self {
            Then::Once(report) => &report.plan,
            Then::Retrying(retry, _) => &retry.plan,
        }
    }

    /// The request's place in the gates that count what is in flight, if one does.
    fn presence(&mut self) -> Option<&mut Presence> {
        match self {
            Then::Once(report) => Own::presence(&mut report.own),
            Then::Retrying(retry, _) => Own::presence(&mut retry.own),
        }
    }

    /// The request's gates.
    pub(crate) fn gates(&self) -> &Gates {
        let own = match self {
            Then::Once(report) => &report.own,
            Then::Retrying(retry, _) => &retry.own,
        };
        Own::gates(own, &self.plan().gates)
    }
}

/// A first attempt a gate asked to wait: its request, the service `poll_ready` readied
/// for it (kept across the wait: tower allows a readied service to be called later, and
/// polling another clone could wait on a slot this one holds), and what the gates took for
/// it, given back if the request is dropped before it is sent.
pub(crate) struct Held<S, B> {
    service: S,
    request: Request<ReplayBody<B>>,
    then: Then<S, B>,
    reserved: Reserved,
    wait: std::time::Duration,
}

impl<S, B> Held<S, B> {
    pub(crate) fn new(
        service: S,
        request: Request<ReplayBody<B>>,
        then: Then<S, B>,
        admitted: Admitted,
    ) -> Box<Self> {
        let reserved = Reserved::new(then.gates(), admitted);
        Box::new(Held {
            service,
            request,
            then,
            reserved,
            wait: admitted.wait,
        })
    }
}

/// Sends a first attempt its gates admitted, at `now`: the hooks write on it now (the time
/// it has left is counted from now), and the attempt's state and timer start.
fn launch<F, S, B, R>(
    service: &mut S,
    mut request: Request<ReplayBody<B>>,
    mut then: Then<S, B>,
    limits: &Limits,
    trace: &Trace,
    now: Instant,
) -> (State<F, S, B, R>, Timer)
where
    S: Service<Request<ReplayBody<B>>, Future = F>,
{
    let hooks = &then.plan().hooks;
    if !hooks.is_empty() {
        let attempt = decision::first_attempt_at(limits, Some(now));
        hooks.before_attempt(&attempt, request.headers_mut());
    }
    let span = Slot::start(trace, &then.plan().log, 1, AttemptKind::First, &mut request);
    let future = service.call(request);
    if let Some(presence) = then.presence() {
        presence.started(1, Ask::First);
    }
    let timer = limits
        .attempt_end(now)
        .map(|at| then.plan().clock.sleep_until(at));
    match then {
        Then::Once(report) => (
            State::Once {
                future,
                report: Some(report),
                span,
            },
            timer,
        ),
        Then::Retrying(retry, false) => (
            State::Attempt {
                future,
                retry,
                later: None,
                span,
            },
            timer,
        ),
        Then::Retrying(retry, true) => {
            let delay = hedge_delay(&retry, now);
            let flight = hedge::Flight::new(future, span, retry, delay, limits, now);
            // Armed on the first poll.
            (State::Hedged { flight }, None)
        }
    }
}

/// The first hedging delay of a hedged request whose first attempt is sent at `now`.
fn hedge_delay<S, B>(retry: &Retrying<S, B>, now: Instant) -> Option<std::time::Duration> {
    retry
        .plan
        .hedging
        .as_ref()
        .and_then(|hedging| hedging.delay_at(retry.plan.latency().map(|r| &**r), || now))
}

/// What only retries use, boxed when the first retry goes ahead: most requests succeed at
/// once, and a clone of a client (hundreds of bytes for hyper-util's) would make every
/// response future that much larger.
struct Later<S> {
    /// The inner service for retries, cloned from the prototype for the first retry and
    /// driven to readiness before every retry.
    service: S,
    course: Course,
}

impl<F, S, B, R> ResponseFuture<F, S, B, R> {
    /// A request sent once.
    #[inline]
    pub(crate) fn once(
        future: F,
        span: Slot,
        limits: Limits,
        info: RetryInfo,
        trace: Trace,
        clock: &Clock,
    ) -> Self {
        Self {
            timer: first_timer(&limits, clock),
            state: State::Once {
                future,
                report: None,
                span,
            },
            limits,
            info,
            trace,
        }
    }

    /// A request sent once whose outcome its gates hear.
    #[inline(never)]
    pub(crate) fn reported(
        future: F,
        span: Slot,
        limits: Limits,
        info: RetryInfo,
        trace: Trace,
        report: Report,
    ) -> Self {
        Self {
            timer: first_timer(&limits, &report.plan.clock),
            state: State::Once {
                future,
                report: Some(report),
                span,
            },
            limits,
            info,
            trace,
        }
    }

    /// The first attempt of a request that may be retried.
    // Built in one place, so that the large state is written once, where it stays.
    #[inline]
    pub(crate) fn first(
        future: F,
        span: Slot,
        retry: Retrying<S, B>,
        limits: Limits,
        info: RetryInfo,
        trace: Trace,
    ) -> Self {
        Self {
            timer: first_timer(&limits, &retry.plan.clock),
            state: State::Attempt {
                future,
                retry,
                later: None,
                span,
            },
            limits,
            info,
            trace,
        }
    }
}

impl<F, S, B, R> ResponseFuture<F, S, B, R> {
    /// The first attempt of a hedged request: hedges follow every delay of the policy's
    /// hedging while no attempt has answered (with no delay known yet, only a non-fatal
    /// failure sends one). Out of line: the unhedged requests' `call` stays as it was.
    #[cold]
    #[inline(never)]
    pub(crate) fn hedged(
        future: F,
        span: Slot,
        retry: Retrying<S, B>,
        limits: Limits,
        info: RetryInfo,
        trace: Trace,
    ) -> Self {
        let now = retry.plan.clock.now();
        let delay = hedge_delay(&retry, now);
        let flight = hedge::Flight::new(future, span, retry, delay, &limits, now);
        Self {
            // Armed on the first poll.
            timer: None,
            state: State::Hedged { flight },
            limits,
            info,
            trace,
        }
    }

    /// A request whose first attempt its gates admitted at once: [`Self::launch`] sends it.
    pub(crate) fn starting(limits: Limits, info: RetryInfo, trace: Trace) -> Self {
        Self {
            timer: None,
            state: State::Done,
            limits,
            info,
            trace,
        }
    }

    /// Sends the first attempt of a future made by [`Self::starting`], at `now`.
    pub(crate) fn launch(
        &mut self,
        service: &mut S,
        request: Request<ReplayBody<B>>,
        then: Then<S, B>,
        now: Instant,
    ) where
        S: Service<Request<ReplayBody<B>>, Future = F>,
    {
        let (state, timer) = launch(service, request, then, &self.limits, &self.trace, now);
        self.state = state;
        self.timer = timer;
    }

    /// A request whose first attempt waits, from `now`, for the wait a gate asked for.
    pub(crate) fn admitting(
        held: Box<Held<S, B>>,
        now: Instant,
        limits: Limits,
        info: RetryInfo,
        trace: Trace,
    ) -> Self {
        Self {
            timer: Some(
                held.then
                    .plan()
                    .clock
                    .sleep_until(decision::after(now, held.wait)),
            ),
            state: State::Admitting { held },
            limits,
            info,
            trace,
        }
    }

    /// A request none of whose attempts is sent, for this reason.
    pub(crate) fn refused(stop: StopReason, limits: Limits, info: RetryInfo, trace: Trace) -> Self {
        Self {
            timer: None,
            state: State::Refused { stop },
            limits,
            info,
            trace,
        }
    }
}

/// The one timer of a response future, made when a state first needs one and reset after.
pub(crate) type Timer = Option<Pin<Box<Sleep>>>;

/// The first attempt's timer: the clock is read only for a request with a time limit.
#[inline]
fn first_timer(limits: &Limits, clock: &Clock) -> Timer {
    match limits.bounds_attempts() {
        true => limits
            .attempt_end(clock.now())
            .map(|at| clock.sleep_until(at)),
        false => None,
    }
}

/// Sets `timer` to fire at `end`, or not at all.
fn arm(timer: &mut Timer, end: Option<Instant>, clock: &Clock) {
    match (timer.as_mut(), end) {
        (Some(sleep), Some(at)) => sleep.as_mut().reset(at),
        (None, Some(at)) => *timer = Some(clock.sleep_until(at)),
        (Some(_), None) => *timer = None,
        (None, None) => {}
    }
}

/// Whether `timer` is set and has fired.
/// The time on the clock of `timer`, which has fired (the default clock's, without one).
fn timer_now(timer: &Timer) -> Instant {
    timer
        .as_ref()
        .map_or_else(crate::time::default_now, |sleep| sleep.clock().now())
}

fn fired(timer: &mut Timer, cx: &mut Context<'_>) -> bool {
    timer
        .as_mut()
        .is_some_and(|sleep| sleep.as_mut().poll(cx).is_ready())
}

/// What the current state came to.
enum Step<R> {
    /// The outcome of a request sent once: the answer.
    Once(Result<R, BoxError>),
    /// A success its policy returns without further thought (a 2xx under the default
    /// classification), settled without moving anything out of the state.
    Success(R),
    /// An attempt's outcome, to be decided: the response or the error.
    Outcome(Result<R, BoxError>),
    /// The deadline passed during an attempt: the request ends with its error.
    Deadline(Result<R, BoxError>),
    /// The transport released the body, or its wait ran out.
    Released(bool),
    /// The wait before a retry is over.
    Waited,
    /// The retry's service is ready, failed, or did not get ready in time (`None`).
    Ready(Option<Result<(), BoxError>>),
    /// The wait a gate asked of the first attempt is over.
    Admitted,
    /// A hedged request's result.
    Hedged(Result<R, BoxError>),
}

impl<F, S, B, RB, E> Future for ResponseFuture<F, S, B, Response<RB>>
where
    F: Future<Output = Result<Response<RB>, E>>,
    E: Into<BoxError>,
    S: Service<Request<ReplayBody<B>>, Future = F, Response = Response<RB>, Error = E> + Clone,
    B: http_body::Body + Unpin,
{
    type Output = Result<Response<RB>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        let _entered = this.trace.enter();
        loop {
            let step = ready!(poll_state(
                this.state.as_mut(),
                this.timer,
                this.limits,
                this.info,
                this.trace,
                cx
            ));
            // The common ends, outside the driver: nothing to decide, and the response
            // moved as few times as it can be.
            match step {
                Step::Success(response) => {
                    decision::succeeded(this.info);
                    this.state.set(State::Done);
                    return Poll::Ready(Ok(succeed(this.info, this.trace, response)));
                }
                // A response to a request sent once is the caller's at once: the error
                // path's checks are `finish`'s (16 instructions a `never()` request).
                Step::Once(Ok(response)) => {
                    decision::returning(this.info, false);
                    this.state.set(State::Done);
                    return Poll::Ready(Ok(succeed(this.info, this.trace, response)));
                }
                Step::Once(result) => {
                    this.state.set(State::Done);
                    return Poll::Ready(finish(this.info, this.trace, result));
                }
                _ => {}
            }
            let mut driver = Driver {
                state: this.state.as_mut(),
                timer: this.timer,
                limits: this.limits,
                info: this.info,
                trace: this.trace,
            };
            if let Some(result) = driver.advance(step) {
                return Poll::Ready(finish(this.info, this.trace, result));
            }
        }
    }
}

/// Polls what the current state waits for; what it came to.
fn poll_state<F, S, B, RB, E>(
    state: Pin<&mut State<F, S, B, Response<RB>>>,
    timer: &mut Timer,
    limits: &Limits,
    info: &mut RetryInfo,
    trace: &Trace,
    cx: &mut Context<'_>,
) -> Poll<Step<Response<RB>>>
where
    F: Future<Output = Result<Response<RB>, E>>,
    E: Into<BoxError>,
    S: Service<Request<ReplayBody<B>>, Future = F, Response = Response<RB>, Error = E> + Clone,
{
    let step = match state.project() {
        StateProj::Admitting { .. } => {
            if let Some(sleep) = timer.as_mut() {
                ready!(sleep.as_mut().poll(cx));
            }
            Step::Admitted
        }
        StateProj::Refused { stop } => {
            Step::Once(Err(decision::first_refused(limits, *stop, info)))
        }
        StateProj::Once {
            future,
            report,
            span,
        } => match ready!(poll_booked(future, timer, limits, info, span, cx)) {
            Attempted::Outcome(result)
            | Attempted::TimedOut(result)
            | Attempted::Deadline(result) => {
                if let Some(report) = report {
                    report.hear(&result, info);
                }
                Step::Once(result)
            }
        },
        StateProj::Attempt {
            future,
            retry,
            span,
            ..
        } => match ready!(poll_booked(future, timer, limits, info, span, cx)) {
            Attempted::Outcome(Ok(response)) if retry.plan.plain_success_status(&response) => {
                Step::Success(response)
            }
            Attempted::Outcome(result) | Attempted::TimedOut(result) => Step::Outcome(result),
            Attempted::Deadline(result) => Step::Deadline(result),
        },
        StateProj::Releasing { retry, .. } => match retry.replay.poll_released(cx) {
            Poll::Ready(_) => Step::Released(true),
            Poll::Pending if fired(timer, cx) => Step::Released(false),
            Poll::Pending => return Poll::Pending,
        },
        StateProj::Waiting { .. } => {
            if let Some(sleep) = timer.as_mut() {
                ready!(sleep.as_mut().poll(cx));
            }
            Step::Waited
        }
        StateProj::Readying { later, .. } => match later.service.poll_ready(cx) {
            Poll::Ready(ready) => Step::Ready(Some(ready.map_err(Into::into))),
            Poll::Pending if fired(timer, cx) => Step::Ready(None),
            Poll::Pending => return Poll::Pending,
        },
        StateProj::Hedged { flight } => {
            Step::Hedged(ready!(hedge::poll(flight, timer, limits, info, trace, cx)))
        }
        StateProj::Done => panic!("ResponseFuture polled after completion"),
    };
    Poll::Ready(step)
}

/// How an attempt ended.
enum Attempted<R> {
    /// With the inner service's response or error.
    Outcome(Result<R, BoxError>),
    /// With its attempt timeout: an outcome like any other.
    TimedOut(Result<R, BoxError>),
    /// With the request's deadline.
    Deadline(Result<R, BoxError>),
}

impl<RB> Attempted<Response<RB>> {
    /// What the attempt got, for the record.
    fn outcome(&self) -> AttemptOutcome {
        match self {
            Attempted::Outcome(Ok(response)) => AttemptOutcome::Response(response.status()),
            Attempted::Outcome(Err(_)) => AttemptOutcome::Error,
            Attempted::TimedOut(_) => AttemptOutcome::TimedOut,
            Attempted::Deadline(_) => AttemptOutcome::Abandoned,
        }
    }

    fn result(&self) -> &Result<Response<RB>, BoxError> {
        match self {
            Attempted::Outcome(result)
            | Attempted::TimedOut(result)
            | Attempted::Deadline(result) => result,
        }
    }
}

/// Polls an attempt (its span entered), and books what it got (its span ended).
fn poll_booked<F, RB, E>(
    future: Pin<&mut F>,
    timer: &mut Timer,
    limits: &Limits,
    info: &mut RetryInfo,
    span: &mut Slot,
    cx: &mut Context<'_>,
) -> Poll<Attempted<Response<RB>>>
where
    F: Future<Output = Result<Response<RB>, E>>,
    E: Into<BoxError>,
{
    let attempted = {
        let _entered = span.enter();
        ready!(poll_attempt(future, timer, limits, cx))
    };
    decision::attempt_ended(info, attempted.outcome());
    span.end(attempted.outcome(), attempted.result());
    Poll::Ready(attempted)
}

/// Polls an attempt, bounded by `timer`.
fn poll_attempt<F, R, E>(
    future: Pin<&mut F>,
    timer: &mut Timer,
    limits: &Limits,
    cx: &mut Context<'_>,
) -> Poll<Attempted<R>>
where
    F: Future<Output = Result<R, E>>,
    E: Into<BoxError>,
{
    match future.poll(cx) {
        Poll::Ready(result) => Poll::Ready(Attempted::Outcome(result.map_err(Into::into))),
        Poll::Pending if fired(timer, cx) => {
            match decision::attempt_expired(limits, timer_now(timer)) {
                Expired::Deadline(error) => Poll::Ready(Attempted::Deadline(Err(error))),
                Expired::Attempt(error) => Poll::Ready(Attempted::TimedOut(Err(error))),
            }
        }
        Poll::Pending => Poll::Pending,
    }
}

/// The driver's view of a future between two polls of its state.
struct Driver<'a, F, S, B, R> {
    state: Pin<&'a mut State<F, S, B, R>>,
    timer: &'a mut Timer,
    limits: &'a Limits,
    info: &'a mut RetryInfo,
    trace: &'a Trace,
}

impl<F, S, B, RB, E> Driver<'_, F, S, B, Response<RB>>
where
    S: Service<Request<ReplayBody<B>>, Future = F, Response = Response<RB>, Error = E> + Clone,
    E: Into<BoxError>,
{
    /// Carries out what `step` calls for; the result to return, when the request is over.
    fn advance(&mut self, step: Step<Response<RB>>) -> Option<Result<Response<RB>, BoxError>> {
        match step {
            // Settled by `poll` before a driver is made.
            Step::Once(_) | Step::Success(_) => unreachable_state(),
            Step::Hedged(result) => {
                // Drops every attempt still in flight.
                self.state.set(State::Done);
                Some(result)
            }
            Step::Outcome(result) => match self.state.as_mut().project_replace(State::Done) {
                StateOwn::Attempt {
                    mut retry, later, ..
                } => {
                    if let Some(presence) = Own::presence(&mut retry.own) {
                        presence.ended(self.info.attempts());
                    }
                    self.decide(result, retry, later, false)
                }
                _ => unreachable_state(),
            },
            Step::Admitted => match self.state.as_mut().project_replace(State::Done) {
                StateOwn::Admitting { held } => {
                    let Held {
                        mut service,
                        request,
                        then,
                        reserved,
                        ..
                    } = *held;
                    // Sent: what the gates took for it is spent. The service that
                    // `poll_ready` readied goes with it; retries clone from the prototype.
                    reserved.spend();
                    let now = then.plan().clock.now();
                    let (state, timer) =
                        launch(&mut service, request, then, self.limits, self.trace, now);
                    *self.timer = timer;
                    self.state.set(state);
                    None
                }
                _ => unreachable_state(),
            },
            Step::Deadline(result) => {
                self.state.set(State::Done);
                decision::deadline_passed(self.info);
                Some(result)
            }

            Step::Released(released) => match self.state.as_mut().project_replace(State::Done) {
                StateOwn::Releasing { held, retry, later } if released => {
                    // Decided anew: time has passed, and the body's state changed.
                    self.decide(held, retry, later, true)
                }
                StateOwn::Releasing { held, .. } => {
                    decision::release_timed_out(self.limits, timer_now(self.timer), self.info);
                    Some(held)
                }
                _ => unreachable_state(),
            },
            Step::Waited => match self.state.as_mut().project_replace(State::Done) {
                StateOwn::Waiting { retry, later } => {
                    self.ready_in(retry, later);
                    None
                }
                _ => unreachable_state(),
            },
            Step::Ready(ready) => match self.state.as_mut().project_replace(State::Done) {
                StateOwn::Readying { retry, later } => self.send(ready, retry, later),
                _ => unreachable_state(),
            },
        }
    }

    /// Has an outcome decided, and carries out the answer.
    fn decide(
        &mut self,
        result: Result<Response<RB>, BoxError>,
        mut retry: Retrying<S, B>,
        mut later: Option<Box<Later<S>>>,
        released: bool,
    ) -> Option<Result<Response<RB>, BoxError>> {
        let plan = &*retry.plan;
        let Some(seen) = retry.seen(&result) else {
            decision::caller_body_failed(self.info);
            return Some(result);
        };
        let outcome = Outcome {
            verdict: plan.policy.classify(&retry.head, seen),
            never_left: match seen {
                Seen::Error(error) if plan.policy.transparent => crate::classify::never_left(error),
                _ => None,
            },
            responded: result.is_ok(),
            may_repeat: retry.any_outcome,
            released,
        };
        let mut facts = Lookup {
            result: &result,
            replay: &retry.replay,
            now: None,
            clock: &plan.clock,
        };
        let course = later.as_deref_mut().map(|later| &mut later.course);
        let gates = Own::gates(&retry.own, &plan.gates);
        match decision::decide(
            plan,
            gates,
            self.limits,
            &outcome,
            &mut facts,
            course,
            self.info,
        ) {
            Answer::Return => Some(result),
            Answer::Refused(reason) => {
                let attempts = self.info.attempts();
                let stop = self.info.stop();
                self.trace
                    .refused(&plan.log, &retry.head, attempts, &reason, stop);
                Some(result)
            }
            Answer::AwaitRelease => {
                let now = plan.clock.now();
                // No attempt in flight from here to the next one's start (or the end).
                self.info.idle_from(now, &plan.clock);
                let end = self.limits.wait_end(now, Some(RELEASE_GRACE));
                arm(self.timer, end, &plan.clock);
                self.state.set(State::Releasing {
                    held: result,
                    retry,
                    later,
                });
                None
            }
            Answer::Retry { wait, start } => {
                let now = retry.plan.clock.now();
                self.info.idle_from(now, &retry.plan.clock);
                if let Some(record) = self.info.retries().last() {
                    let attempt = self.info.attempts() + 1;
                    self.trace
                        .retry(&retry.plan.log, &retry.head, attempt, record);
                }
                // The outcome is dropped before the wait: holding a response across it
                // would keep its connection busy.
                drop(result);
                let later = later.unwrap_or_else(|| {
                    Box::new(Later {
                        service: retry.prototype.make(),
                        course: start.unwrap_or_else(|| Course::new(&retry.plan.policy)),
                    })
                });
                // Until it is sent, what the gates took for it is the request's to give
                // back to those counting what is in flight, should the request end first.
                if let Some(presence) = Own::presence(&mut retry.own) {
                    presence.admitted(&later.course.ticket);
                }
                if wait.is_zero() {
                    // No wait: straight to readiness, without a timer tick in between.
                    self.ready_in(retry, later);
                } else {
                    arm(
                        self.timer,
                        Some(decision::after(now, wait)),
                        &retry.plan.clock,
                    );
                    self.state.set(State::Waiting { retry, later });
                }
                None
            }
        }
    }

    /// Goes on to get the retry's service ready, bounded by the deadline, else the attempt
    /// timeout.
    fn ready_in(&mut self, retry: Retrying<S, B>, later: Box<Later<S>>) {
        let clock = &retry.plan.clock;
        let end = self.limits.wait_end(clock.now(), None);
        arm(self.timer, end, clock);
        self.state.set(State::Readying { retry, later });
    }

    /// Sends the next attempt once its service is ready, or ends the request.
    fn send(
        &mut self,
        ready: Option<Result<(), BoxError>>,
        mut retry: Retrying<S, B>,
        mut later: Box<Later<S>>,
    ) -> Option<Result<Response<RB>, BoxError>> {
        let now = retry.plan.clock.now();
        // The next attempt starts, or the request ends: either way, the time with no
        // attempt in flight ends here.
        self.info.idle_until(now);
        let attempt = match ready {
            Some(Ok(())) => match decision::ready(self.limits, now, self.info) {
                Ok(attempt) => attempt,
                Err(error) => return Some(Err(error)),
            },
            Some(Err(error)) => {
                decision::ready_failed(self.limits, || now, self.info);
                return Some(Err(error));
            }
            None => return Some(Err(decision::not_ready(self.limits, now, self.info))),
        };
        let mut span = Slot::none();
        let future = later
            .service
            .call(retry.attempt_request(&attempt, self.trace, &mut span));
        if let (Some(presence), Some(record)) =
            (Own::presence(&mut retry.own), self.info.retries().last())
        {
            presence.started(
                attempt.number,
                Ask::of_retry(attempt.kind, record.reason.kind()),
            );
        }
        arm(self.timer, self.limits.attempt_end(now), &retry.plan.clock);
        self.state.set(State::Attempt {
            future,
            retry,
            later: Some(later),
            span,
        });
        None
    }
}

/// Reached only if a state was entered without the data its step needs, which `advance`
/// never does.
fn unreachable_state<T>() -> T {
    unreachable!("the response future's state changed under its own step")
}

/// The facts of an outcome that `decision` asks for.
struct Lookup<'a, R, B> {
    result: &'a Result<R, BoxError>,
    replay: &'a Replay<B>,
    now: Option<Instant>,
    clock: &'a Clock,
}

impl<RB, B> Facts for Lookup<'_, Response<RB>, B> {
    fn now(&mut self) -> Instant {
        *self.now.get_or_insert_with(|| self.clock.now())
    }

    fn replay(&mut self) -> Result<(), NotReplayable> {
        self.replay.check()
    }

    fn server_hint(&mut self) -> Option<Hint> {
        let response = self.result.as_ref().ok()?;
        Hint::from_headers(response.headers(), self.clock.wall_now())
    }
}

/// The one way out: the record goes into the response's extensions, or into the error.
fn finish<RB>(
    info: &mut RetryInfo,
    trace: &Trace,
    result: Result<Response<RB>, BoxError>,
) -> Result<Response<RB>, BoxError> {
    let layers_own = match &result {
        Ok(_) => false,
        Err(error) => {
            error.is::<DeadlineExceeded>()
                || error.is::<ServiceNotReady>()
                || error.is::<LocallyRefused>()
        }
    };
    decision::returning(info, layers_own);
    // A request that ends with no attempt in flight (a retry not sent, a hedged request's
    // last failure): that time lasts until now.
    if info.idling() {
        info.idle_until_now();
    }
    match result {
        Ok(response) => Ok(succeed(info, trace, response)),
        Err(error) => {
            let info = std::mem::take(info);
            trace.finish(&info);
            Err(Box::new(RetryError::new(info, error)))
        }
    }
}

/// Hands a response over with its record.
#[inline]
fn succeed<RB>(info: &mut RetryInfo, trace: &Trace, mut response: Response<RB>) -> Response<RB> {
    let info = std::mem::take(info);
    trace.finish(&info);
    response.extensions_mut().insert(info);
    response
}

impl<F, S, B, R> std::fmt::Debug for ResponseFuture<F, S, B, R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match &self.state {
            State::Once { .. } | State::Attempt { .. } => "attempt",
            State::Releasing { .. } => "releasing",
            State::Waiting { .. } => "waiting",
            State::Readying { .. } => "readying",
            State::Hedged { .. } => "hedging",
            State::Admitting { .. } => "admitting",
            State::Refused { .. } => "refused",
            State::Done => "done",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .field("info", &self.info)
            .finish()
    }
}

mod hedge;

#[cfg(test)]
mod tests;
