// A concurrency budget for retries and hedges, Envoy's retry budget: the retries and hedges
// in flight are at most a share of the requests in flight, never fewer than a floor.
//
// Read in Envoy:
// - `source/common/upstream/resource_manager_impl.h` at commit
//   01c2c1fadbc61d572c7e02568c98ff001c0bfe8f, `RetryBudgetImpl`: the most retries is
//   `max(budget_percent / 100 * (active requests + pending requests), min_retry_concurrency)`,
//   the product converted to an integer (so rounded down), with the defaults 20 % and 3; a
//   retry may start while the count is below that (`count() < max()`).
// - `source/common/router/retry_state_impl.cc` at commit
//   e78906c5cbf579e412a7ca76ecabeee0e11d977f, `RetryStateImpl::shouldRetry`: the budget is
//   asked after the request's own retry limit; refused, the retry is not made, the refusal is
//   counted (`upstream_rq_retry_overflow`) and the router passes the last response on (its
//   tests flag it `UpstreamOverflow`); granted, the retry counts from the decision (before its
//   backoff) until the request's next outcome or its end. A hedge sent on a per-try timeout
//   goes through the same call, so hedges count too.
//
// Where this differs, and why:
// - Envoy's "active" is the cluster's upstream streams (retries and hedges among them) plus
//   those waiting for a connection. Here it is the logical requests in flight through the
//   layer (through this gate's partition when kept per authority), from the call to the
//   end of the response future, whatever they are doing: an attempt out, a backoff, a wait
//   for readiness or for a rate limiter's token (the layer's "pending"). Retries do not
//   raise their own limit, so the bound is exactly `max(floor(ratio * requests), min)`.
// - A retry counts from its admission (before its backoff, as in Envoy) until its attempt
//   ends, or until the request ends if it was never sent. One request may hold several
//   places at once (hedges), each its own.
// - The ratio is kept in thousandths and the product taken in integers, so that 0.29 of 100
//   requests is 29 (in floating point it is 28.999..., which Envoy rounds down to 28).
//
// The state is one atomic word: the requests in flight in the high 32 bits, the retries and
// hedges in flight in the low 32. An admission is a compare-and-swap from a word whose
// retries are below the cap its requests give to the same word with one more retry, so no
// interleaving of admissions ever passes the cap (the loom models below check it). Every
// access is `Relaxed`: the word publishes no other memory, and every change is a
// read-modify-write of that one word.

#[cfg(all(test, tower_http_retry_loom))]
use ::loom::sync::atomic::{AtomicU64, Ordering};
#[cfg(not(all(test, tower_http_retry_loom)))]
use std::sync::atomic::{AtomicU64, Ordering};

use std::fmt;

use super::clock::GateClock;
use super::partition::Scoped;
use super::{Admission, Ask, GateBuilder, Kind, amount_units};
use crate::info::StopReason;

/// One request in the state word.
const REQUEST: u64 = 1 << 32;
/// The retries field of the state word.
const RETRIES: u64 = REQUEST - 1;
/// Thousandths in a ratio of 1.
const MILLI: u64 = 1_000;

