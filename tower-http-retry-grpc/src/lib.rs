//! gRPC retries for tonic clients on [`tower_http_retry`]: the building blocks of gRPC's
//! client retry design, grpc/proposal A6-client-retries.
//!
//! A tonic `Channel` is a tower service over HTTP/2, so the retry layer can sit in front
//! of it. gRPC differs from plain HTTP in ways the pieces here take care of:
//!
//! - **Outcomes are in `grpc-status`, not the HTTP status.** Every answer is HTTP 200. A
//!   server that fails an RPC before sending anything answers Trailers-Only: one HEADERS
//!   frame that ends the stream and carries `grpc-status`, so the code is in the response
//!   headers, where [`trailers_only_code`] reads it. Ordinary response headers (no
//!   `grpc-status`) commit the RPC: A6 never retries it after that.
//! - **Which codes to retry is the method's policy** ([`RetryPolicy::grpc_codes`](GrpcPolicyExt::grpc_codes)), from a
//!   service config ([`service_config`]); `UNAVAILABLE` is the usual one.
//!   [`RetryLayer::from_service_config`] turns a whole config into the layer,
//!   [`MethodConfig::policy`] one entry into a policy.
//! - **Server pushback** ([`pushback`]): `grpc-retry-pushback-ms` is the exact wait of the
//!   next retry, or, negative or malformed, says not to retry.
//! - **Throttling** (the core's [`Throttle`]): A6's token count per server, which turns retries off
//!   while failures run above a share of the attempts (1 in 11 at the usual ratio of 0.1).
//! - **Backoff** ([`RetryParams::backoff`]): `initialBackoff * backoffMultiplier^(n-1)`,
//!   capped at `maxBackoff`, with jitter: the crate's [`Backoff::from_initial`].
//! - **Metadata on the wire**: `grpc-previous-rpc-attempts` on retries and `grpc-timeout`
//!   set to the time left (a caller's own `grpc-timeout` bounds the whole RPC).
//! - **Tonic's types**: [`tonic_body_layer`] gives the channel the body type it takes;
//!   [`status_layer`] and [`into_status`] turn the layer's errors into the `Status` a
//!   tonic caller should see.
//!
//! # How the layer applies them, per A6
//!
//! A gRPC policy is the crate's [`RetryPolicy`] with three of the core's seams filled in by
//! this module: a classifier, a per-attempt hook, and the transparent retry.
//!
//! 1. Before every attempt the hook sets `grpc-previous-rpc-attempts` to the number of
//!    earlier attempts (transparent retries not counted; absent on the first), and, with a
//!    deadline, `grpc-timeout` to the time left. A `grpc-timeout` the caller set is read as
//!    the RPC's deadline too (the shorter of it and the policy's applies).
//! 2. On a response the classifier finds the call's code: the `grpc-status` of a
//!    Trailers-Only answer ([`trailers_only_code`]), or, for an HTTP status other than 200
//!    without one (a proxy's error page), gRPC's HTTP-to-gRPC mapping (503, 502, 504 and
//!    429 are `UNAVAILABLE`, 404 `UNIMPLEMENTED`, 401 `UNAUTHENTICATED`, 403
//!    `PERMISSION_DENIED`, 400 `INTERNAL`, others `UNKNOWN`; a `grpc-status` wins, as in
//!    C-core). Ordinary headers of a 200 commit the RPC: a success, as is `OK`; a success
//!    refills the [`Throttle`]. A code the policy retries is a failure, which takes a token
//!    (no retry once half or less are left), retried after the backoff, or after exactly
//!    the [`pushback`]'s wait (the backoff then starts again; only the deadline bounds it),
//!    or not at all when the pushback says stop. Any other code is returned at once and
//!    counts neither way, unless its pushback says stop: that is a failure for the
//!    throttle whatever the code, as A6 counts it and grpc-go does.
//! 3. On a transport error before any response, the failure gets the code gRPC's clients
//!    give it, and is retried only when the policy lists that code (the listed codes are
//!    the service owner's only word that the method may be repeated): a refused, reset or
//!    closed connection, a `GOAWAY` and a timed-out attempt are `UNAVAILABLE`; a stream the
//!    server reset has the code of its HTTP/2 error (`INTERNAL_ERROR` is `INTERNAL`,
//!    `CANCEL` `CANCELLED`, `ENHANCE_YOUR_CALM` `RESOURCE_EXHAUSTED`). A stream refused
//!    before it left (`REFUSED_STREAM`), or a request hyper never started (its connection
//!    closed under it), is first sent again at once, counted neither as an attempt nor for
//!    throttling ([`AttemptKind::Transparent`]), whatever the codes; a second one is
//!    `UNAVAILABLE` for the policy. A refused connection gets no such
//!    retry: C-core and grpc-go hand a failed connection to the retry policy.
//! 4. On the response it returns: tonic's client moves the http response's extensions
//!    (`RetryInfo`) into the `tonic::Response` of a successful call, but builds the
//!    `Status` of a failed one from the response headers alone. [`status_layer`] on top
//!    of the stack makes that status itself, with the record as its source.
//!
//! Errors, as opposed to responses, reach a tonic client through `Status::from_error`,
//! which does not know this crate's errors (a passed deadline would be `UNKNOWN`):
//! [`status_layer`] maps them first ([`into_status`]), keeping the error as the status's
//! source.
//!
//! # Metrics
//!
//! With the `opentelemetry` feature, `StatusLayer::otel_meter` records gRPC's retry
//! metrics (grpc/proposal A96: `grpc.client.call.retries`, `.transparent_retries`,
//! `.hedges`, `.retry_delay`, with `grpc.method` and `grpc.target`) from each call's
//! record, as gRPC's own clients do.
//!
//! # Stacking with a tonic `Channel`
//!
//! ```no_run
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! use tower::ServiceBuilder;
//! use tower_http_retry::RetryLayer;
//! use tower_http_retry_grpc::{self as grpc, GrpcLayerExt};
//!
//! # #[cfg(any())]
//! let channel = tonic::transport::Endpoint::from_static("http://127.0.0.1:50051")
//!     .connect()
//!     .await?;
//! # let channel = tower::service_fn(|_: http::Request<tonic::body::Body>| async {
//! #     Ok::<_, std::convert::Infallible>(http::Response::new(tonic::body::Body::empty()))
//! # });
//! let config = grpc::service_config(r#"{"methodConfig": [{
//!     "name": [{"service": "shop.Cart"}],
//!     "retryPolicy": {"maxAttempts": 3, "initialBackoff": "0.1s", "maxBackoff": "1s",
//!                     "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}
//! }]}"#)?;
//! let stack = ServiceBuilder::new()
//!     .layer(grpc::status_layer())
//!     .layer(RetryLayer::from_service_config(&config)) // or RetryLayer::grpc() and routes
//!     .layer(grpc::tonic_body_layer())
//!     .service(channel);
//! let client = tonic::client::Grpc::new(stack);
//! # let _ = client;
//! # Ok(())
//! # }
//! ```
//!
//! [`AttemptKind::Transparent`]: tower_http_retry::AttemptKind::Transparent
//! [`RetryPolicy::grpc_codes`]: GrpcPolicyExt::grpc_codes
//! [`RetryLayer::from_service_config`]: GrpcLayerExt::from_service_config
//! [`RetryPolicy`]: tower_http_retry::RetryPolicy
//! [`Backoff::from_initial`]: tower_http_retry::Backoff::from_initial
//! [`Throttle`]: tower_http_retry::Throttle

