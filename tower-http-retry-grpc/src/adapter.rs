// Tonic glue: the request body a tonic `Channel` takes, and the layer's errors as the
// `Status` a tonic caller gets.

use std::error::Error as StdError;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::Request;
use tonic::metadata::MetadataMap;
use tonic::{Code, Status};
use tower::BoxError;
use tower_layer::Layer;
use tower_service::Service;

use super::headers::{GRPC_STATUS, response_code};
use tower_http_retry::ReplayBody;
use tower_http_retry::classify::{Classify, DefaultClassifier, Outcome};
use tower_http_retry::{AttemptTimedOut, DeadlineExceeded, ServiceNotReady};
use tower_http_retry::{RetryError, RetryInfo};

/// Puts a [`TonicBody`] under the retry layer: see [`tonic_body_layer`].
#[derive(Debug, Clone, Copy, Default)]
pub struct TonicBodyLayer;

/// A layer that gives the service below it (a tonic `Channel`) the request body type it
/// takes.
///
/// The retry layer hands its inner service `http::Request<ReplayBody<B>>`; a tonic
/// `Channel` takes `http::Request<tonic::body::Body>`. This layer, placed between them,
/// wraps each attempt's replay body in a `tonic::body::Body` (one small allocation per
/// attempt, no copy of the body):
///
/// ```
/// # #[cfg(any())] {
/// let channel = tonic::transport::Endpoint::from_static("http://127.0.0.1:50051")
///     .connect_lazy();
/// let stack = tower::ServiceBuilder::new()
///     .layer(tower_http_retry_grpc::status_layer()) // the layer's errors as `Status`
///     .layer(retry_layer)
///     .layer(tower_http_retry_grpc::tonic_body_layer())
///     .service(channel);
/// let mut client = tonic::client::Grpc::new(stack); // or a generated client's `new`
/// # }
/// ```
pub fn tonic_body_layer() -> TonicBodyLayer {
    TonicBodyLayer
}

impl<S> Layer<S> for TonicBodyLayer {
    type Service = TonicBody<S>;

    fn layer(&self, inner: S) -> TonicBody<S> {
        TonicBody { inner }
    }
}

/// A service taking `http::Request<ReplayBody<B>>` and calling `S` (a tonic `Channel`)
/// with `http::Request<tonic::body::Body>`. Made by [`tonic_body_layer`].
///
/// The body's errors (the caller's own request stream failing) reach the channel as
/// tonic's `Status`, as with any body given to `tonic::body::Body::new`.
#[derive(Debug, Clone)]
pub struct TonicBody<S> {
    inner: S,
}

impl<S> TonicBody<S> {
    /// Wraps `inner`.
    pub fn new(inner: S) -> Self {
        Self { inner }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, B> Service<Request<ReplayBody<B>>> for TonicBody<S>
where
    S: Service<Request<tonic::body::Body>>,
    ReplayBody<B>: http_body::Body<Data = Bytes> + Send + 'static,
    <ReplayBody<B> as http_body::Body>::Error: Into<BoxError>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReplayBody<B>>) -> Self::Future {
        self.inner.call(request.map(tonic::body::Body::new))
    }
}

