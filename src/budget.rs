//! A retry budget: a shared, lock-free token bucket that limits how many
//! retries a client may send, relative to how many requests it sends.
//!
//! # Why a budget, and not only a maximum number of attempts
//!
//! A per-request attempt limit bounds the damage one request can do, but not
//! the damage all of them do together. When a dependency is down for
//! everyone, every request fails, and a limit of 3 attempts means every
//! request is sent 3 times: the struggling service sees three times its
//! normal load at the very moment it can least afford it, and any layer above
//! that also retries multiplies the factor again.
//!
//! A budget caps retries for the whole client instead. Each logical request
//! earns a fraction `r` of a retry (default 0.1, in line with the common
//! advice to keep retries under 10% of requests), and a small floor of `m`
//! retries per second (default 10) is granted regardless of traffic so that a
//! quiet client can still retry its occasional failure. Under a total outage
//! the retry rate therefore settles at about `r * requests + m` per second,
//! roughly 1.1 times the original load instead of 3 times, after an initial
//! burst of at most `C` (default 100) retries saved up while things were
//! healthy. Attempt limits are still useful per request; the budget is the
//! limit on the aggregate.
//!
//! # How it is used
//!
//! [`RetryLayer`](crate::RetryLayer) does both calls itself; use them directly
//! only to share a budget with retries made elsewhere.
//!
//! * Call [`RetryBudget::deposit`] once per logical request, when it starts
//!   (not once per attempt).
//! * Call [`RetryBudget::withdraw`] before each retry (not before the first
//!   attempt); if it returns `false`, give up and return the last outcome.
//!
//! The same two calls are available through tower's
//! [`Budget`](tower::retry::budget::Budget) trait, which `RetryBudget`
//! implements. Neither blocks nor allocates.
//!
//! # The guarantee
//!
//! The bucket starts full with `C` tokens, never holds more than `C`, gains
//! `r` per deposit and `m` per second of elapsed time, and every granted retry
//! takes exactly one token; a retry is refused rather than letting the balance
//! go below zero. Hence, over any interval of length `T`,
//!
//! ```text
//! retries granted <= C + r * deposits + m * T
//! ```
//!
//! no matter how many threads call in, or how their calls interleave. (Time is
//! counted in whole milliseconds, so measured against a wall-clock interval
//! the last term can be larger by the refill of one millisecond, `m / 1000`
//! of a token.) Concurrent withdrawals never overdraw the bucket, and
//! concurrent deposits are never lost (only clipped at `C`).
//!
//! Time comes from [`tokio::time::Instant`], so a test that pauses tokio's
//! clock controls the refill.
//!
//! # Example
//!
//! ```
#![doc = concat!("use ", env!("CARGO_CRATE_NAME"), "::RetryBudget;")]
//!
//! // 20% of requests may be retried, at most 5 saved up. (A real budget also
//! // refills over time; 0 per second keeps this example independent of the clock.)
//! let budget = RetryBudget::new(0.2, 0, 5);
//!
//! // The bucket starts full: five retries are allowed right away...
//! for _ in 0..5 {
//!     assert!(budget.withdraw());
//! }
//! // ...and then no more, until requests earn new ones.
//! assert!(!budget.withdraw());
//!
//! // Five requests at 0.2 earn one retry.
//! for _ in 0..5 {
//!     budget.deposit();
//! }
//! assert!(budget.withdraw());
//! ```

// How it works.
//
// The whole state is one `AtomicU64`, changed only by compare-and-swap:
//
//  63              38 37                               0
// +------------------+----------------------------------+
// | balance: 26 bits | last refill tick: 38 bits        |
// +------------------+----------------------------------+
//
// - The balance counts thousandths of a token ("units"), so `max_tokens` can be at most
//   67 108 (`2^26 - 1` units is 67 108.863 tokens). A deposit adds `r` rounded down to
//   whole thousandths (ratios such as 0.57 or 1.001, which floating point cannot represent
//   exactly, count as the thousandths they were written as; a positive ratio below 0.001
//   is refused instead of being silently rounded to zero).
// - The tick is the number of whole milliseconds since the budget was created, taken
//   modulo `2^38`. With these units a refill of `m` tokens per second is exactly `m` units
//   per millisecond, so refill is exact integer arithmetic: `elapsed_ms * m` units are
//   credited and the tick moves to the current millisecond, so no time is lost or counted
//   twice. Time spent with a full bucket is not banked.
// - A deposit reads no clock and leaves the tick alone; the next withdrawal credits the
//   refill (see `add_deposit`). A withdrawal reads the clock once, before it loads the
//   word, so with several threads it may carry a tick slightly older than the one another
//   thread has just stored. Such a call credits no refill and leaves the stored tick alone;
//   it is still a valid withdrawal. A tick counts as older when it lies in the half of the
//   38-bit circle behind the stored one, which is why the tick needs far more than 32 bits:
//   with 32 bits that half is only 24.8 days, and a client idle for a month could see its
//   refill stall for weeks. With 38 bits the tick wraps every 8.7 years (harmlessly:
//   elapsed time uses wrapping subtraction), and only a budget that sees no withdrawal for
//   more than 2^37 ms (about 4.36 years) can have its elapsed time misread as "older"; it
//   then gets no refill until the clock has gone round again, but deposits still work.
// - Reads and writes of the word use `Ordering::Relaxed`: the word publishes no other
//   memory, and every change is a read-modify-write of that one word, so all changes are
//   totally ordered and a successful compare-and-swap proves no other change came in
//   between its load and its store.
//
// The loom models at the end of this file check the compare-and-swap loops under every
// interleaving; under `--cfg tower_http_retry_loom` the tests build the budget on loom's
// atomics (loom is a dev-dependency, so users' lock files never list it).

use std::fmt;

use crate::error::{ConfigKind, InvalidConfig};

