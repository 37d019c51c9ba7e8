// The decisions with plain values: every answer `decide` can give, every stop, and what
// the timers' ends mean.

use super::*;

use http::StatusCode;

use crate::backoff::{Backoff, Jitter};
use crate::config::Config;
use crate::gate::{AnyGate, RetryBudget, Throttle, sealed::Sealed};
use crate::hints::HintSource;
use crate::policy::RetryPolicy;

const S503: RetryReason = RetryReason::Status(StatusCode::SERVICE_UNAVAILABLE);
const S500: RetryReason = RetryReason::Status(StatusCode::INTERNAL_SERVER_ERROR);
const MS: Duration = Duration::from_millis(1);

/// The facts `decide` may ask for, and how often it asked.
struct World {
    now: Instant,
    replay: Result<(), NotReplayable>,
    hint: Option<Hint>,
    hints_read: u32,
    replays_checked: u32,
}

impl World {
    fn new() -> Self {
        Self {
            now: crate::time::default_now(),
            replay: Ok(()),
            hint: None,
            hints_read: 0,
            replays_checked: 0,
        }
    }
}

impl Facts for World {
    fn now(&mut self) -> Instant {
        self.now
    }

    fn replay(&mut self) -> Result<(), NotReplayable> {
        self.replays_checked += 1;
        self.replay
    }

    fn server_hint(&mut self) -> Option<Hint> {
        self.hints_read += 1;
        self.hint
    }
}

/// 3 attempts, waits of exactly 200 ms, 400 ms, ... (no jitter), no gates.
fn policy() -> RetryPolicy {
    RetryPolicy::default().backoff(Backoff::exponential(100 * MS, 10_000 * MS).jitter(Jitter::None))
}

fn plan(policy: RetryPolicy) -> Plan {
    gated(policy, None, None)
}

fn gated(policy: RetryPolicy, budget: Option<RetryBudget>, throttle: Option<Throttle>) -> Plan {
    let policy = budget.into_iter().fold(policy, RetryPolicy::gate);
    let policy = throttle.into_iter().fold(policy, RetryPolicy::gate);
    Plan::resolve(policy, &Config::default())
}

/// A budget with `tokens` and no refill, or `ratio` per request.
fn no_refill(ratio: f64, max_tokens: f64) -> RetryBudget {
    RetryBudget::builder()
        .ratio(ratio)
        .min_per_sec(0.0)
        .max_tokens(max_tokens)
        .build()
}

/// Gates of these kinds.
fn gates(list: Vec<AnyGate>) -> Gates {
    Gates::new(list)
}

fn outcome(verdict: Classification) -> Outcome {
    Outcome {
        verdict,
        responded: true,
        may_repeat: true,
        released: false,
        never_left: None,
    }
}

fn first() -> RetryInfo {
    RetryInfo::default()
}

/// The retry just decided is sent: the attempt after it is in flight.
fn sent(info: &mut RetryInfo) {
    attempt_ended(info, AttemptOutcome::Abandoned);
}

fn no_limits() -> Limits {
    Limits::start(&RetryPolicy::new().settings(), None, &Clock::default())
}

/// `decide` on a first outcome; the answer and the record.
fn once(plan: &Plan, limits: &Limits, o: Outcome, world: &mut World) -> (Answer, RetryInfo) {
    let mut info = first();
    let answer = decide(plan, &plan.gates, limits, &o, world, None, &mut info);
    (answer, info)
}

fn wait_of(answer: &Answer) -> Option<Duration> {
    match answer {
        Answer::Retry { wait, .. } => Some(*wait),
        _ => None,
    }
}

#[test]
fn a_success_or_a_final_outcome_is_returned() {
    let plan = plan(policy());
    for verdict in [Classification::Success, Classification::Done] {
        let (answer, info) = once(&plan, &no_limits(), outcome(verdict), &mut World::new());
        assert!(matches!(answer, Answer::Return), "{verdict:?}");
        assert_eq!(info.stop(), StopReason::Final);
        assert!(info.retries().is_empty());
    }
    let mut info = first();
    succeeded(&mut info);
    assert_eq!(info.stop(), StopReason::Final);
    assert_eq!(info.returned(), Some(1));
    let mut info = first();
    caller_body_failed(&mut info);
    assert_eq!(info.stop(), StopReason::Final);
}

#[tokio::test(start_paused = true)]
async fn a_final_error_at_the_deadline_is_the_deadlines_doing() {
    let plan = plan(policy().deadline(Duration::from_secs(2)));
    let limits = Limits::start(&plan.policy, None, &Clock::default());
    let mut world = World::new();
    world.now += Duration::from_secs(2);
    let error = Outcome {
        responded: false,
        ..outcome(Classification::Done)
    };
    let (answer, info) = once(&plan, &limits, error, &mut world);
    assert!(matches!(answer, Answer::Return));
    assert_eq!(info.stop(), StopReason::Deadline);
    // A final response at the same moment is final, not late.
    let (_, info) = once(&plan, &limits, outcome(Classification::Done), &mut world);
    assert_eq!(info.stop(), StopReason::Final);
}

#[test]
fn a_retryable_outcome_waits_the_backoff_and_starts_the_course() {
    let plan = plan(policy());
    let mut world = World::new();
    let mut info = first();
    let answer = decide(
        &plan,
        &plan.gates,
        &no_limits(),
        &outcome(Classification::Retry(S503)),
        &mut world,
        None,
        &mut info,
    );
    let Answer::Retry {
        wait,
        start: Some(mut course),
    } = answer
    else {
        panic!("a first retry with its course: {answer:?}");
    };
    assert_eq!(wait, 200 * MS);
    assert_eq!(info.retries().len(), 1);
    assert_eq!(info.retries()[0].reason, S503);
    assert_eq!(info.total_wait(), 200 * MS);
    assert_eq!(world.replays_checked, 1);
    // The second retry goes on from the course: the next ceiling, and no new course.
    sent(&mut info);
    let answer = decide(
        &plan,
        &plan.gates,
        &no_limits(),
        &outcome(Classification::Retry(S503)),
        &mut world,
        Some(&mut course),
        &mut info,
    );
    assert!(matches!(answer, Answer::Retry { wait, start: None } if wait == 400 * MS));
    assert_eq!(info.total_wait(), 600 * MS);
    // The third outcome has no attempt left.
    sent(&mut info);
    let answer = decide(
        &plan,
        &plan.gates,
        &no_limits(),
        &outcome(Classification::Retry(S503)),
        &mut world,
        Some(&mut course),
        &mut info,
    );
    assert!(matches!(answer, Answer::Return));
    assert_eq!(info.stop(), StopReason::MaxAttempts);
}

