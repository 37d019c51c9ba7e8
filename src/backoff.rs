// How long to wait before a retry: capped exponential backoff with jitter.
//
// Everything here is a pure function of the retry number, the previous sleep and a random
// number generator, so it is tested as plain maths. The formulas are on [`Backoff`].

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use fastrand::Rng;

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
    /// The ceiling times a factor uniform in `[0.8, 1.2]`: about the ceiling every time,
    /// so each wait is about `multiplier` times the last (gRPC's A6 as amended in 2024,
    /// which grpc-go follows). A wait may exceed the cap by up to a fifth.
    Proportional,
}

/// Capped exponential backoff with [`Jitter`].
///
/// For retry `n` (1 for the first retry), base `b`, cap `c`, multiplier `m` (2 unless set
/// with [`Backoff::multiplier`]) and previous wait `p` (which starts at `b`):
///
/// | kind | wait |
/// | --- | --- |
/// | ceiling | `min(c, b * m^n)`, saturating |
/// | [`Jitter::None`] | the ceiling |
/// | [`Jitter::Full`] (default) | uniform in `[0, ceiling]` |
/// | [`Jitter::Equal`] | `ceiling / 2` + uniform in `[0, ceiling / 2]` |
/// | [`Jitter::Decorrelated`] | `min(c, uniform in [b, 3p])` |
/// | [`Jitter::Proportional`] | ceiling times uniform in `[0.8, 1.2]` |
///
/// Why jitter at all: clients that fail together and wait the same time retry together, so
/// every round of retries lands on the server as one spike. Full jitter spreads each round
/// over the whole interval.
///
/// Waits are computed in whole nanoseconds, so sub-second precision is kept. Every logical
/// request draws its own random numbers: no two requests share a jitter sequence.
///
/// The default is a base of 100 ms, a cap of 10 s, a multiplier of 2 and [`Jitter::Full`].
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
///
/// // Growing by half each time instead of doubling.
/// let gentle = backoff.multiplier(1.5);
/// assert_eq!(gentle.ceiling(1), Duration::from_millis(150));
/// assert_eq!(gentle.ceiling(2), Duration::from_millis(225));
/// ```
///
/// A backoff can also start from its first retry's ceiling ([`Backoff::from_initial`]):
/// gRPC's A6 backoff, `initialBackoff * backoffMultiplier^(n-1)` capped at `maxBackoff`, is
/// this formula with `b = initialBackoff / backoffMultiplier`, and the policies built from
/// a gRPC service config are made that way.
#[derive(Clone, Copy, Debug)]
pub struct Backoff {
    base: Duration,
    cap: Duration,
    jitter: Jitter,
    /// Finite and greater than zero.
    multiplier: f64,
    /// The first retry's ceiling before the cap: `base * multiplier`, kept exact (for a
    /// multiplier of 2, and for a backoff made from it) so the later ones are computed from
    /// it rather than from a rounded base.
    first: Duration,
    /// Which of `base` and `first` a new multiplier keeps.
    anchor: Anchor,
}

/// What a backoff was made from, which a new multiplier keeps as it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Anchor {
    Base,
    First,
}

impl PartialEq for Backoff {
    fn eq(&self, other: &Self) -> bool {
        // The multiplier is never NaN, so comparing its bits is comparing its value.
        (
            self.base,
            self.cap,
            self.jitter,
            self.multiplier.to_bits(),
            self.first,
            self.anchor,
        ) == (
            other.base,
            other.cap,
            other.jitter,
            other.multiplier.to_bits(),
            other.first,
            other.anchor,
        )
    }
}

impl Eq for Backoff {}

impl std::hash::Hash for Backoff {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        (
            self.base,
            self.cap,
            self.jitter,
            self.multiplier.to_bits(),
            self.first,
            self.anchor,
        )
            .hash(state);
    }
}

