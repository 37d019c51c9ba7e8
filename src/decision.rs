//! The retry decisions as plain code: the limits of a logical request, whether an outcome
//! may be retried, how long to wait, and the record of it all. Nothing here knows futures;
//! [`crate::future`] gathers the facts, calls these, and drives what they decide.

use std::time::Duration;

use tokio::time::Instant;
use tower::BoxError;

use crate::classify::{Classification, RetryReason};
use crate::error::{AttemptTimedOut, DeadlineExceeded};
use crate::hints::{Hint, HintSource};
use crate::info::{RetryInfo, RetryRecord, StopReason};
use crate::policy::RetryPolicy;

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
    /// When the deadline passes, and the configured deadline.
    deadline: Option<(Instant, Duration)>,
    attempt_timeout: Option<Duration>,
}

impl Limits {
    /// The limits of a request starting now, its deadline also at most `bound` away when
    /// given (a gRPC caller's own `grpc-timeout`): the shorter applies. The clock is read
    /// only for a deadline.
    pub(crate) fn start(policy: &RetryPolicy, bound: Option<Duration>) -> Self {
        let deadline = match (policy.deadline, bound) {
            (Some(d), Some(b)) => Some(d.min(b)),
            (d, b) => d.or(b),
        };
        Self {
            deadline: deadline.and_then(|d| Instant::now().checked_add(d).map(|at| (at, d))),
            attempt_timeout: policy.attempt_timeout,
        }
    }

    /// Whether an attempt has any end at all (else no clock needs reading for it).
    pub(crate) fn bounds_attempts(&self) -> bool {
        self.deadline.is_some() || self.attempt_timeout.is_some()
    }

    pub(crate) fn deadline(&self) -> Option<Instant> {
        self.deadline.map(|(at, _)| at)
    }

    pub(crate) fn past_deadline(&self, now: Instant) -> bool {
        self.deadline.is_some_and(|(at, _)| now >= at)
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

    /// The error for a limit that ran out at `now` during attempt `attempt` (or while
    /// preparing it): the deadline if it has passed, else the attempt timeout.
    pub(crate) fn expired(&self, now: Instant, attempt: u32) -> BoxError {
        match self.deadline {
            Some((at, deadline)) if now >= at => Box::new(DeadlineExceeded::new(deadline, attempt)),
            _ => Box::new(AttemptTimedOut::new(
                self.attempt_timeout.unwrap_or_default(),
                attempt,
            )),
        }
    }
}

/// The instant `wait` after `now`; a wait too long to represent ends in about thirty
/// years, which is "never" for a request but still a wait, not none.
pub(crate) fn after(now: Instant, wait: Duration) -> Instant {
    now.checked_add(wait)
        .or_else(|| now.checked_add(Duration::from_secs(86_400 * 365 * 30)))
        .unwrap_or(now)
}

/// What an outcome's classification and the request allow, before any wait is chosen.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Judgement<'a> {
    pub(crate) verdict: Classification,
    /// An idempotent method, a key on the request, or a policy that declares the request
    /// repeatable (DESIGN 1.1).
    pub(crate) may_repeat: bool,
    pub(crate) attempts: u32,
    pub(crate) max_attempts: u32,
    pub(crate) previous: &'a [RetryRecord],
    /// The outcome is an error that came at or after the deadline: when it is final, it is
    /// final because the time is up (a timer below the layer, such as the one a tonic
    /// `Channel` runs for the `grpc-timeout` the layer sent, fired with the deadline).
    pub(crate) failed_after_deadline: bool,
}

/// A6's transparent retry, for a policy that has it (a gRPC policy): an outcome that proves
/// the stream never reached the server's application (a connect error, or
/// `RST_STREAM(REFUSED_STREAM)` on the request's own stream) is retried once per logical
/// request, at once, whatever the attempts left, and without telling the throttle. `Some`
/// with the reason when this outcome gets it; a second such outcome goes by the normal rules.
pub(crate) fn transparent(
    a6: bool,
    verdict: Classification,
    previous: &[RetryRecord],
) -> Option<RetryReason> {
    if !a6 || previous.iter().any(|record| record.transparent) {
        return None;
    }
    match verdict {
        Classification::Retry(reason)
        | Classification::RetryOnce(reason)
        | Classification::RetryWithHint(reason, _)
            if reason.request_not_processed() =>
        {
            Some(reason)
        }
        _ => None,
    }
}

