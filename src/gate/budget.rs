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
// [`RetryLayer`](crate::RetryLayer) does both calls itself; use them directly
// only to share a budget with retries made elsewhere.
//
// * Call [`RetryBudget::deposit`] once per logical request, when it starts
//   (not once per attempt).
// * Call [`RetryBudget::withdraw`] before each retry (not before the first
//   attempt); if it returns `false`, give up and return the last outcome.
//
// The same two calls are available through tower's
// [`Budget`](tower::retry::budget::Budget) trait, which `RetryBudget`
// implements. Neither blocks nor allocates.
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
// Time comes from [`tokio::time::Instant`], so a test that pauses tokio's
// clock controls the refill.
//
// The bucket itself (its state word, the refill, the loom models) is `gate::bucket`; this is
// the ratio kind over it: a deposit of `ratio` per request, a withdrawal of one token per
// retry, refill of `min_per_sec` per second.

use std::fmt;
use std::sync::Arc;

use super::bucket::{BALANCE_BITS, Bucket, MAX_BALANCE_UNITS, UNITS_PER_TOKEN};
use super::partition::{AuthorityKey, Part, Scoped};
use crate::error::{ConfigKind, InvalidConfig};

/// Largest `max_tokens`: the most whole tokens the bucket's balance can hold.
const MAX_TOKENS: u32 = (MAX_BALANCE_UNITS / UNITS_PER_TOKEN) as u32;
/// Largest ratio accepted (a thousand retries per request is no limit at all).
const MAX_RATIO: f64 = 1_000.0;

/// A retry budget: a token bucket shared by all the requests of a client,
/// which grants a retry only while it holds at least one token.
///
/// * Every logical request [deposits](Self::deposit) `ratio` tokens when it
///   starts.
/// * The bucket also refills by `min_per_sec` tokens per second.
/// * It never holds more than `max_tokens`, and starts full.
/// * Every retry [withdraws](Self::withdraw) one token, or is refused; so does every
///   hedge and every transparent retry.
///
/// It hears requests, not outcomes: every logical request under a policy that has it
/// deposits, [`RetryPolicy::never`](crate::RetryPolicy::never), one-attempt policies and
/// `CONNECT` included (they are the client's traffic too).
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
/// to thousandths; see [`BudgetBuilder::try_build`].
///
/// # Clone
///
/// `RetryBudget` is a cheap handle (a reference-counted pointer): cloning it
/// does not create a new bucket, and every clone draws from and deposits into
/// the same one. Clone it into every service or task that should share the
/// budget; build a new one ([`RetryBudget::builder`]) for an independent
/// budget.
///
/// # Example
///
/// ```
#[doc = concat!("use ", env!("CARGO_CRATE_NAME"), "::RetryBudget;")]
///
/// // 10% of requests, no refill over time (keeping this example independent
/// // of the clock), at most 2 retries saved up.
/// let budget = RetryBudget::builder().ratio(0.1).min_per_sec(0).max_tokens(2).build();
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
    /// The bucket: of every request, or one per authority.
    inner: Scoped<Inner>,
}

/// The shared part of a [`RetryBudget`].
struct Inner {
    bucket: Bucket,
    /// Units added by one deposit: the ratio in thousandths, rounded down.
    deposit_units: u64,
}

impl RetryBudget {
    /// A builder of a budget, from the defaults: `ratio` 0.1, `min_per_sec` 10,
    /// `max_tokens` 100. Every setting is named, so none can be swapped for another.
    ///
    /// ```
    #[doc = concat!("use ", env!("CARGO_CRATE_NAME"), "::RetryBudget;")]
    ///
    /// let budget = RetryBudget::builder().ratio(0.2).min_per_sec(5).max_tokens(50).build();
    /// assert_eq!(budget.tokens(), 50.0);
    /// ```
    pub fn builder() -> BudgetBuilder {
        BudgetBuilder {
            ratio: 0.1,
            min_per_sec: 10,
            max_tokens: 100,
            authorities: None,
        }
    }

    fn from_bucket(bucket: Bucket, deposit_units: u64, authorities: Option<usize>) -> RetryBudget {
        let inner = Inner {
            bucket,
            deposit_units,
        };
        RetryBudget {
            inner: Scoped::new(inner, authorities),
        }
    }

