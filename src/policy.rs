// How one class of requests is retried: attempts, time limits, backoff, classification.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::request;

use crate::backoff::{Backoff, JitterRng, SeedSequence};
use crate::classify::{Classification, Classify, Outcome};
use crate::error::InvalidConfig;
use crate::gate::{RetryBudget, RetryQuota, Throttle};
use crate::head::Head;
use crate::hedge::Hedging;
use crate::hook::{AttemptHook, Hooks};
use crate::idempotency::IdempotencyKey;

/// The retry rules for a class of requests.
///
/// Defaults: 3 attempts (the first included), [`Backoff::default`] (100 ms base, 10 s cap,
/// full jitter), no deadline, no per-attempt timeout, `Retry-After` honoured up to 30 s, the
/// [`DefaultClassifier`](crate::classify::DefaultClassifier), the layer's shared budget and
/// the layer's idempotency-key setting (no keys, unless the layer turned them on).
///
/// A policy is set on the layer ([`RetryLayer::policy`](crate::RetryLayer::policy)), per
/// route ([`RetryLayer::route`](crate::RetryLayer::route)), or per request by inserting it
/// in the request's extensions, which overrides both.
///
/// A policy is complete: a route's or a request's policy replaces the layer's default
/// policy and inherits nothing from it. What comes from the layer is what the layer itself
/// holds: its budget, throttle and idempotency keys when the policy sets none of its own,
/// and its attempt header always. Build the policies of a layer from one
/// base, so a route does not silently lose the deadline or the timeouts:
///
/// ```
/// use std::time::Duration;
/// use tower_http_retry::{Backoff, Jitter, RetryPolicy};
///
/// let base = RetryPolicy::default()
///     .backoff(Backoff::exponential(Duration::from_millis(50), Duration::from_secs(2))
///         .jitter(Jitter::Equal))
///     .deadline(Duration::from_secs(5))
///     .attempt_timeout(Duration::from_secs(1));
/// let payments = base.clone().max_attempts(5);
/// assert_eq!(payments.get_max_attempts(), 5);
/// assert_eq!(payments.get_deadline(), Some(Duration::from_secs(5)));
///
/// // Not so: this route keeps 5 attempts and drops the base's deadline and timeout.
/// let bare = RetryPolicy::default().max_attempts(5);
/// assert_eq!(bare.get_deadline(), None);
/// ```
#[derive(Clone)]
pub struct RetryPolicy {
    pub(crate) max_attempts: u32,
    pub(crate) backoff: Backoff,
    pub(crate) deadline: Option<Duration>,
    pub(crate) attempt_timeout: Option<Duration>,
    pub(crate) max_retry_after: Duration,
    pub(crate) classifier: Option<Arc<dyn Classify>>,
    pub(crate) budget: Layered<RetryBudget>,
    pub(crate) seed: Option<Arc<SeedSequence>>,
    pub(crate) assume_idempotent: bool,
    pub(crate) key: PolicyKey,
    pub(crate) throttle: Layered<Throttle>,
    pub(crate) quota: Layered<RetryQuota>,
    pub(crate) hooks: Hooks,
    pub(crate) transparent: bool,
    pub(crate) hedging: Option<Hedging>,
    /// Retries off altogether ([`RetryPolicy::never`]): the request is sent once and the
    /// gates hear nothing of it but the budget's deposit.
    pub(crate) never: bool,
}

/// A setting a policy takes from the layer unless it has its own, or none at all.
#[derive(Clone, Debug, Default)]
pub(crate) enum Layered<T> {
    #[default]
    Layer,
    Own(T),
    Off,
}

impl<T: Clone> Layered<T> {
    /// The policy's own, else the layer's, or none when the policy turned it off.
    pub(crate) fn or_layer(&self, layer: Option<&T>) -> Option<T> {
        match self {
            Layered::Layer => layer.cloned(),
            Layered::Own(own) => Some(own.clone()),
            Layered::Off => None,
        }
    }
}

/// A policy's own idempotency-key configuration.
#[derive(Clone, Debug, Default)]
pub(crate) enum PolicyKey {
    /// The layer's, unless the policy assumes its requests idempotent.
    #[default]
    Layer,
    Own(IdempotencyKey),
    Off,
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
            budget: Layered::Layer,
            seed: None,
            assume_idempotent: false,
            key: PolicyKey::Layer,
            throttle: Layered::Layer,
            quota: Layered::Layer,
            hooks: Hooks::default(),
            transparent: false,
            hedging: None,
            never: false,
        }
    }
}

