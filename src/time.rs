//! The timer seam: every clock the layer reads and every wait it sleeps goes through a
//! [`Timer`].
//!
//! - The default, under the `tokio` feature (on by default), is tokio's timer: its
//!   `Instant::now`, taken as a `std::time::Instant`, and its `sleep_until`, so that a test
//!   under tokio's paused time sees every clock the layer reads. It is no value at all
//!   (`Clock(None)`): reading it is a branch and tokio's own call.
//! - A timer of the user's ([`RetryLayer::timer`](crate::RetryLayer::timer)) is held once,
//!   behind an `Arc`, by the layer's configuration; each response future finds it there
//!   when it reads the time or arms a sleep, and an armed sleep carries it, so that a
//!   request that never waits carries nothing more.
//! - Without the `tokio` feature and without a timer of the user's, the clock is the
//!   platform's monotonic clock and wall clock, and a wait panics, saying to set a timer.
//!
//! - On `wasm32-unknown-unknown` (browsers, Node), where std's clocks panic, the default
//!   clocks are JavaScript's (`performance.now()` and `Date.now()`, through `web-time`), and
//!   the default sleep is a JavaScript timer (`setTimeout`, through `gloo-timers`) under the
//!   `wasm` feature; without it a wait panics, saying to enable it or set a timer. tokio's
//!   timer is never the default there (its clock is std's).
//!
//! The monotonic instant is `std::time::Instant`, except on `wasm32-unknown-unknown`, where
//! std's cannot be made: there it is `web_time::Instant` (the same API, a JavaScript clock
//! behind it; on every other target web-time's `Instant` is std's). The wall clock is
//! `std::time::SystemTime` everywhere: std's arithmetic on it works on wasm32, only its
//! `now()` panics, and the seam builds it from JavaScript's `Date.now()` there.
//!
//! The shared gates (budgets, quotas, throttles, adaptive limiters and throttles, their
//! per-server partitions) read [`default_now`]: they are built apart from any layer, shared
//! by several, and read outside a request (`tokens()`, tower's `Budget`), so they have no
//! layer timer to ask. ARCHITECTURE.md, "Time", says why.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

pub(crate) use std::time::SystemTime;

/// The monotonic instant of the seam: std's, but web-time's where std's cannot be made.
#[cfg(not(all(target_arch = "wasm32", target_os = "unknown")))]
pub(crate) use std::time::Instant;
#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
pub(crate) use web_time::Instant;

/// A timer's sleep: `Send + Sync` (the response future and a resumed body are then `Send`
/// and `Sync`), except on `wasm32-unknown-unknown`, whose JavaScript timers are neither
/// (and neither are the futures of the clients there, reqwest's `fetch` among them).
#[cfg(not(all(target_arch = "wasm32", target_os = "unknown")))]
pub(crate) type BoxSleep = Pin<Box<dyn Future<Output = ()> + Send + Sync>>;
#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
pub(crate) type BoxSleep = Pin<Box<dyn Future<Output = ()>>>;

