use super::*;

use crate::classify::FailureKind;
use crate::gate::sealed::Sealed;
use crate::gate::{Gates, Own, RetryBudget, Ticket};

const RETRY: Ask = Ask::Retry(FailureKind::Transient);
const HEDGE: Ask = Ask::Hedge(FailureKind::Other);

fn budget(ratio: f64, min: u32) -> ConcurrencyBudget {
    ConcurrencyBudget::builder()
        .ratio(ratio)
        .min_in_flight(min)
        .build()
}

fn admitted(state: &Concurrency, ask: Ask) -> bool {
    match state.admit(ask) {
        Admission::Admit { taken, wait } => {
            assert_eq!((taken, wait), (Some(1), std::time::Duration::ZERO));
            true
        }
        Admission::Refuse(reason) => {
            assert_eq!(reason, StopReason::BudgetExhausted);
            false
        }
    }
}

/// Admits retries until refused; how many were admitted.
fn fill(state: &Concurrency) -> u64 {
    let mut admitted_now = 0;
    while admitted(state, RETRY) {
        admitted_now += 1;
        assert!(admitted_now <= 1_000, "no cap");
    }
    admitted_now
}

#[test]
fn envoy_s_defaults_bound_retries_by_a_fifth_of_the_requests_and_at_least_3() {
    let budget = ConcurrencyBudget::builder().build();
    let state = &budget.inner;
    assert_eq!((state.ratio_milli, state.min), (200, 3));
    // Envoy's max(): the floor binds below 15 requests, the share from 20 on, rounded down.
    for (requests, cap) in [(0, 3), (1, 3), (10, 3), (14, 3), (15, 3), (19, 3), (20, 4)] {
        assert_eq!(state.cap(requests), cap, "{requests} requests");
    }
    assert_eq!(
        (state.cap(40), state.cap(99), state.cap(1_000)),
        (8, 19, 200)
    );
    // Integer arithmetic: 0.29 of 100 is 29 (28.999... in floating point).
    assert_eq!(budget_cap(0.29, 100), 29);
    assert_eq!(budget_cap(1.0, u64::from(u32::MAX)), u64::from(u32::MAX));
}

fn budget_cap(ratio: f64, requests: u64) -> u64 {
    budget(ratio, 0).inner.cap(requests)
}

#[test]
fn retries_and_hedges_are_admitted_while_fewer_than_the_cap_are_in_flight() {
    let budget = budget(0.2, 3);
    let state = &budget.inner;
    for _ in 0..10 {
        state.on_request();
    }
    // 10 requests: 0.2 gives 2, the floor 3.
    assert_eq!(fill(state), 3);
    assert_eq!(state.counts(), (10, 3));
    // First attempts are requests: admitted, nothing taken.
    assert_eq!(state.admit(Ask::First), Admission::ADMIT);
    // 10 more requests: 0.2 of 20 is 4, one more place; a hedge takes it.
    for _ in 0..10 {
        state.on_request();
    }
    assert!(admitted(state, HEDGE));
    assert!(!admitted(state, Ask::Transparent));
    // An attempt that ends frees its place; a first attempt's end frees none.
    state.on_attempt_end(Ask::First);
    assert!(!admitted(state, RETRY));
    state.on_attempt_end(HEDGE);
    assert_eq!(state.counts(), (20, 3));
    assert!(admitted(state, Ask::Transparent));
    // A retry admitted and not sent gives its place back.
    state.release(1);
    assert!(admitted(state, RETRY));
    // Requests end: the cap falls back to the floor, and what is in flight stays counted.
    for _ in 0..20 {
        state.on_request_end();
    }
    assert_eq!(state.counts(), (0, 4));
    assert!(!admitted(state, RETRY));
    for ask in [RETRY, RETRY] {
        state.on_attempt_end(ask);
    }
    assert!(admitted(state, RETRY));
    assert!(!admitted(state, RETRY));
}

