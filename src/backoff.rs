//! How long to wait before a retry: capped exponential backoff with jitter.
//!
//! Everything here is a pure function of the retry number, the previous sleep and a random
//! number generator, so it is tested as plain maths. The formulas are on [`Backoff`].

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, RngExt, SeedableRng};

use crate::error::InvalidConfig;

/// How random the wait before a retry is. See [`Backoff`] for the formulas.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Jitter {
    /// Wait exactly the capped exponential ceiling. Synchronised clients stay synchronised:
    /// only for tests and for single clients.
    None,
    /// Uniform in `[0, ceiling]`: the widest spread, and the default.
    #[default]
    Full,
    /// Half the ceiling plus uniform in `[0, ceiling / 2]`: never waits less than half.
    Equal,
    /// `min(cap, uniform in [base, 3 * previous])`: each wait depends on the last one.
    Decorrelated,
}

/// Capped exponential backoff with [`Jitter`].
///
/// For retry `n` (1 for the first retry), base `b`, cap `c` and previous wait `p` (which
/// starts at `b`):
///
/// | kind | wait |
/// | --- | --- |
/// | ceiling | `min(c, b * 2^n)`, saturating |
/// | [`Jitter::None`] | the ceiling |
/// | [`Jitter::Full`] (default) | uniform in `[0, ceiling]` |
/// | [`Jitter::Equal`] | `ceiling / 2` + uniform in `[0, ceiling / 2]` |
/// | [`Jitter::Decorrelated`] | `min(c, uniform in [b, 3p])` |
///
/// Why jitter at all: clients that fail together and wait the same time retry together, so
/// every round of retries lands on the server as one spike. Full jitter spreads each round
/// over the whole interval.
///
/// Waits are computed in whole nanoseconds, so sub-second precision is kept. Every logical
/// request draws its own random numbers: no two requests share a jitter sequence.
///
/// The default is a base of 100 ms, a cap of 10 s and [`Jitter::Full`].
///
/// ```
/// use std::time::Duration;
/// use tower_http_retry::{Backoff, Jitter};
///
/// let backoff = Backoff::exponential(Duration::from_millis(100), Duration::from_secs(10))
///     .jitter(Jitter::None);
/// assert_eq!(backoff.ceiling(1), Duration::from_millis(200));
/// assert_eq!(backoff.ceiling(4), Duration::from_millis(1600));
/// assert_eq!(backoff.ceiling(30), Duration::from_secs(10));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Backoff {
    base: Duration,
    cap: Duration,
    jitter: Jitter,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            base: Duration::from_millis(100),
            cap: Duration::from_secs(10),
            jitter: Jitter::Full,
        }
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Backoff {
    /// Exponential backoff from `base`, never above `cap`, with [`Jitter::Full`].
    ///
    /// # Panics
    ///
    /// When `base` is greater than `cap`. [`Backoff::try_exponential`] returns an error
    /// instead.
    pub fn exponential(base: Duration, cap: Duration) -> Self {
        match Self::try_exponential(base, cap) {
            Ok(backoff) => backoff,
            Err(e) => panic!("{e}"),
        }
    }

    /// Like [`Backoff::exponential`], but refuses a `base` greater than `cap` with an error.
    pub fn try_exponential(base: Duration, cap: Duration) -> Result<Self, InvalidConfig> {
        if base > cap {
            return Err(InvalidConfig::new(
                crate::error::ConfigKind::Backoff,
                format!("backoff base ({base:?}) is greater than its cap ({cap:?})"),
            ));
        }
        Ok(Self {
            base,
            cap,
            jitter: Jitter::Full,
        })
    }

    /// Sets the kind of jitter.
    pub fn jitter(mut self, jitter: Jitter) -> Self {
        self.jitter = jitter;
        self
    }

    /// The base delay.
    pub fn base(&self) -> Duration {
        self.base
    }

    /// The cap no wait exceeds.
    pub fn cap(&self) -> Duration {
        self.cap
    }

    /// The kind of jitter.
    pub fn jitter_kind(&self) -> Jitter {
        self.jitter
    }

    /// The ceiling for retry `n` (1 for the first retry): `min(cap, base * 2^n)`, saturating.
    pub fn ceiling(&self, n: u32) -> Duration {
        let base = nanos(self.base);
        let cap = nanos(self.cap);
        let raised = match 1u64.checked_shl(n) {
            Some(factor) => base.saturating_mul(factor),
            // 2^n does not fit: the product saturates, unless the base is zero.
            None if base == 0 => 0,
            None => u64::MAX,
        };
        Duration::from_nanos(raised.min(cap))
    }

    /// The wait before retry `n` (1 for the first retry), given the previous wait (`base`
    /// before the first retry; only [`Jitter::Decorrelated`] uses it).
    pub fn delay<R: Rng + ?Sized>(&self, n: u32, previous: Duration, rng: &mut R) -> Duration {
        match self.jitter {
            Jitter::None => self.ceiling(n),
            Jitter::Full => {
                let ceiling = nanos(self.ceiling(n));
                Duration::from_nanos(rng.random_range(0..=ceiling))
            }
            Jitter::Equal => {
                let ceiling = nanos(self.ceiling(n));
                let half = ceiling / 2;
                // `ceiling - half` keeps the odd nanosecond, so the top is the ceiling itself.
                Duration::from_nanos(half + rng.random_range(0..=ceiling - half))
            }
            Jitter::Decorrelated => {
                let base = nanos(self.base);
                let high = nanos(previous).saturating_mul(3).max(base);
                let drawn = rng.random_range(base..=high);
                Duration::from_nanos(drawn.min(nanos(self.cap)))
            }
        }
    }
}

