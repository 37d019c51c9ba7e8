//! How one class of requests is retried: attempts, time limits, backoff, classification.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::backoff::{Backoff, JitterRng, SeedSequence};
use crate::budget::RetryBudget;
use crate::classify::{Classification, Classify, Outcome};
use crate::error::InvalidConfig;
use crate::head::Head;

/// The retry rules for a class of requests.
///
/// Defaults: 3 attempts (the first included), [`Backoff::default`] (100 ms base, 10 s cap,
/// full jitter), no deadline, no per-attempt timeout, `Retry-After` honoured up to 30 s, the
/// [`DefaultClassifier`](crate::classify::DefaultClassifier), and the layer's shared budget.
///
/// A policy is set on the layer ([`RetryLayer::policy`](crate::RetryLayer::policy)), per
/// route ([`RetryLayer::route`](crate::RetryLayer::route)), or per request by inserting it
/// in the request's extensions, which overrides both.
///
/// ```
/// use std::time::Duration;
/// use tower_http_retry::{Backoff, Jitter, RetryPolicy};
///
/// let policy = RetryPolicy::default()
///     .max_attempts(4)
///     .backoff(Backoff::exponential(Duration::from_millis(50), Duration::from_secs(2))
///         .jitter(Jitter::Equal))
///     .deadline(Duration::from_secs(5))
///     .attempt_timeout(Duration::from_secs(1));
/// assert_eq!(policy.get_max_attempts(), 4);
/// ```
#[derive(Clone)]
pub struct RetryPolicy {
    pub(crate) max_attempts: u32,
    pub(crate) backoff: Backoff,
    pub(crate) deadline: Option<Duration>,
    pub(crate) attempt_timeout: Option<Duration>,
    pub(crate) max_retry_after: Duration,
    pub(crate) classifier: Option<Arc<dyn Classify>>,
    pub(crate) budget: Option<RetryBudget>,
    pub(crate) seed: Option<Arc<SeedSequence>>,
    pub(crate) assume_idempotent: bool,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 3,
            backoff: Backoff::default(),
            deadline: None,
            attempt_timeout: None,
            max_retry_after: Duration::from_secs(30),
            classifier: None,
            budget: None,
            seed: None,
            assume_idempotent: false,
        }
    }
}

impl RetryPolicy {
    /// The defaults listed on [`RetryPolicy`].
    pub fn new() -> Self {
        Self::default()
    }

    /// A policy that never retries: the request is sent once and nothing is kept for a
    /// replay. Put it in a request's extensions to switch retries off for that request.
    pub fn never() -> Self {
        Self {
            max_attempts: 1,
            ..Self::default()
        }
    }

    /// Attempts per logical request, the first included; 1 disables retries.
    ///
    /// # Panics
    ///
    /// When `attempts` is 0. [`RetryPolicy::try_max_attempts`] returns an error instead.
    pub fn max_attempts(self, attempts: u32) -> Self {
        match self.try_max_attempts(attempts) {
            Ok(policy) => policy,
            Err(e) => panic!("{e}"),
        }
    }

    /// Like [`RetryPolicy::max_attempts`], but refuses 0 with an error.
    pub fn try_max_attempts(mut self, attempts: u32) -> Result<Self, InvalidConfig> {
        if attempts == 0 {
            return Err(InvalidConfig::new(
                "max_attempts must be at least 1 (the first attempt counts)",
            ));
        }
        self.max_attempts = attempts;
        Ok(self)
    }