    /// True when the budget keeps a bucket per authority
    /// ([`BudgetBuilder::per_authority`]).
    ///
    /// ```
    /// use tower_http_retry::RetryBudget;
    ///
    /// assert!(!RetryBudget::default().is_per_authority());
    /// assert!(RetryBudget::builder().per_authority().build().is_per_authority());
    /// ```
    pub fn is_per_authority(&self) -> bool {
        self.inner.is_per_authority()
    }

    /// The budget that requests to `uri`'s authority draw from: for a per-authority budget,
    /// that authority's bucket (made on first sight, from the overflow's balance, full unless authorities failed there; the shared overflow bucket when
    /// the authorities tracked are all in use); the budget itself otherwise, and for a URI
    /// without an authority. The layer finds it this way once per logical request, from
    /// the URI or, in origin form, the `Host` header (whose bucket this cannot name).
    ///
    /// ```
    /// use tower_http_retry::RetryBudget;
    ///
    /// let budget = RetryBudget::builder().min_per_sec(0).max_tokens(2).per_authority().build();
    /// let down = budget.partition(&"http://down.example/".parse().unwrap());
    /// assert!(down.withdraw() && down.withdraw() && !down.withdraw());
    /// // The other server's bucket is untouched.
    /// let up = budget.partition(&"http://up.example/".parse().unwrap());
    /// assert_eq!(up.tokens(), 2.0);
    /// assert_eq!(budget.partition(&"http://DOWN.example:80/x".parse().unwrap()).tokens(), 0.0);
    /// ```
    pub fn partition(&self, uri: &http::Uri) -> RetryBudget {
        self.partition_of(AuthorityKey::of_uri(uri))
    }

    /// The bucket of the authority `key` names (see [`RetryBudget::partition`]).
    pub(crate) fn partition_of(&self, key: Option<AuthorityKey>) -> RetryBudget {
        RetryBudget {
            inner: self.inner.partition_of(key),
        }
    }

    /// How many authorities have a bucket of their own: 0 for a budget not per authority.
    ///
    /// ```
    /// use tower_http_retry::RetryBudget;
    ///
    /// let budget = RetryBudget::builder().per_authority().build();
    /// assert_eq!(budget.authorities(), 0);
    /// let _ = budget.partition(&"http://a.example/".parse().unwrap());
    /// let _ = budget.partition(&"http://b.example/".parse().unwrap());
    /// assert_eq!(budget.authorities(), 2);
    /// ```
    pub fn authorities(&self) -> usize {
        self.inner.authorities()
    }

    /// Records the start of a logical request: adds `ratio` tokens to the
    /// bucket, up to `max_tokens`.
    ///
    /// Call it once per request, not once per attempt. It never blocks and
    /// never allocates.
    ///
    /// ```
    /// use tower_http_retry::RetryBudget;
    ///
    /// // A fifth of a token per request, and no refill over time.
    /// let budget = RetryBudget::builder().ratio(0.2).min_per_sec(0).max_tokens(10).build();
    /// while budget.withdraw() {}
    /// for _ in 0..5 {
    ///     budget.deposit();
    /// }
    /// assert_eq!(budget.tokens(), 1.0); // five requests earn one retry
    /// ```
    pub fn deposit(&self) {
        self.inner.bucket.deposit(self.inner.deposit_units);
    }

    /// Asks for one retry: takes one token and returns `true` if the bucket
    /// holds at least one, or returns `false` and takes nothing.
    ///
    /// Call it before each retry (not before the first attempt), and do not
    /// retry when it returns `false`. It never blocks and never allocates.
    ///
    /// ```
    /// use tower_http_retry::RetryBudget;
    ///
    /// let budget = RetryBudget::builder().min_per_sec(0).max_tokens(1).build();
    /// assert!(budget.withdraw()); // this retry may go
    /// assert!(!budget.withdraw()); // the next may not
    /// ```
    #[must_use = "a refused withdrawal means the retry must not be sent"]
    pub fn withdraw(&self) -> bool {
        self.inner.bucket.withdraw(UNITS_PER_TOKEN)
    }

    /// The current balance in tokens, including the refill earned so far, to
    /// a thousandth of a token.
    ///
    /// This is a snapshot for metrics and tests: other clones may change the
    /// balance before the caller looks at it, so do not use it to decide
    /// whether to retry (use [`RetryBudget::withdraw`]). It does not change
    /// the bucket.
    ///
    /// ```
    /// use tower_http_retry::RetryBudget;
    ///
    /// let budget = RetryBudget::builder().min_per_sec(0).max_tokens(20).build();
    /// assert_eq!(budget.tokens(), 20.0); // a budget starts full
    /// budget.withdraw();
    /// assert_eq!(budget.tokens(), 19.0);
    /// ```
    #[must_use]
    pub fn tokens(&self) -> f64 {
        self.inner.bucket.units() as f64 / UNITS_PER_TOKEN as f64
    }

