// smithy-rs's unit vectors of its client rate limiter, ported from
// rust-runtime/aws-smithy-runtime/src/client/retries/client_rate_limiter.rs (`mod tests`) at
// commit 56ee88c5c6edd967967656f1e29f46b229105e79. The CUBIC and send-rate tables are
// matched as smithy-rs matches them (`assert_relative_eq!` with its default tolerance, one
// epsilon relative); the acquire cases, where this port reserves tokens instead of asking
// again, say what differs.

use super::*;

/// `approx::assert_relative_eq!` with its defaults: within `f64::EPSILON`, absolutely or
/// relative to the larger.
#[track_caller]
fn assert_close(expected: f64, got: f64, what: &str) {
    let diff = (expected - got).abs();
    let largest = expected.abs().max(got.abs());
    assert!(
        diff <= f64::EPSILON || diff <= largest * f64::EPSILON,
        "{what}: expected {expected}, got {got}"
    );
}

/// smithy-rs's builder with `time_of_last_throttle` and
/// `tokens_retrieved_per_second_at_time_of_last_throttle` set.
fn after_throttle(at: f64, last_max_rate: f64) -> Cubic {
    Cubic {
        time_of_last_throttle: at,
        last_max_rate,
        ..Cubic::new()
    }
}

/// `should_match_beta_decrease`.
#[test]
fn a_throttle_cuts_to_beta_and_the_curve_starts_there() {
    assert_eq!(10.0 * BETA, 7.0);
    let cubic = after_throttle(1.0, 10.0);
    assert_close(7.0, cubic.cubic_success(1.0), "cubic_success(1.0)");
}

/// `test_calculated_rate_with_successes`: the curve after a throttle at 5 s from 10 a
/// second (nothing updated between rows).
#[test]
fn the_rate_grows_back_along_smithy_rs_s_curve() {
    const ROWS: [(f64, f64); 7] = [
        (5.0, 7.0),
        (6.0, 9.64893600966),
        (7.0, 10.000030849917364),
        (8.0, 10.453284520772092),
        (9.0, 13.408697022224185),
        (10.0, 21.26626835427364),
        (11.0, 36.425998516920465),
    ];
    let cubic = after_throttle(5.0, 10.0);
    for (t, expected) in ROWS {
        assert_close(expected, cubic.cubic_success(t), &format!("t = {t}"));
    }
}

/// `test_calculated_rate_with_throttles`, ported as smithy-rs ported it from aws-sdk-go-v2
/// (its `adaptive_ratelimit_test.go`, commit 844ff45c): a throttle cuts the running rate
/// and makes the cut rate the curve's `last_max_rate`, which `update` does not (it keeps
/// the rate before the cut); this checks `cubic_success` and the cut alone.
#[test]
fn throttles_and_successes_mixed_follow_smithy_rs_s_table() {
    const ROWS: [(f64, bool, f64); 8] = [
        (5.0, false, 7.0),
        (6.0, false, 9.64893600966),
        (7.0, true, 6.754255206761999),
        (8.0, true, 4.727978644733399),
        (9.0, false, 4.670125557970046),
        (10.0, false, 4.770870456867401),
        (11.0, false, 6.011819748005445),
        (12.0, false, 10.792973431384178),
    ];
    let mut cubic = after_throttle(5.0, 10.0);
    let mut calculated = 0.0;
    for (t, throttled, expected) in ROWS {
        if throttled {
            calculated *= BETA;
            cubic.time_of_last_throttle = t;
            cubic.last_max_rate = calculated;
        } else {
            calculated = cubic.cubic_success(t);
        }
        assert_close(expected, calculated, &format!("t = {t}"));
    }
}

