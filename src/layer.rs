// `RetryLayer`: the builder of the configuration.

use std::fmt;
use std::sync::{Arc, OnceLock};

use http::HeaderName;
use tower_layer::Layer;

use crate::config::{Config, Plans};
use crate::error::InvalidConfig;
use crate::gate::{RetryBudget, RetryQuota, Throttle};
use crate::idempotency::IdempotencyKey;
use crate::policy::RetryPolicy;
use crate::route::RouteMatch;
use crate::service::Retry;

/// Applies [`Retry`] to a service. See the [crate docs](crate) for what it does.
///
/// Every service made by one layer (and every clone of them) shares the layer's
/// configuration and its [`RetryBudget`].
///
/// As it comes, the layer stamps no idempotency key, and a non-idempotent request (POST,
/// PATCH, ...) is repeated only when the failure proves the server never saw it, or when the
/// caller set an `Idempotency-Key` on it. Turn keys on for a server that de-duplicates on
/// them: for one route with [`RetryPolicy::idempotency_key`], or layer-wide with
/// [`RetryLayer::idempotency_key`].
///
/// ```
/// use std::time::Duration;
/// use tower_http_retry::{IdempotencyKey, RetryBudget, RetryLayer, RetryPolicy, RouteMatch};
///
/// let budget = RetryBudget::builder().ratio(0.1).min_per_sec(10).max_tokens(100).build();
/// let base = RetryPolicy::default().max_attempts(3).deadline(Duration::from_secs(10));
/// let layer = RetryLayer::new()
///     .policy(base.clone())
///     .budget(budget.clone())
///     .max_replay_bytes(64 * 1024)
///     // The payments API de-duplicates on the key: keys on, there alone.
///     .route(
///         RouteMatch::post().path_prefix("/v1/payments"),
///         base.clone().max_attempts(5).idempotency_key(IdempotencyKey::default()),
///     )
///     .route(RouteMatch::get().path_prefix("/health"), RetryPolicy::never());
/// # let _ = layer;
/// ```
///
/// # Runtime
///
/// Waits, deadlines and attempt timeouts are tokio timers, so the services must run on a
/// tokio runtime with time enabled (`#[tokio::main]` and `#[tokio::test]` enable it; a
/// hand-built runtime needs `enable_time` or `enable_all`). Without it a call panics at its
/// first retry, or at once when its policy has a deadline or an attempt timeout.
#[derive(Clone)]
pub struct RetryLayer {
    config: Arc<Config>,
    /// Every policy of the configuration resolved, once, when the layer first makes a
    /// service; shared by the services it makes and by its clones.
    plans: Arc<OnceLock<Arc<Plans>>>,
}

impl Default for RetryLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl RetryLayer {
    /// A layer with every default: [`RetryPolicy::default`], its own
    /// [`RetryBudget::default`], no idempotency keys, a 64 KiB replay cap, no throttle, no
    /// attempt header, no routes.
    ///
    /// ```
    /// use tower_http_retry::RetryLayer;
    ///
    /// // 3 attempts, 100 ms to 10 s of full-jitter backoff, `Retry-After` honoured up to 30 s,
    /// // a shared budget, no POST repeated unless it was never seen: ready for
    /// // `ServiceBuilder::layer`.
    /// let layer = RetryLayer::new();
    /// # let _ = layer;
    /// ```
    pub fn new() -> Self {
        Self {
            config: Arc::new(Config::default()),
            plans: Arc::default(),
        }
    }

    /// A retry [`Throttle`] for every policy of the layer that has none of its own
    /// ([`RetryPolicy::throttle`]): retries stop while failures run above the share
    /// the throttle tolerates (1 attempt in 11 at its default ratio), whatever the budget still allows. Every service made by this
    /// layer, and every clone of them, share it.
    ///
    /// ```
    /// use tower_http_retry::{RetryLayer, Throttle};
    ///
    /// // gRPC's A6 example: 10 tokens, a tenth of one back per success.
    /// let layer = RetryLayer::new().throttle(Throttle::builder().max_tokens(10.0).token_ratio(0.1).build());
    /// # let _ = layer;
    /// ```
    pub fn throttle(self, throttle: Throttle) -> Self {
        self.edit(|c| c.throttle = Some(throttle))
    }