    #[cfg(all(test, not(tower_http_retry_loom)))]
    fn withdraw_at(&self, now_ms: u64) -> bool {
        self.inner.bucket.withdraw_at(UNITS_PER_TOKEN, now_ms)
    }

    #[cfg(all(test, not(tower_http_retry_loom)))]
    fn units_at(&self, now_ms: u64) -> u64 {
        self.inner.bucket.units_at(now_ms)
    }
}

/// Builds a [`RetryBudget`]: see [`RetryBudget::builder`].
#[derive(Debug, Clone, Copy, PartialEq)]
#[must_use = "a builder does nothing until it is built"]
pub struct BudgetBuilder {
    ratio: f64,
    min_per_sec: u32,
    max_tokens: u32,
    authorities: Option<usize>,
}

impl BudgetBuilder {
    /// One bucket per authority (the request URI's scheme, host and port; the `Host`
    /// header for a request in origin form), each with these settings, so that a server
    /// that fails spends its own retries and not a healthy one's. At most 1 024 authorities
    /// are tracked ([`max_authorities`](Self::max_authorities)); only a bucket back at its
    /// full state and used by no request in flight is forgotten to make room, and when every
    /// one is in use, further authorities share one overflow bucket. Requests with no
    /// authority share the budget's own bucket. Clones share all of them.
    ///
    /// A request to an authority already known takes a read lock on the map, never an
    /// exclusive one.
    ///
    /// ```
    /// use tower_http_retry::RetryBudget;
    ///
    /// let budget = RetryBudget::builder().min_per_sec(0).max_tokens(1).per_authority().build();
    /// let down = budget.partition(&"http://down.example/".parse().unwrap());
    /// assert!(down.withdraw());
    /// // The failing server spent its own token; another server still has one.
    /// assert!(budget.partition(&"http://up.example/".parse().unwrap()).withdraw());
    /// ```
    pub fn per_authority(mut self) -> Self {
        self.authorities
            .get_or_insert(super::partition::DEFAULT_MAX_AUTHORITIES);
        self
    }

    /// One bucket per authority ([`per_authority`](Self::per_authority)), tracking at most
    /// `max` authorities (default 1 024; at least 1).
    ///
    /// ```
    /// use tower_http_retry::RetryBudget;
    ///
    /// // A client of a few servers: track at most 16 of them.
    /// let budget = RetryBudget::builder().max_authorities(16).build();
    /// assert!(budget.is_per_authority());
    /// ```
    pub fn max_authorities(mut self, max: usize) -> Self {
        self.authorities = Some(max);
        self
    }

    /// Tokens every logical request deposits when it starts (default 0.1: retries under
    /// a tenth of the requests). Counted in thousandths of a token: rounded down to a
    /// multiple of 0.001 (a value that is such a multiple up to floating-point error,
    /// like 0.57, counts as that multiple); 0 for no deposits.
    ///
    /// ```
    /// use tower_http_retry::RetryBudget;
    ///
    /// // Retries under a fifth of the requests.
    /// let budget = RetryBudget::builder().ratio(0.2).min_per_sec(0).max_tokens(10).build();
    /// while budget.withdraw() {}
    /// budget.deposit();
    /// assert_eq!(budget.tokens(), 0.2);
    /// ```
    pub fn ratio(mut self, ratio: f64) -> Self {
        self.ratio = ratio;
        self
    }

    /// Tokens the bucket also gains per second, whatever the traffic (default 10), so a
    /// quiet client can still retry; 0 for none.
    ///
    /// ```
    /// use tower_http_retry::RetryBudget;
    ///
    /// // A client sending a request a minute may still retry up to 2 a second.
    /// let budget = RetryBudget::builder().min_per_sec(2).build();
    /// # let _ = budget;
    /// ```
    pub fn min_per_sec(mut self, min_per_sec: u32) -> Self {
        self.min_per_sec = min_per_sec;
        self
    }

