// Gates: what may stop a retry the policy allows. Every kind of gate is one state type
// implementing `Kind` (its settings, their validation, its state's partitions, and what it
// hears and answers), a public handle around it (`RetryBudget`, `Throttle`, `RetryQuota`),
// and one line in `kinds!` below. Everything else is shared: the builder (`GateBuilder`),
// the validation of amounts (`amount_units`), the per-authority partitions
// (`partition.rs`), the set of gates a policy holds (`GateSet`) and the gates of one request
// (`Gates`).
//
// What a gate hears and answers, in the order of a request:
// - `on_request`: a logical request starts (the ratio budget deposits);
// - `admit`: asked before each retry, hedge or transparent retry, and, for a kind that
//   paces first attempts (`ASKS_FIRST`), before the first attempt too; it admits (having
//   taken what it charges, and possibly asking the attempt to wait longer), or refuses;
// - `release`: another gate refused, or the wait it asked for does not fit the deadline,
//   or the request was dropped while waiting: it gets back what it took for that attempt
//   (and, for a kind that counts what is in flight, for a retry the request ended before
//   sending: the `Presence` keeps what it took until the retry is sent);
// - `on_attempt_start` and `on_attempt_end`, and `on_request_end`, for a kind that counts
//   what is in flight (`HEARS_FLIGHT`): each attempt sent, and its end (an outcome, or
//   dropped: at the deadline, by a hedge that won, or with the request); then the
//   request's end (answered, failed, or dropped by its caller). A `Presence` owned by the
//   response future says them, so that dropping the future says them too;
// - `on_outcome`: an attempt's outcome (a success, a failure of some kind, or neither),
//   with what the kind took for the request's last retry (a quota refunds it on success);
//   a failure may make it refuse any retry after it (the throttle).
// The kinds use the parts they need: the adaptive limiter and the adaptive throttle are
// asked before first attempts (and hear every outcome); the concurrency budget counts what
// is in flight (the test-only `Pacer` does both, to check the driver's paths). A first
// attempt a gate asks to wait waits in the response future, holding the service
// `poll_ready` readied (the `Retry` keeps a clone in its place), and is sent when the wait
// ends.
//
// - `RetryBudget` (request-driven, the SRE book's): a request deposits `ratio`, a retry
//   withdraws one token or is refused, the bucket refills `min_per_sec` per second.
// - `Throttle` (failure-driven, gRPC's A6): a failure takes a token, a success gives
//   `token_ratio` back, and no retry is allowed while half or less is left.
// - `RetryQuota` (cost-weighted, the AWS SDKs' standard mode): a retry costs tokens by the
//   failure it follows, a success refunds its request's last retry, or, on a first try,
//   adds a reward.
// - `AdaptiveLimiter` (rate, the AWS SDKs' adaptive mode): off until a throttled outcome,
//   then every attempt, first ones included, takes a token from a bucket whose fill rate
//   follows CUBIC, and waits for it (or is refused past `max_wait`).
// - `AdaptiveThrottle` (client-side throttling, the SRE book's): every attempt is rejected
//   locally with a probability that grows as throttles outnumber accepts in a window.
// - `ConcurrencyBudget` (concurrency, Envoy's retry budget): the retries and hedges in
//   flight are at most a share of the requests in flight, or a floor.
//
// A request carries a `Ticket` from its first retry on: what its last retry took from each
// kind, so that a gate that refunds on success (a cost-weighted quota) can give back
// exactly that.

// The gate machinery below is `pub` where the public `Gate` trait names it (its sealed
// supertrait, the kinds' states and settings, what they hear and answer), yet unnameable
// outside the crate: the modules are private.
#![allow(unreachable_pub)]

mod adaptive;
mod adaptive_throttle;
mod bucket;
mod budget;
mod clock;
mod concurrency;
#[cfg(test)]
pub(crate) mod pacer;
mod partition;
// The per-authority partitions through the layer: how many a gate tracks is crate-private.
#[cfg(all(test, not(tower_http_retry_loom)))]
mod partition_tests;
mod quota;
mod throttle;

pub use self::adaptive::AdaptiveLimiter;
pub use self::adaptive_throttle::AdaptiveThrottle;
pub use self::budget::RetryBudget;
pub use self::concurrency::ConcurrencyBudget;
pub use self::quota::RetryQuota;
pub use self::throttle::Throttle;

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use self::bucket::UNITS_PER_TOKEN;
use self::clock::GateClock;
use self::partition::{AuthorityKey, Part, Scoped};
use crate::classify::{Classification, FailureKind};
use crate::error::InvalidConfig;
use crate::info::StopReason;
use crate::time::Clock;

/// A gate that a policy's retries pass: [`RetryBudget`], [`Throttle`] or [`RetryQuota`], or,
/// counting what is in flight, [`ConcurrencyBudget`]; or that every attempt passes, first
/// attempts included: [`AdaptiveLimiter`] or [`AdaptiveThrottle`].
/// Give one to a policy with [`RetryPolicy::gate`](crate::RetryPolicy::gate); every clone of
/// a gate shares its state, so one gate given to several policies, layers or clients bounds
/// their retries together.
///
/// Each kind is built the same way, `Kind::builder()`, its settings, then
/// [`build`](GateBuilder::build), and each can keep its state per server
/// ([`GateBuilder::per_authority`]).
///
/// A gate that measures time (a budget's refill, the adaptive limiter's rate, the adaptive
/// throttle's window, a per-server gate's look for a server's place to give up) reads the
/// clock of the first layer that makes a service with it: that layer's
/// [`timer`](crate::RetryLayer::timer), or the default (tokio's). It keeps that clock: a
/// gate shared by layers on different timers follows the first, so give layers that share
/// a gate the same timer. A gate used on its own before any layer (tower's `Budget`) keeps
/// the default clock; reading one ([`RetryBudget::tokens`]) sets nothing.
///
/// The kinds are this crate's own; the trait cannot be implemented elsewhere.
pub trait Gate: sealed::Sealed + Clone + fmt::Debug + Send + Sync + 'static {
    /// The state this gate keeps for requests to the server `uri` names: for a gate kept
    /// per authority, that authority's (made full if it had none); else, and for a URI
    /// without an authority, the gate's own. A handle on the state, as the gate is, for
    /// reading it (`tokens()`).
    ///
    /// ```
    /// use tower_http_retry::{Gate, RetryBudget};
    ///
    /// let budget = RetryBudget::builder().per_authority().build();
    /// let uri: http::Uri = "https://api.example.com/v1/orders".parse().unwrap();
    /// assert_eq!(budget.partition(&uri).tokens(), 100.0); // full until its first retry
    /// ```
    #[must_use]
    fn partition(&self, uri: &http::Uri) -> Self {
        Self::from_scoped(self.scoped().partition_of(AuthorityKey::of_uri(uri)))
    }
}