#[test]
fn a_ratio_of_0_keeps_the_floor_and_a_floor_of_0_the_ratio() {
    let floor_only = budget(0.0, 2);
    for _ in 0..1_000 {
        floor_only.inner.on_request();
    }
    assert_eq!(fill(&floor_only.inner), 2);
    let ratio_only = budget(0.5, 0);
    assert_eq!(fill(&ratio_only.inner), 0, "no request in flight, no retry");
    ratio_only.inner.on_request();
    assert_eq!(fill(&ratio_only.inner), 0, "half of one rounds down");
    ratio_only.inner.on_request();
    assert_eq!(fill(&ratio_only.inner), 1);
}

#[test]
fn settings_out_of_range_are_named() {
    let message = |ratio: f64, min: u32| {
        ConcurrencyBudget::builder()
            .ratio(ratio)
            .min_in_flight(min)
            .try_build()
            .expect_err("refused")
            .to_string()
    };
    assert_eq!(
        message(1.5, 3),
        "invalid concurrency budget: ratio is 1.5; it must be at most 1"
    );
    for (bad, shown) in [(f64::NAN, "NaN"), (-0.2, "-0.2"), (f64::INFINITY, "inf")] {
        assert_eq!(
            message(bad, 3),
            format!(
                "invalid concurrency budget: ratio is {shown}; it must be a finite number from \
                 0 to 1"
            )
        );
    }
    assert_eq!(
        message(0.0004, 3),
        "invalid concurrency budget: ratio is 0.0004; it must be 0 or at least 0.001 (it is \
         counted in thousandths)"
    );
    assert_eq!(
        message(0.0, 0),
        "invalid concurrency budget: ratio and min_in_flight are both 0, which refuses every \
         retry and hedge; to send each request once, use RetryPolicy::max_attempts(1)"
    );
    assert_eq!(
        ConcurrencyBudget::builder()
            .max_authorities(0)
            .try_build()
            .unwrap_err()
            .to_string(),
        "invalid concurrency budget: max_authorities is 0; it must be at least 1"
    );
    for (ratio, min) in [(0.0, 1), (0.001, 0), (1.0, u32::MAX), (0.2, 3)] {
        assert!(budget(ratio, min).inner.cap(0) == u64::from(min));
    }
}

#[test]
fn a_partition_starts_empty_and_rests_when_nothing_is_in_flight() {
    let budget = budget(0.2, 3);
    let state = &budget.inner;
    assert!(state.at_rest());
    state.on_request();
    assert!(admitted(state, RETRY));
    assert!(!state.at_rest());
    // What is in flight ends where it started: a successor starts with none.
    assert_eq!(state.successor().counts(), (0, 0));
    assert_eq!(state.fresh().counts(), (0, 0));
    state.on_attempt_end(RETRY);
    assert!(!state.at_rest(), "a request is still in flight");
    state.on_request_end();
    assert!(state.at_rest());
}

#[test]
fn debug_shows_the_settings_and_what_is_in_flight() {
    let budget = budget(0.25, 4);
    budget.inner.on_request();
    assert!(admitted(&budget.inner, RETRY));
    assert_eq!(
        format!("{budget:?}"),
        "ConcurrencyBudget { ratio: 0.25, min_in_flight: 4, requests_in_flight: 1, \
         retries_in_flight: 1 }"
    );
    let kept = ConcurrencyBudget::builder().max_authorities(8).build();
    assert!(format!("{kept:?}").starts_with("ConcurrencyBudget { max_authorities: 8, ratio: 0.2,"));
}