    /// A cost-weighted [`RetryQuota`] (the AWS SDKs' standard retry mode) for every policy
    /// of the layer that has none of its own ([`RetryPolicy::quota`]): each retry spends
    /// tokens by the failure it follows, and only successes give them back. It works beside
    /// the budget and the throttle (each may refuse a retry); the AWS SDKs use it instead of
    /// a budget, so pair it with [`no_budget`](Self::no_budget) to behave as they do. A
    /// quota that cannot pay stops the retries with `StopReason::BudgetExhausted`.
    ///
    /// ```
    /// use tower_http_retry::{RetryLayer, RetryQuota};
    ///
    /// let layer = RetryLayer::new().no_budget().quota(RetryQuota::aws_standard());
    /// assert_eq!(layer.get_quota().unwrap().tokens(), 500);
    /// ```
    pub fn quota(self, quota: RetryQuota) -> Self {
        self.edit(|c| c.quota = Some(quota))
    }

    /// The layer's quota, if it has one ([`RetryLayer::quota`]).
    ///
    /// ```
    /// use tower_http_retry::{RetryLayer, RetryQuota};
    ///
    /// assert!(RetryLayer::new().get_quota().is_none()); // none by default
    /// let layer = RetryLayer::new().quota(RetryQuota::aws_standard());
    /// assert!(layer.get_quota().is_some());
    /// ```
    pub fn get_quota(&self) -> Option<&RetryQuota> {
        self.config.quota.as_ref()
    }

    fn edit(mut self, f: impl FnOnce(&mut Config)) -> Self {
        f(Arc::make_mut(&mut self.config));
        // A changed configuration is resolved anew.
        self.plans = Arc::default();
        self
    }

    /// The default policy, for requests no route matches.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_http_retry::{RetryLayer, RetryPolicy};
    ///
    /// let layer = RetryLayer::new().policy(
    ///     RetryPolicy::default().max_attempts(4).deadline(Duration::from_secs(5)),
    /// );
    /// # let _ = layer;
    /// ```
    pub fn policy(self, policy: RetryPolicy) -> Self {
        self.edit(|c| c.policy = policy)
    }

    /// Requests matching `route` use `policy`. Routes are tried in the order they were
    /// added; the first match wins; a request no route matches uses the default policy
    /// ([`RetryLayer::policy`]).
    ///
    /// The route's policy is complete: it replaces the default policy and inherits nothing
    /// from it. What comes from the layer is what the layer itself holds: its budget,
    /// throttle and idempotency keys when the policy sets none of its own, and its attempt
    /// header always. A route given
    /// `RetryPolicy::default().max_attempts(5)` has no deadline and no attempt timeout, even
    /// when the default policy has both. Build routes from the base policy instead:
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_http_retry::{RetryLayer, RetryPolicy, RouteMatch};
    ///
    /// let base = RetryPolicy::default()
    ///     .deadline(Duration::from_secs(10))
    ///     .attempt_timeout(Duration::from_secs(2));
    /// let layer = RetryLayer::new()
    ///     .policy(base.clone())
    ///     // 5 attempts, the base's deadline and attempt timeout.
    ///     .route(RouteMatch::post().path_prefix("/v1/payments"), base.clone().max_attempts(5))
    ///     // A POST that may be repeated: retried like a GET, with no key.
    ///     .route(RouteMatch::post().path_prefix("/v1/search"), base.clone().assume_idempotent());
    /// # let _ = layer;
    /// ```
    pub fn route(self, route: RouteMatch, policy: RetryPolicy) -> Self {
        self.edit(|c| c.routes.push((route, policy)))
    }