#[test]
fn the_request_must_be_repeatable_unless_the_server_never_saw_it() {
    let plan = plan(policy());
    let keyless = |verdict| Outcome {
        may_repeat: false,
        ..outcome(verdict)
    };
    let (answer, info) = once(
        &plan,
        &no_limits(),
        keyless(Classification::Retry(S503)),
        &mut World::new(),
    );
    assert!(matches!(answer, Answer::Return));
    assert_eq!(info.stop(), StopReason::NotIdempotent);
    for proof in [RetryReason::Connect, RetryReason::RefusedStream] {
        let (answer, _) = once(
            &plan,
            &no_limits(),
            keyless(Classification::Retry(proof)),
            &mut World::new(),
        );
        assert!(wait_of(&answer).is_some(), "{proof:?}");
    }
}

#[test]
fn a_500_is_retried_once() {
    let plan = plan(policy());
    let mut info = first();
    info.push_retry(record(S500));
    sent(&mut info);
    let answer = decide(
        &plan,
        &plan.gates,
        &no_limits(),
        &outcome(Classification::RetryOnce(S500)),
        &mut World::new(),
        None,
        &mut info,
    );
    assert!(matches!(answer, Answer::Return));
    assert_eq!(info.stop(), StopReason::Final);
}

#[test]
fn the_server_saying_stop_stops_after_the_other_rules() {
    let plan = plan(policy());
    let (answer, info) = once(
        &plan,
        &no_limits(),
        outcome(Classification::Stop(S503)),
        &mut World::new(),
    );
    assert!(matches!(answer, Answer::Return));
    assert_eq!(info.stop(), StopReason::ServerSaidStop);
    // No attempts left: that is the reason, whatever the server said.
    let one = plan_one();
    let (_, info) = once(
        &one,
        &no_limits(),
        outcome(Classification::Stop(S503)),
        &mut World::new(),
    );
    assert_eq!(info.stop(), StopReason::MaxAttempts);
}

fn plan_one() -> Plan {
    plan(policy().max_attempts(1))
}

#[test]
fn the_throttle_hears_each_outcome_once_and_its_refusal_comes_after_the_limits() {
    let throttle = Throttle::builder().max_tokens(4.0).token_ratio(1.0).build();
    let plan = gated(policy(), None, Some(throttle.clone()));
    // 3 tokens left: above half, retried.
    let (answer, _) = once(
        &plan,
        &no_limits(),
        outcome(Classification::Retry(S503)),
        &mut World::new(),
    );
    assert!(wait_of(&answer).is_some());
    assert_eq!(throttle.tokens(), 3.0);
    // 2 left: not above half.
    let (answer, info) = once(
        &plan,
        &no_limits(),
        outcome(Classification::Retry(S503)),
        &mut World::new(),
    );
    // Refused by a gate: the driver logs it as such, with the reason it refused.
    assert!(matches!(answer, Answer::Refused(S503)));
    assert_eq!(info.stop(), StopReason::Throttled);
    assert_eq!(throttle.tokens(), 2.0);
    // The limits' own stop is the reason, but the failure is still counted.
    let one = gated(policy().max_attempts(1), None, Some(throttle.clone()));
    let (_, info) = once(
        &one,
        &no_limits(),
        outcome(Classification::Retry(S503)),
        &mut World::new(),
    );
    assert_eq!(info.stop(), StopReason::MaxAttempts);
    assert_eq!(throttle.tokens(), 1.0);
    // A success gives back; a final failure counts neither way.
    once(
        &plan,
        &no_limits(),
        outcome(Classification::Success),
        &mut World::new(),
    );
    assert_eq!(throttle.tokens(), 2.0);
    once(
        &plan,
        &no_limits(),
        outcome(Classification::Done),
        &mut World::new(),
    );
    assert_eq!(throttle.tokens(), 2.0);
    // Decided again after the body's release: not heard twice.
    let again = Outcome {
        released: true,
        ..outcome(Classification::Retry(S503))
    };
    let (answer, _) = once(&plan, &no_limits(), again, &mut World::new());
    assert!(
        wait_of(&answer).is_some(),
        "its refusal came with the first hearing"
    );
    assert_eq!(throttle.tokens(), 2.0);
}

#[test]
fn a_body_that_cannot_be_sent_again_stops_or_is_waited_for() {
    let plan = plan(policy());
    for cause in [NotReplayable::TooLarge, NotReplayable::BodyError] {
        let mut world = World::new();
        world.replay = Err(cause);
        let (answer, info) = once(
            &plan,
            &no_limits(),
            outcome(Classification::Retry(S503)),
            &mut world,
        );
        assert!(matches!(answer, Answer::Return), "{cause:?}");
        assert_eq!(info.stop(), StopReason::BodyNotReplayable);
    }
    // Still held by the transport: wait for it to let go, once.
    let mut world = World::new();
    world.replay = Err(NotReplayable::InFlight);
    let (answer, info) = once(
        &plan,
        &no_limits(),
        outcome(Classification::Retry(S503)),
        &mut world,
    );
    assert!(matches!(answer, Answer::AwaitRelease));
    assert!(info.retries().is_empty());
    let released = Outcome {
        released: true,
        ..outcome(Classification::Retry(S503))
    };
    let (answer, info) = once(&plan, &no_limits(), released, &mut world);
    assert!(matches!(answer, Answer::Return));
    assert_eq!(info.stop(), StopReason::BodyNotReplayable);
    // A final outcome never asks about the body.
    let mut world = World::new();
    once(
        &plan,
        &no_limits(),
        outcome(Classification::Done),
        &mut world,
    );
    assert_eq!(world.replays_checked, 0);
}

