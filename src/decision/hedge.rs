// The decisions of a hedged request: what an attempt's outcome means while others may be
// in flight, and whether the next hedge may go. Plain code, as the rest of `decision`.

use std::time::Duration;

use super::{
    Facts, Limits, asks_too_long, counted_attempts, hint_after, leaves_no_time, record_retry,
    record_stop,
};
use crate::classify::{Classification, RetryReason};
use crate::gate::{Ask, Gates, Heard, Ticket};
use crate::hints::HintSource;
use crate::hook::{Attempt, AttemptKind};
use crate::info::{AttemptOutcome, RetryInfo, RetryRecord, StopReason};
use crate::policy::Settings;
use crate::replay::NotReplayable;
use crate::time::Instant;

/// What one attempt's outcome means for a hedged request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Judged {
    /// It is returned, for this reason; the attempts still in flight are dropped.
    Wins(StopReason),
    /// A non-fatal failure: the next hedge follows it as `next` says, and the outcome is
    /// kept, to be returned if nothing better comes.
    NonFatal {
        reason: RetryReason,
        hint: Option<HintSource>,
        next: Next,
    },
}

/// When the hedge after a non-fatal failure goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Next {
    /// After this wait (zero: at once), replacing the hedging delay in force.
    After(Duration),
    /// Never: no more hedges, for this reason (the attempts in flight go on).
    Freeze(StopReason),
}

/// The facts of an outcome of a hedged request.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HedgeOutcome {
    pub(crate) verdict: Classification,
    /// The attempt produced a response (as opposed to an error).
    pub(crate) responded: bool,
}

/// Decides what an attempt's outcome means for a hedged request, and tells the gates of
/// it. `once` holds the reasons of the "once" outcomes (the 500 once) seen so far, and
/// gets this one's.
pub(crate) fn outcome(
    policy: &Settings,
    gates: &Gates,
    ticket: &Ticket,
    limits: &Limits,
    seen: &HedgeOutcome,
    facts: &mut impl Facts,
    once: &mut Vec<RetryReason>,
) -> Judged {
    let verdict = seen.verdict;
    let gated = gates.on_outcome(Heard::of(verdict), Some(ticket));
    let mut last = || match !seen.responded && limits.past_deadline(facts.now()) {
        true => StopReason::Deadline,
        false => StopReason::Final,
    };
    let reason = match verdict {
        Classification::Success => return Judged::Wins(StopReason::Final),
        Classification::Done => return Judged::Wins(last()),
        Classification::RetryOnce(reason) if once.contains(&reason) => {
            return Judged::Wins(last());
        }
        Classification::RetryOnce(reason) => {
            once.push(reason);
            reason
        }
        Classification::Retry(reason)
        | Classification::RetryWithHint(reason, _)
        | Classification::Stop(reason) => reason,
    };
    let non_fatal = |next, hint| Judged::NonFatal { reason, hint, next };
    if gated.is_err() {
        return non_fatal(Next::Freeze(StopReason::Throttled), None);
    }
    if let Classification::Stop(_) = verdict {
        return non_fatal(Next::Freeze(StopReason::ServerSaidStop), None);
    }
    // A body that can never be sent again (over the cap, or the caller's own failed) ends
    // hedging. A body still being sent is no obstacle: the next hedge waits for it.
    match facts.replay() {
        Ok(()) | Err(NotReplayable::InFlight) => {}
        Err(_) => return non_fatal(Next::Freeze(StopReason::BodyNotReplayable), None),
    }
    let hint = hint_after(verdict, seen.responded, facts);
    let source = hint.map(|hint| hint.source);
    if hint.is_some_and(|hint| asks_too_long(hint, policy.max_retry_after)) {
        return non_fatal(Next::Freeze(StopReason::HintTooLong), source);
    }
    // Without a hint the next hedge goes at once; a hint (an exact pushback, or a floor
    // such as `Retry-After`) sets its time.
    let wait = hint.map_or(Duration::ZERO, |hint| hint.wait);
    if let Some(start_by) = limits.start_by(facts.now()) {
        if leaves_no_time(facts.now(), wait, start_by) {
            let stop = match hint {
                Some(_) => StopReason::HintTooLong,
                None => StopReason::Deadline,
            };
            return non_fatal(Next::Freeze(stop), source);
        }
    }
    non_fatal(Next::After(wait), source)
}

