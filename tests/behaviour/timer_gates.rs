//! The gates on a layer's timer: a `ManualClock` set on the layer moves a budget's refill,
//! the per-server partitions' look for one at rest, the adaptive limiter's bucket and the
//! adaptive throttle's window, with no tokio runtime at all. A gate shared by two layers
//! with different clocks follows the first that made a service with it.

use std::future::Future;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use crate::common::manual::drive;
use crate::common::{Mock, get};
use tower::{Layer, ServiceExt};
use tower_http_retry::{
    AdaptiveLimiter, AdaptiveThrottle, Backoff, Gate, LocallyRefused, ManualClock, RetryBudget,
    RetryError, RetryInfo, RetryLayer, RetryPolicy, StopReason,
};

const MS: Duration = Duration::from_millis(1);

/// Polls `future` once: it must end without waiting (the clock does not move).
fn at_once<F: Future>(future: F) -> F::Output {
    let mut future = std::pin::pin!(future);
    match future
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        Poll::Ready(output) => output,
        Poll::Pending => panic!("the request waited"),
    }
}

/// Up to `attempts` attempts, no backoff, under `gate` alone.
fn policy(gate: impl Gate, attempts: u32) -> RetryPolicy {
    RetryPolicy::default()
        .max_attempts(attempts)
        .backoff(Backoff::exponential(Duration::ZERO, Duration::ZERO))
        .no_gates()
        .gate(gate)
}

/// How many attempts a request to `uri` made, and why it stopped (it must not wait).
fn attempts<S>(client: &S, uri: &str) -> (u32, StopReason)
where
    S: tower::Service<
            http::Request<http_body_util::Full<bytes::Bytes>>,
            Response = http::Response<http_body_util::Full<bytes::Bytes>>,
            Error = tower::BoxError,
        > + Clone,
{
    let response = at_once(client.clone().oneshot(get(uri))).unwrap();
    let info = response.extensions().get::<RetryInfo>().unwrap();
    (info.attempts(), info.stop())
}

#[test]
fn a_budget_refills_on_the_layers_hand_moved_clock() {
    let clock = ManualClock::new();
    // Three tokens, none per request, one a second.
    let budget = RetryBudget::builder()
        .max_tokens(3.0)
        .ratio(0.0)
        .min_per_sec(1.0)
        .build();
    let client = RetryLayer::new()
        .timer(clock.clone())
        .policy(policy(budget.clone(), 2))
        .layer(Mock::statuses(&[503; 20]));
    // Each retry takes a token, on a clock that stands still.
    for _ in 0..3 {
        assert_eq!(
            attempts(&client, "http://a.test/"),
            (2, StopReason::MaxAttempts)
        );
    }
    assert_eq!(budget.tokens(), 0.0);
    assert_eq!(
        attempts(&client, "http://a.test/"),
        (1, StopReason::BudgetExhausted)
    );
    // 999 ms on the clock earn 0.999 of a token: still refused. A millisecond more, one.
    clock.advance(999 * MS);
    assert_eq!(budget.tokens(), 0.999);
    assert_eq!(
        attempts(&client, "http://a.test/"),
        (1, StopReason::BudgetExhausted)
    );
    clock.advance(MS);
    assert_eq!(budget.tokens(), 1.0);
    assert_eq!(
        attempts(&client, "http://a.test/"),
        (2, StopReason::MaxAttempts)
    );
    assert_eq!(budget.tokens(), 0.0);
    // An hour fills it, up to its cap.
    clock.advance(Duration::from_secs(3_600));
    assert_eq!(budget.tokens(), 3.0);
}

#[test]
fn a_partition_at_rest_gives_its_place_up_on_the_hand_moved_clock() {
    let clock = ManualClock::new();
    // One server tracked; two tokens each, ten a second.
    let budget = RetryBudget::builder()
        .max_tokens(2.0)
        .ratio(0.0)
        .min_per_sec(10.0)
        .max_authorities(1)
        .build();
    let client = RetryLayer::new()
        .timer(clock.clone())
        .policy(policy(budget.clone(), 2))
        .layer(Mock::statuses(&[503; 20]));
    let uri = |host: &str| -> http::Uri { format!("http://{host}.test/").parse().unwrap() };
    // `a` takes the one place and a token of its own; `b` finds no place at rest and
    // shares the overflow, which its retry takes a token of.
    assert_eq!(
        attempts(&client, "http://a.test/"),
        (2, StopReason::MaxAttempts)
    );
    assert_eq!(
        attempts(&client, "http://b.test/"),
        (2, StopReason::MaxAttempts)
    );
    assert_eq!(budget.partition(&uri("a")).tokens(), 1.0);
    // 100 ms on the clock refill `a` (at rest: it may be forgotten) and the overflow, and
    // pass the interval between two looks for a place at rest: `b` takes `a`'s place.
    clock.advance(100 * MS);
    assert_eq!(
        attempts(&client, "http://b.test/"),
        (2, StopReason::MaxAttempts)
    );
    assert_eq!(budget.partition(&uri("b")).tokens(), 1.0);
    // Its retry took from its own partition: a newcomer shares the overflow, full.
    assert_eq!(budget.partition(&uri("c")).tokens(), 2.0);
}

