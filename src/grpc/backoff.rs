//! A6's exponential backoff: `initialBackoff * backoffMultiplier^(n-1)`, capped at
//! `maxBackoff`, with jitter.
//!
//! The crate's [`Backoff`](crate::Backoff) puts retry `n`'s ceiling at `base * m^n`, which
//! is A6's with a base of `initialBackoff / backoffMultiplier` and `m =
//! backoffMultiplier`: the policies built from a service config
//! ([`MethodConfig::policy`](super::MethodConfig::policy)) use it so, with the same
//! ceilings as [`backoff_ceiling`] to the nanosecond. These functions are the formula on
//! its own, for a retry loop of your own, and [`A6Jitter::Proportional`], which `Backoff`
//! does not offer.

use std::time::Duration;

use rand::{Rng, RngExt};

/// How the wait is drawn below (or around) the A6 ceiling.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum A6Jitter {
    /// Uniform in `[0, ceiling)`: A6 as published in 2017, and what Java, C++ and Node
    /// still do. The default: the widest spread, matching the crate's
    /// [`Jitter::Full`](crate::Jitter::Full).
    #[default]
    Full,
    /// The ceiling times a factor uniform in `[0.8, 1.2)`: A6 as amended in 2024 (the
    /// initial retry after about `initialBackoff`, each later one about
    /// `backoffMultiplier` times longer), which grpc-go implements. The wait may exceed
    /// `maxBackoff` by up to a fifth.
    Proportional,
}

/// Retry `n`'s ceiling (1 for the first retry): `min(initial * multiplier^(n-1), max)`.
///
/// After server pushback A6 starts the sequence again: `n` counts the retries since the
/// last pushback (1 for the first retry after it). `n = 0` is taken as 1. Computed in
/// floating point on nanoseconds, as grpc-go does, and rounded to the nearest nanosecond;
/// the result never exceeds `max`, and a
/// multiplier that is NaN or not positive (never accepted from a service config) gives
/// `initial` for every retry.
///
/// ```
/// use std::time::Duration;
/// use tower_http_retry::grpc::backoff_ceiling;
///
/// let (initial, max) = (Duration::from_millis(100), Duration::from_secs(1));
/// assert_eq!(backoff_ceiling(initial, max, 1.5, 1), Duration::from_millis(100));
/// assert_eq!(backoff_ceiling(initial, max, 1.5, 2), Duration::from_millis(150));
/// assert_eq!(backoff_ceiling(initial, max, 1.5, 3), Duration::from_millis(225));
/// assert_eq!(backoff_ceiling(initial, max, 1.5, 30), Duration::from_secs(1));
/// ```
pub fn backoff_ceiling(initial: Duration, max: Duration, multiplier: f64, n: u32) -> Duration {
    let initial_ns = initial.as_nanos() as f64;
    let max_ns = max.as_nanos() as f64;
    let multiplier = if multiplier > 0.0 { multiplier } else { 1.0 };
    let exponent = i32::try_from(n.saturating_sub(1)).unwrap_or(i32::MAX);
    let raised = initial_ns * multiplier.powi(exponent);
    // NaN (0 * inf) and anything above the cap are the cap; `min` keeps the cap on NaN.
    let capped = if raised.is_nan() {
        max_ns
    } else {
        raised.min(max_ns)
    };
    nanos_to_duration(capped.round())
}

/// The wait before retry `n`: [`backoff_ceiling`] with `jitter` applied.
///
/// ```
/// use std::time::Duration;
/// use tower_http_retry::grpc::{A6Jitter, backoff_delay};
///
/// let mut rng = rand::rng();
/// let wait = backoff_delay(
///     Duration::from_millis(100), Duration::from_secs(1), 2.0, 2, A6Jitter::Full, &mut rng);
/// assert!(wait < Duration::from_millis(200));
/// ```
pub fn backoff_delay<R: Rng + ?Sized>(
    initial: Duration,
    max: Duration,
    multiplier: f64,
    n: u32,
    jitter: A6Jitter,
    rng: &mut R,
) -> Duration {
    let ceiling = backoff_ceiling(initial, max, multiplier, n);
    match jitter {
        A6Jitter::Full => full_jitter(ceiling, rng),
        A6Jitter::Proportional => proportional_jitter(ceiling, rng),
    }
}

/// Uniform in `[0, ceiling)`, in whole nanoseconds; zero for a zero ceiling.
pub fn full_jitter<R: Rng + ?Sized>(ceiling: Duration, rng: &mut R) -> Duration {
    let ceiling = u64::try_from(ceiling.as_nanos()).unwrap_or(u64::MAX);
    if ceiling == 0 {
        return Duration::ZERO;
    }
    Duration::from_nanos(rng.random_range(0..ceiling))
}

/// `ceiling` times a factor uniform in `[0.8, 1.2)`.
pub fn proportional_jitter<R: Rng + ?Sized>(ceiling: Duration, rng: &mut R) -> Duration {
    let factor = 0.8 + 0.4 * rng.random::<f64>();
    nanos_to_duration(ceiling.as_nanos() as f64 * factor)
}

