//! Temporary stand-in; replaced by the lock-free budget.
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

/// Retry budget.
#[derive(Clone, Debug)]
pub struct RetryBudget(Arc<AtomicI64>);

/// Invalid budget.
#[derive(Debug)]
pub struct InvalidBudget;

impl Default for RetryBudget {
    fn default() -> Self {
        Self::new(0.1, 10, 100)
    }
}

impl RetryBudget {
    /// New.
    pub fn new(_ratio: f64, _min_per_sec: u32, max_tokens: u32) -> Self {
        Self(Arc::new(AtomicI64::new(i64::from(max_tokens) * 1000)))
    }
    /// Deposit.
    pub fn deposit(&self) {
        self.0.fetch_add(100, Ordering::Relaxed);
    }
    /// Withdraw.
    pub fn withdraw(&self) -> bool {
        self.0.fetch_sub(1000, Ordering::Relaxed) >= 1000
    }
}