/// A source of time for the retry layer: a monotonic clock, a way to wait until an instant
/// of it, and the wall clock (which an HTTP-date `Retry-After` is measured against).
///
/// tokio's timer is the default (the `tokio` feature): a layer on tokio needs none. Another
/// runtime's timer, a browser's, or a test's hand-driven clock goes in
/// [`RetryLayer::timer`](crate::RetryLayer::timer). Every time the layer reads, and every
/// wait it sleeps (backoff, `Retry-After`, attempt timeouts, the deadline, hedging delays,
/// the resumption's idle timeout), comes from the one timer; the instants it returns must
/// not go backwards. The gates (budgets, quotas, throttles, the adaptive limiter and
/// throttle) are the exception: built apart from any layer and shared between layers, they
/// measure refills and windows on the default clock (tokio's, else the platform's).
///
/// On `wasm32-unknown-unknown` (browsers, Node) std's clocks panic, so there the signatures
/// read `web_time::Instant` for the instants (`web-time`, which on every other target
/// re-exports std's `Instant`), and `sleep_until` returns a
/// `Pin<Box<dyn Future<Output = ()>>>`, neither `Send` nor `Sync`, as JavaScript's timers
/// are not. The `wasm` feature gives that target a default timer (JavaScript's clocks and
/// `setTimeout`): a timer of one's own is for another clock or another sleep.
///
/// A timer on `futures-timer` (any executor):
///
/// ```
/// use std::future::Future;
/// use std::pin::Pin;
/// use std::time::{Duration, Instant};
/// use tower_http_retry::{RetryLayer, Timer};
///
/// struct FuturesTimer;
///
/// impl Timer for FuturesTimer {
///     fn now(&self) -> Instant {
///         Instant::now()
///     }
///     fn sleep_until(&self, at: Instant) -> Pin<Box<dyn Future<Output = ()> + Send + Sync>> {
///         Box::pin(futures_timer::Delay::new(at.saturating_duration_since(Instant::now())))
///     }
/// }
///
/// let layer = RetryLayer::new().timer(FuturesTimer);
/// # let _ = layer;
/// // The sleep the layer would arm for a backoff: no tokio runtime anywhere.
/// let timer = FuturesTimer;
/// let start = timer.now();
/// futures_executor::block_on(timer.sleep_until(start + Duration::from_millis(20)));
/// assert!(timer.now() >= start + Duration::from_millis(20));
/// ```
pub trait Timer: Send + Sync + 'static {
    /// The monotonic clock's time now (a `web_time::Instant` on `wasm32-unknown-unknown`).
    fn now(&self) -> Instant;

    /// A future that completes once [`Timer::now`] has reached `at` (at once if it has).
    /// `Sync` as well as `Send`, as hyper's timer asks of its sleeps, so that the response
    /// future and a resumed body stay `Sync`; neither on `wasm32-unknown-unknown`
    /// (`Pin<Box<dyn Future<Output = ()>>>`).
    fn sleep_until(&self, at: Instant) -> BoxSleep;

    /// The wall clock's time now, for an HTTP-date `Retry-After` (and `X-RateLimit-Reset`)
    /// without a `Date` header to measure against. The platform's wall clock by default.
    fn wall_now(&self) -> std::time::SystemTime {
        system_wall_now()
    }
}

/// The clock of a layer: its user's [`Timer`], or the default (`None`).
#[derive(Clone, Default)]
pub(crate) struct Clock(Option<Arc<dyn Timer>>);

impl fmt::Debug for Clock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self.0 {
            None => "default",
            Some(_) => "custom",
        })
    }
}

/// Two clocks are one when both are the default, or both the same timer.
impl PartialEq for Clock {
    fn eq(&self, other: &Self) -> bool {
        match (&self.0, &other.0) {
            (None, None) => true,
            (Some(one), Some(other)) => Arc::ptr_eq(one, other),
            _ => false,
        }
    }
}

impl Eq for Clock {}

impl Clock {
    pub(crate) fn custom(timer: impl Timer) -> Self {
        Clock(Some(Arc::new(timer)))
    }

    /// The monotonic clock's time now.
    #[inline]
    pub(crate) fn now(&self) -> Instant {
        match &self.0 {
            None => default_now(),
            Some(timer) => timer.now(),
        }
    }

    /// The wall clock's time now.
    pub(crate) fn wall_now(&self) -> SystemTime {
        match &self.0 {
            None => system_wall_now(),
            Some(timer) => timer.wall_now(),
        }
    }

    /// A sleep until `at`, carrying this clock (for reading the time and for resetting it).
    #[cfg_attr(
        not(any(
            all(
                feature = "tokio",
                not(all(target_arch = "wasm32", target_os = "unknown"))
            ),
            all(feature = "wasm", target_arch = "wasm32", target_os = "unknown")
        )),
        allow(unreachable_code)
    )]
    pub(crate) fn sleep_until(&self, at: Instant) -> Pin<Box<Sleep>> {
        let inner = match &self.0 {
            None => Inner::Native {
                sleep: native_sleep(at),
            },
            Some(timer) => Inner::Custom {
                sleep: timer.sleep_until(at),
            },
        };
        Box::pin(Sleep {
            clock: self.clone(),
            inner,
        })
    }
}

/// The default monotonic clock's time now: tokio's (paused time included) under the
/// `tokio` feature, else the platform's; JavaScript's on `wasm32-unknown-unknown`.
#[inline]
#[allow(clippy::disallowed_methods)] // the seam itself
pub(crate) fn default_now() -> Instant {
    #[cfg(all(
        feature = "tokio",
        not(all(target_arch = "wasm32", target_os = "unknown"))
    ))]
    {
        tokio::time::Instant::now().into_std()
    }
    #[cfg(not(all(
        feature = "tokio",
        not(all(target_arch = "wasm32", target_os = "unknown"))
    )))]
    {
        Instant::now()
    }
}