pub(crate) mod sealed {
    use super::{AnyGate, Kind, Scoped};

    /// What makes a handle a gate: its kind's state, and its place in the registry. Public
    /// in a private module, so that [`Gate`](super::Gate) can be named but not implemented
    /// outside the crate.
    pub trait Sealed: Sized {
        /// The state behind the handle.
        type Kind: Kind;
        /// The handle's state.
        fn scoped(&self) -> &Scoped<Self::Kind>;
        /// A handle on `state`.
        fn from_scoped(state: Scoped<Self::Kind>) -> Self;
        /// The handle as one gate of any kind.
        fn into_any(self) -> AnyGate;
    }
}

/// One kind of gate: its settings, and the state they make. The state is shared by every
/// clone of the handle, and, for a gate kept per authority, one per server.
pub trait Kind: Sized + Send + Sync + 'static {
    /// What the builder collects.
    type Settings: Clone + Copy + fmt::Debug + PartialEq + Send + Sync;
    /// The kind's name in error messages ("retry budget").
    const NAME: &'static str;
    /// Whether the kind wants to hear outcomes (else a success needs no telling).
    const HEARS_OUTCOMES: bool;
    /// Whether the kind is asked before first attempts too ([`Ask::First`]).
    const ASKS_FIRST: bool = false;
    /// Whether the kind hears attempts start and end, and requests end.
    const HEARS_FLIGHT: bool = false;
    /// The settings of `Handle::builder()`.
    fn defaults() -> Self::Settings;
    /// The kind's own rules for its settings: `Err` with what is wrong, naming the setting.
    fn check(settings: &Self::Settings) -> Result<(), String>;
    /// A full state of `settings`, which [`Kind::check`] accepted, reading the time (if it
    /// does) on `clock`, its gate's, which it keeps.
    fn full(settings: &Self::Settings, clock: &GateClock) -> Self;
    /// The clock the state reads, for a kind that reads the time.
    fn clock(&self) -> Option<&GateClock> {
        None
    }
    /// A full state with this one's settings.
    fn fresh(&self) -> Self;
    /// A state with this one's settings, and its balance now (a partition made from the
    /// overflow's state starts where the overflow is).
    fn successor(&self) -> Self;
    /// Whether the state is back where it started, so that making it again changes nothing.
    fn at_rest(&self) -> bool;

    /// A logical request under this gate starts.
    fn on_request(&self) {}
    /// Asked before a retry (of any kind) is sent, and before a first attempt for an
    /// [`Kind::ASKS_FIRST`] kind: admit, having taken what it charges (`taken`: `None` when
    /// the kind has no part in this attempt, else what a later [`Kind::release`] or success
    /// gives back), possibly asking the attempt to wait longer; or refuse, saying why.
    fn admit(&self, ask: Ask) -> Admission {
        let _ = ask;
        Admission::ADMIT
    }
    /// An attempt this kind admitted is not sent after all: `taken` goes back. A
    /// [`Kind::HEARS_FLIGHT`] kind also hears this for a retry its request never sent
    /// (the request ended first); such a kind must take something (`Some`) for every
    /// retry and hedge it admits.
    fn release(&self, taken: u64) {
        let _ = taken;
    }
    /// An attempt, asked for as `ask`, is sent ([`Kind::HEARS_FLIGHT`] kinds only).
    fn on_attempt_start(&self, ask: Ask) {
        let _ = ask;
    }
    /// An attempt that started as `ask` ended: its outcome came, or it was dropped.
    fn on_attempt_end(&self, ask: Ask) {
        let _ = ask;
    }
    /// A logical request under this gate ended: answered, failed, or dropped.
    fn on_request_end(&self) {}
    /// An attempt ended with this outcome; `last` is what this kind took for the
    /// request's last retry (`None` before one). `Err` refuses any retry after it.
    fn on_outcome(&self, heard: Heard, last: Option<u64>) -> Result<(), StopReason> {
        let _ = (heard, last);
        Ok(())
    }
}

macro_rules! opaque_debug {
    ($($ty:ty),*) => {
        $(impl fmt::Debug for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_struct(stringify!($ty)).finish_non_exhaustive()
            }
        })*
    };
}

// The states are shown through their handles.
opaque_debug!(
    adaptive::Adaptive,
    adaptive_throttle::Shedding,
    budget::Budget,
    concurrency::Concurrency,
    quota::Quota,
    throttle::ThrottleState
);
#[cfg(test)]
opaque_debug!(pacer::PacerState);

impl<I> fmt::Debug for Scoped<I> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Scoped").finish_non_exhaustive()
    }
}

impl<K: Kind> Part for Arc<K> {
    fn fresh(&self) -> Self {
        Arc::new(K::fresh(self))
    }

    fn successor(&self) -> Self {
        Arc::new(K::successor(self))
    }

    fn at_rest(&self) -> bool {
        // Held by nothing but the map.
        Arc::strong_count(self) == 1 && K::at_rest(self)
    }
}

