// A failure-driven throttle: gRPC's `retryThrottling` (A6), and useful beyond gRPC. It is
// the crate's one token bucket (`gate::bucket`) without refill: a failure takes a token
// (never below zero), a success gives `token_ratio` back (never above the maximum), and a
// retry is allowed only while more than half is left. A6 supports three decimal places in
// `tokenRatio` and at most 1000 `maxTokens`, so the count in thousandths is at most
// 1 000 000 units and every step is exact integer arithmetic; the threshold test
// `tokens > max_tokens / 2` is `2 * units > max_units`, with no rounding of the half.

use std::fmt;

use super::bucket::{Bucket, UNITS_PER_TOKEN};
use super::clock::GateClock;
use super::partition::Scoped;
use super::{Admission, Ask, GateBuilder, Heard, Kind, tokens};
use crate::info::StopReason;

/// The largest `max_tokens` A6 allows, in thousandths.
const MAX_UNITS: u64 = 1_000 * UNITS_PER_TOKEN;

/// A retry throttle: retries are allowed only while more than half of `max_tokens` tokens
/// are left; failures take tokens and successes give them back.
///
/// This is gRPC's `retryThrottling` (grpc/proposal A6-client-retries), and it suits any
/// client whose retries should stop while a server keeps failing more often than a set
/// share of its attempts, whatever the traffic (where [`RetryBudget`](crate::RetryBudget)
/// bounds retries relative to the requests sent):
///
/// * the count starts at `max_tokens`, and stays between 0 and `max_tokens`;
/// * every failed attempt takes 1 token; a failure is an outcome the policy would retry,
///   or one the server said not to retry. Other outcomes (a 404, gRPC's
///   `INVALID_ARGUMENT`) do not count: they are the caller's fault, not the server's;
/// * every success adds `token_ratio` tokens;
/// * a retry is allowed only while the count is above `max_tokens / 2` (after the failure
///   it follows was counted); a refused retry returns the last outcome, with
///   [`StopReason::Throttled`] in the record. The first attempt is always sent.
///
/// With A6's example of 10 tokens and a ratio of 0.1, starting full, retries stop once the
/// failures number 5 more than a tenth of the successes (roughly: more than one attempt in
/// eleven fails, over a stretch of traffic), and each token lost below the threshold takes
/// ten successes to win back.
///
/// What it hears, exactly: the outcome of every attempt of every request under a policy
/// that has it, classified by that policy's classifier, whatever its attempt limit: a
/// policy of [`max_attempts(1)`](crate::RetryPolicy::max_attempts) reports its one
/// attempt's failure or success too, as gRPC's clients count every retryable failure of a
/// method with a retry policy. It hears nothing of a transparent retry's attempt (the
/// server provably never saw it), nor of a request under
/// [`RetryPolicy::never`](crate::RetryPolicy::never) or a `CONNECT`. A hedge only checks
/// it; each hedge's own outcome is heard like any attempt's.
///
/// The count is kept in thousandths of a token (A6 supports three decimal places in
/// `tokenRatio`), in one atomic word updated by compare-and-swap: no lock, and no update is
/// lost whichever threads call in. `Throttle` is a cheap handle: every clone shares the
/// same count. A6 throttles per server: build it [`per_authority`](GateBuilder::per_authority),
/// or give each server's clients their own.
///
/// ```
/// use tower_http_retry::{RetryLayer, RetryPolicy, Throttle};
///
/// let throttle = Throttle::builder().max_tokens(10.0).token_ratio(0.1).per_authority().build();
/// let layer = RetryLayer::new().policy(RetryPolicy::new().gate(throttle.clone()));
/// assert_eq!(throttle.tokens(), 10.0);
/// # let _ = layer;
/// ```
#[derive(Clone)]
pub struct Throttle {
    pub(super) inner: Scoped<ThrottleState>,
}

/// What a throttle is built from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ThrottleSettings {
    max_tokens: f64,
    token_ratio: f64,
}