/// A concurrency budget for retries and hedges, as Envoy's retry budget: the retries and
/// hedges in flight at once are at most `ratio` (default 0.2) of the requests in flight,
/// and up to `min_in_flight` (default 3) are always allowed.
///
/// A request is in flight from the moment the layer is called until its response future
/// ends (answered, failed, or dropped by the caller), whatever it is doing: an attempt out,
/// a wait between attempts. A retry (or a hedge, or a transparent retry) is in flight from
/// the moment this gate admits it, before its backoff, until its attempt ends, or until its
/// request does if it was never sent. Before each retry and each hedge the gate admits it
/// only while fewer than
///
/// ```text
/// max(floor(ratio * requests in flight), min_in_flight)
/// ```
///
/// are in flight. With the defaults and 10 requests in flight, 3 may be retried at once
/// (the floor); with 40, 8.
///
/// Where the token kinds ([`RetryBudget`](crate::RetryBudget),
/// [`RetryQuota`](crate::RetryQuota)) bound retries over time, this bounds how many are out
/// at once, which is what a hedge costs a server: a token budget prices a hedge only on
/// average, while a burst of slow requests sends all its hedges together. The two compose:
/// give a policy both ([`RetryPolicy::gate`](crate::RetryPolicy::gate) takes one of each
/// kind), and a retry goes only if each admits it; when one refuses, what the others took
/// for it goes back.
///
/// First attempts are never refused: they are the requests the share is of. A refused retry
/// returns the last outcome, with [`StopReason::BudgetExhausted`] in the record (Envoy counts
/// it as a retry overflow); a refused hedge is not sent, and the attempts in flight go on.
/// Kept [`per_authority`](GateBuilder::per_authority), each server's requests and retries
/// are counted apart. The continuations of a resumable response body are not counted: they
/// come after their request's response, when it is no longer in flight.
///
/// The count is lock-free: one atomic word, updated by compare-and-swap, so that no
/// interleaving of requests admitting retries together passes the limit. Its `Debug` shows
/// the requests and the retries in flight.
///
/// ```
/// use std::time::Duration;
/// use tower_http_retry::{ConcurrencyBudget, Hedging, RetryBudget, RetryLayer, RetryPolicy};
///
/// // Retries and hedges: at most a tenth of the requests in flight, at least 5, and, over
/// // time, the default token budget.
/// let concurrency = ConcurrencyBudget::builder().ratio(0.1).min_in_flight(5).build();
/// let layer = RetryLayer::new().policy(
///     RetryPolicy::new()
///         .hedge(Hedging::after(Duration::from_millis(50)))
///         .gate(concurrency.clone())
///         .gate(RetryBudget::default()),
/// );
/// assert_eq!(
///     format!("{concurrency:?}"),
///     "ConcurrencyBudget { ratio: 0.1, min_in_flight: 5, requests_in_flight: 0, \
///      retries_in_flight: 0 }",
/// );
/// # let _ = layer;
/// ```
#[derive(Clone)]
pub struct ConcurrencyBudget {
    pub(super) inner: Scoped<Concurrency>,
}

/// What a concurrency budget is built from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ConcurrencySettings {
    ratio: f64,
    min_in_flight: u32,
}

/// The state of a [`ConcurrencyBudget`].
pub struct Concurrency {
    /// Requests in flight (high 32 bits), retries and hedges in flight (low 32 bits).
    word: AtomicU64,
    /// The ratio in thousandths.
    ratio_milli: u64,
    min: u64,
    settings: ConcurrencySettings,
}

impl ConcurrencyBudget {
    /// A builder with Envoy's defaults: a ratio of 0.2, at least 3 in flight.
    ///
    /// ```
    /// use tower_http_retry::ConcurrencyBudget;
    ///
    /// let budget = ConcurrencyBudget::builder().per_authority().build();
    /// # let _ = budget;
    /// ```
    pub fn builder() -> GateBuilder<ConcurrencyBudget> {
        GateBuilder::new()
    }
}

impl GateBuilder<ConcurrencyBudget> {
    /// The most retries and hedges in flight, as a share of the requests in flight
    /// (default 0.2, Envoy's 20 %; from 0 to 1, counted in thousandths). The product is
    /// rounded down: 0.2 of 14 requests is 2.
    ///
    /// ```
    /// use tower_http_retry::ConcurrencyBudget;
    ///
    /// // One retry or hedge in flight per ten requests in flight (at least 3).
    /// let budget = ConcurrencyBudget::builder().ratio(0.1).build();
    /// # let _ = budget;
    /// ```
    pub fn ratio(mut self, ratio: f64) -> Self {
        self.settings.ratio = ratio;
        self
    }

    /// The retries and hedges that may always be in flight, however few the requests
    /// (default 3, Envoy's `min_retry_concurrency`), so that a quiet client can still retry.
    ///
    /// ```
    /// use tower_http_retry::ConcurrencyBudget;
    ///
    /// let budget = ConcurrencyBudget::builder().min_in_flight(10).build();
    /// # let _ = budget;
    /// ```
    pub fn min_in_flight(mut self, min: u32) -> Self {
        self.settings.min_in_flight = min;
        self
    }
}

impl Concurrency {
    /// The most retries in flight that `requests` in flight allow.
    fn cap(&self, requests: u64) -> u64 {
        (requests * self.ratio_milli / MILLI).max(self.min)
    }

    /// Admits a retry while fewer than the cap are in flight.
    fn try_take(&self) -> bool {
        let mut word = self.word.load(Ordering::Relaxed);
        loop {
            if word & RETRIES >= self.cap(word >> 32) {
                return false;
            }
            match self.word.compare_exchange_weak(
                word,
                word + 1,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                Err(now) => word = now,
            }
        }
    }