/// Books the reason the classifier gave attempt `number`'s outcome, if any. A hedge's own
/// reason says why it was sent (its delay, or some attempt's failure), not what the
/// attempt before it got, so each attempt's is booked as it ends.
pub(crate) fn classified(info: &mut RetryInfo, number: u32, verdict: Classification) {
    if let Some(reason) = verdict.reason() {
        info.set_cause(number, reason);
    }
}

/// Whether a hedged request may send another attempt: fewer than `max_attempts` sent.
pub(crate) fn attempts_left(policy: &Settings, info: &RetryInfo) -> bool {
    counted_attempts(info.attempts(), info.retries()) < policy.max_attempts
}

/// A hedge is due and its body and service are ready at `now`: asks the gates and books
/// it, or says why it is not sent. `trigger` is the non-fatal failure it follows, if any
/// (else it follows the hedging delay); `previous` is when the attempt before it was sent.
#[allow(clippy::too_many_arguments)]
pub(crate) fn send(
    gates: &Gates,
    ticket: &mut Ticket,
    limits: &Limits,
    trigger: Option<(RetryReason, Option<HintSource>)>,
    now: Instant,
    previous: Instant,
    info: &mut RetryInfo,
) -> Result<Attempt, StopReason> {
    if limits.too_late_to_start(now) {
        return Err(StopReason::Deadline);
    }
    let (reason, hint) = trigger.unwrap_or((RetryReason::Hedge, None));
    let admitted = match gates.admit(Ask::Hedge(reason.kind())) {
        Ok(admitted) => admitted,
        Err(refused) => {
            if refused == StopReason::BudgetExhausted {
                crate::trace::budget_refused(&reason);
            }
            return Err(refused);
        }
    };
    // A hedge is sent for latency: one a gate would delay has lost its point. It is not
    // sent, and what the gates took goes back.
    if !admitted.wait.is_zero() {
        gates.release(&admitted);
        return Err(StopReason::Throttled);
    }
    gates.commit(&admitted, ticket);
    let record = RetryRecord {
        kind: AttemptKind::Hedge,
        reason,
        // The time since the attempt before it was sent.
        wait: now.saturating_duration_since(previous),
        hint,
        // In flight: dropped if nothing else is booked for it.
        outcome: AttemptOutcome::Abandoned,
    };
    crate::trace::retried(&record);
    record_retry(info, record);
    Ok(Attempt {
        number: info.attempts(),
        counted_before: counted_attempts(info.attempts(), info.retries()).saturating_sub(1),
        time_left: limits.time_left(Some(now)),
        timeout: limits.attempt_timeout,
        kind: AttemptKind::Hedge,
    })
}

/// Nothing is in flight and nothing more will be sent: the last failure is returned, and
/// the stop says why no more was sent.
pub(crate) fn exhausted(frozen: Option<StopReason>, returned: u32, info: &mut RetryInfo) {
    record_stop(info, frozen.unwrap_or(StopReason::MaxAttempts));
    info.set_returned(returned);
    crate::trace::hedge_returned(returned);
}

/// An attempt's outcome is returned: every other attempt still in flight is cancelled.
pub(crate) fn won(
    stop: StopReason,
    returned: u32,
    cancelled: impl Iterator<Item = u32>,
    info: &mut RetryInfo,
) {
    for number in cancelled {
        info.set_outcome_of(number, AttemptOutcome::Cancelled);
    }
    record_stop(info, stop);
    info.set_returned(returned);
    crate::trace::hedge_returned(returned);
}

/// The deadline passed with attempts in flight: each is abandoned.
pub(crate) fn abandoned(in_flight: impl Iterator<Item = u32>, info: &mut RetryInfo) {
    for number in in_flight {
        info.set_outcome_of(number, AttemptOutcome::Abandoned);
    }
    record_stop(info, StopReason::Deadline);
}