/// `test_client_sending_rates` (aws-sdk-go-v2's `TestAdaptiveRateLimit_Update`, "base"): an
/// outcome every 200 ms from a new limiter, throttles at 2.0 s and 3.2 s; the measured send
/// rate and the fill rate after each. The values are smithy-rs's literals (aws-sdk-go-v2
/// writes three of them one digit shorter).
#[test]
fn the_send_rate_and_fill_rate_follow_smithy_rs_s_table() {
    const ROWS: [(f64, bool, f64, f64); 17] = [
        (0.2, false, 0.000000, 0.500000),
        (0.4, false, 0.000000, 0.500000),
        (0.6, false, 4.800000000000001, 0.500000),
        (0.8, false, 4.800000000000001, 0.500000),
        (1.0, false, 4.160000, 0.500000),
        (1.2, false, 4.160000, 0.691200),
        (1.4, false, 4.160000, 1.0975999999999997),
        (1.6, false, 5.632000000000001, 1.6384000000000005),
        (1.8, false, 5.632000000000001, 2.332800),
        (2.0, true, 4.326400, 3.0284799999999996),
        (2.2, false, 4.326400, 3.48663917347026),
        (2.4, false, 4.326400, 3.821874416040255),
        (2.6, false, 5.665280, 4.053385727709987),
        (2.8, false, 5.665280, 4.200373108479454),
        (3.0, false, 4.333056, 4.282036558348658),
        (3.2, true, 4.333056, 2.99742559084406),
        (3.4, false, 4.333056, 3.4522263943863463),
    ];
    let mut cubic = Cubic::new();
    // smithy-rs sums 200 ms sleeps on a clock of whole nanoseconds and asserts the sum is
    // the row's time: the same floats as 0.2 * n.
    let step = Duration::from_millis(200);
    for (n, (t, throttled, measured, fill)) in ROWS.into_iter().enumerate() {
        let slept = (step * (n as u32 + 1)).as_secs_f64();
        assert_eq!(slept, t);
        cubic.update(t, throttled);
        assert_close(
            measured,
            cubic.measured_tx_rate,
            &format!("measured at {t}"),
        );
        assert_close(fill, cubic.fill_rate, &format!("fill rate at {t}"));
        assert_eq!(cubic.enabled, t >= 2.0, "enabled at {t}");
    }
}

/// The state every acquire case of smithy-rs starts from: `time_of_last_throttle(0)`,
/// `previous_time_bucket(0)`, then a throttle at 0: fill rate 0.5, capacity 0 of 1.
fn throttled_at_zero() -> Cubic {
    let mut cubic = Cubic::new();
    cubic.update(0.0, true);
    assert!(cubic.enabled);
    assert_eq!(
        (cubic.fill_rate, cubic.max_capacity, cubic.capacity),
        (0.5, 1.0, 0.0)
    );
    cubic
}

const NO_BOUND: f64 = f64::MAX;

/// `throttling_is_enabled_once_throttling_error_is_received`, and before it every attempt
/// goes free, whatever it asks.
#[test]
fn off_until_the_first_throttle() {
    let mut cubic = Cubic::new();
    for t in [0.0, 0.1, 0.2] {
        assert_eq!(cubic.acquire(t, 0.0), Grant::Free);
        cubic.update(t, false);
    }
    assert!(!cubic.enabled);
    assert_eq!(cubic.last_timestamp, Some(0.2), "updates refill");
    cubic.update(0.3, true);
    assert!(cubic.enabled);
}

/// `test_capacity_never_goes_negative`: at 0.1 s the bucket holds 0.05 of the 1 token an
/// attempt needs, so the wait is (1 - 0.05) / 0.5 = 1.9 s, smithy-rs's. smithy-rs takes
/// nothing and its caller asks again after the wait; here the attempt reserves its token
/// (the balance goes to -0.95), and the bucket is back at 0 when the wait ends.
#[test]
fn a_short_bucket_makes_the_attempt_wait_smithy_rs_s_time() {
    let mut cubic = throttled_at_zero();
    let Grant::After(wait) = cubic.acquire(0.1, NO_BOUND) else {
        panic!("admitted after a wait");
    };
    assert_close(1.9, wait, "wait");
    assert_close(-0.95, cubic.capacity, "capacity");
    cubic.refill(0.1 + wait);
    assert!(cubic.capacity.abs() < 1e-12, "{}", cubic.capacity);
}