/// The reason an outcome was given is booked for its attempt when the request stops on it
/// (no retry will carry it), or may (the wait for the body's release); never when a retry
/// goes ahead, and never for an outcome without one.
#[test]
fn the_reason_of_the_outcome_stopped_on_is_booked_for_its_attempt() {
    const CONNECT: RetryReason = RetryReason::Connect;
    let error = |verdict| Outcome {
        responded: false,
        ..outcome(verdict)
    };
    let decided = |plan: &Plan, o: Outcome, world: &mut World| {
        let mut info = first();
        attempt_ended(&mut info, AttemptOutcome::Error);
        let answer = decide(plan, &plan.gates, &no_limits(), &o, world, None, &mut info);
        (answer, info)
    };
    // Retried: the retry carries the reason, nothing is booked.
    let (answer, info) = decided(
        &plan(policy()),
        error(Classification::Retry(CONNECT)),
        &mut World::new(),
    );
    assert!(wait_of(&answer).is_some());
    assert_eq!(info.booked_causes(), []);
    assert_eq!(info.retries()[0].reason, CONNECT);
    // No reason to book.
    for verdict in [Classification::Success, Classification::Done] {
        let (_, info) = decided(&plan(policy()), error(verdict), &mut World::new());
        assert_eq!(info.booked_causes(), [], "{verdict:?}");
    }
    // Every stop on an outcome with a reason books it.
    let last = plan(policy().max_attempts(1));
    let (_, info) = decided(
        &last,
        error(Classification::Retry(CONNECT)),
        &mut World::new(),
    );
    assert_eq!(info.stop(), StopReason::MaxAttempts);
    assert_eq!(info.booked_causes(), [(1, CONNECT)]);
    assert_eq!(
        info.to_string(),
        "1 attempt: connect error; stopped: max attempts"
    );
    let keyless = Outcome {
        may_repeat: false,
        ..error(Classification::Retry(RetryReason::ConnectionClosed))
    };
    let (_, info) = decided(&plan(policy()), keyless, &mut World::new());
    assert_eq!(info.stop(), StopReason::NotIdempotent);
    assert_eq!(info.booked_causes(), [(1, RetryReason::ConnectionClosed)]);
    let (_, info) = decided(
        &plan(policy()),
        error(Classification::Stop(CONNECT)),
        &mut World::new(),
    );
    assert_eq!(info.stop(), StopReason::ServerSaidStop);
    assert_eq!(info.booked_causes(), [(1, CONNECT)]);
    let budget = no_refill(0.0, 1.0);
    while tower::retry::budget::Budget::withdraw(&budget) {}
    let empty = gated(policy(), Some(budget), None);
    let (_, info) = decided(
        &empty,
        error(Classification::Retry(CONNECT)),
        &mut World::new(),
    );
    assert_eq!(info.stop(), StopReason::BudgetExhausted);
    assert_eq!(info.booked_causes(), [(1, CONNECT)]);
    let mut world = World::new();
    world.replay = Err(NotReplayable::TooLarge);
    let (_, info) = decided(
        &plan(policy()),
        error(Classification::Retry(CONNECT)),
        &mut world,
    );
    assert_eq!(info.stop(), StopReason::BodyNotReplayable);
    assert_eq!(info.booked_causes(), [(1, CONNECT)]);
    // The body still held: the outcome may be returned after the wait, its reason booked.
    world.replay = Err(NotReplayable::InFlight);
    let (answer, info) = decided(
        &plan(policy()),
        error(Classification::Retry(CONNECT)),
        &mut world,
    );
    assert!(matches!(answer, Answer::AwaitRelease));
    assert_eq!(info.booked_causes(), [(1, CONNECT)]);
    // A second 500 is final; its reason is booked with it.
    let s500 = Classification::RetryOnce(S500);
    let mut info = first();
    attempt_ended(
        &mut info,
        AttemptOutcome::Response(StatusCode::INTERNAL_SERVER_ERROR),
    );
    info.push_retry(record(S500));
    attempt_ended(
        &mut info,
        AttemptOutcome::Response(StatusCode::INTERNAL_SERVER_ERROR),
    );
    let p = plan(policy());
    decide(
        &p,
        &p.gates,
        &no_limits(),
        &outcome(s500),
        &mut World::new(),
        None,
        &mut info,
    );
    assert_eq!(info.stop(), StopReason::Final);
    assert_eq!(info.booked_causes(), [(2, S500)]);
}

#[test]
fn the_classifiers_hint_comes_first_then_the_servers() {
    let plan = plan(policy());
    // The server's hint, a floor above the 200 ms backoff.
    let mut world = World::new();
    world.hint = Some(Hint::new(Duration::from_secs(2), HintSource::RetryAfter));
    let (answer, info) = once(
        &plan,
        &no_limits(),
        outcome(Classification::Retry(S503)),
        &mut world,
    );
    assert_eq!(wait_of(&answer), Some(Duration::from_secs(2)));
    assert_eq!(info.retries()[0].hint, Some(HintSource::RetryAfter));
    assert_eq!(info.retries()[0].hint, Some(HintSource::RetryAfter));
    // Below the backoff it changes nothing, and the record says the backoff decided.
    world.hint = Some(Hint::new(50 * MS, HintSource::RateLimit));
    let (answer, info) = once(
        &plan,
        &no_limits(),
        outcome(Classification::Retry(S503)),
        &mut world,
    );
    assert_eq!(wait_of(&answer), Some(200 * MS));
    assert_eq!(info.retries()[0].hint, None);
    // The classifier's own: the server's headers are not even read.
    let mut world = World::new();
    world.hint = Some(Hint::new(Duration::from_secs(9), HintSource::RetryAfter));
    let own = Hint::new(Duration::from_secs(1), HintSource::Classifier);
    let (answer, info) = once(
        &plan,
        &no_limits(),
        outcome(Classification::RetryWithHint(S503, own)),
        &mut world,
    );
    assert_eq!(wait_of(&answer), Some(Duration::from_secs(1)));
    assert_eq!(info.retries()[0].hint, Some(HintSource::Classifier));
    assert_eq!(world.hints_read, 0);
    // An error has no headers to read.
    let error = Outcome {
        responded: false,
        ..outcome(Classification::Retry(RetryReason::Timeout))
    };
    once(&plan, &no_limits(), error, &mut world);
    assert_eq!(world.hints_read, 0);
}

#[test]
fn an_exact_hint_is_the_wait_bounded_only_by_the_deadline_and_restarts_the_backoff() {
    let plan = plan(policy());
    let pushback = HintSource::Header("x-pushback");
    // Shorter than the backoff, and longer than max_retry_after: exact either way.
    for wait in [10 * MS, Duration::from_secs(60)] {
        let verdict = Classification::RetryWithHint(S503, Hint::exact(wait, pushback));
        let (answer, info) = once(&plan, &no_limits(), outcome(verdict), &mut World::new());
        assert_eq!(wait_of(&answer), Some(wait));
        assert_eq!(info.retries()[0].hint, Some(pushback));
    }
    // After it, the backoff counts from the first retry again.
    let mut info = first();
    let exact = Classification::RetryWithHint(S503, Hint::exact(10 * MS, pushback));
    let answer = decide(
        &plan,
        &plan.gates,
        &no_limits(),
        &outcome(exact),
        &mut World::new(),
        None,
        &mut info,
    );
    let Answer::Retry {
        start: Some(mut course),
        ..
    } = answer
    else {
        panic!("{answer:?}");
    };
    sent(&mut info);
    let answer = decide(
        &plan,
        &plan.gates,
        &no_limits(),
        &outcome(Classification::Retry(S503)),
        &mut World::new(),
        Some(&mut course),
        &mut info,
    );
    assert_eq!(
        wait_of(&answer),
        Some(200 * MS),
        "the first retry's ceiling"
    );
    // Past the deadline it stops, as a hint too long.
    let limited = self::plan(policy().deadline(Duration::from_secs(5)));
    let limits = Limits::start(&limited.policy, None, &Clock::default());
    let verdict =
        Classification::RetryWithHint(S503, Hint::exact(Duration::from_secs(6), pushback));
    let (answer, info) = once(&limited, &limits, outcome(verdict), &mut World::new());
    assert!(matches!(answer, Answer::Return));
    assert_eq!(info.stop(), StopReason::HintTooLong);
}