/// The state of a [`Throttle`].
pub struct ThrottleState {
    /// The token count, in thousandths of a token; it starts full, at `max_tokens`.
    bucket: Bucket,
    /// `token_ratio` in thousandths, at most the maximum.
    ratio_units: u64,
    settings: ThrottleSettings,
}

impl Throttle {
    /// A builder of a throttle, from A6's example: `max_tokens` 10, `token_ratio` 0.1.
    ///
    /// ```
    /// use tower_http_retry::Throttle;
    ///
    /// let throttle = Throttle::builder().max_tokens(20.0).token_ratio(0.5).build();
    /// assert_eq!(throttle.tokens(), 20.0);
    /// ```
    pub fn builder() -> GateBuilder<Throttle> {
        GateBuilder::new()
    }

    /// The tokens counted now (for a throttle kept per authority, those of requests without
    /// one: see [`Gate::partition`](super::Gate::partition)).
    #[must_use]
    pub fn tokens(&self) -> f64 {
        tokens(self.inner.bucket.units_still())
    }
}

impl GateBuilder<Throttle> {
    /// The most tokens, and the count at the start (default 10; more than 0, at most
    /// 1000, as A6 allows). Retries stop at half of it.
    ///
    /// ```
    /// use tower_http_retry::Throttle;
    ///
    /// let throttle = Throttle::builder().max_tokens(100.0).build();
    /// # let _ = throttle;
    /// ```
    pub fn max_tokens(mut self, max_tokens: f64) -> Self {
        self.settings.max_tokens = max_tokens;
        self
    }

    /// Tokens each success gives back (default 0.1; at least 0.001; a ratio above
    /// `max_tokens` refills the count at once).
    ///
    /// ```
    /// use tower_http_retry::Throttle;
    ///
    /// // Each token lost takes two successes to win back.
    /// let throttle = Throttle::builder().token_ratio(0.5).build();
    /// # let _ = throttle;
    /// ```
    pub fn token_ratio(mut self, token_ratio: f64) -> Self {
        self.settings.token_ratio = token_ratio;
        self
    }
}

impl ThrottleState {
    /// Takes one token (never below 0) and says whether a retry is still allowed: more
    /// than half left after it.
    fn record_failure(&self) -> bool {
        self.above_threshold(self.bucket.take_saturating(UNITS_PER_TOKEN))
    }

    fn record_success(&self) {
        self.bucket.deposit(self.ratio_units);
    }

    fn allows_retry(&self) -> bool {
        self.above_threshold(self.bucket.units_still())
    }

    /// `tokens > max_tokens / 2`, as `2 * units > max_units`: no rounding of the half.
    fn above_threshold(&self, units: u64) -> bool {
        units * 2 > self.bucket.cap_units()
    }
}

impl ThrottleState {
    /// A full state of `s` (the kind reads no time).
    fn of(s: &ThrottleSettings) -> ThrottleState {
        let units = |value| super::amount_units("", value, MAX_UNITS).unwrap_or(0);
        let max_units = units(s.max_tokens);
        ThrottleState {
            bucket: Bucket::full(max_units, 0),
            ratio_units: units(s.token_ratio.min(s.max_tokens)).min(max_units),
            settings: *s,
        }
    }
}

impl Kind for ThrottleState {
    type Settings = ThrottleSettings;
    const NAME: &'static str = "retry throttle";
    const HEARS_OUTCOMES: bool = true;

    fn defaults() -> ThrottleSettings {
        ThrottleSettings {
            max_tokens: 10.0,
            token_ratio: 0.1,
        }
    }

