// The AWS SDKs' adaptive rate limiter ("adaptive" retry mode), as a kind of gate asked
// before every attempt, first attempts included. A token bucket whose fill rate follows
// CUBIC: off until the first throttling outcome; then each throttle cuts the rate to 0.7 of
// what the client was sending, and each other outcome lets it grow back along a cubic curve,
// never above twice the measured send rate, never below 0.5 per second.
//
// Ported from smithy-rs at commit 56ee88c5c6edd967967656f1e29f46b229105e79 (21 August 2026),
// rust-runtime/aws-smithy-runtime/src/client/retries/client_rate_limiter.rs: the constants,
// the update on every outcome (`update_rate_limiter`: measured rate, then the cubic, then
// `min(calculated, 2 * measured)`, then a refill at the old rate and the new rate and
// capacity) and the refill, operation for operation (`powf(1/3)`, `powi(3)`), so that its
// unit vectors hold to the last bit or so (`tests` below). aws-sdk-go-v2's
// `aws/retry/adaptive_ratelimit.go` has the same arithmetic.
//
// Where this differs from smithy-rs, and why:
// - The initial state is that of smithy-rs's `ClientRateLimiter::builder().build()` and of
//   aws-sdk-go-v2's `newAdaptiveRateLimit` (measured rate 0), on which every published
//   vector is computed; smithy-rs's `ClientRateLimiter::new` starts the measured rate at 0.5
//   through a builder setter whose name suggests the fill rate, which only shifts the
//   recovery curve after the first throttle.
// - Time is seconds since the state was made, on the limiter's clock (`clock.rs`: the
//   clock of the first layer that uses it, else the default, tokio's: paused-time tests
//   and a layer's `ManualClock` drive it), not since the UNIX epoch: the half-second
//   buckets are aligned on the state's birth (a state made before the limiter has a clock
//   is born when it gets one).
//   The clock is read under the lock, so one state never sees time go back.
// - Every attempt costs 1 (the first, a retry, a hedge, a transparent retry): the rule of
//   aws-sdk-go-v2 and of smithy-rs's newer retry behaviour (its `acquire_adaptive_send_token`
//   before every send). smithy-rs's older 5 and 10 for retries are not kept.
// - A token is reserved, not awaited. smithy-rs answers a shortfall with the wait and takes
//   nothing, and its caller sleeps and asks again; here the gate's answer is final (the
//   driver sends the attempt when the wait ends), so the attempt takes its token now, the
//   balance may go below zero, and the wait is the time the current fill rate takes to bring
//   it back to zero: `(1 - capacity) / fill_rate`, smithy-rs's wait. For one requester the
//   times at which attempts leave are smithy-rs's; for several at once they leave one fill
//   interval apart, instead of all waking together and all but one waiting again. A token
//   reserved for an attempt that is not sent (another gate refused, the deadline leaves no
//   time, the request was dropped during the wait) goes back.
// - A wait longer than `max_wait` (default 20 s, the SDKs' longest backoff, which
//   smithy-rs's older mode also put on the limiter's delay) refuses the attempt at once,
//   taking nothing: neither SDK bounds the wait, but a caller should not queue behind a
//   limiter for minutes.
//
// Locking: before the first throttle (`enabled` false, one atomic load) an attempt is
// admitted without the lock. Every outcome takes the lock for the update (a dozen float
// operations), and after the first throttle so does every admission: the update reads and
// writes ten fields together, which one atomic word cannot hold. Measured (release, a
// no-op service, requests through the layer, a shared two-core machine): a request under a
// limiter that has not throttled costs about 0.3 to 0.5 us more than under the budget
// alone, on one thread as on two sharing it; a lock-free throttle that hears outcomes costs
// about half of that, so most of it is the driver's path for a gate asked before first
// attempts, not the lock. An outcome that only tried the lock before the first throttle (a
// pending count applied by the next) measured no better on two threads and was not kept.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use super::clock::GateClock;
use super::partition::Scoped;
use super::{Admission, Ask, GateBuilder, Heard, Kind};
use crate::classify::FailureKind;
use crate::info::StopReason;