#[test]
fn a_hint_too_long_or_a_wait_past_the_deadline_stops() {
    let plan = plan(policy().max_retry_after(Duration::from_secs(30)));
    let mut world = World::new();
    world.hint = Some(Hint::new(Duration::from_secs(31), HintSource::RetryAfter));
    let (_, info) = once(
        &plan,
        &no_limits(),
        outcome(Classification::Retry(S503)),
        &mut world,
    );
    assert_eq!(info.stop(), StopReason::HintTooLong);
    // The deadline leaves 150 ms: a hint past it is too long; the backoff past it is the
    // deadline.
    let limited = self::plan(policy().deadline(150 * MS));
    let limits = Limits::start(&limited.policy, None, &Clock::default());
    let mut world = World::new();
    world.hint = Some(Hint::new(Duration::from_secs(1), HintSource::RetryAfter));
    let (_, info) = once(
        &limited,
        &limits,
        outcome(Classification::Retry(S503)),
        &mut world,
    );
    assert_eq!(info.stop(), StopReason::HintTooLong);
    let (_, info) = once(
        &limited,
        &limits,
        outcome(Classification::Retry(S503)),
        &mut World::new(),
    );
    assert_eq!(info.stop(), StopReason::Deadline);
}

#[test]
fn the_budget_is_asked_last_and_its_refusal_is_recorded() {
    let budget = no_refill(0.0, 1.0);
    let plan = gated(policy(), Some(budget.clone()), None);
    let (answer, _) = once(
        &plan,
        &no_limits(),
        outcome(Classification::Retry(S503)),
        &mut World::new(),
    );
    assert!(wait_of(&answer).is_some());
    assert_eq!(budget.tokens(), 0.0);
    let (answer, info) = once(
        &plan,
        &no_limits(),
        outcome(Classification::Retry(S503)),
        &mut World::new(),
    );
    assert!(matches!(answer, Answer::Refused(S503)));
    assert_eq!(info.stop(), StopReason::BudgetExhausted);
    // A retry that cannot happen for another reason spends nothing.
    tower::retry::budget::Budget::deposit(&budget);
    let mut world = World::new();
    world.replay = Err(NotReplayable::TooLarge);
    let full = no_refill(1.0, 1.0);
    let refill = gated(policy(), Some(full.clone()), None);
    let before = full.tokens();
    once(
        &refill,
        &no_limits(),
        outcome(Classification::Retry(S503)),
        &mut world,
    );
    assert_eq!(full.tokens(), before);
}

#[test]
fn a_transparent_retry_waits_nothing_is_not_counted_and_is_paid_for() {
    let budget = no_refill(0.0, 5.0);
    let throttle = Throttle::builder()
        .max_tokens(10.0)
        .token_ratio(1.0)
        .build();
    let plan = gated(
        policy().max_attempts(1).transparent_retry(true),
        Some(budget.clone()),
        Some(throttle.clone()),
    );
    let refused = Outcome {
        responded: false,
        may_repeat: false,
        never_left: Some(RetryReason::RefusedStream),
        ..outcome(Classification::Retry(RetryReason::RefusedStream))
    };
    let mut world = World::new();
    world.hint = Some(Hint::new(Duration::from_secs(99), HintSource::RetryAfter));
    let mut info = first();
    let answer = decide(
        &plan,
        &plan.gates,
        &no_limits(),
        &refused,
        &mut world,
        None,
        &mut info,
    );
    let Answer::Retry {
        wait,
        start: Some(mut course),
    } = answer
    else {
        panic!("{answer:?}");
    };
    assert_eq!(wait, Duration::ZERO);
    assert!(info.retries()[0].is_transparent());
    assert_eq!(info.retries()[0].hint, None, "no hint is read for it");
    assert_eq!(throttle.tokens(), 10.0, "outside the throttle");
    assert_eq!(budget.tokens(), 4.0, "paid for by the budget");
    // A second refusal goes by the normal rules: one attempt counted, none left.
    sent(&mut info);
    let answer = decide(
        &plan,
        &plan.gates,
        &no_limits(),
        &refused,
        &mut world,
        Some(&mut course),
        &mut info,
    );
    assert!(matches!(answer, Answer::Return));
    assert_eq!(info.stop(), StopReason::MaxAttempts);
    assert_eq!(throttle.tokens(), 9.0, "heard as a failure");
    // Without the policy flag a refusal is a normal retry.
    let plain = plan_one();
    let (_, info) = once(&plain, &no_limits(), refused, &mut World::new());
    assert_eq!(info.stop(), StopReason::MaxAttempts);
}

#[test]
fn decorrelated_jitter_goes_on_from_the_wait_slept_not_a_transparent_one() {
    let backoff = Backoff::exponential(100 * MS, 10_000 * MS).jitter(Jitter::Decorrelated);
    let plan = plan(
        RetryPolicy::default()
            .max_attempts(5)
            .transparent_retry(true)
            .backoff(backoff)
            .rng_seed(7),
    );
    let mut info = first();
    let hint = Hint::new(Duration::from_secs(3), HintSource::RetryAfter);
    let mut world = World::new();
    world.hint = Some(hint);
    let answer = decide(
        &plan,
        &plan.gates,
        &no_limits(),
        &outcome(Classification::Retry(S503)),
        &mut world,
        None,
        &mut info,
    );
    let Answer::Retry {
        start: Some(mut course),
        ..
    } = answer
    else {
        panic!("{answer:?}");
    };
    assert_eq!(
        course.previous,
        Duration::from_secs(3),
        "the wait slept, hint included"
    );
    let refused = Outcome {
        responded: false,
        never_left: Some(RetryReason::RefusedStream),
        ..outcome(Classification::Retry(RetryReason::RefusedStream))
    };
    sent(&mut info);
    decide(
        &plan,
        &plan.gates,
        &no_limits(),
        &refused,
        &mut World::new(),
        Some(&mut course),
        &mut info,
    );
    assert!(info.retries()[1].is_transparent());
    assert_eq!(
        course.previous,
        Duration::from_secs(3),
        "a transparent retry is no backoff"
    );
}