    fn check(s: &ThrottleSettings) -> Result<(), String> {
        super::positive_units("max_tokens", s.max_tokens, MAX_UNITS)?;
        // Any positive ratio: one above the maximum refills the count at once.
        let ratio = s.token_ratio.min(s.max_tokens);
        if !s.token_ratio.is_finite() || s.token_ratio <= 0.0 {
            return Err(format!(
                "token_ratio is {}; it must be a finite number greater than 0",
                s.token_ratio
            ));
        }
        super::positive_units("token_ratio", ratio, MAX_UNITS).map(|_| ())
    }

    fn full(s: &ThrottleSettings, _: &GateClock) -> ThrottleState {
        ThrottleState::of(s)
    }

    fn fresh(&self) -> ThrottleState {
        ThrottleState::of(&self.settings)
    }

    fn successor(&self) -> ThrottleState {
        let next = self.fresh();
        next.bucket
            .take_saturating(self.bucket.cap_units() - self.bucket.units_still());
        next
    }

    fn at_rest(&self) -> bool {
        self.bucket.units_still() == self.bucket.cap_units()
    }

    fn admit(&self, ask: Ask) -> Admission {
        match ask {
            // A hedge is no failure: it only looks. A retry's answer came with the failure
            // it follows; a transparent retry is outside the throttle.
            Ask::Hedge(_) if !self.allows_retry() => Admission::Refuse(StopReason::Throttled),
            _ => Admission::ADMIT,
        }
    }

    fn on_outcome(&self, heard: Heard, _: Option<u64>) -> Result<(), StopReason> {
        match heard {
            Heard::Success => self.record_success(),
            Heard::Failure(_) if !self.record_failure() => return Err(StopReason::Throttled),
            _ => {}
        }
        Ok(())
    }
}

impl fmt::Debug for Throttle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut f = f.debug_struct("Throttle");
        if let Some(max) = self.inner.max_authorities() {
            f.field("max_authorities", &max);
        }
        f.field("tokens", &self.tokens())
            .field("max_tokens", &tokens(self.inner.bucket.cap_units()))
            .field("token_ratio", &tokens(self.inner.ratio_units))
            .finish()
    }
}

#[cfg(all(test, not(tower_http_retry_loom)))]
mod tests {
    use super::*;

    // What the layer does through the gate interface, by name, for these tests.
    impl Throttle {
        fn record_failure(&self) -> bool {
            self.inner.record_failure()
        }

        fn record_success(&self) {
            self.inner.record_success();
        }

        fn allows_retry(&self) -> bool {
            self.inner.allows_retry()
        }

        fn max_tokens(&self) -> f64 {
            tokens(self.inner.bucket.cap_units())
        }

        fn token_ratio(&self) -> f64 {
            tokens(self.inner.ratio_units)
        }

        fn same_as(&self, other: &Throttle) -> bool {
            self.inner.same_as(&other.inner)
        }

        fn units(&self) -> u64 {
            self.inner.bucket.units_still()
        }
    }

    use proptest::prelude::*;

    #[test]
    fn starts_full_and_stops_retries_at_half() {
        let throttle = Throttle::builder()
            .max_tokens(10.0)
            .token_ratio(0.1)
            .build();
        assert_eq!(throttle.tokens(), 10.0);
        assert!(throttle.allows_retry());
        let answers: Vec<bool> = (0..7).map(|_| throttle.record_failure()).collect();
        // 9, 8, 7, 6 are above 5; 5, 4, 3 are not.
        assert_eq!(
            answers,
            [true, true, true, true, false, false, false],
            "tokens after: {}",
            throttle.tokens()
        );
        assert_eq!(throttle.tokens(), 3.0);
    }

    #[test]
    fn never_goes_below_zero_or_above_the_maximum() {
        let throttle = Throttle::builder().max_tokens(2.0).token_ratio(0.5).build();
        for _ in 0..10 {
            assert!(!throttle.record_failure() || throttle.tokens() > 1.0);
        }
        assert_eq!(throttle.units(), 0);
        for _ in 0..100 {
            throttle.record_success();
        }
        assert_eq!(throttle.units(), 2_000);
    }