#[cfg(all(test, tower_http_retry_loom))]
use ::loom::sync::{
    Arc,
    atomic::{AtomicU64, Ordering},
};
#[cfg(not(all(test, tower_http_retry_loom)))]
use std::sync::{
    Arc,
    atomic::{AtomicU64, Ordering},
};

use tokio::time::Instant;

/// Balance units per token: the balance is kept in thousandths of a token.
const UNITS_PER_TOKEN: u64 = 1_000;
/// Width of the tick field (the low bits of the state word).
const TICK_BITS: u32 = 38;
/// Width of the balance field (the high bits of the state word).
const BALANCE_BITS: u32 = u64::BITS - TICK_BITS;
/// Mask of the tick field; ticks are taken modulo `2^TICK_BITS`.
const TICK_MASK: u64 = (1 << TICK_BITS) - 1;
/// Elapsed tick counts at or above this are read as "behind the stored tick".
const TICK_HALF_RANGE: u64 = 1 << (TICK_BITS - 1);
/// Largest balance, in units, that the balance field can hold.
const MAX_BALANCE_UNITS: u64 = (1 << BALANCE_BITS) - 1;
/// Largest `max_tokens`: the most whole tokens the balance field can hold.
const MAX_TOKENS: u32 = (MAX_BALANCE_UNITS / UNITS_PER_TOKEN) as u32;
/// Largest ratio accepted (a thousand retries per request is no limit at all).
const MAX_RATIO: f64 = 1_000.0;

/// Packs a balance (in units) and a tick into one state word.
const fn pack(balance: u64, tick: u64) -> u64 {
    (balance << TICK_BITS) | (tick & TICK_MASK)
}

/// The balance, in units, stored in a state word.
const fn balance_of(state: u64) -> u64 {
    state >> TICK_BITS
}

/// The last refill tick stored in a state word.
const fn tick_of(state: u64) -> u64 {
    state & TICK_MASK
}

/// A retry budget: a token bucket shared by all the requests of a client,
/// which grants a retry only while it holds at least one token.
///
/// * Every logical request [deposits](Self::deposit) `ratio` tokens when it
///   starts.
/// * The bucket also refills by `min_per_sec` tokens per second.
/// * It never holds more than `max_tokens`, and starts full.
/// * Every retry [withdraws](Self::withdraw) one token, or is refused.
///
/// Over any interval of length `T`, retries granted never exceed
/// `max_tokens + ratio * deposits + min_per_sec * T`, under any interleaving
/// of threads: the bucket is one atomic word updated by compare-and-swap, so
/// it is never overdrawn and no deposit is lost. Under a total outage,
/// where a limit of 3 attempts per request triples the load, a budget keeps
/// retries near `ratio * requests + min_per_sec` per second: with the
/// defaults, about 1.1 times the load.
///
/// Balances are kept in thousandths of a token and time in whole
/// milliseconds, which limits `max_tokens` to 67 108 and rounds `ratio` down
/// to thousandths; see [`RetryBudget::try_new`].
///
/// # Clone
///
/// `RetryBudget` is a cheap handle (a reference-counted pointer): cloning it
/// does not create a new bucket, and every clone draws from and deposits into
/// the same one. Clone it into every service or task that should share the
/// budget; create a new one with [`RetryBudget::new`] for an independent
/// budget.
///
/// # Example
///
/// ```
#[doc = concat!("use ", env!("CARGO_CRATE_NAME"), "::RetryBudget;")]
///
/// // 10% of requests, no refill over time (keeping this example independent
/// // of the clock), at most 2 retries saved up.
/// let budget = RetryBudget::new(0.1, 0, 2);
/// let shared = budget.clone();
///
/// assert!(shared.withdraw());
/// assert!(budget.withdraw());
/// // Both handles drew from the same bucket, which is now empty.
/// assert!(!shared.withdraw());
/// assert_eq!(budget.tokens(), 0.0);
/// ```
#[derive(Clone)]
pub struct RetryBudget {
    inner: Arc<Inner>,
}

/// The shared part of a [`RetryBudget`].
struct Inner {
    /// Balance and last refill tick, packed by [`pack`].
    state: AtomicU64,
    /// Tick zero: the instant the budget was created.
    epoch: Instant,
    /// Units added by one deposit: the ratio in thousandths, rounded down.
    deposit_units: u64,
    /// Units added per elapsed millisecond: `min_per_sec` itself.
    refill_per_ms: u64,
    /// Most units the bucket may hold: `max_tokens * 1000`.
    cap_units: u64,
}

impl Inner {
    /// The state `state` becomes once refilled up to tick `now` (already
    /// masked). A tick that is not ahead of the stored one credits nothing and
    /// leaves the state as it is.
    fn refilled(&self, state: u64, now: u64) -> u64 {
        let elapsed = now.wrapping_sub(tick_of(state)) & TICK_MASK;
        if elapsed == 0 || elapsed >= TICK_HALF_RANGE {
            return state;
        }
        let credit = elapsed.saturating_mul(self.refill_per_ms);
        let balance = balance_of(state).saturating_add(credit).min(self.cap_units);
        pack(balance, now)
    }
}

impl RetryBudget {
    /// Creates a budget that allows `ratio` retries per request (deposit),
    /// plus `min_per_sec` retries per second, with at most `max_tokens`
    /// retries saved up. The bucket starts full.
    ///
    /// `ratio` is counted in thousandths of a token: it is rounded down to a
    /// multiple of 0.001 (a value that is such a multiple up to floating-point
    /// error, like 0.57, counts as that multiple).
    ///
    /// # Panics
    ///
    /// Panics if [`RetryBudget::try_new`] would refuse the values: if `ratio`
    /// is NaN, infinite, negative, positive but below 0.001, or above 1000, or
    /// if `max_tokens` is 0 or above 67 108. The panic message is the
    /// [`InvalidConfig`] error's, naming the value at fault.
    ///
    /// # Example
    ///
    /// ```
    #[doc = concat!("use ", env!("CARGO_CRATE_NAME"), "::RetryBudget;")]
    ///
    /// let budget = RetryBudget::new(0.1, 10, 100);
    /// assert_eq!(budget.tokens(), 100.0);
    /// ```
    #[must_use]
    #[track_caller]
    pub fn new(ratio: f64, min_per_sec: u32, max_tokens: u32) -> RetryBudget {
        match RetryBudget::try_new(ratio, min_per_sec, max_tokens) {
            Ok(budget) => budget,
            Err(error) => panic!("{error}"),
        }
    }