#[tokio::test(start_paused = true)]
async fn an_expired_attempt_is_the_deadline_or_a_retryable_timeout() {
    let policy = RetryPolicy::default()
        .deadline(Duration::from_secs(10))
        .attempt_timeout(Duration::from_secs(3));
    let limits = Limits::start(&policy.settings(), None, &Clock::default());
    let now = crate::time::default_now();
    match attempt_expired(&limits, now + Duration::from_secs(3)) {
        Expired::Attempt(error) => {
            let timed_out = error.downcast_ref::<AttemptTimedOut>().unwrap();
            assert_eq!(timed_out.timeout(), Duration::from_secs(3));
        }
        other => panic!("{other:?}"),
    }
    match attempt_expired(&limits, now + Duration::from_secs(10)) {
        Expired::Deadline(error) => {
            let deadline = error.downcast_ref::<DeadlineExceeded>().unwrap();
            assert_eq!(deadline.deadline(), Duration::from_secs(10));
        }
        other => panic!("{other:?}"),
    }
    let mut info = first();
    deadline_passed(&mut info);
    assert_eq!(info.stop(), StopReason::Deadline);
}

#[tokio::test(start_paused = true)]
async fn a_body_never_released_is_the_deadline_or_not_replayable() {
    let limits = Limits::start(
        &RetryPolicy::default()
            .deadline(Duration::from_secs(1))
            .settings(),
        None,
        &Clock::default(),
    );
    let now = crate::time::default_now();
    let mut info = first();
    release_timed_out(&limits, now, &mut info);
    assert_eq!(info.stop(), StopReason::BodyNotReplayable);
    release_timed_out(&limits, now + Duration::from_secs(1), &mut info);
    assert_eq!(info.stop(), StopReason::Deadline);
}

#[tokio::test(start_paused = true)]
async fn readiness_sends_the_next_attempt_or_ends_the_request() {
    let policy = RetryPolicy::default()
        .deadline(Duration::from_secs(10))
        .attempt_timeout(Duration::from_secs(2));
    let limits = Limits::start(&policy.settings(), None, &Clock::default());
    let now = crate::time::default_now();
    // Ready in time: attempt 2, one earlier attempt counted, 7 s left.
    let mut info = first();
    info.push_retry(record(S503));
    let attempt = ready(&limits, now + Duration::from_secs(3), &mut info).unwrap();
    assert_eq!(
        attempt,
        Attempt {
            number: 2,
            counted_before: 1,
            time_left: Some(Duration::from_secs(7)),
            timeout: Some(Duration::from_secs(2)),
            kind: AttemptKind::Retry,
        }
    );
    assert_eq!(info.attempts(), 2);
    // After a transparent retry: numbered on the wire, not counted.
    info.push_retry(transparent_record(RetryReason::RefusedStream));
    let attempt = ready(&limits, now, &mut info).unwrap();
    assert_eq!((attempt.number, attempt.counted_before), (3, 1));
    assert_eq!(attempt.kind, AttemptKind::Transparent);
    // Ready only after the deadline: nothing is sent.
    let mut late = first();
    let error = ready(&limits, now + Duration::from_secs(10), &mut late).unwrap_err();
    assert!(error.is::<DeadlineExceeded>());
    assert_eq!((late.attempts(), late.stop()), (1, StopReason::Deadline));
    // Never ready: the service's fault, with the attempt that was to be sent, or the
    // deadline's when that came first.
    let mut info = first();
    info.push_retry(record(S503));
    let error = not_ready(&limits, now + Duration::from_secs(2), &mut info);
    let not = error.downcast_ref::<ServiceNotReady>().unwrap();
    assert_eq!(not.timeout(), Duration::from_secs(2));
    assert_eq!(info.stop(), StopReason::ServiceNotReady);
    assert_eq!(
        info.retries().len(),
        1,
        "the retry that asked stays in the record"
    );
    let error = not_ready(&limits, now + Duration::from_secs(10), &mut info);
    assert!(error.is::<DeadlineExceeded>());
    assert_eq!(info.stop(), StopReason::Deadline);
    // Failed to get ready: the service's fault, the deadline's only when it had passed.
    let mut info = first();
    ready_failed(&limits, || now, &mut info);
    assert_eq!(info.stop(), StopReason::ServiceNotReady);
    ready_failed(&limits, || now + Duration::from_secs(11), &mut info);
    assert_eq!(info.stop(), StopReason::Deadline);
    // The first attempt: the whole deadline, no clock read.
    assert_eq!(
        first_attempt(&limits),
        Attempt {
            number: 1,
            counted_before: 0,
            time_left: Some(Duration::from_secs(10)),
            timeout: Some(Duration::from_secs(2)),
            kind: AttemptKind::First,
        }
    );
    assert_eq!(first_attempt(&no_limits()).time_left, None);
}

#[tokio::test(start_paused = true)]
async fn the_floor_keeps_attempts_from_starting_with_too_little_time() {
    let policy = RetryPolicy::default()
        .deadline(Duration::from_secs(1))
        .min_time_left(Duration::from_millis(300));
    let limits = Limits::start(&policy.settings(), None, &Clock::default());
    let now = crate::time::default_now();
    assert!(!limits.no_time_at_start());
    assert_eq!(limits.start_by(now), Some(now + Duration::from_millis(700)));
    assert!(!limits.too_late_to_start(now + Duration::from_millis(700)));
    assert!(limits.too_late_to_start(now + Duration::from_millis(701)));
    // A retry ready with less than the floor left is not sent; the error names the floor.
    let mut info = first();
    info.push_retry(record(S503));
    let error = ready(&limits, now + Duration::from_millis(800), &mut info).unwrap_err();
    assert_eq!(
        error.to_string(),
        "request deadline of 1s exceeded: less than the 300ms floor was left to start an attempt"
    );
    assert_eq!(info.stop(), StopReason::Deadline);
    // Once the deadline itself has passed, the error is the plain one.
    let error = ready(&limits, now + Duration::from_secs(1), &mut first()).unwrap_err();
    assert_eq!(error.to_string(), "request deadline of 1s exceeded");
    // A wait that ends after the last start is not taken.
    let schedule = |wait: u64| Schedule {
        reason: RetryReason::Status(StatusCode::SERVICE_UNAVAILABLE),
        backoff: Duration::from_millis(wait),
        hint: None,
        max_hint: Duration::from_secs(30),
        now,
        deadline: limits.start_by(now),
        transparent: false,
    };
    let gates = Plan::resolve(RetryPolicy::new(), &Config::default()).gates;
    let mut ticket = Ticket::default();
    assert!(schedule_retry(&schedule(600), &gates, &mut ticket).is_ok());
    assert_eq!(
        schedule_retry(&schedule(700), &gates, &mut ticket).unwrap_err(),
        StopReason::Deadline
    );
    // A deadline shorter than the floor: no first attempt.
    let short = RetryPolicy::default()
        .deadline(Duration::from_millis(200))
        .min_time_left(Duration::from_millis(300));
    assert!(Limits::start(&short.settings(), None, &Clock::default()).no_time_at_start());
    // No deadline, no floor.
    let unbounded = RetryPolicy::default().min_time_left(Duration::from_secs(1));
    let limits = Limits::start(&unbounded.settings(), None, &Clock::default());
    assert!(!limits.no_time_at_start() && !limits.too_late_to_start(now));
    assert_eq!(limits.start_by(now), None);
}

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
        kind: AttemptKind::Retry,
        reason,
        wait: Duration::ZERO,
        hint: None,
        outcome: AttemptOutcome::NotSent,
    }
}

