// A retry budget: a shared, lock-free token bucket that limits how many
// retries a client may send, relative to how many requests it sends.
//
// # Why a budget, and not only a maximum number of attempts
//
// A per-request attempt limit bounds the damage one request can do, but not
// the damage all of them do together. When a dependency is down for
// everyone, every request fails, and a limit of 3 attempts means every
// request is sent 3 times: the struggling service sees three times its
// normal load at the very moment it can least afford it, and any layer above
// that also retries multiplies the factor again.
//
// A budget caps retries for the whole client instead. Each logical request
// earns a fraction `r` of a retry (default 0.1, in line with the common
// advice to keep retries under 10% of requests), and a small floor of `m`
// retries per second (default 10) is granted regardless of traffic so that a
// quiet client can still retry its occasional failure. Under a total outage
// the retry rate therefore settles at about `r * requests + m` per second,
// roughly 1.1 times the original load instead of 3 times, after an initial
// burst of at most `C` (default 100) retries saved up while things were
// healthy. Attempt limits are still useful per request; the budget is the
// limit on the aggregate.
//
// # How it is used
//
// The layer deposits once per logical request, when it starts (not once per attempt), and
// withdraws before each retry (not before the first attempt). The same two calls are
// tower's `Budget` trait, which `RetryBudget` implements, so one budget can also bound the
// retries of tower's own `Retry`. Neither blocks nor allocates.
//
// # The guarantee
//
// The bucket starts full with `C` tokens, never holds more than `C`, gains
// `r` per deposit and `m` per second of elapsed time, and every granted retry
// takes exactly one token; a retry is refused rather than letting the balance
// go below zero. Hence, over any interval of length `T`,
//
// ```text
// retries granted <= C + r * deposits + m * T
// ```
//
// no matter how many threads call in, or how their calls interleave. (Time is
// counted in whole milliseconds, so measured against a wall-clock interval
// the last term can be larger by the refill of one millisecond, `m / 1000`
// of a token.) Concurrent withdrawals never overdraw the bucket, and
// concurrent deposits are never lost (only clipped at `C`).
//
// Time comes from the budget's clock (`clock.rs`): the clock of the first layer that uses
// it, else the default (tokio's under the `tokio` feature), so that a test that moves a
// layer's `ManualClock`, or pauses tokio's clock, controls the refill.
//
// The bucket itself (its state word, the refill, the loom models) is `gate::bucket`; this is
// the ratio kind over it: a deposit of `ratio` per request, a withdrawal of one token per
// retry, refill of `min_per_sec` per second.

use std::fmt;

use super::bucket::{Bucket, MAX_BALANCE_UNITS, UNITS_PER_TOKEN};
use super::clock::GateClock;
use super::partition::Scoped;
use super::{Admission, Ask, GateBuilder, Kind, amount_units, positive_units, tokens};
use crate::info::StopReason;

/// Largest ratio accepted (a thousand retries per request is no limit at all).
const MAX_RATIO: f64 = 1_000.0;

/// A retry budget: a token bucket shared by all the requests of a client,
/// which grants a retry only while it holds at least one token.
///
/// * Every logical request deposits `ratio` tokens when it starts.
/// * The bucket also refills by `min_per_sec` tokens per second.
/// * It never holds more than `max_tokens`, and starts full.
/// * Every retry withdraws one token, or is refused; so does every hedge and every
///   transparent retry.
///
/// It hears requests, not outcomes: every logical request under a policy that has it
/// deposits, [`RetryPolicy::never`](crate::RetryPolicy::never), one-attempt policies and
/// `CONNECT` included (they are the client's traffic too). A refused retry returns the
/// last outcome, with [`StopReason::BudgetExhausted`] in the record.
///
/// Over any interval of length `T`, retries granted never exceed
/// `max_tokens + ratio * deposits + min_per_sec * T`, under any interleaving
/// of threads: the bucket is one atomic word updated by compare-and-swap, so
/// it is never overdrawn and no deposit is lost. Under a total outage,
/// where a limit of 3 attempts per request triples the load, a budget keeps
/// retries near `ratio * requests + min_per_sec` per second: with the
/// defaults (0.1, 10, 100), about 1.1 times the load.
///
/// Every [`RetryLayer`](crate::RetryLayer) has one of its own unless its policy says
/// otherwise ([`RetryPolicy::no_gates`](crate::RetryPolicy::no_gates)). Balances are kept in
/// thousandths of a token and time in whole milliseconds, which limits `max_tokens` to
/// 67 108.
///
/// `RetryBudget` is a cheap handle: every clone draws from and deposits into the same
/// bucket. It implements tower's [`Budget`](tower::retry::budget::Budget) trait, so one
/// budget can also bound the retries of tower's own `Retry`.
///
/// ```
/// use tower_http_retry::{RetryBudget, RetryLayer, RetryPolicy};
///
/// // 20% of requests, no refill over time, at most 50 retries saved up; shared by two
/// // layers (two clients of one service).
/// let budget = RetryBudget::builder().ratio(0.2).min_per_sec(0.0).max_tokens(50.0).build();
/// let a = RetryLayer::new().policy(RetryPolicy::new().gate(budget.clone()));
/// let b = RetryLayer::new().policy(RetryPolicy::new().gate(budget.clone()));
/// assert_eq!(budget.tokens(), 50.0);
/// # let _ = (a, b);
/// ```
#[derive(Clone)]
pub struct RetryBudget {
    pub(super) inner: Scoped<Budget>,
}