    /// Creates a budget like [`RetryBudget::new`], or says which value is
    /// invalid and why.
    ///
    /// # Errors
    ///
    /// Returns [`InvalidConfig`] if `ratio` is NaN or infinite, negative,
    /// positive but below 0.001 (the budget counts thousandths of a token; use
    /// 0 for no deposits), or above 1000; or if `max_tokens` is 0, or above
    /// 67 108 (the most the budget's 26-bit balance of thousandths can hold).
    /// Every `min_per_sec` is valid, including 0 (no refill over time).
    ///
    /// # Example
    ///
    /// ```
    #[doc = concat!("use ", env!("CARGO_CRATE_NAME"), "::RetryBudget;")]
    ///
    /// let error = RetryBudget::try_new(f64::NAN, 10, 100).unwrap_err();
    /// assert!(error.to_string().contains("ratio is NaN"));
    /// assert!(RetryBudget::try_new(0.2, 0, 10).is_ok());
    /// ```
    pub fn try_new(
        ratio: f64,
        min_per_sec: u32,
        max_tokens: u32,
    ) -> Result<RetryBudget, InvalidConfig> {
        let deposit_units = deposit_units(ratio)?;
        if max_tokens == 0 {
            return Err(InvalidBudget {
                kind: Invalid::ZeroMaxTokens,
            }
            .into());
        }
        if max_tokens > MAX_TOKENS {
            return Err(InvalidBudget {
                kind: Invalid::MaxTokensTooLarge(max_tokens),
            }
            .into());
        }
        Ok(RetryBudget::with_start_tick(
            deposit_units,
            min_per_sec,
            max_tokens,
            0,
        ))
    }

    /// Builds a full budget from validated values, its state stamped with
    /// `start_tick` (0 outside tests).
    fn with_start_tick(
        deposit_units: u64,
        min_per_sec: u32,
        max_tokens: u32,
        start_tick: u64,
    ) -> RetryBudget {
        let cap_units = u64::from(max_tokens) * UNITS_PER_TOKEN;
        RetryBudget {
            inner: Arc::new(Inner {
                state: AtomicU64::new(pack(cap_units, start_tick)),
                epoch: Instant::now(),
                deposit_units,
                refill_per_ms: u64::from(min_per_sec),
                cap_units,
            }),
        }
    }

    /// Records the start of a logical request: adds `ratio` tokens to the
    /// bucket, up to `max_tokens`.
    ///
    /// Call it once per request, not once per attempt. It never blocks and
    /// never allocates.
    pub fn deposit(&self) {
        self.add_deposit();
    }

    /// Asks for one retry: takes one token and returns `true` if the bucket
    /// holds at least one, or returns `false` and takes nothing.
    ///
    /// Call it before each retry (not before the first attempt), and do not
    /// retry when it returns `false`. It never blocks and never allocates.
    #[must_use = "a refused withdrawal means the retry must not be sent"]
    pub fn withdraw(&self) -> bool {
        self.withdraw_at(self.now_tick())
    }

    /// The current balance in tokens, including the refill earned so far, to
    /// a thousandth of a token.
    ///
    /// This is a snapshot for metrics and tests: other clones may change the
    /// balance before the caller looks at it, so do not use it to decide
    /// whether to retry (use [`RetryBudget::withdraw`]). It does not change
    /// the bucket.
    #[must_use]
    pub fn tokens(&self) -> f64 {
        self.units_at(self.now_tick()) as f64 / UNITS_PER_TOKEN as f64
    }

    /// The current tick: whole milliseconds since the epoch, modulo `2^38`.
    fn now_tick(&self) -> u64 {
        let elapsed = Instant::now().saturating_duration_since(self.inner.epoch);
        elapsed
            .as_secs()
            .wrapping_mul(1_000)
            .wrapping_add(u64::from(elapsed.subsec_millis()))
            & TICK_MASK
    }

    /// The deposit itself: adds `ratio` tokens, up to the cap, without reading the clock
    /// and without moving the stored tick.
    ///
    /// Refill is credited by the next withdrawal instead (which reads the clock and
    /// moves the tick). That keeps the bound: deposits still add at most `ratio` each,
    /// refill still adds at most `min_per_sec` per elapsed second, and the balance is
    /// still capped; a deposit made while earned refill is not yet credited can only be
    /// capped sooner, never later. It halves the clock reads of a deposit/withdraw pair,
    /// and a request that never retries reads no clock at all.
    fn add_deposit(&self) {
        let state = &self.inner.state;
        let mut current = state.load(Ordering::Relaxed);
        loop {
            let balance =
                (balance_of(current) + self.inner.deposit_units).min(self.inner.cap_units);
            let next = pack(balance, tick_of(current));
            if next == current {
                // Full already: nothing to write.
                return;
            }
            match state.compare_exchange_weak(current, next, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return,
                Err(actual) => current = actual,
            }
        }
    }

    /// [`RetryBudget::withdraw`] at an explicit tick (taken modulo `2^38`).
    pub(crate) fn withdraw_at(&self, now_ms: u64) -> bool {
        let now = now_ms & TICK_MASK;
        let state = &self.inner.state;
        let mut current = state.load(Ordering::Relaxed);
        loop {
            let refilled = self.inner.refilled(current, now);
            if balance_of(refilled) < UNITS_PER_TOKEN {
                // Refused. Nothing is stored: the balance is below one token,
                // so far below the cap, and the next call will credit the same
                // elapsed time from the same stored tick.
                return false;
            }
            let next = refilled - (UNITS_PER_TOKEN << TICK_BITS);
            match state.compare_exchange_weak(current, next, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return true,
                Err(actual) => current = actual,
            }
        }
    }

