// `RetryLayer`: the builder of the configuration.

use std::fmt;
use std::marker::PhantomData;
use std::sync::{Arc, OnceLock};

use http::HeaderName;
use tower_layer::Layer;

use crate::config::{Config, Plans};
use crate::policy::RetryPolicy;
use crate::route::RouteMatch;
use crate::service::Retry;

/// Applies [`Retry`] to a service. See the [crate docs](crate) for what it does.
///
/// A layer holds a policy for every request ([`RetryLayer::policy`]) and policies for
/// routes ([`RetryLayer::route`]), each laid over the layer's; beneath the layer's policy,
/// the crate's defaults and a [`RetryBudget`](crate::RetryBudget) of the layer's own. Every
/// service made by one layer (and every clone of them) shares that configuration and its
/// gates.
///
/// As it comes, the layer stamps no idempotency key, and a non-idempotent request (POST,
/// PATCH, ...) is repeated only when the failure proves the server never saw it, or when the
/// caller set an `Idempotency-Key` on it. Turn keys on for a server that de-duplicates on
/// them, on its route ([`RetryPolicy::idempotency_key`]).
///
/// ```
/// use std::time::Duration;
/// use tower_http_retry::{IdempotencyKey, RetryBudget, RetryLayer, RetryPolicy, RouteMatch};
///
/// let budget = RetryBudget::builder().ratio(0.1).max_tokens(100.0).build();
/// let layer = RetryLayer::new()
///     .policy(RetryPolicy::new().max_attempts(3).deadline(Duration::from_secs(10)).gate(budget))
///     .max_replay_bytes(64 * 1024)
///     // The payments API de-duplicates on the key: keys on, there alone, and 5 attempts
///     // within the layer's 10 s deadline.
///     .route(
///         RouteMatch::post().path_prefix("/v1/payments"),
///         RetryPolicy::new().max_attempts(5).idempotency_key(IdempotencyKey::new()),
///     )
///     .route(RouteMatch::get().path_prefix("/health"), RetryPolicy::never());
/// # let _ = layer;
/// ```
///
/// # Modes
///
/// `M` is the layer's mode: `()`, as [`RetryLayer::new`] makes it, keeps the inner
/// service's response type; [`Resume`](crate::Resume), from [`RetryLayer::resume`],
/// continues response bodies that break. Every configuration method works in either.
///
/// # Runtime
///
/// Waits, deadlines and attempt timeouts are tokio timers by default (the `tokio` feature),
/// so the services must run on a tokio runtime with time enabled (`#[tokio::main]` and
/// `#[tokio::test]` enable it; a hand-built runtime needs `enable_time` or `enable_all`).
/// Without it a call panics at its first retry, or at once when its policy has a deadline
/// or an attempt timeout. On another executor, give the layer its timer
/// ([`RetryLayer::timer`]); on `wasm32-unknown-unknown` the `wasm` feature gives it
/// JavaScript's (the [time guide](crate::guide::time), "Runtimes and targets").
pub struct RetryLayer<M = ()> {
    config: Arc<Config>,
    /// Every policy of the configuration resolved, once, when the layer first makes a
    /// service; shared by the services it makes and by its clones.
    plans: Arc<OnceLock<Arc<Plans>>>,
    mode: PhantomData<fn() -> M>,
}

impl<M> Clone for RetryLayer<M> {
    fn clone(&self) -> Self {
        Self {
            config: Arc::clone(&self.config),
            plans: Arc::clone(&self.plans),
            mode: PhantomData,
        }
    }
}

impl Default for RetryLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl RetryLayer {
    /// A layer with the crate's defaults ([`RetryPolicy`] lists them), a
    /// [`RetryBudget`](crate::RetryBudget) of its own, a 64 KiB replay cap, no routes.
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
            mode: PhantomData,
        }
    }
}

impl<M> RetryLayer<M> {
    fn edit(mut self, f: impl FnOnce(&mut Config)) -> Self {
        f(Arc::make_mut(&mut self.config));
        // A changed configuration is resolved anew.
        self.plans = Arc::default();
        self
    }

    /// Lays `policy` over the layer's policy (the crate's defaults and the layer's own
    /// budget, at first): it applies to every request, and every route's policy is laid
    /// over it. A second call changes what its policy sets and keeps the rest.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_http_retry::{RetryLayer, RetryPolicy, Throttle};
    ///
    /// let layer = RetryLayer::new().policy(
    ///     RetryPolicy::new()
    ///         .max_attempts(4)
    ///         .deadline(Duration::from_secs(5))
    ///         // Beside the layer's budget: gRPC's A6 throttle, per server.
    ///         .gate(Throttle::builder().per_authority().build()),
    /// );
    /// # let _ = layer;
    /// ```
    pub fn policy(self, policy: RetryPolicy) -> Self {
        self.edit(|c| c.policy = c.policy.then(&policy))
    }

