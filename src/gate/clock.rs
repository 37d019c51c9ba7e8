// The clock of a gate. A gate is built apart from any layer, may be given to several, and
// is read outside a request (`tokens()`, tower's `Budget`), so it cannot be handed the time
// by each caller: it holds its clock. Every handle, partition and state of one gate shares
// one `GateClock`, which the first layer that resolves a policy holding the gate binds to
// the layer's clock (`Plan::resolve`, once per layer's service, or per request for a
// request's own policy), together with the instant the gate's time counts from (its
// epoch). A gate that needs the time before any layer has it (used on its own through
// tower's `Budget`, or its full map of partitions looked up) binds to the default clock
// then. Reading a gate (`tokens()`, `at_rest`) binds nothing: an unbound gate has seen no
// time pass.
//
// Why first binding wins rather than an error: a layer's builder is infallible and the
// layers sharing a gate never meet, and two timers cannot be compared (two
// `RetryLayer::timer(clock.clone())` are one clock in two boxes), so a second, different
// clock cannot be told from the same one.
//
// Cost: reading the time is one more load and branch than the default clock's own read
// (the `OnceLock`'s state, then `Clock`'s `None` test, which `default_now` did not have),
// and only where a gate read the time already; binding is done once per plan, not per
// request.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::time::{Clock, Instant};

/// Where a gate reads the time; clones share it.
#[derive(Clone, Default)]
pub struct GateClock(Arc<OnceLock<Base>>);

impl std::fmt::Debug for GateClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0.get() {
            None => f.write_str("unbound"),
            Some(base) => base.clock.fmt(f),
        }
    }
}

/// A bound clock and the gate's time zero on it.
struct Base {
    clock: Clock,
    epoch: Instant,
}

impl Base {
    fn on(clock: Clock) -> Base {
        let epoch = clock.now();
        Base { clock, epoch }
    }
}

impl GateClock {
    /// Binds the gate to `clock`, unless it is bound already (the first binding wins).
    pub(crate) fn bind(&self, clock: &Clock) {
        if self.0.get().is_none() {
            let _ = self.0.set(Base::on(clock.clone()));
        }
    }

    /// The time since the gate's epoch, binding it to the default clock if nothing has.
    #[inline]
    pub(crate) fn elapsed(&self) -> Duration {
        let base = self.0.get_or_init(|| Base::on(Clock::default()));
        base.clock.now().saturating_duration_since(base.epoch)
    }

    /// The time since the gate's epoch if it is bound, binding nothing: for a read, and
    /// for a state made after the others (a partition), which starts at that time.
    pub(crate) fn elapsed_if_bound(&self) -> Option<Duration> {
        let base = self.0.get()?;
        Some(base.clock.now().saturating_duration_since(base.epoch))
    }

    /// The time since the gate's epoch for a state that starts now: 0 while unbound (its
    /// epoch, taken when bound, is then later).
    pub(crate) fn birth(&self) -> Duration {
        self.elapsed_if_bound().unwrap_or(Duration::ZERO)
    }

    /// Whether the gate is bound to `clock`.
    #[cfg(all(test, not(tower_http_retry_loom)))]
    pub(crate) fn is_bound_to(&self, clock: &Clock) -> bool {
        self.0.get().is_some_and(|base| base.clock == *clock)
    }
}

#[cfg(all(test, not(tower_http_retry_loom)))]
mod tests {
    use super::*;
    use crate::time::ManualClock;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn the_first_binding_wins_and_reads_bind_nothing() {
        let first = ManualClock::new();
        let second = ManualClock::new();
        let (one, two) = (Clock::custom(first.clone()), Clock::custom(second.clone()));
        let gate = GateClock::default();
        first.advance(5 * MS);
        assert_eq!(gate.elapsed_if_bound(), None);
        assert_eq!(gate.birth(), Duration::ZERO);
        gate.clone().bind(&one);
        gate.bind(&two);
        assert!(gate.is_bound_to(&one) && !gate.is_bound_to(&two));
        // Time counts from the binding, on the first clock only.
        assert_eq!(gate.elapsed(), Duration::ZERO);
        second.advance(100 * MS);
        first.advance(7 * MS);
        assert_eq!(gate.elapsed(), 7 * MS);
        assert_eq!(gate.birth(), 7 * MS);
    }

    #[test]
    fn a_gate_that_needs_the_time_unbound_takes_the_default_clock() {
        let gate = GateClock::default();
        let _ = gate.elapsed();
        gate.bind(&Clock::custom(ManualClock::new()));
        assert!(gate.is_bound_to(&Clock::default()));
    }
}