// The registry: one line per kind, in the order in which they are asked (the throttle,
// which only looks, before those that take tokens).
macro_rules! kinds {
    ($($name:ident($handle:ty: $state:ty)),* $(,)?) => {
        /// One gate of any kind.
        #[derive(Clone, Debug)]
        pub enum AnyGate {
            $(
                #[doc = concat!("A [`", stringify!($handle), "`].")]
                $name($handle),
            )*
        }

        /// A kind's place in the registry.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
        enum Id {
            $($name,)*
        }

        /// How many kinds there are.
        const KINDS: usize = [$(Id::$name),*].len();

        $(
            impl sealed::Sealed for $handle {
                type Kind = $state;

                fn scoped(&self) -> &Scoped<Self::Kind> {
                    &self.inner
                }

                fn from_scoped(inner: Scoped<Self::Kind>) -> Self {
                    Self { inner }
                }

                fn into_any(self) -> AnyGate {
                    AnyGate::$name(self)
                }
            }

            impl Gate for $handle {}
        )*

        impl AnyGate {
            fn id(&self) -> Id {
                match self {
                    $(AnyGate::$name(_) => Id::$name,)*
                }
            }

            fn is_per_authority(&self) -> bool {
                match self {
                    $(AnyGate::$name(gate) => gate.inner.is_per_authority(),)*
                }
            }

            fn hears_outcomes(&self) -> bool {
                match self {
                    $(AnyGate::$name(_) => <$state as Kind>::HEARS_OUTCOMES,)*
                }
            }

            fn asks_first(&self) -> bool {
                match self {
                    $(AnyGate::$name(_) => <$state as Kind>::ASKS_FIRST,)*
                }
            }

            fn hears_flight(&self) -> bool {
                match self {
                    $(AnyGate::$name(_) => <$state as Kind>::HEARS_FLIGHT,)*
                }
            }

            fn on_attempt_start(&self, ask: Ask) {
                match self {
                    $(AnyGate::$name(gate) => gate.inner.on_attempt_start(ask),)*
                }
            }

            fn on_attempt_end(&self, ask: Ask) {
                match self {
                    $(AnyGate::$name(gate) => gate.inner.on_attempt_end(ask),)*
                }
            }

            fn on_request_end(&self) {
                match self {
                    $(AnyGate::$name(gate) => gate.inner.on_request_end(),)*
                }
            }

            fn bind(&self, clock: &Clock) {
                match self {
                    $(AnyGate::$name(gate) => gate.inner.bind(clock),)*
                }
            }

            fn partition_of(&self, key: Option<&AuthorityKey>) -> AnyGate {
                match self {
                    $(AnyGate::$name(gate) => AnyGate::$name(<$handle as sealed::Sealed>::from_scoped(
                        gate.inner.partition_of(key.cloned()),
                    )),)*
                }
            }

            #[inline]
            fn on_request(&self) {
                match self {
                    $(AnyGate::$name(gate) => gate.inner.on_request(),)*
                }
            }

            fn admit(&self, ask: Ask) -> Admission {
                match self {
                    $(AnyGate::$name(gate) => gate.inner.admit(ask),)*
                }
            }

            fn release(&self, taken: u64) {
                match self {
                    $(AnyGate::$name(gate) => gate.inner.release(taken),)*
                }
            }

            fn on_outcome(&self, heard: Heard, last: Option<u64>) -> Result<(), StopReason> {
                match self {
                    $(AnyGate::$name(gate) => gate.inner.on_outcome(heard, last),)*
                }
            }
        }
    };
}

#[cfg(not(test))]
kinds!(
    Throttle(Throttle: throttle::ThrottleState),
    Shedding(AdaptiveThrottle: adaptive_throttle::Shedding),
    Adaptive(AdaptiveLimiter: adaptive::Adaptive),
    Quota(RetryQuota: quota::Quota),
    Budget(RetryBudget: budget::Budget),
    Concurrency(ConcurrencyBudget: concurrency::Concurrency),
);
// Tests add a kind that asks retries to wait, to check the paths no kind of today takes.
#[cfg(test)]
kinds!(
    Throttle(Throttle: throttle::ThrottleState),
    Shedding(AdaptiveThrottle: adaptive_throttle::Shedding),
    Adaptive(AdaptiveLimiter: adaptive::Adaptive),
    Quota(RetryQuota: quota::Quota),
    Budget(RetryBudget: budget::Budget),
    Concurrency(ConcurrencyBudget: concurrency::Concurrency),
    Pacer(pacer::Pacer: pacer::PacerState),
);

/// Builds a gate of kind `G`: `RetryBudget::builder()`, `Throttle::builder()`,
/// `RetryQuota::builder()`, `ConcurrencyBudget::builder()`, `AdaptiveLimiter::builder()` and
/// `AdaptiveThrottle::builder()` start one with the kind's defaults. The settings every kind has
/// are here; each kind's own are on `GateBuilder<ThatKind>`.
///
/// Every amount of tokens is an `f64`, kept in thousandths of a token (finer fractions are
/// rounded down).
///
/// ```
/// use tower_http_retry::{RetryBudget, RetryQuota, Throttle};
///
/// let budget = RetryBudget::builder().ratio(0.2).max_tokens(50.0).build();
/// let throttle = Throttle::builder().max_tokens(10.0).token_ratio(0.1).per_authority().build();
/// let quota = RetryQuota::builder().max_tokens(500.0).retry_cost(5.0).build();
/// # let _ = (budget, throttle, quota);
/// ```
#[must_use = "a builder does nothing until it is built"]
pub struct GateBuilder<G: Gate> {
    settings: <G::Kind as Kind>::Settings,
    authorities: Option<usize>,
    kind: PhantomData<fn() -> G>,
}

impl<G: Gate> GateBuilder<G> {
    pub(crate) fn new() -> Self {
        GateBuilder {
            settings: <G::Kind as Kind>::defaults(),
            authorities: None,
            kind: PhantomData,
        }
    }

