// Client-side throttling, the Google SRE book's "adaptive throttling" (chapter 21,
// "Handling Overload", equation 21-1), as a kind of gate asked before every attempt, first
// attempts included. Over a window of recent history each client counts the attempts the
// backend accepted and those it throttled (its own local rejections among them), and sends
// an attempt only with probability 1 - p, where
//
//     p = max(0, (requests - K * accepts) / (requests + P)),  requests = accepts + throttles
//
// Ported from grpc-go at commit 4793ad0474669eafbd5346c8a3d098fdfa542498 (21 August 2026),
// balancer/rls/internal/adaptive/adaptive.go and lookback.go: `ShouldThrottle` (draw r in
// [0, 1); throttle only when p > r, strictly, and then count a throttle, so local rejections
// raise `requests` without raising `accepts`, as the book asks), `RegisterBackendResponse`,
// and the moving sum over `bins` bins of absolute index `t / width`, where a time earlier
// than the head reads the sum at the head and an add more than `bins` behind it is dropped.
// Its unit tests are ported as tables (`tests` below). Where this differs:
// - grpc-go has no `max(0, ..)`: a negative p never exceeds r, so the answers are the same.
// - Time is nanoseconds since the state was made, on the throttle's clock (`clock.rs`: the
//   clock of the first layer that uses it, else the default, tokio's), not since the UNIX
//   epoch: only where the bins' edges fall changes.
// - The book's padding is 1 and its window two minutes; grpc-go's are 8 and 30 s in 100
//   bins, its defaults, which are this gate's (`sre_book()` sets the book's).
// - What counts: a throttled outcome (a reason of `FailureKind::Throttling`: 429, gRPC's
//   `RESOURCE_EXHAUSTED`) is a throttle; a success, and a failure the backend answered as
//   having handled (`FailureKind::Other`, a 404) is an accept. A transient failure (a
//   connection failure, a timeout, 500, 502, 503, 504) counts as neither: the backend may
//   not have seen it, and a 503 is as often a proxy's as an overload's. grpc-go leaves the
//   choice to its caller (whose RLS code does not call `RegisterBackendResponse` at all).
//
// The two sums sit under one short lock (as in grpc-go), taken once per attempt asked and
// once per outcome; the draw is from the thread's generator that jitter draws from.

use std::fmt;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use super::clock::GateClock;
use super::partition::Scoped;
use super::{Admission, Ask, GateBuilder, Heard, Kind};
use crate::classify::FailureKind;
use crate::info::StopReason;

/// Client-side throttling, from the Google SRE book: once a server rejects a large share of
/// a client's attempts as throttled, the client rejects a share of them itself, before they
/// are sent, so that an overloaded server spends nothing on requests it would refuse.
///
/// Over a recent window (default 30 s) the gate counts the attempts the server accepted and
/// those throttled, its own rejections among them, and sends each attempt (first attempts,
/// retries and hedges alike) with probability `1 - p`:
///
/// ```text
/// p = max(0, (requests - K * accepts) / (requests + P)),   requests = accepts + throttles
/// ```
///
/// With `K` = 2 a client starts rejecting once the server throttles more than half of what
/// it sends, and lets through about twice what the server accepts. `P` (default 8) keeps a
/// client with little traffic from rejecting on a few throttles. The defaults are grpc-go's
/// (its `balancer/rls/internal/adaptive`: 30 s in 100 bins, `K` 2, `P` 8);
/// [`sre_book`](GateBuilder::sre_book) sets the book's (two minutes, `P` 1).
///
/// A throttle is an outcome whose reason is [`FailureKind::Throttling`] (a 429 under the
/// default classification, gRPC's `RESOURCE_EXHAUSTED`, or what a classifier marks so); a
/// success, and any other answer the server gave as handled ([`FailureKind::Other`], a
/// 404), is an accept; a transient failure (a connection failure, a timeout, 500, 502, 503,
/// 504) counts as neither.
///
/// A first attempt rejected is never sent: the request ends with
/// [`LocallyRefused`](crate::LocallyRefused), its record says no attempt was sent and
/// [`StopReason::Throttled`]. A retry or hedge rejected is not sent and the last outcome is
/// returned, as when a budget refuses.
///
/// # Clone
///
/// `AdaptiveThrottle` is a cheap handle: every clone shares the same counts. Built
/// [`per_authority`](GateBuilder::per_authority) it keeps one per server, as the book's
/// clients keep theirs per backend.
///
/// ```
/// use tower_http_retry::{AdaptiveThrottle, RetryLayer, RetryPolicy};
///
/// let throttle = AdaptiveThrottle::builder().per_authority().build();
/// let layer = RetryLayer::new().policy(RetryPolicy::new().gate(throttle));
/// # let _ = layer;
/// ```
#[derive(Clone)]
pub struct AdaptiveThrottle {
    pub(super) inner: Scoped<Shedding>,
}

/// What a client-side throttle is built from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SheddingSettings {
    window: Duration,
    bins: u32,
    accepts_multiplier: f64,
    requests_padding: f64,
}