/// The least fill rate, tokens per second.
const MIN_FILL_RATE: f64 = 0.5;
/// The least bucket capacity, tokens.
const MIN_CAPACITY: f64 = 1.0;
/// The weight of the newest measured rate.
const SMOOTH: f64 = 0.8;
/// How far a throttle cuts the rate.
const BETA: f64 = 0.7;
/// How fast the rate grows back (CUBIC's `C`).
const SCALE_CONSTANT: f64 = 0.4;
/// What every attempt costs.
const SEND_COST: f64 = 1.0;
/// What a taken token is in the admission's `taken` (the one amount this kind takes).
const SEND_COST_UNITS: u64 = super::bucket::UNITS_PER_TOKEN;
/// The longest wait unless set.
const DEFAULT_MAX_WAIT: Duration = Duration::from_secs(20);

/// A client-side rate limiter that slows every attempt, first attempts included, once the
/// server throttles: the AWS SDKs' adaptive retry mode.
///
/// A retry gate ([`RetryBudget`](crate::RetryBudget), [`RetryQuota`](crate::RetryQuota),
/// [`Throttle`](crate::Throttle)) bounds the retries a client adds; when a server answers
/// 429 because the client sends too much, the first attempts keep arriving at full speed
/// and most are throttled too. This limiter slows the sender itself:
///
/// * it is off, and costs one atomic read per attempt, until the first throttled outcome;
/// * from then on every attempt (the first, a retry, a hedge) takes a token from a bucket
///   filled at a rate the limiter adapts, and waits for it when none is left;
/// * each throttled outcome cuts the rate to 0.7 of what the client was sending; each other
///   outcome lets it grow back along a cubic curve (CUBIC, as TCP's congestion control),
///   never above twice the client's measured send rate, never below 0.5 a second;
/// * an attempt whose wait would be longer than [`max_wait`](GateBuilder::max_wait)
///   (default 20 s) is not sent. A first attempt then ends with [`LocallyRefused`] (the
///   record says no attempt was sent, and [`StopReason::Throttled`]); a retry or a hedge
///   is not sent and the last outcome is returned, as when a budget refuses. A request's
///   deadline bounds the wait too ([`DeadlineExceeded`](crate::DeadlineExceeded)).
///
/// A throttled outcome is one its policy's classifier gives a reason of
/// [`FailureKind::Throttling`]: a 429 under the default classification, gRPC's
/// `RESOURCE_EXHAUSTED`, or any reason a classifier of one's own marks so (an AWS error
/// code such as `SlowDown`, which S3 sends as a 503). A 503 is not one by itself, with or
/// without a `Retry-After`: a proxy with no healthy upstream or a server in maintenance
/// answers 503 whatever the client's rate, and its `Retry-After` already delays the retry.
/// The AWS SDKs count their throttling error codes and no status at all.
///
/// Every outcome of an attempt (a success, a failure, a 404) updates the measured send
/// rate; it is heard only under a policy that has the limiter, as the other gates' are.
/// A request under [`RetryPolicy::never`](crate::RetryPolicy::never) or a `CONNECT` is
/// neither asked nor heard.
///
/// # The port
///
/// The arithmetic is smithy-rs's `client_rate_limiter.rs` (its `aws-smithy-runtime` crate,
/// `src/client/retries/`) at commit `56ee88c5c6edd967967656f1e29f46b229105e79`, the same
/// as aws-sdk-go-v2's `aws/retry/adaptive_ratelimit.go`; every attempt costs one token, as
/// in aws-sdk-go-v2 and smithy-rs's newer retry behaviour. An attempt reserves its token
/// when it is admitted and waits until the bucket has refilled it, which for one client at
/// a time is the SDKs' wait; a reserved token goes back when the attempt is not sent after
/// all (another gate refused it, or the request was dropped while it waited).
///
/// # Clone
///
/// `AdaptiveLimiter` is a cheap handle: every clone shares the same limiter, so one handle
/// given to several clients paces them together, as the AWS SDKs share one per retry
/// partition (a service in a region). Built
/// [`per_authority`](GateBuilder::per_authority), it keeps one limiter per server.
///
/// Before the first throttle, admitting an attempt takes no lock; each outcome, and after
/// the first throttle each admission, takes a short lock on the limiter's state.
///
/// ```
/// use std::time::Duration;
/// use tower_http_retry::{AdaptiveLimiter, RetryLayer, RetryPolicy};
///
/// let limiter = AdaptiveLimiter::builder()
///     .max_wait(Duration::from_secs(5))
///     .per_authority()
///     .build();
/// let layer = RetryLayer::new().policy(RetryPolicy::new().gate(limiter.clone()));
/// assert_eq!(limiter.rate(), None); // off until a server throttles
/// # let _ = layer;
/// ```
///
/// [`LocallyRefused`]: crate::LocallyRefused
#[derive(Clone)]
pub struct AdaptiveLimiter {
    pub(super) inner: Scoped<Adaptive>,
}