    /// Keeps one state per authority (the request URI's scheme, host and port; in origin
    /// form, its `Host` header) instead of one for every request, so that a failing server
    /// spends its own retries and not those the others need. At most 1 024 authorities are
    /// tracked ([`max_authorities`](Self::max_authorities)); a server's state is forgotten
    /// only once it is back where it started, and when every place is taken, further
    /// authorities share one overflow state. Requests with no authority share the gate's
    /// own.
    ///
    /// ```
    /// use tower_http_retry::{Gate, RetryBudget};
    ///
    /// let budget = RetryBudget::builder().max_tokens(2.0).min_per_sec(0.0).per_authority().build();
    /// let failing: http::Uri = "https://a.example/".parse().unwrap();
    /// let healthy: http::Uri = "https://b.example/".parse().unwrap();
    /// assert_eq!(budget.partition(&failing).tokens(), 2.0);
    /// assert_eq!(budget.partition(&healthy).tokens(), 2.0);
    /// ```
    pub fn per_authority(mut self) -> Self {
        self.authorities
            .get_or_insert(partition::DEFAULT_MAX_AUTHORITIES);
        self
    }

    /// Keeps one state per authority, as [`per_authority`](Self::per_authority), for at
    /// most `max` authorities (at least 1).
    ///
    /// ```
    /// use tower_http_retry::Throttle;
    ///
    /// let throttle = Throttle::builder().max_authorities(64).build();
    /// # let _ = throttle;
    /// ```
    pub fn max_authorities(mut self, max: usize) -> Self {
        self.authorities = Some(max);
        self
    }

    /// The gate, full.
    ///
    /// # Panics
    ///
    /// When a setting is out of range; the message names it. [`try_build`](Self::try_build)
    /// returns the error instead.
    #[track_caller]
    pub fn build(self) -> G {
        match self.try_build() {
            Ok(gate) => gate,
            Err(error) => panic!("{error}"),
        }
    }

    /// The gate, or an error that names the setting out of range, for settings read from
    /// configuration.
    ///
    /// ```
    /// use tower_http_retry::RetryBudget;
    ///
    /// let error = RetryBudget::builder().max_tokens(0.0).try_build().unwrap_err();
    /// assert_eq!(
    ///     error.to_string(),
    ///     "invalid retry budget: max_tokens is 0; it must be at least 0.001",
    /// );
    /// ```
    pub fn try_build(self) -> Result<G, InvalidConfig> {
        let name = <G::Kind as Kind>::NAME;
        let invalid = |message: String| InvalidConfig::new(format!("invalid {name}: {message}"));
        <G::Kind as Kind>::check(&self.settings).map_err(invalid)?;
        if self.authorities == Some(0) {
            return Err(invalid(
                "max_authorities is 0; it must be at least 1".to_string(),
            ));
        }
        let clock = GateClock::default();
        let state = <G::Kind as Kind>::full(&self.settings, &clock);
        Ok(G::from_scoped(Scoped::new(state, self.authorities, clock)))
    }
}

impl<G: Gate> Clone for GateBuilder<G> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<G: Gate> Copy for GateBuilder<G> {}

impl<G: Gate> PartialEq for GateBuilder<G> {
    fn eq(&self, other: &Self) -> bool {
        self.settings == other.settings && self.authorities == other.authorities
    }
}

impl<G: Gate> fmt::Debug for GateBuilder<G> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GateBuilder")
            .field("settings", &self.settings)
            .field("max_authorities", &self.authorities)
            .finish()
    }
}

/// An amount of tokens in thousandths ("units"): finite, not negative, at most `max_units`;
/// a positive amount below a thousandth is refused (it would be none). Finer fractions are
/// rounded down, except floating-point noise (1.001 is stored a hair below itself), which
/// is taken as the thousandth that was meant. The one check of every amount a gate takes.
pub(crate) fn amount_units(name: &str, value: f64, max_units: u64) -> Result<u64, String> {
    let max = max_units as f64 / UNITS_PER_TOKEN as f64;
    if !value.is_finite() || value < 0.0 {
        return Err(format!(
            "{name} is {value}; it must be a finite number from 0 to {max}"
        ));
    }
    if value > max {
        return Err(format!("{name} is {value}; it must be at most {max}"));
    }
    let scaled = value * UNITS_PER_TOKEN as f64;
    let nearest = scaled.round();
    let units = if (scaled - nearest).abs() <= 4.0 * f64::EPSILON * nearest.max(1.0) {
        nearest
    } else {
        scaled.floor()
    };
    if units == 0.0 && value > 0.0 {
        return Err(format!(
            "{name} is {value}; a positive amount must be at least 0.001, since gates count \
             thousandths of a token"
        ));
    }
    // In range: 0 <= units <= max_units.
    Ok(units as u64)
}

/// [`amount_units`] for an amount that must not be zero.
pub(crate) fn positive_units(name: &str, value: f64, max_units: u64) -> Result<u64, String> {
    match amount_units(name, value, max_units)? {
        0 => Err(format!("{name} is {value}; it must be at least 0.001")),
        units => Ok(units),
    }
}

/// Tokens from units.
pub(crate) fn tokens(units: u64) -> f64 {
    units as f64 / UNITS_PER_TOKEN as f64
}

/// What one outcome was, for the gates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Heard {
    Success,
    Failure(FailureKind),
    /// Final, but neither a success nor a failure (a 404, an unrecognised error).
    Neither,
}

impl Heard {
    pub(crate) fn of(verdict: Classification) -> Self {
        match verdict {
            Classification::Success => Heard::Success,
            Classification::Done => Heard::Neither,
            other => match other.reason() {
                Some(reason) => Heard::Failure(reason.kind()),
                None => Heard::Neither,
            },
        }
    }
}

/// What a gate is asked to admit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ask {
    /// A request's first attempt (asked of [`Kind::ASKS_FIRST`] kinds only).
    First,
    /// A retry after a failure of this kind.
    Retry(FailureKind),
    /// A hedge, paid for as a retry after a failure of this kind would be.
    Hedge(FailureKind),
    /// A transparent retry: the server never saw the attempt before it.
    Transparent,
}

/// A gate's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Go ahead, no sooner than `wait` from now; `taken` is what the gate took for it
    /// (`None`: it has no part in this retry).
    Admit { taken: Option<u64>, wait: Duration },
    /// No retry, for this reason.
    Refuse(StopReason),
}