/// The state of an [`AdaptiveThrottle`].
pub struct Shedding {
    counts: Mutex<Counts>,
    /// The throttle's clock.
    clock: GateClock,
    /// Time zero of the counts' time, on `clock` (since its epoch).
    born: Duration,
    settings: SheddingSettings,
}

/// grpc-go's `Throttler`, on nanoseconds since the state was made.
#[derive(Debug, Clone, PartialEq)]
struct Counts {
    accepts: Lookback,
    throttles: Lookback,
    accepts_multiplier: f64,
    requests_padding: f64,
}

/// grpc-go's `lookback`: a moving sum over `bins` bins of `width` nanoseconds.
#[derive(Debug, Clone, PartialEq)]
struct Lookback {
    width: i64,
    /// The absolute index of the newest bin.
    head: i64,
    total: i64,
    buf: Vec<i64>,
}

impl Lookback {
    fn new(bins: u32, window: Duration) -> Lookback {
        let bins = bins.max(1);
        // At least a nanosecond a bin (the settings' check keeps it so).
        let width = (window.as_nanos() / u128::from(bins)).clamp(1, i64::MAX as u128) as i64;
        Lookback {
            width,
            head: 0,
            total: 0,
            buf: vec![0; bins as usize],
        }
    }

    fn bins(&self) -> i64 {
        self.buf.len() as i64
    }

    fn add(&mut self, t: i64, v: i64) {
        let pos = self.advance(t);
        if self.head - pos >= self.bins() {
            // More than the window behind the head.
            return;
        }
        let slot = pos.rem_euclid(self.bins()) as usize;
        self.buf[slot] += v;
        self.total += v;
    }

    fn sum(&mut self, t: i64) -> i64 {
        self.advance(t);
        self.total
    }

    /// Moves the head to `t`'s bin, clearing the bins it passes, unless `t` is not after
    /// the head; `t`'s bin.
    fn advance(&mut self, t: i64) -> i64 {
        let current = self.head;
        let next = t.div_euclid(self.width);
        if next <= current {
            return next;
        }
        for j in 0..self.bins().min(next - current) {
            let slot = (current + j + 1).rem_euclid(self.bins()) as usize;
            self.total -= self.buf[slot];
            self.buf[slot] = 0;
        }
        self.head = next;
        next
    }
}

impl Counts {
    fn new(s: &SheddingSettings) -> Counts {
        Counts {
            accepts: Lookback::new(s.bins, s.window),
            throttles: Lookback::new(s.bins, s.window),
            accepts_multiplier: s.accepts_multiplier,
            requests_padding: s.requests_padding,
        }
    }

    /// grpc-go's `ShouldThrottle` at `t` with the draw `r` in [0, 1): whether to reject
    /// (and then a throttle is counted).
    fn should_throttle(&mut self, t: i64, r: f64) -> bool {
        let accepts = self.accepts.sum(t) as f64;
        let throttles = self.throttles.sum(t) as f64;
        let requests = accepts + throttles;
        let p = (requests - self.accepts_multiplier * accepts) / (requests + self.requests_padding);
        if p <= r {
            return false;
        }
        self.throttles.add(t, 1);
        true
    }

    /// grpc-go's `RegisterBackendResponse`.
    fn register(&mut self, t: i64, throttled: bool) {
        match throttled {
            true => self.throttles.add(t, 1),
            false => self.accepts.add(t, 1),
        }
    }
}

impl AdaptiveThrottle {
    /// A builder with grpc-go's settings: a 30 s window in 100 bins, `K` 2, `P` 8.
    ///
    /// ```
    /// use tower_http_retry::AdaptiveThrottle;
    ///
    /// let throttle = AdaptiveThrottle::builder().accepts_multiplier(1.5).build();
    /// # let _ = throttle;
    /// ```
    pub fn builder() -> GateBuilder<AdaptiveThrottle> {
        GateBuilder::new()
    }
}

impl GateBuilder<AdaptiveThrottle> {
    /// The SRE book's settings: a two-minute window (in 120 bins of a second), `K` 2, `P` 1.
    ///
    /// ```
    /// use tower_http_retry::AdaptiveThrottle;
    ///
    /// let throttle = AdaptiveThrottle::builder().sre_book().build();
    /// # let _ = throttle;
    /// ```
    pub fn sre_book(self) -> Self {
        self.window(Duration::from_secs(120), 120)
            .accepts_multiplier(2.0)
            .requests_padding(1.0)
    }

    /// The history counted: `window` (default 30 s) in `bins` bins (default 100), each
    /// dropped whole when it leaves the window (bins of at least a nanosecond, 1 to 10 000
    /// of them).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_http_retry::AdaptiveThrottle;
    ///
    /// let throttle = AdaptiveThrottle::builder().window(Duration::from_secs(60), 60).build();
    /// # let _ = throttle;
    /// ```
    pub fn window(mut self, window: Duration, bins: u32) -> Self {
        self.settings.window = window;
        self.settings.bins = bins;
        self
    }