/// [`into_status`]'s table on a borrowed error: the status has no source.
#[cfg(test)]
pub(crate) fn status_from_error(error: &(dyn StdError + 'static)) -> Status {
    find_status(error).unwrap_or_else(|| Status::unknown(error.to_string()))
}

/// The gRPC status for an error that came out of the retry layer (or anything below
/// it), found by walking its [`source`](StdError::source) chain from the top; the first
/// link recognised decides:
///
/// | link | status |
/// | --- | --- |
/// | a `tonic::Status` | that status, code, message, details and metadata as they are |
/// | [`DeadlineExceeded`] (the layer's overall deadline) | `DEADLINE_EXCEEDED` |
/// | [`AttemptTimedOut`] (one attempt's timeout, the last attempt's) | `UNAVAILABLE` |
/// | [`ServiceNotReady`] (the channel was not ready for a retry within the attempt timeout) | `UNAVAILABLE` |
/// | `tonic::TimeoutExpired` (the `Channel`'s own `grpc-timeout` or `Endpoint::timeout` timer) | `DEADLINE_EXCEEDED` |
/// | `tonic::ConnectError` | `UNAVAILABLE` |
/// | with the `hyper` feature: a `GOAWAY` (any code) | `UNAVAILABLE` |
/// | with the `hyper` feature: an `h2::Error` with an error code | as grpc-go maps them (`REFUSED_STREAM` is `UNAVAILABLE`, `CANCEL` `CANCELLED`, `ENHANCE_YOUR_CALM` `RESOURCE_EXHAUSTED`, the others `INTERNAL`) |
/// | with the `hyper` feature: a hyper timeout, or a request hyper dropped when its connection went | `UNAVAILABLE` |
/// | another connection failure the layer recognises (refused, reset, closed, broken by another I/O error) | `UNAVAILABLE`, the code the retry policy judged it by |
/// | nothing recognised | `UNKNOWN`, with the error's message |
///
/// Three choices differ from what tonic itself would say:
///
/// - A6 has one deadline per RPC, across all attempts; only when it passes is the
///   answer `DEADLINE_EXCEEDED`. A per-attempt timeout is not that deadline: the call
///   still had time, the server did not answer in the time one attempt was given, and
///   trying again may work. That is a transient failure, `UNAVAILABLE`, the code an
///   Envoy-style per-try timeout gives a gRPC client too.
/// - tonic reports its own timer as `CANCELLED` ("Timeout expired"). That timer is the
///   RPC's deadline (the `grpc-timeout` the layer sets to the time left, or the
///   endpoint's timeout), so the caller gets `DEADLINE_EXCEEDED`, as from any other gRPC
///   client whose deadline passed, whichever of the layer's deadline and the channel's
///   timer fired first.
/// - A connection that failed under the request (reset, closed, hyper's dispatch gone) is
///   `UNAVAILABLE`, as grpc-go and C-core report it and as a gRPC policy retries it; tonic
///   says `UNKNOWN` or `CANCELLED`.
///
///
/// The error is kept as the status's [`source`](StdError::source) (so a caller can
/// downcast it and reach what the layer recorded), and tonic's own `Status::from_error`
/// answers for anything the table does not know. A `Status` passed in is returned as it
/// is.
///
/// Use it where the errors leave the stack, as [`status_layer`] does:
///
/// ```
/// use std::error::Error;
/// use std::time::Duration;
/// use tonic::Code;
/// use tower_http_retry_grpc::into_status;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// # use tower::{Layer, ServiceExt};
/// # use tower_http_retry::{RetryLayer, RetryPolicy};
/// # let inner = tower::service_fn(|_: http::Request<tower_http_retry::ReplayBody<String>>| {
/// #     std::future::pending::<Result<http::Response<()>, std::convert::Infallible>>()
/// # });
/// # let client = RetryLayer::new()
/// #     .policy(RetryPolicy::new().deadline(Duration::from_secs(1)))
/// #     .layer(inner);
/// # let request = http::Request::post("http://127.0.0.1/a.B/C").body(String::new()).unwrap();
/// // `error` is what the retry layer returned: its deadline passed.
/// let error = client.oneshot(request).await.unwrap_err();
/// let status = into_status(error);
/// assert_eq!(status.code(), Code::DeadlineExceeded);
/// // The layer's error itself, for a caller that wants more than the code.
/// assert!(status.source().is_some());
/// # }
/// ```
pub fn into_status(error: BoxError) -> Status {
    let error = match error.downcast::<Status>() {
        Ok(status) => return *status,
        Err(error) => error,
    };
    match find_status(&*error) {
        Some(mut status) => {
            status.set_source(Arc::from(error));
            status
        }
        None => Status::from_error(error),
    }
}

fn find_status(error: &(dyn StdError + 'static)) -> Option<Status> {
    let mut link = Some(error);
    while let Some(error) = link {
        if let Some(status) = error.downcast_ref::<Status>() {
            return Some(Status::with_details_and_metadata(
                status.code(),
                status.message(),
                Bytes::copy_from_slice(status.details()),
                status.metadata().clone(),
            ));
        }
        if error.is::<DeadlineExceeded>() || error.is::<tonic::TimeoutExpired>() {
            return Some(Status::deadline_exceeded(error.to_string()));
        }
        if error.is::<AttemptTimedOut>()
            || error.is::<ServiceNotReady>()
            || error.is::<tonic::ConnectError>()
        {
            return Some(Status::unavailable(error.to_string()));
        }
        #[cfg(feature = "hyper")]
        if let Some(status) = transport_status(error) {
            return Some(status);
        }
        link = error.source();
    }
    // A transport failure the retry policy judged by its gRPC code: that code.
    // The core's default table reads the outcome alone: an empty head will do.
    let head = http::Request::new(()).into_parts().0;
    let transport = DefaultClassifier
        .classify(&head, Outcome::Error(error))
        .reason()?;
    let code = super::transport_code(error, transport);
    Some(Status::new(code, error.to_string()))
}

/// hyper's and h2's errors: a timeout is `UNAVAILABLE`, and so is a request hyper gave up
/// on because its connection went away (tonic says `CANCELLED`; nothing cancelled it but
/// the connection, as the retry policy sees it); an h2 error with an error code as
/// [`h2_reason_code`] says.
#[cfg(feature = "hyper")]
fn transport_status(error: &(dyn StdError + 'static)) -> Option<Status> {
    if let Some(error) = error.downcast_ref::<hyper::Error>() {
        if error.is_timeout() {
            return Some(Status::unavailable(error.to_string()));
        }
        if error.is_canceled() {
            return Some(Status::unavailable(error.to_string()));
        }
        return None;
    }
    let error = error.downcast_ref::<h2::Error>()?;
    if error.is_go_away() {
        // The connection is going away, whatever its code says: UNAVAILABLE, as grpc-go
        // reports a draining connection's streams and as the retry policy judged it.
        return Some(Status::unavailable(format!("h2 protocol error: {error}")));
    }
    let code = h2_reason_code(error.reason()?);
    Some(Status::new(code, format!("h2 protocol error: {error}")))
}

/// gRPC's code for an HTTP/2 error code (`RST_STREAM`, `GOAWAY`), as grpc-go and tonic
/// map them: `REFUSED_STREAM` is `UNAVAILABLE`, `CANCEL` `CANCELLED`, `ENHANCE_YOUR_CALM`
/// `RESOURCE_EXHAUSTED`, `INADEQUATE_SECURITY` `PERMISSION_DENIED`, the other defined ones
/// `INTERNAL`, an unknown one `UNKNOWN`.
#[cfg(feature = "hyper")]
pub(crate) fn h2_reason_code(reason: h2::Reason) -> Code {
    match reason {
        h2::Reason::NO_ERROR
        | h2::Reason::PROTOCOL_ERROR
        | h2::Reason::INTERNAL_ERROR
        | h2::Reason::FLOW_CONTROL_ERROR
        | h2::Reason::SETTINGS_TIMEOUT
        | h2::Reason::STREAM_CLOSED
        | h2::Reason::FRAME_SIZE_ERROR
        | h2::Reason::COMPRESSION_ERROR
        | h2::Reason::CONNECT_ERROR
        | h2::Reason::HTTP_1_1_REQUIRED => Code::Internal,
        h2::Reason::REFUSED_STREAM => Code::Unavailable,
        h2::Reason::CANCEL => Code::Cancelled,
        h2::Reason::ENHANCE_YOUR_CALM => Code::ResourceExhausted,
        h2::Reason::INADEQUATE_SECURITY => Code::PermissionDenied,
        _ => Code::Unknown,
    }
}

/// Puts an [`IntoStatus`] on top of the stack: see [`status_layer`].
#[derive(Debug, Clone, Default)]
pub struct StatusLayer {
    #[cfg(feature = "opentelemetry")]
    a96: Option<Arc<crate::metrics::A96>>,
}

impl StatusLayer {
    /// Records gRPC's retry metrics (grpc/proposal A96) through OpenTelemetry's metrics
    /// API, with instruments made now from `meter`: once per call, at its end as this layer
    /// sees it (the response head, or the error), from the retry layer's record of it
    /// ([`RetryInfo`]). Four histograms, with A96's names, units and bucket boundaries:
    ///
    /// | name | unit | value |
    /// | --- | --- | --- |
    /// | `grpc.client.call.retries` | `{retry}` | retries sent (not transparent ones, not hedges) |
    /// | `grpc.client.call.transparent_retries` | `{transparent_retry}` | transparent retries sent |
    /// | `grpc.client.call.hedges` | `{hedge}` | hedges sent |
    /// | `grpc.client.call.retry_delay` | `s` | [`RetryInfo::retry_delay`]: the time with no attempt in flight |
    ///
    /// A count of 0 is not recorded, so a call that was not retried records nothing; the
    /// delay is recorded for a call that had a retry or a hedge (as gRPC C++ does; grpc-java
    /// records it for every call, 0 included). The attributes: `grpc.method`, the request's
    /// path without its leading slash (`package.Service/Method`, as tonic's generated
    /// clients send it; a path not of that shape is `other`), and `grpc.target`, `target`
    /// as gRPC canonicalizes a channel's target: `localhost:50051` is
    /// `dns:///localhost:50051`, a tonic endpoint's `http://localhost:50051` too (its host
    /// is resolved by DNS), one with a resolver's scheme (`dns:`, `unix:`, `xds:`, ...) is
    /// kept as it is. Give each channel's stack its own layer, with its target.
    ///
    /// These are the gRPC names only: the retry layer's own HTTP ones
    /// ([`RetryLayer::otel_meter`](tower_http_retry::RetryLayer::otel_meter)) are recorded
    /// as well only if it is given a meter too.
    ///
    /// ```
    /// use opentelemetry::metrics::MeterProvider as _;
    /// use opentelemetry_sdk::metrics::SdkMeterProvider;
    /// use tower::ServiceBuilder;
    /// use tower_http_retry::RetryLayer;
    /// use tower_http_retry_grpc::{self as grpc, GrpcLayerExt};
    ///
    /// let provider = SdkMeterProvider::builder().build();
    /// let meter = provider.meter("tower-http-retry-grpc");
    /// # let channel = tower::service_fn(|_: http::Request<tonic::body::Body>| async {
    /// #     Ok::<_, std::convert::Infallible>(http::Response::new(tonic::body::Body::empty()))
    /// # });
    /// let stack = ServiceBuilder::new()
    ///     .layer(grpc::status_layer().otel_meter(meter, "localhost:50051"))
    ///     .layer(RetryLayer::grpc())
    ///     .layer(grpc::tonic_body_layer())
    ///     .service(channel);
    /// # let _ = stack;
    /// ```
    #[cfg(feature = "opentelemetry")]
    #[cfg_attr(docsrs, doc(cfg(feature = "opentelemetry")))]
    pub fn otel_meter(self, meter: opentelemetry::metrics::Meter, target: &str) -> Self {
        Self {
            a96: Some(Arc::new(crate::metrics::A96::new(&meter, target))),
        }
    }
}

/// A layer that gives a tonic client the `Status` of every call that failed, with the
/// retry layer's record of that call as the status's source. Put it on top of the stack,
/// above the retry layer.
///
/// - **Errors** become a `Status` with [`into_status`]: the layer's own errors get the
///   right codes (a passed deadline is `DEADLINE_EXCEEDED`, not `UNKNOWN`), and the error,
///   a [`RetryError`] holding the record, is the status's source.
/// - **A final response that fails the call** becomes its `Status` too, so that its record
///   is not lost: tonic's client builds such a status from the response headers and drops
///   the response's extensions, where the record is. That is a Trailers-Only answer with
///   a `grpc-status` other than `OK` (the status is tonic's reading of the headers: code,
///   message, details, the other headers as metadata), or an HTTP status other than 200
///   without `grpc-status`, a proxy's error page (the code is gRPC's HTTP-to-gRPC mapping:
///   503, 502, 504 and 429 are `UNAVAILABLE`, 404 `UNIMPLEMENTED`, 401 `UNAUTHENTICATED`,
///   403 `PERMISSION_DENIED`, 400 `INTERNAL`, others `UNKNOWN`; tonic alone would say
///   `INTERNAL` after failing to read the page as gRPC messages).
///
/// The status's source is then a [`RetryError`] with the record
/// ([`RetryError::info`](tower_http_retry::RetryError::info)); nothing failed beneath it, so the
/// `RetryError`'s own source is the same status, without a source.
///
/// ```
/// # #[cfg(any())] {
/// let status = client.get_cart(request).await.unwrap_err();
/// let record = status
///     .source()
///     .and_then(|e| e.downcast_ref::<tower_http_retry::RetryError>())
///     .map(|e| e.info());
/// # }
/// ```
///
/// A call whose response headers arrived is committed: when it fails later, its status is
/// in the trailers, which tonic reads from the body after the layers are done with it; that
/// status has no record. A successful call's record is in the `tonic::Response`'s
/// extensions, where tonic moves the http response's.
pub fn status_layer() -> StatusLayer {
    StatusLayer::default()
}

impl<S> Layer<S> for StatusLayer {
    type Service = IntoStatus<S>;

    fn layer(&self, inner: S) -> IntoStatus<S> {
        IntoStatus {
            inner,
            #[cfg(feature = "opentelemetry")]
            a96: self.a96.clone(),
        }
    }
}

/// A service whose errors are the `tonic::Status` that [`into_status`] makes of `S`'s.
/// Made by [`status_layer`].
#[derive(Debug, Clone)]
pub struct IntoStatus<S> {
    inner: S,
    #[cfg(feature = "opentelemetry")]
    a96: Option<Arc<crate::metrics::A96>>,
}

impl<S> IntoStatus<S> {
    /// Wraps `inner`.
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            #[cfg(feature = "opentelemetry")]
            a96: None,
        }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, R, B> Service<R> for IntoStatus<S>
where
    // 'static: with the `opentelemetry` feature, the metrics read the path of tonic's
    // requests.
    R: 'static,
    S: Service<R, Response = http::Response<B>>,
    S::Error: Into<BoxError>,
{
    type Response = http::Response<B>;
    type Error = Status;
    type Future = IntoStatusFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Status>> {
        self.inner
            .poll_ready(cx)
            .map_err(|error| into_status(error.into()))
    }

    fn call(&mut self, request: R) -> Self::Future {
        #[cfg(feature = "opentelemetry")]
        let call = crate::metrics::Call::start(self.a96.as_ref(), &request);
        #[cfg(not(feature = "opentelemetry"))]
        let call = crate::metrics::Call;
        IntoStatusFuture {
            inner: self.inner.call(request),
            call,
        }
    }
}

pin_project_lite::pin_project! {
    /// The response future of [`IntoStatus`].
    #[derive(Debug)]
    pub struct IntoStatusFuture<F> {
        #[pin]
        inner: F,
        // The call's part in the metrics (nothing without the `opentelemetry` feature).
        call: crate::metrics::Call,
    }
}

impl<F, B, E> Future for IntoStatusFuture<F>
where
    F: Future<Output = Result<http::Response<B>, E>>,
    E: Into<BoxError>,
{
    type Output = Result<http::Response<B>, Status>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let result = ready!(this.inner.poll(cx)).map_err(Into::into);
        this.call.finish(&result);
        Poll::Ready(match result {
            Ok(mut response) => match response_code(response.status(), response.headers()) {
                None => Ok(response),
                Some(Code::Ok) => {
                    // tonic reads an OK's details too, and panics on ones that are not base64.
                    drop_bad_details(response.headers_mut());
                    Ok(response)
                }
                Some(code) => Err(failed_call(code, response)),
            },
            Err(error) => Err(into_status(error)),
        })
    }
}

/// The `Status` of a final response that ends the call with `code`, as tonic's client would
/// make it from the headers (code, message, details, the other headers as metadata), with
/// the layer's record as its source: a [`RetryError`] whose own source is the same status,
/// without a source of its own.
fn failed_call<B>(code: Code, response: http::Response<B>) -> Status {
    let (mut parts, _body) = response.into_parts();
    let mut status = match parts.headers.contains_key(GRPC_STATUS) {
        true => status_from_headers(&mut parts.headers),
        false => {
            let message = format!(
                "HTTP status {} without grpc-status (a proxy's or load balancer's answer)",
                parts.status
            );
            Status::with_metadata(code, message, MetadataMap::from_headers(parts.headers))
        }
    };
    if let Some(info) = parts.extensions.remove::<RetryInfo>() {
        let error = RetryError::new(info, Box::new(status.clone()));
        status.set_source(Arc::new(error));
    }
    status
}

/// tonic's reading of a Trailers-Only response's headers, with [`drop_bad_details`] first.
fn status_from_headers(headers: &mut http::HeaderMap) -> Status {
    drop_bad_details(headers);
    Status::from_header_map(headers).unwrap_or_else(|| Status::unknown("no grpc-status"))
}

/// Removes a `grpc-status-details-bin` that is not base64: tonic's reading of the headers
/// expects base64 there and panics on anything else.
fn drop_bad_details(headers: &mut http::HeaderMap) {
    use base64::Engine as _;
    use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};

    const DETAILS: &str = "grpc-status-details-bin";
    const LENIENT: GeneralPurpose = GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
    );
    let bad = headers
        .get_all(DETAILS)
        .iter()
        .any(|value| LENIENT.decode(value.as_bytes()).is_err());
    if bad {
        headers.remove(DETAILS);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::fmt;
    use std::time::Duration;

    use tonic::metadata::MetadataValue;

    /// An error with a source, like the layer's `RetryError` will be.
    #[derive(Debug)]
    struct Wrapper(BoxError);

    impl fmt::Display for Wrapper {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "gave up: {}", self.0)
        }
    }

    impl StdError for Wrapper {
        fn source(&self) -> Option<&(dyn StdError + 'static)> {
            Some(&*self.0)
        }
    }

    fn deadline() -> DeadlineExceeded {
        DeadlineExceeded::new(Duration::from_secs(2))
    }

    fn timed_out() -> AttemptTimedOut {
        AttemptTimedOut::new(Duration::from_millis(500))
    }

    #[test]
    fn the_layers_own_errors() {
        let status = status_from_error(&deadline());
        assert_eq!(status.code(), Code::DeadlineExceeded);
        assert_eq!(status.message(), "request deadline of 2s exceeded");
        let status = status_from_error(&timed_out());
        assert_eq!(status.code(), Code::Unavailable);
        assert_eq!(status.message(), "attempt timed out after 500ms");
        // A retry the channel was not ready for in time: the server's side is down.
        let not_ready = ServiceNotReady::new(Duration::from_secs(1));
        assert_eq!(status_from_error(&not_ready).code(), Code::Unavailable);
    }

    #[test]
    fn found_anywhere_in_the_chain() {
        let wrapped = Wrapper(Box::new(Wrapper(Box::new(deadline()))));
        assert_eq!(status_from_error(&wrapped).code(), Code::DeadlineExceeded);
        let status = into_status(Box::new(wrapped));
        assert_eq!(status.code(), Code::DeadlineExceeded);
        let source = status.source().expect("the error is kept");
        assert!(source.is::<Wrapper>());
        assert_eq!(
            source.to_string(),
            "gave up: gave up: request deadline of 2s exceeded"
        );
    }

    #[test]
    fn a_status_is_kept_as_it_is() {
        let mut original =
            Status::with_details(Code::Aborted, "conflict", Bytes::from_static(b"d"));
        original
            .metadata_mut()
            .insert("x-why", MetadataValue::from_static("because"));
        let wrapped = Wrapper(Box::new(original));
        let status = status_from_error(&wrapped);
        assert_eq!(status.code(), Code::Aborted);
        assert_eq!(status.message(), "conflict");
        assert_eq!(status.details(), b"d");
        assert_eq!(status.metadata().get("x-why").unwrap(), "because");

        // A status that is the error itself comes back unchanged, source included.
        let mut with_source = Status::unavailable("down");
        with_source.set_source(Arc::new(deadline()));
        let back = into_status(Box::new(with_source));
        assert_eq!(back.code(), Code::Unavailable);
        assert!(back.source().unwrap().is::<DeadlineExceeded>());
    }

    #[test]
    fn the_first_recognised_link_wins() {
        // A status above the deadline: the status.
        let status = Status::resource_exhausted("slow down");
        struct Above(Status);
        impl fmt::Debug for Above {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("Above")
            }
        }
        impl fmt::Display for Above {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("above")
            }
        }
        impl StdError for Above {
            fn source(&self) -> Option<&(dyn StdError + 'static)> {
                Some(&self.0)
            }
        }
        assert_eq!(
            status_from_error(&Above(status)).code(),
            Code::ResourceExhausted
        );
        let deadline_over_status = Wrapper(Box::new(deadline()));
        assert_eq!(
            status_from_error(&deadline_over_status).code(),
            Code::DeadlineExceeded
        );
    }

    #[test]
    fn tonics_own_errors() {
        let status = status_from_error(&tonic::TimeoutExpired(()));
        assert_eq!(status.code(), Code::DeadlineExceeded);
        assert_eq!(status.message(), "Timeout expired");
        let connect = tonic::ConnectError(Box::new(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "refused",
        )));
        assert_eq!(status_from_error(&connect).code(), Code::Unavailable);
    }

    #[cfg(feature = "hyper")]
    #[test]
    fn h2_reasons_as_tonic_maps_them() {
        let cases = [
            (h2::Reason::REFUSED_STREAM, Code::Unavailable),
            (h2::Reason::CANCEL, Code::Cancelled),
            (h2::Reason::ENHANCE_YOUR_CALM, Code::ResourceExhausted),
            (h2::Reason::INTERNAL_ERROR, Code::Internal),
            (h2::Reason::INADEQUATE_SECURITY, Code::PermissionDenied),
            (h2::Reason::from(0xff), Code::Unknown),
        ];
        for (reason, code) in cases {
            let error = h2::Error::from(reason);
            assert_eq!(
                status_from_error(&Wrapper(Box::new(error))).code(),
                code,
                "{reason:?}"
            );
        }
    }

    #[cfg(feature = "hyper")]
    #[tokio::test]
    async fn an_h2_connection_broken_by_an_io_error_is_unavailable() {
        use crate::broken_h2;
        use std::io::{Error, ErrorKind};
        // An end in the middle of a frame is `Other`; a reset and an early end, the same.
        for kind in [
            ErrorKind::Other,
            ErrorKind::ConnectionReset,
            ErrorKind::UnexpectedEof,
        ] {
            let h2 = broken_h2::h2_error(Error::new(kind, "cut")).await;
            let status = status_from_error(&Wrapper(Box::new(h2)));
            assert_eq!(status.code(), Code::Unavailable, "{kind:?}");
            // hyper hands the I/O error over as its own, without the h2 error.
            let hyper = broken_h2::hyper_h2_error(Error::new(kind, "cut")).await;
            let status = into_status(Box::new(Wrapper(Box::new(hyper))));
            assert_eq!(status.code(), Code::Unavailable, "{kind:?}");
            assert!(status.source().unwrap().is::<Wrapper>(), "{kind:?}");
        }
    }

    #[test]
    fn anything_else_is_unknown() {
        let error = std::io::Error::other("disk on fire");
        let status = status_from_error(&error);
        assert_eq!(status.code(), Code::Unknown);
        assert_eq!(status.message(), "disk on fire");
        // The owned form defers to tonic, which says the same and keeps the source.
        let status = into_status(Box::new(error));
        assert_eq!(status.code(), Code::Unknown);
        assert!(status.source().unwrap().is::<std::io::Error>());
    }

    #[tokio::test]
    async fn the_status_layer_maps_errors_and_passes_responses() {
        use tower::ServiceExt;

        let failing = tower::service_fn(|fail: bool| async move {
            if fail {
                Err::<http::Response<&str>, BoxError>(Box::new(deadline()))
            } else {
                Ok(http::Response::new("fine"))
            }
        });
        let service = status_layer().layer(failing);
        let response = service.clone().oneshot(false).await.unwrap();
        assert_eq!(*response.body(), "fine");
        let status = service.oneshot(true).await.unwrap_err();
        assert_eq!(status.code(), Code::DeadlineExceeded);
    }

    /// A response through the status layer, as the retry layer would return it.
    async fn through_status_layer(
        status: u16,
        headers: &[(&'static str, &'static str)],
        record: bool,
    ) -> Result<http::Response<&'static str>, Status> {
        use tower::ServiceExt;

        let mut response = http::Response::new("<html>maintenance</html>");
        *response.status_mut() = http::StatusCode::from_u16(status).unwrap();
        for (name, value) in headers {
            response
                .headers_mut()
                .insert(*name, http::HeaderValue::from_static(value));
        }
        if record {
            response.extensions_mut().insert(RetryInfo::default());
        }
        let inner = tower::service_fn(move |_: ()| {
            let response = std::mem::take(&mut Some(response.clone_parts()));
            async move { Ok::<_, BoxError>(response.unwrap()) }
        });
        status_layer().layer(inner).oneshot(()).await
    }

    trait CloneParts {
        fn clone_parts(&self) -> Self;
    }

    impl CloneParts for http::Response<&'static str> {
        fn clone_parts(&self) -> Self {
            let mut response = http::Response::new(*self.body());
            *response.status_mut() = self.status();
            *response.headers_mut() = self.headers().clone();
            if let Some(info) = self.extensions().get::<RetryInfo>() {
                response.extensions_mut().insert(info.clone());
            }
            response
        }
    }

    #[tokio::test]
    async fn a_final_response_that_fails_the_call_becomes_its_status_with_the_record() {
        // Trailers-Only: tonic's reading, metadata kept, the record as the source, and
        // the same status beneath the record.
        let status = through_status_layer(
            200,
            &[
                ("grpc-status", "14"),
                ("grpc-message", "down%20for%20now"),
                ("x-region", "eu"),
            ],
            true,
        )
        .await
        .unwrap_err();
        assert_eq!(status.code(), Code::Unavailable);
        assert_eq!(status.message(), "down for now");
        assert_eq!(status.metadata().get("x-region").unwrap(), "eu");
        let error = status
            .source()
            .unwrap()
            .downcast_ref::<RetryError>()
            .unwrap();
        assert_eq!(error.info().attempts(), RetryInfo::default().attempts());
        let beneath = error.get_ref().downcast_ref::<Status>().unwrap();
        assert_eq!(beneath.code(), Code::Unavailable);
        assert!(beneath.source().is_none());

        // A proxy's 503 without grpc-status: gRPC's mapping, not tonic's INTERNAL.
        let status = through_status_layer(503, &[("x-proxy", "nginx")], true)
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::Unavailable);
        assert!(status.message().contains("503"), "{}", status.message());
        assert_eq!(status.metadata().get("x-proxy").unwrap(), "nginx");
        assert!(status.source().unwrap().is::<RetryError>());
        let status = through_status_layer(404, &[], false).await.unwrap_err();
        assert_eq!(status.code(), Code::Unimplemented);
        assert!(status.source().is_none(), "no record, no source");

        // Details that are not base64 are dropped rather than handed to tonic.
        let status = through_status_layer(
            200,
            &[("grpc-status", "13"), ("grpc-status-details-bin", "!!")],
            false,
        )
        .await
        .unwrap_err();
        assert_eq!(status.code(), Code::Internal);
        assert!(status.details().is_empty());

        // An OK with details that are not base64: passed on, without them.
        let response = through_status_layer(
            200,
            &[("grpc-status", "0"), ("grpc-status-details-bin", "!!")],
            true,
        )
        .await
        .unwrap();
        assert!(response.headers().get("grpc-status-details-bin").is_none());

        // OK, and ordinary headers: the response, untouched.
        for headers in [&[("grpc-status", "0")][..], &[]] {
            let response = through_status_layer(200, headers, true).await.unwrap();
            assert!(response.extensions().get::<RetryInfo>().is_some());
        }
    }

    #[tokio::test]
    async fn the_body_layer_hands_over_the_replayed_bytes() {
        use http_body_util::{BodyExt, Full};
        use tower::ServiceExt;

        let channel = tower::service_fn(|request: Request<tonic::body::Body>| async move {
            let bytes = request.into_body().collect().await?.to_bytes();
            Ok::<_, Status>(bytes)
        });
        let service = tonic_body_layer().layer(channel);
        let body = ReplayBody::new(Full::new(Bytes::from_static(b"\0\0\0\0\x02hi")), 1024);
        let request = Request::post("http://127.0.0.1/a.B/C").body(body).unwrap();
        let bytes = service.oneshot(request).await.unwrap();
        assert_eq!(&bytes[..], b"\0\0\0\0\x02hi");
    }
}
