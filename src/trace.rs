// Spans and events, or nothing at all without the `tracing` feature.

use std::error::Error as StdError;

use crate::classify::RetryReason;
use crate::info::{RetryInfo, RetryRecord};

#[cfg(feature = "tracing")]
mod imp {
    use super::*;

    /// The span of one logical request.
    pub(crate) struct Trace(tracing::Span);

    impl Trace {
        pub(crate) fn new<B>(request: &http::Request<B>) -> Self {
            Trace(tracing::debug_span!(
                "http_retry",
                method = %request.method(),
                uri = %request.uri(),
            ))
        }

        pub(crate) fn enter(&self) -> tracing::span::Entered<'_> {
            self.0.enter()
        }

        pub(crate) fn retry(
            &self,
            attempt: u32,
            record: &RetryRecord,
            error: Option<&(dyn StdError + Send + Sync)>,
        ) {
            tracing::debug!(
                attempt,
                // The retry about to be sent was sent `attempt` times before (OpenTelemetry's
                // `http.request.resend_count`).
                resend_count = attempt,
                reason = %record.reason,
                wait_ms = record.wait.as_secs_f64() * 1e3,
                hint = record.hint.map(|source| source.as_str()),
                transparent = record.is_transparent(),
                hedge = record.kind == crate::AttemptKind::Hedge,
                error = error.map(tracing::field::display),
                "retrying",
            );
        }

        pub(crate) fn finish(
            &self,
            info: &RetryInfo,
            error: Option<&(dyn StdError + Send + Sync)>,
        ) {
            tracing::debug!(
                attempts = info.attempts(),
                stop = %info.stop(),
                total_wait_ms = info.total_wait().as_secs_f64() * 1e3,
                error = error.map(tracing::field::display),
                "done",
            );
        }

        pub(crate) fn deadline(&self, error: &(dyn StdError + Send + Sync)) {
            tracing::debug!(%error, "gave up");
        }
    }

    pub(crate) fn budget_refused(attempts: u32, reason: &RetryReason) {
        tracing::warn!(attempts, %reason, "retry budget exhausted; not retrying");
    }
}

#[cfg(not(feature = "tracing"))]
mod imp {
    use super::*;

    /// Nothing: the `tracing` feature is off.
    pub(crate) struct Trace;

    impl Trace {
        pub(crate) fn new<B>(_: &http::Request<B>) -> Self {
            Trace
        }
        pub(crate) fn enter(&self) {}
        pub(crate) fn retry(
            &self,
            _: u32,
            _: &RetryRecord,
            _: Option<&(dyn StdError + Send + Sync)>,
        ) {
        }
        pub(crate) fn finish(&self, _: &RetryInfo, _: Option<&(dyn StdError + Send + Sync)>) {}
        pub(crate) fn deadline(&self, _: &(dyn StdError + Send + Sync)) {}
    }

    pub(crate) fn budget_refused(_: u32, _: &RetryReason) {}
}

pub(crate) use imp::Trace;

/// Metric names, for dashboards.
pub(crate) mod names {
    pub(crate) const RETRIES: &str = "http_retry_retries_total";
    pub(crate) const BUDGET_REFUSALS: &str = "http_retry_budget_refusals_total";
    pub(crate) const WAIT_SECONDS: &str = "http_retry_wait_seconds";
    pub(crate) const HEDGES: &str = "http_retry_hedges_total";
    pub(crate) const HEDGE_WINS: &str = "http_retry_hedge_wins_total";
}

/// One retry decided: an event (in [`Trace::retry`]) and the metrics. A hedge counts as
/// a hedge, not a retry, and its wait (the time since the attempt before it) is no wait.
pub(crate) fn retried(record: &RetryRecord) {
    #[cfg(feature = "metrics")]
    {
        if record.kind == crate::AttemptKind::Hedge {
            metrics::counter!(names::HEDGES, "reason" => record.reason.as_str()).increment(1);
        } else {
            metrics::counter!(names::RETRIES, "reason" => record.reason.as_str()).increment(1);
            metrics::histogram!(names::WAIT_SECONDS).record(record.wait.as_secs_f64());
        }
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (record, names::RETRIES, names::WAIT_SECONDS, names::HEDGES);
}

/// A hedged request returned the outcome of attempt `returned` (1 for the first): a win
/// for hedging when it was a hedge.
pub(crate) fn hedge_returned(returned: u32) {
    #[cfg(feature = "metrics")]
    if returned > 1 {
        metrics::counter!(names::HEDGE_WINS).increment(1);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (returned, names::HEDGE_WINS);
}

/// The budget refused a retry: a warning and a counter.
pub(crate) fn budget_refused(attempts: u32, reason: &RetryReason) {
    imp::budget_refused(attempts, reason);
    #[cfg(feature = "metrics")]
    metrics::counter!(names::BUDGET_REFUSALS, "reason" => reason.as_str()).increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = names::BUDGET_REFUSALS;
}