/// Whole nanoseconds, saturating at `u64::MAX` nanoseconds (584 years) and at zero.
fn nanos_to_duration(nanos: f64) -> Duration {
    // `as` saturates and maps NaN to 0.
    Duration::from_nanos(nanos as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    use proptest::prelude::*;
    use rand::SeedableRng;
    use rand::rngs::SmallRng;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn the_a6_example_doubles_from_the_initial_backoff() {
        // maxAttempts 4, initialBackoff .1s, maxBackoff 1s, multiplier 2.
        let ceilings: Vec<_> = (1..=6)
            .map(|n| backoff_ceiling(100 * MS, 1000 * MS, 2.0, n))
            .collect();
        assert_eq!(
            ceilings,
            [100 * MS, 200 * MS, 400 * MS, 800 * MS, 1000 * MS, 1000 * MS]
        );
        // The first retry's ceiling is the initial backoff, also for n = 0.
        assert_eq!(backoff_ceiling(100 * MS, 1000 * MS, 2.0, 0), 100 * MS);
    }

    #[test]
    fn a_multiplier_below_one_shrinks_and_one_stays() {
        assert_eq!(backoff_ceiling(100 * MS, 1000 * MS, 0.5, 2), 50 * MS);
        assert_eq!(backoff_ceiling(100 * MS, 1000 * MS, 1.0, 9), 100 * MS);
    }

    #[test]
    fn extremes_saturate_without_panicking() {
        let max = Duration::from_secs(30);
        assert_eq!(backoff_ceiling(MS, max, 1e300, u32::MAX), max);
        assert_eq!(backoff_ceiling(MS, max, f64::INFINITY, 2), max);
        assert_eq!(backoff_ceiling(Duration::ZERO, max, f64::INFINITY, 2), max);
        assert_eq!(backoff_ceiling(MS, max, f64::NAN, 5), MS);
        assert_eq!(backoff_ceiling(MS, max, -2.0, 5), MS);
        assert_eq!(
            backoff_ceiling(Duration::MAX, Duration::MAX, 2.0, 3).as_secs(),
            18_446_744_073
        );
        // An initial above the max is capped too.
        assert_eq!(backoff_ceiling(2 * max, max, 2.0, 1), max);
    }

    #[test]
    fn the_crates_backoff_matches_a6_for_any_multiplier() {
        // A multiplier of 2: Backoff::exponential(initial / 2, max) has the same ceilings.
        let doubling = crate::Backoff::exponential(50 * MS, 1000 * MS).jitter(crate::Jitter::None);
        for n in 1..=8 {
            assert_eq!(
                doubling.ceiling(n),
                backoff_ceiling(100 * MS, 1000 * MS, 2.0, n)
            );
        }
        // Any other: the one a service config's policy gets.
        for multiplier in [1.5, 1.3, 0.7, 3.0] {
            let a6 = crate::Backoff::a6(100 * MS, 1000 * MS, multiplier);
            for n in 1..=12 {
                assert_eq!(
                    a6.ceiling(n),
                    backoff_ceiling(100 * MS, 1000 * MS, multiplier, n),
                    "{multiplier} {n}"
                );
            }
        }
    }

    #[test]
    fn full_jitter_spreads_over_the_whole_interval() {
        let mut rng = SmallRng::seed_from_u64(7);
        let ceiling = 100 * MS;
        let draws: Vec<_> = (0..2_000).map(|_| full_jitter(ceiling, &mut rng)).collect();
        assert!(draws.iter().all(|d| *d < ceiling));
        assert!(draws.iter().any(|d| *d < 5 * MS));
        assert!(draws.iter().any(|d| *d > 95 * MS));
        let mean = draws.iter().sum::<Duration>() / 2_000;
        assert!(mean > 45 * MS && mean < 55 * MS, "{mean:?}");
        assert_eq!(full_jitter(Duration::ZERO, &mut rng), Duration::ZERO);
        assert!(full_jitter(Duration::from_nanos(1), &mut rng).is_zero());
    }

    #[test]
    fn proportional_jitter_stays_within_a_fifth() {
        let mut rng = SmallRng::seed_from_u64(8);
        let ceiling = 100 * MS;
        let draws: Vec<_> = (0..2_000)
            .map(|_| proportional_jitter(ceiling, &mut rng))
            .collect();
        assert!(draws.iter().all(|d| *d >= 80 * MS && *d < 120 * MS));
        assert!(draws.iter().any(|d| *d < 82 * MS));
        assert!(draws.iter().any(|d| *d > 118 * MS));
    }

    proptest! {
        #[test]
        fn waits_stay_under_their_ceiling(
            initial_ms in 1u32..10_000,
            max_ms in 1u32..100_000,
            multiplier in 0.01f64..10.0,
            n in 0u32..64,
            seed in any::<u64>(),
        ) {
            let (initial, max) = (initial_ms * MS, max_ms * MS);
            let ceiling = backoff_ceiling(initial, max, multiplier, n);
            prop_assert!(ceiling <= max);
            // Monotone in n for multipliers of at least 1.
            if multiplier >= 1.0 {
                prop_assert!(backoff_ceiling(initial, max, multiplier, n + 1) >= ceiling);
            }
            let mut rng = SmallRng::seed_from_u64(seed);
            let full = backoff_delay(initial, max, multiplier, n, A6Jitter::Full, &mut rng);
            prop_assert!(full < ceiling || ceiling.is_zero());
            let near = backoff_delay(initial, max, multiplier, n, A6Jitter::Proportional, &mut rng);
            prop_assert!(near.as_nanos() * 10 >= (ceiling.as_nanos() * 8).saturating_sub(10));
            prop_assert!(near.as_nanos() * 10 <= ceiling.as_nanos() * 12);
            // The crate's Backoff, built as a service config's policy builds it.
            if n > 0 {
                prop_assert_eq!(crate::Backoff::a6(initial, max, multiplier).ceiling(n), ceiling);
            }
        }
    }
}