/// The platform's monotonic clock (tokio's paused time does not move it).
#[cfg(feature = "test-util")]
#[allow(clippy::disallowed_methods)] // the seam itself
fn real_now() -> Instant {
    Instant::now()
}

/// The platform's wall clock: JavaScript's `Date.now()` on `wasm32-unknown-unknown`, as a
/// std `SystemTime`.
#[allow(clippy::disallowed_methods)] // the seam itself
pub(crate) fn system_wall_now() -> SystemTime {
    #[cfg(not(all(target_arch = "wasm32", target_os = "unknown")))]
    {
        SystemTime::now()
    }
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    {
        use web_time::web::SystemTimeExt as _;
        web_time::SystemTime::now().to_std()
    }
}

#[cfg(all(
    feature = "tokio",
    not(all(target_arch = "wasm32", target_os = "unknown"))
))]
type Native = tokio::time::Sleep;

#[cfg(all(
    feature = "tokio",
    not(all(target_arch = "wasm32", target_os = "unknown"))
))]
#[allow(clippy::disallowed_methods)] // the seam itself
fn native_sleep(at: Instant) -> Native {
    tokio::time::sleep_until(at.into())
}

#[cfg(all(feature = "wasm", target_arch = "wasm32", target_os = "unknown"))]
type Native = js::JsSleep;

#[cfg(all(feature = "wasm", target_arch = "wasm32", target_os = "unknown"))]
fn native_sleep(at: Instant) -> Native {
    js::JsSleep::new(at)
}

/// Without tokio (or on wasm32 without the `wasm` feature) there is no default sleep: a
/// future that is never made.
#[cfg(not(any(
    all(
        feature = "tokio",
        not(all(target_arch = "wasm32", target_os = "unknown"))
    ),
    all(feature = "wasm", target_arch = "wasm32", target_os = "unknown")
)))]
mod never {
    use super::*;

    pub(super) enum Native {}

    impl Future for Native {
        type Output = ();
        fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
            match *self {}
        }
    }

    impl Native {
        pub(super) fn reset(self: Pin<&mut Self>, _: Instant) {
            match *self {}
        }
    }

    #[cfg(not(all(target_arch = "wasm32", target_os = "unknown")))]
    pub(super) fn native_sleep(_: Instant) -> Native {
        panic!(
            "tower-http-retry has no timer to wait with: enable its `tokio` feature, or give \
             the layer one with `RetryLayer::timer`"
        )
    }

    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    pub(super) fn native_sleep(_: Instant) -> Native {
        panic!(
            "tower-http-retry has no timer to wait with on wasm32: enable its `wasm` feature \
             (JavaScript's `setTimeout`), or give the layer one with `RetryLayer::timer`"
        )
    }
}

#[cfg(not(any(
    all(
        feature = "tokio",
        not(all(target_arch = "wasm32", target_os = "unknown"))
    ),
    all(feature = "wasm", target_arch = "wasm32", target_os = "unknown")
)))]
use never::{Native, native_sleep};

/// The default sleep on wasm32: JavaScript's `setTimeout`, through gloo-timers.
#[cfg(all(feature = "wasm", target_arch = "wasm32", target_os = "unknown"))]
mod js {
    use std::future::Future;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use gloo_timers::future::TimeoutFuture;

    use super::Instant;

    /// setTimeout's longest delay (a signed 32-bit count of milliseconds: a longer one
    /// fires at once). A longer wait re-arms when it fires.
    const MAX_MS: u128 = i32::MAX as u128;

    /// A wait until `at` on JavaScript's clock. The timer is armed at the first poll, for
    /// the milliseconds left (rounded up); when it fires before `at` (its clock and
    /// `performance.now()` round differently, or the wait was longer than one timer), it is
    /// armed again for the rest.
    pub(crate) struct JsSleep {
        at: Instant,
        timeout: Option<TimeoutFuture>,
    }

    impl JsSleep {
        pub(super) fn new(at: Instant) -> Self {
            JsSleep { at, timeout: None }
        }

        pub(super) fn reset(self: Pin<&mut Self>, at: Instant) {
            let this = self.get_mut();
            this.at = at;
            // Dropping the armed timer clears it; the next poll arms one for the new time.
            this.timeout = None;
        }
    }