impl Admission {
    /// Admitted at once, nothing taken.
    pub(crate) const ADMIT: Admission = Admission::Admit {
        taken: None,
        wait: Duration::ZERO,
    };

    /// Admitted at once, `units` taken.
    pub(crate) fn took(units: u64) -> Admission {
        Admission::Admit {
            taken: Some(units),
            wait: Duration::ZERO,
        }
    }
}

impl Ask {
    /// What the attempt a retry record books was asked as.
    pub(crate) fn of_retry(kind: crate::hook::AttemptKind, reason: FailureKind) -> Ask {
        match kind {
            crate::hook::AttemptKind::First => Ask::First,
            crate::hook::AttemptKind::Transparent => Ask::Transparent,
            crate::hook::AttemptKind::Hedge => Ask::Hedge(reason),
            crate::hook::AttemptKind::Retry | crate::hook::AttemptKind::Continuation => {
                Ask::Retry(reason)
            }
        }
    }
}

/// What a request's retries took from its gates: each kind's share of its last retry.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Ticket {
    taken: [Option<u64>; KINDS],
}

impl Ticket {
    /// What the kind of `gate` took for the request's last retry that it had a part in.
    fn last(&self, gate: &AnyGate) -> Option<u64> {
        self.taken[gate.id() as usize]
    }
}

/// What the gates took for a retry they all admitted, until it is committed to the
/// request's ticket (it goes ahead) or given back.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Admitted {
    taken: [Option<u64>; KINDS],
    /// The longest wait a gate asked for.
    pub(crate) wait: Duration,
}

/// The gates a policy sets: its own, over those it inherits unless it turned them off.
#[derive(Debug, Clone, Default)]
pub(crate) struct GateSet {
    /// The inherited gates are off ([`RetryPolicy::no_gates`](crate::RetryPolicy::no_gates)).
    off: bool,
    /// The policy's own, at most one of each kind.
    own: Vec<AnyGate>,
}

impl GateSet {
    /// Sets `gate` in place of one of its kind.
    pub(crate) fn set(&mut self, gate: AnyGate) {
        match self.own.iter_mut().find(|own| own.id() == gate.id()) {
            Some(slot) => *slot = gate,
            None => self.own.push(gate),
        }
    }

    /// Whether the inherited gates are off.
    pub(crate) fn is_off(&self) -> bool {
        self.off
    }

    /// The policy's own gates.
    pub(crate) fn own(&self) -> &[AnyGate] {
        &self.own
    }

    /// Turns every inherited gate off, and those set so far.
    pub(crate) fn clear(&mut self) {
        self.off = true;
        self.own.clear();
    }

    /// `over` laid over this set: its own gates replace those of their kinds, and all of
    /// these when it turned the inherited ones off.
    pub(crate) fn then(&self, over: &GateSet) -> GateSet {
        if over.off {
            return over.clone();
        }
        let mut all = self.clone();
        for gate in &over.own {
            all.set(gate.clone());
        }
        all
    }

    /// The gates that apply.
    pub(crate) fn gates(&self) -> Gates {
        Gates::new(self.own.clone())
    }
}

/// The gates of one policy, or of one request (with each per-authority gate's partition),
/// in the registry's order.
#[derive(Debug, Clone, Default)]
pub(crate) struct Gates {
    list: Vec<AnyGate>,
    hears_outcomes: bool,
    asks_first: bool,
    hears_flight: bool,
    partitioned: bool,
}

impl Gates {
    pub(crate) fn new(mut list: Vec<AnyGate>) -> Gates {
        list.sort_by_key(AnyGate::id);
        Gates {
            hears_outcomes: list.iter().any(AnyGate::hears_outcomes),
            asks_first: list.iter().any(AnyGate::asks_first),
            hears_flight: list.iter().any(AnyGate::hears_flight),
            partitioned: list.iter().any(AnyGate::is_per_authority),
            list,
        }
    }

    /// Binds every gate that is not bound yet to `clock`, a layer's: the first layer to
    /// resolve a policy holding a gate gives the gate its clock ([`GateClock`]).
    pub(crate) fn bind(&self, clock: &Clock) {
        for gate in &self.list {
            gate.bind(clock);
        }
    }

    /// Whether a request needs gates of its own ([`Own`]): a gate keeps its state per
    /// authority, or counts what is in flight.
    pub(crate) fn needs_own(&self) -> bool {
        self.partitioned || self.hears_flight
    }

    /// The gates of one request to the server `uri` (or, in origin form, the `Host` header)
    /// names: each per-authority gate's partition for that authority, the others as they
    /// are. Found once per logical request.
    pub(crate) fn for_request(&self, uri: &http::Uri, headers: &http::HeaderMap) -> Gates {
        let key = AuthorityKey::of(uri, headers);
        Gates {
            list: self
                .list
                .iter()
                .map(|gate| gate.partition_of(key.as_ref()))
                .collect(),
            hears_outcomes: self.hears_outcomes,
            asks_first: self.asks_first,
            hears_flight: self.hears_flight,
            partitioned: false,
        }
    }

    /// These gates without the kinds that count what is in flight: for the continuations
    /// of a resumable body, which come after their request ended (no `Presence` follows
    /// them, so such a kind would never hear them end).
    pub(crate) fn without_flight(&self) -> Gates {
        match self.hears_flight {
            true => Gates::new(
                self.list
                    .iter()
                    .filter(|gate| !gate.hears_flight())
                    .cloned()
                    .collect(),
            ),
            false => self.clone(),
        }
    }

    /// A logical request starts: it is the client's traffic, retried or not.
    #[inline]
    pub(crate) fn on_request(&self) {
        for gate in &self.list {
            gate.on_request();
        }
    }

    /// Whether any gate wants to hear of outcomes, successes included (else an outcome
    /// needs no telling).
    pub(crate) fn hears_outcomes(&self) -> bool {
        self.hears_outcomes
    }

    /// Whether any gate is asked before a first attempt.
    pub(crate) fn asks_first(&self) -> bool {
        self.asks_first
    }

    /// Whether any gate counts what is in flight (a request then needs a [`Presence`]).
    pub(crate) fn hears_flight(&self) -> bool {
        self.hears_flight
    }