/// Where one logical request draws its random numbers from.
///
/// By default every draw comes from the thread's generator, so no two requests share a
/// sequence. With a seed (tests, simulations), each logical request gets its own generator,
/// seeded from the policy's seed and the request's place in line.
#[derive(Debug)]
pub(crate) enum JitterRng {
    Thread,
    Seeded(SmallRng),
}

impl JitterRng {
    pub(crate) fn draw(&mut self, backoff: &Backoff, n: u32, previous: Duration) -> Duration {
        match self {
            JitterRng::Thread => backoff.delay(n, previous, &mut rand::rng()),
            JitterRng::Seeded(rng) => backoff.delay(n, previous, rng),
        }
    }
}

/// A seed shared by every request of one policy: each request takes the next stream.
#[derive(Debug)]
pub(crate) struct SeedSequence {
    seed: u64,
    next: AtomicU64,
}

impl SeedSequence {
    pub(crate) fn new(seed: u64) -> Arc<Self> {
        Arc::new(Self {
            seed,
            next: AtomicU64::new(0),
        })
    }

    pub(crate) fn rng(&self) -> JitterRng {
        let index = self.next.fetch_add(1, Ordering::Relaxed);
        JitterRng::Seeded(SmallRng::seed_from_u64(splitmix(
            self.seed ^ splitmix(index),
        )))
    }
}

