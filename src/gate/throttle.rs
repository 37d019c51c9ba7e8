// A failure-driven throttle: gRPC's `retryThrottling` (A6), and useful beyond gRPC. It is
// the crate's one token bucket (`gate::bucket`) without refill: a failure takes a token
// (never below zero), a success gives `token_ratio` back (never above the maximum), and a
// retry is allowed only while more than half is left. A6 supports three decimal places in
// `tokenRatio` and at most 1000 `maxTokens`, so the count in thousandths is at most
// 1 000 000 units and every step is exact integer arithmetic; the threshold test
// `tokens > max_tokens / 2` is `2 * units > max_units`, with no rounding of the half.

use std::fmt;
use std::sync::Arc;

use super::bucket::{Bucket, UNITS_PER_TOKEN};
use super::partition::{AuthorityKey, Part, Scoped};
use crate::error::{ConfigKind, InvalidConfig};

/// The largest `max_tokens` A6 allows.
const MAX_TOKENS: f64 = 1_000.0;

/// A retry throttle: retries are allowed only while more than half of `max_tokens` tokens
/// are left; failures take tokens and successes give them back.
///
/// This is gRPC's `retryThrottling` (grpc/proposal A6-client-retries), and it suits any
/// client whose retries should stop while a server keeps failing more often than a set
/// share of its attempts, whatever the traffic (where [`RetryBudget`](crate::RetryBudget) bounds retries relative to the
/// requests sent):
///
/// * the count starts at `max_tokens`, and stays between 0 and `max_tokens`;
/// * every failed attempt takes 1 token ([`record_failure`](Self::record_failure)); a
///   failure is an outcome the policy would retry, or one the server said not to retry.
///   Other outcomes (a 404, gRPC's `INVALID_ARGUMENT`) do not count: they are the caller's
///   fault, not the server's;
/// * every success adds `token_ratio` tokens ([`record_success`](Self::record_success));
/// * a retry is allowed only while the count is above `max_tokens / 2`
///   ([`allows_retry`](Self::allows_retry)). The first attempt is always sent.
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
/// Give it to a layer with [`RetryLayer::throttle`](crate::RetryLayer::throttle) or to a
/// policy with [`RetryPolicy::throttle`](crate::RetryPolicy::throttle). The count is kept in
/// thousandths of a token (A6 supports three decimal places in `tokenRatio`), in one atomic
/// word updated by compare-and-swap: no lock, and no update is lost whichever threads call
/// in.
///
/// # Clone
///
/// `Throttle` is a cheap handle (a reference-counted pointer): every clone shares the same
/// count. A6 throttles per server, so give every client of one server the same handle,
/// and each server its own.
///
/// # Example
///
/// ```
/// use tower_http_retry::Throttle;
///
/// let throttle = Throttle::builder().max_tokens(10.0).token_ratio(0.1).build();
/// let shared = throttle.clone();
/// assert!(throttle.allows_retry());
///
/// // Four failures leave 6 tokens, above the threshold of 5: retries still allowed.
/// for _ in 0..4 {
///     assert!(shared.record_failure());
/// }
/// // The fifth leaves 5, which is not above it.
/// assert!(!throttle.record_failure());
/// assert!(!shared.allows_retry());
///
/// // Ten successes at 0.1 earn one token back.
/// for _ in 0..10 {
///     throttle.record_success();
/// }
/// assert_eq!(throttle.tokens(), 6.0);
/// assert!(shared.allows_retry());
/// ```
#[derive(Clone)]
pub struct Throttle {
    /// The count: of every request, or one per authority.
    inner: Scoped<Inner>,
}

struct Inner {
    /// The token count, in thousandths of a token; it starts full, at `max_tokens`.
    bucket: Bucket,
    /// `token_ratio` in thousandths, at most the maximum.
    ratio_units: u64,
}

impl Throttle {
    /// A builder of a throttle, from A6's example: `max_tokens` 10, `token_ratio` 0.1.
    /// Both settings are named, so neither can be swapped for the other.
    ///
    /// ```
    /// use tower_http_retry::Throttle;
    ///
    /// let throttle = Throttle::builder().max_tokens(20.0).token_ratio(0.5).build();
    /// assert_eq!((throttle.max_tokens(), throttle.token_ratio()), (20.0, 0.5));
    /// ```
    pub fn builder() -> ThrottleBuilder {
        ThrottleBuilder {
            max_tokens: 10.0,
            token_ratio: 0.1,
            authorities: None,
        }
    }

    fn from_units(max_units: u32, ratio_units: u32, authorities: Option<usize>) -> Throttle {
        let inner = Inner {
            bucket: Bucket::full(u64::from(max_units), 0),
            ratio_units: u64::from(ratio_units),
        };
        Throttle {
            inner: Scoped::new(inner, authorities),
        }
    }

    /// True when the throttle keeps a count per authority
    /// ([`ThrottleBuilder::per_authority`]).
    pub fn is_per_authority(&self) -> bool {
        self.inner.is_per_authority()
    }