    /// `n` retries in flight ended (or were never sent).
    fn give_back(&self, n: u64) {
        // Never below zero, should a count ever be given back twice: the requests' field
        // stays whole.
        let _ = self
            .word
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |word| {
                debug_assert!(word & RETRIES >= n, "more retries ended than began");
                Some(word - n.min(word & RETRIES))
            });
    }

    /// Requests and retries in flight.
    fn counts(&self) -> (u64, u64) {
        let word = self.word.load(Ordering::Relaxed);
        (word >> 32, word & RETRIES)
    }
}

impl Concurrency {
    /// A full state of `s` (the kind reads no time).
    fn of(s: &ConcurrencySettings) -> Concurrency {
        Concurrency {
            word: AtomicU64::new(0),
            ratio_milli: amount_units("ratio", s.ratio, MILLI).unwrap_or(0),
            min: u64::from(s.min_in_flight),
            settings: *s,
        }
    }
}

impl Kind for Concurrency {
    type Settings = ConcurrencySettings;
    const NAME: &'static str = "concurrency budget";
    const HEARS_OUTCOMES: bool = false;
    const HEARS_FLIGHT: bool = true;

    fn defaults() -> ConcurrencySettings {
        ConcurrencySettings {
            ratio: 0.2,
            min_in_flight: 3,
        }
    }

    fn check(s: &ConcurrencySettings) -> Result<(), String> {
        let ratio = s.ratio;
        if ratio > 0.0 && ratio < 0.001 {
            return Err(format!(
                "ratio is {ratio}; it must be 0 or at least 0.001 (it is counted in thousandths)"
            ));
        }
        amount_units("ratio", ratio, MILLI)?;
        if ratio == 0.0 && s.min_in_flight == 0 {
            return Err(
                "ratio and min_in_flight are both 0, which refuses every retry and \
                        hedge; to send each request once, use RetryPolicy::max_attempts(1)"
                    .to_string(),
            );
        }
        Ok(())
    }

    fn full(s: &ConcurrencySettings, _: &GateClock) -> Concurrency {
        Concurrency::of(s)
    }

    fn fresh(&self) -> Concurrency {
        Concurrency::of(&self.settings)
    }

    fn successor(&self) -> Concurrency {
        // What is in flight is counted where it started: a new partition starts empty.
        self.fresh()
    }

    fn at_rest(&self) -> bool {
        self.word.load(Ordering::Relaxed) == 0
    }

    // Out of line: inlined into the gates' dispatch it grows every request's path, this
    // gate's or not (measured: 20 instructions a request under the default budget).
    #[inline(never)]
    fn on_request(&self) {
        self.word.fetch_add(REQUEST, Ordering::Relaxed);
    }

    fn admit(&self, ask: Ask) -> Admission {
        // A first attempt is a request: never refused (the gate is not asked of one).
        if ask == Ask::First {
            return Admission::ADMIT;
        }
        match self.try_take() {
            true => Admission::took(1),
            false => Admission::Refuse(StopReason::BudgetExhausted),
        }
    }

    fn release(&self, taken: u64) {
        self.give_back(taken);
    }

    fn on_attempt_end(&self, ask: Ask) {
        if ask != Ask::First {
            self.give_back(1);
        }
    }

    fn on_request_end(&self) {
        let before = self.word.fetch_sub(REQUEST, Ordering::Relaxed);
        debug_assert!(before >= REQUEST, "more requests ended than began");
    }
}

impl fmt::Debug for ConcurrencyBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = &*self.inner;
        let (requests, retries) = state.counts();
        let mut f = f.debug_struct("ConcurrencyBudget");
        if let Some(max) = self.inner.max_authorities() {
            f.field("max_authorities", &max);
        }
        f.field("ratio", &(state.ratio_milli as f64 / MILLI as f64))
            .field("min_in_flight", &state.settings.min_in_flight)
            .field("requests_in_flight", &requests)
            .field("retries_in_flight", &retries)
            .finish()
    }
}

#[cfg(all(test, not(tower_http_retry_loom)))]
mod tests;

/// Loom models of the count: every interleaving of a few threads admitting retries, ending
/// them and ending requests, on loom's atomics. Run with
/// `RUSTFLAGS="--cfg tower_http_retry_loom" cargo test --release --lib gate::concurrency::loom_models`.
#[cfg(all(test, tower_http_retry_loom))]
mod loom_models {
    use super::{Concurrency, ConcurrencyBudget, Kind};
    use crate::classify::FailureKind;
    use crate::gate::{Admission, Ask};

    use ::loom::thread;

    const RETRY: Ask = Ask::Retry(FailureKind::Transient);
    const HEDGE: Ask = Ask::Hedge(FailureKind::Other);