    /// The balance in units as of an explicit tick (taken modulo `2^38`),
    /// without changing the bucket.
    pub(crate) fn units_at(&self, now_ms: u64) -> u64 {
        let current = self.inner.state.load(Ordering::Relaxed);
        balance_of(self.inner.refilled(current, now_ms & TICK_MASK))
    }
}

impl Default for RetryBudget {
    /// A budget of 10% of requests (`ratio` 0.1), plus 10 retries per second,
    /// with at most 100 retries saved up.
    fn default() -> Self {
        RetryBudget::new(0.1, 10, 100)
    }
}

impl fmt::Debug for RetryBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = &self.inner;
        f.debug_struct("RetryBudget")
            .field(
                "ratio",
                &(inner.deposit_units as f64 / UNITS_PER_TOKEN as f64),
            )
            .field("min_per_sec", &inner.refill_per_ms)
            .field("max_tokens", &(inner.cap_units / UNITS_PER_TOKEN))
            .field("tokens", &self.tokens())
            .finish()
    }
}

impl tower::retry::budget::Budget for RetryBudget {
    fn deposit(&self) {
        RetryBudget::deposit(self);
    }

    fn withdraw(&self) -> bool {
        RetryBudget::withdraw(self)
    }
}

/// Converts a ratio to the units one deposit adds, or says why it is invalid.
fn deposit_units(ratio: f64) -> Result<u64, InvalidBudget> {
    let refuse = |kind| Err(InvalidBudget { kind });
    if !ratio.is_finite() {
        return refuse(Invalid::RatioNotFinite(ratio));
    }
    if ratio < 0.0 {
        return refuse(Invalid::RatioNegative(ratio));
    }
    if ratio > MAX_RATIO {
        return refuse(Invalid::RatioTooLarge(ratio));
    }
    let scaled = ratio * UNITS_PER_TOKEN as f64;
    let nearest = scaled.round();
    // A decimal such as 1.001 is stored a hair below itself, and scaling it
    // gives 1000.9999999999999: take such floating-point noise as the
    // thousandth that was meant, and round anything else down.
    let units = if (scaled - nearest).abs() <= 4.0 * f64::EPSILON * nearest.max(1.0) {
        nearest
    } else {
        scaled.floor()
    };
    if units == 0.0 && ratio > 0.0 {
        return refuse(Invalid::RatioTooSmall(ratio));
    }
    // In range: 0 <= units <= 1_000_000.
    Ok(units as u64)
}

/// The error returned by [`RetryBudget::try_new`] for a value the budget
/// cannot use. Its [`Display`](fmt::Display) names the value and says what
/// would be accepted.
///
/// # Example
///
/// ```
#[doc = concat!("use ", env!("CARGO_CRATE_NAME"), "::RetryBudget;")]
///
/// let error = RetryBudget::try_new(0.1, 10, 0).unwrap_err();
/// assert_eq!(
///     error.to_string(),
///     "invalid retry budget: max_tokens is 0; it must be at least 1",
/// );
/// ```
#[derive(Clone, Debug)]
struct InvalidBudget {
    kind: Invalid,
}

impl From<InvalidBudget> for InvalidConfig {
    fn from(error: InvalidBudget) -> Self {
        // The message without the prefix `InvalidConfig` writes for a budget.
        let text = error.to_string();
        let message = text.strip_prefix("invalid retry budget: ").unwrap_or(&text);
        InvalidConfig::new(ConfigKind::Budget, message)
    }
}

/// Which value was invalid, and the value itself.
#[derive(Clone, Debug)]
enum Invalid {
    RatioNotFinite(f64),
    RatioNegative(f64),
    RatioTooSmall(f64),
    RatioTooLarge(f64),
    ZeroMaxTokens,
    MaxTokensTooLarge(u32),
}

impl fmt::Display for InvalidBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("invalid retry budget: ")?;
        match self.kind {
            Invalid::RatioNotFinite(ratio) => write!(
                f,
                "ratio is {ratio}; it must be a finite number from 0 to {MAX_RATIO}"
            ),
            Invalid::RatioNegative(ratio) => {
                write!(f, "ratio is {ratio}; it must not be negative")
            }
            Invalid::RatioTooSmall(ratio) => write!(
                f,
                "ratio is {ratio}; a positive ratio must be at least 0.001, since the budget \
                 counts thousandths of a token (use 0 for no deposits)"
            ),
            Invalid::RatioTooLarge(ratio) => {
                write!(f, "ratio is {ratio}; it must be at most {MAX_RATIO}")
            }
            Invalid::ZeroMaxTokens => f.write_str("max_tokens is 0; it must be at least 1"),
            Invalid::MaxTokensTooLarge(max_tokens) => write!(
                f,
                "max_tokens is {max_tokens}; it must be at most {MAX_TOKENS}, the most whole \
                 tokens the budget's {BALANCE_BITS}-bit balance of thousandths can hold"
            ),
        }
    }
}

#[cfg(all(test, not(tower_http_retry_loom)))]
mod tests {
    use super::*;

    use std::sync::atomic::AtomicUsize;
    use std::time::Duration;

    use proptest::prelude::*;

    /// The stored (not refilled) balance and tick.
    fn raw(budget: &RetryBudget) -> (u64, u64) {
        let state = budget.inner.state.load(Ordering::Relaxed);
        (balance_of(state), tick_of(state))
    }