    /// Requests matching `route` run under `policy` laid over the layer's: what it sets,
    /// and the layer's policy for the rest. Routes are tried in the order they were added;
    /// the first match wins; a request no route matches runs under the layer's policy.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_http_retry::{RetryLayer, RetryPolicy, RouteMatch};
    ///
    /// let layer = RetryLayer::new()
    ///     .policy(
    ///         RetryPolicy::new()
    ///             .deadline(Duration::from_secs(10))
    ///             .attempt_timeout(Duration::from_secs(2)),
    ///     )
    ///     // 5 attempts, with the layer's deadline and attempt timeout.
    ///     .route(RouteMatch::post().path_prefix("/v1/payments"), RetryPolicy::new().max_attempts(5))
    ///     // A POST that may be repeated: retried like a GET, with no key.
    ///     .route(RouteMatch::post().path_prefix("/v1/search"), RetryPolicy::new().assume_idempotent(true));
    /// # let _ = layer;
    /// ```
    pub fn route(self, route: RouteMatch, policy: RetryPolicy) -> Self {
        self.edit(|c| c.routes.push((route, policy)))
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
    /// use http::HeaderName;
    /// use tower_http_retry::RetryLayer;
    ///
    /// // `x-attempt: 1` on the first attempt, `2` on the first retry, ...
    /// let layer = RetryLayer::new().attempt_header(HeaderName::from_static("x-attempt"));
    /// # let _ = layer;
    /// ```
    pub fn attempt_header(self, name: HeaderName) -> Self {
        self.edit(|c| c.attempt_header = Some(name))
    }

    /// Reads the time and sleeps with `timer` instead of the default (tokio's timer, under
    /// the `tokio` feature): every clock read and every wait of the layer's requests
    /// (backoff, `Retry-After` and its HTTP-date, attempt timeouts, the deadline, hedging
    /// delays, a resumed body's idle timeout), and the time of its policies' gates (a
    /// budget's refill, the adaptive limiter's and throttle's), unless another layer used a
    /// gate first: a gate keeps the clock of the first layer that makes a service with it
    /// (see [`Timer`](crate::Timer)). Without the `tokio` feature, a layer that ever waits
    /// needs one.
    ///
    /// ```
    /// # #[cfg(feature = "test-util")] {
    /// use tower_http_retry::{ManualClock, RetryLayer};
    ///
    /// // A clock a test moves by hand (`test-util` feature).
    /// let clock = ManualClock::new();
    /// let layer = RetryLayer::new().timer(clock.clone());
    /// # let _ = layer;
    /// # }
    /// ```
    pub fn timer(self, timer: impl crate::Timer) -> Self {
        let clock = crate::time::Clock::custom(timer);
        self.edit(|c| c.clock = clock)
    }

    /// The level at which each retry is logged (INFO by default): one event per retry,
    /// transparent retry and hedge, on the target `tower_http_retry`, with the attempt it
    /// sends, why, and the wait before it:
    ///
    /// ```text
    /// INFO tower_http_retry: retrying attempt=2 reason="status 503" wait=150ms method=GET uri=https://api.example/v1/items
    /// ```
    ///
    /// A retry that a gate refuses (the budget, a quota, the throttle) is logged at WARN,
    /// or at this level if it is ERROR. The span of each request and its end are DEBUG.
    /// The crate docs' [Logging](crate#logging) section shows every line.
    ///
    /// ```
    /// use tower_http_retry::RetryLayer;
    /// use tracing::Level;
    ///
    /// // Retries as warnings, as reqwest-retry logs them.
    /// let layer = RetryLayer::new().retry_log_level(Level::WARN);
    /// # let _ = layer;
    /// ```
    #[cfg(feature = "tracing")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tracing")))]
    pub fn retry_log_level(self, level: tracing::Level) -> Self {
        self.edit(|c| c.log.retries = level)
    }

    /// Logs every request's URI whole (`true`), instead of without its query string and
    /// user info (`false`, the default): tokens and personal data often travel there.
    ///
    /// ```
    /// use tower_http_retry::RetryLayer;
    ///
    /// // `uri=https://api.example/v1/items?page=2` instead of `uri=https://api.example/v1/items`.
    /// let layer = RetryLayer::new().log_full_uri(true);
    /// # let _ = layer;
    /// ```
    #[cfg(feature = "tracing")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tracing")))]
    pub fn log_full_uri(self, full: bool) -> Self {
        self.edit(|c| c.log.full_uri = full)
    }

    /// Records retry metrics through OpenTelemetry's metrics API, with instruments made
    /// now from `meter`: once per logical request, at its end as the layer sees it (the
    /// response head returned to the caller, or the error), four histograms in the shape
    /// of gRPC's retry metrics (grpc/proposal A96), with A96's bucket boundaries:
    ///
    /// | name | unit | value |
    /// | --- | --- | --- |
    /// | `tower_http_retry.call.retries` | `{retry}` | retries sent (not transparent ones, not hedges) |
    /// | `tower_http_retry.call.transparent_retries` | `{transparent_retry}` | transparent retries sent |
    /// | `tower_http_retry.call.hedges` | `{hedge}` | hedges sent |
    /// | `tower_http_retry.call.retry_delay` | `s` | [`RetryInfo::retry_delay`](crate::RetryInfo::retry_delay): the time with no attempt in flight |
    ///
    /// A count of 0 is not recorded, so a request that was not retried records nothing;
    /// the delay is recorded for a request that had a retry or a hedge. The attributes are
    /// those of OpenTelemetry's HTTP client metrics that keep the cardinality low:
    /// `http.request.method` (`_OTHER` for a method the conventions do not know),
    /// `server.address` and `server.port`. The `metrics` feature's counters are separate,
    /// and keep their names. The guide's telemetry chapter has the details.
    ///
    /// Pass a meter from the provider itself: one taken from OpenTelemetry's global
    /// provider before the application sets it stays a no-op.
    ///
    /// ```
    /// use opentelemetry::metrics::MeterProvider as _;
    /// use opentelemetry_sdk::metrics::SdkMeterProvider;
    /// use tower_http_retry::RetryLayer;
    ///
    /// let provider = SdkMeterProvider::builder().build();
    /// let layer = RetryLayer::new().otel_meter(provider.meter("tower-http-retry"));
    /// # let _ = layer;
    /// ```
    #[cfg(feature = "opentelemetry")]
    #[cfg_attr(docsrs, doc(cfg(feature = "opentelemetry")))]
    pub fn otel_meter(self, meter: opentelemetry::metrics::Meter) -> Self {
        let instruments = Arc::new(crate::otel_metrics::Instruments::new(&meter));
        self.edit(|c| c.log.meter = Some(instruments))
    }

    /// Records each attempt's `url.full` whole (`true`) in its OpenTelemetry span, query
    /// string included, instead of without it (`false`, the default). Whole, the values of
    /// the query parameters the semantic conventions name as secret (`X-Amz-Signature`,
    /// `X-Amz-Credential`, `X-Amz-Security-Token`, `sig`, `X-Goog-Signature`) are
    /// `REDACTED`, as is any user info; by default user info and query never reach the
    /// span. See the [telemetry guide](crate::guide::telemetry).
    ///
    /// ```
    /// use tower_http_retry::RetryLayer;
    ///
    /// // `url.full = https://bucket.example/f?X-Amz-Signature=REDACTED&part=2`
    /// // instead of `url.full = https://bucket.example/f`.
    /// let layer = RetryLayer::new().otel_full_url(true);
    /// # let _ = layer;
    /// ```
    #[cfg(feature = "opentelemetry")]
    #[cfg_attr(docsrs, doc(cfg(feature = "opentelemetry")))]
    pub fn otel_full_url(self, full: bool) -> Self {
        self.edit(|c| c.log.otel.full_url = full)
    }
}

impl<M> RetryLayer<M> {
    /// This layer, with response bodies continued when they break: a GET whose body fails
    /// (or stalls past [`RetryPolicy::body_idle_timeout`]) after its head arrived is sent
    /// again with `Range` from the next byte the caller has not had and `If-Range` with
    /// the first response's validator, and the answer's bytes are handed on only if they
    /// provably continue the same representation. The responses' body becomes
    /// [`ResumeBody`](crate::ResumeBody), so the layer changes mode: a
    /// `RetryLayer<`[`Resume`](crate::Resume)`>`, making `Retry<S, Resume>` services;
    /// without it, the layer keeps the inner service's response type, and pays nothing.
    /// Its configuration methods work before and after this call alike.
    ///
    /// Per route and per request, [`RetryPolicy::resume`] turns it off (and on again);
    /// [`RetryPolicy::max_continuations`] (default 5) bounds the continuations of one body.
    /// Each continuation is an attempt of the same request: the policy's gates pay for it
    /// (before it is sent), it waits the policy's backoff, and it is not started after the
    /// deadline, which now bounds a resumable body's continuations too (not the reading of
    /// the body itself). [`ResumeInfo`](crate::ResumeInfo), in the response's extensions
    /// tells how many the body took; a body that could not be continued ends with a
    /// [`RetryError`](crate::RetryError) whose record says why
    /// ([`RetryInfo::stop`](crate::RetryInfo::stop)).
    ///
    /// What is resumed: a GET without a body, answered 200, or 206 to a `Range: bytes=a-b`
    /// (or `bytes=a-`) of the caller's own, within which the continuation asks for the rest
    /// (`bytes=(a+N)-b`). Not resumed: other methods, suffix ranges (`bytes=-500`), several
    /// ranges (multipart answers), a caller's own `If-Range`. A resumable request asks for
    /// `Accept-Encoding: identity` unless the caller set one, since ranges count the bytes
    /// as sent: with a decompressing client or layer below this one, which would hand over
    /// decoded bytes, keep the caller's `Accept-Encoding` unset. A response that names its
    /// encoding is continued as the encoded bytes this layer sees, only by a continuation of
    /// the same encoding; a caller that asked for an encoding and got an answer that names
    /// none (identity bytes, or bytes decoded below this layer, which no range could tell
    /// apart) gets its body passed through, not continued.
    ///
    /// ```
    /// use bytes::Bytes;
    /// use http::{Request, Response, StatusCode};
    /// use http_body_util::{BodyExt, Full, StreamBody};
    /// use tower::{Layer, ServiceExt};
    /// use tower_http_retry::{ReplayBody, ResumeInfo, RetryLayer};
    /// # use http_body::Frame;
    /// # type Body = http_body_util::combinators::BoxBody<Bytes, std::io::Error>;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), tower::BoxError> {
    /// // The server cuts the first body after "hello ", then answers `Range: bytes=6-`.
    /// let inner = tower::service_fn(|req: Request<ReplayBody<Full<Bytes>>>| async move {
    ///     let response = match req.headers().get("range") {
    ///         None => {
    ///             let frames: Vec<Result<Frame<Bytes>, std::io::Error>> = vec![
    ///                 Ok(Frame::data(Bytes::from_static(b"hello "))),
    ///                 Err(std::io::ErrorKind::ConnectionReset.into()),
    ///             ];
    ///             Response::builder()
    ///                 .header("etag", "\"v1\"")
    ///                 .header("content-length", "11")
    ///                 .body(StreamBody::new(futures_util::stream::iter(frames)).boxed())
    ///         }
    ///         Some(_) => Response::builder()
    ///             .status(StatusCode::PARTIAL_CONTENT)
    ///             .header("etag", "\"v1\"")
    ///             .header("content-range", "bytes 6-10/11")
    ///             .body(Full::new(Bytes::from_static(b"world")).map_err(|e| match e {}).boxed()),
    ///     };
    ///     Ok::<_, std::convert::Infallible>(response.unwrap())
    /// });
    ///
    /// let client = RetryLayer::new().resume().layer(inner);
    /// let request = Request::get("http://127.0.0.1:3000/file").body(Full::new(Bytes::new()))?;
    /// let response = client.oneshot(request).await?;
    /// let info = response.extensions().get::<ResumeInfo>().cloned().unwrap();
    /// assert_eq!(response.into_body().collect().await?.to_bytes(), "hello world");
    /// assert_eq!(info.continuations().len(), 1);
    /// # Ok(())
    /// # }
    /// ```
    pub fn resume(self) -> RetryLayer<crate::Resume> {
        RetryLayer {
            config: self.config,
            plans: self.plans,
            mode: PhantomData,
        }
    }
}

impl<S: Clone, M> Layer<S> for RetryLayer<M> {
    type Service = Retry<S, M>;

    fn layer(&self, inner: S) -> Self::Service {
        Retry::from_plans(inner, self.plans())
    }
}

impl<M> RetryLayer<M> {
    /// Every policy of the layer resolved, as a service made by [`Layer::layer`] holds them:
    /// resolved once, on first use.
    pub(crate) fn plans(&self) -> Arc<Plans> {
        Arc::clone(
            self.plans
                .get_or_init(|| Arc::new(Plans::new(Arc::clone(&self.config)))),
        )
    }
}

impl<M> fmt::Debug for RetryLayer<M> {
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