/// `test_acquire_succeeds_after_sufficient_refill`, as its attempts leave: smithy-rs's
/// first caller asks at 0.1, sleeps 1.9 s, and takes the token at 2.0; a second attempt at
/// 2.1 then finds 0.05 and waits 1.9 s. Reserving gives each the same time.
#[test]
fn one_attempt_after_another_leaves_when_smithy_rs_s_would() {
    let mut cubic = throttled_at_zero();
    let Grant::After(first) = cubic.acquire(0.1, NO_BOUND) else {
        panic!("admitted after a wait");
    };
    assert_close(2.0, 0.1 + first, "first leaves");
    let Grant::After(second) = cubic.acquire(2.1, NO_BOUND) else {
        panic!("admitted after a wait");
    };
    assert_close(1.9, second, "second waits");
    // After 4 s at 0.5 a second, a full bucket (1 token): one attempt at once.
    assert_eq!(cubic.acquire(8.0, NO_BOUND), Grant::After(0.0));
    assert_eq!(cubic.capacity, 0.0);
}

/// `test_concurrent_acquires_no_cascading_delays` asks that ten attempts at once all get
/// the same wait (and nine of them, asking again after it, wait again). Reserving, they get
/// one fill interval (2 s at 0.5 a second) each, in turn, so they leave at the rate; those
/// whose wait would pass the bound take nothing and are refused.
#[test]
fn attempts_at_once_leave_one_fill_interval_apart_up_to_the_bound() {
    let mut cubic = throttled_at_zero();
    let mut grants = Vec::new();
    for _ in 0..10 {
        grants.push(cubic.acquire(0.1, 10.0));
    }
    let waits: Vec<f64> = grants
        .iter()
        .filter_map(|grant| match grant {
            Grant::After(wait) => Some(*wait),
            _ => None,
        })
        .collect();
    assert_eq!(waits.len(), 5);
    for (i, wait) in waits.iter().enumerate() {
        assert_close(1.9 + 2.0 * i as f64, *wait, &format!("wait {i}"));
    }
    assert!(
        grants[5..]
            .iter()
            .all(|grant| matches!(grant, Grant::TooLong(wait) if *wait > 10.0))
    );
    // Five reserved; the refused took nothing.
    assert_close(0.05 - 5.0, cubic.capacity, "capacity");
    // One not sent after all gives its token back.
    cubic.give_back();
    assert_close(0.05 - 4.0, cubic.capacity, "capacity");
}

/// `test_sub_nanosecond_shortfall_grants_instead_of_returning_zero_delay`.
#[test]
fn a_shortfall_under_a_nanosecond_is_granted_without_going_below_zero() {
    let mut cubic = throttled_at_zero();
    cubic.capacity = SEND_COST - 1e-12;
    cubic.last_timestamp = Some(0.5);
    assert_eq!(cubic.acquire(0.5, 0.0), Grant::After(0.0));
    assert!(cubic.capacity >= 0.0, "{}", cubic.capacity);
}