    /// The most tokens the bucket holds, and where it starts (default 100).
    ///
    /// ```
    /// use tower_http_retry::RetryBudget;
    ///
    /// // At most 20 retries saved up for a burst of failures.
    /// let budget = RetryBudget::builder().max_tokens(20).build();
    /// assert_eq!(budget.tokens(), 20.0);
    /// ```
    pub fn max_tokens(mut self, max_tokens: u32) -> Self {
        self.max_tokens = max_tokens;
        self
    }

    /// The budget.
    ///
    /// ```
    /// use tower_http_retry::RetryBudget;
    ///
    /// let budget = RetryBudget::builder().ratio(0.1).min_per_sec(10).max_tokens(100).build();
    /// assert_eq!(budget.tokens(), 100.0);
    /// ```
    ///
    /// # Panics
    ///
    /// When [`BudgetBuilder::try_build`] would refuse the settings, with its error's
    /// message naming the value at fault.
    #[must_use]
    #[track_caller]
    pub fn build(self) -> RetryBudget {
        match self.try_build() {
            Ok(budget) => budget,
            Err(error) => panic!("{error}"),
        }
    }

    /// The budget, or which setting is invalid and why.
    ///
    /// # Errors
    ///
    /// [`InvalidConfig`] when the ratio is NaN or infinite, negative, positive but below
    /// 0.001 (the budget counts thousandths of a token; use 0 for no deposits), or above
    /// 1000; or when `max_tokens` is 0, or above 67 108 (the most the budget's 26-bit
    /// balance of thousandths can hold). Every `min_per_sec` is valid.
    ///
    /// ```
    #[doc = concat!("use ", env!("CARGO_CRATE_NAME"), "::RetryBudget;")]
    ///
    /// let error = RetryBudget::builder().ratio(f64::NAN).try_build().unwrap_err();
    /// assert!(error.to_string().contains("ratio is NaN"));
    /// assert!(RetryBudget::builder().ratio(0.2).min_per_sec(0).max_tokens(10).try_build().is_ok());
    /// ```
    pub fn try_build(self) -> Result<RetryBudget, InvalidConfig> {
        let deposit_units = deposit_units(self.ratio)?;
        if self.max_tokens == 0 {
            return Err(InvalidBudget {
                kind: Invalid::ZeroMaxTokens,
            }
            .into());
        }
        if self.max_tokens > MAX_TOKENS {
            return Err(InvalidBudget {
                kind: Invalid::MaxTokensTooLarge(self.max_tokens),
            }
            .into());
        }
        if self.authorities == Some(0) {
            return Err(InvalidBudget {
                kind: Invalid::ZeroAuthorities,
            }
            .into());
        }
        Ok(RetryBudget::from_bucket(
            Bucket::full(
                u64::from(self.max_tokens) * UNITS_PER_TOKEN,
                u64::from(self.min_per_sec),
            ),
            deposit_units,
            self.authorities,
        ))
    }
}