#[test]
fn the_adaptive_limiter_refills_on_the_hand_moved_clock() {
    let clock = ManualClock::new();
    let limiter = AdaptiveLimiter::builder()
        .max_wait(Duration::from_secs(5))
        .build();
    let mock = Mock::statuses(&[429]);
    let client = RetryLayer::new()
        .timer(clock.clone())
        .policy(policy(limiter.clone(), 1))
        .layer(mock.clone());
    // The 429 turns the limiter on at 0.5 a second, its bucket empty: the next first
    // attempt would wait 2 s for its token.
    let (took, response) = drive(&clock, client.clone().oneshot(get("http://a.test/")));
    assert_eq!(
        (took, response.unwrap().status().as_u16()),
        (Duration::ZERO, 429)
    );
    assert_eq!(limiter.rate(), Some(0.5));
    // 10 s later on the clock the bucket holds its token: the attempt goes at once.
    clock.advance(Duration::from_secs(10));
    let (took, response) = drive(&clock, client.clone().oneshot(get("http://a.test/")));
    assert_eq!(
        (took, response.unwrap().status().as_u16()),
        (Duration::ZERO, 200)
    );
    // Now empty again: the next waits the 2 s of its token, on the same clock.
    let (took, response) = drive(&clock, client.clone().oneshot(get("http://a.test/")));
    assert_eq!(response.unwrap().status().as_u16(), 200);
    assert!(took > Duration::ZERO && took <= 2_000 * MS, "{took:?}");
    assert_eq!(mock.calls(), 3);
}

#[test]
fn the_adaptive_throttles_window_passes_on_the_hand_moved_clock() {
    let clock = ManualClock::new();
    // Rejects once throttles outnumber accepts (K 1, P 0.001), over one second.
    let throttle = AdaptiveThrottle::builder()
        .accepts_multiplier(1.0)
        .requests_padding(0.001)
        .window(Duration::from_secs(1), 10)
        .build();
    let mock = Mock::statuses(&[429]);
    let client = RetryLayer::new()
        .timer(clock.clone())
        .policy(policy(throttle, 1))
        .layer(mock.clone());
    let send = || at_once(client.clone().oneshot(get("http://a.test/")));
    assert_eq!(send().unwrap().status(), 429);
    // Then it rejects nearly every attempt (each goes with a chance of 0.001 in n + 0.001
    // after n throttles: at most one is let through, but for a chance under 10^-5).
    let mut refused = 0;
    for _ in 0..20 {
        if let Err(error) = send() {
            let error = error.downcast_ref::<RetryError>().unwrap();
            assert!(error.get_ref().is::<LocallyRefused>());
            refused += 1;
        }
    }
    assert!(refused >= 19, "{refused} of 20 refused");
    // A second on the clock and the history is gone: every attempt goes (and is accepted).
    clock.advance(Duration::from_secs(1));
    let sent = mock.calls();
    for _ in 0..5 {
        send().unwrap();
    }
    assert_eq!(mock.calls(), sent + 5);
}

#[test]
fn a_gate_shared_by_layers_on_two_clocks_follows_the_first_that_used_it() {
    let (first, second) = (ManualClock::new(), ManualClock::new());
    let budget = RetryBudget::builder()
        .max_tokens(1.0)
        .ratio(0.0)
        .min_per_sec(1.0)
        .build();
    let layer = |clock: &ManualClock| {
        RetryLayer::new()
            .timer(clock.clone())
            .policy(policy(budget.clone(), 2))
    };
    // The layers are built in one order and make their services in the other: the
    // budget's clock is that of the first layer to make a service with it.
    let (on_second, on_first) = (layer(&second), layer(&first));
    let one = on_first.layer(Mock::statuses(&[503; 20]));
    let two = on_second.layer(Mock::statuses(&[503; 20]));
    assert_eq!(
        attempts(&two, "http://a.test/"),
        (2, StopReason::MaxAttempts)
    );
    assert_eq!(
        attempts(&one, "http://a.test/"),
        (1, StopReason::BudgetExhausted)
    );
    // The second layer's clock moves the budget not at all; the first layer's does.
    second.advance(Duration::from_secs(60));
    assert_eq!(budget.tokens(), 0.0);
    assert_eq!(
        attempts(&two, "http://a.test/"),
        (1, StopReason::BudgetExhausted)
    );
    first.advance(Duration::from_secs(1));
    assert_eq!(budget.tokens(), 1.0);
    assert_eq!(
        attempts(&two, "http://a.test/"),
        (2, StopReason::MaxAttempts)
    );
}