    #[test]
    fn recovers_above_the_threshold_with_successes() {
        let throttle = Throttle::builder()
            .max_tokens(10.0)
            .token_ratio(0.1)
            .build();
        while throttle.record_failure() {}
        assert_eq!(throttle.tokens(), 5.0);
        assert!(!throttle.allows_retry());
        // Exactly 5 is not above 5: one success (0.1) is needed.
        throttle.record_success();
        assert_eq!(throttle.units(), 5_100);
        assert!(throttle.allows_retry());
    }

    #[test]
    fn an_odd_maximum_has_an_exact_half() {
        // max 3: threshold 1.5; 2 tokens allow, 1 does not.
        let throttle = Throttle::builder().max_tokens(3.0).token_ratio(0.5).build();
        assert!(throttle.record_failure()); // 2
        assert!(!throttle.record_failure()); // 1
        throttle.record_success(); // 1.5: not above 1.5
        assert!(!throttle.allows_retry());
        throttle.record_success(); // 2
        assert!(throttle.allows_retry());
    }

    #[test]
    fn fractional_values_count_in_thousandths() {
        let throttle = Throttle::builder()
            .max_tokens(10.5)
            .token_ratio(0.57)
            .build();
        assert_eq!(throttle.inner.bucket.cap_units(), 10_500);
        assert_eq!(throttle.inner.ratio_units, 570);
        assert_eq!(throttle.max_tokens(), 10.5);
        assert_eq!(throttle.token_ratio(), 0.57);
        // Digits past the third decimal place are dropped.
        let throttle = Throttle::builder()
            .max_tokens(1.0009)
            .token_ratio(0.0019)
            .build();
        assert_eq!(throttle.inner.bucket.cap_units(), 1_000);
        assert_eq!(throttle.inner.ratio_units, 1);
    }

    #[test]
    fn a_ratio_above_the_maximum_fills_the_count() {
        let throttle = Throttle::builder()
            .max_tokens(4.0)
            .token_ratio(1e300)
            .build();
        assert_eq!(throttle.token_ratio(), 4.0);
        while throttle.record_failure() {}
        throttle.record_success();
        assert_eq!(throttle.tokens(), 4.0);
    }

    #[test]
    fn clones_share_one_count_and_new_ones_do_not() {
        let throttle = Throttle::builder().max_tokens(4.0).token_ratio(1.0).build();
        let clone = throttle.clone();
        assert!(clone.record_failure());
        assert_eq!(throttle.tokens(), 3.0);
        assert!(throttle.same_as(&clone));
        let other = Throttle::builder().max_tokens(4.0).token_ratio(1.0).build();
        assert!(!other.same_as(&throttle));
        assert_eq!(other.tokens(), 4.0);
    }

    #[test]
    fn debug_shows_the_count() {
        let text = format!(
            "{:?}",
            Throttle::builder()
                .max_tokens(10.0)
                .token_ratio(0.1)
                .build()
        );
        assert_eq!(
            text,
            "Throttle { tokens: 10.0, max_tokens: 10.0, token_ratio: 0.1 }"
        );
    }

    /// Many threads fail and succeed at once on a count that never reaches either bound:
    /// the final count is exactly what the calls add up to, so no update was lost.
    #[test]
    fn no_update_is_lost_across_threads() {
        const THREADS: u32 = 4;
        const FAILURES: u32 = 2_000;
        for round in 0..5 {
            // 1000 tokens, ratio 0.5, starting at 500. Each step of a thread is one
            // failure and two successes (net zero), so at any moment each thread is at
            // most one token away from where it started: the four together stay far from
            // 0 and 1000, and nothing may be clipped.
            let throttle = Throttle::builder()
                .max_tokens(1000.0)
                .token_ratio(0.5)
                .build();
            for _ in 0..500 {
                throttle.record_failure();
            }
            assert_eq!(throttle.units(), 500_000);
            let handles: Vec<_> = (0..THREADS)
                .map(|t| {
                    let throttle = throttle.clone();
                    std::thread::spawn(move || {
                        for i in 0..FAILURES {
                            // Alternate the order per thread and round, so threads
                            // contend on both operations.
                            if (i + t + round) % 2 == 0 {
                                throttle.record_failure();
                                throttle.record_success();
                                throttle.record_success();
                            } else {
                                throttle.record_success();
                                throttle.record_success();
                                throttle.record_failure();
                            }
                        }
                    })
                })
                .collect();
            for handle in handles {
                handle.join().unwrap();
            }
            assert_eq!(throttle.units(), 500_000, "round {round}");
        }
    }