impl Part for Arc<Inner> {
    fn fresh(&self) -> Self {
        Arc::new(Inner {
            bucket: Bucket::full(self.bucket.cap_units(), self.bucket.refill_per_ms()),
            deposit_units: self.deposit_units,
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

impl Default for RetryBudget {
    /// A budget of 10% of requests (`ratio` 0.1), plus 10 retries per second,
    /// with at most 100 retries saved up.
    fn default() -> Self {
        RetryBudget::builder().build()
    }
}

impl fmt::Debug for RetryBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = &self.inner;
        let mut f = f.debug_struct("RetryBudget");
        if let Some(max) = self.inner.max_authorities() {
            f.field("max_authorities", &max);
        }
        f.field(
            "ratio",
            &(inner.deposit_units as f64 / UNITS_PER_TOKEN as f64),
        )
        .field("min_per_sec", &inner.bucket.refill_per_ms())
        .field("max_tokens", &(inner.bucket.cap_units() / UNITS_PER_TOKEN))
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

/// What is wrong with a value the budget cannot use; [`BudgetBuilder::try_build`] returns
/// it inside an `InvalidConfig`, whose [`Display`](fmt::Display) names the value and says
/// what would be accepted.
///
/// # Example
///
/// ```
#[doc = concat!("use ", env!("CARGO_CRATE_NAME"), "::RetryBudget;")]
///
/// let error = RetryBudget::builder().ratio(0.1).min_per_sec(10).max_tokens(0).try_build().unwrap_err();
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
    ZeroAuthorities,
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
            Invalid::ZeroAuthorities => f.write_str("max_authorities is 0; it must be at least 1"),
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

    use std::time::Duration;

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
        let budget = RetryBudget::builder()
            .ratio(0.25)
            .min_per_sec(0)
            .max_tokens(5)
            .build();
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
        let budget = RetryBudget::builder()
            .ratio(0.999)
            .min_per_sec(1)
            .max_tokens(2)
            .build();
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
        let budget = RetryBudget::builder()
            .ratio(0.0)
            .min_per_sec(10)
            .max_tokens(3)
            .build();
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
        let budget = RetryBudget::builder()
            .ratio(MAX_RATIO)
            .min_per_sec(u32::MAX)
            .max_tokens(MAX_TOKENS)
            .build();
        assert_eq!(MAX_TOKENS, 67_108);
        assert_eq!(budget.inner.bucket.cap_units(), 67_108_000);
        assert!(budget.withdraw_at(0));
        budget.deposit();
        assert_eq!(budget.units_at(0), 67_108_000);
        assert_eq!(drain_at(&budget, 0), u64::from(MAX_TOKENS));
        budget.deposit();
        assert_eq!(budget.units_at(0), 1_000_000);
    }

    #[test]
    fn try_build_refuses_a_nan_ratio() {
        assert_eq!(
            message(f64::NAN, 10, 100),
            "invalid retry budget: ratio is NaN; it must be a finite number from 0 to 1000"
        );
    }

    #[test]
    fn try_build_refuses_an_infinite_ratio() {
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
    fn try_build_refuses_a_negative_ratio() {
        assert_eq!(
            message(-0.5, 10, 100),
            "invalid retry budget: ratio is -0.5; it must not be negative"
        );
    }

    #[test]
    fn try_build_refuses_a_ratio_too_small_to_count() {
        let text = message(0.0004, 10, 100);
        assert!(
            text.starts_with("invalid retry budget: ratio is 0.0004; "),
            "{text}"
        );
        assert!(text.contains("at least 0.001"), "{text}");
        // Zero is not "too small": it means no deposits.
        assert!(
            RetryBudget::builder()
                .ratio(0.0)
                .min_per_sec(10)
                .max_tokens(100)
                .try_build()
                .is_ok()
        );
        assert!(
            RetryBudget::builder()
                .ratio(0.001)
                .min_per_sec(10)
                .max_tokens(100)
                .try_build()
                .is_ok()
        );
    }

    #[test]
    fn try_build_refuses_a_ratio_too_large() {
        assert_eq!(
            message(1_000.5, 10, 100),
            "invalid retry budget: ratio is 1000.5; it must be at most 1000"
        );
        assert!(
            RetryBudget::builder()
                .ratio(1_000.0)
                .min_per_sec(10)
                .max_tokens(100)
                .try_build()
                .is_ok()
        );
    }

    #[test]
    fn try_build_refuses_zero_max_tokens() {
        assert_eq!(
            message(0.1, 10, 0),
            "invalid retry budget: max_tokens is 0; it must be at least 1"
        );
    }

    #[test]
    fn try_build_refuses_max_tokens_too_large() {
        let text = message(0.1, 10, 67_109);
        assert!(
            text.starts_with("invalid retry budget: max_tokens is 67109; it must be at most 67108"),
            "{text}"
        );
        assert!(message(0.1, 10, u32::MAX).contains("max_tokens is 4294967295"));
        assert!(
            RetryBudget::builder()
                .ratio(0.1)
                .min_per_sec(10)
                .max_tokens(67_108)
                .try_build()
                .is_ok()
        );
    }

    #[test]
    #[should_panic(expected = "invalid retry budget: max_tokens is 0")]
    fn new_panics_with_the_error_message() {
        let _ = RetryBudget::builder()
            .ratio(0.1)
            .min_per_sec(10)
            .max_tokens(0)
            .build();
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
        let first = RetryBudget::builder()
            .ratio(1.0)
            .min_per_sec(0)
            .max_tokens(2)
            .build();
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
        let budget = RetryBudget::builder()
            .ratio(0.5)
            .min_per_sec(0)
            .max_tokens(1)
            .build();
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
        let budget = RetryBudget::builder()
            .ratio(0.25)
            .min_per_sec(7)
            .max_tokens(3)
            .build();
        assert_eq!(
            format!("{budget:?}"),
            "RetryBudget { ratio: 0.25, min_per_sec: 7, max_tokens: 3, tokens: 3.0 }"
        );
    }
}