/// A 64-bit finaliser, so neighbouring indices give unrelated seeds.
fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MS: Duration = Duration::from_millis(1);

    fn default_with(jitter: Jitter) -> Backoff {
        Backoff::default().jitter(jitter)
    }

    #[test]
    fn ceiling_doubles_from_twice_the_base_and_caps() {
        let b = default_with(Jitter::None);
        let seen: Vec<_> = (1..=7).map(|n| b.ceiling(n)).collect();
        assert_eq!(
            seen,
            [200, 400, 800, 1600, 3200, 6400, 10_000].map(|ms| ms * MS)
        );
    }

    #[test]
    fn ceiling_saturates_for_huge_retry_numbers() {
        let b = Backoff::exponential(Duration::from_secs(1), Duration::MAX);
        assert_eq!(b.ceiling(200), Duration::from_nanos(u64::MAX));
        assert_eq!(default_with(Jitter::None).ceiling(u32::MAX), 10 * 1000 * MS);
    }

    #[test]
    fn no_jitter_is_the_ceiling() {
        let b = default_with(Jitter::None);
        let mut rng = SmallRng::seed_from_u64(1);
        assert_eq!(b.delay(3, MS, &mut rng), 800 * MS);
    }

    #[test]
    fn base_above_cap_is_refused() {
        let err =
            Backoff::try_exponential(Duration::from_secs(2), Duration::from_secs(1)).unwrap_err();
        assert!(err.to_string().contains("greater than its cap"), "{err}");
    }

    #[test]
    #[should_panic(expected = "greater than its cap")]
    fn exponential_panics_on_base_above_cap() {
        let _ = Backoff::exponential(Duration::from_secs(2), Duration::from_secs(1));
    }

    #[test]
    fn full_jitter_keeps_sub_millisecond_precision() {
        let b = default_with(Jitter::Full);
        let mut rng = SmallRng::seed_from_u64(7);
        let fractional = (0..100)
            .map(|_| b.delay(1, MS, &mut rng))
            .filter(|d| d.subsec_nanos() % 1_000_000 != 0)
            .count();
        assert!(fractional > 90, "only {fractional} of 100 had sub-ms parts");
    }

    #[test]
    fn seeded_requests_draw_different_sequences() {
        let seq = SeedSequence::new(42);
        let b = default_with(Jitter::Full);
        let mut first = seq.rng();
        let mut second = seq.rng();
        let a: Vec<_> = (1..=4).map(|n| first.draw(&b, n, MS)).collect();
        let c: Vec<_> = (1..=4).map(|n| second.draw(&b, n, MS)).collect();
        assert_ne!(a, c);
        // The same seed replays the same requests.
        let again = SeedSequence::new(42);
        let mut first_again = again.rng();
        let a2: Vec<_> = (1..=4).map(|n| first_again.draw(&b, n, MS)).collect();
        assert_eq!(a, a2);
    }

    #[test]
    fn thread_rng_requests_do_not_share_a_sequence() {
        let b = default_with(Jitter::Full);
        let mut x = JitterRng::Thread;
        let mut y = JitterRng::Thread;
        let a: Vec<_> = (1..=4).map(|n| x.draw(&b, n, MS)).collect();
        let c: Vec<_> = (1..=4).map(|n| y.draw(&b, n, MS)).collect();
        assert_ne!(a, c);
    }

    proptest! {
        #[test]
        fn every_delay_stays_within_its_bounds(
            base_ms in 0u64..5_000,
            extra_ms in 0u64..60_000,
            n in 1u32..80,
            prev_ms in 0u64..120_000,
            seed in any::<u64>(),
        ) {
            let base = Duration::from_millis(base_ms);
            let cap = base + Duration::from_millis(extra_ms);
            let mut rng = SmallRng::seed_from_u64(seed);
            let prev = Duration::from_millis(prev_ms).max(base);
            let ceiling = Backoff::exponential(base, cap).ceiling(n);
            prop_assert!(ceiling <= cap);
            // The same formula in wide integers: min(c, b * 2^n).
            let wide = base.as_nanos().saturating_mul(1u128 << n.min(100));
            prop_assert_eq!(ceiling.as_nanos(), wide.min(cap.as_nanos()));

            let none = Backoff::exponential(base, cap).jitter(Jitter::None).delay(n, prev, &mut rng);
            prop_assert_eq!(none, ceiling);

            let full = Backoff::exponential(base, cap).jitter(Jitter::Full).delay(n, prev, &mut rng);
            prop_assert!(full <= ceiling);

            let equal = Backoff::exponential(base, cap).jitter(Jitter::Equal).delay(n, prev, &mut rng);
            prop_assert!(equal <= ceiling && equal >= ceiling / 2, "{equal:?} vs {ceiling:?}");

            let dec = Backoff::exponential(base, cap).jitter(Jitter::Decorrelated).delay(n, prev, &mut rng);
            prop_assert!(dec <= cap);
            prop_assert!(dec >= base.min(cap));
            prop_assert!(dec <= (prev * 3).max(base));
        }
    }
}