/// The attempts that count against `max_attempts` and in `grpc-previous-rpc-attempts`:
/// all of them but the transparent retries among `previous` (A6).
pub(crate) fn counted_attempts(attempts: u32, previous: &[RetryRecord]) -> u32 {
    let transparent = previous.iter().filter(|record| record.transparent).count();
    attempts.saturating_sub(u32::try_from(transparent).unwrap_or(u32::MAX))
}

/// The backoff's retry number for the next retry (1 for the first): the retries since the
/// first `offset` ones (those up to the last gRPC pushback), transparent ones not counted.
pub(crate) fn backoff_number(previous: &[RetryRecord], offset: usize) -> u32 {
    let since = previous.get(offset..).unwrap_or_default();
    let counted = since.iter().filter(|record| !record.transparent).count();
    u32::try_from(counted + 1).unwrap_or(u32::MAX)
}

/// Whether the outcome is worth a retry, and for which reason; or why not.
pub(crate) fn judge(j: &Judgement<'_>) -> Result<RetryReason, StopReason> {
    let last = match j.failed_after_deadline {
        true => StopReason::Deadline,
        false => StopReason::Final,
    };
    let reason = match j.verdict {
        Classification::Done => return Err(last),
        Classification::Retry(reason) | Classification::RetryWithHint(reason, _) => reason,
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
    /// The hint is the wait itself, not a floor (gRPC pushback).
    pub(crate) exact: bool,
    pub(crate) max_hint: Duration,
    pub(crate) now: Instant,
    pub(crate) deadline: Option<Instant>,
    /// A6's transparent retry ([`transparent`]): sent at once, backoff and hints aside.
    pub(crate) transparent: bool,
}

/// Schedules the retry, or says why it cannot happen. `withdraw` asks the budget for a
/// token, and is called only when everything else allows the retry.
///
/// A transparent retry waits nothing, but the deadline still applies, and so does the
/// budget: DESIGN 1.7 bounds every retry the layer sends, and one per logical request at
/// most is transparent.
pub(crate) fn schedule(
    s: &Schedule,
    withdraw: impl FnOnce() -> bool,
) -> Result<RetryRecord, StopReason> {
    let hint = s.hint.filter(|_| !s.transparent).map(|hint| hint.wait);
    if hint.is_some_and(|hint| hint > s.max_hint) {
        return Err(StopReason::RetryAfterTooLong);
    }
    let backoff = match s.transparent {
        true => Duration::ZERO,
        false => s.backoff,
    };
    let (wait, from_hint) = match hint {
        Some(hint) if s.exact => (hint, true),
        Some(hint) => (hint.max(backoff), hint > backoff),
        None => (backoff, false),
    };
    if let Some(deadline) = s.deadline {
        // Timers fire on whole milliseconds, so a wait may end up to 1 ms late: a wait that
        // would end within that of the deadline leaves no time for an attempt.
        let ends = s
            .now
            .checked_add(wait)
            .and_then(|ends| ends.checked_add(TIMER_SLACK));
        if ends.is_none_or(|ends| ends >= deadline) {
            return Err(if from_hint {
                StopReason::RetryAfterTooLong
            } else {
                StopReason::Deadline
            });
        }
    }
    if !withdraw() {
        return Err(StopReason::BudgetExhausted);
    }
    let source = s.hint.filter(|_| from_hint).map(|hint| hint.source);
    Ok(RetryRecord {
        reason: s.reason,
        wait,
        retry_after: source == Some(HintSource::RetryAfter),
        hint: source,
        transparent: s.transparent,
    })
}

/// Books a retry that goes ahead.
pub(crate) fn record_retry(info: &mut RetryInfo, record: RetryRecord) {
    info.total_wait = info.total_wait.saturating_add(record.wait);
    info.retries.push(record);
}

/// Books why retrying stopped.
pub(crate) fn record_stop(info: &mut RetryInfo, stop: StopReason) {
    info.stop = stop;
    if stop == StopReason::BudgetExhausted {
        info.budget_exhausted = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::StatusCode;

    const S503: RetryReason = RetryReason::Status(StatusCode::SERVICE_UNAVAILABLE);
    const S500: RetryReason = RetryReason::Status(StatusCode::INTERNAL_SERVER_ERROR);

    fn judgement(verdict: Classification) -> Judgement<'static> {
        Judgement {
            verdict,
            may_repeat: true,
            attempts: 1,
            max_attempts: 3,
            previous: &[],
            failed_after_deadline: false,
        }
    }

    fn record(reason: RetryReason) -> RetryRecord {
        RetryRecord {
            reason,
            wait: Duration::ZERO,
            retry_after: false,
            hint: None,
            transparent: false,
        }
    }

    #[test]
    fn judge_follows_the_verdict_the_method_and_the_attempts() {
        assert_eq!(
            judge(&judgement(Classification::Done)),
            Err(StopReason::Final)
        );
        assert_eq!(judge(&judgement(Classification::Retry(S503))), Ok(S503));
        let once = Classification::RetryOnce(S500);
        assert_eq!(judge(&judgement(once)), Ok(S500));
        let previous = [record(S500)];
        let again = Judgement {
            previous: &previous,
            ..judgement(once)
        };
        assert_eq!(judge(&again), Err(StopReason::Final));
        let keyless = Judgement {
            may_repeat: false,
            ..judgement(Classification::Retry(S503))
        };
        assert_eq!(judge(&keyless), Err(StopReason::NotIdempotent));
        for proof in [RetryReason::Connect, RetryReason::RefusedStream] {
            let unseen = Judgement {
                may_repeat: false,
                ..judgement(Classification::Retry(proof))
            };
            assert_eq!(judge(&unseen), Ok(proof));
        }
        let goaway = Judgement {
            may_repeat: false,
            ..judgement(Classification::Retry(RetryReason::GoAway))
        };
        assert_eq!(judge(&goaway), Err(StopReason::NotIdempotent));
        let last = Judgement {
            attempts: 3,
            ..judgement(Classification::Retry(S503))
        };
        assert_eq!(judge(&last), Err(StopReason::MaxAttempts));
        // A final error at or after the deadline ended because the time was up; a
        // retryable one is judged as before (the schedule then finds no time left).
        let late = |verdict| Judgement {
            failed_after_deadline: true,
            ..judgement(verdict)
        };
        assert_eq!(
            judge(&late(Classification::Done)),
            Err(StopReason::Deadline)
        );
        assert_eq!(judge(&late(Classification::Retry(S503))), Ok(S503));
    }

    fn transparent_record(reason: RetryReason) -> RetryRecord {
        RetryRecord {
            transparent: true,
            ..record(reason)
        }
    }

    #[test]
    fn a_refused_stream_or_connect_error_is_retried_transparently_once() {
        use RetryReason::{Connect, RefusedStream};
        for reason in [Connect, RefusedStream] {
            for verdict in [
                Classification::Retry(reason),
                Classification::RetryOnce(reason),
                Classification::RetryWithHint(reason, Duration::from_secs(1)),
            ] {
                assert_eq!(transparent(true, verdict, &[]), Some(reason), "{verdict:?}");
                // Only under A6's rules (a gRPC policy).
                assert_eq!(transparent(false, verdict, &[]), None, "{verdict:?}");
            }
            // After a normal retry it is still available; after a transparent one, not.
            let normal = [record(S503)];
            let verdict = Classification::Retry(reason);
            assert_eq!(transparent(true, verdict, &normal), Some(reason));
            let once = [record(S503), transparent_record(RefusedStream)];
            assert_eq!(transparent(true, verdict, &once), None);
        }
        // Nothing else proves the server's application never saw the stream.
        for other in [
            RetryReason::GoAway,
            RetryReason::ConnectionClosed,
            RetryReason::Timeout,
            S503,
        ] {
            assert_eq!(transparent(true, Classification::Retry(other), &[]), None);
        }
        assert_eq!(transparent(true, Classification::Done, &[]), None);
    }

    #[test]
    fn transparent_retries_do_not_count_against_max_attempts() {
        let refused = [transparent_record(RetryReason::RefusedStream)];
        assert_eq!(counted_attempts(2, &refused), 1);
        assert_eq!(counted_attempts(1, &[]), 1);
        assert_eq!(counted_attempts(0, &refused), 0, "saturates");
        // max_attempts(1): after the transparent retry, the second attempt is the first
        // that counts, and it is the last.
        let after_refusal = Judgement {
            attempts: 2,
            max_attempts: 1,
            previous: &refused,
            ..judgement(Classification::Retry(RetryReason::RefusedStream))
        };
        assert_eq!(judge(&after_refusal), Err(StopReason::MaxAttempts));
        let two = Judgement {
            max_attempts: 2,
            ..after_refusal
        };
        assert_eq!(judge(&two), Ok(RetryReason::RefusedStream));
        // A plain record of the same reason counts as an attempt.
        let counted = [record(RetryReason::RefusedStream)];
        let plain = Judgement {
            previous: &counted,
            ..two
        };
        assert_eq!(judge(&plain), Err(StopReason::MaxAttempts));
    }

    #[test]
    fn transparent_retries_do_not_advance_the_backoff() {
        assert_eq!(backoff_number(&[], 0), 1);
        let t = transparent_record(RetryReason::RefusedStream);
        assert_eq!(backoff_number(&[t], 0), 1);
        assert_eq!(backoff_number(&[t, record(S503)], 0), 2);
        assert_eq!(backoff_number(&[record(S503), t, record(S503)], 0), 3);
        // Counted from the last pushback.
        assert_eq!(backoff_number(&[record(S503), t, record(S503)], 1), 2);
        assert_eq!(backoff_number(&[record(S503)], 1), 1);
        assert_eq!(backoff_number(&[record(S503)], 5), 1, "past the end");
    }

    #[test]
    fn a_transparent_retry_waits_nothing_but_keeps_the_deadline_and_the_budget() {
        let at_once = |backoff, hint, deadline_in| Schedule {
            transparent: true,
            reason: RetryReason::RefusedStream,
            ..plan(backoff, hint, deadline_in)
        };
        let r = schedule(&at_once(5_000, Some(20_000), Some(60_000)), || true).unwrap();
        assert_eq!(r.wait, Duration::ZERO, "no backoff, no hint");
        assert!(r.transparent);
        assert_eq!((r.retry_after, r.hint), (false, None));
        assert_eq!(r.reason, RetryReason::RefusedStream);
        // A hint too long for `max_retry_after` does not stop it: hints are not read.
        assert!(schedule(&at_once(0, Some(31_000), None), || true).is_ok());
        // No time for an attempt before the deadline: not sent.
        assert_eq!(
            schedule(&at_once(0, None, Some(1)), || true),
            Err(StopReason::Deadline)
        );
        assert!(schedule(&at_once(0, None, Some(2)), || true).is_ok());
        // The budget pays for it, as for every retry.
        assert_eq!(
            schedule(&at_once(0, None, None), || false),
            Err(StopReason::BudgetExhausted)
        );
        let mut info = RetryInfo::default();
        record_retry(&mut info, r);
        assert_eq!(info.total_wait, Duration::ZERO);
        assert!(info.retries[0].transparent);
    }

    fn plan(backoff: u64, hint: Option<u64>, deadline_in: Option<u64>) -> Schedule {
        let now = Instant::now();
        Schedule {
            reason: S503,
            backoff: Duration::from_millis(backoff),
            hint: hint.map(|ms| Hint::new(Duration::from_millis(ms), HintSource::RetryAfter)),
            max_hint: Duration::from_secs(30),
            exact: false,
            now,
            deadline: deadline_in.map(|ms| now + Duration::from_millis(ms)),
            transparent: false,
        }
    }

    #[test]
    fn the_hint_is_a_floor_and_is_recorded_only_when_it_decides() {
        let r = schedule(&plan(100, Some(2_000), None), || true).unwrap();
        assert_eq!((r.wait, r.retry_after), (Duration::from_secs(2), true));
        assert_eq!(r.hint, Some(HintSource::RetryAfter));
        let r = schedule(&plan(300, Some(200), None), || true).unwrap();
        assert_eq!(
            (r.wait, r.retry_after, r.hint),
            (Duration::from_millis(300), false, None)
        );
        let rate_limited = Schedule {
            hint: Some(Hint::new(Duration::from_secs(7), HintSource::RateLimit)),
            ..plan(100, None, None)
        };
        let r = schedule(&rate_limited, || true).unwrap();
        assert_eq!(
            (r.wait, r.retry_after, r.hint),
            (Duration::from_secs(7), false, Some(HintSource::RateLimit))
        );
        let too_long = Schedule {
            hint: Some(Hint::new(Duration::from_secs(31), HintSource::Classifier)),
            ..plan(100, None, None)
        };
        assert_eq!(
            schedule(&too_long, || true),
            Err(StopReason::RetryAfterTooLong)
        );
        let r = schedule(&plan(300, None, None), || true).unwrap();
        assert_eq!((r.wait, r.retry_after), (Duration::from_millis(300), false));
    }

    #[test]
    fn too_long_a_hint_or_a_wait_past_the_deadline_stops() {
        assert_eq!(
            schedule(&plan(100, Some(31_000), None), || true),
            Err(StopReason::RetryAfterTooLong)
        );
        assert_eq!(
            schedule(&plan(100, Some(5_000), Some(4_000)), || true),
            Err(StopReason::RetryAfterTooLong)
        );
        assert_eq!(
            schedule(&plan(4_000, None, Some(4_000)), || true),
            Err(StopReason::Deadline)
        );
        // Within a millisecond of the deadline leaves no room for an attempt.
        assert_eq!(
            schedule(&plan(3_999, None, Some(4_000)), || true),
            Err(StopReason::Deadline)
        );
        assert!(schedule(&plan(3_998, None, Some(4_000)), || true).is_ok());
    }

    #[test]
    fn the_budget_is_asked_last_and_only_then() {
        let mut asked = false;
        let stop = schedule(&plan(100, Some(31_000), None), || {
            asked = true;
            true
        });
        assert_eq!(stop, Err(StopReason::RetryAfterTooLong));
        assert!(!asked, "a retry that cannot happen spends no token");
        assert_eq!(
            schedule(&plan(100, None, None), || false),
            Err(StopReason::BudgetExhausted)
        );
    }

    #[test]
    fn the_record_adds_waits_and_marks_budget_refusals() {
        let mut info = RetryInfo::default();
        record_retry(
            &mut info,
            RetryRecord {
                wait: Duration::from_millis(5),
                ..record(S503)
            },
        );
        record_retry(
            &mut info,
            RetryRecord {
                wait: Duration::MAX,
                ..record(S503)
            },
        );
        assert_eq!(info.total_wait, Duration::MAX, "saturates");
        assert_eq!(info.retries.len(), 2);
        record_stop(&mut info, StopReason::BudgetExhausted);
        assert!(info.budget_exhausted);
        let mut other = RetryInfo::default();
        record_stop(&mut other, StopReason::MaxAttempts);
        assert!(!other.budget_exhausted);
    }

    #[tokio::test(start_paused = true)]
    async fn limits_pick_the_first_end() {
        let policy = RetryPolicy::default()
            .deadline(Duration::from_secs(10))
            .attempt_timeout(Duration::from_secs(3));
        let now = Instant::now();
        let limits = Limits::start(&policy, None);
        assert!(limits.bounds_attempts());
        assert_eq!(limits.attempt_end(now), Some(now + Duration::from_secs(3)));
        let late = now + Duration::from_secs(8);
        assert_eq!(
            limits.attempt_end(late),
            Some(now + Duration::from_secs(10))
        );
        assert_eq!(
            limits.wait_end(now, None),
            Some(now + Duration::from_secs(10))
        );
        assert!(limits.expired(late, 2).is::<AttemptTimedOut>());
        let past = now + Duration::from_secs(10);
        assert!(limits.past_deadline(past));
        assert!(limits.expired(past, 2).is::<DeadlineExceeded>());

        let timeout_only = Limits::start(
            &RetryPolicy::default().attempt_timeout(Duration::from_secs(2)),
            None,
        );
        assert_eq!(
            timeout_only.wait_end(now, Some(RELEASE_GRACE)),
            Some(now + Duration::from_secs(2))
        );
        // A bound shortens the deadline, never lengthens it, and is one on its own.
        let ten = RetryPolicy::default().deadline(Duration::from_secs(10));
        let bounded = Limits::start(&ten, Some(Duration::from_secs(4)));
        assert_eq!(bounded.deadline(), Some(now + Duration::from_secs(4)));
        assert!(
            bounded
                .expired(now + Duration::from_secs(4), 1)
                .is::<DeadlineExceeded>()
        );
        let loose = Limits::start(&ten, Some(Duration::from_secs(40)));
        assert_eq!(loose.deadline(), Some(now + Duration::from_secs(10)));
        let only = Limits::start(&RetryPolicy::default(), Some(Duration::from_secs(3)));
        assert_eq!(only.deadline(), Some(now + Duration::from_secs(3)));
        assert!(only.bounds_attempts());

        let none = Limits::start(&RetryPolicy::default(), None);
        assert!(!none.bounds_attempts());
        assert_eq!(
            none.wait_end(now, Some(RELEASE_GRACE)),
            Some(now + RELEASE_GRACE)
        );
        assert_eq!(none.wait_end(now, None), None);
        assert_eq!(none.attempt_end(now), None);
    }
}