    /// The throttle of requests to `uri`'s authority: for a per-authority throttle, that
    /// authority's count (made on first sight, from the overflow's balance, full unless authorities failed there; the shared overflow count when the
    /// authorities tracked are all in use); the throttle itself otherwise, and for a URI
    /// without an authority.
    ///
    /// ```
    /// use tower_http_retry::Throttle;
    ///
    /// let throttle = Throttle::builder().max_tokens(4.0).per_authority().build();
    /// let down = throttle.partition(&"http://down.example/".parse().unwrap());
    /// down.record_failure();
    /// down.record_failure();
    /// assert!(!down.allows_retry());
    /// let up = throttle.partition(&"http://up.example/".parse().unwrap());
    /// assert!(up.allows_retry());
    /// ```
    pub fn partition(&self, uri: &http::Uri) -> Throttle {
        self.partition_of(AuthorityKey::of_uri(uri))
    }

    /// The count of the authority `key` names (see [`Throttle::partition`]).
    pub(crate) fn partition_of(&self, key: Option<AuthorityKey>) -> Throttle {
        Throttle {
            inner: self.inner.partition_of(key),
        }
    }

    /// How many authorities have a count of their own: 0 for a throttle not per authority.
    pub fn authorities(&self) -> usize {
        self.inner.authorities()
    }

    /// Records a failed attempt: takes one token (the count never goes below 0) and says
    /// whether a retry is still allowed, that is whether more than `max_tokens / 2` tokens
    /// are left after this one was taken.
    ///
    /// Call it once for every attempt that failed in a way the policy retries, or that the
    /// server said not to retry, before deciding on the retry; when it returns `false`, do
    /// not retry. Never for a transparent retry. It never blocks and never allocates.
    pub fn record_failure(&self) -> bool {
        self.above_threshold(self.inner.bucket.take_saturating(UNITS_PER_TOKEN))
    }

    /// Records a success: adds `token_ratio` tokens (the count never goes above
    /// `max_tokens`).
    ///
    /// Call it once per request that succeeded (a gRPC call that ended with `OK`), not once
    /// per attempt. It never blocks and never allocates.
    pub fn record_success(&self) {
        self.inner.bucket.deposit(self.inner.ratio_units);
    }

    /// Whether a retry would be allowed now: more than `max_tokens / 2` tokens are left.
    ///
    /// A snapshot: other clones may change the count right after. The retry decision
    /// itself should use the result of [`Throttle::record_failure`], which takes the
    /// failure's token and answers in one step, as A6 does.
    #[must_use]
    pub fn allows_retry(&self) -> bool {
        self.above_threshold(self.inner.bucket.units())
    }

    /// The current count of tokens, to a thousandth. A snapshot, for metrics and tests.
    #[must_use]
    pub fn tokens(&self) -> f64 {
        self.inner.bucket.units() as f64 / UNITS_PER_TOKEN as f64
    }

    /// The most tokens the count holds (A6's `maxTokens`, to a thousandth).
    #[must_use]
    pub fn max_tokens(&self) -> f64 {
        self.inner.bucket.cap_units() as f64 / UNITS_PER_TOKEN as f64
    }

    /// The tokens a success adds (A6's `tokenRatio`, to a thousandth, at most
    /// `max_tokens`).
    #[must_use]
    pub fn token_ratio(&self) -> f64 {
        self.inner.ratio_units as f64 / UNITS_PER_TOKEN as f64
    }

    /// True when two handles share one count.
    #[cfg(all(test, not(tower_http_retry_loom)))]
    pub(crate) fn same_as(&self, other: &Throttle) -> bool {
        self.inner.same_as(&other.inner)
    }

    fn above_threshold(&self, units: u64) -> bool {
        // tokens > max / 2, in units and without halving.
        units * 2 > self.inner.bucket.cap_units()
    }

    #[cfg(all(test, not(tower_http_retry_loom)))]
    fn units(&self) -> u64 {
        self.inner.bucket.units()
    }
}

/// Builds a [`Throttle`]: see [`Throttle::builder`].
#[derive(Debug, Clone, Copy, PartialEq)]
#[must_use = "a builder does nothing until it is built"]
pub struct ThrottleBuilder {
    max_tokens: f64,
    token_ratio: f64,
    authorities: Option<usize>,
}

impl ThrottleBuilder {
    /// One count per authority (the request URI's scheme, host and port; the `Host` header
    /// for a request in origin form), as A6 throttles per server, each with these settings.
    /// At most 1 024 authorities are tracked ([`max_authorities`](Self::max_authorities));
    /// only a count back at `max_tokens` and used by no request in flight is forgotten to
    /// make room (a failing server's count never is, so it cannot reset itself), and when
    /// every one is in use, further authorities share one overflow count. Requests with no
    /// authority share the throttle's own count. Clones share all of them.
    pub fn per_authority(mut self) -> Self {
        self.authorities
            .get_or_insert(super::partition::DEFAULT_MAX_AUTHORITIES);
        self
    }

    /// One count per authority ([`per_authority`](Self::per_authority)), tracking at most
    /// `max` authorities (default 1 024; at least 1).
    pub fn max_authorities(mut self, max: usize) -> Self {
        self.authorities = Some(max);
        self
    }