impl RetryPolicy {
    /// The defaults listed on [`RetryPolicy`].
    ///
    /// ```
    /// use tower_http_retry::RetryPolicy;
    ///
    /// let policy = RetryPolicy::new();
    /// assert_eq!(policy.get_max_attempts(), 3);
    /// ```
    pub fn new() -> Self {
        Self::default()
    }

    /// A policy that never retries: the request is sent once, nothing is kept for a replay,
    /// and the gates hear nothing of it but the budget's deposit (no throttle or quota is
    /// told its outcome). Put it in a request's extensions to switch retries off for that
    /// request, or give it to a route.
    ///
    /// It is not the same as [`max_attempts(1)`](Self::max_attempts): a policy with one
    /// attempt sends each request once too, but still reports its outcome to its gates (a
    /// first-try success refills a [`RetryQuota`], a failure the classifier would have
    /// retried drains a [`Throttle`]), so that traffic without retries still counts.
    /// [`max_attempts`](Self::max_attempts) or [`transparent_retry`](Self::transparent_retry)
    /// on a `never()` policy turns retries back on.
    ///
    /// ```
    /// use bytes::Bytes;
    /// use http_body_util::Full;
    /// use tower_http_retry::RetryPolicy;
    ///
    /// // This one request is sent once, whatever the layer's policy.
    /// let mut request = http::Request::post("http://h/charge").body(Full::new(Bytes::new())).unwrap();
    /// request.extensions_mut().insert(RetryPolicy::never());
    /// assert!(RetryPolicy::never().is_never());
    /// assert!(!RetryPolicy::default().max_attempts(1).is_never());
    /// ```
    pub fn never() -> Self {
        Self {
            max_attempts: 1,
            never: true,
            ..Self::default()
        }
    }

    /// Attempts per logical request, the first included; 1 disables retries (the gates
    /// still hear each request's outcome: see [`RetryPolicy::never`] for the difference).
    ///
    /// ```
    /// use tower_http_retry::RetryPolicy;
    ///
    /// let policy = RetryPolicy::default().max_attempts(5); // the first and up to 4 retries
    /// assert_eq!(policy.get_max_attempts(), 5);
    /// ```
    ///
    /// # Panics
    ///
    /// When `attempts` is 0. [`RetryPolicy::try_max_attempts`] returns an error instead.
    #[track_caller]
    pub fn max_attempts(self, attempts: u32) -> Self {
        match self.try_max_attempts(attempts) {
            Ok(policy) => policy,
            Err(e) => panic!("{e}"),
        }
    }

    /// Like [`RetryPolicy::max_attempts`], but refuses 0 with an error.
    ///
    /// ```
    /// use tower_http_retry::RetryPolicy;
    ///
    /// // A count read from configuration: 0 is an error, not a panic.
    /// assert!(RetryPolicy::default().try_max_attempts(0).is_err());
    /// let policy = RetryPolicy::default().try_max_attempts(4)?;
    /// assert_eq!(policy.get_max_attempts(), 4);
    /// # Ok::<(), tower_http_retry::InvalidConfig>(())
    /// ```
    pub fn try_max_attempts(mut self, attempts: u32) -> Result<Self, InvalidConfig> {
        if attempts == 0 {
            return Err(InvalidConfig::new(
                crate::error::ConfigKind::Attempts,
                "max_attempts must be at least 1 (the first attempt counts)",
            ));
        }
        self.max_attempts = attempts;
        self.never = false;
        Ok(self)
    }

