// The driver of a hedged request: several attempts in flight in one response future, each
// boxed (a hedged request allocates for its attempts; an unhedged one never enters here).
// One timer still serves it all: it fires at the first of the next hedge's time (unless
// the hedge waits for its body or its service, whose wakers do), the attempts' timeouts,
// the deadline, and, with nothing in flight, the end of the wait for a stalled hedge.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response};
use tower::BoxError;
use tower_service::Service;

use super::{Lookup, Retrying, Timer, arm, fired};
use crate::classify::RetryReason;
use crate::decision::hedge::{self, HedgeOutcome, Judged, Next};
use crate::decision::{self, Expired, Limits, RELEASE_GRACE};
use crate::gate::{Ask, Own, Ticket};
use crate::hedge::LatencyRecord;
use crate::hints::HintSource;
use crate::info::{AttemptOutcome, RetryInfo, StopReason};
use crate::replay::ReplayBody;
use crate::time::Instant;
use crate::trace::{Slot, Trace};

/// A hedged request between two polls.
pub(super) struct Flight<F, S, B, R> {
    retry: Retrying<S, B>,
    /// The hedging delay; `None` while a percentile has no samples (and no fallback): then
    /// only a non-fatal failure sends a hedge.
    delay: Option<Duration>,
    /// The attempts in flight, in the order they were sent.
    flying: Vec<Flying<F>>,
    /// When the next hedge is due; `None` once none will be sent.
    next_at: Option<Instant>,
    /// Why no more hedges are sent, once something said so.
    frozen: Option<StopReason>,
    /// The non-fatal failure the next hedge follows, if any (else the delay).
    trigger: Option<(RetryReason, Option<HintSource>)>,
    /// The hedges' service, cloned from the prototype for the first hedge.
    service: Option<S>,
    /// `service` is ready for the next hedge.
    ready: bool,
    ticket: Ticket,
    /// The "once" outcomes seen (the 500 once): a second one is returned.
    once: Vec<RetryReason>,
    /// The last non-fatal failure and its attempt, returned if nothing better comes.
    held: Option<(Result<R, BoxError>, u32)>,
    /// When the last attempt was sent.
    last_sent: Instant,
    /// With nothing in flight, what a due hedge waits for, and until when (`None`: no
    /// bound).
    stall: Option<(Awaited, Option<Instant>)>,
    /// The route's latency record, when the delay is its percentile.
    latencies: Option<Arc<LatencyRecord>>,
    /// The attempts share the caller's body, and none has yet read past the replay cap
    /// (after which the others are cut off).
    sharing: bool,
}

struct Flying<F> {
    future: Pin<Box<F>>,
    number: u32,
    sent: Instant,
    /// The attempt's timeout, or the deadline.
    end: Option<Instant>,
    /// Its OpenTelemetry span: ended with its outcome, or dropped (unset) with it.
    span: Slot,
}

/// What a due hedge waits for.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Awaited {
    /// The transport of an attempt no longer in flight still holds the body: waited for
    /// as a retry waits for it, within the deadline, else the attempt timeout, else a
    /// short grace.
    Body,
    /// The hedges' service to get ready: waited for as a retry waits for its service,
    /// within the deadline, else the attempt timeout, else without bound.
    Service,
}

/// What became of a due hedge.
enum Sending {
    Sent,
    /// Waiting for its body or its service (their wakers wake the future).
    Waiting(Awaited),
    /// Not sent, and no hedge will be.
    Frozen,
}

impl<F, S, B, R> Flight<F, S, B, R> {
    /// The flight of a request whose first attempt, `first`, was sent at `now`.
    #[inline(never)]
    pub(super) fn new(
        first: F,
        span: Slot,
        retry: Retrying<S, B>,
        delay: Option<Duration>,
        limits: &Limits,
        now: Instant,
    ) -> Box<Self> {
        let more = retry.plan.policy.max_attempts > 1;
        let latencies = retry
            .plan
            .hedging
            .as_ref()
            .filter(|hedging| hedging.reads_latencies())
            .and_then(|_| retry.plan.latency().cloned());
        let sharing = retry.replay.shares();
        Box::new(Self {
            retry,
            delay,
            latencies,
            flying: vec![Flying {
                future: Box::pin(first),
                number: 1,
                sent: now,
                end: limits.attempt_end(now),
                span,
            }],
            next_at: delay
                .filter(|_| more)
                .map(|delay| decision::after(now, delay)),
            frozen: None,
            trigger: None,
            service: None,
            ready: false,
            ticket: Ticket::default(),
            once: Vec::new(),
            held: None,
            last_sent: now,
            stall: None,
            sharing,
        })
    }