#[test]
fn judge_follows_the_verdict_the_method_and_the_attempts() {
    assert_eq!(
        judge(&judgement(Classification::Done)),
        Err(StopReason::Final)
    );
    assert_eq!(
        judge(&judgement(Classification::Success)),
        Err(StopReason::Final)
    );
    assert_eq!(judge(&judgement(Classification::Retry(S503))), Ok(S503));
    assert_eq!(judge(&judgement(Classification::Stop(S503))), Ok(S503));
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
    // A final error at or after the deadline ended because the time was up; a retryable
    // one is judged as before (the schedule then finds no time left); a success is a
    // success.
    let late = |verdict| Judgement {
        failed_after_deadline: true,
        ..judgement(verdict)
    };
    assert_eq!(
        judge(&late(Classification::Done)),
        Err(StopReason::Deadline)
    );
    assert_eq!(
        judge(&late(Classification::Success)),
        Err(StopReason::Final)
    );
    assert_eq!(judge(&late(Classification::Retry(S503))), Ok(S503));
}

fn transparent_record(reason: RetryReason) -> RetryRecord {
    RetryRecord {
        kind: AttemptKind::Transparent,
        ..record(reason)
    }
}

#[test]
fn a_refused_stream_is_retried_transparently_once_whatever_the_verdict() {
    use RetryReason::RefusedStream;
    for verdict in [
        Classification::Retry(RefusedStream),
        Classification::RetryOnce(RefusedStream),
        // A gRPC policy that does not list UNAVAILABLE: final, but the transport's own
        // retry still applies.
        Classification::Done,
        Classification::Retry(RetryReason::ConnectionClosed),
    ] {
        assert_eq!(
            transparent(true, Some(RefusedStream), verdict, &[]),
            Some(RefusedStream),
            "{verdict:?}"
        );
        // Only for a policy that has them, and only for a refused stream.
        assert_eq!(
            transparent(false, Some(RefusedStream), verdict, &[]),
            None,
            "{verdict:?}"
        );
        assert_eq!(transparent(true, None, verdict, &[]), None, "{verdict:?}");
    }
    // After a normal retry it is still available; after a transparent one, not.
    let verdict = Classification::Retry(RefusedStream);
    let normal = [record(S503)];
    assert_eq!(
        transparent(true, Some(RefusedStream), verdict, &normal),
        Some(RefusedStream)
    );
    let once = [record(S503), transparent_record(RefusedStream)];
    assert_eq!(transparent(true, Some(RefusedStream), verdict, &once), None);
    // A classifier that says stop is obeyed.
    let stop = Classification::Stop(RefusedStream);
    assert_eq!(transparent(true, Some(RefusedStream), stop, &[]), None);
    // A request hyper never started is the other proof the transport gives.
    let not_sent = Some(RetryReason::NotSent);
    assert_eq!(
        transparent(true, not_sent, Classification::Done, &[]),
        not_sent
    );
    // A connect error proves the request unseen, but is the retry policy's to judge.
    let connect = Classification::Retry(RetryReason::Connect);
    assert_eq!(transparent(true, None, connect, &[]), None);
}

#[test]
fn transparent_retries_do_not_count_against_max_attempts() {
    let refused = [transparent_record(RetryReason::RefusedStream)];
    assert_eq!(counted_attempts(2, &refused), 1);
    assert_eq!(counted_attempts(1, &[]), 1);
    assert_eq!(counted_attempts(0, &refused), 0, "saturates");
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
    // Counted from the last exact hint.
    assert_eq!(backoff_number(&[record(S503), t, record(S503)], 1), 2);
    assert_eq!(backoff_number(&[record(S503)], 1), 1);
    assert_eq!(backoff_number(&[record(S503)], 5), 1, "past the end");
}

fn schedule(backoff: u64, hint: Option<u64>, deadline_in: Option<u64>) -> Schedule {
    let now = crate::time::default_now();
    Schedule {
        reason: S503,
        backoff: Duration::from_millis(backoff),
        hint: hint.map(|ms| Hint::new(Duration::from_millis(ms), HintSource::RetryAfter)),
        max_hint: Duration::from_secs(30),
        now,
        deadline: deadline_in.map(|ms| now + Duration::from_millis(ms)),
        transparent: false,
    }
}

fn scheduled(s: &Schedule, gates: &Gates) -> Result<RetryRecord, StopReason> {
    schedule_retry(s, gates, &mut Ticket::default())
}

#[test]
fn within_a_millisecond_of_the_deadline_leaves_no_room_for_an_attempt() {
    assert_eq!(
        scheduled(&schedule(4_000, None, Some(4_000)), &Gates::default()),
        Err(StopReason::Deadline)
    );
    assert_eq!(
        scheduled(&schedule(3_999, None, Some(4_000)), &Gates::default()),
        Err(StopReason::Deadline)
    );
    assert!(scheduled(&schedule(3_998, None, Some(4_000)), &Gates::default()).is_ok());
    // A transparent retry keeps the deadline too.
    let at_once = Schedule {
        transparent: true,
        ..schedule(0, Some(31_000), Some(1))
    };
    assert_eq!(
        scheduled(&at_once, &Gates::default()),
        Err(StopReason::Deadline)
    );
}

#[test]
fn the_gates_are_asked_last_and_only_then() {
    let one = no_refill(0.0, 1.0);
    let stop = scheduled(
        &schedule(100, Some(31_000), None),
        &gates(vec![one.clone().into_any()]),
    );
    assert_eq!(stop, Err(StopReason::HintTooLong));
    assert_eq!(
        one.tokens(),
        1.0,
        "a retry that cannot happen spends nothing"
    );
    let empty = no_refill(0.0, 1.0);
    assert!(
        scheduled(
            &schedule(100, None, None),
            &gates(vec![empty.clone().into_any()])
        )
        .is_ok()
    );
    assert_eq!(
        scheduled(&schedule(100, None, None), &gates(vec![empty.into_any()])),
        Err(StopReason::BudgetExhausted)
    );
    let spent = crate::gate::pacer::Pacer::new(Duration::ZERO, 0);
    assert_eq!(
        scheduled(&schedule(100, None, None), &gates(vec![spent.into_any()])),
        Err(StopReason::Throttled)
    );
}

