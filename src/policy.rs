// How one class of requests is retried: attempts, time limits, backoff, classification,
// gates, keys, hooks, hedging. `RetryPolicy` is what a user writes, and records only what
// was set; `Settings` is a policy laid over every policy beneath it, down to the crate's
// defaults: what a request under it runs with.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, request};

use crate::backoff::{Backoff, JitterRng, SeedSequence};
use crate::classify::{Classification, Classify, Outcome};
use crate::error::InvalidConfig;
use crate::gate::{Gate, GateSet};
use crate::head::Head;
use crate::hedge::Hedging;
use crate::hook::{AttemptHook, Hooks};
use crate::idempotency::{IDEMPOTENCY_KEY, IdempotencyKey};

/// The retry rules for a class of requests: what this policy changes, and nothing else.
///
/// A policy records only the settings it was given. The layer's policy
/// ([`RetryLayer::policy`](crate::RetryLayer::policy)) is laid over the crate's defaults; a
/// route's policy ([`RetryLayer::route`](crate::RetryLayer::route)) over the layer's; a
/// policy in a request's extensions over the policy of the route the request matched. So a
/// route changes what it names and keeps the rest, the layer's deadline included:
///
/// ```
/// use std::time::Duration;
/// use tower_http_retry::{RetryLayer, RetryPolicy, RouteMatch};
///
/// let layer = RetryLayer::new()
///     .policy(RetryPolicy::new().deadline(Duration::from_secs(5)))
///     // Five attempts for payments, within the layer's 5 s deadline.
///     .route(RouteMatch::post().path_prefix("/v1/payments"), RetryPolicy::new().max_attempts(5));
///
/// // A policy shows what it sets.
/// let payments = RetryPolicy::new().max_attempts(5);
/// assert_eq!(format!("{payments:?}"), "RetryPolicy { max_attempts: 5 }");
/// # let _ = layer;
/// ```
///
/// The crate's defaults, under every layer: 3 attempts (the first included),
/// [`Backoff::default`] (100 ms base, 10 s cap, full jitter), no deadline, no attempt
/// timeout, server hints honoured up to 30 s, the default classification
/// ([`DefaultClassifier`](crate::classify::DefaultClassifier)), a [`RetryBudget`](crate::RetryBudget)
/// of the layer's own, no idempotency keys, no hedging, no transparent retries.
///
/// A policy's settings are written with its builder methods, each of which has an off
/// switch where a policy beneath may have turned it on: `None` for an optional value
/// (`deadline(None)`), `false` for a flag, `no_*` to clear a list (`no_gates`, `no_hooks`);
/// they are not read back one by one: `{:?}` shows what a policy sets, and the record of a
/// request ([`RetryInfo`](crate::RetryInfo)) what it did.
#[derive(Clone, Default)]
pub struct RetryPolicy {
    max_attempts: Option<u32>,
    backoff: Option<Backoff>,
    deadline: Option<Option<Duration>>,
    attempt_timeout: Option<Option<Duration>>,
    deadline_header: Option<Option<HeaderName>>,
    min_time_left: Option<Duration>,
    max_retry_after: Option<Duration>,
    classifier: Option<Arc<dyn Classify>>,
    gates: GateSet,
    seed: Option<Arc<SeedSequence>>,
    assume_idempotent: Option<bool>,
    key: Option<KeySetting>,
    hooks: Hooks,
    transparent: Option<bool>,
    hedging: Option<Option<Hedging>>,
    never: Option<bool>,
    resume: Option<bool>,
    max_continuations: Option<u32>,
    body_idle_timeout: Option<Option<Duration>>,
}

/// A policy's idempotency-key setting.
#[derive(Clone, Debug)]
enum KeySetting {
    Stamp(IdempotencyKey),
    /// No keys stamped; a caller's key is still looked for under this header, the last
    /// one a policy beneath stamped (else `Idempotency-Key`).
    Off(Option<HeaderName>),
}

impl RetryPolicy {
    /// A policy that sets nothing: laid over another, it changes nothing.
    ///
    /// ```
    /// use tower_http_retry::RetryPolicy;
    ///
    /// assert_eq!(format!("{:?}", RetryPolicy::new()), "RetryPolicy");
    /// ```
    pub fn new() -> Self {
        Self::default()
    }

    /// A policy that never retries, wherever it is laid: one attempt, no hedges, no
    /// transparent retry. The request is sent once, nothing is kept for a replay, and the
    /// gates hear nothing of it but the budget's deposit (no throttle or quota is told its
    /// outcome). Put it in a request's extensions to switch retries off for that request, or
    /// give it to a route.
    ///
    /// It is not the same as [`max_attempts(1)`](Self::max_attempts): a policy with one
    /// attempt sends each request once too, but still reports its outcome to its gates (a
    /// first-try success refills a [`RetryQuota`](crate::RetryQuota), a failure the
    /// classifier would have retried drains a [`Throttle`](crate::Throttle)), so that traffic
    /// without retries still counts. [`max_attempts`](Self::max_attempts) or
    /// [`transparent_retry`](Self::transparent_retry) after `never()` turns retries back on.
    ///
    /// ```
    /// use bytes::Bytes;
    /// use http_body_util::Full;
    /// use tower_http_retry::RetryPolicy;
    ///
    /// // This one request is sent once, whatever the layer's and the route's policies.
    /// let mut request = http::Request::post("http://h/charge").body(Full::new(Bytes::new())).unwrap();
    /// request.extensions_mut().insert(RetryPolicy::never());
    /// ```
    pub fn never() -> Self {
        Self {
            max_attempts: Some(1),
            hedging: Some(None),
            transparent: Some(false),
            never: Some(true),
            ..Self::default()
        }
    }

