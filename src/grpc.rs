//! gRPC retries for tonic clients (feature `grpc`): the building blocks of gRPC's client
//! retry design, grpc/proposal A6-client-retries.
//!
//! A tonic `Channel` is a tower service over HTTP/2, so the retry layer can sit in front
//! of it. gRPC differs from plain HTTP in ways the pieces here take care of:
//!
//! - **Outcomes are in `grpc-status`, not the HTTP status.** Every answer is HTTP 200. A
//!   server that fails an RPC before sending anything answers Trailers-Only: one HEADERS
//!   frame that ends the stream and carries `grpc-status`, so the code is in the response
//!   headers, where [`trailers_only_code`] reads it. Ordinary response headers (no
//!   `grpc-status`) commit the RPC: A6 never retries it after that.
//! - **Which codes to retry is the method's policy** ([`RetryParams`]), from a service
//!   config ([`service_config`]); `UNAVAILABLE` is the usual one.
//!   [`RetryLayer::from_service_config`](crate::RetryLayer::from_service_config) turns a
//!   whole config into the layer, [`MethodConfig::policy`] one entry into a policy.
//! - **Server pushback** ([`pushback`]): `grpc-retry-pushback-ms` is the exact wait of the
//!   next retry, or, negative or malformed, says not to retry.
//! - **Throttling** ([`Throttle`]): A6's token count per server, which turns retries off
//!   while failures outnumber successes.
//! - **Backoff** ([`backoff_ceiling`], [`backoff_delay`]): `initialBackoff *
//!   backoffMultiplier^(n-1)`, capped at `maxBackoff`, with jitter.
//! - **Metadata on the wire**: `grpc-previous-rpc-attempts` on retries
//!   ([`set_previous_rpc_attempts`]) and `grpc-timeout` set to the time left
//!   ([`set_grpc_timeout`], [`format_grpc_timeout`]).
//! - **Tonic's types**: [`tonic_body_layer`] gives the channel the body type it takes;
//!   [`status_layer`] and [`into_status`] turn the layer's errors into the `Status` a
//!   tonic caller should see.
//!
//! # What the retry loop does with them, per A6
//!
//! For each attempt of an RPC whose method has a [`RetryParams`]:
//!
//! 1. Before sending: [`set_previous_rpc_attempts`] with the number of earlier attempts
//!    (transparent retries not counted), and, with a deadline, [`set_grpc_timeout`] with
//!    the time left.
//! 2. On a response: if [`trailers_only_code`] is `None`, the RPC is committed: return it.
//!    If it is `OK`, return it and call [`Throttle::record_success`]. Otherwise read
//!    [`pushback`]: [`Pushback::Stop`] means call [`Throttle::record_failure`] and return
//!    the response. Else, if [`RetryParams::retries`] the code, call
//!    [`Throttle::record_failure`]; when it returns `false`, or no attempts are left, return
//!    the response; else wait the pushback's exact time (and restart the backoff count),
//!    or [`RetryParams::backoff`] for the next retry since the last pushback. A code that is
//!    not retryable is returned at once and counts neither way.
//! 3. On a transport error before any response: a stream refused before it left
//!    (`REFUSED_STREAM`, a connect error) is retried once at once, counted neither as an
//!    attempt nor for throttling (the layer marks it [`RetryRecord::transparent`]); a
//!    second refusal, and other errors, are outcomes like any other.
//! 4. On the response it returns: tonic's client moves the http response's extensions
//!    (`RetryInfo`) into the `tonic::Response` of a successful call, but turns a
//!    Trailers-Only failure into a `Status` made from the response headers alone, which
//!    become its metadata. What a failed call's caller should learn must therefore be a
//!    header: [`set_previous_rpc_attempts`] on the response headers, say (A6 lets the
//!    client see its attempt count).
//!
//! Errors, as opposed to responses, reach a tonic client through `Status::from_error`,
//! which does not know this crate's errors (a passed deadline would be `UNKNOWN`):
//! [`status_layer`] on top of the stack maps them first ([`into_status`]), keeping the
//! error as the status's source.
//!
//! Transparent retries and the loop itself belong to the retry layer; this module holds
//! only pure pieces and tonic glue.
//!
//! # Stacking with a tonic `Channel`
//!
//! ```no_run
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! use tower::ServiceBuilder;
//! use tower_http_retry::{grpc, RetryLayer};
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
//! [`RetryRecord::transparent`]: crate::RetryRecord::transparent
#![cfg_attr(docsrs, doc(cfg(feature = "grpc")))]

mod adapter;
mod backoff;
mod config;
mod headers;
mod throttle;

pub use adapter::{
    IntoStatus, IntoStatusFuture, StatusLayer, TonicBody, TonicBodyLayer, into_status,
    status_from_error, status_layer, tonic_body_layer,
};
pub use backoff::{A6Jitter, backoff_ceiling, backoff_delay, full_jitter, proportional_jitter};
pub use config::{
    InvalidServiceConfig, MAX_ATTEMPTS_CAP, MethodConfig, MethodName, RetryParams, ServiceConfig,
    code_name, service_config,
};
pub use headers::{
    GRPC_MESSAGE, GRPC_PREVIOUS_RPC_ATTEMPTS, GRPC_RETRY_PUSHBACK_MS, GRPC_STATUS, GRPC_TIMEOUT,
    Pushback, format_grpc_timeout, grpc_message, parse_grpc_timeout, parse_pushback,
    previous_rpc_attempts, pushback, set_grpc_timeout, set_previous_rpc_attempts,
    trailers_only_code,
};
pub use throttle::Throttle;

/// The classification of a gRPC policy ([`RetryPolicy::grpc_codes`](crate::RetryPolicy::grpc_codes)):
/// a Trailers-Only response whose `grpc-status` is one of `codes` is retried; any other
/// response is final (committed once its ordinary headers arrived); a transport failure
/// is judged as for HTTP.
pub(crate) fn classify(
    codes: &[tonic::Code],
    outcome: crate::classify::Outcome<'_>,
) -> crate::classify::Classification {
    use crate::classify::{Classification, Outcome, RetryReason};
    match outcome {
        Outcome::Response { headers, .. } => match trailers_only_code(headers) {
            Some(code) if codes.contains(&code) => {
                Classification::Retry(RetryReason::GrpcStatus(code))
            }
            _ => Classification::Done,
        },
        Outcome::Error(error) => crate::classify::classify_error(error),
    }
}