#[test]
fn the_record_keeps_every_attempt_what_it_got_and_whose_outcome_was_returned() {
    let mut info = RetryInfo::default();
    assert_eq!(info.attempts(), 1);
    // Attempt 1 gets a 503; a retry is decided after 5 ms, sent, and gets a reset.
    attempt_ended(
        &mut info,
        AttemptOutcome::Response(StatusCode::SERVICE_UNAVAILABLE),
    );
    record_retry(
        &mut info,
        RetryRecord {
            wait: 5 * MS,
            ..record(S503)
        },
    );
    assert_eq!(info.attempts(), 1, "decided, not sent");
    assert_eq!(info.retries()[0].outcome, AttemptOutcome::NotSent);
    sent(&mut info);
    assert_eq!(info.attempts(), 2);
    attempt_ended(&mut info, AttemptOutcome::Error);
    // A transparent retry, sent at once, which times out.
    record_retry(&mut info, transparent_record(RetryReason::RefusedStream));
    sent(&mut info);
    attempt_ended(&mut info, AttemptOutcome::TimedOut);
    // A last retry that is never sent.
    record_retry(
        &mut info,
        RetryRecord {
            wait: Duration::MAX,
            ..record(RetryReason::Timeout)
        },
    );
    record_stop(&mut info, StopReason::ServiceNotReady);
    returning(&mut info, true);

    assert_eq!(info.attempts(), 3);
    assert_eq!(
        info.outcomes().next().unwrap(),
        AttemptOutcome::Response(StatusCode::SERVICE_UNAVAILABLE)
    );
    let kinds: Vec<_> = info.retries().iter().map(|r| r.kind).collect();
    assert_eq!(
        kinds,
        [
            AttemptKind::Retry,
            AttemptKind::Transparent,
            AttemptKind::Retry
        ]
    );
    let outcomes: Vec<_> = info.outcomes().collect();
    assert_eq!(
        outcomes,
        [
            AttemptOutcome::Response(StatusCode::SERVICE_UNAVAILABLE),
            AttemptOutcome::Error,
            AttemptOutcome::TimedOut,
        ],
        "every attempt sent, the unsent retry left out"
    );
    assert_eq!(info.retries()[2].outcome, AttemptOutcome::NotSent);
    assert_eq!(info.total_wait(), Duration::MAX, "saturates");
    assert_eq!(info.stop(), StopReason::ServiceNotReady);
    assert_eq!(info.returned(), None, "the layer's own error ended it");

    // A request whose second attempt answered: that answer is what the caller got.
    let mut info = RetryInfo::default();
    attempt_ended(&mut info, AttemptOutcome::TimedOut);
    record_retry(&mut info, record(RetryReason::Timeout));
    sent(&mut info);
    attempt_ended(&mut info, AttemptOutcome::Response(StatusCode::OK));
    returning(&mut info, false);
    assert_eq!(info.returned(), Some(2));
    assert_eq!(info.attempts(), 2);
}

#[tokio::test(start_paused = true)]
async fn limits_pick_the_first_end() {
    let policy = RetryPolicy::default()
        .deadline(Duration::from_secs(10))
        .attempt_timeout(Duration::from_secs(3));
    let now = crate::time::default_now();
    let limits = Limits::start(&policy.settings(), None, &Clock::default());
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
    assert_eq!(limits.time_left(Some(late)), Some(Duration::from_secs(2)));
    assert_eq!(
        limits.time_left(Some(now + Duration::from_secs(11))),
        Some(Duration::ZERO)
    );
    assert!(limits.past_deadline(now + Duration::from_secs(10)));

    let timeout_only = Limits::start(
        &RetryPolicy::default()
            .attempt_timeout(Duration::from_secs(2))
            .settings(),
        None,
        &Clock::default(),
    );
    assert_eq!(
        timeout_only.wait_end(now, Some(RELEASE_GRACE)),
        Some(now + Duration::from_secs(2))
    );
    // A bound shortens the deadline, never lengthens it, and is one on its own.
    let ten = RetryPolicy::default().deadline(Duration::from_secs(10));
    let bounded = Limits::start(
        &ten.settings(),
        Some(Duration::from_secs(4)),
        &Clock::default(),
    );
    assert_eq!(bounded.deadline(), Some(now + Duration::from_secs(4)));
    assert_eq!(bounded.time_left(None), Some(Duration::from_secs(4)));
    let loose = Limits::start(
        &ten.settings(),
        Some(Duration::from_secs(40)),
        &Clock::default(),
    );
    assert_eq!(loose.deadline(), Some(now + Duration::from_secs(10)));
    let only = Limits::start(
        &RetryPolicy::default().settings(),
        Some(Duration::from_secs(3)),
        &Clock::default(),
    );
    assert_eq!(only.deadline(), Some(now + Duration::from_secs(3)));
    assert!(only.bounds_attempts());

    let none = no_limits();
    assert!(!none.bounds_attempts());
    assert_eq!(
        none.wait_end(now, Some(RELEASE_GRACE)),
        Some(now + RELEASE_GRACE)
    );
    assert_eq!(none.wait_end(now, None), None);
    assert_eq!(none.attempt_end(now), None);
    assert_eq!(
        after(now, Duration::MAX),
        now + Duration::from_secs(86_400 * 365 * 30)
    );
}

// A hedged request's decisions (`decision::hedge`).

fn judged(
    policy: &crate::policy::Settings,
    verdict: Classification,
    world: &mut World,
) -> hedge::Judged {
    let limits = Limits::start(policy, None, &Clock::default());
    let mut once = Vec::new();
    hedge::outcome(
        policy,
        &Gates::default(),
        &Ticket::default(),
        &limits,
        &hedge::HedgeOutcome {
            verdict,
            responded: true,
        },
        world,
        &mut once,
    )
}