/// What a budget is built from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BudgetSettings {
    ratio: f64,
    min_per_sec: f64,
    max_tokens: f64,
}

/// The state of a [`RetryBudget`].
pub struct Budget {
    bucket: Bucket,
    deposit_units: u64,
    settings: BudgetSettings,
    /// The budget's clock, which the bucket's refill is measured on.
    clock: GateClock,
}

impl RetryBudget {
    /// A builder with the defaults: ratio 0.1, 10 tokens per second, at most 100 tokens.
    ///
    /// ```
    /// use tower_http_retry::RetryBudget;
    ///
    /// let budget = RetryBudget::builder().ratio(0.05).build();
    /// assert_eq!(budget.tokens(), 100.0);
    /// ```
    pub fn builder() -> GateBuilder<RetryBudget> {
        GateBuilder::new()
    }

    /// The tokens in the bucket now, refill included (for a budget kept per authority,
    /// those of requests without one: see [`Gate::partition`](super::Gate::partition)).
    #[must_use]
    pub fn tokens(&self) -> f64 {
        tokens(self.inner.units())
    }
}

impl GateBuilder<RetryBudget> {
    /// Tokens each logical request deposits: the share of requests that may be retried in
    /// the long run (default 0.1; 0 for none, else from 0.001 to 1000).
    ///
    /// ```
    /// use tower_http_retry::RetryBudget;
    ///
    /// // One retry per five requests.
    /// let budget = RetryBudget::builder().ratio(0.2).build();
    /// # let _ = budget;
    /// ```
    pub fn ratio(mut self, ratio: f64) -> Self {
        self.settings.ratio = ratio;
        self
    }

    /// Tokens the bucket gains per second whatever the traffic (default 10), so that a
    /// quiet client may still retry its occasional failure; a whole number (0 for none).
    ///
    /// ```
    /// use tower_http_retry::RetryBudget;
    ///
    /// let budget = RetryBudget::builder().min_per_sec(1.0).build();
    /// # let _ = budget;
    /// ```
    pub fn min_per_sec(mut self, min_per_sec: f64) -> Self {
        self.settings.min_per_sec = min_per_sec;
        self
    }

    /// The most tokens the bucket holds (default 100, at most 67 108): the burst of
    /// retries a budget allows after a quiet time. It starts full.
    ///
    /// ```
    /// use tower_http_retry::RetryBudget;
    ///
    /// let budget = RetryBudget::builder().max_tokens(20.0).build();
    /// assert_eq!(budget.tokens(), 20.0);
    /// ```
    pub fn max_tokens(mut self, max_tokens: f64) -> Self {
        self.settings.max_tokens = max_tokens;
        self
    }
}

impl Budget {
    fn deposit(&self) {
        self.bucket.deposit(self.deposit_units);
    }

    fn withdraw(&self) -> bool {
        self.bucket.withdraw(UNITS_PER_TOKEN, &self.clock)
    }

    fn units(&self) -> u64 {
        self.bucket.units(&self.clock)
    }
}

impl Kind for Budget {
    type Settings = BudgetSettings;
    const NAME: &'static str = "retry budget";
    const HEARS_OUTCOMES: bool = false;