/// What a limiter is built from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdaptiveSettings {
    max_wait: Duration,
}

/// The state of an [`AdaptiveLimiter`].
pub struct Adaptive {
    /// Whether the first throttle came: until then admission needs no lock.
    enabled: AtomicBool,
    cubic: Mutex<Cubic>,
    /// The limiter's clock.
    clock: GateClock,
    /// Time zero of `cubic`'s time, on `clock` (since its epoch).
    born: Duration,
    settings: AdaptiveSettings,
}

/// The limiter's arithmetic, smithy-rs's `Inner`, on seconds since the state was made.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Cubic {
    /// Tokens per second the bucket fills at.
    fill_rate: f64,
    /// The most tokens the bucket holds.
    max_capacity: f64,
    /// The tokens in the bucket; below zero while attempts wait for reserved tokens.
    capacity: f64,
    /// When the bucket was last refilled.
    last_timestamp: Option<f64>,
    /// Whether a throttle came: until then every attempt goes at once.
    enabled: bool,
    /// The smoothed rate of outcomes heard, per second.
    measured_tx_rate: f64,
    /// The start of the half second in which outcomes are being counted.
    last_tx_rate_bucket: f64,
    /// Outcomes heard in that half second.
    request_count: u64,
    /// The rate at the last throttle.
    last_max_rate: f64,
    /// When the last throttle came.
    time_of_last_throttle: f64,
}

/// What the bucket answers an attempt.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Grant {
    /// Off: go, nothing taken.
    Free,
    /// A token is taken; go after this many seconds (0: at once).
    After(f64),
    /// The wait would be this many seconds, longer than allowed: nothing taken.
    TooLong(f64),
}

impl Cubic {
    /// smithy-rs's `ClientRateLimiter::builder().build()`: everything zero, off, with no
    /// bound on the capacity until the first update sets one.
    fn new() -> Cubic {
        Cubic {
            fill_rate: 0.0,
            max_capacity: f64::MAX,
            capacity: 0.0,
            last_timestamp: None,
            enabled: false,
            measured_tx_rate: 0.0,
            last_tx_rate_bucket: 0.0,
            request_count: 0,
            last_max_rate: 0.0,
            time_of_last_throttle: 0.0,
        }
    }

    /// smithy-rs's `update_rate_limiter`: an outcome heard at `t`.
    fn update(&mut self, t: f64, throttled: bool) {
        self.measure(t);
        let calculated = if throttled {
            let rate_to_use = match self.enabled {
                true => f64::min(self.measured_tx_rate, self.fill_rate),
                false => self.measured_tx_rate,
            };
            self.last_max_rate = rate_to_use;
            self.time_of_last_throttle = t;
            self.enabled = true;
            rate_to_use * BETA
        } else {
            self.cubic_success(t)
        };
        let new_rate = f64::min(calculated, 2.0 * self.measured_tx_rate);
        // Refilled at the rate until now, then the new one.
        self.refill(t);
        self.fill_rate = f64::max(new_rate, MIN_FILL_RATE);
        self.max_capacity = f64::max(new_rate, MIN_CAPACITY);
        self.capacity = f64::min(self.capacity, self.max_capacity);
    }