    /// The budget every retry is paid from (unless its policy has its own). Every service
    /// made by this layer, every clone of them, and every other layer given a clone of the
    /// same handle, share one bucket.
    ///
    /// ```
    /// use tower_http_retry::{RetryBudget, RetryLayer};
    ///
    /// // Two layers (say over two clients of one service) share one bucket.
    /// let budget = RetryBudget::builder().ratio(0.2).build();
    /// let first = RetryLayer::new().budget(budget.clone());
    /// let second = RetryLayer::new().budget(budget);
    /// # let _ = (first, second);
    /// ```
    pub fn budget(self, budget: RetryBudget) -> Self {
        self.edit(|c| c.budget = Some(budget))
    }

    /// No budget: only the attempt limit and the deadline bound retries.
    ///
    /// ```
    /// use tower_http_retry::RetryLayer;
    ///
    /// // Tests and batch jobs, where nothing else shares the server.
    /// let layer = RetryLayer::new().no_budget();
    /// assert!(layer.get_budget().is_none());
    /// ```
    pub fn no_budget(self) -> Self {
        self.edit(|c| c.budget = None)
    }

    /// Turns idempotency keys on, for every policy that does not configure its own
    /// ([`RetryPolicy::idempotency_key`], [`RetryPolicy::no_idempotency_key`]): "this
    /// client's servers de-duplicate on the key". Every non-idempotent request without the
    /// header then gets one stable key before its first attempt, the same on every retry,
    /// and may be retried. Off by default; to turn keys on for one route only, give its
    /// policy [`RetryPolicy::idempotency_key`] instead.
    ///
    /// Against a server that ignores the key, a retried POST may be applied twice: turn
    /// keys on only where the server stores each key's outcome and answers a repeat with it.
    ///
    /// ```
    /// use tower_http_retry::{IdempotencyKey, RetryLayer};
    ///
    /// // Every server behind this client de-duplicates on `Idempotency-Key`; Stripe's
    /// // style: the bare token.
    /// let layer = RetryLayer::new().idempotency_key(IdempotencyKey::default().raw());
    /// # let _ = layer;
    /// ```
    pub fn idempotency_key(self, key: IdempotencyKey) -> Self {
        self.edit(|c| {
            c.key_header = key.get_header_name().clone();
            c.key = Some(key);
        })
    }

    /// Turns idempotency keys off again (the default), except under policies that configure
    /// their own ([`RetryPolicy::idempotency_key`]). A non-idempotent request is then retried
    /// only when the caller set an `Idempotency-Key` header itself, or when the failure
    /// proves the server never saw it, or when its policy declares it repeatable
    /// ([`RetryPolicy::assume_idempotent`]).
    ///
    /// ```
    /// use tower_http_retry::{IdempotencyKey, RetryLayer, RetryPolicy, RouteMatch};
    ///
    /// // A layer built from shared settings that turned keys on; this client's servers
    /// // ignore them, but its payments API, which de-duplicates on them.
    /// let shared = RetryLayer::new().idempotency_key(IdempotencyKey::default());
    /// let layer = shared.no_idempotency_key().route(
    ///     RouteMatch::post().path_prefix("/v1/payments"),
    ///     RetryPolicy::default().idempotency_key(IdempotencyKey::default()),
    /// );
    /// # let _ = layer;
    /// ```
    pub fn no_idempotency_key(self) -> Self {
        self.edit(|c| c.key = None)
    }

    /// The most request-body bytes kept for replays (default 64 KiB). A larger body is
    /// still sent, once, complete; it is just not retried.
    ///
    /// ```
    /// use tower_http_retry::RetryLayer;
    ///
    /// // Keep up to 1 MiB of each request body for a retry.
    /// let layer = RetryLayer::new().max_replay_bytes(1 << 20);
    /// # let _ = layer;
    /// ```
    pub fn max_replay_bytes(self, max: usize) -> Self {
        self.edit(|c| c.max_replay_bytes = max)
    }