    fn defaults() -> BudgetSettings {
        BudgetSettings {
            ratio: 0.1,
            min_per_sec: 10.0,
            max_tokens: 100.0,
        }
    }

    fn check(s: &BudgetSettings) -> Result<(), String> {
        let max_ratio = (MAX_RATIO * UNITS_PER_TOKEN as f64) as u64;
        amount_units("ratio", s.ratio, max_ratio)?;
        positive_units("max_tokens", s.max_tokens, MAX_BALANCE_UNITS)?;
        // A refill of `m` tokens per second is `m` thousandths per millisecond, which the
        // bucket counts in whole thousandths.
        let per_sec = s.min_per_sec;
        if !per_sec.is_finite() || per_sec < 0.0 || per_sec.fract() != 0.0 {
            return Err(format!(
                "min_per_sec is {per_sec}; it must be a whole number of tokens per second \
                 (0 for no refill)"
            ));
        }
        if per_sec > f64::from(u32::MAX) {
            return Err(format!(
                "min_per_sec is {per_sec}; it must be at most {}",
                u32::MAX
            ));
        }
        Ok(())
    }

    fn full(s: &BudgetSettings, clock: &GateClock) -> Budget {
        let units = |name, value, max| amount_units(name, value, max).unwrap_or(0);
        Budget {
            bucket: Bucket::full_on(
                units("max_tokens", s.max_tokens, MAX_BALANCE_UNITS),
                s.min_per_sec as u64,
                clock,
            ),
            deposit_units: units("ratio", s.ratio, u64::MAX),
            settings: *s,
            clock: clock.clone(),
        }
    }

    fn clock(&self) -> Option<&GateClock> {
        Some(&self.clock)
    }

    fn fresh(&self) -> Budget {
        Budget::full(&self.settings, &self.clock)
    }

    fn successor(&self) -> Budget {
        let next = self.fresh();
        next.bucket
            .take_saturating(self.bucket.cap_units() - self.units());
        next
    }

    fn at_rest(&self) -> bool {
        self.units() == self.bucket.cap_units()
    }

    #[inline]
    fn on_request(&self) {
        self.deposit();
    }

    fn admit(&self, ask: Ask) -> Admission {
        // Every retry the layer sends, of whatever kind, takes a token; a first attempt is
        // paid for by its deposit (the budget is not asked of one).
        if ask == Ask::First {
            return Admission::ADMIT;
        }
        match self.withdraw() {
            true => Admission::took(UNITS_PER_TOKEN),
            false => Admission::Refuse(StopReason::BudgetExhausted),
        }
    }

    fn release(&self, taken: u64) {
        self.bucket.deposit(taken);
    }
}

impl Default for RetryBudget {
    /// [`RetryBudget::builder`]'s defaults.
    fn default() -> Self {
        RetryBudget::builder().build()
    }
}

impl fmt::Debug for RetryBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.inner.settings;
        let mut f = f.debug_struct("RetryBudget");
        if let Some(max) = self.inner.max_authorities() {
            f.field("max_authorities", &max);
        }
        f.field("ratio", &tokens(self.inner.deposit_units))
            .field("min_per_sec", &s.min_per_sec)
            .field("max_tokens", &tokens(self.inner.bucket.cap_units()))
            .field("tokens", &self.tokens())
            .finish()
    }
}

// tower's retry module (the `tokio` feature brings it) and its own policies.
#[cfg(feature = "tokio")]
impl tower::retry::budget::Budget for RetryBudget {
    fn deposit(&self) {
        self.inner.deposit();
    }

    fn withdraw(&self) -> bool {
        self.inner.withdraw()
    }
}

#[cfg(all(test, not(tower_http_retry_loom)))]
mod tests {
    use super::*;

    use std::time::Duration;

    use tower::retry::budget::Budget as _;

    impl RetryBudget {
        fn withdraw_at(&self, now_ms: u64) -> bool {
            self.inner.bucket.withdraw_at(UNITS_PER_TOKEN, now_ms)
        }

        fn units_at(&self, now_ms: u64) -> u64 {
            self.inner.bucket.units_at(now_ms)
        }
    }

    /// Withdraws at `now` until refused; returns how many were granted.
    fn drain_at(budget: &RetryBudget, now: u64) -> u64 {
        let mut granted = 0;
        while budget.withdraw_at(now) {
            granted += 1;
            assert!(granted <= 67_108, "more grants than any bucket holds");
        }
        granted
    }