/// `test_multi_task_recovery_after_throttle_blip`, with its numbers: 50 throttles 1 ms
/// apart bring the fill rate to its floor; then 200 rounds of 100 ms in which 50 tasks each
/// ask once (those not admitted at once count as not acquired, as there) and each admitted
/// one succeeds. More than 100 are admitted, and the balance never goes below 0 when
/// nobody waits.
#[test]
fn a_throttle_blip_is_recovered_from() {
    let mut cubic = Cubic::new();
    let mut time = 0.0;
    for _ in 0..50 {
        time += 0.001;
        cubic.update(time, true);
    }
    assert!((cubic.fill_rate - 0.5).abs() <= 0.01, "{}", cubic.fill_rate);
    let mut acquired = 0;
    for _ in 0..200 {
        time += 0.1;
        let mut this_round = 0;
        for task in 0..50 {
            // A wait would be refused: only tokens in the bucket count, as there.
            if cubic.acquire(time + f64::from(task) * 0.0001, 0.0) == Grant::After(0.0) {
                this_round += 1;
            }
        }
        for _ in 0..this_round {
            time += 0.001;
            cubic.update(time, false);
        }
        acquired += this_round;
        assert!(cubic.capacity >= 0.0, "{}", cubic.capacity);
    }
    assert!(acquired > 100, "{acquired}");
}

/// `test_when_throttling_is_enabled_requests_can_still_be_sent`, without its randomness:
/// steps of 0 to 1 s, each attempt waiting if it must, then succeeding; the bucket's clock
/// follows the time slept.
#[test]
fn attempts_keep_going_once_on_and_the_clock_follows() {
    let mut cubic = throttled_at_zero();
    let mut now = 0.0;
    let mut seed = 7_u64;
    for _ in 0..100 {
        // SplitMix64, to [0, 1).
        seed = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = seed;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        now += ((z ^ (z >> 31)) >> 11) as f64 / (1_u64 << 53) as f64;
        match cubic.acquire(now, NO_BOUND) {
            Grant::After(wait) => now += wait,
            other => panic!("{other:?}"),
        }
        cubic.update(now, false);
    }
    assert!(cubic.enabled);
    assert_close(now, cubic.last_timestamp.unwrap(), "last refill");
}

/// The gate over the arithmetic: admission is free until a throttle is heard, then takes a
/// token or asks a wait, refuses past `max_wait`, and gives back on release.
#[tokio::test(start_paused = true)]
async fn the_gate_asks_waits_once_throttled_and_refuses_past_its_bound() {
    let limiter = AdaptiveLimiter::builder()
        .max_wait(Duration::from_secs(3))
        .build();
    let state = &limiter.inner;
    assert_eq!(state.admit(Ask::First), Admission::ADMIT);
    assert_eq!(state.on_outcome(Heard::Success, None), Ok(()));
    assert_eq!(limiter.rate(), None);
    assert!(state.at_rest());
    // A 429 at 0: on, at 0.5 a second, nothing in the bucket.
    let throttled = Heard::Failure(FailureKind::Throttling);
    assert_eq!(state.on_outcome(throttled, None), Ok(()));
    assert_eq!(limiter.rate(), Some(0.5));
    assert!(!state.at_rest());
    let two_seconds = Admission::Admit {
        taken: Some(SEND_COST_UNITS),
        wait: Duration::from_secs(2),
    };
    assert_eq!(state.admit(Ask::First), two_seconds);
    // The next would wait 4 s: refused, nothing taken.
    assert_eq!(
        state.admit(Ask::Retry(FailureKind::Transient)),
        Admission::Refuse(StopReason::Throttled)
    );
    // The first one is not sent: its token back, the next waits 2 s again.
    state.release(SEND_COST_UNITS);
    assert_eq!(state.admit(Ask::Hedge(FailureKind::Other)), two_seconds);
    // 503s and 404s are no throttles: the rate is not cut.
    tokio::time::advance(Duration::from_secs(10)).await;
    state
        .on_outcome(Heard::Failure(FailureKind::Transient), None)
        .unwrap();
    state.on_outcome(Heard::Neither, None).unwrap();
    assert!(limiter.rate().unwrap() >= 0.5);
    // Each partition is its own limiter, and a successor keeps the state.
    let successor = state.successor();
    assert_eq!(*successor.lock(), *state.lock());
    assert!(successor.enabled.load(Ordering::Acquire));
    assert!(state.fresh().at_rest());
}