    /// The backoff between attempts.
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// The whole logical request, every attempt and every wait, ends within `deadline`.
    ///
    /// No wait starts that would end after it (the last outcome is returned instead); an
    /// attempt still in flight when it passes is dropped and the caller gets
    /// [`DeadlineExceeded`](crate::DeadlineExceeded).
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = Some(deadline);
        self
    }

    /// Removes the deadline.
    pub fn no_deadline(mut self) -> Self {
        self.deadline = None;
        self
    }

    /// Each attempt is dropped after `min(timeout, time left before the deadline)`, which
    /// counts as a retryable timeout ([`AttemptTimedOut`](crate::AttemptTimedOut)).
    pub fn attempt_timeout(mut self, timeout: Duration) -> Self {
        self.attempt_timeout = Some(timeout);
        self
    }

    /// The longest `Retry-After` the layer is willing to wait; a longer hint stops retrying
    /// and returns that response at once. Default 30 s.
    pub fn max_retry_after(mut self, max: Duration) -> Self {
        self.max_retry_after = max;
        self
    }

    /// Replaces the [`DefaultClassifier`](crate::classify::DefaultClassifier).
    ///
    /// A custom classifier is given the request's head as `http::request::Parts`, so for
    /// requests under this policy the layer keeps its copy of the head in that form (a
    /// `HeaderMap` copy, two allocations), where the default classifier, which looks at the
    /// outcome alone, lets it keep a plain list of the header fields (one allocation).
    pub fn classifier<C: Classify>(mut self, classifier: C) -> Self {
        self.classifier = Some(Arc::new(classifier));
        self
    }

    /// Spends this policy's retries from `budget` instead of the layer's shared one.
    pub fn budget(mut self, budget: RetryBudget) -> Self {
        self.budget = Some(budget);
        self
    }

    /// Draws jitter from generators seeded with `seed`, for tests and simulations. Every
    /// logical request still gets its own sequence (derived from the seed and the order in
    /// which requests first retry), so the same program replays the same waits.
    pub fn rng_seed(mut self, seed: u64) -> Self {
        self.seed = Some(SeedSequence::new(seed));
        self
    }

    /// Attempts per logical request, the first included.
    pub fn get_max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// The backoff.
    pub fn get_backoff(&self) -> &Backoff {
        &self.backoff
    }

    /// The overall deadline, if any.
    pub fn get_deadline(&self) -> Option<Duration> {
        self.deadline
    }

    /// The per-attempt timeout, if any.
    pub fn get_attempt_timeout(&self) -> Option<Duration> {
        self.attempt_timeout
    }

    /// The longest `Retry-After` honoured.
    pub fn get_max_retry_after(&self) -> Duration {
        self.max_retry_after
    }

    /// Declares the requests under this policy repeatable whatever their method: the
    /// service owner says a second copy does no harm (a POST-based query API, gRPC methods
    /// listed in a retry policy). They are then retried as idempotent methods are, after
    /// errors and retryable statuses alike, and the layer stamps no idempotency key on them.
    ///
    /// Use it for routes whose server really does tolerate duplicates: a keyless POST under
    /// it that timed out after the server did the work is sent again.
    ///
    /// ```
    /// use tower_http_retry::{RetryLayer, RetryPolicy, RouteMatch};
    ///
    /// let search = RetryPolicy::default().assume_idempotent();
    /// assert!(search.is_assumed_idempotent());
    /// let layer = RetryLayer::new().route(RouteMatch::post().path_prefix("/v1/search"), search);
    /// # let _ = layer;
    /// ```
    pub fn assume_idempotent(mut self) -> Self {
        self.assume_idempotent = true;
        self
    }

    /// True when [`RetryPolicy::assume_idempotent`] was set.
    pub fn is_assumed_idempotent(&self) -> bool {
        self.assume_idempotent
    }

    /// True when requests under this policy are sent once and never retried.
    pub fn is_never(&self) -> bool {
        self.max_attempts <= 1
    }

    /// True when a classifier other than the default was set.
    pub(crate) fn has_custom_classifier(&self) -> bool {
        self.classifier.is_some()
    }

    /// Classifies one outcome of the request whose head is `head`.
    pub(crate) fn classify(&self, head: &Head, outcome: Outcome<'_>) -> Classification {
        match &self.classifier {
            // The default looks at the outcome alone.
            None => crate::classify::classify_outcome(outcome),
            Some(classifier) => match head.as_parts() {
                Some(parts) => classifier.classify(parts, outcome),
                // Not reached: a head is kept as `Parts` when the policy has a classifier.
                None => classifier.classify(&head.to_parts(), outcome),
            },
        }
    }

    pub(crate) fn jitter_rng(&self) -> JitterRng {
        match &self.seed {
            Some(seq) => seq.rng(),
            None => JitterRng::Thread,
        }
    }
}

impl fmt::Debug for RetryPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryPolicy")
            .field("max_attempts", &self.max_attempts)
            .field("backoff", &self.backoff)
            .field("deadline", &self.deadline)
            .field("attempt_timeout", &self.attempt_timeout)
            .field("max_retry_after", &self.max_retry_after)
            .field("custom_classifier", &self.classifier.is_some())
            .field("budget", &self.budget)
            .field("seeded", &self.seed.is_some())
            .field("assume_idempotent", &self.assume_idempotent)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_the_design() {
        let p = RetryPolicy::default();
        assert_eq!(p.get_max_attempts(), 3);
        assert_eq!(p.get_backoff(), &Backoff::default());
        assert_eq!(p.get_deadline(), None);
        assert_eq!(p.get_attempt_timeout(), None);
        assert_eq!(p.get_max_retry_after(), Duration::from_secs(30));
        assert!(RetryPolicy::never().is_never());
        assert!(!p.is_never());
    }

    #[test]
    fn zero_attempts_is_refused() {
        let err = RetryPolicy::default().try_max_attempts(0).unwrap_err();
        assert!(err.to_string().contains("at least 1"), "{err}");
    }

    #[test]
    #[should_panic(expected = "at least 1")]
    fn zero_attempts_panics() {
        let _ = RetryPolicy::default().max_attempts(0);
    }
}