    /// smithy-rs's `update_tokens_retrieved_per_second`: counts the outcome, and at the
    /// first one of a new half second, smooths the rate of the half seconds since the last.
    fn measure(&mut self, t: f64) {
        let bucket = (t * 2.0).floor() / 2.0;
        self.request_count += 1;
        if bucket > self.last_tx_rate_bucket {
            let rate = self.request_count as f64 / (bucket - self.last_tx_rate_bucket);
            self.measured_tx_rate = rate * SMOOTH + self.measured_tx_rate * (1.0 - SMOOTH);
            self.request_count = 0;
            self.last_tx_rate_bucket = bucket;
        }
    }

    /// CUBIC's time from a throttle to the rate before it.
    fn time_window(&self) -> f64 {
        ((self.last_max_rate * (1.0 - BETA)) / SCALE_CONSTANT).powf(1.0 / 3.0)
    }

    /// The rate at `t` after the last throttle, on CUBIC's curve.
    fn cubic_success(&self, t: f64) -> f64 {
        let dt = t - self.time_of_last_throttle - self.time_window();
        SCALE_CONSTANT * dt.powi(3) + self.last_max_rate
    }

    fn refill(&mut self, t: f64) {
        if let Some(last) = self.last_timestamp {
            let fill = (t - last) * self.fill_rate;
            self.capacity = f64::min(self.max_capacity, self.capacity + fill);
        }
        self.last_timestamp = Some(t);
    }

    /// An attempt at `t`, which may wait at most `max_wait` seconds.
    fn acquire(&mut self, t: f64, max_wait: f64) -> Grant {
        if !self.enabled {
            return Grant::Free;
        }
        self.refill(t);
        if self.capacity >= SEND_COST {
            self.capacity -= SEND_COST;
            return Grant::After(0.0);
        }
        let wait = (SEND_COST - self.capacity) / self.fill_rate;
        if Duration::try_from_secs_f64(wait).is_ok_and(|wait| wait.is_zero()) {
            // A shortfall under a nanosecond is none (smithy-rs grants it, never below 0).
            self.capacity = (self.capacity - SEND_COST).max(0.0);
            return Grant::After(0.0);
        }
        if wait > max_wait {
            return Grant::TooLong(wait);
        }
        self.capacity -= SEND_COST;
        Grant::After(wait)
    }

    /// A token taken for an attempt not sent goes back.
    fn give_back(&mut self) {
        self.capacity = f64::min(self.max_capacity, self.capacity + SEND_COST);
    }
}

impl AdaptiveLimiter {
    /// A builder of a limiter: it waits up to 20 s for a token.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_http_retry::AdaptiveLimiter;
    ///
    /// let limiter = AdaptiveLimiter::builder().max_wait(Duration::from_secs(2)).build();
    /// # let _ = limiter;
    /// ```
    pub fn builder() -> GateBuilder<AdaptiveLimiter> {
        GateBuilder::new()
    }

    /// The rate, in attempts per second, at which the limiter lets attempts go now; `None`
    /// until the first throttled outcome (every attempt goes at once). For a limiter kept
    /// per authority, that of requests without one: see
    /// [`Gate::partition`](super::Gate::partition).
    ///
    /// ```
    /// use tower_http_retry::AdaptiveLimiter;
    ///
    /// assert_eq!(AdaptiveLimiter::builder().build().rate(), None);
    /// ```
    #[must_use]
    pub fn rate(&self) -> Option<f64> {
        let cubic = self.inner.lock();
        cubic.enabled.then_some(cubic.fill_rate)
    }
}