    /// The tokens the throttle holds, and starts with (A6's `maxTokens`, default 10). Counted
    /// in thousandths: digits past the third decimal place are dropped, as A6 allows.
    pub fn max_tokens(mut self, max_tokens: f64) -> Self {
        self.max_tokens = max_tokens;
        self
    }

    /// The tokens a success gives back (A6's `tokenRatio`, default 0.1), in thousandths.
    pub fn token_ratio(mut self, token_ratio: f64) -> Self {
        self.token_ratio = token_ratio;
        self
    }

    /// The throttle.
    ///
    /// # Panics
    ///
    /// When [`ThrottleBuilder::try_build`] refuses the settings, with its error's message.
    #[must_use]
    #[track_caller]
    pub fn build(self) -> Throttle {
        match self.try_build() {
            Ok(throttle) => throttle,
            Err(error) => panic!("{error}"),
        }
    }

    /// The throttle, or which setting is invalid and why.
    ///
    /// # Errors
    ///
    /// [`InvalidConfig`] when `max_tokens` is not in `(0, 1000]` (A6's range; NaN and
    /// infinities are outside it) or is below 0.001, or when `token_ratio` is not a finite
    /// number greater than 0, or is below 0.001 (it would round to no tokens at all). A
    /// ratio above `max_tokens` is accepted: one success then fills the count.
    ///
    /// ```
    /// use tower_http_retry::Throttle;
    ///
    /// let error = Throttle::builder().max_tokens(0.0).try_build().unwrap_err();
    /// assert!(error.to_string().contains("max_tokens is 0"), "{error}");
    /// let error = Throttle::builder().token_ratio(f64::NAN).try_build().unwrap_err();
    /// assert!(error.to_string().contains("token_ratio is NaN"), "{error}");
    /// assert!(Throttle::builder().max_tokens(1000.0).token_ratio(0.001).try_build().is_ok());
    /// ```
    pub fn try_build(self) -> Result<Throttle, InvalidConfig> {
        let ThrottleBuilder {
            max_tokens,
            token_ratio,
            authorities,
        } = self;
        let refuse = |message: String| {
            Err(InvalidConfig::new(
                ConfigKind::Throttle,
                format!("throttle {message}"),
            ))
        };
        if max_tokens.is_nan() || max_tokens <= 0.0 || max_tokens > MAX_TOKENS {
            return refuse(format!(
                "max_tokens is {max_tokens}; it must be greater than 0 and at most {MAX_TOKENS}"
            ));
        }
        let max_units = thousandths(max_tokens);
        if max_units == 0 {
            return refuse(format!(
                "max_tokens is {max_tokens}; it must be at least 0.001, since the throttle \
                 counts thousandths of a token"
            ));
        }
        if !token_ratio.is_finite() || token_ratio <= 0.0 {
            return refuse(format!(
                "token_ratio is {token_ratio}; it must be a finite number greater than 0"
            ));
        }
        let ratio_units = thousandths(token_ratio);
        if ratio_units == 0 {
            return refuse(format!(
                "token_ratio is {token_ratio}; it must be at least 0.001, since the throttle \
                 counts thousandths of a token"
            ));
        }
        if authorities == Some(0) {
            return refuse("max_authorities is 0; it must be at least 1".to_string());
        }
        Ok(Throttle::from_units(
            max_units,
            ratio_units.min(max_units),
            authorities,
        ))
    }
}

impl fmt::Debug for Throttle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut f = f.debug_struct("Throttle");
        if let Some(max) = self.inner.max_authorities() {
            f.field("max_authorities", &max);
        }
        f.field("tokens", &self.tokens())
            .field("max_tokens", &self.max_tokens())
            .field("token_ratio", &self.token_ratio())
            .finish()
    }
}

impl Part for Arc<Inner> {
    fn fresh(&self) -> Self {
        Arc::new(Inner {
            bucket: Bucket::full(self.bucket.cap_units(), 0),
            ratio_units: self.ratio_units,
        })
    }

    fn successor(&self) -> Self {
        let next = self.fresh();
        let missing = self.bucket.cap_units() - self.bucket.units();
        next.bucket.take_saturating(missing);
        next
    }

    fn at_rest(&self) -> bool {
        Arc::strong_count(self) == 1 && self.bucket.units() == self.bucket.cap_units()
    }
}

/// `value` in whole thousandths, dropping further digits. A decimal such as 0.57, stored a
/// hair below itself, counts as the thousandths it was written as. `value` is finite and
/// positive; anything above `u32::MAX` thousandths saturates.
fn thousandths(value: f64) -> u32 {
    let scaled = value * UNITS_PER_TOKEN as f64;
    let nearest = scaled.round();
    let units = if (scaled - nearest).abs() <= 4.0 * f64::EPSILON * nearest.max(1.0) {
        nearest
    } else {
        scaled.floor()
    };
    // `as` saturates, which is what a ratio far above the maximum wants.
    units as u32
}

#[cfg(all(test, not(tower_http_retry_loom)))]
mod tests {
    use super::*;

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
                    "invalid retry configuration: throttle ")),
            }
        }
    }
}