    /// Whether a hedge may still be sent.
    fn may_hedge(&self, info: &RetryInfo) -> bool {
        self.frozen.is_none()
            && self.next_at.is_some()
            && hedge::attempts_left(&self.retry.plan.policy, info)
    }

    fn freeze(&mut self, stop: StopReason) {
        self.frozen.get_or_insert(stop);
    }

    /// Counts an attempt sent at `sent` that ended at `now`.
    fn ended(&self, sent: Instant, now: Instant) {
        if let Some(record) = &self.latencies {
            record.record(now.saturating_duration_since(sent), now);
        }
    }

    /// The caller's body passed the replay cap, and attempt `sole` read past it: it alone
    /// can send the rest, so every other attempt in flight is dropped (its stream reset or
    /// its connection closed before its body ended), and no more hedges are sent.
    fn cut_off(&mut self, sole: u32, info: &mut RetryInfo, now: Instant) {
        let (delay, latencies) = (self.delay, self.latencies.as_deref());
        let mut presence = Own::presence(&mut self.retry.own);
        self.flying.retain(|attempt| {
            if attempt.number == sole {
                return true;
            }
            if let Some(presence) = presence.as_deref_mut() {
                presence.ended(attempt.number);
            }
            let elapsed = now.saturating_duration_since(attempt.sent);
            if let Some(record) = latencies.filter(|_| delay.is_some_and(|d| elapsed >= d)) {
                record.record(elapsed, now);
            }
            info.set_outcome_of(attempt.number, AttemptOutcome::Cancelled);
            false
        });
        self.sharing = false;
        self.freeze(StopReason::BodyNotReplayable);
    }

    /// Counts the attempts in flight, about to be dropped at `now`: each that has been out
    /// for at least the delay as that long (it would have taken longer still). One dropped
    /// sooner says nothing of its latency, and counting it would pull the percentile down.
    fn dropping(&self, now: Instant) {
        if let Some(record) = &self.latencies {
            for attempt in &self.flying {
                let elapsed = now.saturating_duration_since(attempt.sent);
                if self.delay.is_some_and(|delay| elapsed >= delay) {
                    record.record(elapsed, now);
                }
            }
        }
    }
}

impl<F, S, B, R> Drop for Flight<F, S, B, R> {
    fn drop(&mut self) {
        // The caller dropped the request with attempts in flight.
        if self.latencies.is_some() && !self.flying.is_empty() {
            self.dropping(self.retry.plan.clock.now());
        }
    }
}