    /// `K`, how many attempts the client lets through per accepted one before it rejects
    /// (default 2; at least 1: lower, it rejects what the server would have accepted).
    ///
    /// ```
    /// use tower_http_retry::AdaptiveThrottle;
    ///
    /// // Rejects sooner: about one throttle for each ten accepted.
    /// let throttle = AdaptiveThrottle::builder().accepts_multiplier(1.1).build();
    /// # let _ = throttle;
    /// ```
    pub fn accepts_multiplier(mut self, k: f64) -> Self {
        self.settings.accepts_multiplier = k;
        self
    }

    /// `P`, added to the requests counted, so that a few throttles with little traffic do
    /// not reject (default 8; the book's 1; more than 0).
    ///
    /// ```
    /// use tower_http_retry::AdaptiveThrottle;
    ///
    /// let throttle = AdaptiveThrottle::builder().requests_padding(1.0).build();
    /// # let _ = throttle;
    /// ```
    pub fn requests_padding(mut self, p: f64) -> Self {
        self.settings.requests_padding = p;
        self
    }
}

impl Shedding {
    fn made(
        settings: SheddingSettings,
        counts: Counts,
        clock: GateClock,
        born: Duration,
    ) -> Shedding {
        Shedding {
            counts: Mutex::new(counts),
            clock,
            born,
            settings,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Counts> {
        self.counts.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Nanoseconds on the state's clock.
    fn now(&self) -> i64 {
        let elapsed = self.clock.elapsed().saturating_sub(self.born);
        i64::try_from(elapsed.as_nanos()).unwrap_or(i64::MAX)
    }
}

impl Kind for Shedding {
    type Settings = SheddingSettings;
    const NAME: &'static str = "adaptive throttle";
    const HEARS_OUTCOMES: bool = true;
    const ASKS_FIRST: bool = true;

    fn defaults() -> SheddingSettings {
        SheddingSettings {
            window: Duration::from_secs(30),
            bins: 100,
            accepts_multiplier: 2.0,
            requests_padding: 8.0,
        }
    }

    fn check(s: &SheddingSettings) -> Result<(), String> {
        if !(1..=10_000).contains(&s.bins) {
            return Err(format!("bins is {}; it must be from 1 to 10000", s.bins));
        }
        if s.window.as_nanos() < u128::from(s.bins) {
            return Err(format!(
                "window is {:?}; it must be at least a nanosecond for each of the {} bins",
                s.window, s.bins
            ));
        }
        if !s.accepts_multiplier.is_finite() || s.accepts_multiplier < 1.0 {
            return Err(format!(
                "accepts_multiplier is {}; it must be a finite number of at least 1",
                s.accepts_multiplier
            ));
        }
        // With none, no history would be 0 / 0, which rejects.
        if !s.requests_padding.is_finite() || s.requests_padding <= 0.0 {
            return Err(format!(
                "requests_padding is {}; it must be a finite number greater than 0",
                s.requests_padding
            ));
        }
        Ok(())
    }

    fn full(settings: &SheddingSettings, clock: &GateClock) -> Shedding {
        let counts = Counts::new(settings);
        Shedding::made(*settings, counts, clock.clone(), clock.birth())
    }

    fn clock(&self) -> Option<&GateClock> {
        Some(&self.clock)
    }

    fn fresh(&self) -> Shedding {
        Shedding::full(&self.settings, &self.clock)
    }

    fn successor(&self) -> Shedding {
        Shedding::made(
            self.settings,
            self.lock().clone(),
            self.clock.clone(),
            self.born,
        )
    }

    fn at_rest(&self) -> bool {
        let t = self.now();
        let mut counts = self.lock();
        counts.accepts.sum(t) == 0 && counts.throttles.sum(t) == 0
    }

    fn admit(&self, _: Ask) -> Admission {
        let r = crate::backoff::thread_f64();
        let t = self.now();
        match self.lock().should_throttle(t, r) {
            true => Admission::Refuse(StopReason::Throttled),
            false => Admission::ADMIT,
        }
    }

    fn on_outcome(&self, heard: Heard, _: Option<u64>) -> Result<(), StopReason> {
        let throttled = match heard {
            Heard::Failure(FailureKind::Throttling) => true,
            Heard::Failure(FailureKind::Transient) => return Ok(()),
            Heard::Success | Heard::Neither | Heard::Failure(FailureKind::Other) => false,
        };
        let t = self.now();
        self.lock().register(t, throttled);
        Ok(())
    }
}

impl fmt::Debug for AdaptiveThrottle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.inner.settings;
        let mut f = f.debug_struct("AdaptiveThrottle");
        if let Some(max) = self.inner.max_authorities() {
            f.field("max_authorities", &max);
        }
        f.field("window", &s.window)
            .field("bins", &s.bins)
            .field("accepts_multiplier", &s.accepts_multiplier)
            .field("requests_padding", &s.requests_padding)
            .finish()
    }
}

#[cfg(all(test, not(tower_http_retry_loom)))]
mod tests;