    fn budget(ratio: f64, min_per_sec: f64, max_tokens: f64) -> RetryBudget {
        RetryBudget::builder()
            .ratio(ratio)
            .min_per_sec(min_per_sec)
            .max_tokens(max_tokens)
            .build()
    }

    fn message(ratio: f64, min_per_sec: f64, max_tokens: f64) -> String {
        RetryBudget::builder()
            .ratio(ratio)
            .min_per_sec(min_per_sec)
            .max_tokens(max_tokens)
            .try_build()
            .expect_err("these values must be refused")
            .to_string()
    }

    #[test]
    fn the_default_is_ratio_0_1_ten_per_second_and_100_tokens() {
        let budget = RetryBudget::default();
        assert_eq!(budget.inner.deposit_units, 100);
        assert_eq!(budget.inner.bucket.refill_per_ms(), 10);
        assert_eq!(drain_at(&budget, 0), 100);
        for _ in 0..9 {
            budget.deposit();
        }
        assert!(!budget.withdraw_at(0), "nine deposits of 0.1 made a token");
        budget.deposit();
        assert!(
            budget.withdraw_at(0),
            "ten deposits of 0.1 did not make a token"
        );
        assert!(!budget.withdraw_at(0));
    }

    #[test]
    fn each_deposit_adds_the_ratio() {
        let budget = budget(0.25, 0.0, 5.0);
        assert_eq!(drain_at(&budget, 0), 5);
        for _ in 0..3 {
            budget.deposit();
        }
        assert_eq!(budget.units_at(0), 750);
        assert!(!budget.withdraw_at(0), "granted with 0.75 tokens");
        budget.deposit();
        assert!(budget.withdraw_at(0), "refused with 1 token");
        assert_eq!(budget.units_at(0), 0);
    }