    /// Tells every gate of an outcome that was not a transparent retry's (the server never
    /// saw that one), once per outcome. `Err` when a gate refuses any retry after it.
    /// `ticket` is what this request's retries took so far (none before a first retry).
    pub(crate) fn on_outcome(
        &self,
        heard: Heard,
        ticket: Option<&Ticket>,
    ) -> Result<(), StopReason> {
        let mut verdict = Ok(());
        for gate in &self.list {
            let last = ticket.and_then(|ticket| ticket.last(gate));
            if let Err(refused) = gate.on_outcome(heard, last) {
                verdict = verdict.and(Err(refused));
            }
        }
        verdict
    }

    /// Asks every gate, in order, for an attempt everything else allows (a first attempt
    /// only of the gates that pace them). When one refuses, those before it give back what
    /// they took.
    pub(crate) fn admit(&self, ask: Ask) -> Result<Admitted, StopReason> {
        let mut admitted = Admitted {
            taken: [None; KINDS],
            wait: Duration::ZERO,
        };
        for (i, gate) in self.list.iter().enumerate() {
            if ask == Ask::First && !gate.asks_first() {
                continue;
            }
            match gate.admit(ask) {
                Admission::Admit { taken, wait } => {
                    admitted.taken[gate.id() as usize] = taken;
                    admitted.wait = admitted.wait.max(wait);
                }
                Admission::Refuse(reason) => {
                    self.release_upto(&admitted, i);
                    return Err(reason);
                }
            }
        }
        Ok(admitted)
    }

    /// The retry the gates admitted goes ahead: what it took is the request's last.
    pub(crate) fn commit(&self, admitted: &Admitted, ticket: &mut Ticket) {
        for (slot, taken) in ticket.taken.iter_mut().zip(admitted.taken) {
            if taken.is_some() {
                *slot = taken;
            }
        }
    }

    /// The retry the gates admitted is not sent: every gate gets back what it took.
    pub(crate) fn release(&self, admitted: &Admitted) {
        self.release_upto(admitted, self.list.len());
    }

    fn release_upto(&self, admitted: &Admitted, end: usize) {
        for gate in &self.list[..end] {
            if let Some(taken) = admitted.taken[gate.id() as usize] {
                gate.release(taken);
            }
        }
    }
}

/// What the gates took for a first attempt that waits before it is sent: given back if it
/// never is (the request dropped during the wait), else spent.
pub(crate) struct Reserved {
    gates: Gates,
    admitted: Option<Admitted>,
}

impl Reserved {
    pub(crate) fn new(gates: &Gates, admitted: Admitted) -> Reserved {
        Reserved {
            gates: gates.clone(),
            admitted: Some(admitted),
        }
    }

    /// The attempt is sent: what was taken for it stays taken.
    pub(crate) fn spend(mut self) {
        self.admitted = None;
    }
}

impl Drop for Reserved {
    fn drop(&mut self) {
        if let Some(admitted) = self.admitted.take() {
            self.gates.release(&admitted);
        }
    }
}

impl fmt::Debug for Reserved {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reserved").finish_non_exhaustive()
    }
}

/// What one request keeps of its gates beyond its plan's, made (and boxed) only for a
/// request that needs any: each per-authority gate's partition for its server, and its
/// presence in the gates that count what is in flight.
#[derive(Debug)]
pub(crate) struct Own {
    partition: Option<Gates>,
    presence: Option<Presence>,
}

impl Own {
    /// Drops a request's own gates out of line: a request without them (most) pays a test.
    #[cold]
    #[inline(never)]
    pub(crate) fn end(own: Box<Own>) {
        drop(own);
    }

    /// Tells the request to its gates (`plan`'s, or their partitions for the server `uri`,
    /// or in origin form the `Host` header, names), and keeps what it needs of them.
    #[cold]
    #[inline(never)]
    pub(crate) fn start(plan: &Gates, uri: &http::Uri, headers: &http::HeaderMap) -> Box<Own> {
        let partition = plan.partitioned.then(|| plan.for_request(uri, headers));
        let gates = partition.as_ref().unwrap_or(plan);
        gates.on_request();
        let presence = gates.hears_flight.then(|| Presence {
            gates: gates.clone(),
            out: Vec::new(),
            unsent: None,
        });
        Box::new(Own {
            partition,
            presence,
        })
    }

    /// The request's gates: its own partitions, else its plan's.
    #[inline]
    pub(crate) fn gates<'a>(own: &'a Option<Box<Own>>, plan: &'a Gates) -> &'a Gates {
        match own.as_deref() {
            Some(Own {
                partition: Some(partition),
                ..
            }) => partition,
            _ => plan,
        }
    }

    /// The request's place in the gates that count what is in flight, if one does.
    pub(crate) fn presence(own: &mut Option<Box<Own>>) -> Option<&mut Presence> {
        own.as_deref_mut().and_then(|own| own.presence.as_mut())
    }

    /// Whether the request is counted in flight.
    pub(crate) fn counted(own: &Option<Box<Own>>) -> bool {
        own.as_deref().is_some_and(|own| own.presence.is_some())
    }
}

/// A request's place in the gates that count what is in flight ([`Kind::HEARS_FLIGHT`]):
/// the attempts it has out, and itself. It goes where the request goes; dropped (the
/// request answered, failed, or dropped by its caller), it ends every attempt still out,
/// then the request, so that no count is left behind whatever becomes of the future.
pub(crate) struct Presence {
    gates: Gates,
    /// The attempts out: each one's number, and what it was asked as.
    out: Vec<(u32, Ask)>,
    /// What the gates took for the retry or hedge they admitted last, until it is sent.
    unsent: Option<Ticket>,
}

impl Presence {
    /// The gates admitted a retry or hedge, and `ticket` holds what each took for it: if
    /// the request ends before it is sent (dropped during its backoff, or its service never
    /// ready), the kinds that count what is in flight get that back (the others keep it
    /// spent, as a retry decided is paid for).
    pub(crate) fn admitted(&mut self, ticket: &Ticket) {
        self.unsent = Some(*ticket);
    }