#![forbid(unsafe_code)]
#![warn(
    missing_docs,
    missing_debug_implementations,
    rust_2018_idioms,
    unreachable_pub
)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod adapter;
mod config;
mod headers;
mod metrics;

#[doc = include_str!("parity.md")]
pub mod parity {}

/// Real h2 and hyper errors of a broken HTTP/2 connection, for the tests.
#[cfg(all(test, feature = "hyper"))]
#[path = "../../tests/common/broken_h2.rs"]
mod broken_h2;

use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, request};
use tonic::Code;

pub use self::adapter::{
    IntoStatus, IntoStatusFuture, StatusLayer, TonicBody, TonicBodyLayer, into_status,
    status_layer, tonic_body_layer,
};
use self::config::code_name;
pub use self::config::{
    HedgingParams, InvalidServiceConfig, MethodConfig, MethodName, RetryParams, ServiceConfig,
    ThrottlingParams, service_config,
};
use self::headers::{
    GRPC_TIMEOUT, parse_grpc_timeout, response_code, set_grpc_timeout, set_previous_rpc_attempts,
};
pub use self::headers::{Pushback, pushback, trailers_only_code};

use tower_http_retry::classify::{
    Classification, Classify, DefaultClassifier, FailureKind, Outcome, RetryReason,
};
use tower_http_retry::hints::{Hint, HintSource};
use tower_http_retry::{Attempt, AttemptHook};
use tower_http_retry::{RetryLayer, RetryPolicy};

/// The [`RetryReason`] the layer records for a retried gRPC status code: a
/// [`RetryReason::Code`] of protocol `"gRPC"`, with the code's number and its name.
///
/// ```
/// use tonic::Code;
/// use tower_http_retry::classify::RetryReason;
/// use tower_http_retry_grpc as grpc;
///
/// let reason = grpc::reason(Code::Unavailable);
/// assert_eq!(reason.to_string(), "gRPC UNAVAILABLE");
/// assert!(matches!(reason, RetryReason::Code { value: 14, .. }));
/// ```
pub fn reason(code: Code) -> RetryReason {
    let kind = match code {
        Code::ResourceExhausted => FailureKind::Throttling,
        Code::Unavailable | Code::DeadlineExceeded | Code::Aborted => FailureKind::Transient,
        _ => FailureKind::Other,
    };
    RetryReason::Code {
        protocol: "gRPC",
        value: code as i32,
        name: code_name(code),
        kind,
    }
}

/// Where the layer records a pushback's wait as coming from.
const PUSHBACK: HintSource = HintSource::Header("grpc-retry-pushback-ms");

/// The classification of a gRPC policy ([`RetryPolicy::grpc_codes`](GrpcPolicyExt::grpc_codes)): a final answer
/// whose code is one of the policy's is retried, after its pushback, or not at all when
/// the pushback says stop. The code is a Trailers-Only response's `grpc-status`, or gRPC's
/// mapping of an HTTP error without one (a proxy's 503 is `UNAVAILABLE`). `OK` and a
/// committed response (ordinary headers of a 200) are successes; any other code is final,
/// and a failure for the throttle only when its pushback says stop. A transport failure
/// is retried when its gRPC code is listed: `UNAVAILABLE` for a connection that was
/// refused, reset or closed, a `GOAWAY` or a timed-out attempt; a reset stream's HTTP/2
/// error code mapped as grpc-go maps it.
///
/// A classifier of your own for a gRPC policy falls back to this one, as an HTTP one falls
/// back to the [`DefaultClassifier`]; set it after
/// [`RetryPolicy::grpc_codes`](GrpcPolicyExt::grpc_codes), which sets this one:
///
/// ```
/// use tonic::Code;
/// use tower_http_retry::RetryPolicy;
/// use tower_http_retry::classify::{Classification, Classify, Outcome};
/// use tower_http_retry_grpc::{GrpcPolicyExt, StatusClassifier};
///
/// let grpc = StatusClassifier::new([Code::Unavailable]);
/// // Also final: an UNAVAILABLE this service marks as a maintenance window.
/// let policy = RetryPolicy::new()
///     .grpc_codes([Code::Unavailable])
///     .classifier(move |head, outcome| match outcome {
///         Outcome::Response { headers, .. } if headers.contains_key("x-maintenance") => {
///             Classification::Done
///         }
///         _ => grpc.classify(head, outcome),
///     });
/// # let _ = policy;
/// ```
#[derive(Debug, Clone)]
pub struct StatusClassifier {
    codes: Arc<[Code]>,
}

