// grpc-go's unit tests of its adaptive throttler, ported from
// balancer/rls/internal/adaptive/lookback_test.go and adaptive_test.go at commit
// 4793ad0474669eafbd5346c8a3d098fdfa542498, with their numbers: a window of `bins`
// nanoseconds in `bins` bins (one a nanosecond), ticks in nanoseconds from 0 (grpc-go's
// `TestLookback` adds them to the wall clock's now; with bins of a nanosecond only the
// offsets matter), a fixed draw of 0.5 for `ShouldThrottle`. Not ported: `TestParallel`,
// whose ten goroutines for two seconds check that no count is lost under its mutex; the
// counts here sit under one too.

use super::*;

fn lookback(bins: u32) -> Lookback {
    Lookback::new(bins, Duration::from_nanos(u64::from(bins)))
}

/// `TestLookback`: `add(tick, value)`, then `sum(tick)`.
#[test]
fn the_moving_sum_follows_grpc_go_s_table() {
    /// Name, bins, ticks, values, sums.
    type Case = (&'static str, u32, [i64; 3], [i64; 3], [i64; 3]);
    const CASES: [Case; 4] = [
        ("Accumulate", 3, [0, 1, 2], [1, 2, 3], [1, 3, 6]),
        ("LightTimeTravel", 3, [1, 0, 2], [1, 2, 3], [1, 3, 6]),
        ("HeavyTimeTravel", 3, [8, 0, 9], [1, 2, 3], [1, 1, 4]),
        ("Rollover", 1, [0, 1, 2], [1, 2, 3], [1, 2, 3]),
    ];
    for (name, bins, ticks, values, want) in CASES {
        let mut sum = lookback(bins);
        for i in 0..3 {
            sum.add(ticks[i], values[i]);
            assert_eq!(sum.sum(ticks[i]), want[i], "{name}, index {i}");
        }
    }
}

/// A response in grpc-go's tables.
#[derive(Clone, Copy, PartialEq)]
enum R {
    /// None.
    E,
    /// Accepted.
    A,
    /// Throttled.
    T,
}
use R::{A, E, T};

fn counts(bins: u32, k: f64, p: f64) -> Counts {
    Counts::new(&SheddingSettings {
        window: Duration::from_nanos(u64::from(bins)),
        bins,
        accepts_multiplier: k,
        requests_padding: p,
    })
}

/// `TestRegisterBackendResponse`: at each tick the response (if any) is registered, then
/// the sums read.
#[test]
fn responses_are_counted_as_grpc_go_s_table_says() {
    type Case = (&'static str, u32, [i64; 3], [R; 3], [i64; 3], [i64; 3]);
    const CASES: [Case; 4] = [
        ("Accumulate", 3, [0, 1, 2], [A, T, E], [1, 1, 1], [0, 1, 1]),
        (
            "LightTimeTravel",
            3,
            [1, 0, 2],
            [A, T, E],
            [1, 1, 1],
            [0, 1, 1],
        ),
        (
            "HeavyTimeTravel",
            3,
            [8, 0, 9],
            [A, A, A],
            [1, 1, 2],
            [0, 0, 0],
        ),
        ("Rollover", 1, [0, 1, 2], [A, T, E], [1, 0, 0], [0, 1, 0]),
    ];
    for (name, bins, ticks, responses, accepts, throttles) in CASES {
        let mut th = counts(bins, 2.0, 8.0);
        for i in 0..3 {
            if responses[i] != E {
                th.register(ticks[i], responses[i] == T);
            }
            let got = (th.accepts.sum(ticks[i]), th.throttles.sum(ticks[i]));
            assert_eq!(got, (accepts[i], throttles[i]), "{name}, index {i}");
        }
    }
}

/// `TestShouldThrottleOptions`: the clock at 0, one bin of a nanosecond (nothing expires),
/// the draw 0.5; each response registered, then `ShouldThrottle` asked (a rejection counts
/// a throttle). On the rows where p is exactly 0.5 only the strict `p > r` gives grpc-go's
/// answer.
#[test]
fn rejections_follow_grpc_go_s_table_for_each_k_and_p() {
    const RESPONSES: [R; 19] = [T, T, T, T, T, T, T, T, T, A, A, A, A, A, A, T, T, T, T];
    const N: bool = false;
    const Y: bool = true;
    const CASES: [(&str, f64, f64, [bool; 19]); 3] = [
        (
            "Baseline",
            1.1,
            8.0,
            [N, N, N, N, N, N, N, N, Y, Y, Y, Y, Y, N, N, N, Y, Y, Y],
        ),
        (
            "ChangePadding",
            1.1,
            7.0,
            [N, N, N, N, N, N, N, Y, Y, Y, Y, Y, Y, Y, Y, Y, Y, Y, Y],
        ),
        (
            "ChangeRatioForAccepts",
            1.4,
            8.0,
            [N, N, N, N, N, N, N, N, Y, Y, N, N, N, N, N, N, N, N, N],
        ),
    ];
    for (name, k, p, want) in CASES {
        let mut th = counts(1, k, p);
        for (i, response) in RESPONSES.into_iter().enumerate() {
            if response != E {
                th.register(0, response == T);
            }
            assert_eq!(th.should_throttle(0, 0.5), want[i], "{name}, index {i}");
        }
    }
}

/// The gate: nothing rejected without history; after a run of 429s most attempts are
/// rejected (each rejection a throttle too); successes and 404s are accepts, transient
/// failures count for neither; and it all leaves the window.
#[tokio::test(start_paused = true)]
async fn the_gate_rejects_once_throttles_dominate_and_forgets_after_the_window() {
    let throttle = AdaptiveThrottle::builder()
        .window(Duration::from_secs(1), 10)
        .build();
    let state = &throttle.inner;
    assert!(state.at_rest());
    for _ in 0..100 {
        assert_eq!(state.admit(Ask::First), Admission::ADMIT);
    }
    let throttled = Heard::Failure(FailureKind::Throttling);
    for _ in 0..92 {
        state.on_outcome(throttled, None).unwrap();
    }
    // p = 92 / 100 = 0.92: few of a thousand attempts go.
    let sent = (0..1000)
        .filter(|_| state.admit(Ask::Retry(FailureKind::Throttling)) == Admission::ADMIT)
        .count();
    assert!(sent < 150, "{sent}");
    assert!(!state.at_rest());
    for heard in [
        Heard::Success,
        Heard::Neither,
        Heard::Failure(FailureKind::Other),
        Heard::Failure(FailureKind::Transient),
    ] {
        state.on_outcome(heard, None).unwrap();
    }
    assert_eq!(state.lock().accepts.sum(state.now()), 3);
    // A window later, all forgotten.
    tokio::time::advance(Duration::from_secs(1)).await;
    assert!(state.at_rest());
    assert_eq!(state.admit(Ask::First), Admission::ADMIT);
    let successor = state.successor();
    assert_eq!(*successor.lock(), *state.lock());
}

#[test]
fn settings_out_of_range_are_named() {
    let error =
        |builder: GateBuilder<AdaptiveThrottle>| builder.try_build().unwrap_err().to_string();
    let b = AdaptiveThrottle::builder;
    assert!(error(b().window(Duration::from_secs(1), 0)).contains("bins is 0"));
    assert!(error(b().window(Duration::from_nanos(5), 10)).contains("window is 5ns"));
    assert!(error(b().accepts_multiplier(0.9)).contains("accepts_multiplier is 0.9"));
    assert!(error(b().requests_padding(0.0)).contains("requests_padding is 0"));
    assert_eq!(
        error(b().requests_padding(f64::NAN)),
        "invalid adaptive throttle: requests_padding is NaN; it must be a finite number \
         greater than 0"
    );
    assert!(b().sre_book().try_build().is_ok());
}