    /// Attempts per logical request, the first included (default 3); 1 disables retries
    /// (the gates still hear each request's outcome: see [`RetryPolicy::never`] for the
    /// difference).
    ///
    /// ```
    /// use tower_http_retry::RetryPolicy;
    ///
    /// let policy = RetryPolicy::new().max_attempts(5); // the first and up to 4 retries
    /// # let _ = policy;
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
    /// assert!(RetryPolicy::new().try_max_attempts(0).is_err());
    /// let policy = RetryPolicy::new().try_max_attempts(4)?;
    /// # let _ = policy;
    /// # Ok::<(), tower_http_retry::InvalidConfig>(())
    /// ```
    pub fn try_max_attempts(mut self, attempts: u32) -> Result<Self, InvalidConfig> {
        if attempts == 0 {
            return Err(InvalidConfig::new(
                "max_attempts must be at least 1 (the first attempt counts)",
            ));
        }
        self.max_attempts = Some(attempts);
        self.never = Some(false);
        Ok(self)
    }

    /// The backoff between attempts.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_http_retry::{Backoff, Jitter, RetryPolicy};
    ///
    /// let policy = RetryPolicy::new().backoff(
    ///     Backoff::exponential(Duration::from_millis(50), Duration::from_secs(2)).jitter(Jitter::Equal),
    /// );
    /// # let _ = policy;
    /// ```
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = Some(backoff);
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
    /// let policy = RetryPolicy::new().deadline(Duration::from_secs(10));
    /// # let _ = policy;
    /// ```
    ///
    /// `None` turns it off: no deadline for this policy's requests, whatever a policy
    /// beneath set.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_http_retry::{RetryLayer, RetryPolicy, RouteMatch};
    ///
    /// // A long export: bounded by its attempts alone.
    /// let layer = RetryLayer::new()
    ///     .policy(RetryPolicy::new().deadline(Duration::from_secs(10)))
    ///     .route(RouteMatch::get().path_prefix("/export"), RetryPolicy::new().deadline(None));
    /// # let _ = layer;
    /// ```
    pub fn deadline(mut self, deadline: impl Into<Option<Duration>>) -> Self {
        self.deadline = Some(deadline.into());
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
    /// let policy = RetryPolicy::new()
    ///     .attempt_timeout(Duration::from_secs(2))
    ///     .deadline(Duration::from_secs(10));
    /// # let _ = policy;
    /// ```
    ///
    /// `None` turns it off: no per-attempt timeout for this policy's requests, whatever a
    /// policy beneath set.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_http_retry::RetryPolicy;
    ///
    /// // A streaming download: one attempt may take as long as the deadline allows.
    /// let download = RetryPolicy::new().attempt_timeout(None).deadline(Duration::from_secs(300));
    /// # let _ = download;
    /// ```
    pub fn attempt_timeout(mut self, timeout: impl Into<Option<Duration>>) -> Self {
        self.attempt_timeout = Some(timeout.into());
        self
    }

    /// Tells the server how long each attempt has: `name` is written on every attempt
    /// (the first, each retry, hedge and body continuation) with the lesser of the time
    /// left before the [deadline](Self::deadline) and the
    /// [attempt timeout](Self::attempt_timeout), in whole milliseconds, rounded up and
    /// never 0 (Envoy reads 0 as "no timeout"; it writes 1 when the time is gone, and so
    /// does this). An attempt with neither limit carries nothing (the caller's own value,
    /// if it set one, goes as it is). A server reads it with
    /// [`DeadlineLayer`](crate::DeadlineLayer), and stops working when the client has
    /// stopped waiting.
    ///
    /// The value is relative, as Envoy's, userver's and Connect's are: hosts' clocks need
    /// not agree, and the time the request spends in transit is not counted (the server
    /// believes it has up to that much more). [`RetryPolicy::no_hooks`] leaves it on; `None`
    /// turns it off, whatever a policy beneath set.
    ///
    /// ```
    /// use std::time::Duration;
    /// use http::HeaderName;
    /// use tower_http_retry::{RetryLayer, RetryPolicy, RouteMatch};
    ///
    /// let layer = RetryLayer::new()
    ///     .policy(
    ///         RetryPolicy::new()
    ///             .deadline(Duration::from_secs(2))
    ///             .deadline_header(HeaderName::from_static("x-timeout-ms")),
    ///     )
    ///     // A partner's API, which has no use for it.
    ///     .route(RouteMatch::any().path_prefix("/partner"), RetryPolicy::new().deadline_header(None));
    /// # let _ = layer;
    /// ```
    pub fn deadline_header(mut self, name: impl Into<Option<HeaderName>>) -> Self {
        self.deadline_header = Some(name.into());
        self
    }

    /// [`deadline_header`](Self::deadline_header) under Envoy's name,
    /// `x-envoy-upstream-rq-timeout-ms`: an Envoy in front of the server then bounds the
    /// request, its own retries included, by the time this attempt has (Envoy removes the
    /// header before it forwards the request, and tells its upstream in
    /// `x-envoy-expected-rq-timeout-ms`, which [`DeadlineLayer::envoy`](crate::DeadlineLayer::envoy)
    /// reads).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_http_retry::RetryPolicy;
    ///
    /// let policy = RetryPolicy::new().deadline(Duration::from_secs(2)).envoy_deadline_header();
    /// assert_eq!(
    ///     format!("{policy:?}"),
    ///     r#"RetryPolicy { deadline: Some(2s), deadline_header: Some("x-envoy-upstream-rq-timeout-ms") }"#
    /// );
    /// ```
    pub fn envoy_deadline_header(self) -> Self {
        self.deadline_header(crate::deadline::ENVOY_UPSTREAM_TIMEOUT)
    }

    /// No attempt is started with less than `floor` left before the deadline: not the
    /// first, a retry, a hedge or a body continuation. An attempt that could not finish in
    /// time is load on the server for nothing. A retry whose wait would leave less is not
    /// taken (the last outcome is returned); a first attempt, or one whose service became
    /// ready too late, is not sent, and the caller gets
    /// [`DeadlineExceeded`](crate::DeadlineExceeded), whose message names the floor. The
    /// record's stop is [`StopReason::Deadline`](crate::StopReason::Deadline) either way.
    /// Without a deadline it does nothing; `Duration::ZERO` (the default) turns it off.
    ///
    /// ```
    /// use std::time::Duration;
    /// use bytes::Bytes;
    /// use http::{Request, Response};
    /// use http_body_util::Full;
    /// use tower::{Layer, ServiceExt};
    /// use tower_http_retry::{DeadlineExceeded, RetryError, RetryLayer, RetryPolicy, StopReason};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// # let inner = tower::service_fn(|_: Request<tower_http_retry::ReplayBody<Full<Bytes>>>| async {
    /// #     Ok::<_, std::convert::Infallible>(Response::new(()))
    /// # });
    /// // A deadline of 30 ms leaves less than the 50 ms an attempt needs: nothing is sent.
    /// let client = RetryLayer::new()
    ///     .policy(RetryPolicy::new().min_time_left(Duration::from_millis(50)))
    ///     .layer(inner);
    /// let mut request = Request::get("http://127.0.0.1:3000/").body(Full::new(Bytes::new())).unwrap();
    /// request.extensions_mut().insert(RetryPolicy::new().deadline(Duration::from_millis(30)));
    /// let error = client.oneshot(request).await.unwrap_err();
    /// let error = error.downcast_ref::<RetryError>().unwrap();
    /// assert_eq!((error.info().attempts(), error.info().stop()), (0, StopReason::Deadline));
    /// assert!(error.get_ref().is::<DeadlineExceeded>());
    /// assert_eq!(
    ///     error.get_ref().to_string(),
    ///     "request deadline of 30ms exceeded: less than the 50ms floor was left to start an attempt"
    /// );
    /// # }
    /// ```
    pub fn min_time_left(mut self, floor: Duration) -> Self {
        self.min_time_left = Some(floor);
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
    /// let policy = RetryPolicy::new().max_retry_after(Duration::from_secs(120));
    /// # let _ = policy;
    /// ```
    pub fn max_retry_after(mut self, max: Duration) -> Self {
        self.max_retry_after = Some(max);
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
    /// let policy = RetryPolicy::new().classifier(|head, outcome| match outcome {
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
    /// }
    ///
    /// let policy = RetryPolicy::new().custom_classifier(FinalOn500);
    /// # let _ = policy;
    /// ```
    pub fn custom_classifier<C: Classify>(mut self, classifier: C) -> Self {
        self.classifier = Some(Arc::new(classifier));
        self
    }

    /// Passes this policy's retries through `gate` ([`RetryBudget`](crate::RetryBudget),
    /// [`Throttle`](crate::Throttle), [`RetryQuota`](crate::RetryQuota) or
    /// [`ConcurrencyBudget`](crate::ConcurrencyBudget)), or all its
    /// attempts ([`AdaptiveLimiter`](crate::AdaptiveLimiter),
    /// [`AdaptiveThrottle`](crate::AdaptiveThrottle)), in place of a gate of the
    /// same kind beneath; gates of other kinds beneath still apply. Every
    /// layer has a budget of its own beneath its policy.
    ///
    /// ```
    /// use tower_http_retry::{RetryBudget, RetryLayer, RetryPolicy, RouteMatch, Throttle};
    ///
    /// let layer = RetryLayer::new()
    ///     // Every route: the layer's own budget, and a throttle per server.
    ///     .policy(RetryPolicy::new().gate(Throttle::builder().per_authority().build()))
    ///     // Search's retries cannot drain the budget the rest of the client relies on.
    ///     .route(
    ///         RouteMatch::get().path_prefix("/search"),
    ///         RetryPolicy::new().gate(RetryBudget::builder().max_tokens(20.0).build()),
    ///     );
    /// # let _ = layer;
    /// ```
    pub fn gate<G: Gate>(mut self, gate: G) -> Self {
        self.gates.set(crate::gate::sealed::Sealed::into_any(gate));
        self
    }

    /// No gate but those this policy sets itself after this call: the gates beneath (the
    /// layer's budget among them) do not apply to its requests. Their retries are then
    /// bounded by the attempt limit and the deadline alone.
    ///
    /// ```
    /// use tower_http_retry::{RetryLayer, RetryPolicy, RouteMatch};
    ///
    /// // Health checks: two attempts each, never refused by the layer's budget.
    /// let layer = RetryLayer::new()
    ///     .route(RouteMatch::get().path_prefix("/health"), RetryPolicy::new().max_attempts(2).no_gates());
    /// // A layer with no budget at all.
    /// let unbounded = RetryLayer::new().policy(RetryPolicy::new().no_gates());
    /// # let _ = (layer, unbounded);
    /// ```
    pub fn no_gates(mut self) -> Self {
        self.gates.clear();
        self
    }

    /// Draws jitter from generators seeded with `seed`, for tests and simulations (the
    /// `test-util` feature). Every logical request still gets its own sequence (derived
    /// from the seed and the order in which requests first retry), so the same program
    /// replays the same waits.
    ///
    /// ```
    /// use tower_http_retry::RetryPolicy;
    ///
    /// // The same program waits the same times, run after run.
    /// let policy = RetryPolicy::new().rng_seed(42);
    /// # let _ = policy;
    /// ```
    #[cfg(feature = "test-util")]
    #[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
    pub fn rng_seed(mut self, seed: u64) -> Self {
        self.seed = Some(SeedSequence::new(seed));
        self
    }

    /// Declares the requests under this policy repeatable whatever their method: the
    /// service owner says a second copy does no harm, also while the first is still in
    /// flight (a POST-based query API, gRPC methods listed in a retry or hedging policy).
    /// They are then retried as idempotent methods are, after errors and retryable
    /// statuses alike, hedged when the policy hedges ([`RetryPolicy::hedge`]), and get no
    /// idempotency key from a policy beneath (only one this policy sets itself:
    /// [`RetryPolicy::idempotency_key`]).
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
    /// let layer = RetryLayer::new()
    ///     .route(RouteMatch::post().path_prefix("/v1/search"), RetryPolicy::new().assume_idempotent(true));
    /// # let _ = layer;
    /// ```
    ///
    /// `assume_idempotent(false)` takes the declaration back for a route under a policy
    /// that made it (a plain POST route under a gRPC layer, for instance): its requests are
    /// judged by their method and key again.
    pub fn assume_idempotent(mut self, repeatable: bool) -> Self {
        self.assume_idempotent = Some(repeatable);
        self
    }

    /// Sends a request again at once when the transport proved it never left the client
    /// (`RST_STREAM(REFUSED_STREAM)` on the request's own stream, with the `h2` feature; or
    /// a request hyper never started because its connection closed, with the `hyper`
    /// feature): once per logical
    /// request, whatever the classifier says, without counting against
    /// [`max_attempts`](Self::max_attempts), without a wait, and outside the throttle and
    /// the quota; the deadline and the budget still apply, and a second such failure is
    /// judged by the normal rules. A refused connection is no transparent retry: the server
    /// is down, and the policy judges that (as gRPC's clients do). The retry is in the
    /// record, of kind [`AttemptKind::Transparent`](crate::AttemptKind::Transparent). gRPC's
    /// A6 calls it a transparent retry, and gRPC policies have it.
    ///
    /// Even with `max_attempts(1)` the body is then kept for that one replay. After
    /// [`never()`](Self::never) it turns retries back on, with one attempt.
    /// `transparent_retry(false)` turns it off for a policy laid over one that has it.
    ///
    /// ```
    /// use tower_http_retry::RetryPolicy;
    ///
    /// let policy = RetryPolicy::new().max_attempts(1).transparent_retry(true);
    /// # let _ = policy;
    /// ```
    pub fn transparent_retry(mut self, on: bool) -> Self {
        self.transparent = Some(on);
        if on {
            self.never = Some(false);
        }
        self
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
    /// let search = RetryPolicy::new()
    ///     .max_attempts(2)
    ///     .hedge(Hedging::after(Duration::from_millis(20)));
    /// let layer = RetryLayer::new().route(RouteMatch::get().path_prefix("/search"), search);
    /// # let _ = layer;
    /// ```
    ///
    /// `None` turns it off: no hedging for this policy's requests, whatever a policy
    /// beneath set: they get ordinary retries.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_http_retry::{Hedging, RetryLayer, RetryPolicy, RouteMatch};
    ///
    /// let layer = RetryLayer::new()
    ///     .policy(RetryPolicy::new().hedge(Hedging::after(Duration::from_millis(50))))
    ///     // An expensive report: a second copy costs more than the wait it saves.
    ///     .route(RouteMatch::get().path_prefix("/reports"), RetryPolicy::new().hedge(None));
    /// # let _ = layer;
    /// ```
    pub fn hedge(mut self, hedging: impl Into<Option<Hedging>>) -> Self {
        self.hedging = Some(hedging.into());
        self
    }

    /// Runs `hook` on every attempt's request before it is sent (see [`AttemptHook`]). A
    /// policy has at most one hook of each type: a second one of the same type, here or in
    /// a policy laid over this one, replaces the first; hooks of other types beneath stay.
    ///
    /// ```
    /// use http::{HeaderMap, HeaderValue};
    /// use tower_http_retry::{Attempt, AttemptHook, RetryPolicy};
    ///
    /// /// Tells the server which attempt this is: `1`, `2`, ...
    /// struct AttemptNumber;
    ///
    /// impl AttemptHook for AttemptNumber {
    ///     fn before_attempt(&self, attempt: &Attempt, headers: &mut HeaderMap) {
    ///         headers.insert("x-attempt", HeaderValue::from(attempt.number));
    ///     }
    /// }
    ///
    /// let policy = RetryPolicy::new().on_attempt(AttemptNumber);
    /// # let _ = policy;
    /// ```
    pub fn on_attempt<H: AttemptHook>(mut self, hook: H) -> Self {
        self.hooks.add(hook);
        self
    }

    /// No hook but those this policy adds itself after this call: the hooks of the
    /// policies beneath do not run on its requests (the layer's
    /// [attempt header](crate::RetryLayer::attempt_header) still does).
    ///
    /// ```
    /// use tower_http_retry::{RetryLayer, RetryPolicy, RouteMatch};
    ///
    /// # struct Metadata;
    /// # impl tower_http_retry::AttemptHook for Metadata {
    /// #     fn before_attempt(&self, _: &tower_http_retry::Attempt, _: &mut http::HeaderMap) {}
    /// # }
    /// let layer = RetryLayer::new()
    ///     .policy(RetryPolicy::new().on_attempt(Metadata))
    ///     // A third-party API that must not see the internal metadata.
    ///     .route(RouteMatch::any().path_prefix("/partner"), RetryPolicy::new().no_hooks());
    /// # let _ = layer;
    /// ```
    pub fn no_hooks(mut self) -> Self {
        self.hooks.clear();
        self
    }

    /// Turns idempotency keys on for this policy's requests, as `key` says: on a route, for
    /// the requests it matches ("this API de-duplicates on the key"); in a request's
    /// extensions, for that request; on the layer's policy, for every route that does not
    /// turn them off. A non-idempotent request under it gets one stable key before its
    /// first attempt, the same on every retry, and may be retried. Also with
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
    /// let client = RetryLayer::new()
    ///     // Stripe documents the bare token.
    ///     .route(
    ///         RouteMatch::post().host("api.stripe.com"),
    ///         RetryPolicy::new().idempotency_key(IdempotencyKey::new().raw()),
    ///     )
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
    ///
    /// `None` turns it off: stamps no idempotency key on this policy's requests, whatever a
    /// policy beneath set: the switch off for a route under a layer that turned keys on. A
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
    /// let client = RetryLayer::new()
    ///     // Every server behind this client de-duplicates on keys, but one.
    ///     .policy(RetryPolicy::new().idempotency_key(IdempotencyKey::new()))
    ///     // This server applies a repeated POST twice, key or no key.
    ///     .route(RouteMatch::post().path_prefix("/legacy"), RetryPolicy::new().idempotency_key(None))
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
    pub fn idempotency_key(mut self, key: impl Into<Option<IdempotencyKey>>) -> Self {
        self.key = Some(match key.into() {
            Some(key) => KeySetting::Stamp(key),
            None => KeySetting::Off(None),
        });
        self
    }

    /// Whether a GET's response body that breaks is continued (`true`, the default under a
    /// layer made resumable by [`RetryLayer::resume`](crate::RetryLayer::resume)) or left to
    /// fail in the caller's hands (`false`). Only such a layer reads it; under
    /// [`RetryPolicy::never`] no body is continued. Give `false` to a route whose bodies are
    /// not worth continuing (small JSON answers, event streams), or put it in one request's
    /// extensions.
    ///
    /// ```
    /// use bytes::Bytes;
    /// use http_body_util::Full;
    /// use tower_http_retry::{RetryLayer, RetryPolicy, RouteMatch};
    ///
    /// let layer = RetryLayer::new()
    ///     // Server-sent events: a stream that breaks is the caller's to reopen.
    ///     .route(RouteMatch::get().path_prefix("/events"), RetryPolicy::new().resume(false))
    ///     .resume();
    ///
    /// // And this one request's body is not continued either.
    /// let mut request = http::Request::get("http://h/files/a").body(Full::new(Bytes::new())).unwrap();
    /// request.extensions_mut().insert(RetryPolicy::new().resume(false));
    /// # let _ = layer;
    /// ```
    pub fn resume(mut self, on: bool) -> Self {
        self.resume = Some(on);
        self
    }

    /// The most continuations one response body takes (default 5), each an attempt of the
    /// request, paid from its gates and waited for like a retry; past it the body ends
    /// with a [`RetryError`](crate::RetryError) whose record stops on
    /// [`StopReason::MaxContinuations`](crate::StopReason::MaxContinuations).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_http_retry::{RetryLayer, RetryPolicy};
    ///
    /// // Large downloads over a flaky link: up to 10 continuations, and a body that sends
    /// // nothing for 30 s counts as broken.
    /// let layer = RetryLayer::new()
    ///     .policy(RetryPolicy::new().max_continuations(10).body_idle_timeout(Duration::from_secs(30)))
    ///     .resume();
    /// # let _ = layer;
    /// ```
    pub fn max_continuations(mut self, max: u32) -> Self {
        self.max_continuations = Some(max);
        self
    }

    /// A response body that sends nothing for this long counts as broken, and is
    /// continued as a body that failed would be (none by default: a stalled body waits for
    /// the transport's own timeouts). Only a resumable layer reads it.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_http_retry::{RetryLayer, RetryPolicy};
    ///
    /// let layer = RetryLayer::new()
    ///     .policy(RetryPolicy::new().body_idle_timeout(Duration::from_secs(20)))
    ///     .resume();
    /// # let _ = layer;
    /// ```
    ///
    /// `None` turns it off: no body idle timeout, whatever a policy beneath set.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_http_retry::{RetryLayer, RetryPolicy, RouteMatch};
    ///
    /// let layer = RetryLayer::new()
    ///     .policy(RetryPolicy::new().body_idle_timeout(Duration::from_secs(20)))
    ///     // A long poll: its body is silent for minutes on purpose.
    ///     .route(RouteMatch::get().path_prefix("/poll"), RetryPolicy::new().body_idle_timeout(None))
    ///     .resume();
    /// # let _ = layer;
    /// ```
    pub fn body_idle_timeout(mut self, timeout: impl Into<Option<Duration>>) -> Self {
        self.body_idle_timeout = Some(timeout.into());
        self
    }

    /// `over` laid over this policy: what `over` sets, and this policy's settings where it
    /// sets nothing. Its gates replace those of their kinds (all of these after
    /// `no_gates`), its hooks those of their types. A policy that declares its requests
    /// repeatable without a key of its own drops a key it would inherit.
    pub(crate) fn then(&self, over: &RetryPolicy) -> RetryPolicy {
        fn pick<T: Clone>(over: &Option<T>, base: &Option<T>) -> Option<T> {
            over.clone().or_else(|| base.clone())
        }
        let over_key = match (&over.key, over.assume_idempotent) {
            (None, Some(true)) => Some(KeySetting::Off(None)),
            (key, _) => key.clone(),
        };
        let key = match (over_key, &self.key) {
            (Some(KeySetting::Off(None)), Some(below)) => {
                let header = match below {
                    KeySetting::Stamp(key) => Some(key.get_header_name().clone()),
                    KeySetting::Off(header) => header.clone(),
                };
                Some(KeySetting::Off(header))
            }
            (over, below) => over.or_else(|| below.clone()),
        };
        RetryPolicy {
            max_attempts: pick(&over.max_attempts, &self.max_attempts),
            backoff: pick(&over.backoff, &self.backoff),
            deadline: pick(&over.deadline, &self.deadline),
            attempt_timeout: pick(&over.attempt_timeout, &self.attempt_timeout),
            deadline_header: pick(&over.deadline_header, &self.deadline_header),
            min_time_left: pick(&over.min_time_left, &self.min_time_left),
            max_retry_after: pick(&over.max_retry_after, &self.max_retry_after),
            classifier: pick(&over.classifier, &self.classifier),
            gates: self.gates.then(&over.gates),
            seed: pick(&over.seed, &self.seed),
            assume_idempotent: pick(&over.assume_idempotent, &self.assume_idempotent),
            key,
            hooks: self.hooks.then(&over.hooks),
            transparent: pick(&over.transparent, &self.transparent),
            hedging: pick(&over.hedging, &self.hedging),
            never: pick(&over.never, &self.never),
            resume: pick(&over.resume, &self.resume),
            max_continuations: pick(&over.max_continuations, &self.max_continuations),
            body_idle_timeout: pick(&over.body_idle_timeout, &self.body_idle_timeout),
        }
    }

    /// The settings of a request under this policy (laid over everything beneath it),
    /// the crate's defaults where nothing set them.
    pub(crate) fn settings(&self) -> Settings {
        let never = self.never.unwrap_or(false);
        Settings {
            max_attempts: match never {
                true => 1,
                false => self.max_attempts.unwrap_or(3),
            },
            backoff: self.backoff.unwrap_or_default(),
            deadline: self.deadline.flatten(),
            attempt_timeout: self.attempt_timeout.flatten(),
            min_time_left: self.min_time_left.unwrap_or_default(),
            max_retry_after: self.max_retry_after.unwrap_or(Duration::from_secs(30)),
            classifier: self.classifier.clone(),
            seed: self.seed.clone(),
            assume_idempotent: self.assume_idempotent.unwrap_or(false),
            transparent: !never && self.transparent.unwrap_or(false),
            never,
            resume: !never && self.resume.unwrap_or(true),
            max_continuations: self.max_continuations.unwrap_or(DEFAULT_MAX_CONTINUATIONS),
            body_idle_timeout: self.body_idle_timeout.flatten(),
        }
    }

    /// How requests under this policy hedge, if they do (the plan resolves it with the
    /// attempts).
    pub(crate) fn hedging(&self) -> Option<Hedging> {
        self.hedging.clone().flatten()
    }

    /// The gates that apply.
    pub(crate) fn gate_set(&self) -> &GateSet {
        &self.gates
    }

    /// The key to stamp, if any, and the header under which a caller's key is looked for.
    pub(crate) fn key(&self) -> (Option<IdempotencyKey>, HeaderName) {
        match &self.key {
            Some(KeySetting::Stamp(key)) => (Some(key.clone()), key.get_header_name().clone()),
            Some(KeySetting::Off(Some(header))) => (None, header.clone()),
            Some(KeySetting::Off(None)) | None => (None, IDEMPOTENCY_KEY),
        }
    }

    /// The hooks, in order.
    pub(crate) fn hooks(&self) -> &Hooks {
        &self.hooks
    }

    /// The header that tells the server how long each attempt has, if any.
    pub(crate) fn deadline_header_name(&self) -> Option<&HeaderName> {
        self.deadline_header.as_ref().and_then(Option::as_ref)
    }
}

impl fmt::Debug for RetryPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Only what is set: a policy is what it changes.
        let mut s = f.debug_struct("RetryPolicy");
        let mut any = false;
        let mut field = |name: &str, value: &dyn fmt::Debug| {
            s.field(name, value);
            any = true;
        };
        if let Some(v) = &self.max_attempts {
            field("max_attempts", v);
        }
        if let Some(v) = &self.backoff {
            field("backoff", v);
        }
        if let Some(v) = &self.deadline {
            field("deadline", v);
        }
        if let Some(v) = &self.attempt_timeout {
            field("attempt_timeout", v);
        }
        if let Some(v) = &self.deadline_header {
            field("deadline_header", v);
        }
        if let Some(v) = &self.min_time_left {
            field("min_time_left", v);
        }
        if let Some(v) = &self.max_retry_after {
            field("max_retry_after", v);
        }
        if self.classifier.is_some() {
            field("classifier", &format_args!("custom"));
        }
        if self.gates.is_off() {
            field("no_gates", &true);
        }
        if !self.gates.own().is_empty() {
            field("gates", &self.gates.own());
        }
        if self.seed.is_some() {
            field("rng_seed", &true);
        }
        if let Some(v) = &self.assume_idempotent {
            field("assume_idempotent", v);
        }
        match &self.key {
            Some(KeySetting::Stamp(key)) => field("idempotency_key", key),
            Some(KeySetting::Off(_)) => field("idempotency_key", &format_args!("None")),
            None => {}
        }
        if self.hooks.is_off() {
            field("no_hooks", &true);
        }
        if !self.hooks.is_empty() {
            field("hooks", &self.hooks);
        }
        if let Some(v) = &self.transparent {
            field("transparent_retry", v);
        }
        if let Some(v) = &self.hedging {
            field("hedging", v);
        }
        // `max_attempts` and `transparent_retry` turn `never()` off; only `never()` shows.
        if self.never == Some(true) {
            field("never", &true);
        }
        if let Some(v) = &self.resume {
            field("resume", v);
        }
        if let Some(v) = &self.max_continuations {
            field("max_continuations", v);
        }
        if let Some(v) = &self.body_idle_timeout {
            field("body_idle_timeout", v);
        }
        let _ = any;
        s.finish()
    }
}

/// The most continuations one response body takes by default
/// ([`RetryPolicy::max_continuations`]).
pub(crate) const DEFAULT_MAX_CONTINUATIONS: u32 = 5;

/// A policy laid over the crate's defaults: the settings one request runs with. The gates,
/// the key and the hooks are resolved beside it ([`Plan`](crate::config::Plan)).
#[derive(Clone)]
pub(crate) struct Settings {
    pub(crate) max_attempts: u32,
    pub(crate) backoff: Backoff,
    pub(crate) deadline: Option<Duration>,
    pub(crate) attempt_timeout: Option<Duration>,
    /// No attempt starts with less than this left before the deadline.
    pub(crate) min_time_left: Duration,
    pub(crate) max_retry_after: Duration,
    pub(crate) classifier: Option<Arc<dyn Classify>>,
    pub(crate) seed: Option<Arc<SeedSequence>>,
    pub(crate) assume_idempotent: bool,
    pub(crate) transparent: bool,
    /// Retries off altogether ([`RetryPolicy::never`]): the request is sent once and the
    /// gates hear nothing of it but the budget's deposit.
    pub(crate) never: bool,
    /// Whether a GET's response body is continued when it breaks, under a layer made
    /// resumable ([`RetryLayer::resume`](crate::RetryLayer::resume)).
    pub(crate) resume: bool,
    pub(crate) max_continuations: u32,
    pub(crate) body_idle_timeout: Option<Duration>,
}

impl Settings {
    /// Whether a request is sent once: `never()`, or one attempt with no transparent retry.
    pub(crate) fn sends_once(&self) -> bool {
        self.never || (self.max_attempts <= 1 && !self.transparent)
    }

    pub(crate) fn has_custom_classifier(&self) -> bool {
        self.classifier.is_some()
    }

    /// Whether the classifier reads the request's head (the default reads the outcome
    /// alone).
    pub(crate) fn classifier_needs_request(&self) -> bool {
        self.classifier.is_some()
    }

    pub(crate) fn classify(&self, head: &Head, outcome: Outcome<'_>) -> Classification {
        self.classify_parts(head.as_parts(), outcome)
    }

    /// Classifies with the request's head when one was kept.
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

    /// The generator of one logical request's jitter.
    pub(crate) fn jitter_rng(&self) -> JitterRng {
        match &self.seed {
            Some(seq) => seq.rng(),
            None => JitterRng::Thread,
        }
    }
}

impl fmt::Debug for Settings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Settings")
            .field("max_attempts", &self.max_attempts)
            .field("backoff", &self.backoff)
            .field("deadline", &self.deadline)
            .field("attempt_timeout", &self.attempt_timeout)
            .field("min_time_left", &self.min_time_left)
            .field("max_retry_after", &self.max_retry_after)
            .field("custom_classifier", &self.classifier.is_some())
            .field("seeded", &self.seed.is_some())
            .field("assume_idempotent", &self.assume_idempotent)
            .field("transparent_retry", &self.transparent)
            .field("never", &self.never)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gate::{RetryBudget, Throttle};

    #[test]
    fn an_empty_policy_has_the_crate_s_defaults() {
        let s = RetryPolicy::new().settings();
        assert_eq!(s.max_attempts, 3);
        assert_eq!(s.backoff, Backoff::default());
        assert_eq!((s.deadline, s.attempt_timeout), (None, None));
        assert_eq!(s.max_retry_after, Duration::from_secs(30));
        assert!(!s.never && !s.transparent && !s.assume_idempotent);
        assert!(RetryPolicy::new().hedging().is_none() && s.classifier.is_none());
        assert_eq!(format!("{:?}", RetryPolicy::new()), "RetryPolicy");
    }

    #[test]
    fn a_policy_laid_over_another_changes_only_what_it_sets() {
        let base = RetryPolicy::new()
            .deadline(Duration::from_secs(5))
            .attempt_timeout(Duration::from_secs(1))
            .max_attempts(4)
            .hedge(Hedging::after(Duration::from_millis(20)));
        let route = RetryPolicy::new().max_attempts(5).attempt_timeout(None);
        let s = base.then(&route).settings();
        assert_eq!(s.max_attempts, 5);
        assert_eq!(s.deadline, Some(Duration::from_secs(5)));
        assert_eq!(s.attempt_timeout, None);
        assert!(base.then(&route).hedging().is_some());
        let off = base.then(&route).then(&RetryPolicy::new().hedge(None));
        assert!(off.hedging().is_none());
        assert_eq!(off.settings().max_attempts, 5);
        assert_eq!(
            format!("{route:?}"),
            "RetryPolicy { max_attempts: 5, attempt_timeout: None }"
        );
    }

    /// The plan a policy makes, as the layer resolves it.
    fn plan(policy: RetryPolicy) -> crate::config::Plan {
        crate::config::Plan::resolve(policy, &crate::config::Config::default())
    }

    #[test]
    fn never_is_absolute_wherever_it_is_laid() {
        let base = RetryPolicy::new()
            .max_attempts(4)
            .transparent_retry(true)
            .hedge(Hedging::after(Duration::from_millis(20)));
        assert!(plan(base.clone()).hedging.is_some());
        let never = plan(base.then(&RetryPolicy::never()));
        let s = &never.policy;
        assert!(s.never && s.sends_once());
        assert_eq!(s.max_attempts, 1);
        assert!(never.hedging.is_none() && !s.transparent);
        // Laid over never(), a policy that asks for retries turns them back on, without the
        // hedging never() turned off beneath it.
        let again = plan(
            base.then(&RetryPolicy::never())
                .then(&RetryPolicy::new().max_attempts(3)),
        );
        assert!(!again.policy.never && !again.policy.sends_once());
        assert_eq!(again.policy.max_attempts, 3);
        assert!(again.hedging.is_none());
        // Other settings laid over never() leave it never.
        let still = plan(
            RetryPolicy::never().then(
                &RetryPolicy::new()
                    .deadline(Duration::from_secs(1))
                    .hedge(Hedging::after(Duration::ZERO)),
            ),
        );
        assert!(still.policy.never && still.hedging.is_none());
        // One attempt hedges nothing.
        let one = RetryPolicy::new().max_attempts(1);
        assert!(
            plan(one.hedge(Hedging::after(Duration::ZERO)))
                .hedging
                .is_none()
        );
        // Within one policy, the order of the calls decides.
        assert!(!RetryPolicy::never().max_attempts(3).settings().never);
        assert!(
            RetryPolicy::new()
                .max_attempts(3)
                .then(&RetryPolicy::never())
                .settings()
                .never
        );
        let one = RetryPolicy::never().transparent_retry(true).settings();
        assert!(!one.never && !one.sends_once() && one.transparent);
        assert_eq!(one.max_attempts, 1);
    }

    #[test]
    fn one_attempt_is_not_never() {
        let one = RetryPolicy::new().max_attempts(1).settings();
        assert!(!one.never && one.sends_once());
        // Settings that turn retries on turn `never()` off, in the same policy too.
        let again = RetryPolicy::never().max_attempts(3).settings();
        assert!(!again.never && !again.sends_once());
        assert!(
            !RetryPolicy::never()
                .transparent_retry(true)
                .settings()
                .never
        );
        // Turning transparent retries off leaves a `never()` policy never.
        assert!(
            RetryPolicy::never()
                .transparent_retry(false)
                .settings()
                .never
        );
        // The rest of a `never()` policy's settings keep it off.
        let still = RetryPolicy::never()
            .no_gates()
            .assume_idempotent(true)
            .settings();
        assert!(still.never && still.sends_once() && still.max_attempts == 1);
        assert!(!RetryPolicy::new().settings().sends_once());
    }

    #[test]
    fn keys_are_inherited_and_declaring_repeatable_drops_an_inherited_one() {
        let keyed = RetryPolicy::new()
            .idempotency_key(IdempotencyKey::new().header_name(HeaderName::from_static("x-key")));
        let (key, header) = RetryPolicy::new().then(&keyed).key();
        assert!(key.is_some());
        assert_eq!(header, "x-key");
        let (key, header) = keyed.then(&RetryPolicy::new()).key();
        assert!(key.is_some());
        assert_eq!(header, "x-key");
        // Off under a keyed layer: no key, and a caller's key is looked for where the layer
        // put its own.
        let (key, header) = keyed.then(&RetryPolicy::new().idempotency_key(None)).key();
        assert!(key.is_none());
        assert_eq!(header, "x-key");
        let (key, header) = keyed
            .then(&RetryPolicy::new().assume_idempotent(true))
            .key();
        assert!(key.is_none());
        assert_eq!(header, "x-key");
        // Declared repeatable with a key of its own: that key.
        let own = RetryPolicy::new()
            .assume_idempotent(true)
            .idempotency_key(IdempotencyKey::new());
        let (key, header) = keyed.then(&own).key();
        assert!(key.is_some());
        assert_eq!(header, "idempotency-key");
        assert_eq!(RetryPolicy::new().key().1, "idempotency-key");
    }

    #[test]
    fn gates_replace_their_kind_and_no_gates_clears_those_beneath() {
        let layer = RetryPolicy::new()
            .gate(RetryBudget::default())
            .gate(Throttle::builder().build());
        let own = RetryPolicy::new().gate(RetryBudget::builder().max_tokens(3.0).build());
        assert!(format!("{:?}", layer.then(&own)).contains("max_tokens: 3.0"));
        let gates = layer.then(&own).gate_set().gates();
        assert!(gates.hears_outcomes(), "the throttle beneath stays");
        let none = layer
            .then(&RetryPolicy::new().no_gates())
            .gate_set()
            .gates();
        assert!(!none.hears_outcomes());
        assert_eq!(
            format!("{:?}", RetryPolicy::new().no_gates()),
            "RetryPolicy { no_gates: true }"
        );
    }

    #[test]
    fn zero_attempts_is_refused() {
        let err = RetryPolicy::new().try_max_attempts(0).unwrap_err();
        assert!(err.to_string().contains("at least 1"), "{err}");
    }

    #[test]
    #[should_panic(expected = "at least 1")]
    fn zero_attempts_panics() {
        let _ = RetryPolicy::new().max_attempts(0);
    }
}