/// Drives a hedged request to its result. Never inlined: the unhedged states' polling
/// stays as small as it was.
#[inline(never)]
pub(super) fn poll<F, S, B, RB, E>(
    flight: &mut Flight<F, S, B, Response<RB>>,
    timer: &mut Timer,
    limits: &Limits,
    info: &mut RetryInfo,
    trace: &Trace,
    cx: &mut Context<'_>,
) -> Poll<Result<Response<RB>, BoxError>>
where
    F: Future<Output = Result<Response<RB>, E>>,
    E: Into<BoxError>,
    S: Service<Request<ReplayBody<B>>, Future = F, Response = Response<RB>, Error = E> + Clone,
{
    loop {
        let now = flight.retry.plan.clock.now();
        if limits.past_deadline(now) {
            flight.dropping(now);
            flight.flying.iter_mut().for_each(|a| a.span.abandoned());
            hedge::abandoned(flight.flying.drain(..).map(|a| a.number), info);
            return Poll::Ready(Err(limits.deadline_exceeded()));
        }
        // Attempts that share the body and cannot follow the one that read past the cap.
        if flight.sharing {
            if let Some(sole) = flight.retry.replay.poll_sole(cx) {
                flight.cut_off(sole + 1, info, now);
            }
        }
        // Every attempt in flight, in the order they were sent.
        let mut i = 0;
        while i < flight.flying.len() {
            let attempt = &mut flight.flying[i];
            let polled = {
                let _entered = attempt.span.enter();
                attempt.future.as_mut().poll(cx)
            };
            let (result, outcome) = match polled {
                Poll::Ready(Ok(response)) => {
                    let status = response.status();
                    (Ok(response), AttemptOutcome::Response(status))
                }
                Poll::Ready(Err(error)) => (Err(error.into()), AttemptOutcome::Error),
                Poll::Pending if attempt.end.is_some_and(|end| now >= end) => {
                    let error = match decision::attempt_expired(limits, now) {
                        Expired::Attempt(error) | Expired::Deadline(error) => error,
                    };
                    (Err(error), AttemptOutcome::TimedOut)
                }
                Poll::Pending => {
                    i += 1;
                    continue;
                }
            };
            let mut ended = flight.flying.remove(i);
            ended.span.end(outcome, &result);
            let number = ended.number;
            flight.ended(ended.sent, now);
            if let Some(presence) = Own::presence(&mut flight.retry.own) {
                presence.ended(number);
            }
            info.set_outcome_of(number, outcome);
            if let Some(stop) = judge(flight, &result, limits, number, info, trace) {
                flight.dropping(now);
                let cancelled = flight.flying.drain(..).map(|a| a.number);
                hedge::won(stop, number, cancelled, info);
                return Poll::Ready(result);
            }
            // Kept in case nothing better comes (the one kept before is dropped).
            flight.held = Some((result, number));
            if flight.flying.is_empty() {
                // No attempt in flight until the next hedge starts, or the request ends.
                info.idle_from(now, &flight.retry.plan.clock);
            }
        }

        let mut waiting = None;
        if flight.may_hedge(info) && flight.next_at.is_some_and(|at| at <= now) {
            match send(flight, limits, info, trace, now, cx) {
                // The new attempt is polled at once.
                Sending::Sent => continue,
                Sending::Waiting(awaited) => waiting = Some(awaited),
                Sending::Frozen => {}
            }
        }
        if flight.flying.is_empty() {
            if !flight.may_hedge(info) {
                // Nothing in flight, nothing more to send: the last failure.
                let Some((result, number)) = flight.held.take() else {
                    unreachable!("a hedged request ended with no outcome");
                };
                hedge::exhausted(flight.frozen, number, info);
                return Poll::Ready(result);
            }
            if let Some(awaited) = waiting {
                // A wait of the same kind keeps its end; a new one starts its own.
                let (_, end) = match flight.stall {
                    Some(stall) if stall.0 == awaited => stall,
                    _ => {
                        let grace = (awaited == Awaited::Body).then_some(RELEASE_GRACE);
                        *flight.stall.insert((awaited, limits.wait_end(now, grace)))
                    }
                };
                if end.is_some_and(|end| now >= end) {
                    let stop = match awaited {
                        Awaited::Body => StopReason::BodyNotReplayable,
                        Awaited::Service => StopReason::ServiceNotReady,
                    };
                    flight.freeze(stop);
                    continue;
                }
            }
        }

        // The timer: the first of every end that is not waited for by a waker.
        let ends = flight.flying.iter().filter_map(|a| a.end);
        let next = flight
            .next_at
            .filter(|_| waiting.is_none() && flight.may_hedge(info));
        let stall = flight
            .stall
            .and_then(|(_, end)| end)
            .filter(|_| waiting.is_some() && flight.flying.is_empty());
        let end = ends.chain(next).chain(stall).chain(limits.deadline()).min();
        arm(timer, end, &flight.retry.plan.clock);
        if fired(timer, cx) {
            continue;
        }
        return Poll::Pending;
    }
}

/// Judges attempt `number`'s outcome, and books the reason it was given: `Some` with the
/// stop when it is returned.
fn judge<F, S, B, RB>(
    flight: &mut Flight<F, S, B, Response<RB>>,
    result: &Result<Response<RB>, BoxError>,
    limits: &Limits,
    number: u32,
    info: &mut RetryInfo,
    trace: &Trace,
) -> Option<StopReason> {
    let retry = &flight.retry;
    let plan = &*retry.plan;
    if plan.plain_success(result) {
        return Some(StopReason::Final);
    }
    let Some(seen) = retry.seen(result) else {
        // The caller's own body failed: its error is returned as is.
        return Some(StopReason::Final);
    };
    let outcome = HedgeOutcome {
        verdict: plan.policy.classify(&retry.head, seen),
        responded: result.is_ok(),
    };
    hedge::classified(info, number, outcome.verdict);
    let mut facts = Lookup {
        result,
        replay: &retry.replay,
        now: None,
        clock: &plan.clock,
    };
    let gates = Own::gates(&retry.own, &plan.gates);
    let judged = hedge::outcome(
        &plan.policy,
        gates,
        &flight.ticket,
        limits,
        &outcome,
        &mut facts,
        &mut flight.once,
    );
    match judged {
        Judged::Wins(stop) => Some(stop),
        Judged::NonFatal { reason, hint, next } => {
            flight.trigger = Some((reason, hint));
            match next {
                Next::After(wait) => {
                    if flight.frozen.is_none() {
                        // The failure shortcuts the delay: the next hedge goes after the
                        // hint, else at once.
                        let now = facts.now.unwrap_or_else(|| plan.clock.now());
                        flight.next_at = Some(decision::after(now, wait));
                    }
                }
                Next::Freeze(stop) => {
                    // A gate's refusal of the hedge this failure would have sent, if one
                    // could still go.
                    if decision::by_gate(stop)
                        && flight.frozen.is_none()
                        && hedge::attempts_left(&flight.retry.plan.policy, info)
                    {
                        let retry = &flight.retry;
                        let attempts = info.attempts();
                        trace.refused(&retry.plan.log, &retry.head, attempts, &reason, stop);
                    }
                    flight.freeze(stop);
                }
            }
            None
        }
    }
}