impl GateBuilder<AdaptiveLimiter> {
    /// The longest an attempt waits for its token (default 20 s). An attempt that would
    /// wait longer is not sent: a first attempt ends with
    /// [`LocallyRefused`](crate::LocallyRefused), a retry returns the last outcome.
    /// `Duration::ZERO` never waits: every attempt beyond the rate is refused.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_http_retry::AdaptiveLimiter;
    ///
    /// let limiter = AdaptiveLimiter::builder().max_wait(Duration::from_millis(500)).build();
    /// # let _ = limiter;
    /// ```
    pub fn max_wait(mut self, max_wait: Duration) -> Self {
        self.settings.max_wait = max_wait;
        self
    }
}

impl Adaptive {
    fn made(
        settings: AdaptiveSettings,
        cubic: Cubic,
        clock: GateClock,
        born: Duration,
    ) -> Adaptive {
        Adaptive {
            enabled: AtomicBool::new(cubic.enabled),
            cubic: Mutex::new(cubic),
            clock,
            born,
            settings,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Cubic> {
        // Every update leaves the state whole: a panic elsewhere cannot break it.
        self.cubic.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Seconds on the state's clock, read under its lock.
    fn now(&self) -> f64 {
        self.clock.elapsed().saturating_sub(self.born).as_secs_f64()
    }
}

impl Kind for Adaptive {
    type Settings = AdaptiveSettings;
    const NAME: &'static str = "adaptive limiter";
    const HEARS_OUTCOMES: bool = true;
    const ASKS_FIRST: bool = true;

    fn defaults() -> AdaptiveSettings {
        AdaptiveSettings {
            max_wait: DEFAULT_MAX_WAIT,
        }
    }

    fn check(_: &AdaptiveSettings) -> Result<(), String> {
        // Any wait: zero never waits, a long one is bounded by the request's deadline.
        Ok(())
    }

    fn full(settings: &AdaptiveSettings, clock: &GateClock) -> Adaptive {
        Adaptive::made(*settings, Cubic::new(), clock.clone(), clock.birth())
    }

    fn clock(&self) -> Option<&GateClock> {
        Some(&self.clock)
    }

    fn fresh(&self) -> Adaptive {
        Adaptive::full(&self.settings, &self.clock)
    }

    fn successor(&self) -> Adaptive {
        Adaptive::made(self.settings, *self.lock(), self.clock.clone(), self.born)
    }

    fn at_rest(&self) -> bool {
        // Never throttled: a new one admits the same. (What it measured is lost, which
        // only shifts the curve after a first throttle.)
        !self.enabled.load(Ordering::Acquire)
    }

    fn admit(&self, _: Ask) -> Admission {
        if !self.enabled.load(Ordering::Acquire) {
            return Admission::ADMIT;
        }
        let mut cubic = self.lock();
        let t = self.now();
        match cubic.acquire(t, self.settings.max_wait.as_secs_f64()) {
            Grant::Free => Admission::ADMIT,
            Grant::After(wait) => Admission::Admit {
                taken: Some(SEND_COST_UNITS),
                // Up to `max_wait`, which a `Duration` holds.
                wait: Duration::try_from_secs_f64(wait).unwrap_or(self.settings.max_wait),
            },
            Grant::TooLong(_) => Admission::Refuse(StopReason::Throttled),
        }
    }

    fn release(&self, _: u64) {
        self.lock().give_back();
    }

    fn on_outcome(&self, heard: Heard, _: Option<u64>) -> Result<(), StopReason> {
        let throttled = heard == Heard::Failure(FailureKind::Throttling);
        let mut cubic = self.lock();
        let t = self.now();
        cubic.update(t, throttled);
        if throttled {
            self.enabled.store(true, Ordering::Release);
        }
        Ok(())
    }
}

impl fmt::Debug for AdaptiveLimiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut f = f.debug_struct("AdaptiveLimiter");
        if let Some(max) = self.inner.max_authorities() {
            f.field("max_authorities", &max);
        }
        f.field("rate", &self.rate())
            .field("max_wait", &self.inner.settings.max_wait)
            .finish()
    }
}

#[cfg(all(test, not(tower_http_retry_loom)))]
mod tests;