    /// Attempt `number`, asked for as `ask`, is sent.
    pub(crate) fn started(&mut self, number: u32, ask: Ask) {
        self.unsent = None;
        self.out.push((number, ask));
        for gate in &self.gates.list {
            gate.on_attempt_start(ask);
        }
    }

    /// Attempt `number` ended (its outcome came, or it was dropped); once per attempt.
    pub(crate) fn ended(&mut self, number: u32) {
        if let Some(i) = self.out.iter().position(|(n, _)| *n == number) {
            let (_, ask) = self.out.swap_remove(i);
            for gate in &self.gates.list {
                gate.on_attempt_end(ask);
            }
        }
    }
}

impl Drop for Presence {
    fn drop(&mut self) {
        if let Some(ticket) = self.unsent.take() {
            for gate in self.gates.list.iter().filter(|gate| gate.hears_flight()) {
                if let Some(taken) = ticket.last(gate) {
                    gate.release(taken);
                }
            }
        }
        for (_, ask) in std::mem::take(&mut self.out) {
            for gate in &self.gates.list {
                gate.on_attempt_end(ask);
            }
        }
        for gate in &self.gates.list {
            gate.on_request_end();
        }
    }
}

impl fmt::Debug for Presence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Presence")
            .field("out", &self.out)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::sealed::Sealed;
    use super::*;
    use crate::classify::RetryReason;
    use http::StatusCode;

    const S503: RetryReason = RetryReason::Status(StatusCode::SERVICE_UNAVAILABLE);

    fn gates(list: Vec<AnyGate>) -> Gates {
        Gates::new(list)
    }

    fn ask_retry(gates: &Gates, ticket: &mut Ticket) -> Result<Duration, StopReason> {
        let admitted = gates.admit(Ask::Retry(FailureKind::Transient))?;
        gates.commit(&admitted, ticket);
        Ok(admitted.wait)
    }

    #[test]
    fn outcomes_are_heard_by_their_verdict() {
        assert_eq!(Heard::of(Classification::Success), Heard::Success);
        assert_eq!(Heard::of(Classification::Done), Heard::Neither);
        let transient = Heard::Failure(FailureKind::Transient);
        assert_eq!(Heard::of(Classification::Retry(S503)), transient);
        assert_eq!(Heard::of(Classification::RetryOnce(S503)), transient);
        assert_eq!(Heard::of(Classification::Stop(S503)), transient);
        let too_many = RetryReason::Status(StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(
            Heard::of(Classification::Retry(too_many)),
            Heard::Failure(FailureKind::Throttling)
        );
        assert_eq!(
            Heard::of(Classification::Retry(RetryReason::Custom("x"))),
            Heard::Failure(FailureKind::Other)
        );
    }

    #[test]
    fn the_budget_is_paid_on_request_and_on_retry_and_hears_no_outcome() {
        let budget = RetryBudget::builder()
            .ratio(0.5)
            .min_per_sec(0.0)
            .max_tokens(1.0)
            .build();
        let gates = gates(vec![budget.clone().into_any()]);
        assert!(!gates.hears_outcomes());
        let mut ticket = Ticket::default();
        assert_eq!(ask_retry(&gates, &mut ticket), Ok(Duration::ZERO));
        assert_eq!(ticket.taken[Id::Budget as usize], Some(1_000));
        assert_eq!(
            ask_retry(&gates, &mut ticket),
            Err(StopReason::BudgetExhausted)
        );
        for heard in [Heard::Success, Heard::Failure(FailureKind::Transient)] {
            assert_eq!(gates.on_outcome(heard, Some(&ticket)), Ok(()));
        }
        gates.on_request();
        gates.on_request();
        assert_eq!(budget.tokens(), 1.0);
        assert_eq!(ask_retry(&gates, &mut ticket), Ok(Duration::ZERO));
        // No gates: everything passes.
        let none = Gates::default();
        none.on_request();
        assert_eq!(ask_retry(&none, &mut Ticket::default()), Ok(Duration::ZERO));
        assert_eq!(
            none.on_outcome(Heard::Failure(FailureKind::Other), None),
            Ok(())
        );
    }

    #[test]
    fn the_throttle_hears_failures_and_successes_and_is_asked_only_for_hedges() {
        let throttle = Throttle::builder().max_tokens(4.0).token_ratio(1.0).build();
        let gates = gates(vec![throttle.clone().into_any()]);
        assert!(gates.hears_outcomes());
        let failure = Heard::Failure(FailureKind::Transient);
        // 3 tokens left: above half.
        assert_eq!(gates.on_outcome(failure, None), Ok(()));
        // 2 left: not above half.
        assert_eq!(gates.on_outcome(failure, None), Err(StopReason::Throttled));
        assert_eq!(gates.on_outcome(Heard::Neither, None), Ok(()));
        assert_eq!(throttle.tokens(), 2.0);
        // A retry is not asked again (its answer came with the failure); a hedge is.
        assert_eq!(
            ask_retry(&gates, &mut Ticket::default()),
            Ok(Duration::ZERO)
        );
        assert_eq!(
            gates.admit(Ask::Hedge(FailureKind::Transient)).err(),
            Some(StopReason::Throttled)
        );
        assert_eq!(gates.on_outcome(Heard::Success, None), Ok(()));
        assert_eq!(throttle.tokens(), 3.0);
        assert!(gates.admit(Ask::Hedge(FailureKind::Transient)).is_ok());
        assert_eq!(throttle.tokens(), 3.0);
    }

    #[test]
    fn a_refusal_gives_back_what_the_gates_before_it_took() {
        let quota = RetryQuota::builder().max_tokens(20.0).build();
        let budget = RetryBudget::builder()
            .max_tokens(1.0)
            .min_per_sec(0.0)
            .build();
        // Listed budget first: asked in the registry's order all the same.
        let gates = gates(vec![budget.clone().into_any(), quota.clone().into_any()]);
        let mut ticket = Ticket::default();
        assert_eq!(ask_retry(&gates, &mut ticket), Ok(Duration::ZERO));
        assert_eq!((quota.tokens(), budget.tokens()), (10.0, 0.0));
        // The budget refuses: the quota's 10 go back, and the ticket keeps the last retry's.
        assert_eq!(
            ask_retry(&gates, &mut ticket),
            Err(StopReason::BudgetExhausted)
        );
        assert_eq!(quota.tokens(), 10.0);
        assert_eq!(ticket.taken[Id::Quota as usize], Some(10_000));
        // A transparent retry is the budget's alone: the quota's part of the ticket stays.
        let budget_again = RetryBudget::builder().max_tokens(1.0).build();
        let gates = Gates::new(vec![budget_again.into_any(), quota.clone().into_any()]);
        let admitted = gates.admit(Ask::Transparent).unwrap();
        gates.commit(&admitted, &mut ticket);
        assert_eq!(ticket.taken[Id::Quota as usize], Some(10_000));
        // A success refunds the last retry the quota paid for.
        assert_eq!(gates.on_outcome(Heard::Success, Some(&ticket)), Ok(()));
        assert_eq!(quota.tokens(), 20.0);
    }

    #[test]
    fn the_longest_wait_asked_is_the_admission_s_and_a_release_undoes_every_take() {
        let pacer = pacer::Pacer::new(Duration::from_millis(300), 2);
        let quota = RetryQuota::builder().max_tokens(20.0).build();
        let gates = gates(vec![pacer.clone().into_any(), quota.clone().into_any()]);
        let admitted = gates.admit(Ask::Retry(FailureKind::Other)).unwrap();
        assert_eq!(admitted.wait, Duration::from_millis(300));
        assert_eq!((pacer.permits(), quota.tokens()), (1, 15.0));
        gates.release(&admitted);
        assert_eq!((pacer.permits(), quota.tokens()), (2, 20.0));
    }

    #[test]
    fn a_first_attempt_is_asked_only_of_the_kinds_that_pace_first_attempts() {
        let pacer = pacer::Pacer::pacing_first(Duration::from_millis(50), 1);
        let quota = RetryQuota::builder().max_tokens(20.0).build();
        let budget = RetryBudget::builder()
            .max_tokens(1.0)
            .min_per_sec(0.0)
            .build();
        let throttle = Throttle::builder().build();
        let today = vec![
            budget.clone().into_any(),
            quota.clone().into_any(),
            throttle.into_any(),
        ];
        let today = gates(today);
        assert!(!today.asks_first() && !today.hears_flight());
        let mut all = today.list.clone();
        all.push(pacer.clone().into_any());
        let all = gates(all);
        assert!(all.asks_first() && all.hears_flight());
        let admitted = all.admit(Ask::First).unwrap();
        assert_eq!(admitted.wait, Duration::from_millis(50));
        assert_eq!(
            (budget.tokens(), quota.tokens(), pacer.permits()),
            (1.0, 20.0, 0)
        );
        assert_eq!(all.admit(Ask::First).err(), Some(StopReason::Throttled));
        // Held for a wait and dropped: given back; sent: spent.
        drop(Reserved::new(&all, admitted));
        assert_eq!(pacer.permits(), 1);
        Reserved::new(&all, all.admit(Ask::First).unwrap()).spend();
        assert_eq!(pacer.permits(), 0);
    }

    #[test]
    fn a_presence_ends_each_attempt_once_and_the_request_when_dropped() {
        let pacer = pacer::Pacer::new(Duration::ZERO, 0);
        let gates = gates(vec![pacer.clone().into_any()]);
        let uri = http::Uri::from_static("http://a.example/");
        let headers = http::HeaderMap::new();
        assert!(
            Own::start(&Gates::default(), &uri, &headers)
                .presence
                .is_none()
        );
        let mut own = Some(Own::start(&gates, &uri, &headers));
        assert!(Own::counted(&own));
        assert_eq!(pacer.flight(), (1, 0, 0));
        let presence = Own::presence(&mut own).unwrap();
        presence.started(1, Ask::First);
        presence.started(2, Ask::Hedge(FailureKind::Other));
        presence.started(3, Ask::Hedge(FailureKind::Other));
        assert_eq!(pacer.flight(), (1, 3, 3));
        presence.ended(2);
        presence.ended(2);
        assert_eq!(pacer.flight(), (1, 2, 3));
        drop(own);
        assert_eq!(pacer.flight(), (0, 0, 3));
    }

    #[test]
    fn a_policy_s_gates_replace_their_kinds_and_off_clears_the_inherited() {
        let budget = RetryBudget::builder().build();
        let other_budget = RetryBudget::builder().max_tokens(5.0).build();
        let throttle = Throttle::builder().build();
        let mut base = GateSet::default();
        base.set(budget.into_any());
        base.set(throttle.into_any());
        let mut over = GateSet::default();
        over.set(other_budget.clone().into_any());
        let both = base.then(&over).gates();
        assert_eq!(both.list.len(), 2);
        assert!(matches!(&both.list[1], AnyGate::Budget(b) if b.tokens() == 5.0));
        let mut off = GateSet::default();
        off.clear();
        assert!(base.then(&off).gates().list.is_empty());
        off.set(other_budget.into_any());
        assert_eq!(base.then(&off).gates().list.len(), 1);
        // An empty set inherits everything.
        assert_eq!(base.then(&GateSet::default()).gates().list.len(), 2);
    }

    #[test]
    fn amounts_are_thousandths_and_out_of_range_is_named() {
        assert_eq!(amount_units("x", 1.001, 10_000), Ok(1_001));
        assert_eq!(amount_units("x", 0.0019, 10_000), Ok(1));
        assert_eq!(amount_units("x", 0.0, 10_000), Ok(0));
        for bad in [f64::NAN, f64::INFINITY, -1.0, 10.001, 0.0001] {
            let error = amount_units("max_tokens", bad, 10_000).unwrap_err();
            assert!(error.starts_with("max_tokens is "), "{error}");
        }
        assert!(positive_units("x", 0.0, 10_000).is_err());
    }
}