    #[test]
    fn a_thousandth_short_of_a_token_is_refused() {
        let budget = budget(0.999, 1.0, 2.0);
        assert_eq!(drain_at(&budget, 0), 2);
        budget.deposit();
        assert_eq!(budget.units_at(0), 999);
        assert!(!budget.withdraw_at(0), "granted with 0.999 tokens");
        // 1 token/s is one thousandth per millisecond.
        assert!(budget.withdraw_at(1), "refused with 1.000 tokens");
        assert_eq!(budget.units_at(1), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn refill_follows_the_paused_tokio_clock() {
        let budget = budget(0.0, 10.0, 3.0);
        for _ in 0..3 {
            assert!(budget.withdraw());
        }
        assert!(!budget.withdraw());
        tokio::time::advance(Duration::from_millis(99)).await;
        assert!(!budget.withdraw(), "granted after 99 ms at 10 tokens/s");
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(budget.withdraw(), "refused after 100 ms at 10 tokens/s");
        assert!(!budget.withdraw());
        tokio::time::advance(Duration::from_secs(3_600)).await;
        assert_eq!(budget.tokens(), 3.0);
        assert!(format!("{budget:?}").contains("tokens: 3.0"));
    }

    #[test]
    fn the_largest_values_fit_the_bucket() {
        let budget = budget(MAX_RATIO, f64::from(u32::MAX), 67_108.863);
        assert_eq!(budget.inner.bucket.cap_units(), 67_108_863);
        assert!(budget.withdraw_at(0));
        budget.deposit();
        assert_eq!(budget.units_at(0), 67_108_863);
        assert_eq!(drain_at(&budget, 0), 67_108);
        budget.deposit();
        assert_eq!(budget.units_at(0), 1_000_863);
    }

    #[test]
    fn try_build_refuses_a_ratio_that_is_not_a_finite_positive_number() {
        for (ratio, shown) in [
            (f64::NAN, "NaN"),
            (f64::INFINITY, "inf"),
            (f64::NEG_INFINITY, "-inf"),
            (-0.5, "-0.5"),
        ] {
            assert_eq!(
                message(ratio, 10.0, 100.0),
                format!(
                    "invalid retry budget: ratio is {shown}; it must be a finite number from 0 to 1000"
                )
            );
        }
    }

    #[test]
    fn try_build_refuses_a_ratio_too_small_to_count() {
        let text = message(0.0004, 10.0, 100.0);
        assert!(
            text.starts_with("invalid retry budget: ratio is 0.0004; "),
            "{text}"
        );
        assert!(text.contains("at least 0.001"), "{text}");
        // Zero is not "too small": it means no deposits.
        for ratio in [0.0, 0.001, 1_000.0] {
            assert!(
                RetryBudget::builder().ratio(ratio).try_build().is_ok(),
                "{ratio}"
            );
        }
        assert_eq!(
            message(1_000.5, 10.0, 100.0),
            "invalid retry budget: ratio is 1000.5; it must be at most 1000"
        );
    }

    #[test]
    fn try_build_refuses_max_tokens_out_of_range() {
        assert_eq!(
            message(0.1, 10.0, 0.0),
            "invalid retry budget: max_tokens is 0; it must be at least 0.001"
        );
        let text = message(0.1, 10.0, 67_109.0);
        assert!(
            text.starts_with(
                "invalid retry budget: max_tokens is 67109; it must be at most 67108.863"
            ),
            "{text}"
        );
        assert!(message(0.1, 10.0, f64::from(u32::MAX)).contains("max_tokens is 4294967295"));
        assert_eq!(budget(0.1, 10.0, 67_108.863).tokens(), 67_108.863);
    }

    #[test]
    fn try_build_refuses_a_refill_that_is_not_whole_tokens_per_second() {
        for bad in [0.5, -1.0, f64::NAN, 5e9] {
            let text = message(0.1, bad, 100.0);
            assert!(
                text.starts_with(&format!("invalid retry budget: min_per_sec is {bad}; ")),
                "{text}"
            );
        }
    }

    #[test]
    #[should_panic(expected = "invalid retry budget: max_tokens is 0")]
    fn build_panics_with_the_error_message() {
        let _ = budget(0.1, 10.0, 0.0);
    }

    #[test]
    fn ratios_count_as_the_thousandths_they_were_written_as() {
        // Every ratio the budget takes, through the check the builder runs; then a few
        // through a whole budget.
        let max = (MAX_RATIO * UNITS_PER_TOKEN as f64) as u64;
        for k in 0..=1_000_000_u64 {
            let ratio = k as f64 / 1_000.0;
            assert_eq!(amount_units("ratio", ratio, max), Ok(k), "ratio {ratio}");
        }
        for (ratio, units) in [
            (0.57, 570),
            (1.001, 1_001),
            (0.0015, 1),
            (0.1239, 123),
            (1.0 / 3.0, 333),
            (999.999, 999_999),
        ] {
            assert_eq!(budget(ratio, 0.0, 1.0).inner.deposit_units, units);
        }
    }

    #[test]
    fn clones_share_one_bucket() {
        let first = budget(1.0, 0.0, 2.0);
        let second = first.clone();
        assert!(first.withdraw_at(0));
        assert!(second.withdraw_at(0));
        assert!(!first.withdraw_at(0), "the clone had a bucket of its own");
        second.deposit();
        assert_eq!(first.units_at(0), 1_000);
        assert!(first.withdraw_at(0));
        assert!(!second.withdraw_at(0));
        assert_eq!(first.tokens(), second.tokens());
    }

    #[test]
    fn the_tower_budget_trait_uses_the_same_bucket() {
        use tower::retry::budget::Budget;

        fn through_trait<B: Budget>(budget: &B) -> bool {
            budget.deposit();
            budget.withdraw()
        }

        // No refill, so the real clock these calls read does not matter.
        let budget = budget(0.5, 0.0, 1.0);
        // Full: the deposit is clipped, the withdrawal takes the one token.
        assert!(through_trait(&budget));
        assert_eq!(budget.tokens(), 0.0);
        // Half a token is not enough...
        assert!(!through_trait(&budget));
        assert_eq!(budget.tokens(), 0.5);
        // ...but two halves are.
        assert!(through_trait(&budget));
        assert_eq!(budget.tokens(), 0.0);
        assert!(!Budget::withdraw(&budget));
    }

    #[test]
    fn debug_shows_the_settings_and_the_balance() {
        let budget = budget(0.25, 7.0, 3.0);
        assert_eq!(
            format!("{budget:?}"),
            "RetryBudget { ratio: 0.25, min_per_sec: 7.0, max_tokens: 3.0, tokens: 3.0 }"
        );
    }
}