    /// Withdraws at `now` until refused; returns how many were granted.
    fn drain_at(budget: &RetryBudget, now: u64) -> u64 {
        let mut granted = 0;
        while budget.withdraw_at(now) {
            granted += 1;
            assert!(
                granted <= u64::from(MAX_TOKENS),
                "more grants than any bucket holds"
            );
        }
        granted
    }

    fn message(ratio: f64, min_per_sec: u32, max_tokens: u32) -> String {
        RetryBudget::try_new(ratio, min_per_sec, max_tokens)
            .expect_err("these values must be refused")
            .to_string()
    }

    #[test]
    fn starts_full_and_refuses_the_withdrawal_after_the_last_token() {
        let budget = RetryBudget::new(0.1, 10, 5);
        for i in 0..5 {
            assert!(budget.withdraw_at(0), "withdrawal {i} of 5 was refused");
        }
        assert!(!budget.withdraw_at(0), "the 6th withdrawal was granted");
        assert_eq!(raw(&budget), (0, 0));
    }

    #[test]
    fn the_default_is_ratio_0_1_ten_per_second_and_100_tokens() {
        let budget = RetryBudget::default();
        assert_eq!(budget.inner.deposit_units, 100);
        assert_eq!(budget.inner.refill_per_ms, 10);
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
        let budget = RetryBudget::new(0.25, 0, 5);
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
        let budget = RetryBudget::new(0.999, 1, 2);
        assert_eq!(drain_at(&budget, 0), 2);
        budget.deposit();
        assert_eq!(budget.units_at(0), 999);
        assert!(!budget.withdraw_at(0), "granted with 0.999 tokens");
        // 1 token/s is one thousandth per millisecond.
        assert!(budget.withdraw_at(1), "refused with 1.000 tokens");
        assert_eq!(raw(&budget), (0, 1));
    }

    #[test]
    fn deposits_never_fill_past_max_tokens() {
        let budget = RetryBudget::new(0.5, 0, 3);
        for _ in 0..10 {
            budget.deposit();
        }
        assert_eq!(raw(&budget), (3_000, 0));
        assert_eq!(drain_at(&budget, 0), 3);
    }

    #[test]
    fn refill_earns_min_per_sec_per_second_from_explicit_ticks() {
        let budget = RetryBudget::new(0.0, 10, 5);
        assert_eq!(drain_at(&budget, 0), 5);
        // 10 tokens/s is 10 units per millisecond: a token every 100 ms.
        assert!(!budget.withdraw_at(99), "granted after 99 ms (0.99 tokens)");
        assert_eq!(raw(&budget), (0, 0), "a refused withdrawal wrote the state");
        assert!(budget.withdraw_at(100), "refused after 100 ms (1 token)");
        assert_eq!(raw(&budget), (0, 100));
        assert!(!budget.withdraw_at(100));
        assert_eq!(budget.units_at(250), 1_500);
    }

    #[test]
    fn refill_stops_at_max_tokens_and_time_spent_full_is_not_banked() {
        let budget = RetryBudget::new(0.0, 10, 2);
        assert_eq!(drain_at(&budget, 0), 2);
        assert_eq!(budget.units_at(3_600_000), 2_000);
        assert_eq!(drain_at(&budget, 3_600_000), 2);
        assert_eq!(budget.units_at(3_600_099), 990);
    }