    impl Future for JsSleep {
        type Output = ();

        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            let this = self.get_mut();
            loop {
                let now = super::default_now();
                if now >= this.at {
                    this.timeout = None;
                    return Poll::Ready(());
                }
                if let Some(timeout) = &mut this.timeout {
                    if Pin::new(timeout).poll(cx).is_pending() {
                        return Poll::Pending;
                    }
                }
                let left = this.at - now;
                let ms = left.as_nanos().div_ceil(1_000_000).min(MAX_MS);
                // At most i32::MAX: the conversion cannot fail.
                this.timeout = Some(TimeoutFuture::new(u32::try_from(ms).unwrap_or(u32::MAX)));
            }
        }
    }
}

pin_project_lite::pin_project! {
    /// A wait on a layer's clock: tokio's sleep (no allocation beyond its box), or the
    /// user's timer's future.
    pub(crate) struct Sleep {
        clock: Clock,
        #[pin]
        inner: Inner,
    }
}

pin_project_lite::pin_project! {
    #[project = InnerProj]
    enum Inner {
        Native { #[pin] sleep: Native },
        Custom { sleep: BoxSleep },
    }
}

impl Sleep {
    /// The clock this sleep waits on.
    #[inline]
    pub(crate) fn clock(&self) -> &Clock {
        &self.clock
    }

    /// Waits until `at` instead.
    pub(crate) fn reset(self: Pin<&mut Self>, at: Instant) {
        let this = self.project();
        match this.inner.project() {
            #[cfg(all(
                feature = "tokio",
                not(all(target_arch = "wasm32", target_os = "unknown"))
            ))]
            InnerProj::Native { sleep } => sleep.reset(at.into()),
            #[cfg(not(all(
                feature = "tokio",
                not(all(target_arch = "wasm32", target_os = "unknown"))
            )))]
            InnerProj::Native { sleep } => sleep.reset(at),
            InnerProj::Custom { sleep } => {
                if let Some(timer) = &this.clock.0 {
                    *sleep = timer.sleep_until(at);
                }
            }
        }
    }
}

impl Future for Sleep {
    type Output = ();

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        match self.project().inner.project() {
            InnerProj::Native { sleep } => sleep.poll(cx),
            InnerProj::Custom { sleep } => sleep.as_mut().poll(cx),
        }
    }
}

#[cfg(feature = "test-util")]
pub use manual::ManualClock;

#[cfg(feature = "test-util")]
mod manual {
    use std::future::Future;
    use std::pin::Pin;
    use std::sync::{Arc, Mutex, PoisonError};
    use std::task::{Context, Poll, Waker};
    use std::time::{Duration, SystemTime};

    use super::{BoxSleep, Instant, Timer};

    /// A [`Timer`] that moves only when a test says so (`test-util` feature): for tests
    /// on targets without tokio's paused time, or with no runtime at all. Its monotonic
    /// clock starts at the platform's time, its wall clock at a fixed date (1.7 × 10^9
    /// seconds after the UNIX epoch, 2023-11-14T22:13:20Z), so that an HTTP-date a test
    /// writes is the same on every run; [`ManualClock::advance`] moves both together and
    /// wakes the sleeps that are then due. Clones share one clock.
    ///
    /// ```
    /// use std::future::Future;
    /// use std::time::{Duration, UNIX_EPOCH};
    /// use tower_http_retry::{ManualClock, RetryLayer, Timer};
    ///
    /// let clock = ManualClock::new();
    /// let layer = RetryLayer::new().timer(clock.clone());
    /// # let _ = layer;
    /// assert_eq!(clock.wall_now(), UNIX_EPOCH + Duration::from_secs(1_700_000_000));
    /// let start = clock.now();
    /// let mut sleep = clock.sleep_until(start + Duration::from_millis(100));
    /// let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    /// assert!(sleep.as_mut().poll(&mut cx).is_pending());
    /// clock.advance(Duration::from_millis(100));
    /// assert!(sleep.as_mut().poll(&mut cx).is_ready());
    /// assert_eq!(clock.now() - start, Duration::from_millis(100));
    /// ```
    #[derive(Clone, Debug)]
    pub struct ManualClock {
        state: Arc<Mutex<State>>,
    }

    #[derive(Debug)]
    struct State {
        now: Instant,
        wall: SystemTime,
        /// The sleeps not yet due when last polled: woken at each advance, to look again.
        wakers: Vec<Waker>,
    }

    impl Default for ManualClock {
        fn default() -> Self {
            Self::new()
        }
    }