    /// Many threads fail at once from full: the count reaches exactly 0, and exactly the
    /// failures that left more than half the tokens were told a retry is allowed.
    #[test]
    fn racing_failures_answer_as_some_sequential_order() {
        for _ in 0..20 {
            let throttle = Throttle::builder()
                .max_tokens(100.0)
                .token_ratio(1.0)
                .build();
            let handles: Vec<_> = (0..4)
                .map(|_| {
                    let throttle = throttle.clone();
                    std::thread::spawn(move || {
                        (0..50).filter(|_| throttle.record_failure()).count()
                    })
                })
                .collect();
            let allowed: usize = handles.into_iter().map(|h| h.join().unwrap()).sum();
            // 99 .. 51 are above 50: 49 of the first 50 failures allowed a retry.
            assert_eq!(allowed, 49);
            assert_eq!(throttle.units(), 0);
        }
    }

    #[derive(Debug, Clone, Copy)]
    enum Op {
        Failure,
        Success,
        Check,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => Just(Op::Failure),
            3 => Just(Op::Success),
            1 => Just(Op::Check),
        ]
    }

    proptest! {
        /// The throttle against A6's rule written out in floating point, as grpc-go keeps
        /// it, on values that binary floating point holds exactly (whole maxima, ratios in
        /// eighths): every answer and every count agree.
        #[test]
        fn follows_the_a6_rule(
            max_tokens in 1u32..=1000,
            eighths in 1u32..=40,
            ops in proptest::collection::vec(op(), 0..300),
        ) {
            let max = f64::from(max_tokens);
            let ratio = f64::from(eighths) / 8.0;
            let throttle = Throttle::builder().max_tokens(max).token_ratio(ratio).build();
            let mut model = max;
            for op in ops {
                match op {
                    Op::Failure => {
                        model = (model - 1.0).max(0.0);
                        prop_assert_eq!(throttle.record_failure(), model > max / 2.0);
                    }
                    Op::Success => {
                        model = (model + ratio).min(max);
                        throttle.record_success();
                    }
                    Op::Check => prop_assert_eq!(throttle.allows_retry(), model > max / 2.0),
                }
                prop_assert_eq!(throttle.tokens(), model);
            }
        }

        /// Any finite input is either refused with an error or makes a throttle whose
        /// count stays within its bounds.
        #[test]
        fn any_values_are_refused_or_stay_in_bounds(
            max_tokens in prop_oneof![any::<f64>(), 0.0..1001.0f64],
            token_ratio in prop_oneof![any::<f64>(), 0.0..2.0f64],
            failures in 0usize..50,
        ) {
            match Throttle::builder().max_tokens(max_tokens).token_ratio(token_ratio).try_build() {
                Ok(throttle) => {
                    prop_assert!(max_tokens > 0.0 && max_tokens <= 1000.0);
                    prop_assert!(token_ratio > 0.0);
                    for _ in 0..failures {
                        throttle.record_failure();
                    }
                    throttle.record_success();
                    prop_assert!(throttle.tokens() >= 0.0);
                    prop_assert!(throttle.tokens() <= throttle.max_tokens());
                }
                Err(error) => prop_assert!(error.to_string().starts_with(
                    "invalid retry throttle: ")),
            }
        }
    }
}
