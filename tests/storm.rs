//! The shapes of the storm figures (not their exact numbers), from the same simulations the
//! `storm` example prints, driving the real layer under paused time.

#[path = "../examples/storm/sim.rs"]
mod sim;

use tower_http_retry::Jitter;

#[test]
fn no_jitter_puts_every_round_in_one_window() {
    let rounds = sim::paused(sim::jitter_spread(Jitter::None, 1000, 4, 1));
    for (i, round) in rounds.iter().enumerate() {
        assert_eq!(round.occupied(), 1, "retry {}", i + 1);
        assert_eq!(round.peak(), 1000, "retry {}", i + 1);
    }
}

#[test]
fn full_jitter_spreads_retries_and_decorrelated_is_widest_at_retry_four() {
    let full = sim::paused(sim::jitter_spread(Jitter::Full, 1000, 4, 1));
    assert!(
        (3..=5).contains(&full[0].occupied()),
        "retry 1 over {} windows",
        full[0].occupied()
    );
    assert!(full[0].peak() < 350, "retry 1 peak {}", full[0].peak());
    assert!(
        full[3].occupied() >= 40,
        "retry 4 over {} windows",
        full[3].occupied()
    );
    // Each round spreads wider than the one before.
    for pair in full.windows(2) {
        assert!(pair[1].occupied() > pair[0].occupied());
        assert!(pair[1].peak() < pair[0].peak());
    }

    let equal = sim::paused(sim::jitter_spread(Jitter::Equal, 1000, 4, 1));
    let decorrelated = sim::paused(sim::jitter_spread(Jitter::Decorrelated, 1000, 4, 1));
    let widest = decorrelated[3].occupied();
    assert!(
        widest > full[3].occupied() && widest > equal[3].occupied(),
        "{widest}"
    );
    assert!(widest > 100, "decorrelated retry 4 over {widest} windows");
    // Equal jitter never waits less than half the ceiling: narrower than full.
    assert!(equal[3].occupied() < full[3].occupied());
}

#[test]
fn amplification_without_a_budget_multiplies_by_the_attempts() {
    assert_eq!(sim::paused(sim::amplification(1, false, 2_000, 1000)), 3.0);
    assert_eq!(sim::paused(sim::amplification(3, false, 2_000, 1000)), 27.0);
}

#[test]
fn the_default_budget_keeps_amplification_near_ten_percent_per_layer() {
    let one = sim::paused(sim::amplification(1, true, 20_000, 1000));
    let three = sim::paused(sim::amplification(3, true, 20_000, 1000));
    assert!(one > 1.0 && one <= 1.2, "one layer: {one}");
    assert!(three > one && three <= 1.45, "three layers: {three}");
}