    impl ManualClock {
        /// A clock at the platform's monotonic time now and at the fixed wall date, which
        /// moves only by [`ManualClock::advance`].
        pub fn new() -> Self {
            ManualClock {
                state: Arc::new(Mutex::new(State {
                    now: super::real_now(),
                    wall: SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000),
                    wakers: Vec::new(),
                })),
            }
        }

        /// Moves both clocks forward by `by`, and wakes every sleep to look at the time.
        pub fn advance(&self, by: Duration) {
            let wakers = {
                let mut state = self.lock();
                state.now += by;
                state.wall += by;
                std::mem::take(&mut state.wakers)
            };
            for waker in wakers {
                waker.wake();
            }
        }

        fn lock(&self) -> std::sync::MutexGuard<'_, State> {
            self.state.lock().unwrap_or_else(PoisonError::into_inner)
        }
    }

    impl Timer for ManualClock {
        fn now(&self) -> Instant {
            self.lock().now
        }

        fn sleep_until(&self, at: Instant) -> BoxSleep {
            Box::pin(ManualSleep {
                clock: self.clone(),
                at,
            })
        }

        fn wall_now(&self) -> SystemTime {
            self.lock().wall
        }
    }

    struct ManualSleep {
        clock: ManualClock,
        at: Instant,
    }

    impl Future for ManualSleep {
        type Output = ();

        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            let mut state = self.clock.lock();
            if state.now >= self.at {
                return Poll::Ready(());
            }
            if !state.wakers.iter().any(|w| w.will_wake(cx.waker())) {
                state.wakers.push(cx.waker().clone());
            }
            Poll::Pending
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::{Wake, Waker};
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// A waker that counts its wakes.
    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_default_clock_is_tokios_paused_clock() {
        let clock = Clock::default();
        let start = clock.now();
        tokio::time::advance(Duration::from_secs(3_600)).await;
        assert_eq!(clock.now() - start, Duration::from_secs(3_600));
        // And its sleep is tokio's, which paused time fires.
        let mut sleep = clock.sleep_until(start + Duration::from_secs(3_601));
        let mut cx = Context::from_waker(Waker::noop());
        assert!(sleep.as_mut().poll(&mut cx).is_pending());
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(sleep.as_mut().poll(&mut cx).is_ready());
    }

    #[test]
    fn a_manual_sleep_ends_when_the_clock_is_moved_past_it_and_its_waker_is_woken() {
        let manual = ManualClock::new();
        let start = manual.now();
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(Arc::clone(&count));
        let mut cx = Context::from_waker(&waker);
        let mut sleep = manual.sleep_until(start + 10 * MS);
        assert!(sleep.as_mut().poll(&mut cx).is_pending());
        // Polled again with the same waker: registered once.
        assert!(sleep.as_mut().poll(&mut cx).is_pending());
        manual.advance(9 * MS);
        assert_eq!(count.0.load(Ordering::SeqCst), 1, "woken to look again");
        assert!(sleep.as_mut().poll(&mut cx).is_pending());
        // A clone moves the same clock.
        manual.clone().advance(MS);
        assert_eq!(count.0.load(Ordering::SeqCst), 2);
        assert!(sleep.as_mut().poll(&mut cx).is_ready());
        assert_eq!(manual.now() - start, 10 * MS);
        assert_eq!(
            manual.wall_now(),
            UNIX_EPOCH + Duration::from_secs(1_700_000_000) + 10 * MS
        );
    }

    #[test]
    fn a_custom_clocks_sleep_is_reset_on_its_own_timer() {
        let manual = ManualClock::new();
        let clock = Clock::custom(manual.clone());
        let start = clock.now();
        let mut cx = Context::from_waker(Waker::noop());
        let mut sleep = clock.sleep_until(start + 100 * MS);
        sleep.as_mut().reset(start + 10 * MS);
        assert!(sleep.as_mut().poll(&mut cx).is_pending());
        manual.advance(10 * MS);
        assert!(sleep.as_mut().poll(&mut cx).is_ready());
        assert_eq!(sleep.clock().now(), manual.now());
        assert_eq!(clock.wall_now(), manual.wall_now());
        // Moved later again: pending until the clock gets there.
        sleep.as_mut().reset(start + 20 * MS);
        assert!(sleep.as_mut().poll(&mut cx).is_pending());
        manual.advance(10 * MS);
        assert!(sleep.as_mut().poll(&mut cx).is_ready());
    }
}