impl Default for Backoff {
    fn default() -> Self {
        Self::doubling(Duration::from_millis(100), Duration::from_secs(10))
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Nanoseconds in floating point, rounded to the nearest whole one; saturating at
/// `u64::MAX` and at zero (`as` saturates, and maps NaN to 0).
fn f64_nanos(nanos: f64) -> u64 {
    nanos.round() as u64
}

impl Backoff {
    /// Exponential backoff from `base`, never above `cap`, with [`Jitter::Full`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_http_retry::Backoff;
    ///
    /// let backoff = Backoff::exponential(Duration::from_millis(100), Duration::from_secs(10));
    /// assert_eq!(backoff.ceiling(1), Duration::from_millis(200));
    /// ```
    ///
    /// # Panics
    ///
    /// When `base` is greater than `cap`. [`Backoff::try_exponential`] returns an error
    /// instead.
    #[track_caller]
    pub fn exponential(base: Duration, cap: Duration) -> Self {
        match Self::try_exponential(base, cap) {
            Ok(backoff) => backoff,
            Err(e) => panic!("{e}"),
        }
    }

    /// Like [`Backoff::exponential`], but refuses a `base` greater than `cap` with an error.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_http_retry::Backoff;
    ///
    /// // Durations read from configuration: a base above the cap is an error, not a panic.
    /// assert!(Backoff::try_exponential(Duration::from_secs(5), Duration::from_secs(1)).is_err());
    /// let backoff = Backoff::try_exponential(Duration::from_millis(50), Duration::from_secs(1))?;
    /// assert_eq!(backoff.ceiling(0), Duration::from_millis(50));
    /// # Ok::<(), tower_http_retry::InvalidConfig>(())
    /// ```
    pub fn try_exponential(base: Duration, cap: Duration) -> Result<Self, InvalidConfig> {
        if base > cap {
            return Err(InvalidConfig::new(format!(
                "backoff base ({base:?}) is greater than its cap ({cap:?})"
            )));
        }
        Ok(Self::doubling(base, cap))
    }

    fn doubling(base: Duration, cap: Duration) -> Self {
        Self {
            base,
            cap,
            jitter: Jitter::Full,
            multiplier: 2.0,
            first: Duration::from_nanos(nanos(base).saturating_mul(2)),
            anchor: Anchor::Base,
        }
    }

    /// Exponential backoff whose first retry's ceiling is `initial` exactly, each later one
    /// the multiplier (2 unless set) times the last, never above `cap`: retry `n`'s ceiling
    /// is `min(cap, initial * m^(n-1))`, with [`Jitter::Full`]. This is gRPC's A6 backoff
    /// (`initialBackoff`, `maxBackoff`, `backoffMultiplier`). A new
    /// [`multiplier`](Self::multiplier) keeps `initial` as it is; the base is
    /// `initial / m`. An `initial` above `cap` is allowed: every ceiling is then `cap`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_http_retry::{Backoff, Jitter};
    ///
    /// let a6 = Backoff::from_initial(Duration::from_millis(100), Duration::from_secs(1))
    ///     .multiplier(1.5)
    ///     .jitter(Jitter::None);
    /// assert_eq!(a6.ceiling(1), Duration::from_millis(100));
    /// assert_eq!(a6.ceiling(2), Duration::from_millis(150));
    /// assert_eq!(a6.ceiling(30), Duration::from_secs(1));
    /// ```
    pub fn from_initial(initial: Duration, cap: Duration) -> Self {
        Self {
            base: Duration::from_nanos(nanos(initial) / 2).min(cap),
            cap,
            jitter: Jitter::Full,
            multiplier: 2.0,
            first: initial,
            anchor: Anchor::First,
        }
    }

    /// Sets the multiplier `m` of the ceiling `min(cap, base * m^n)`: 2 by default; 1.5 or
    /// 1.6 grow more gently, 1 keeps every ceiling at the base, and a multiplier below 1
    /// (which gRPC service configs allow) makes them shrink. [`Jitter::Decorrelated`]
    /// does not use it: its waits grow from the previous wait.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_http_retry::{Backoff, Jitter};
    ///
    /// let gentle = Backoff::exponential(Duration::from_millis(100), Duration::from_secs(10))
    ///     .multiplier(1.5)
    ///     .jitter(Jitter::None);
    /// assert_eq!(gentle.ceiling(1), Duration::from_millis(150));
    /// assert_eq!(gentle.ceiling(2), Duration::from_millis(225));
    /// ```
    ///
    /// # Panics
    ///
    /// When `multiplier` is not a finite number greater than zero (NaN, an infinity, zero
    /// or negative). [`Backoff::try_multiplier`] returns an error instead.
    #[track_caller]
    pub fn multiplier(self, multiplier: f64) -> Self {
        match self.try_multiplier(multiplier) {
            Ok(backoff) => backoff,
            Err(e) => panic!("{e}"),
        }
    }

    /// Like [`Backoff::multiplier`], but refuses a multiplier that is not a finite number
    /// greater than zero with an error.
    ///
    /// ```
    /// use tower_http_retry::Backoff;
    ///
    /// let error = Backoff::default().try_multiplier(f64::NAN).unwrap_err();
    /// assert!(error.to_string().contains("backoff multiplier is NaN"));
    /// assert!(Backoff::default().try_multiplier(0.0).is_err());
    /// assert_eq!(Backoff::default().try_multiplier(1.5)?, Backoff::default().multiplier(1.5));
    /// # Ok::<(), tower_http_retry::InvalidConfig>(())
    /// ```
    pub fn try_multiplier(mut self, multiplier: f64) -> Result<Self, InvalidConfig> {
        if !(multiplier.is_finite() && multiplier > 0.0) {
            return Err(InvalidConfig::new(format!(
                "backoff multiplier is {multiplier}; it must be a finite number greater than zero"
            )));
        }
        self.multiplier = multiplier;
        match self.anchor {
            Anchor::Base => {
                self.first = if multiplier == 2.0 {
                    Duration::from_nanos(nanos(self.base).saturating_mul(2))
                } else {
                    Duration::from_nanos(f64_nanos(nanos(self.base) as f64 * multiplier))
                };
            }
            Anchor::First => {
                let base = Duration::from_nanos(f64_nanos(nanos(self.first) as f64 / multiplier));
                self.base = base.min(self.cap);
            }
        }
        Ok(self)
    }

    /// Sets the kind of jitter.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_http_retry::{Backoff, Jitter};
    ///
    /// let backoff = Backoff::default().jitter(Jitter::Decorrelated);
    /// # let _ = backoff;
    /// ```
    pub fn jitter(mut self, jitter: Jitter) -> Self {
        self.jitter = jitter;
        self
    }

    /// The base delay.
    pub(crate) fn base(&self) -> Duration {
        self.base
    }

    /// The ceiling for retry `n` (1 for the first retry): `min(cap, base * m^n)`,
    /// saturating; `n = 0` gives `min(cap, base)`.
    ///
    /// With the default multiplier of 2 it is computed in integers, exactly. With any
    /// other, in floating point on nanoseconds (as gRPC's clients do), rounded to the
    /// nearest nanosecond.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_http_retry::Backoff;
    ///
    /// // The most each retry may wait: 200 ms, 400 ms, 800 ms, ... up to the cap.
    /// let backoff = Backoff::exponential(Duration::from_millis(100), Duration::from_secs(1));
    /// assert_eq!(backoff.ceiling(1), Duration::from_millis(200));
    /// assert_eq!(backoff.ceiling(3), Duration::from_millis(800));
    /// assert_eq!(backoff.ceiling(4), Duration::from_secs(1));
    /// ```
    pub fn ceiling(&self, n: u32) -> Duration {
        let cap = nanos(self.cap);
        let Some(later) = n.checked_sub(1) else {
            return Duration::from_nanos(nanos(self.base).min(cap));
        };
        let first = nanos(self.first);
        let raised = if self.multiplier == 2.0 {
            match 1u64.checked_shl(later) {
                Some(factor) => first.saturating_mul(factor),
                // 2^(n-1) does not fit: the product saturates, unless it is zero.
                None if first == 0 => 0,
                None => u64::MAX,
            }
        } else if first == 0 {
            0
        } else {
            let exponent = i32::try_from(later).unwrap_or(i32::MAX);
            // Finite and positive times a power that may reach 0 or infinity: never NaN.
            f64_nanos(first as f64 * self.multiplier.powi(exponent))
        };
        Duration::from_nanos(raised.min(cap))
    }

    /// The wait before retry `n` (1 for the first retry), given the previous wait (`base`
    /// before the first retry; only [`Jitter::Decorrelated`] uses it).
    pub(crate) fn delay(&self, n: u32, previous: Duration, rng: &mut Rng) -> Duration {
        match self.jitter {
            Jitter::None => self.ceiling(n),
            Jitter::Full => {
                let ceiling = nanos(self.ceiling(n));
                Duration::from_nanos(rng.u64(0..=ceiling))
            }
            Jitter::Equal => {
                let ceiling = nanos(self.ceiling(n));
                let half = ceiling / 2;
                // `ceiling - half` keeps the odd nanosecond, so the top is the ceiling itself.
                Duration::from_nanos(half + rng.u64(0..=ceiling - half))
            }
            Jitter::Decorrelated => {
                let base = nanos(self.base);
                let high = nanos(previous).saturating_mul(3).max(base);
                let drawn = rng.u64(base..=high);
                Duration::from_nanos(drawn.min(nanos(self.cap)))
            }
            Jitter::Proportional => {
                let factor = 0.8 + 0.4 * rng.f64_inclusive();
                Duration::from_nanos(f64_nanos(nanos(self.ceiling(n)) as f64 * factor))
            }
        }
    }
}

/// Where one logical request draws its random numbers from.
///
/// By default every draw comes from the thread's generator, so no two requests share a
/// sequence. With a seed (tests, simulations), each logical request gets its own generator,
/// seeded from the policy's seed and the request's place in line.
///
/// Jitter needs numbers that are spread evenly and differ between clients, not numbers no
/// one can predict: the generator is fastrand's wyrand (64 bits of state), each thread's
/// seeded once from the operating system.
#[derive(Debug)]
pub(crate) enum JitterRng {
    Thread,
    Seeded(Rng),
}

impl JitterRng {
    pub(crate) fn draw(&mut self, backoff: &Backoff, n: u32, previous: Duration) -> Duration {
        match self {
            JitterRng::Thread => {
                THREAD_RNG.with(|rng| backoff.delay(n, previous, &mut rng.borrow_mut()))
            }
            JitterRng::Seeded(rng) => backoff.delay(n, previous, rng),
        }
    }
}

thread_local! {
    /// The thread's jitter generator, seeded when the thread first draws.
    static THREAD_RNG: RefCell<Rng> = RefCell::new(Rng::with_seed(os_seed()));
}

/// A draw in [0, 1) from the thread's generator (the client-side throttle's coin).
pub(crate) fn thread_f64() -> f64 {
    THREAD_RNG.with(|rng| rng.borrow_mut().f64())
}

/// A seed from the operating system's generator. Should there be none to be had (a
/// sandbox without `getrandom(2)` or `/dev/urandom`), a hash of the process, the thread and
/// where this thread's stack lies (randomised per process where the system does so), so
/// that clients still differ: jitter that works beats a panic that fails the request the
/// retry was for.
fn os_seed() -> u64 {
    getrandom::u64().unwrap_or_else(|_| {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        std::process::id().hash(&mut hasher);
        std::thread::current().id().hash(&mut hasher);
        let here = 0u8;
        (std::ptr::from_ref(&here) as usize).hash(&mut hasher);
        hasher.finish()
    })
}

/// A seed shared by every request of one policy: each request takes the next stream.
#[derive(Debug)]
pub(crate) struct SeedSequence {
    seed: u64,
    next: AtomicU64,
}

impl SeedSequence {
    #[cfg(any(test, feature = "test-util"))]
    pub(crate) fn new(seed: u64) -> std::sync::Arc<Self> {
        std::sync::Arc::new(Self {
            seed,
            next: AtomicU64::new(0),
        })
    }

    pub(crate) fn rng(&self) -> JitterRng {
        let index = self.next.fetch_add(1, Ordering::Relaxed);
        JitterRng::Seeded(Rng::with_seed(splitmix(self.seed ^ splitmix(index))))
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
    use fastrand::Rng;
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
        let mut rng = Rng::with_seed(1);
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
    fn the_multiplier_sets_how_fast_ceilings_grow() {
        let b = default_with(Jitter::None);
        let ceilings = |m: f64| -> Vec<Duration> {
            let b = b.multiplier(m);
            (1..=5).map(|n| b.ceiling(n)).collect()
        };
        let us = |micros: [u64; 5]| micros.map(Duration::from_micros);
        assert_eq!(
            ceilings(1.5),
            us([150_000, 225_000, 337_500, 506_250, 759_375])
        );
        assert_eq!(ceilings(1.0), [100 * MS; 5]);
        assert_eq!(ceilings(0.5), us([50_000, 25_000, 12_500, 6_250, 3_125]));
        assert_eq!(
            ceilings(3.0),
            [300, 900, 2700, 8100, 10_000].map(|ms| ms * MS)
        );
        // n = 0 is the base, whatever the multiplier.
        assert_eq!(b.multiplier(7.0).ceiling(0), 100 * MS);
        // 2 set explicitly is the default, in every respect.
        assert_eq!(b.multiplier(2.0), b);
        assert_eq!(b.multiplier, 2.0);
        assert_ne!(b.multiplier(1.5), b);
    }

    #[test]
    fn extreme_multipliers_saturate_without_panicking() {
        let b = Backoff::exponential(Duration::from_secs(1), Duration::MAX);
        assert_eq!(
            b.multiplier(1e300).ceiling(u32::MAX),
            Duration::from_nanos(u64::MAX)
        );
        assert_eq!(
            b.multiplier(f64::MAX).ceiling(3),
            Duration::from_nanos(u64::MAX)
        );
        assert_eq!(b.multiplier(1e-300).ceiling(u32::MAX), Duration::ZERO);
        assert_eq!(b.multiplier(f64::MIN_POSITIVE).ceiling(1), Duration::ZERO);
        let zero = Backoff::exponential(Duration::ZERO, Duration::from_secs(1));
        assert_eq!(zero.multiplier(1e300).ceiling(9), Duration::ZERO);
        assert_eq!(zero.multiplier(3.0).ceiling(u32::MAX), Duration::ZERO);
    }

    #[test]
    fn invalid_multipliers_are_refused() {
        for bad in [f64::NAN, 0.0, -0.0, -1.5, f64::INFINITY, f64::NEG_INFINITY] {
            let error = Backoff::default().try_multiplier(bad).unwrap_err();
            assert!(error.to_string().contains("backoff"), "{bad}");
            assert!(
                error
                    .to_string()
                    .contains("a finite number greater than zero"),
                "{bad}: {error}"
            );
        }
        assert!(Backoff::default().try_multiplier(0.25).is_ok());
    }

    #[test]
    #[should_panic(expected = "backoff multiplier is NaN")]
    fn multiplier_panics_on_nan() {
        let _ = Backoff::default().multiplier(f64::NAN);
    }

    #[test]
    fn a6_ceilings_start_at_the_initial_backoff_exactly() {
        let a6 = Backoff::from_initial(100 * MS, 1000 * MS)
            .multiplier(1.5)
            .jitter(Jitter::None);
        let seen: Vec<_> = (1..=7).map(|n| a6.ceiling(n)).collect();
        assert_eq!(
            seen,
            [
                100 * MS,
                150 * MS,
                225 * MS,
                Duration::from_micros(337_500),
                Duration::from_micros(506_250),
                Duration::from_micros(759_375),
                1000 * MS,
            ]
        );
        // An initial backoff above the maximum: every ceiling is the maximum.
        let over = Backoff::from_initial(5000 * MS, 1000 * MS);
        assert_eq!(over.ceiling(1), 1000 * MS);
        assert!(over.base <= over.cap);
        // Doubling from the first ceiling, and the base under it.
        let doubling = Backoff::from_initial(100 * MS, 10_000 * MS).jitter(Jitter::None);
        assert_eq!(doubling.ceiling(1), 100 * MS);
        assert_eq!(doubling.ceiling(3), 400 * MS);
        assert_eq!(doubling.base, 50 * MS);
        assert_eq!(doubling.multiplier(4.0).base, 25 * MS);
        assert_eq!(doubling.multiplier(4.0).ceiling(1), 100 * MS);
    }

    #[test]
    fn proportional_jitter_stays_within_a_fifth_of_the_ceiling() {
        let b = default_with(Jitter::Proportional);
        let mut rng = Rng::with_seed(7);
        for n in 1..=8 {
            let ceiling = b.ceiling(n).as_secs_f64();
            let waits: Vec<f64> = (0..200)
                .map(|_| b.delay(n, MS, &mut rng).as_secs_f64())
                .collect();
            assert!(
                waits
                    .iter()
                    .all(|w| *w >= ceiling * 0.8 - 1e-9 && *w <= ceiling * 1.2 + 1e-9)
            );
            // Spread over the interval, not stuck at one end.
            assert!(
                waits.iter().any(|w| *w < ceiling * 0.9)
                    && waits.iter().any(|w| *w > ceiling * 1.1)
            );
        }
    }

    #[test]
    fn full_jitter_keeps_sub_millisecond_precision() {
        let b = default_with(Jitter::Full);
        let mut rng = Rng::with_seed(7);
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

    /// `RetryPolicy::rng_seed` promises the same waits run after run: the sequence a seed
    /// gives is pinned here, so that a change of generator (or of how fastrand draws from
    /// a range) is seen, and its figures (the storm example's) redone on purpose.
    #[test]
    fn a_seed_gives_the_same_waits_in_every_build() {
        let sequence = SeedSequence::new(42);
        let full = default_with(Jitter::Full);
        let mut first = sequence.rng();
        let waits: Vec<u64> = (1..=4)
            .map(|n| first.draw(&full, n, MS).as_nanos() as u64)
            .collect();
        assert_eq!(waits, PINNED_FULL);
        let decorrelated = default_with(Jitter::Decorrelated);
        let mut second = sequence.rng();
        let mut previous = decorrelated.base();
        let waits: Vec<u64> = (1..=4)
            .map(|n| {
                previous = second.draw(&decorrelated, n, previous);
                previous.as_nanos() as u64
            })
            .collect();
        assert_eq!(waits, PINNED_DECORRELATED);
    }

    /// Nanoseconds: seed 42's first request under full jitter (ceilings 200, 400, 800 and
    /// 1,600 ms), and its second under decorrelated jitter (from 100 ms).
    const PINNED_FULL: [u64; 4] = [137_887_402, 317_473_459, 776_245_844, 676_789_811];
    const PINNED_DECORRELATED: [u64; 4] = [273_037_885, 239_004_487, 224_074_235, 300_562_005];

    #[test]
    fn each_thread_seeds_its_own_generator() {
        let draws = || -> Vec<Duration> {
            let b = default_with(Jitter::Full);
            let mut rng = JitterRng::Thread;
            (0..4).map(|_| rng.draw(&b, 1, MS)).collect()
        };
        let one = std::thread::spawn(draws).join().unwrap();
        let other = std::thread::spawn(draws).join().unwrap();
        // Two new threads seeded alike would draw the same four waits.
        assert_ne!(one, other);
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
            let mut rng = Rng::with_seed(seed);
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

        #[test]
        fn any_multiplier_follows_the_formula(
            base_ms in 0u64..5_000,
            extra_ms in 0u64..60_000,
            multiplier in 0.01f64..10.0,
            n in 0u32..80,
            seed in any::<u64>(),
        ) {
            let base = Duration::from_millis(base_ms);
            let cap = base + Duration::from_millis(extra_ms);
            let backoff = Backoff::exponential(base, cap).multiplier(multiplier);
            let ceiling = backoff.ceiling(n);
            prop_assert!(ceiling <= cap);
            // min(c, b * m^n) in floating point; the first ceiling is rounded to the
            // nanosecond and the later ones grow from it.
            let exact = base.as_nanos() as f64 * multiplier.powi(n as i32);
            let expected = exact.min(cap.as_nanos() as f64);
            let slack = 1.0 + 0.5 * multiplier.powi(n as i32 - 1) + expected * 1e-12;
            prop_assert!(
                (ceiling.as_nanos() as f64 - expected).abs() <= slack,
                "{ceiling:?} vs {expected} ns"
            );
            // Growing for multipliers above 1, shrinking below, flat at 1.
            let next = backoff.ceiling(n + 1);
            if n > 0 && multiplier >= 1.0 {
                prop_assert!(next >= ceiling);
            }
            if n > 0 && multiplier <= 1.0 {
                prop_assert!(next <= ceiling);
            }
            let mut rng = Rng::with_seed(seed);
            let full = backoff.jitter(Jitter::Full).delay(n, base, &mut rng);
            prop_assert!(full <= ceiling);
            let equal = backoff.jitter(Jitter::Equal).delay(n, base, &mut rng);
            prop_assert!(equal <= ceiling && equal >= ceiling / 2);
            prop_assert_eq!(backoff.jitter(Jitter::None).delay(n, base, &mut rng), ceiling);
        }

        /// A backoff made from its first ceiling against A6's formula written out as
        /// grpc-go computes it: `initialBackoff * backoffMultiplier^(n-1)` in floating
        /// point on nanoseconds, capped at `maxBackoff`, rounded to the nanosecond.
        #[test]
        fn from_initial_is_a6s_formula(
            initial_ms in 1u64..10_000,
            max_ms in 1u64..100_000,
            multiplier in 0.01f64..10.0,
            n in 1u32..64,
            seed in any::<u64>(),
        ) {
            let (initial, max) = (Duration::from_millis(initial_ms), Duration::from_millis(max_ms));
            let backoff = Backoff::from_initial(initial, max).multiplier(multiplier);
            let raised = initial.as_nanos() as f64 * multiplier.powi(n as i32 - 1);
            let a6 = Duration::from_nanos(raised.min(max.as_nanos() as f64).round() as u64);
            prop_assert_eq!(backoff.ceiling(n), a6);
            prop_assert!(backoff.base <= max);
            let mut rng = Rng::with_seed(seed);
            prop_assert!(backoff.delay(n, initial, &mut rng) <= a6);
            let near = backoff.jitter(Jitter::Proportional).delay(n, initial, &mut rng);
            prop_assert!(near.as_nanos() * 10 >= (a6.as_nanos() * 8).saturating_sub(10));
            prop_assert!(near.as_nanos() * 10 <= a6.as_nanos() * 12 + 10);
        }
    }
}