    /// The backoff between attempts.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_http_retry::{Backoff, Jitter, RetryPolicy};
    ///
    /// let policy = RetryPolicy::default().backoff(
    ///     Backoff::exponential(Duration::from_millis(50), Duration::from_secs(2)).jitter(Jitter::Equal),
    /// );
    /// assert_eq!(policy.get_backoff().get_cap(), Duration::from_secs(2));
    /// ```
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// The whole logical request, every attempt and every wait, ends within `deadline`.
    ///
    /// No wait starts that would end after it (the last outcome is returned instead); an
    /// attempt still in flight when it passes is dropped and the caller gets
    /// [`DeadlineExceeded`](crate::DeadlineExceeded).
    ///
    /// An attempt ends when its response head arrives: the deadline does not reach the
    /// response body the caller then reads, and a body that fails while it is read is
    /// returned to the caller as its error, not retried. To bound the whole exchange, put a
    /// timeout around the call and the body's reading together (`tokio::time::timeout`);
    /// to survive a download that breaks, read it again (with `Range`, where the server
    /// supports it).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_http_retry::RetryPolicy;
    ///
    /// let policy = RetryPolicy::default().deadline(Duration::from_secs(10));
    /// assert_eq!(policy.get_deadline(), Some(Duration::from_secs(10)));
    /// ```
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = Some(deadline);
        self
    }

    /// Removes the deadline.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_http_retry::RetryPolicy;
    ///
    /// let base = RetryPolicy::default().deadline(Duration::from_secs(10));
    /// // A long export: bounded by its attempts alone.
    /// let export = base.clone().no_deadline();
    /// assert_eq!(export.get_deadline(), None);
    /// ```
    pub fn no_deadline(mut self) -> Self {
        self.deadline = None;
        self
    }

    /// Each attempt is dropped after `min(timeout, time left before the deadline)`, which
    /// counts as a retryable timeout ([`AttemptTimedOut`](crate::AttemptTimedOut)).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_http_retry::RetryPolicy;
    ///
    /// // Each attempt gets 2 s, and all of them together 10 s.
    /// let policy = RetryPolicy::default()
    ///     .attempt_timeout(Duration::from_secs(2))
    ///     .deadline(Duration::from_secs(10));
    /// assert_eq!(policy.get_attempt_timeout(), Some(Duration::from_secs(2)));
    /// ```
    pub fn attempt_timeout(mut self, timeout: Duration) -> Self {
        self.attempt_timeout = Some(timeout);
        self
    }

    /// Removes the per-attempt timeout.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_http_retry::RetryPolicy;
    ///
    /// let base = RetryPolicy::default().attempt_timeout(Duration::from_secs(2));
    /// // A streaming download: one attempt may take as long as the deadline allows.
    /// let download = base.clone().no_attempt_timeout().deadline(Duration::from_secs(300));
    /// assert_eq!(download.get_attempt_timeout(), None);
    /// ```
    pub fn no_attempt_timeout(mut self) -> Self {
        self.attempt_timeout = None;
        self
    }

    /// The longest server hint the layer is willing to wait: every floor hint, whether
    /// `Retry-After`, the RateLimit fields, `X-RateLimit-Reset` or a classifier's
    /// [`Hint::new`](crate::hints::Hint::new). A longer one stops retrying and returns that
    /// outcome at once ([`StopReason::HintTooLong`](crate::StopReason::HintTooLong)).
    /// Default 30 s. An exact hint ([`Hint::exact`](crate::hints::Hint::exact), gRPC's
    /// pushback) is bounded by the deadline only.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_http_retry::RetryPolicy;
    ///
    /// // Wait out a `Retry-After` of up to two minutes; a longer one returns the response at once.
    /// let policy = RetryPolicy::default().max_retry_after(Duration::from_secs(120));
    /// assert_eq!(policy.get_max_retry_after(), Duration::from_secs(120));
    /// ```
    pub fn max_retry_after(mut self, max: Duration) -> Self {
        self.max_retry_after = max;
        self
    }

    /// Replaces the [`DefaultClassifier`](crate::classify::DefaultClassifier) with a closure
    /// given the request's head and one outcome. Its argument types are inferred:
    ///
    /// ```
    /// use bytes::Bytes;
    /// use http::{Request, Response, StatusCode};
    /// use http_body_util::Full;
    /// use tower::{Layer, ServiceExt};
    /// use tower_http_retry::classify::{Classification, Classify, DefaultClassifier, Outcome, RetryReason};
    /// use tower_http_retry::{RetryInfo, RetryLayer, RetryPolicy};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// // Also retry a 409 Conflict on the cart, once; everything else as by default.
    /// let policy = RetryPolicy::default().classifier(|head, outcome| match outcome {
    ///     Outcome::Response { status: StatusCode::CONFLICT, .. } if head.uri.path() == "/cart" => {
    ///         Classification::RetryOnce(RetryReason::Custom("conflict"))
    ///     }
    ///     _ => DefaultClassifier.classify(head, outcome),
    /// });
    /// # let calls = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    /// # let inner = tower::service_fn(move |_: Request<tower_http_retry::ReplayBody<Full<Bytes>>>| {
    /// #     let first = calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0;
    /// #     let status = if first { StatusCode::CONFLICT } else { StatusCode::OK };
    /// #     async move { Ok::<_, std::convert::Infallible>(Response::builder().status(status).body(()).unwrap()) }
    /// # });
    /// let client = RetryLayer::new().policy(policy).layer(inner);
    /// let request = Request::get("http://127.0.0.1:3000/cart").body(Full::new(Bytes::new())).unwrap();
    /// let response = client.oneshot(request).await.unwrap();
    /// assert_eq!(response.status(), StatusCode::OK);
    /// assert_eq!(response.extensions().get::<RetryInfo>().unwrap().attempts(), 2); // 409, then 200
    /// # }
    /// ```
    ///
    /// A classifier that is a type of its own goes to [`RetryPolicy::custom_classifier`].
    ///
    /// A custom classifier is given the request's head as `http::request::Parts`, so for
    /// requests under this policy the layer keeps its copy of the head in that form (a
    /// boxed `Parts` with its `HeaderMap` copy: three allocations), where the default
    /// classifier, which looks at the outcome alone, lets it keep a plain list of the
    /// header fields (one allocation). A classifier that does not read the head says so
    /// with [`Classify::needs_request`](crate::classify::Classify::needs_request).
    pub fn classifier<F>(self, classifier: F) -> Self
    where
        F: Fn(&request::Parts, Outcome<'_>) -> Classification + Send + Sync + 'static,
    {
        self.custom_classifier(classifier)
    }

    /// Replaces the [`DefaultClassifier`](crate::classify::DefaultClassifier) with any
    /// [`Classify`] implementation: a type of your own (see [`Classify`] for one that reads
    /// a response header). For a closure, [`RetryPolicy::classifier`] infers its argument
    /// types.
    ///
    /// ```
    /// use http::{StatusCode, request};
    /// use tower_http_retry::RetryPolicy;
    /// use tower_http_retry::classify::{Classification, Classify, DefaultClassifier, Outcome};
    ///
    /// /// The default rules, except that a 500 is final.
    /// struct FinalOn500;
    ///
    /// impl Classify for FinalOn500 {
    ///     fn classify(&self, head: &request::Parts, outcome: Outcome<'_>) -> Classification {
    ///         match outcome {
    ///             Outcome::Response { status: StatusCode::INTERNAL_SERVER_ERROR, .. } => Classification::Done,
    ///             _ => DefaultClassifier.classify(head, outcome),
    ///         }
    ///     }
    ///
    ///     // Reads the outcome only: the layer keeps a cheaper copy of the head.
    ///     fn needs_request(&self) -> bool {
    ///         false
    ///     }
    /// }
    ///
    /// let policy = RetryPolicy::default().custom_classifier(FinalOn500);
    /// # let _ = policy;
    /// ```
    pub fn custom_classifier<C: Classify>(mut self, classifier: C) -> Self {
        self.classifier = Some(Arc::new(classifier));
        self
    }

    /// Spends this policy's retries from `budget` instead of the layer's shared one.
    ///
    /// ```
    /// use tower_http_retry::{RetryBudget, RetryLayer, RetryPolicy, RouteMatch};
    ///
    /// // Search's retries cannot drain the budget the rest of the client relies on.
    /// let search = RetryPolicy::default().budget(RetryBudget::builder().max_tokens(20).build());
    /// let layer = RetryLayer::new().route(RouteMatch::get().path_prefix("/search"), search);
    /// # let _ = layer;
    /// ```
    pub fn budget(mut self, budget: RetryBudget) -> Self {
        self.budget = Layered::Own(budget);
        self
    }

    /// No budget for this policy's retries, whatever the layer has: only the attempt
    /// limit, the deadline (and a throttle, if any) bound them.
    ///
    /// ```
    /// use tower_http_retry::{RetryLayer, RetryPolicy, RouteMatch};
    ///
    /// // Health checks: two attempts each, never refused by the layer's budget.
    /// let health = RetryPolicy::default().max_attempts(2).no_budget();
    /// let layer = RetryLayer::new().route(RouteMatch::get().path_prefix("/health"), health);
    /// # let _ = layer;
    /// ```
    pub fn no_budget(mut self) -> Self {
        self.budget = Layered::Off;
        self
    }

    /// Draws jitter from generators seeded with `seed`, for tests and simulations. Every
    /// logical request still gets its own sequence (derived from the seed and the order in
    /// which requests first retry), so the same program replays the same waits.
    ///
    /// ```
    /// use tower_http_retry::RetryPolicy;
    ///
    /// // The same program waits the same times, run after run.
    /// let policy = RetryPolicy::default().rng_seed(42);
    /// # let _ = policy;
    /// ```
    pub fn rng_seed(mut self, seed: u64) -> Self {
        self.seed = Some(SeedSequence::new(seed));
        self
    }

    /// Attempts per logical request, the first included.
    ///
    /// ```
    /// use tower_http_retry::RetryPolicy;
    ///
    /// assert_eq!(RetryPolicy::default().get_max_attempts(), 3);
    /// assert_eq!(RetryPolicy::never().get_max_attempts(), 1);
    /// ```
    pub fn get_max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// The backoff.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_http_retry::{Backoff, RetryPolicy};
    ///
    /// let policy = RetryPolicy::default();
    /// assert_eq!(policy.get_backoff(), &Backoff::default());
    /// assert_eq!(policy.get_backoff().get_base(), Duration::from_millis(100));
    /// ```
    pub fn get_backoff(&self) -> &Backoff {
        &self.backoff
    }

    /// The overall deadline, if any.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_http_retry::RetryPolicy;
    ///
    /// assert_eq!(RetryPolicy::default().get_deadline(), None); // none by default
    /// let policy = RetryPolicy::default().deadline(Duration::from_secs(5));
    /// assert_eq!(policy.get_deadline(), Some(Duration::from_secs(5)));
    /// ```
    pub fn get_deadline(&self) -> Option<Duration> {
        self.deadline
    }

    /// The per-attempt timeout, if any.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_http_retry::RetryPolicy;
    ///
    /// assert_eq!(RetryPolicy::default().get_attempt_timeout(), None); // none by default
    /// let policy = RetryPolicy::default().attempt_timeout(Duration::from_millis(500));
    /// assert_eq!(policy.get_attempt_timeout(), Some(Duration::from_millis(500)));
    /// ```
    pub fn get_attempt_timeout(&self) -> Option<Duration> {
        self.attempt_timeout
    }

    /// The longest floor hint honoured ([`RetryPolicy::max_retry_after`]).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_http_retry::RetryPolicy;
    ///
    /// assert_eq!(RetryPolicy::default().get_max_retry_after(), Duration::from_secs(30));
    /// ```
    pub fn get_max_retry_after(&self) -> Duration {
        self.max_retry_after
    }

    /// Declares the requests under this policy repeatable whatever their method: the
    /// service owner says a second copy does no harm, also while the first is still in
    /// flight (a POST-based query API, gRPC methods listed in a retry or hedging policy).
    /// They are then retried as idempotent methods are, after errors and retryable
    /// statuses alike, hedged when the policy hedges ([`RetryPolicy::hedge`]), and the layer
    /// stamps no idempotency key on them unless this policy configures one itself
    /// ([`RetryPolicy::idempotency_key`]).
    ///
    /// Use it for routes whose server really does tolerate duplicates: a keyless POST under
    /// it that timed out after the server did the work is sent again. A PUT or DELETE route
    /// needs it to be hedged, and should be sure of it first: idempotent is not the same as
    /// safe to run twice at the same time. A DELETE the slow first attempt already applied
    /// makes the hedge answer 404, and a PUT with `If-Match` makes it answer 412; that
    /// answer wins, and the caller is told the write failed though it was applied once.
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

    /// Sends a request again at once when the transport proved it never left the client
    /// (`RST_STREAM(REFUSED_STREAM)` on the request's own stream, or a request hyper never
    /// started because its connection closed; with the `hyper` feature): once per logical
    /// request, whatever the classifier says, without counting against
    /// [`max_attempts`](Self::max_attempts), without a wait, and outside the throttle and
    /// the quota; the deadline and the budget still apply, and a second such failure is
    /// judged by the normal rules. A refused connection is no transparent retry: the server is down,
    /// and the policy judges that (as gRPC's clients do). The retry is in the record, of kind
    /// [`AttemptKind::Transparent`](crate::AttemptKind::Transparent). gRPC's A6 calls it a
    /// transparent retry, and gRPC policies have it.
    ///
    /// Even with `max_attempts(1)` the body is then kept for that one replay. On a
    /// [`never()`](Self::never) policy it turns retries back on, with one attempt.
    ///
    /// ```
    /// use tower_http_retry::RetryPolicy;
    ///
    /// let policy = RetryPolicy::default().max_attempts(1).transparent_retry();
    /// assert!(policy.has_transparent_retry());
    /// assert!(!RetryPolicy::never().transparent_retry().is_never());
    /// ```
    pub fn transparent_retry(mut self) -> Self {
        self.transparent = true;
        self.never = false;
        self
    }

    /// True when [`RetryPolicy::transparent_retry`] was set.
    ///
    /// ```
    /// use tower_http_retry::RetryPolicy;
    ///
    /// assert!(!RetryPolicy::default().has_transparent_retry());
    /// assert!(RetryPolicy::default().transparent_retry().has_transparent_retry());
    /// ```
    pub fn has_transparent_retry(&self) -> bool {
        self.transparent
    }

    /// Hedges the requests under this policy that are safe to send twice at once: the safe
    /// methods (GET, HEAD, OPTIONS, TRACE, QUERY), and every request when the policy
    /// [declares them repeatable](Self::assume_idempotent). While none has answered,
    /// another attempt is sent as `hedging` says, up to [`max_attempts`](Self::max_attempts)
    /// in all, and the first outcome that is not a non-fatal failure wins ([`Hedging`] has
    /// the rules). Hedged requests are not retried otherwise: a failure sends the next hedge
    /// instead, without a backoff. Other requests under the policy get its ordinary
    /// retries: a PUT or DELETE (idempotent, but a copy racing a slow first attempt may
    /// answer 404 or 412), and a keyed POST (a server that de-duplicates on the key answers
    /// a concurrent duplicate with 409). With `max_attempts(1)` nothing is hedged.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_http_retry::{Hedging, RetryLayer, RetryPolicy, RouteMatch};
    ///
    /// let search = RetryPolicy::default()
    ///     .max_attempts(2)
    ///     .hedge(Hedging::after(Duration::from_millis(20)));
    /// let layer = RetryLayer::new().route(RouteMatch::get().path_prefix("/search"), search);
    /// # let _ = layer;
    /// ```
    pub fn hedge(mut self, hedging: Hedging) -> Self {
        self.hedging = Some(hedging);
        self
    }

    /// The policy's hedging, if it hedges.
    pub fn get_hedging(&self) -> Option<&Hedging> {
        self.hedging.as_ref()
    }

    /// Stops this policy's retries while its server fails more often than the throttle
    /// tolerates (1 attempt in 11 at its default ratio): a
    /// [`Throttle`] of its own, instead of the layer's
    /// ([`RetryLayer::throttle`](crate::RetryLayer::throttle)).
    ///
    /// ```
    /// use tower_http_retry::{RetryPolicy, Throttle};
    ///
    /// let policy = RetryPolicy::default().throttle(Throttle::builder().max_tokens(20.0).build());
    /// # let _ = policy;
    /// ```
    pub fn throttle(mut self, throttle: Throttle) -> Self {
        self.throttle = Layered::Own(throttle);
        self
    }

    /// No throttle for this policy's retries, whatever the layer has.
    ///
    /// ```
    /// use tower_http_retry::{RetryLayer, RetryPolicy, RouteMatch, Throttle};
    ///
    /// // The layer's throttle guards every server but the one this route goes to.
    /// let layer = RetryLayer::new()
    ///     .throttle(Throttle::builder().build())
    ///     .route(RouteMatch::any().host("backup.internal"), RetryPolicy::default().no_throttle());
    /// # let _ = layer;
    /// ```
    pub fn no_throttle(mut self) -> Self {
        self.throttle = Layered::Off;
        self
    }

    /// Pays this policy's retries from a [`RetryQuota`] of its own, instead of the layer's
    /// ([`RetryLayer::quota`](crate::RetryLayer::quota)).
    ///
    /// ```
    /// use tower_http_retry::{RetryPolicy, RetryQuota};
    ///
    /// let policy = RetryPolicy::default().quota(RetryQuota::aws_standard());
    /// # let _ = policy;
    /// ```
    pub fn quota(mut self, quota: RetryQuota) -> Self {
        self.quota = Layered::Own(quota);
        self
    }

    /// No quota for this policy's retries, whatever the layer has.
    ///
    /// ```
    /// use tower_http_retry::{RetryLayer, RetryPolicy, RetryQuota, RouteMatch};
    ///
    /// // The layer's quota pays for every route's retries but this one's.
    /// let layer = RetryLayer::new()
    ///     .quota(RetryQuota::aws_standard())
    ///     .route(RouteMatch::get().path_prefix("/health"), RetryPolicy::default().no_quota());
    /// # let _ = layer;
    /// ```
    pub fn no_quota(mut self) -> Self {
        self.quota = Layered::Off;
        self
    }

    /// Runs `hook` on every attempt's request before it is sent (see [`AttemptHook`]). A
    /// policy has at most one hook of each type: a second one of the same type replaces
    /// the first.
    ///
    /// ```
    /// use http::{HeaderMap, HeaderValue};
    /// use tower_http_retry::{AttemptContext, AttemptHook, RetryPolicy};
    ///
    /// /// Tells the server which attempt this is: `1`, `2`, ...
    /// struct AttemptNumber;
    ///
    /// impl AttemptHook for AttemptNumber {
    ///     fn before_attempt(&self, attempt: &AttemptContext, headers: &mut HeaderMap) {
    ///         headers.insert("x-attempt", HeaderValue::from(attempt.number));
    ///     }
    /// }
    ///
    /// let policy = RetryPolicy::default().on_attempt(AttemptNumber);
    /// # let _ = policy;
    /// ```
    pub fn on_attempt<H: AttemptHook>(mut self, hook: H) -> Self {
        self.hooks.add(hook);
        self
    }

    /// True when [`RetryPolicy::assume_idempotent`] was set.
    ///
    /// ```
    /// use tower_http_retry::RetryPolicy;
    ///
    /// assert!(!RetryPolicy::default().is_assumed_idempotent());
    /// assert!(RetryPolicy::default().assume_idempotent().is_assumed_idempotent());
    /// ```
    pub fn is_assumed_idempotent(&self) -> bool {
        self.assume_idempotent
    }

    /// Turns idempotency keys on for this policy's requests, as `key` says, in place of the
    /// layer's key configuration: on a route, for the requests it matches ("this API
    /// de-duplicates on the key"); in a request's extensions, for that request. A
    /// non-idempotent request under it gets one stable key before its first attempt, the
    /// same on every retry, and may be retried. Also with
    /// [`RetryPolicy::assume_idempotent`], which on its own stamps no key.
    ///
    /// Give each API the key format it documents:
    ///
    /// ```
    /// use bytes::Bytes;
    /// use http::{Request, Response};
    /// use http_body_util::Full;
    /// use tower::{Layer, ServiceExt};
    /// use tower_http_retry::{IdempotencyKey, RetryInfo, RetryLayer, RetryPolicy, RouteMatch};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// # let inner = tower::service_fn(|req: Request<tower_http_retry::ReplayBody<Full<Bytes>>>| async move {
    /// #     let mut response = Response::new(());
    /// #     response.extensions_mut().insert(req.headers().clone());
    /// #     Ok::<_, std::convert::Infallible>(response)
    /// # });
    /// let base = RetryPolicy::default();
    /// let client = RetryLayer::new()
    ///     // Stripe documents the bare token; every other route keeps the quoted default.
    ///     .route(
    ///         RouteMatch::post().host("api.stripe.com"),
    ///         base.clone().idempotency_key(IdempotencyKey::default().raw()),
    ///     )
    ///     .policy(base)
    ///     .layer(inner);
    ///
    /// let request = Request::post("https://api.stripe.com/v1/charges")
    ///     .body(Full::new(Bytes::from_static(b"amount=100")))
    ///     .unwrap();
    /// let response = client.oneshot(request).await.unwrap();
    /// let key = response.extensions().get::<RetryInfo>().unwrap().idempotency_key();
    /// // 36 characters: a UUID v4 without the quotes of the default.
    /// assert_eq!(key.map(|key| key.len()), Some(36));
    /// # let sent = response.extensions().get::<http::HeaderMap>().unwrap();
    /// # assert_eq!(sent.get("idempotency-key"), key);
    /// # }
    /// ```
    pub fn idempotency_key(mut self, key: IdempotencyKey) -> Self {
        self.key = PolicyKey::Own(key);
        self
    }

    /// Stamps no idempotency key on this policy's requests, whatever the layer does: the
    /// switch off for a route under a layer that turned keys on
    /// ([`RetryLayer::idempotency_key`](crate::RetryLayer::idempotency_key)). A
    /// non-idempotent request under it is then retried only when the caller set the key
    /// header itself, or when the failure proves the server never saw the request.
    ///
    /// For routes whose server ignores `Idempotency-Key`: a generated key there makes a POST
    /// retryable without making the retry safe.
    ///
    /// ```
    /// use bytes::Bytes;
    /// use http::{Request, Response, StatusCode};
    /// use http_body_util::Full;
    /// use tower::{Layer, ServiceExt};
    /// use tower_http_retry::{IdempotencyKey, RetryInfo, RetryLayer, RetryPolicy, RouteMatch, StopReason};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// # let inner = tower::service_fn(|_: Request<tower_http_retry::ReplayBody<Full<Bytes>>>| async {
    /// #     Ok::<_, std::convert::Infallible>(
    /// #         Response::builder().status(StatusCode::SERVICE_UNAVAILABLE).body(()).unwrap(),
    /// #     )
    /// # });
    /// let base = RetryPolicy::default();
    /// let client = RetryLayer::new()
    ///     // Every server behind this client de-duplicates on keys, but one.
    ///     .idempotency_key(IdempotencyKey::default())
    ///     // This server applies a repeated POST twice, key or no key.
    ///     .route(RouteMatch::post().path_prefix("/legacy"), base.clone().no_idempotency_key())
    ///     .policy(base)
    ///     .layer(inner);
    ///
    /// let request = Request::post("http://127.0.0.1:3000/legacy/orders")
    ///     .body(Full::new(Bytes::from_static(b"{}")))
    ///     .unwrap();
    /// let response = client.oneshot(request).await.unwrap();
    /// let info = response.extensions().get::<RetryInfo>().unwrap();
    /// assert_eq!(info.idempotency_key(), None);
    /// assert_eq!(info.attempts(), 1); // the 503 is returned: the POST may have been applied
    /// assert_eq!(info.stop(), StopReason::NotIdempotent);
    /// # }
    /// ```
    pub fn no_idempotency_key(mut self) -> Self {
        self.key = PolicyKey::Off;
        self
    }

    /// True for [`RetryPolicy::never`]: retries off, and no gate told of the outcome. A
    /// policy with [`max_attempts(1)`](Self::max_attempts) sends each request once too, but
    /// is not `never()`: its gates hear its outcomes.
    ///
    /// ```
    /// use tower_http_retry::RetryPolicy;
    ///
    /// assert!(RetryPolicy::never().is_never());
    /// assert!(!RetryPolicy::default().max_attempts(1).is_never());
    /// assert!(!RetryPolicy::never().max_attempts(3).is_never()); // retries back on
    /// assert!(!RetryPolicy::default().is_never());
    /// ```
    pub fn is_never(&self) -> bool {
        self.never
    }

    /// True when each request is sent once (one attempt, no transparent retry), whether
    /// or not the gates hear of it.
    pub(crate) fn sends_once(&self) -> bool {
        self.never || (self.max_attempts <= 1 && !self.transparent)
    }

    /// True when a classifier other than the default was set.
    pub(crate) fn has_custom_classifier(&self) -> bool {
        self.classifier.is_some()
    }

    /// Whether the classifier looks at the request's head, which is then kept as `Parts`.
    pub(crate) fn classifier_needs_request(&self) -> bool {
        self.classifier
            .as_ref()
            .is_some_and(|classifier| classifier.needs_request())
    }

    /// Classifies one outcome of the request whose head is `head`.
    pub(crate) fn classify(&self, head: &Head, outcome: Outcome<'_>) -> Classification {
        self.classify_parts(head.as_parts(), outcome)
    }

    /// Classifies one outcome, given the request's head as `Parts` when it was kept so
    /// (a classifier of the outcome alone gets an empty head).
    pub(crate) fn classify_parts(
        &self,
        parts: Option<&request::Parts>,
        outcome: Outcome<'_>,
    ) -> Classification {
        match &self.classifier {
            // The default looks at the outcome alone.
            None => crate::classify::classify_outcome(outcome),
            Some(classifier) => match parts {
                Some(parts) => classifier.classify(parts, outcome),
                None => classifier.classify(crate::classify::empty_head(), outcome),
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
            .field("idempotency_key", &self.key)
            .field("throttle", &self.throttle)
            .field("quota", &self.quota)
            .field("hooks", &self.hooks)
            .field("transparent_retry", &self.transparent)
            .field("hedging", &self.hedging)
            .field("never", &self.never)
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
    fn one_attempt_with_a_transparent_retry_is_not_never() {
        let one = RetryPolicy::default().max_attempts(1).transparent_retry();
        assert!(!one.is_never());
        assert!(!one.sends_once());
        assert!(one.has_transparent_retry());
        assert!(!RetryPolicy::default().has_transparent_retry());
        assert!(RetryPolicy::never().is_never());
    }

    #[test]
    fn never_is_a_setting_of_its_own() {
        let never = RetryPolicy::never();
        assert!(never.is_never() && never.sends_once());
        assert_eq!(never.get_max_attempts(), 1);
        // One attempt sends once, but its gates still hear it: not `never()`.
        let one = RetryPolicy::default().max_attempts(1);
        assert!(!one.is_never() && one.sends_once());
        // Settings that turn retries on turn `never()` off.
        let again = RetryPolicy::never().max_attempts(3);
        assert!(!again.is_never() && !again.sends_once());
        assert!(!RetryPolicy::never().transparent_retry().is_never());
        // The rest of a `never()` policy's settings keep it off.
        assert!(
            RetryPolicy::never()
                .no_budget()
                .assume_idempotent()
                .is_never()
        );
        assert!(!RetryPolicy::default().sends_once());
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