    fn budget(ratio: f64, min: u32, requests: u32) -> ConcurrencyBudget {
        let budget = ConcurrencyBudget::builder()
            .ratio(ratio)
            .min_in_flight(min)
            .build();
        for _ in 0..requests {
            budget.inner.on_request();
        }
        budget
    }

    /// Bounds the four-thread model's preemptions: a few seconds instead of minutes.
    /// `LOOM_MAX_PREEMPTIONS` overrides it.
    const PREEMPTION_BOUND: usize = 3;

    fn admitted(state: &Concurrency, ask: Ask) -> bool {
        matches!(state.admit(ask), Admission::Admit { .. })
    }

    /// Runs `work` on a new loom thread with a clone of `budget`.
    fn spawn<T: 'static>(
        budget: &ConcurrencyBudget,
        work: impl FnOnce(&Concurrency) -> T + 'static,
    ) -> thread::JoinHandle<T> {
        let budget = budget.clone();
        thread::spawn(move || work(&budget.inner))
    }

    /// Three threads admit retries and hedges against a floor of 2 (5 requests at 0.2 give
    /// 1): exactly two are admitted, whatever the interleaving, and two are counted.
    #[test]
    fn three_threads_admitting_never_pass_the_floor() {
        ::loom::model(|| {
            let budget = budget(0.2, 2, 5);
            let first = spawn(&budget, |state| admitted(state, RETRY));
            let second = spawn(&budget, |state| admitted(state, HEDGE));
            let third = admitted(&budget.inner, RETRY);
            let grants = [first.join().unwrap(), second.join().unwrap(), third];
            assert_eq!(grants.iter().filter(|&&granted| granted).count(), 2);
            assert_eq!(budget.inner.counts(), (5, 2));
        });
    }

    /// Two threads admit two retries each against the ratio (10 requests at 0.3 give 3,
    /// over a floor of 1): three of the four are admitted, never four.
    #[test]
    fn two_threads_admitting_twice_never_pass_the_ratio() {
        ::loom::model(|| {
            let budget = budget(0.3, 1, 10);
            let other = spawn(&budget, |state| {
                [admitted(state, RETRY), admitted(state, RETRY)]
            });
            let mine = [
                admitted(&budget.inner, HEDGE),
                admitted(&budget.inner, RETRY),
            ];
            let theirs = other.join().unwrap();
            let grants = mine.iter().chain(&theirs).filter(|&&g| g).count();
            assert_eq!(grants, 3);
            assert_eq!(budget.inner.counts(), (10, 3));
        });
    }

    /// Requests end while three threads admit: the cap falls from 2 (4 requests at 0.5) to
    /// 1 (2 requests, and the floor). Each admission is made from a word below its own cap,
    /// so at least one and at most two are admitted, never three, and the count is exactly
    /// what was admitted.
    #[test]
    fn admissions_racing_requests_that_end_never_pass_the_cap() {
        let mut builder = ::loom::model::Builder::new();
        if builder.preemption_bound.is_none() {
            builder.preemption_bound = Some(PREEMPTION_BOUND);
        }
        builder.check(|| {
            let budget = budget(0.5, 1, 4);
            let ender = spawn(&budget, |state| {
                state.on_request_end();
                state.on_request_end();
            });
            let first = spawn(&budget, |state| admitted(state, RETRY));
            let second = spawn(&budget, |state| admitted(state, HEDGE));
            let third = admitted(&budget.inner, RETRY);
            ender.join().unwrap();
            let grants = [first.join().unwrap(), second.join().unwrap(), third];
            let grants = grants.iter().filter(|&&g| g).count() as u64;
            assert!((1..=2).contains(&grants), "{grants} admitted");
            assert_eq!(budget.inner.counts(), (2, grants));
        });
    }

    /// A retry ends while two threads admit against a cap of 1 that it holds: at most one
    /// is admitted (and only after it ended), and the count is exactly that one.
    #[test]
    fn an_ending_retry_frees_its_place_once() {
        ::loom::model(|| {
            let budget = budget(0.0, 1, 3);
            assert!(admitted(&budget.inner, RETRY));
            let ender = spawn(&budget, |state| state.on_attempt_end(RETRY));
            let other = spawn(&budget, |state| admitted(state, HEDGE));
            let mine = admitted(&budget.inner, RETRY);
            ender.join().unwrap();
            let theirs = other.join().unwrap();
            let grants = [mine, theirs].iter().filter(|&&g| g).count() as u64;
            assert!(grants <= 1);
            assert_eq!(budget.inner.counts(), (3, grants));
        });
    }
}
