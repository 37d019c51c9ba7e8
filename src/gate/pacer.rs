// A kind of gate for tests only: it admits a retry after a set wait while it has permits,
// and refuses once they are gone, so that the paths today's kinds never take (a gate that
// asks a retry to wait longer, a refusal after another gate took its share) are tested.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

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
}

pub struct PacerState {
    permits: AtomicU64,
    settings: PacerSettings,
}

impl Pacer {
    /// Admits `permits` retries, each `wait` later than it would go.
    pub fn new(wait: Duration, permits: u64) -> Pacer {
        let settings = PacerSettings { wait, permits };
        Pacer {
            inner: Scoped::new(PacerState::full(&settings), None),
        }
    }

    pub fn permits(&self) -> u64 {
        self.inner.permits.load(Ordering::Relaxed)
    }
}

impl Kind for PacerState {
    type Settings = PacerSettings;
    const NAME: &'static str = "pacer";
    const HEARS_OUTCOMES: bool = false;

    fn defaults() -> PacerSettings {
        PacerSettings {
            wait: Duration::ZERO,
            permits: 0,
        }
    }

    fn check(_: &PacerSettings) -> Result<(), String> {
        Ok(())
    }

    fn full(s: &PacerSettings) -> PacerState {
        PacerState {
            permits: AtomicU64::new(s.permits),
            settings: *s,
        }
    }

    fn fresh(&self) -> PacerState {
        PacerState::full(&self.settings)
    }

    fn successor(&self) -> PacerState {
        PacerState {
            permits: AtomicU64::new(self.permits.load(Ordering::Relaxed)),
            settings: self.settings,
        }
    }

    fn at_rest(&self) -> bool {
        self.permits.load(Ordering::Relaxed) == self.settings.permits
    }

    fn admit(&self, _: Ask) -> Admission {
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
}

impl fmt::Debug for Pacer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pacer")
            .field("permits", &self.permits())
            .field("wait", &self.inner.settings.wait)
            .finish()
    }
}
