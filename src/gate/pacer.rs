// A kind of gate for tests only: it admits a retry after a set wait while it has permits,
// and refuses once they are gone, so that the driver's paths for a gate that asks a retry
// to wait longer, or refuses after another gate took its share, are tested apart from any
// public kind's arithmetic.
// Made `pacing_first`, it charges first attempts the same way (a wait before the first
// attempt, a first attempt refused); and it counts the requests and attempts in flight, as
// a concurrency limit would.

use std::fmt;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use super::clock::GateClock;
use super::partition::Scoped;
use super::{Admission, Ask, Kind};
use crate::info::StopReason;

#[derive(Clone)]
pub struct Pacer {
    pub(super) inner: Scoped<PacerState>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PacerSettings {
    wait: Duration,
    permits: u64,
    first: bool,
}

pub struct PacerState {
    permits: AtomicU64,
    settings: PacerSettings,
    /// Requests and attempts in flight, and attempts started.
    requests: AtomicI64,
    attempts: AtomicI64,
    started: AtomicU64,
}

impl Pacer {
    /// Admits `permits` retries, each `wait` later than it would go.
    pub fn new(wait: Duration, permits: u64) -> Pacer {
        Pacer::with(PacerSettings {
            wait,
            permits,
            first: false,
        })
    }

    /// Admits `permits` attempts, first attempts included, each `wait` later than it would
    /// go.
    pub fn pacing_first(wait: Duration, permits: u64) -> Pacer {
        Pacer::with(PacerSettings {
            wait,
            permits,
            first: true,
        })
    }

    fn with(settings: PacerSettings) -> Pacer {
        Pacer {
            inner: Scoped::new(PacerState::of(&settings), None, GateClock::default()),
        }
    }

    pub fn permits(&self) -> u64 {
        self.inner.permits.load(Ordering::Relaxed)
    }

    /// Requests in flight, attempts in flight, attempts started.
    pub fn flight(&self) -> (i64, i64, u64) {
        (
            self.inner.requests.load(Ordering::Relaxed),
            self.inner.attempts.load(Ordering::Relaxed),
            self.inner.started.load(Ordering::Relaxed),
        )
    }
}

impl PacerState {
    /// A full state of `s` (the kind reads no time).
    fn of(s: &PacerSettings) -> PacerState {
        PacerState {
            permits: AtomicU64::new(s.permits),
            settings: *s,
            requests: AtomicI64::new(0),
            attempts: AtomicI64::new(0),
            started: AtomicU64::new(0),
        }
    }
}

impl Kind for PacerState {
    type Settings = PacerSettings;
    const NAME: &'static str = "pacer";
    const HEARS_OUTCOMES: bool = false;
    const ASKS_FIRST: bool = true;
    const HEARS_FLIGHT: bool = true;

    fn defaults() -> PacerSettings {
        PacerSettings {
            wait: Duration::ZERO,
            permits: 0,
            first: false,
        }
    }

    fn check(_: &PacerSettings) -> Result<(), String> {
        Ok(())
    }

    fn full(s: &PacerSettings, _: &GateClock) -> PacerState {
        PacerState::of(s)
    }

    fn fresh(&self) -> PacerState {
        PacerState::of(&self.settings)
    }

    fn successor(&self) -> PacerState {
        PacerState {
            permits: AtomicU64::new(self.permits.load(Ordering::Relaxed)),
            ..PacerState::of(&self.settings)
        }
    }

    fn at_rest(&self) -> bool {
        self.permits.load(Ordering::Relaxed) == self.settings.permits
    }

    fn on_request(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
    }

    fn admit(&self, ask: Ask) -> Admission {
        if ask == Ask::First && !self.settings.first {
            return Admission::ADMIT;
        }
        let taken = self
            .permits
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
        match taken {
            Ok(_) => Admission::Admit {
                taken: Some(1),
                wait: self.settings.wait,
            },
            Err(_) => Admission::Refuse(StopReason::Throttled),
        }
    }

    fn release(&self, taken: u64) {
        self.permits.fetch_add(taken, Ordering::Relaxed);
    }

    fn on_attempt_start(&self, _: Ask) {
        self.attempts.fetch_add(1, Ordering::Relaxed);
        self.started.fetch_add(1, Ordering::Relaxed);
    }

    fn on_attempt_end(&self, _: Ask) {
        self.attempts.fetch_sub(1, Ordering::Relaxed);
    }

    fn on_request_end(&self) {
        self.requests.fetch_sub(1, Ordering::Relaxed);
    }
}

impl fmt::Debug for Pacer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pacer")
            .field("permits", &self.permits())
            .field("wait", &self.inner.settings.wait)
            .finish()
    }
}