/// Sends the due hedge if its body, its service and the gates let it.
fn send<F, S, B, RB, E>(
    flight: &mut Flight<F, S, B, Response<RB>>,
    limits: &Limits,
    info: &mut RetryInfo,
    trace: &Trace,
    now: Instant,
    cx: &mut Context<'_>,
) -> Sending
where
    F: Future<Output = Result<Response<RB>, E>>,
    E: Into<BoxError>,
    S: Service<Request<ReplayBody<B>>, Future = F, Response = Response<RB>, Error = E> + Clone,
{
    match flight.retry.replay.poll_hedge(cx) {
        Poll::Pending => return Sending::Waiting(Awaited::Body),
        Poll::Ready(Err(_)) => {
            flight.freeze(StopReason::BodyNotReplayable);
            return Sending::Frozen;
        }
        Poll::Ready(Ok(())) => {}
    }
    if !flight.ready {
        let retry = &flight.retry;
        let service = flight.service.get_or_insert_with(|| retry.prototype.make());
        match service.poll_ready(cx) {
            Poll::Pending => return Sending::Waiting(Awaited::Service),
            Poll::Ready(Err(_)) => {
                // The attempts in flight go on; their outcome is the caller's.
                flight.freeze(StopReason::ServiceNotReady);
                return Sending::Frozen;
            }
            Poll::Ready(Ok(())) => flight.ready = true,
        }
    }
    let retry = &flight.retry;
    let gates = Own::gates(&retry.own, &retry.plan.gates);
    let trigger = flight.trigger.take();
    let attempt = match hedge::send(
        gates,
        &mut flight.ticket,
        limits,
        trigger,
        now,
        flight.last_sent,
        info,
    ) {
        Ok(attempt) => attempt,
        Err(stop) => {
            if decision::by_gate(stop) {
                let reason = trigger.map_or(RetryReason::Hedge, |(reason, _)| reason);
                let attempts = info.attempts();
                trace.refused(&retry.plan.log, &retry.head, attempts, &reason, stop);
            }
            flight.freeze(stop);
            return Sending::Frozen;
        }
    };
    if let Some(record) = info.retries().last() {
        trace.retry(&retry.plan.log, &retry.head, attempt.number, record);
    }
    let mut span = Slot::none();
    let request = retry.attempt_request(&attempt, trace, &mut span);
    let more = hedge::attempts_left(&retry.plan.policy, info);
    if let Some(presence) = Own::presence(&mut flight.retry.own) {
        presence.admitted(&flight.ticket);
    }
    let Some(service) = flight.service.as_mut() else {
        unreachable!("a hedge is sent only through a ready service");
    };
    let future = service.call(request);
    if let (Some(presence), Some(record)) =
        (Own::presence(&mut flight.retry.own), info.retries().last())
    {
        presence.started(attempt.number, Ask::Hedge(record.reason.kind()));
    }
    flight.ready = false;
    flight.flying.push(Flying {
        future: Box::pin(future),
        number: attempt.number,
        sent: now,
        end: limits.attempt_end(now),
        span,
    });
    flight.last_sent = now;
    flight.stall = None;
    info.idle_until(now);
    // The delay restarts from the hedge just sent.
    flight.next_at = flight
        .delay
        .filter(|_| more)
        .map(|delay| decision::after(now, delay));
    Sending::Sent
}