impl StatusClassifier {
    /// Retries the Trailers-Only answers whose status is one of `codes`.
    pub fn new(codes: impl IntoIterator<Item = Code>) -> Self {
        Self {
            codes: codes.into_iter().collect(),
        }
    }
}

impl StatusClassifier {
    fn lists(&self, code: Code) -> bool {
        self.codes.contains(&code)
    }

    /// A transport failure: retried when its gRPC code is listed ([`transport_code`]).
    fn classify_error(
        &self,
        request: &request::Parts,
        error: &(dyn std::error::Error + 'static),
    ) -> Classification {
        let verdict = DefaultClassifier.classify(request, Outcome::Error(error));
        let Some(transport) = verdict.reason() else {
            return verdict;
        };
        match transport_code(error, transport) {
            // The transport's own reason is kept: it says more, and is as transient.
            Code::Unavailable if self.lists(Code::Unavailable) => verdict,
            code if self.lists(code) => Classification::Retry(reason(code)),
            _ => Classification::Done,
        }
    }
}

impl Classify for StatusClassifier {
    fn classify(&self, request: &request::Parts, outcome: Outcome<'_>) -> Classification {
        match outcome {
            Outcome::Response { status, headers } => match response_code(status, headers) {
                None | Some(Code::Ok) => Classification::Success,
                Some(code) => match (self.lists(code), pushback(headers)) {
                    (true, None) => Classification::Retry(reason(code)),
                    (true, Some(Pushback::Wait(wait))) => {
                        Classification::RetryWithHint(reason(code), Hint::exact(wait, PUSHBACK))
                    }
                    // A pushback that says stop counts as a failure for the throttle, on
                    // any code (A6; grpc-go reads it before the code).
                    (_, Some(Pushback::Stop)) => Classification::Stop(reason(code)),
                    (false, _) => Classification::Done,
                },
            },
            Outcome::Error(error) => self.classify_error(request, error),
            // An outcome of a kind this classifier does not know: the core's judgement.
            other => DefaultClassifier.classify(request, other),
        }
    }
}

/// The gRPC code of a transport failure the core recognised as `transport`, as gRPC's
/// clients give it: a stream the server reset by its HTTP/2 error code
/// (`INTERNAL_ERROR` is `INTERNAL`, `CANCEL` `CANCELLED`, `ENHANCE_YOUR_CALM`
/// `RESOURCE_EXHAUSTED`, `REFUSED_STREAM` `UNAVAILABLE`); every connection-level failure (a
/// refused or reset connection, a `GOAWAY`, a timed-out attempt) `UNAVAILABLE`; a reason a
/// layer below gave, its code.
pub(crate) fn transport_code(
    error: &(dyn std::error::Error + 'static),
    transport: RetryReason,
) -> Code {
    match transport {
        RetryReason::ConnectionClosed => reset_code(error).unwrap_or(Code::Unavailable),
        RetryReason::Code {
            protocol: "gRPC",
            value,
            ..
        } => Code::from_i32(value),
        RetryReason::Code { .. } | RetryReason::Custom(_) => Code::Unknown,
        RetryReason::Status(status) => headers::http_status_code(status),
        _ => Code::Unavailable,
    }
}

/// The code of an `RST_STREAM` the server sent on the request's stream, if that is the
/// failure.
#[cfg(feature = "hyper")]
fn reset_code(error: &(dyn std::error::Error + 'static)) -> Option<Code> {
    let mut link = Some(error);
    while let Some(error) = link {
        if let Some(h2) = error.downcast_ref::<h2::Error>() {
            return match (h2.is_reset() && h2.is_remote(), h2.reason()) {
                (true, Some(reason)) => Some(adapter::h2_reason_code(reason)),
                _ => None,
            };
        }
        link = match error.downcast_ref::<std::io::Error>() {
            // `io::Error::source` skips the custom payload itself.
            Some(io) => io
                .get_ref()
                .map(|inner| inner as &(dyn std::error::Error + 'static)),
            None => error.source(),
        };
    }
    None
}

/// Without the `hyper` feature h2's errors are not recognised.
#[cfg(not(feature = "hyper"))]
fn reset_code(_: &(dyn std::error::Error + 'static)) -> Option<Code> {
    None
}

/// A6's metadata on every attempt: `grpc-previous-rpc-attempts` (removed from the first,
/// so a caller's stray value never reaches the server) and `grpc-timeout`, the time left
/// before the deadline when that is shorter than what the request says. The caller's own
/// `grpc-timeout` is the RPC's time limit.
struct GrpcMetadata;

impl AttemptHook for GrpcMetadata {
    fn before_attempt(&self, attempt: &Attempt, headers: &mut HeaderMap) {
        set_previous_rpc_attempts(headers, attempt.counted_before);
        if let Some(left) = attempt.time_left {
            if self.time_limit(headers).is_none_or(|said| said > left) {
                set_grpc_timeout(headers, left);
            }
        }
    }

    fn time_limit(&self, headers: &HeaderMap) -> Option<Duration> {
        headers
            .get(GRPC_TIMEOUT)
            .and_then(|value| parse_grpc_timeout(value.as_bytes()))
    }
}

/// gRPC's rules on a [`RetryPolicy`]: bring the trait into scope
/// (`use tower_http_retry_grpc::GrpcPolicyExt;`) and call
/// [`grpc_codes`](GrpcPolicyExt::grpc_codes) on any policy.
pub trait GrpcPolicyExt: sealed::Sealed {
    /// Makes this a gRPC policy (gRPC's A6 rules): the status codes that are
    /// retried, read from `grpc-status` in the headers of a Trailers-Only response (an RPC
    /// whose ordinary headers arrived is committed and returned as is), or mapped from an
    /// HTTP error without `grpc-status`; transport failures get their gRPC code
    /// ([`StatusClassifier`]) and are retried only when it is listed. Listing codes is A6's declaration that
    /// the method may be repeated, so the policy's requests are treated as repeatable
    /// ([`RetryPolicy::assume_idempotent`]) and get no idempotency key.
    ///
    /// The classification is the policy's classifier, a [`StatusClassifier`]: it replaces a
    /// classifier set before; one set after replaces it, and can fall back to it. Like
    /// every setting of a policy, it replaces the classification of the policies beneath
    /// where the policy is laid (a route's over the layer's), and what it does not set
    /// (attempts, backoff, deadline, gates) comes from them.
    ///
    /// It also sends A6's metadata on every attempt (`grpc-previous-rpc-attempts`,
    /// `grpc-timeout`: the time left when the policy has a deadline; a `grpc-timeout` the
    /// caller set is the RPC's deadline too), honours `grpc-retry-pushback-ms` (the exact
    /// wait; a negative or malformed value stops), and gets A6's transparent retry
    /// ([`RetryPolicy::transparent_retry`]): a stream refused before it left is sent again
    /// at once, once per RPC, whatever the codes, without counting against [`max_attempts`], in
    /// `grpc-previous-rpc-attempts`, or for the throttle. So even with `max_attempts(1)`
    /// the body is kept for that one replay; [`RetryPolicy::never`], which is not a gRPC
    /// policy, sends once, keeps nothing and tells the throttle nothing.
    ///
    /// [`max_attempts`]: RetryPolicy::max_attempts
    ///
    /// ```
    /// use tonic::Code;
    /// use tower_http_retry::RetryPolicy;
    /// use tower_http_retry_grpc::GrpcPolicyExt;
    ///
    /// let policy = RetryPolicy::new().grpc_codes([Code::Unavailable, Code::ResourceExhausted]);
    /// // What it sets: the classifier, the metadata hook, repeatable calls without a key,
    /// // the transparent retry.
    /// assert_eq!(
    ///     format!("{policy:?}"),
    ///     "RetryPolicy { classifier: custom, assume_idempotent: true, \
    ///      idempotency_key: None, hooks: Hooks { count: 1 }, transparent_retry: true }"
    /// );
    /// ```
    fn grpc_codes(self, codes: impl IntoIterator<Item = Code>) -> RetryPolicy;
}

impl GrpcPolicyExt for RetryPolicy {
    fn grpc_codes(self, codes: impl IntoIterator<Item = Code>) -> RetryPolicy {
        self.custom_classifier(StatusClassifier::new(codes))
            .on_attempt(GrpcMetadata)
            .transparent_retry(true)
            .assume_idempotent(true)
            .idempotency_key(None)
    }
}

/// gRPC's layers: bring the trait into scope (`use tower_http_retry_grpc::GrpcLayerExt;`)
/// and make one with [`RetryLayer::grpc`](GrpcLayerExt::grpc) or
/// [`RetryLayer::from_service_config`](GrpcLayerExt::from_service_config).
pub trait GrpcLayerExt: sealed::Sealed {
    /// A layer that speaks gRPC's retry rules (gRPC's A6): its policy retries `UNAVAILABLE`
    /// ([`RetryPolicy::grpc_codes`](GrpcPolicyExt::grpc_codes)), with no idempotency keys.
    /// Everything else is as [`RetryLayer::new`]: the backoff, the budget, the replay cap.
    ///
    /// Policies given to the layer afterwards are laid over that one: a
    /// [`policy`](RetryLayer::policy) changes what it sets for every call, a
    /// [`route`](RetryLayer::route)'s for the calls it matches, and both keep gRPC's rules
    /// unless they set codes of their own. (A route for plain HTTP under this layer takes
    /// them back with `RetryPolicy::new().custom_classifier(DefaultClassifier)
    /// .assume_idempotent(false).transparent_retry(false).no_hooks()`; a layer of its own is
    /// simpler.) A6's throttle is a gate of the layer's policy (beside the layer's budget):
    ///
    /// ```
    /// use tower_http_retry::{RetryLayer, RetryPolicy, RouteMatch, Throttle};
    /// use tower_http_retry_grpc::{GrpcLayerExt, GrpcPolicyExt};
    ///
    /// let layer = RetryLayer::grpc()
    ///     .policy(RetryPolicy::new().gate(Throttle::builder().max_tokens(10.0).token_ratio(0.1).build()))
    ///     // Four attempts, `RESOURCE_EXHAUSTED` retried too; the throttle and the rest are
    ///     // the layer's.
    ///     .route(
    ///         RouteMatch::post().path_prefix("/shop.Orders/Get"),
    ///         RetryPolicy::new()
    ///             .max_attempts(4)
    ///             .grpc_codes([tonic::Code::Unavailable, tonic::Code::ResourceExhausted]),
    ///     );
    /// # let _ = layer;
    /// ```
    fn grpc() -> RetryLayer;

    /// The layer a gRPC service config describes (gRPC's A6 "Integration with
    /// Service Config"): one call from [`service_config`]'s reading to the whole retry
    /// configuration of a tonic client.
    ///
    /// - Every `methodConfig` name becomes a route ([`ServiceConfig::routes`]): `POST` to
    ///   `/service/method`, to `/service/...`, or, for the empty name, every `POST`; the
    ///   most specific match wins, as in gRPC.
    /// - Each route's policy is its entry's [`MethodConfig::policy`]: the
    ///   `retryableStatusCodes`, `maxAttempts` (at most 5), A6's full-jitter backoff from
    ///   `initialBackoff` times `backoffMultiplier` up to `maxBackoff`, and the `timeout` as
    ///   the deadline of the RPC across all its attempts (sent as `grpc-timeout`, the time
    ///   left, on every attempt; a shorter deadline of the caller's own, tonic's
    ///   `Request::set_timeout`, applies instead, as in gRPC's clients). An entry without a
    ///   `retryPolicy` retries nothing but keeps gRPC's classification and A6's transparent
    ///   retry.
    /// - A method no entry names gets the same: one attempt, gRPC's rules, no deadline. That
    ///   is the layer's policy, and every route's policy is laid over it; each sets what
    ///   its entry says (attempts, codes, backoff or hedging, the timeout), so no entry
    ///   takes anything from another, as in gRPC.
    /// - `retryThrottling` becomes a [`Throttle`](tower_http_retry::Throttle) gate of the
    ///   layer's policy ([`RetryPolicy::gate`]), which every route inherits, with one count
    ///   per authority (A6 throttles per server name), shared by every route and by every
    ///   layer made from the same [`ServiceConfig`] (its throttle is one shared handle). A
    ///   tonic client sends a path alone (the channel adds its origin below the layer), so
    ///   its calls count as requests without an authority, sharing one count, unless the
    ///   client is made with tonic's `with_origin`.
    ///
    /// The rest is [`RetryLayer::new`]'s: no idempotency keys, the default
    /// [`RetryBudget`](tower_http_retry::RetryBudget) (gRPC has none), the 64 KiB replay
    /// cap. It is a layer like any other, so those can be changed afterwards; a route added
    /// later is tried after the config's routes.
    ///
    /// A policy laid over the layer afterwards ([`RetryLayer::policy`]) reaches every
    /// method for what the method's entry does not set:
    ///
    /// - a `deadline` reaches the methods whose entry has no `timeout` (and those no entry
    ///   names); a method's own `timeout` replaces it, even a longer one. gRPC's per-call
    ///   deadline, of which the shorter wins, is the call's own `grpc-timeout` (tonic's
    ///   `Request::set_timeout`);
    /// - an `attempt_timeout`, hooks, a `max_retry_after` reach every method;
    /// - a gate replaces the gate of its kind for every method: `.gate(budget)` the
    ///   layer's budget, `.gate(throttle)` the config's throttle. `no_gates()` removes
    ///   them all, the config's throttle included: to drop the budget alone, give the
    ///   throttle back, `RetryPolicy::new().no_gates().gate(config.throttle().unwrap().clone())`;
    /// - a `hedge` reaches only the methods no entry names, which make one attempt and so
    ///   hedge nothing: an entry with a `retryPolicy` is never hedged (A6 allows a method
    ///   one of the two).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_http_retry::{RetryLayer, RetryPolicy};
    /// use tower_http_retry_grpc::{GrpcLayerExt, service_config};
    ///
    /// let config = service_config(r#"{
    ///   "methodConfig": [{
    ///     "name": [{"service": "shop.Cart"}],
    ///     "timeout": "2s",
    ///     "retryPolicy": {
    ///       "maxAttempts": 4, "initialBackoff": "0.1s", "maxBackoff": "1s",
    ///       "backoffMultiplier": 1.5, "retryableStatusCodes": ["UNAVAILABLE"]
    ///     }
    ///   }],
    ///   "retryThrottling": {"maxTokens": 10, "tokenRatio": 0.1}
    /// }"#)?;
    /// let layer = RetryLayer::from_service_config(&config)
    ///     // Every call within 10 s, unless its method's entry says otherwise (shop.Cart's: 2 s).
    ///     .policy(RetryPolicy::new().deadline(Duration::from_secs(10)));
    /// // tower::ServiceBuilder::new()
    /// //     .layer(grpc::status_layer())
    /// //     .layer(layer)
    /// //     .layer(grpc::tonic_body_layer())
    /// //     .service(channel)
    /// # let _ = layer;
    /// # Ok::<_, tower_http_retry_grpc::InvalidServiceConfig>(())
    /// ```
    fn from_service_config(config: &ServiceConfig) -> RetryLayer;
}

impl GrpcLayerExt for RetryLayer {
    fn grpc() -> RetryLayer {
        RetryLayer::new().policy(RetryPolicy::new().grpc_codes([Code::Unavailable]))
    }

    fn from_service_config(config: &ServiceConfig) -> RetryLayer {
        let unnamed = RetryPolicy::new().max_attempts(1).grpc_codes([]);
        let unnamed = match config.throttle() {
            Some(throttle) => unnamed.gate(throttle.clone()),
            None => unnamed,
        };
        let mut layer = RetryLayer::new().policy(unnamed);
        for (route, method) in config.routes() {
            layer = layer.route(route, method.policy());
        }
        layer
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for tower_http_retry::RetryPolicy {}
    impl Sealed for tower_http_retry::RetryLayer {}
}

/// The codes a policy retries, found by sending through it a call answered with each
/// code, Trailers-Only, and counting its attempts.
#[cfg(test)]
fn retried_codes(policy: &RetryPolicy) -> Vec<Code> {
    use tower::{Layer, ServiceExt};
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    let attempts = |code: Code| {
        let calls = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let counted = Arc::clone(&calls);
        let service = tower::service_fn(
            move |_: http::Request<
                tower_http_retry::ReplayBody<http_body_util::Empty<bytes::Bytes>>,
            >| {
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                async move {
                    let response = http::Response::builder()
                        .header(headers::GRPC_STATUS, code as i32)
                        .body(())
                        .unwrap();
                    Ok::<_, std::convert::Infallible>(response)
                }
            },
        );
        let layer = RetryLayer::new()
            .policy(RetryPolicy::new().no_gates())
            .policy(policy.clone().max_attempts(2));
        let request = http::Request::post("http://h/test.Raw/Unary")
            .body(http_body_util::Empty::new())
            .unwrap();
        runtime
            .block_on(layer.layer(service).oneshot(request))
            .unwrap();
        calls.load(std::sync::atomic::Ordering::SeqCst)
    };
    (0..=16)
        .map(Code::from_i32)
        .filter(|&code| attempts(code) == 2)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request head, which `StatusClassifier` does not read.
    fn empty_head() -> http::request::Parts {
        http::Request::new(()).into_parts().0
    }
    use crate::headers::GRPC_PREVIOUS_RPC_ATTEMPTS;

    fn trailers_only(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.append(*name, http::HeaderValue::from_static(value));
        }
        headers
    }

    fn classify(headers: &HeaderMap) -> Classification {
        let classifier = StatusClassifier::new([Code::Unavailable]);
        let outcome = Outcome::Response {
            status: http::StatusCode::OK,
            headers,
        };
        classifier.classify(&empty_head(), outcome)
    }

    #[test]
    fn trailers_only_codes_are_classified_with_their_pushback() {
        let unavailable = reason(Code::Unavailable);
        assert_eq!(
            classify(&trailers_only(&[("grpc-status", "14")])),
            Classification::Retry(unavailable)
        );
        assert_eq!(
            classify(&trailers_only(&[
                ("grpc-status", "14"),
                ("grpc-retry-pushback-ms", "250")
            ])),
            Classification::RetryWithHint(
                unavailable,
                Hint::exact(Duration::from_millis(250), PUSHBACK)
            )
        );
        assert_eq!(
            classify(&trailers_only(&[
                ("grpc-status", "14"),
                ("grpc-retry-pushback-ms", "-1")
            ])),
            Classification::Stop(unavailable)
        );
        // Not a listed code: final; a pushback that says stop makes it a failure the
        // throttle counts, a pushback that gives a wait is ignored.
        assert_eq!(
            classify(&trailers_only(&[
                ("grpc-status", "3"),
                ("grpc-retry-pushback-ms", "-1")
            ])),
            Classification::Stop(reason(Code::InvalidArgument))
        );
        assert_eq!(
            classify(&trailers_only(&[
                ("grpc-status", "3"),
                ("grpc-retry-pushback-ms", "10")
            ])),
            Classification::Done
        );
        assert_eq!(
            classify(&trailers_only(&[("grpc-status", "3")])),
            Classification::Done
        );
        // OK, and a committed response: successes.
        assert_eq!(
            classify(&trailers_only(&[("grpc-status", "0")])),
            Classification::Success
        );
        assert_eq!(classify(&HeaderMap::new()), Classification::Success);
    }

    fn classify_status(status: u16, headers: &HeaderMap) -> Classification {
        let classifier = StatusClassifier::new([Code::Unavailable]);
        let outcome = Outcome::Response {
            status: http::StatusCode::from_u16(status).unwrap(),
            headers,
        };
        classifier.classify(&empty_head(), outcome)
    }

    #[test]
    fn an_http_error_without_grpc_status_gets_grpcs_mapping() {
        let none = HeaderMap::new();
        let unavailable = Classification::Retry(reason(Code::Unavailable));
        for status in [429, 502, 503, 504] {
            assert_eq!(classify_status(status, &none), unavailable, "{status}");
        }
        // Mapped to codes the policy does not list: final, and no success.
        for status in [400, 401, 403, 404, 500, 301] {
            assert_eq!(
                classify_status(status, &none),
                Classification::Done,
                "{status}"
            );
        }
        // A grpc-status wins over the HTTP status, as in C-core.
        let ok = trailers_only(&[("grpc-status", "0")]);
        assert_eq!(classify_status(503, &ok), Classification::Success);
        let internal = trailers_only(&[("grpc-status", "13")]);
        assert_eq!(classify_status(200, &internal), Classification::Done);
        // A proxy's 503 with a pushback that says stop: counted, not retried.
        let stop = trailers_only(&[("grpc-retry-pushback-ms", "-1")]);
        assert_eq!(
            classify_status(503, &stop),
            Classification::Stop(reason(Code::Unavailable))
        );
        // The table itself.
        let table = [
            (400, Code::Internal),
            (401, Code::Unauthenticated),
            (403, Code::PermissionDenied),
            (404, Code::Unimplemented),
            (429, Code::Unavailable),
            (502, Code::Unavailable),
            (503, Code::Unavailable),
            (504, Code::Unavailable),
            (500, Code::Unknown),
            (418, Code::Unknown),
        ];
        for (status, code) in table {
            let status = http::StatusCode::from_u16(status).unwrap();
            assert_eq!(headers::http_status_code(status), code, "{status}");
            assert_eq!(response_code(status, &none), Some(code), "{status}");
        }
        assert_eq!(response_code(http::StatusCode::OK, &none), None);
    }

    fn classify_error_with(
        codes: &[Code],
        error: &(dyn std::error::Error + 'static),
    ) -> Classification {
        let classifier = StatusClassifier::new(codes.iter().copied());
        classifier.classify(&empty_head(), Outcome::Error(error))
    }

    #[test]
    fn a_connection_failure_is_unavailable_and_retried_only_when_listed() {
        use std::io::{Error, ErrorKind};
        for (kind, transport) in [
            (ErrorKind::ConnectionRefused, RetryReason::Connect),
            (ErrorKind::ConnectionReset, RetryReason::ConnectionClosed),
            (ErrorKind::TimedOut, RetryReason::Timeout),
        ] {
            let error = Error::new(kind, "transport");
            assert_eq!(
                classify_error_with(&[Code::Unavailable], &error),
                Classification::Retry(transport),
                "{kind:?}"
            );
            assert_eq!(
                classify_error_with(&[Code::ResourceExhausted], &error),
                Classification::Done,
                "{kind:?}"
            );
        }
        let attempt = tower_http_retry::AttemptTimedOut::new(Duration::from_secs(1));
        assert_eq!(
            classify_error_with(&[Code::Unavailable], &attempt),
            Classification::Retry(RetryReason::Timeout)
        );
        assert_eq!(classify_error_with(&[], &attempt), Classification::Done);
        // What no rule recognises stays final.
        let other = Error::other("disk on fire");
        assert_eq!(
            classify_error_with(&[Code::Unavailable, Code::Unknown], &other),
            Classification::Done
        );
    }

    #[cfg(feature = "hyper")]
    #[tokio::test]
    async fn an_h2_connection_broken_by_an_io_error_is_unavailable() {
        use crate::broken_h2;
        // An end in the middle of a frame: an I/O error of kind `Other`, as h2 reports it
        // and as hyper hands it over.
        let cut = || std::io::Error::other("cut");
        let h2 = broken_h2::h2_error(cut()).await;
        let hyper = broken_h2::hyper_h2_error(cut()).await;
        for error in [&h2 as &(dyn std::error::Error + 'static), &hyper] {
            assert_eq!(
                classify_error_with(&[Code::Unavailable], error),
                Classification::Retry(RetryReason::ConnectionClosed),
                "{error:?}"
            );
            assert_eq!(
                classify_error_with(&[Code::Internal, Code::Unknown], error),
                Classification::Done,
                "{error:?}"
            );
        }
    }

    #[test]
    fn grpc_codes_sets_the_classifier_and_one_set_after_it_wins() {
        let done = |_: &request::Parts, _: Outcome<'_>| Classification::Done;
        let before = RetryPolicy::new()
            .classifier(done)
            .grpc_codes([Code::Unavailable]);
        assert_eq!(retried_codes(&before), [Code::Unavailable]);
        let after = RetryPolicy::new()
            .grpc_codes([Code::Unavailable])
            .classifier(done);
        assert_eq!(retried_codes(&after), []);
    }

    /// What one attempt of [`record`]'s call gets.
    #[derive(Clone, Copy)]
    enum Answer {
        /// A Trailers-Only answer: HTTP 200 with these headers (`grpc-status` among them).
        TrailersOnly(&'static [(&'static str, &'static str)]),
        /// An answer of this HTTP status without `grpc-status` (a proxy's).
        Http(u16),
        /// The transport's error, recognised with this reason.
        Failed(Option<RetryReason>),
    }

    /// The record of one call through `policy`, each attempt answered with the next of
    /// `answers`, under paused time.
    fn record(policy: RetryPolicy, answers: Vec<Answer>) -> tower_http_retry::RetryInfo {
        use tower::{Layer, ServiceExt};
        use tower_http_retry::{RetryError, RetryInfo};
        let answers = Arc::new(std::sync::Mutex::new(std::collections::VecDeque::from(
            answers,
        )));
        let service = tower::service_fn(
            move |_: http::Request<
                tower_http_retry::ReplayBody<http_body_util::Empty<bytes::Bytes>>,
            >| {
                let answer = answers.lock().unwrap().pop_front().expect("an answer left");
                async move {
                    let headers: &[(&str, &str)] = match answer {
                        Answer::TrailersOnly(headers) => headers,
                        Answer::Http(status) => {
                            let response = http::Response::builder().status(status);
                            return Ok(response.body(()).unwrap());
                        }
                        Answer::Failed(reason) => {
                            let error = std::io::Error::other("transport failed");
                            let error = tower_http_retry::classify::Recognized::new(error, reason);
                            return Err(tower::BoxError::from(error));
                        }
                    };
                    let mut response = http::Response::builder();
                    for (name, value) in headers {
                        response = response.header(*name, *value);
                    }
                    Ok(response.body(()).unwrap())
                }
            },
        );
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        let request = http::Request::post("http://h/shop.Cart/Add")
            .body(http_body_util::Empty::new())
            .unwrap();
        let layer = RetryLayer::new()
            .policy(RetryPolicy::new().no_gates())
            .policy(policy);
        match runtime.block_on(layer.layer(service).oneshot(request)) {
            Ok(response) => response.extensions().get::<RetryInfo>().unwrap().clone(),
            Err(error) => error.downcast_ref::<RetryError>().unwrap().info().clone(),
        }
    }

    /// A gRPC policy of `codes`, three attempts, 100 ms between them.
    fn grpc_policy(codes: impl IntoIterator<Item = Code>) -> RetryPolicy {
        use tower_http_retry::{Backoff, Jitter};
        let wait = Duration::from_millis(100);
        RetryPolicy::new()
            .grpc_codes(codes)
            .max_attempts(3)
            .backoff(Backoff::exponential(wait, wait).jitter(Jitter::None))
    }

    /// `{}` and `{:#}` of a record.
    fn shown(info: &tower_http_retry::RetryInfo) -> (String, String) {
        (info.to_string(), format!("{info:#}"))
    }

    /// The record names the gRPC code of every attempt the classifier gave one, whether the
    /// call was retried after it or stopped on it, with the HTTP status (or `error`) beside
    /// it in `{:#}`; a transport failure keeps its own name; an `OK`, and a code the policy
    /// does not retry, have no reason, and are named by their HTTP status.
    #[test]
    fn the_record_names_grpc_codes() {
        use Answer::{Failed, Http, TrailersOnly};
        const UNAVAILABLE: &[(&str, &str)] = &[("grpc-status", "14")];
        const OK: &[(&str, &str)] = &[("grpc-status", "0")];
        let cases: [(_, Vec<Answer>, &str, &[&str]); 8] = [
            (
                grpc_policy([Code::Unavailable]),
                vec![TrailersOnly(UNAVAILABLE), TrailersOnly(OK)],
                "2 attempts: gRPC UNAVAILABLE, 200; waited 100 ms (backoff); stopped: final",
                &[
                    "attempt 1: gRPC UNAVAILABLE (HTTP 200)",
                    "attempt 2, after 100 ms (backoff): 200",
                ],
            ),
            (
                grpc_policy([Code::Unavailable]),
                vec![TrailersOnly(UNAVAILABLE); 3],
                "3 attempts: gRPC UNAVAILABLE, gRPC UNAVAILABLE, gRPC UNAVAILABLE; \
                 waited 200 ms (backoff); stopped: max attempts",
                &[
                    "attempt 1: gRPC UNAVAILABLE (HTTP 200)",
                    "attempt 2, after 100 ms (backoff): gRPC UNAVAILABLE (HTTP 200)",
                    "attempt 3, after 100 ms (backoff): gRPC UNAVAILABLE (HTTP 200)",
                ],
            ),
            // The server's pushback sets the wait, or stops the call.
            (
                grpc_policy([Code::ResourceExhausted]),
                vec![
                    TrailersOnly(&[("grpc-status", "8"), ("grpc-retry-pushback-ms", "250")]),
                    TrailersOnly(&[("grpc-status", "8"), ("grpc-retry-pushback-ms", "-1")]),
                ],
                "2 attempts: gRPC RESOURCE_EXHAUSTED, gRPC RESOURCE_EXHAUSTED; \
                 waited 250 ms (grpc-retry-pushback-ms); stopped: server said stop",
                &[
                    "attempt 1: gRPC RESOURCE_EXHAUSTED (HTTP 200)",
                    "attempt 2, after 250 ms (grpc-retry-pushback-ms): \
                     gRPC RESOURCE_EXHAUSTED (HTTP 200)",
                ],
            ),
            // A proxy's 503 without grpc-status is UNAVAILABLE.
            (
                grpc_policy([Code::Unavailable]),
                vec![Http(503), TrailersOnly(OK)],
                "2 attempts: gRPC UNAVAILABLE, 200; waited 100 ms (backoff); stopped: final",
                &[
                    "attempt 1: gRPC UNAVAILABLE (HTTP 503)",
                    "attempt 2, after 100 ms (backoff): 200",
                ],
            ),
            // A transport failure given a gRPC code by the layer below.
            (
                grpc_policy([Code::Internal]),
                vec![Failed(Some(reason(Code::Internal))), TrailersOnly(OK)],
                "2 attempts: gRPC INTERNAL, 200; waited 100 ms (backoff); stopped: final",
                &[
                    "attempt 1: gRPC INTERNAL (error)",
                    "attempt 2, after 100 ms (backoff): 200",
                ],
            ),
            // A refused connection keeps its own name (it is UNAVAILABLE, listed).
            (
                grpc_policy([Code::Unavailable]),
                vec![Failed(Some(RetryReason::Connect)); 3],
                "3 attempts: connect error, connect error, connect error; \
                 waited 200 ms (backoff); stopped: max attempts",
                &[
                    "attempt 1: connect error",
                    "attempt 2, after 100 ms (backoff): connect error",
                    "attempt 3, after 100 ms (backoff): connect error",
                ],
            ),
            // A stream refused before it left: A6's transparent retry, at once.
            (
                grpc_policy([]),
                vec![Failed(Some(RetryReason::RefusedStream)), TrailersOnly(OK)],
                "2 attempts: HTTP/2 stream refused, 200; waited 0 ms (transparent retry); \
                 stopped: final",
                &[
                    "attempt 1: HTTP/2 stream refused",
                    "attempt 2, at once (transparent retry): 200",
                ],
            ),
            // A code the policy does not retry is final, and the classifier gives it no
            // reason: the record has only its HTTP status.
            (
                grpc_policy([Code::Unavailable]),
                vec![TrailersOnly(&[("grpc-status", "3")])],
                "1 attempt: 200; stopped: final",
                &["attempt 1: 200"],
            ),
        ];
        for (policy, answers, summary, lines) in cases {
            let info = record(policy, answers);
            let alternate: String = std::iter::once(summary.to_string())
                .chain(lines.iter().map(|line| format!("\n  {line}")))
                .collect();
            assert_eq!(shown(&info), (summary.to_string(), alternate));
        }
    }

    #[test]
    fn reasons_name_the_code_and_its_kind() {
        assert_eq!(
            reason(Code::ResourceExhausted).kind(),
            FailureKind::Throttling
        );
        assert_eq!(reason(Code::Unavailable).kind(), FailureKind::Transient);
        assert_eq!(reason(Code::Internal).kind(), FailureKind::Other);
        assert_eq!(reason(Code::Unavailable).as_str(), "UNAVAILABLE");
        assert_eq!(reason(Code::Unavailable), reason(Code::Unavailable));
        assert_ne!(reason(Code::Unavailable), reason(Code::Internal));
    }

    #[test]
    fn the_metadata_hook_numbers_attempts_and_sends_the_time_left() {
        use tower_http_retry::AttemptKind;
        let hook = GrpcMetadata;
        let mut headers = trailers_only(&[("grpc-previous-rpc-attempts", "7")]);
        let first = Attempt::new(1, 0, None, AttemptKind::First);
        hook.before_attempt(&first, &mut headers);
        assert!(
            headers.get(GRPC_PREVIOUS_RPC_ATTEMPTS).is_none(),
            "a stray value is removed"
        );
        assert!(
            headers.get(GRPC_TIMEOUT).is_none(),
            "no deadline, no grpc-timeout"
        );
        // The caller's shorter timeout stays; a longer one becomes the time left.
        headers.insert(GRPC_TIMEOUT, http::HeaderValue::from_static("2S"));
        let retry = Attempt::new(3, 1, Some(Duration::from_secs(5)), AttemptKind::Retry);
        hook.before_attempt(&retry, &mut headers);
        assert_eq!(headers[GRPC_PREVIOUS_RPC_ATTEMPTS], "1");
        assert_eq!(headers[GRPC_TIMEOUT], "2S");
        let later = Attempt::new(3, 1, Some(Duration::from_millis(1500)), AttemptKind::Retry);
        hook.before_attempt(&later, &mut headers);
        assert_eq!(headers[GRPC_TIMEOUT], "1500000u");
        assert_eq!(hook.time_limit(&headers), Some(Duration::from_millis(1500)));
        assert_eq!(hook.time_limit(&HeaderMap::new()), None);
    }
}