#[test]
fn with_a_token_budget_a_refusal_by_either_gives_back_what_the_other_took() {
    let concurrency = budget(0.0, 1);
    let tokens = RetryBudget::builder()
        .max_tokens(2.0)
        .min_per_sec(0.0)
        .build();
    let gates = Gates::new(vec![
        concurrency.clone().into_any(),
        tokens.clone().into_any(),
    ]);
    assert!(gates.hears_flight() && gates.needs_own());
    let mut ticket = Ticket::default();
    let first = gates.admit(RETRY).unwrap();
    gates.commit(&first, &mut ticket);
    assert_eq!((tokens.tokens(), concurrency.inner.counts().1), (1.0, 1));
    // The concurrency budget refuses (its one place is taken): the token goes back.
    assert_eq!(gates.admit(RETRY).err(), Some(StopReason::BudgetExhausted));
    assert_eq!(tokens.tokens(), 1.0);
    // Asked last, it takes a place only once the token kinds admitted: when the budget
    // refuses, it is not asked.
    concurrency.inner.on_attempt_end(RETRY);
    let second = gates.admit(HEDGE).unwrap();
    assert_eq!((tokens.tokens(), concurrency.inner.counts().1), (0.0, 1));
    // An admission given back (its wait did not fit the deadline, or a hedge was asked to
    // wait): both get back what they took.
    gates.release(&second);
    assert_eq!((tokens.tokens(), concurrency.inner.counts().1), (1.0, 0));
    let third = gates.admit(HEDGE).unwrap();
    gates.commit(&third, &mut ticket);
    concurrency.inner.on_attempt_end(HEDGE);
    assert_eq!(gates.admit(RETRY).err(), Some(StopReason::BudgetExhausted));
    assert_eq!((tokens.tokens(), concurrency.inner.counts().1), (0.0, 0));
}

#[test]
fn a_retry_its_request_never_sent_gives_back_its_place_but_not_its_token() {
    let concurrency = budget(0.0, 1);
    let tokens = RetryBudget::builder()
        .max_tokens(2.0)
        .min_per_sec(0.0)
        .build();
    let gates = Gates::new(vec![
        concurrency.clone().into_any(),
        tokens.clone().into_any(),
    ]);
    let uri = http::Uri::from_static("http://a.example/");
    let mut own = Some(Own::start(&gates, &uri, &http::HeaderMap::new()));
    assert_eq!(concurrency.inner.counts(), (1, 0));
    let presence = Own::presence(&mut own).unwrap();
    presence.started(1, Ask::First);
    presence.ended(1);
    // A retry admitted, then the request dropped during its backoff.
    let mut ticket = Ticket::default();
    let retry = gates.admit(RETRY).unwrap();
    gates.commit(&retry, &mut ticket);
    Own::presence(&mut own).unwrap().admitted(&ticket);
    assert_eq!(concurrency.inner.counts(), (1, 1));
    drop(own);
    assert_eq!(concurrency.inner.counts(), (0, 0));
    assert_eq!(
        tokens.tokens(),
        1.0,
        "the token kinds keep a retry decided spent"
    );
    // Sent, it ends with its attempt, once.
    let mut own = Some(Own::start(&gates, &uri, &http::HeaderMap::new()));
    let retry = gates.admit(RETRY).unwrap();
    gates.commit(&retry, &mut ticket);
    let presence = Own::presence(&mut own).unwrap();
    presence.admitted(&ticket);
    presence.started(2, RETRY);
    assert_eq!(concurrency.inner.counts(), (1, 1));
    drop(own);
    assert_eq!(concurrency.inner.counts(), (0, 0));
}

#[test]
fn continuations_are_not_asked_of_it() {
    let concurrency = budget(0.0, 1);
    let tokens = RetryBudget::builder().build();
    let gates = Gates::new(vec![
        concurrency.clone().into_any(),
        tokens.clone().into_any(),
    ]);
    let continuing = gates.without_flight();
    assert!(!continuing.hears_flight() && continuing.list.len() == 1);
    for _ in 0..3 {
        assert!(continuing.admit(RETRY).is_ok());
    }
    assert_eq!(concurrency.inner.counts(), (0, 0));
    assert_eq!(tokens.tokens(), 97.0);
}