    /// Sends the attempt number (1, 2, ...) in this header on every attempt, so servers can
    /// tell retries apart.
    ///
    /// ```
    /// use tower_http_retry::RetryLayer;
    ///
    /// // `x-attempt: 1` on the first attempt, `2` on the first retry, ...
    /// let layer = RetryLayer::new().attempt_header("x-attempt");
    /// # let _ = layer;
    /// ```
    ///
    /// # Panics
    ///
    /// When `name` is not a valid header name; [`RetryLayer::try_attempt_header`] returns
    /// an error instead.
    #[track_caller]
    pub fn attempt_header(self, name: &str) -> Self {
        match self.try_attempt_header(name) {
            Ok(layer) => layer,
            Err(e) => panic!("{e}"),
        }
    }

    /// Like [`RetryLayer::attempt_header`], but refuses an invalid name with an error.
    ///
    /// ```
    /// use tower_http_retry::RetryLayer;
    ///
    /// // A name read from configuration: an invalid one is an error, not a panic.
    /// assert!(RetryLayer::new().try_attempt_header("x attempt").is_err());
    /// let layer = RetryLayer::new().try_attempt_header("x-attempt")?;
    /// # let _ = layer;
    /// # Ok::<(), tower_http_retry::InvalidConfig>(())
    /// ```
    pub fn try_attempt_header(self, name: &str) -> Result<Self, InvalidConfig> {
        let name = HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
            InvalidConfig::new(
                crate::error::ConfigKind::HeaderName,
                format!("{name:?} is not a valid header name"),
            )
        })?;
        Ok(self.edit(|c| c.attempt_header = Some(name)))
    }

    /// The layer's retry budget, if it has one.
    ///
    /// ```
    /// use tower_http_retry::{RetryBudget, RetryLayer};
    ///
    /// // A layer has its own budget by default, full at first.
    /// assert_eq!(RetryLayer::new().get_budget().map(RetryBudget::tokens), Some(100.0));
    /// assert!(RetryLayer::new().no_budget().get_budget().is_none());
    /// ```
    pub fn get_budget(&self) -> Option<&RetryBudget> {
        self.config.budget.as_ref()
    }
}

impl<S: Clone> Layer<S> for RetryLayer {
    type Service = Retry<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Retry::from_plans(inner, self.plans())
    }
}

impl RetryLayer {
    /// Every policy of the layer resolved, as a service made by [`Layer::layer`] holds them:
    /// resolved once, on first use.
    pub(crate) fn plans(&self) -> Arc<Plans> {
        Arc::clone(
            self.plans
                .get_or_init(|| Arc::new(Plans::new(Arc::clone(&self.config)))),
        )
    }
}

impl fmt::Debug for RetryLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.config.fmt(f)
    }
}

impl<S: Clone> Retry<S> {
    /// Wraps `inner` with every default of [`RetryLayer::new`]. For anything else, build
    /// a [`RetryLayer`] and apply it (`ServiceBuilder::layer`, or [`Layer::layer`]).
    ///
    /// [`Layer::layer`]: tower_layer::Layer::layer
    ///
    /// ```
    /// use bytes::Bytes;
    /// use http::{Request, Response, StatusCode};
    /// use http_body_util::Full;
    /// use tower::ServiceExt;
    /// use tower_http_retry::{Retry, RetryInfo};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// # let calls = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    /// // `inner` answers 503 once, then 200.
    /// # let inner = tower::service_fn(move |_: Request<tower_http_retry::ReplayBody<Full<Bytes>>>| {
    /// #     let first = calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0;
    /// #     let status = if first { StatusCode::SERVICE_UNAVAILABLE } else { StatusCode::OK };
    /// #     async move { Ok::<_, std::convert::Infallible>(Response::builder().status(status).body(()).unwrap()) }
    /// # });
    /// let client = Retry::new(inner);
    /// let request = Request::get("http://127.0.0.1:3000/").body(Full::new(Bytes::new())).unwrap();
    /// let response = client.oneshot(request).await.unwrap();
    /// assert_eq!(response.status(), StatusCode::OK);
    /// assert_eq!(response.extensions().get::<RetryInfo>().unwrap().attempts(), 2);
    /// # }
    /// ```
    pub fn new(inner: S) -> Self {
        tower_layer::Layer::layer(&RetryLayer::new(), inner)
    }
}