    #[tokio::test(start_paused = true)]
    async fn refill_follows_the_paused_tokio_clock() {
        let budget = RetryBudget::new(0.0, 10, 3);
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
    fn an_older_tick_credits_nothing_and_does_not_move_the_clock_back() {
        let budget = RetryBudget::new(0.0, 10, 5);
        assert_eq!(drain_at(&budget, 0), 5);
        // 150 ms at 10 tokens/s: 1.5 tokens, one taken.
        assert!(budget.withdraw_at(150));
        assert_eq!(raw(&budget), (500, 150));
        // A caller that read the clock before the call above was stored.
        assert!(!budget.withdraw_at(140));
        assert_eq!(raw(&budget), (500, 150));
        // 10 ms after the stored tick, not 20 ms after the older one.
        assert_eq!(budget.units_at(160), 600);
    }

    #[test]
    fn elapsed_time_is_measured_across_the_wrap_of_the_tick() {
        let start = TICK_MASK - 4;
        let budget = RetryBudget::with_start_tick(0, 10, 5, start);
        assert_eq!(drain_at(&budget, start), 5);
        // 100 ms later, past the wrap: 1 token.
        let later = start + 100;
        assert!(later > TICK_MASK);
        assert!(budget.withdraw_at(later));
        assert_eq!(raw(&budget), (0, 95));
        assert!(!budget.withdraw_at(later));
    }

    #[test]
    fn an_idle_gap_of_half_the_tick_range_reads_as_an_older_tick() {
        let budget = RetryBudget::new(0.0, 10, 5);
        assert_eq!(drain_at(&budget, 0), 5);
        assert_eq!(budget.units_at(TICK_HALF_RANGE - 1), 5_000);
        assert_eq!(budget.units_at(TICK_HALF_RANGE), 0);
        assert_eq!(budget.units_at(TICK_MASK), 0);
    }

    #[test]
    fn the_largest_values_neither_overflow_nor_exceed_the_cap() {
        let budget = RetryBudget::new(MAX_RATIO, u32::MAX, MAX_TOKENS);
        assert_eq!(MAX_TOKENS, 67_108);
        assert_eq!(budget.inner.cap_units, 67_108_000);
        assert!(budget.inner.cap_units <= MAX_BALANCE_UNITS);
        assert!(budget.withdraw_at(0));
        budget.deposit();
        assert_eq!(raw(&budget), (67_108_000, 0));
        assert_eq!(budget.units_at(TICK_HALF_RANGE - 1), 67_108_000);
        assert_eq!(drain_at(&budget, 0), u64::from(MAX_TOKENS));
        budget.deposit();
        assert_eq!(raw(&budget), (1_000_000, 0));
    }

    #[test]
    fn try_new_refuses_a_nan_ratio() {
        assert_eq!(
            message(f64::NAN, 10, 100),
            "invalid retry budget: ratio is NaN; it must be a finite number from 0 to 1000"
        );
    }

    #[test]
    fn try_new_refuses_an_infinite_ratio() {
        assert_eq!(
            message(f64::INFINITY, 10, 100),
            "invalid retry budget: ratio is inf; it must be a finite number from 0 to 1000"
        );
        assert!(
            message(f64::NEG_INFINITY, 10, 100)
                .contains("ratio is -inf; it must be a finite number")
        );
    }

    #[test]
    fn try_new_refuses_a_negative_ratio() {
        assert_eq!(
            message(-0.5, 10, 100),
            "invalid retry budget: ratio is -0.5; it must not be negative"
        );
    }

    #[test]
    fn try_new_refuses_a_ratio_too_small_to_count() {
        let text = message(0.0004, 10, 100);
        assert!(
            text.starts_with("invalid retry budget: ratio is 0.0004; "),
            "{text}"
        );
        assert!(text.contains("at least 0.001"), "{text}");
        // Zero is not "too small": it means no deposits.
        assert!(RetryBudget::try_new(0.0, 10, 100).is_ok());
        assert!(RetryBudget::try_new(0.001, 10, 100).is_ok());
    }

    #[test]
    fn try_new_refuses_a_ratio_too_large() {
        assert_eq!(
            message(1_000.5, 10, 100),
            "invalid retry budget: ratio is 1000.5; it must be at most 1000"
        );
        assert!(RetryBudget::try_new(1_000.0, 10, 100).is_ok());
    }

    #[test]
    fn try_new_refuses_zero_max_tokens() {
        assert_eq!(
            message(0.1, 10, 0),
            "invalid retry budget: max_tokens is 0; it must be at least 1"
        );
    }

    #[test]
    fn try_new_refuses_max_tokens_too_large() {
        let text = message(0.1, 10, 67_109);
        assert!(
            text.starts_with("invalid retry budget: max_tokens is 67109; it must be at most 67108"),
            "{text}"
        );
        assert!(message(0.1, 10, u32::MAX).contains("max_tokens is 4294967295"));
        assert!(RetryBudget::try_new(0.1, 10, 67_108).is_ok());
    }

    #[test]
    #[should_panic(expected = "invalid retry budget: max_tokens is 0")]
    fn new_panics_with_the_error_message() {
        let _ = RetryBudget::new(0.1, 10, 0);
    }

    #[test]
    fn ratios_count_as_the_thousandths_they_were_written_as() {
        for k in 0..=1_000_000_u64 {
            let ratio = k as f64 / 1_000.0;
            assert_eq!(deposit_units(ratio).unwrap(), k, "ratio {ratio}");
        }
        assert_eq!(deposit_units(0.57).unwrap(), 570);
        assert_eq!(deposit_units(1.001).unwrap(), 1_001);
        assert_eq!(deposit_units(0.0015).unwrap(), 1);
        assert_eq!(deposit_units(0.1239).unwrap(), 123);
        assert_eq!(deposit_units(1.0 / 3.0).unwrap(), 333);
    }

    #[test]
    fn clones_share_one_bucket() {
        let first = RetryBudget::new(1.0, 0, 2);
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
        let budget = RetryBudget::new(0.5, 0, 1);
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
        let budget = RetryBudget::new(0.25, 7, 3);
        assert_eq!(
            format!("{budget:?}"),
            "RetryBudget { ratio: 0.25, min_per_sec: 7, max_tokens: 3, tokens: 3.0 }"
        );
    }

    const THREADS: usize = 4;

    /// Runs `step(thread, i, budget)` on `THREADS` threads started together,
    /// each with its own clone of `budget`, and returns the total (grants, deposits) the steps
    /// report. Every thread keeps stepping until every thread has done at
    /// least `min_steps` (so they overlap however the threads are
    /// scheduled), and none does more than `20 * min_steps`. After each step
    /// the thread checks that the stored balance is within the cap.
    fn race(
        budget: &RetryBudget,
        min_steps: u64,
        step: impl Fn(usize, u64, &RetryBudget) -> (bool, bool) + Sync,
    ) -> (u64, u64) {
        let ready = AtomicUsize::new(0);
        let done = AtomicUsize::new(0);
        std::thread::scope(|scope| {
            let handles: Vec<_> = (0..THREADS)
                .map(|index| {
                    let budget = budget.clone();
                    let (ready, done, step) = (&ready, &done, &step);
                    scope.spawn(move || {
                        let (mut grants, mut deposits) = (0, 0);
                        // Spin rather than block, so that the threads that
                        // are running when the last one arrives start at once.
                        ready.fetch_add(1, Ordering::Relaxed);
                        while ready.load(Ordering::Relaxed) < THREADS {
                            std::hint::spin_loop();
                        }
                        for i in 0..20 * min_steps {
                            let (granted, deposited) = step(index, i, &budget);
                            grants += u64::from(granted);
                            deposits += u64::from(deposited);
                            let (balance, _) = raw(&budget);
                            assert!(balance <= budget.inner.cap_units, "balance {balance}");
                            if i + 1 == min_steps {
                                done.fetch_add(1, Ordering::Relaxed);
                            }
                            if i + 1 >= min_steps && done.load(Ordering::Relaxed) == THREADS {
                                break;
                            }
                        }
                        (grants, deposits)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|handle| handle.join().expect("a racing thread panicked"))
                .fold((0, 0), |(g, d), (g2, d2)| (g + g2, d + d2))
        })
    }

    /// Each racing test runs this many independent races: whether threads
    /// really run at the same time depends on what else the machine is
    /// doing, so one race may see little contention.
    const ROUNDS: usize = 10;

    #[test]
    fn racing_withdrawals_grant_exactly_the_tokens_held() {
        for round in 0..ROUNDS {
            // The largest bucket, so that the threads contend for long.
            // Refill would be fast, but the tick never moves.
            let budget = RetryBudget::new(0.0, 1_000, MAX_TOKENS);
            let (grants, _) = race(&budget, 20_000, |_, _, budget| {
                (budget.withdraw_at(0), false)
            });
            assert_eq!(grants, u64::from(MAX_TOKENS), "round {round}");
            assert_eq!(raw(&budget), (0, 0), "round {round}");
        }
    }

    #[test]
    fn racing_deposits_and_withdrawals_lose_nothing_below_the_cap() {
        for round in 0..ROUNDS {
            // At most 4 * 20 * 20_000 deposits of 0.01 token: 16_000 tokens,
            // so the cap of 20_000 is never reached and every deposit must be
            // found in the final balance or in a grant.
            let budget = RetryBudget::new(0.01, 1_000, 20_000);
            assert_eq!(drain_at(&budget, 0), 20_000);
            let (grants, deposits) = race(&budget, 20_000, |index, i, budget| {
                budget.deposit();
                let granted = (i + index as u64) & 3 != 0 && budget.withdraw_at(0);
                (granted, true)
            });
            assert!(deposits >= 80_000);
            assert!(grants > 0);
            let (balance, tick) = raw(&budget);
            assert_eq!(tick, 0);
            assert_eq!(
                balance + grants * 1_000,
                deposits * 10,
                "round {round}: {grants} grants and {balance} units left from {deposits} deposits"
            );
        }
    }

    #[test]
    fn racing_near_empty_never_grants_more_than_the_bound() {
        for round in 0..ROUNDS {
            // One token per deposit and as many withdrawals as deposits: the
            // balance stays near zero, where an overdraw would show.
            let budget = RetryBudget::new(1.0, 1_000, 5);
            let (grants, deposits) = race(&budget, 20_000, |index, i, budget| {
                if (i + index as u64) & 1 == 0 {
                    budget.deposit();
                    (false, true)
                } else {
                    (budget.withdraw_at(0), false)
                }
            });
            let (balance, _) = raw(&budget);
            assert!(
                balance + grants * 1_000 <= 5_000 + deposits * 1_000,
                "round {round}: {grants} grants and {balance} units left from 5 tokens and \
                 {deposits} deposits"
            );
        }
    }

    /// One step of a scripted run.
    #[derive(Clone, Debug)]
    enum Step {
        Deposit,
        Withdraw,
        Advance(u64),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            3 => Just(Step::Deposit),
            4 => Just(Step::Withdraw),
            2 => (0_u64..=300).prop_map(Step::Advance),
            1 => (1_000_u64..=20_000).prop_map(Step::Advance),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// Drives the explicit-tick API with a random script and checks it
        /// against a plain sequential model and against the bound, for
        /// every window of the script, in exact integer units.
        #[test]
        fn scripted_runs_match_the_model_and_never_exceed_the_bound(
            ratio_units in prop_oneof![0_u64..=2_000, Just(999), Just(1_000), Just(1_001)],
            min_per_sec in 0_u32..=50,
            max_tokens in 1_u32..=20,
            start in prop_oneof![Just(0_u64), (TICK_MASK - 30_000)..=TICK_MASK, 0..=TICK_MASK],
            steps in proptest::collection::vec(step(), 0..200),
        ) {
            let ratio = ratio_units as f64 / 1_000.0;
            let units = deposit_units(ratio).unwrap();
            prop_assert_eq!(units, ratio_units);
            let budget = RetryBudget::with_start_tick(units, min_per_sec, max_tokens, start);
            let (m, cap) = (u64::from(min_per_sec), u64::from(max_tokens) * 1_000);

            // Sequential model, on unwrapped time.
            let (mut model_balance, mut model_tick) = (cap, start);
            let mut now = start;
            // After each step: (grants so far, deposits so far, time).
            let mut history = vec![(0_u64, 0_u64, now)];
            let (mut grants, mut deposits) = (0, 0);
            for step in &steps {
                match step {
                    Step::Advance(ms) => now += ms,
                    Step::Deposit => {
                        // The shipped deposit: no clock, the refill is left to the next
                        // withdrawal.
                        budget.deposit();
                        model_balance = (model_balance + units).min(cap);
                        deposits += 1;
                    }
                    Step::Withdraw => {
                        let granted = budget.withdraw_at(now);
                        let refilled = (model_balance + m * (now - model_tick)).min(cap);
                        let expected = refilled >= 1_000;
                        if expected {
                            model_balance = refilled - 1_000;
                            model_tick = now;
                        }
                        // A refusal stores nothing.
                        prop_assert_eq!(granted, expected);
                        grants += u64::from(granted);
                    }
                }
                let (stored, _) = raw(&budget);
                prop_assert!(stored <= cap, "stored balance {} above the cap {}", stored, cap);
                let seen = budget.units_at(now);
                prop_assert!(seen <= cap);
                prop_assert_eq!(seen, (model_balance + m * (now - model_tick)).min(cap));
                history.push((grants, deposits, now));
            }
            for (i, &(g0, d0, t0)) in history.iter().enumerate() {
                for &(g1, d1, t1) in &history[i..] {
                    prop_assert!(
                        (g1 - g0) * 1_000 <= cap + units * (d1 - d0) + m * (t1 - t0),
                        "{} grants in {} ms with {} deposits", g1 - g0, t1 - t0, d1 - d0
                    );
                }
            }
        }
    }
}

/// Loom models of the budget: every interleaving of a few threads depositing and
/// withdrawing at fixed ticks, on loom's atomics. Run with
/// `RUSTFLAGS="--cfg tower_http_retry_loom" cargo test --release --lib budget::loom_models`.
#[cfg(all(test, tower_http_retry_loom))]
mod loom_models {
    use super::RetryBudget;

    use ::loom::thread;

    /// Runs `work` on a new loom thread with its own clone of `budget`.
    fn spawn<T: 'static>(
        budget: &RetryBudget,
        work: impl FnOnce(&RetryBudget) -> T + 'static,
    ) -> thread::JoinHandle<T> {
        let budget = budget.clone();
        thread::spawn(move || work(&budget))
    }

    /// Three threads race for two tokens: exactly two win, and the bucket ends
    /// empty, never overdrawn.
    #[test]
    fn racing_withdrawals_take_each_token_exactly_once() {
        ::loom::model(|| {
            let budget = RetryBudget::new(0.0, 0, 2);
            let first = spawn(&budget, |budget| budget.withdraw_at(0));
            let second = spawn(&budget, |budget| budget.withdraw_at(0));
            let third = budget.withdraw_at(0);
            let grants = [first.join().unwrap(), second.join().unwrap(), third]
                .into_iter()
                .filter(|&granted| granted)
                .count();
            assert_eq!(grants, 2);
            assert_eq!(budget.units_at(0), 0);
        });
    }

    /// Preemption bound for the three-thread model with two calls per thread:
    /// exploring it without a bound takes about ten minutes; with this bound a
    /// few seconds. `LOOM_MAX_PREEMPTIONS` overrides it.
    const PREEMPTION_BOUND: usize = 5;

    /// Empties a budget of `max_tokens` tokens at tick 0.
    fn drain(budget: &RetryBudget, max_tokens: u32) {
        for _ in 0..max_tokens {
            assert!(budget.withdraw_at(0));
        }
        assert!(!budget.withdraw_at(0));
        assert_eq!(budget.units_at(0), 0);
    }

    /// Two threads deposit (the layer's clock-free deposit) and withdraw at
    /// different, out-of-order ticks on an emptied bucket that never reaches
    /// its cap; every interleaving is explored. Nothing is overdrawn, no
    /// deposit is lost, and the 3 ms of refill are credited exactly once: the
    /// final balance is start + deposits + refill - grants.
    #[test]
    fn two_threads_lose_no_deposit_and_count_time_once() {
        ::loom::model(|| {
            // 0.5 tokens per deposit, 1 token/s = 1 thousandth per ms, cap 10.
            let budget = RetryBudget::new(0.5, 1, 10);
            drain(&budget, 10);
            let other = spawn(&budget, |budget| {
                budget.add_deposit();
                budget.withdraw_at(2)
            });
            budget.add_deposit();
            let mine = budget.withdraw_at(3);
            let grants = u64::from(other.join().unwrap()) + u64::from(mine);

            // 2 deposits of 500 and 3 ms at 1 per ms: 1_003 thousandths in all,
            // enough for one retry and not for two.
            assert!(grants <= 1, "overdrawn: {grants} grants from 1.003 tokens");
            assert_eq!(
                budget.units_at(3) + grants * 1_000,
                1_003,
                "a deposit or some refill was lost, or time was counted twice"
            );
        });
    }

    /// The same with three threads, explored up to [`PREEMPTION_BOUND`]
    /// preemptions.
    #[test]
    fn three_threads_lose_no_deposit_and_count_time_once() {
        let mut builder = ::loom::model::Builder::new();
        if builder.preemption_bound.is_none() {
            builder.preemption_bound = Some(PREEMPTION_BOUND);
        }
        builder.check(|| {
            let budget = RetryBudget::new(0.5, 1, 10);
            drain(&budget, 10);
            let first = spawn(&budget, |budget| {
                budget.add_deposit();
                budget.withdraw_at(2)
            });
            let second = spawn(&budget, |budget| {
                budget.add_deposit();
                budget.withdraw_at(3)
            });
            budget.add_deposit();
            let third = budget.withdraw_at(1);
            let grants = [first.join().unwrap(), second.join().unwrap(), third]
                .into_iter()
                .map(u64::from)
                .sum::<u64>();

            // 3 deposits of 500 and 3 ms at 1 per ms: 1_503 thousandths in all.
            assert!(grants <= 1, "overdrawn: {grants} grants from 1.503 tokens");
            assert_eq!(
                budget.units_at(3) + grants * 1_000,
                1_503,
                "a deposit or some refill was lost, or time was counted twice"
            );
        });
    }

    /// At the cap, a deposit and two withdrawals race on a one-token bucket. The
    /// only results a sequential order could give are allowed: the deposit is
    /// clipped if it comes first, kept otherwise.
    #[test]
    fn racing_at_the_cap_matches_some_sequential_order() {
        ::loom::model(|| {
            let budget = RetryBudget::new(1.0, 0, 1);
            let depositor = spawn(&budget, |budget| budget.add_deposit());
            let first = budget.withdraw_at(0);
            let second = budget.withdraw_at(0);
            depositor.join().unwrap();
            let grants = u64::from(first) + u64::from(second);
            let left = budget.units_at(0);
            assert!(
                matches!((grants, left), (2, 0) | (1, 1_000) | (1, 0)),
                "no sequential order gives {grants} grants and {left} thousandths left"
            );
            // The first withdrawal always finds the starting token or the deposit.
            assert!(first);
        });
    }

    /// Two deposits race with a withdrawal on a full one-token bucket: the
    /// balance never rises above the cap, and the withdrawal always finds a
    /// token.
    #[test]
    fn racing_deposits_never_fill_past_the_cap() {
        ::loom::model(|| {
            let budget = RetryBudget::new(1.0, 0, 1);
            let first = spawn(&budget, |budget| budget.add_deposit());
            let second = spawn(&budget, |budget| budget.add_deposit());
            let granted = budget.withdraw_at(0);
            first.join().unwrap();
            second.join().unwrap();
            assert!(granted);
            let left = budget.units_at(0);
            // Both deposits before the withdrawal: both clipped, nothing left.
            // Otherwise the bucket ends full, and never fuller.
            assert!(
                left == 0 || left == 1_000,
                "{left} thousandths left in a one-token bucket"
            );
        });
    }
}