#[tokio::test(start_paused = true)]
async fn a_hedged_outcome_wins_or_sends_the_next_hedge_as_its_verdict_and_facts_say() {
    use hedge::{Judged, Next};
    let policy = policy();
    let non_fatal = |next, hint| Judged::NonFatal {
        reason: S503,
        hint,
        next,
    };
    // Fatal: returned, whatever else.
    for verdict in [Classification::Success, Classification::Done] {
        assert_eq!(
            judged(&policy.settings(), verdict, &mut World::new()),
            Judged::Wins(StopReason::Final)
        );
    }
    // Non-fatal, nothing else said: the next hedge at once.
    assert_eq!(
        judged(
            &policy.settings(),
            Classification::Retry(S503),
            &mut World::new()
        ),
        non_fatal(Next::After(Duration::ZERO), None)
    );
    // The server's floor hint sets its time; beyond `max_retry_after`, no more hedges.
    let mut world = World::new();
    world.hint = Some(Hint::new(2_000 * MS, HintSource::RetryAfter));
    assert_eq!(
        judged(&policy.settings(), Classification::Retry(S503), &mut world),
        non_fatal(Next::After(2_000 * MS), Some(HintSource::RetryAfter))
    );
    world.hint = Some(Hint::new(Duration::from_secs(60), HintSource::RetryAfter));
    assert_eq!(
        judged(&policy.settings(), Classification::Retry(S503), &mut world),
        non_fatal(
            Next::Freeze(StopReason::HintTooLong),
            Some(HintSource::RetryAfter)
        )
    );
    // A stop from the server, and a body that can never be sent again.
    assert_eq!(
        judged(
            &policy.settings(),
            Classification::Stop(S503),
            &mut World::new()
        ),
        non_fatal(Next::Freeze(StopReason::ServerSaidStop), None)
    );
    let mut large = World::new();
    large.replay = Err(NotReplayable::TooLarge);
    assert_eq!(
        judged(&policy.settings(), Classification::Retry(S503), &mut large),
        non_fatal(Next::Freeze(StopReason::BodyNotReplayable), None)
    );
    // A body still being sent is no obstacle: the hedge waits for it.
    let mut streaming = World::new();
    streaming.replay = Err(NotReplayable::InFlight);
    assert_eq!(
        judged(
            &policy.settings(),
            Classification::Retry(S503),
            &mut streaming
        ),
        non_fatal(Next::After(Duration::ZERO), None)
    );
    // A next hedge that could not start before the deadline.
    let tight = policy.clone().deadline(100 * MS);
    let mut world = World::new();
    world.hint = Some(Hint::new(200 * MS, HintSource::RetryAfter));
    assert_eq!(
        judged(&tight.settings(), Classification::Retry(S503), &mut world),
        non_fatal(
            Next::Freeze(StopReason::HintTooLong),
            Some(HintSource::RetryAfter)
        )
    );
}

#[tokio::test(start_paused = true)]
async fn the_500_once_is_non_fatal_once_per_hedged_request() {
    let policy = policy();
    let limits = Limits::start(&policy.settings(), None, &Clock::default());
    let mut once = Vec::new();
    let seen = hedge::HedgeOutcome {
        verdict: Classification::RetryOnce(S500),
        responded: true,
    };
    let mut judge = || {
        hedge::outcome(
            &policy.settings(),
            &Gates::default(),
            &Ticket::default(),
            &limits,
            &seen,
            &mut World::new(),
            &mut once,
        )
    };
    assert!(matches!(judge(), hedge::Judged::NonFatal { .. }));
    assert_eq!(judge(), hedge::Judged::Wins(StopReason::Final));
}

#[test]
fn a_hedge_asks_the_throttle_only_then_pays_the_budget() {
    let throttle = Throttle::builder().max_tokens(4.0).token_ratio(1.0).build();
    let gates = gates(vec![
        no_refill(0.0, 1.0).into_any(),
        throttle.clone().into_any(),
    ]);
    let hedge = crate::gate::Ask::Hedge(crate::classify::FailureKind::Transient);
    assert!(gates.admit(hedge).is_ok());
    assert_eq!(throttle.tokens(), 4.0, "checked, not drawn");
    assert_eq!(gates.admit(hedge).err(), Some(StopReason::BudgetExhausted));
    // At half, the throttle refuses before the budget is asked.
    assert!(
        gates
            .on_outcome(
                Heard::Failure(crate::classify::FailureKind::Transient),
                None
            )
            .is_ok()
    );
    assert!(
        gates
            .on_outcome(
                Heard::Failure(crate::classify::FailureKind::Transient),
                None
            )
            .is_err()
    );
    assert_eq!(gates.admit(hedge).err(), Some(StopReason::Throttled));
}

#[test]
fn how_a_request_may_be_repeated_is_decided_from_its_plan_method_and_key() {
    use crate::hedge::Hedging;
    use http::Method;

    let plain = plan(policy());
    let declared = plan(policy().assume_idempotent(true));
    let hedging = plan(policy().hedge(Hedging::after(10 * MS)));
    let hedging_declared = plan(
        policy()
            .hedge(Hedging::after(10 * MS))
            .assume_idempotent(true),
    );
    let once = plan(policy().max_attempts(1));
    let never = plan(RetryPolicy::never());
    let hedging_once = plan(policy().max_attempts(1).hedge(Hedging::after(10 * MS)));
    let transparent_once = plan(policy().max_attempts(1).transparent_retry(true));
    let query = Method::from_bytes(b"QUERY").unwrap();
    let cases = [
        (&plain, Method::GET, false, Repeat::Retry),
        (&plain, Method::PUT, false, Repeat::Retry),
        (&plain, Method::POST, false, Repeat::IfUnseen),
        (&plain, Method::POST, true, Repeat::Retry),
        (&plain, Method::PATCH, false, Repeat::IfUnseen),
        (&plain, Method::CONNECT, true, Repeat::Once),
        (&declared, Method::POST, false, Repeat::Retry),
        (&hedging, Method::GET, false, Repeat::Hedge),
        (&hedging, query, false, Repeat::Hedge),
        // Idempotent is not enough for a hedge, nor is a key.
        (&hedging, Method::DELETE, false, Repeat::Retry),
        (&hedging, Method::PUT, true, Repeat::Retry),
        (&hedging, Method::POST, true, Repeat::Retry),
        (&hedging, Method::POST, false, Repeat::IfUnseen),
        (&hedging_declared, Method::POST, false, Repeat::Hedge),
        (&hedging_declared, Method::DELETE, false, Repeat::Hedge),
        (&once, Method::GET, true, Repeat::Once),
        (&never, Method::GET, true, Repeat::Once),
        (&hedging_once, Method::GET, false, Repeat::Once),
        // One attempt with a transparent retry is sent again when the server never saw it.
        (&transparent_once, Method::POST, false, Repeat::IfUnseen),
    ];
    for (plan, method, keyed, expected) in cases {
        assert_eq!(
            repeat(plan, &method, keyed),
            expected,
            "{method} keyed={keyed} under {:?}",
            plan.policy
        );
    }
    assert!(Repeat::Retry.any_outcome() && Repeat::Hedge.any_outcome());
    assert!(!Repeat::IfUnseen.any_outcome());
}
